"""Password reset by an emailed link: POST /auth/password/forgot {email} and POST /auth/password/reset
{token, password}.

The forgot answer is the same 202 whether or not the address has an account, and is sent before anything
is looked up: the lookup and the email happen after the answer, so neither the body nor the time says
whether the account exists. At most RESETS_PER_EMAIL emails per address per hour are sent, counted in
MongoDB (storage/limits.py) so that the limit holds across processes: the inbox is someone else's, and
`--workers N` must not give N times the emails. More requests get the same 202, nothing else: nobody can flood
an inbox, nor block someone's reset with 429s. The per-address login throttle (per process) answers 429 to
one client asking too often.

The link carries a signed token (security/tokens.py, purpose "reset"), valid PASSWORD_RESET_TTL_SECONDS, bound
to the account's session version and to a keyed fingerprint of its current password hash: it works once
(the password write is conditional on that hash, so two uses at once cannot both succeed), and no longer
after any password change. A reset ends every session of the account; two-factor sign-in stays on.
The link is PUBLIC_URL/#reset=<token> (the fragment never reaches a server log nor a Referer); without
PUBLIC_URL, development links point at the host the request named, and production sends none."""

import asyncio
import hashlib
import hmac
import logging

from handlers.auth import CREDENTIALS, AuthHandler
from handlers.errors import ValidationError, error
from handlers.validation import Field, validate_body
from security import passwords, tokens
from storage.audit import ANONYMOUS

log = logging.getLogger("gateway.reset")

RESETS_PER_EMAIL, RESET_WINDOW = 3, 3600.0  # emails per address per hour, across processes
FORGOT = [Field("email", str, min_length=1, max_length=254, description="The account's email address")]
RESET = [
    Field("token", str, min_length=1, max_length=1024, description="The token of the emailed link"),
    next(f for f in CREDENTIALS if f.name == "password"),
]
ACCEPTED = {"detail": "If an account uses this address, a link to reset its password is on its way"}
_INVALID = "This link is invalid, expired or already used; ask for a new one"
_pending: set[asyncio.Task] = set()  # sends under way (a task nobody holds may be collected mid-way)


def fingerprint(secret: str, password_hash: str) -> str:
    """A keyed digest of the password hash: the token names the password it may replace, revealing nothing."""
    return hmac.new(secret.encode(), password_hash.encode(), hashlib.sha256).hexdigest()[:32]


def limit_key(secret: str, email: str) -> str:
    """The address's key in the limits collection: a keyed digest (addresses nobody registered are not stored)."""
    return "reset:" + hmac.new(secret.encode(), email.encode(), hashlib.sha256).hexdigest()[:32]


class ForgotHandler(AuthHandler):
    """Always 202, the same body, answered before the address is looked up."""

    async def post(self) -> None:
        email = validate_body(self.json_body(), FORGOT)["email"].strip().lower()
        self.throttle()  # per client address, as logins
        base = self.ctx.settings.public_url.rstrip("/")
        if not base and not self.ctx.settings.production:
            base = f"{self.request.protocol}://{self.request.host}"
        task = asyncio.create_task(self.send_link(email, base, self.client_ip()))
        _pending.add(task)
        task.add_done_callback(_pending.discard)
        self.send_json(ACCEPTED, status=202)

    async def send_link(self, email: str, base: str, address: str) -> None:
        ctx = self.ctx
        try:
            if await ctx.limits.take(limit_key(ctx.settings.jwt_secret, email), RESETS_PER_EMAIL, RESET_WINDOW):
                return
            account = await ctx.accounts.by_email(email)
            if account is None:
                return
            await ctx.audit.record(
                "password.reset_requested",
                account["_id"],
                ANONYMOUS,
                address,
                {"emailed": bool(ctx.outbox.mailer and base)},
            )
            mailer = ctx.outbox.mailer  # the alert emails' sender (webhooks/mail.py): SMTP_URL
            if mailer is None or not base:
                log.warning(
                    "password reset asked for account %s: no SMTP_URL or PUBLIC_URL, no email sent", account["_id"]
                )
                return
            s = ctx.settings
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
        except Exception as exc:  # after the answer: nobody to tell but the log (never the link)
            log.warning("password reset email not sent: %s", type(exc).__name__)


class ResetHandler(AuthHandler):
    """Sets a new password from an emailed link; every session of the account ends."""

    async def post(self) -> None:
        body = validate_body(self.json_body(), RESET)
        s = self.ctx.settings
        claims = tokens.purpose_of(s.jwt_secret, tokens.RESET, body["token"])
        invalid = ValidationError([error(["body", "token"], _INVALID, "value_error")])
        if claims is None:
            raise invalid
        account_id, version, bound = claims.account_id, claims.version, claims.bound
        account = await self.ctx.signin.for_reset(account_id)
        if (
            account is None
            or account.get("session_version", 0) != version
            or not hmac.compare_digest(fingerprint(s.jwt_secret, account["password_hash"]), bound)
        ):
            raise invalid
        digest = await self.hash(passwords.hash_password, body["password"], s.password_scrypt_n)
        if await self.ctx.signin.reset_password(account_id, account["password_hash"], digest) is None:
            raise invalid  # used at the same moment by another request
        self.ctx.account_cache.invalidate(account_id)  # every session ends here at once, elsewhere within a second
        self.ctx.login_throttle.succeeded(account["email"], self.client_ip())
        self.account_id = account_id
        await self.audit("password.reset", account_id)
        self.send_json({"ok": True, "detail": "Password changed; sign in with the new one"})


routes = [
    (r"/auth/password/forgot", ForgotHandler),
    (r"/auth/password/reset", ResetHandler),
]
