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
PUBLIC_URL, development links point at the host the request named, and production sends none. The lookups, the
limit, the email and the conditional write: services/auth.py."""

import asyncio

from handlers.auth.handlers import CREDENTIALS, AuthHandler
from handlers.errors import ValidationError, error
from handlers.validation import Field, validate_body
from security import passwords

FORGOT = [Field("email", str, min_length=1, max_length=254, description="The account's email address")]
RESET = [
    Field("token", str, min_length=1, max_length=1024, description="The token of the emailed link"),
    next(f for f in CREDENTIALS if f.name == "password"),
]
ACCEPTED = {"detail": "If an account uses this address, a link to reset its password is on its way"}
_INVALID = "This link is invalid, expired or already used; ask for a new one"
_pending: set[asyncio.Task] = set()  # sends under way (a task nobody holds may be collected mid-way)


class ForgotHandler(AuthHandler):
    """Always 202, the same body, answered before the address is looked up."""

    async def post(self) -> None:
        email = validate_body(self.json_body(), FORGOT)["email"].strip().lower()
        self.throttle()  # per client address, as logins
        base = self.config.public_url.rstrip("/")
        if not base and not self.config.production:
            base = f"{self.request.protocol}://{self.request.host}"
        task = asyncio.create_task(self.services.auth.send_reset_link(email, base, self.client_ip()))
        _pending.add(task)
        task.add_done_callback(_pending.discard)
        self.send_json(ACCEPTED, status=202)


class ResetHandler(AuthHandler):
    """Sets a new password from an emailed link; every session of the account ends."""

    async def post(self) -> None:
        body = validate_body(self.json_body(), RESET)
        invalid = ValidationError([error(["body", "token"], _INVALID, "value_error")])
        account = await self.services.auth.reset_target(body["token"])
        if account is None:
            raise invalid
        account_id = account["_id"]
        digest = await self.hash(passwords.hash_password, body["password"], self.config.password_scrypt_n)
        if not await self.services.auth.reset_password(account, digest):
            raise invalid  # used at the same moment by another request
        self.ctx.throttles.login.succeeded(account["email"], self.client_ip())
        self.account_id = account_id
        await self.audit("password.reset", account_id)
        self.send_json({"ok": True, "detail": "Password changed; sign in with the new one"})


routes = [
    (r"/auth/password/forgot", ForgotHandler),
    (r"/auth/password/reset", ResetHandler),
]
