"""Signing in (handlers/auth/): registration, the accounts a person's sign-in acts for, two-factor sign-in (its
enrolment, recovery codes and the check of a code, throttled per account) and the password reset by an emailed
link. What a request is answered (its status, its words) stays with the handlers; the codes and tokens themselves
are security/'s."""

import hashlib
import hmac
import logging
import time
from datetime import datetime

from config.settings import Settings
from runtime.cache import LoadingCache
from security import tokens, totp
from security.apikeys import KeyVault
from security.throttle import SlidingWindows
from storage.accounts import AccountStore, DuplicateEmail
from storage.audit import ANONYMOUS, AuditStore
from storage.limits import Limits
from storage.members import MemberStore
from storage.signin import SignInStore
from webhooks.outbox import Outbox

# DuplicateEmail: registering an email that has a sign-in (the handlers answer 409).
__all__ = ["Auth", "DuplicateEmail", "TooManyCodes", "enabled", "CHALLENGE_TTL", "RESETS_PER_EMAIL"]

log = logging.getLogger("gateway.reset")

CHALLENGE_TTL = 300  # seconds to type the code after the password was accepted
RESETS_PER_EMAIL, RESET_WINDOW = 3, 3600.0  # reset emails per address per hour, across processes


class TooManyCodes(Exception):
    """Too many wrong second-factor codes for the account lately: `wait` seconds before the next try."""

    def __init__(self, wait: float):
        super().__init__(wait)
        self.wait = wait


def enabled(account: dict | None) -> bool:
    """Two-factor sign-in is on for this sign-in (a person's document or its 2FA state)."""
    return bool(account and (account.get("totp") or {}).get("enabled"))


def sealed_for(account_id: str) -> str:
    return f"totp:{account_id}"  # binds the sealed secret to its account (AES-GCM associated data)


def fingerprint(secret: str, password_hash: str) -> str:
    """A keyed digest of the password hash: the token names the password it may replace, revealing nothing."""
    return hmac.new(secret.encode(), password_hash.encode(), hashlib.sha256).hexdigest()[:32]


def limit_key(secret: str, email: str) -> str:
    """The address's key in the limits collection: a keyed digest (addresses nobody registered are not stored)."""
    return "reset:" + hmac.new(secret.encode(), email.encode(), hashlib.sha256).hexdigest()[:32]


class Auth:
    def __init__(
        self,
        settings: Settings,
        accounts: AccountStore,
        members: MemberStore,
        signin: SignInStore,
        limits: Limits,
        audit: AuditStore,
        account_cache: LoadingCache,
        vault: KeyVault,
        outbox: Outbox,
    ):
        self.settings, self.accounts, self.members, self.signin = settings, accounts, members, signin
        self.limits, self.audit, self.account_cache, self.vault = limits, audit, account_cache, vault
        self.outbox = outbox
        self.second_factor = SlidingWindows(5, 300.0, 100_000)  # wrong codes per account, in this process

    # --- people and their accounts -------------------------------------------------------------------------------
    async def account(self, account_id: str) -> dict | None:
        """An account's document, or a person's sign-in (None: gone)."""
        return await self.accounts.get(account_id)

    async def by_email(self, email: str) -> dict | None:
        """The sign-in of this (normalised) email, or None."""
        return await self.accounts.by_email(email)

    async def register(self, email: str, password_hash: str, network: str) -> tuple[dict, int]:
        """A new account owned by the one who registers, and the signup credits it got: none once `network` had
        its share today. DuplicateEmail when the email has a sign-in."""
        s = self.settings
        credits = s.signup_credits
        if credits and not await self.accounts.claim_signup_credits(network, s.signup_credited_per_network):
            credits = 0  # this network's signup credits for today are used up: the account starts empty
        account = await self.accounts.create(email, password_hash, credits)
        await self.members.make_owner(account["_id"], email)
        return account, credits

    async def start_own_account(self, person: dict, network: str) -> tuple[bool, int] | None:
        """An account of their own for a sign-in that is in no account any more (a member removed from every one):
        owned by them, with signup credits as at registration (none once `network` had its share today): whether
        this call made it (not another at the same moment, nor an earlier one), and the credits it got. The
        account's id is the person's. None when it cannot be theirs: a registered sign-in's
        document is the account it registered, and one that others own now cannot become theirs again."""
        account_id, s = person["_id"], self.settings
        made, credits = False, 0
        if person.get("person"):  # an invited person's sign-in, no balance: it becomes the account
            credits = s.signup_credits
            if credits and not await self.accounts.claim_signup_credits(network, s.signup_credited_per_network):
                credits = 0
            made = await self.accounts.become_account(account_id, credits)
            credits = credits if made else 0  # else made at the same moment by another request of theirs
        account = await self.accounts.get(account_id)
        if account is None or account.get("person") or account_id not in (account.get("owners") or []):
            return None
        await self.members.make_owner(account_id, person["email"])  # again after a start cut short: no change
        self.account_cache.invalidate(account_id)
        return made, credits

    async def create_person(self, email: str, password_hash: str) -> dict:
        """A sign-in of its own for an invited person (DuplicateEmail when one was made meanwhile)."""
        return await self.accounts.create_person(email, password_hash)

    async def memberships(self, person_id: str) -> list[dict]:
        """The person's memberships, the first they joined first."""
        return await self.members.of_person(person_id)

    async def seen(self, account_id: str, person_id: str) -> None:
        await self.members.seen(account_id, person_id)

    async def set_attribution(self, account_id: str, first_touch: dict | None, anonymous_id: str | None) -> bool:
        return await self.accounts.set_attribution(account_id, first_touch, anonymous_id)

    # --- two-factor sign-in --------------------------------------------------------------------------------------
    async def two_factor(self, person_id: str) -> dict | None:
        """The sign-in's 2FA state (and its session version), or None for an unknown one."""
        return await self.signin.state(person_id)

    def challenge(self, account: dict) -> dict:
        """The first step's answer for an account with two-factor sign-in: no session yet, a challenge to send
        back with a code. It names the session version: a password change or reset voids it."""
        s = self.settings
        token = tokens.issue_purpose(
            s.jwt_secret, tokens.CHALLENGE, account["_id"], CHALLENGE_TTL, account.get("session_version", 0)
        )
        return {"two_factor_required": True, "challenge": token, "expires_in": CHALLENGE_TTL}

    def challenge_claims(self, token: str) -> tokens.Purpose | None:
        return tokens.purpose_of(self.settings.jwt_secret, tokens.CHALLENGE, token)

    async def challenge_spent(self, token_id: str) -> bool:
        return await self.signin.challenge_spent(token_id)

    async def spend_challenge(self, token_id: str, account_id: str, expires: datetime) -> bool:
        """False when the challenge was used at the same moment elsewhere: it opens one session."""
        return await self.signin.spend_challenge(token_id, account_id, expires)

    def _pepper(self) -> bytes:
        return totp.pepper(self.settings.secrets_key)

    def _secret(self, account_id: str, sealed: str) -> str:
        return self.vault.decrypt(sealed, sealed_for(account_id))

    async def check_code(self, account_id: str, code: str, recovery: bool = True) -> tuple[str | None, int | None]:
        """A current TOTP code (once per time step) or, when `recovery`, an unused recovery code: what was used
        ("totp", "recovery_code", or None for a wrong code) and, for a recovery code, how many are left.
        TooManyCodes past the account's wrong codes; every try counts until proven right, so parallel guesses
        cannot all slip in."""
        throttle = self.second_factor
        now = time.monotonic()
        wait = throttle.retry_after(account_id, now)
        if wait:
            raise TooManyCodes(wait)
        throttle.add(account_id, now)
        state = await self.signin.state(account_id)
        used, left = None, None
        if enabled(state):
            factor = state["totp"]
            step = totp.matching_step(self._secret(account_id, factor["sealed"]), code, factor.get("last_step", -1))
            if step is not None and await self.signin.use_step(account_id, step):
                used = "totp"
            elif recovery and not totp.is_totp_code(code.strip()):
                left = await self.signin.use_recovery(account_id, totp.recovery_digest(self._pepper(), code))
                if left is not None:
                    used = "recovery_code"
        if used is not None:
            throttle.clear(account_id)
        return used, left

    async def begin_enrolment(self, account_id: str) -> str | None:
        """A new authenticator's secret, kept sealed until confirmed; None while two-factor sign-in is on."""
        secret = totp.new_secret()
        if not await self.signin.begin(account_id, self.vault.encrypt(secret, sealed_for(account_id))):
            return None
        return secret

    def enrolment_step(self, account_id: str, pending: dict, code: str) -> int | None:
        """The time step `code` matches for the pending enrolment's secret, or None."""
        return totp.matching_step(self._secret(account_id, pending["sealed"]), code)

    async def enable(self, account_id: str, pending: dict, step: int) -> list[str] | None:
        """Two-factor sign-in on, and its ten recovery codes (shown this once; kept as keyed digests). None when
        this enrolment was replaced or confirmed meanwhile."""
        codes = totp.new_recovery_codes()
        digests = [totp.recovery_digest(self._pepper(), c) for c in codes]
        if not await self.signin.enable(account_id, pending["sealed"], step, digests):
            return None
        self.account_cache.invalidate(account_id)
        return codes

    async def new_recovery_codes(self, account_id: str) -> list[str]:
        """Ten new recovery codes; the old ones stop working."""
        codes = totp.new_recovery_codes()
        await self.signin.replace_recovery(account_id, [totp.recovery_digest(self._pepper(), c) for c in codes])
        return codes

    async def disable(self, account_id: str) -> None:
        await self.signin.disable(account_id)
        self.account_cache.invalidate(account_id)

    # --- password reset ------------------------------------------------------------------------------------------
    async def send_reset_link(self, email: str, base: str, address: str) -> None:
        """After the forgot answer: at most RESETS_PER_EMAIL emails per address and hour (across processes), to an
        email with a sign-in only, the link's token bound to its session version and current password. Never
        raises: nobody is left to tell but the log (never the link)."""
        s = self.settings
        try:
            if await self.limits.take(limit_key(s.jwt_secret, email), RESETS_PER_EMAIL, RESET_WINDOW):
                return
            account = await self.accounts.by_email(email)
            if account is None:
                return
            mailer = self.outbox.mailer  # the alert emails' sender (webhooks/mail.py): SMTP_URL
            details = {"emailed": bool(mailer and base)}
            await self.audit.record("password.reset_requested", account["_id"], ANONYMOUS, address, details)
            if mailer is None or not base:
                log.warning(
                    "password reset asked for account %s: no SMTP_URL or PUBLIC_URL, no email sent", account["_id"]
                )
                return
            token = tokens.issue_purpose(
                s.jwt_secret,
                tokens.RESET,
                account["_id"],
                s.password_reset_ttl_seconds,
                account.get("session_version", 0),
                fingerprint(s.jwt_secret, account["password_hash"]),
            )
            minutes = s.password_reset_ttl_seconds // 60
            text = (
                "Someone (we hope you) asked to reset the password of this account.\n\n"
                f"Choose a new password here (the link works once, for {minutes} minutes):\n\n"
                f"{base}/#reset={token}\n\n"
                "If it was not you, ignore this email: your password stays as it is.\n"
            )
            await mailer.send(email, "[social-gateway] Reset your password", text)
        except Exception as exc:
            log.warning("password reset email not sent: %s", type(exc).__name__)

    async def reset_target(self, token: str) -> dict | None:
        """The sign-in an emailed link may reset: its token valid, for the current session version and password;
        else None."""
        s = self.settings
        claims = tokens.purpose_of(s.jwt_secret, tokens.RESET, token)
        if claims is None:
            return None
        account = await self.signin.for_reset(claims.account_id)
        if (
            account is None
            or account.get("session_version", 0) != claims.version
            or not hmac.compare_digest(fingerprint(s.jwt_secret, account["password_hash"]), claims.bound)
        ):
            return None
        return account

    async def reset_password(self, account: dict, password_hash: str) -> bool:
        """The new password, written only over the one the link was made for (two uses at once: one wins). Every
        session ends here at once, elsewhere within a second."""
        if await self.signin.reset_password(account["_id"], account["password_hash"], password_hash) is None:
            return False
        self.account_cache.invalidate(account["_id"])
        return True
