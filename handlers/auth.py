"""Accounts and sessions: register, login, me, attribution."""

import asyncio
import time

from handlers.base import ApiError, BaseHandler, authenticated
from handlers.validation import Field, ValidationError, error, no_operators, validate_body
from security import passwords, tokens
from storage.accounts import DuplicateEmail


def _varied(value: str, loc: list) -> None:
    # Length is what makes a password strong (NIST 800-63B); one character class only is still refused.
    if len(set(value)) < 4:
        raise ValidationError([error(loc, "Password is too weak: use at least 4 different characters", "value_error")])


CREDENTIALS = [
    Field("email", str, format="email", max_length=254),
    Field("password", str, min_length=8, max_length=128, check=_varied),
]
LOGIN = [Field("email", str, min_length=1, max_length=254), Field("password", str, min_length=1, max_length=128)]
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


class AuthHandler(BaseHandler):
    async def hash(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.ctx.executor, fn, *args)

    def throttle(self, email: str | None = None) -> None:
        """429 past the per-address attempt limit or the per-email failure limit; one answer for both."""
        throttle = self.ctx.login_throttle
        if throttle is None:
            return
        # client_ip(): X-Forwarded-For counts only from TRUSTED_PROXIES.
        wait = throttle.check(self.client_ip(), email, time.monotonic())
        if wait:
            self.log_fields["throttled"] = True
            raise ApiError(429, "Too many attempts; retry later", {"Retry-After": str(wait)})

    def session(self, account_id: str) -> None:
        s = self.ctx.settings
        token = tokens.issue(s.jwt_secret, account_id, s.token_ttl_seconds)
        self.send_json(
            {"token": token, "token_type": "bearer", "account_id": account_id, "expires_in": s.token_ttl_seconds}
        )


class RegisterHandler(AuthHandler):
    """Creates an account and returns a session token."""

    async def post(self) -> None:
        body = validate_body(self.json_body(), CREDENTIALS)
        email = body["email"].strip().lower()
        self.throttle()  # per address: hashing is expensive, and registration answers which emails exist
        digest = await self.hash(passwords.hash_password, body["password"], self.ctx.settings.password_scrypt_n)
        try:
            account = await self.ctx.accounts.create(email, digest, self.ctx.settings.signup_credits)
        except DuplicateEmail:
            raise ApiError(409, "An account with this email already exists") from None
        self.account_id = account["_id"]
        self.session(account["_id"])


class LoginHandler(AuthHandler):
    """Returns a session token for valid credentials; one answer for every kind of failure."""

    async def post(self) -> None:
        body = validate_body(self.json_body(), LOGIN)
        email = body["email"].strip().lower()
        self.throttle(email)  # counted as a failure until proven right, known email or not
        account = await self.ctx.accounts.by_email(email)
        stored = account["password_hash"] if account else self.ctx.decoy_hash
        ok = await self.hash(passwords.verify_password, body["password"], stored)
        if not (ok and account):
            raise ApiError(401, "Incorrect email or password")
        if self.ctx.login_throttle is not None:
            self.ctx.login_throttle.succeeded(email)
        self.account_id = account["_id"]
        self.session(account["_id"])


class MeHandler(BaseHandler):
    """The account behind the session token."""

    @authenticated
    async def get(self) -> None:
        account = await self.current_account()
        self.send_json(
            {
                "account_id": account["_id"],
                "email": account["email"],
                "is_admin": self.is_admin(account),
                "created_at": account["created_at"],
            }
        )


class AttributionHandler(BaseHandler):
    """Stores first-touch data set-once and links earlier anonymous events; best effort."""

    @authenticated
    async def post(self) -> None:
        account_id = self.current_user
        data = self.json_body()
        try:
            body = validate_body(data, ATTRIBUTION)
            stored = await self.ctx.accounts.set_attribution(
                account_id, body.get("first_touch"), body.get("anonymous_id")
            )
        except Exception:  # best effort by contract: never fails the caller once authenticated
            stored = False
        self.send_json({"ok": True, "stored": stored})


routes = [
    (r"/auth/register", RegisterHandler),
    (r"/auth/login", LoginHandler),
    (r"/auth/me", MeHandler),
    (r"/auth/attribution", AttributionHandler),
]
