"""Accounts and sessions: register, login, logout, password change, me, switch, attribution; and what every
sign-in handler shares (`AuthHandler`: the throttle, the account a session acts for, issuing it, the second factor's
check). What they do with the stores: services/auth.py; their part of the OpenAPI document:
handlers/auth/openapi.py."""

import asyncio
import time

from handlers.base import BaseHandler, authenticated
from handlers.errors import ApiError
from handlers.validation import Field, ValidationError, error, no_operators, validate_body
from security import passwords
from services.auth import DuplicateEmail, TooManyCodes, enabled


def _varied(value: str, loc: list) -> None:
    # Length is what makes a password strong (NIST 800-63B); one character class only is still refused.
    if len(set(value)) < 4:
        raise ValidationError([error(loc, "Password is too weak: use at least 4 different characters", "value_error")])
    # NIST 800-63B also asks to refuse passwords known from breaches: the 30,000 most common ones.
    if passwords.is_common(value):
        raise ValidationError(
            [error(loc, "This password is one of the most common ones; choose another", "value_error")]
        )


CREDENTIALS = [
    Field("email", str, format="email", max_length=254),
    Field("password", str, min_length=8, max_length=128, check=_varied),
]
PASSWORD_CHANGE = [
    Field("current_password", str, min_length=1, max_length=128),
    Field("new_password", str, min_length=8, max_length=128, check=_varied),
]
LOGIN = [
    Field("email", str, min_length=1, max_length=254),
    Field("password", str, min_length=1, max_length=128),
    Field("code", str, required=False, min_length=6, max_length=32, description="With two-factor sign-in: a code"),
    Field(
        "own_account",
        bool,
        required=False,
        description="true: a sign-in that is in no account any more (removed from every one) starts an account of "
        "its own, owned by it (otherwise 403)",
    ),
]
SWITCH = [Field("account_id", str, min_length=1, max_length=64, description="One of the accounts in /auth/me")]
ATTRIBUTION = [
    Field(
        "first_touch",
        dict,
        required=False,
        check=no_operators,
        description="First-touch blob (utm_source, ...), stored once",
    ),
    Field("anonymous_id", str, required=False, min_length=1, max_length=128),
]


NO_ACCOUNT = "You are not a member of any account any more: ask an owner for an invitation"
OR_START = ", or start an account of your own"  # what a sign-in in no account may do (LoginHandler own_account)


CANNOT_START = (
    "This sign-in cannot start an account of its own: it is the sign-in of the account it registered, which others "
    "own now. Ask an owner for an invitation, or register anew with another email"
)


def may_start_account(sign_in: dict) -> bool:
    """Whether a sign-in in no account may start one of its own (services/auth.py start_own_account): an invited
    person's, or one whose own account lists it as owner (a start cut short); not a registered account's that
    others own now."""
    return bool(sign_in.get("person")) or sign_in["_id"] in (sign_in.get("owners") or [])


class AuthHandler(BaseHandler):
    def initialize(self, ctx, cookie: bool = False, **kwargs) -> None:
        """cookie=True: the portal's variant, which keeps the token in an HttpOnly cookie instead of the body."""
        super().initialize(ctx, **kwargs)
        self.cookie = self.xsrf_always = cookie

    async def hash(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.ctx.runtime.executor, fn, *args)

    def throttle(self, email: str | None = None) -> None:
        """429 past the per-address attempt limit or the per-email failure limit; one answer for both."""
        throttle = self.ctx.throttles.login
        if throttle is None:
            return
        # client_ip(): X-Forwarded-For counts only from TRUSTED_PROXIES.
        wait = throttle.check(self.client_ip(), email, time.monotonic())
        if wait:
            self.log_fields["throttled"] = True
            raise ApiError(429, "Too many attempts; retry later", {"Retry-After": str(wait)})

    async def home_account(self, person_id: str, account_id: str | None = None, may_start: bool = True) -> str:
        """The account a new session of the person acts for: `account_id` if they are its member, else their own
        account, else the first they joined; 403 when they are a member of none (saying they may start one of their
        own, unless `may_start` is False). Sets it as this request's
        account, and its member as the one acting (the audit log)."""
        memberships = await self.services.auth.memberships(person_id)
        chosen = next((m for m in memberships if m["account_id"] == (account_id or person_id)), None)
        if chosen is None and account_id is not None:
            raise ApiError(404, "Not found")  # not one of theirs: as if it did not exist
        chosen = chosen or (memberships[0] if memberships else None)
        if chosen is None:
            raise ApiError(403, NO_ACCOUNT + (OR_START if may_start else ""))
        self.account_id, self.person_id = chosen["account_id"], person_id
        self.acting = {"member_id": chosen["_id"], "email": chosen.get("email")}
        await self.services.auth.seen(chosen["account_id"], person_id)
        return chosen["account_id"]

    def issue_session(self, person_id: str, version: int = 0, account_id: str | None = None) -> None:
        s = self.config
        account_id = account_id or self.account_id or person_id
        token = self.services.sessions.issue(person_id, version, account_id)
        if self.cookie:
            # Page scripts never see the token: HttpOnly, same-site only, HTTPS only in production.
            self.set_cookie(
                self.session_cookie(),
                token,
                max_age=s.token_ttl_seconds,
                httponly=True,
                secure=s.production,
                samesite="Strict",
            )
            self.send_json({"account_id": account_id, "expires_in": s.token_ttl_seconds})
            return
        self.send_json(
            {"token": token, "token_type": "bearer", "account_id": account_id, "expires_in": s.token_ttl_seconds}
        )

    async def slow_down(self, email: str) -> None:
        """A failed login of an email under a spread-out guessing attack is answered late (never a lock)."""
        throttle = self.ctx.throttles.login
        delay = throttle.delay(email, time.monotonic()) if throttle is not None else 0.0
        if delay:
            self.log_fields["delayed_s"] = delay
            await asyncio.sleep(delay)

    async def checked_code(self, account_id: str, code: str, recovery: bool = True) -> str:
        """Accepts a current TOTP code (once per time step) or, when `recovery`, an unused recovery code; what
        was used ("totp" or "recovery_code"). Throttled per account (429); a wrong code is 401 and audited."""
        try:
            used, left = await self.services.auth.check_code(account_id, code, recovery)
        except TooManyCodes as exc:
            self.log_fields["throttled"] = True
            wait = str(max(1, int(exc.wait) + 1))
            raise ApiError(429, "Too many wrong codes; retry later", {"Retry-After": wait}) from None
        if used == "recovery_code":
            await self.audit("2fa.recovery_used", account_id, {"recovery_codes_left": left})
        if used is None:
            await self.audit("2fa.failed", account_id)
            raise ApiError(401, "Incorrect or already used code")
        return used


async def verified_password(handler: AuthHandler, email: str, password: str) -> None:
    """403 unless `password` is the account's (a signed-in user confirming a sensitive change); throttled as
    logins are, so a stolen session cannot become a way to guess the password."""
    handler.throttle(email)
    stored = await handler.services.auth.by_email(email)
    ok = stored is not None and await handler.hash(passwords.verify_password, password, stored["password_hash"])
    if not ok:
        await handler.slow_down(email)
        raise ApiError(403, "The current password is incorrect")
    handler.ctx.throttles.login.succeeded(email, handler.client_ip())


class RegisterHandler(AuthHandler):
    """Creates an account and returns a session token."""

    async def post(self) -> None:
        body = validate_body(self.json_body(), CREDENTIALS)
        email = body["email"].strip().lower()
        self.throttle()  # per address: hashing is expensive, and registration answers which emails exist
        address = self.client_ip()
        wait = self.ctx.throttles.signup.check(address, time.monotonic())  # per network: accounts cannot be farmed
        if wait:
            self.log_fields["throttled"] = True
            raise ApiError(429, "Too many registrations from your network; retry later", {"Retry-After": str(wait)})
        digest = await self.hash(passwords.hash_password, body["password"], self.config.password_scrypt_n)
        try:  # the one who registers owns the account; signup credits while the network has its share
            account, credits = await self.services.auth.register(
                email, digest, self.ctx.throttles.signup.network(address)
            )
        except DuplicateEmail:
            raise ApiError(409, "An account with this email already exists") from None
        await self.home_account(account["_id"])
        await self.audit("account.created", details={"credits": credits})
        self.issue_session(account["_id"])


class LoginHandler(AuthHandler):
    """Returns a session token for valid credentials; one answer for every kind of failure."""

    async def post(self) -> None:
        body = validate_body(self.json_body(), LOGIN)
        email = body["email"].strip().lower()
        self.throttle(email)  # counted as a failure until proven right, known email or not
        account = await self.services.auth.by_email(email)
        stored = account["password_hash"] if account else self.ctx.runtime.decoy_hash
        ok = await self.hash(passwords.verify_password, body["password"], stored)
        if not (ok and account):
            if account:  # an unknown email has no log to land in
                await self.audit("login.failed", account["_id"], {"email": email})
            await self.slow_down(email)
            raise ApiError(401, "Incorrect email or password")
        if self.ctx.throttles.login is not None:
            self.ctx.throttles.login.succeeded(email, self.client_ip())
        self.account_id = account["_id"]
        method = None
        if enabled(account):
            if "code" not in body:  # the second step: POST /auth/login/2fa (handlers/auth/twofactor.py)
                self.send_json(self.services.auth.challenge(account))
                return
            method = await self.checked_code(account["_id"], body["code"])
        started = None  # with own_account, a sign-in in no account starts one: the credits it got
        if body.get("own_account") and not await self.services.auth.memberships(account["_id"]):
            started = await self.own_account(account)
        await self.home_account(account["_id"], may_start=may_start_account(account))
        if started is not None:
            await self.audit("account.created", details={"credits": started, "own_account": True})
        await self.audit("login", details={"second_factor": method} if method else None)
        self.issue_session(account["_id"], account.get("session_version", 0))

    async def own_account(self, person: dict) -> int | None:
        """A sign-in in no account starts one of its own (services/auth.py); the credits it got when this request
        made it. 403 where it cannot (a registered sign-in whose account others own now: it may register anew with
        another email, or be invited)."""
        address, signup = self.client_ip(), self.ctx.throttles.signup
        wait = signup.check(address, time.monotonic()) if person.get("person") else 0  # a new account, as register's
        if wait:
            self.log_fields["throttled"] = True
            raise ApiError(429, "Too many registrations from your network; retry later", {"Retry-After": str(wait)})
        started = await self.services.auth.start_own_account(person, signup.network(address))
        if started is None:
            raise ApiError(403, CANNOT_START)
        made, credits = started
        return credits if made else None  # None: made by another request of theirs (audited there)


class LogoutHandler(BaseHandler):
    """Ends this session token; other sessions of the account go on."""

    @authenticated
    async def post(self) -> None:
        await self.services.sessions.end(self.session)
        await self.audit("logout")
        self.send_json({"ok": True})


class PasswordHandler(AuthHandler):
    """Changes the password; every earlier session token stops working, and a new one is returned."""

    @authenticated
    async def post(self) -> None:
        person = await self.current_person()
        body = validate_body(self.json_body(), PASSWORD_CHANGE)
        await verified_password(self, person["email"], body["current_password"])
        digest = await self.hash(passwords.hash_password, body["new_password"], self.config.password_scrypt_n)
        version = await self.services.sessions.password_changed(person["_id"], digest)
        if version is None:
            raise ApiError(401, "Invalid or expired token", {"WWW-Authenticate": "Bearer"})
        await self.audit("password.changed")
        self.issue_session(person["_id"], version, self.account_id)


class MeHandler(BaseHandler):
    """The person behind the session token and the account it acts for, with every account of theirs."""

    @authenticated
    async def get(self) -> None:
        account, person = await self.current_account(), await self.current_person()
        session = self.session
        memberships = await self.services.auth.memberships(person["_id"])
        # What tells the accounts apart in the portal's picker: each one's name, else the email it was registered with.
        labels = await self.services.account.labels([m["account_id"] for m in memberships])
        self.send_json(
            {
                "account_id": account["_id"],
                "email": person["email"],
                "is_admin": self.is_admin(person),
                "created_at": account["created_at"],
                "two_factor": bool((person.get("totp") or {}).get("enabled")),
                "person_id": person["_id"],
                "member_id": session.member_id,
                "role": session.role,
                "accounts": [
                    {
                        "account_id": m["account_id"],
                        "role": m["role"],
                        "name": labels.get(m["account_id"], {}).get("name"),
                        "email": labels.get(m["account_id"], {}).get("email"),
                    }
                    for m in memberships
                ],
            }
        )


class SwitchHandler(AuthHandler):
    """A session token of the same person for another of their accounts (404 for an account not theirs)."""

    @authenticated
    async def post(self) -> None:
        body = validate_body(self.json_body(), SWITCH)
        person_id, version = self.session.person_id, self.session.version
        await self.home_account(person_id, body["account_id"])
        self.issue_session(person_id, version, body["account_id"])


class AttributionHandler(BaseHandler):
    """Stores first-touch data set-once and links earlier anonymous events; best effort. An owner's (its
    operation's least role): how the account came is not a viewer's to write."""

    @authenticated
    async def post(self) -> None:
        account_id = self.current_user
        data = self.json_body()
        # Closed like every body: a property it does not know is 422. What the known ones hold is best effort.
        validate_body({name: None for name in data} if isinstance(data, dict) else data, ATTRIBUTION)
        try:
            body = validate_body(data, ATTRIBUTION)
            stored = await self.services.auth.set_attribution(
                account_id, body.get("first_touch"), body.get("anonymous_id")
            )
        except Exception:  # best effort by contract: never fails the caller once authenticated
            stored = False
        self.send_json({"ok": True, "stored": stored})


routes = [
    (r"/auth/register", RegisterHandler),
    (r"/auth/login", LoginHandler),
    (r"/auth/logout", LogoutHandler),
    (r"/auth/password", PasswordHandler),
    (r"/auth/me", MeHandler),
    (r"/auth/switch", SwitchHandler),
    (r"/auth/attribution", AttributionHandler),
]
