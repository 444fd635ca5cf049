"""Two-factor sign-in (TOTP, security/totp.py): enrol, confirm, status, new recovery codes, disable; and the
second step of a login (POST /auth/login/2fa, its cookie variant /portal/login/2fa).

Enrolment: POST /auth/2fa/setup {password} answers the secret, its otpauth:// URI and a QR code; POST
/auth/2fa/enable {code} confirms it with a first code and answers the ten recovery codes (shown this once;
kept as keyed digests). Login of an enrolled account: POST /auth/login answers {"two_factor_required": true,
"challenge"} (no session yet); POST /auth/login/2fa {challenge, code} with a current code or a recovery code
answers the session; a challenge opens one session (spent in MongoDB by its first use, in every process:
a second use is 401). A login may also carry the code at once ({email, password, code}). Sessions and bearer
tokens are unchanged: the second factor is asked when one is issued, never on each request.

Wrong codes are throttled per account and process (5 per 5 minutes, then 429: services/auth.py `check_code`)."""

import asyncio
from datetime import UTC, datetime

from handlers.auth.handlers import AuthHandler, verified_password
from handlers.base import authenticated
from handlers.errors import ApiError, ValidationError, error
from handlers.validation import Field, validate_body
from security import totp
from services.auth import enabled

CODE = Field("code", str, min_length=6, max_length=32, description="A current 6-digit code, or a recovery code")
SETUP = [Field("password", str, min_length=1, max_length=128, description="The account's password")]
ENABLE = [Field("code", str, min_length=6, max_length=6, description="The 6-digit code the app shows")]
DISABLE = [
    Field("code", str, required=False, min_length=6, max_length=32, description="A current code or recovery code"),
    Field("password", str, required=False, min_length=1, max_length=128, description="Or the account's password"),
]
RECOVERY = [Field("code", str, min_length=6, max_length=6, description="A current 6-digit code")]
SECOND_STEP = [
    Field("challenge", str, min_length=1, max_length=1024, description="The challenge POST /auth/login answered"),
    CODE,
]
_USED = "This sign-in was already completed; enter your email and password again"


class StatusHandler(AuthHandler):
    """Whether two-factor sign-in is on, since when, and how many recovery codes are left."""

    @authenticated
    async def get(self) -> None:
        state = await self.services.auth.two_factor(self.person_id) or {}
        factor = state.get("totp") or {}
        on = enabled(state)
        self.send_json(
            {
                "enabled": on,
                "enrolled_at": factor.get("enrolled_at") if on else None,
                "recovery_codes_left": len(factor.get("recovery", [])) if on else 0,
                "required": self.config.admin_require_2fa and self.is_admin(await self.current_person()),
            }
        )


class SetupHandler(AuthHandler):
    """Starts an enrolment (the password is asked: a stolen session must not bind its own authenticator)."""

    @authenticated
    async def post(self) -> None:
        body = validate_body(self.json_body(), SETUP)
        account = await self.current_person()
        await verified_password(self, account["email"], body["password"])
        secret = await self.services.auth.begin_enrolment(account["_id"])
        if secret is None:
            raise ApiError(409, "Two-factor sign-in is already on; disable it first to enrol another authenticator")
        uri = totp.provisioning_uri(secret, account["email"])
        qr = await asyncio.get_running_loop().run_in_executor(self.ctx.runtime.executor, totp.qr_data_uri, uri)
        self.send_json(
            {"secret": secret, "otpauth_uri": uri, "qr_svg": qr, "digits": totp.DIGITS, "period": totp.PERIOD}
        )


class EnableHandler(AuthHandler):
    """Confirms the enrolment with a first code; answers the recovery codes, shown this once."""

    @authenticated
    async def post(self) -> None:
        code = validate_body(self.json_body(), ENABLE)["code"]
        account_id = self.person_id
        state = await self.services.auth.two_factor(account_id) or {}
        if enabled(state):
            raise ApiError(409, "Two-factor sign-in is already on")
        pending = state.get("totp_pending")
        if pending is None:
            raise ApiError(409, "No enrolment to confirm: start with POST /auth/2fa/setup")
        step = self.services.auth.enrolment_step(account_id, pending, code)
        if step is None:
            raise ValidationError(
                [
                    error(
                        ["body", "code"],
                        "Incorrect code: check the time on your phone and type the current one",
                        "value_error",
                    )
                ]
            )
        codes = await self.services.auth.enable(account_id, pending, step)
        if codes is None:
            raise ApiError(409, "This enrolment was replaced or confirmed meanwhile; start again")
        await self.audit("2fa.enabled")
        self.send_json({"enabled": True, "recovery_codes": codes})


class RecoveryCodesHandler(AuthHandler):
    """Ten new recovery codes (the old ones stop working), for a current code."""

    @authenticated
    async def post(self) -> None:
        code = validate_body(self.json_body(), RECOVERY)["code"]
        account_id = self.person_id
        if not enabled(await self.services.auth.two_factor(account_id)):
            raise ApiError(409, "Two-factor sign-in is off")
        await self.checked_code(account_id, code, recovery=False)
        codes = await self.services.auth.new_recovery_codes(account_id)
        await self.audit("2fa.recovery_regenerated")
        self.send_json({"recovery_codes": codes})


class DisableHandler(AuthHandler):
    """Turns two-factor sign-in off, for a current code (or a recovery code) or the password (the code counts
    when both are given)."""

    @authenticated
    async def post(self) -> None:
        body = validate_body(self.json_body(), DISABLE)
        if not body:
            raise ValidationError([error(["body"], "Give a current code or the password", "value_error")])
        account = await self.current_person()
        if not enabled(await self.services.auth.two_factor(account["_id"])):
            raise ApiError(409, "Two-factor sign-in is off")
        if "code" in body:
            method = await self.checked_code(account["_id"], body["code"])
        else:
            await verified_password(self, account["email"], body["password"])
            method = "password"
        await self.services.auth.disable(account["_id"])
        await self.audit("2fa.disabled", details={"confirmed_with": method})
        self.send_json({"enabled": False})


class SecondStepHandler(AuthHandler):
    """The second step of a login: the challenge of the first and a code; answers the session."""

    async def post(self) -> None:
        body = validate_body(self.json_body(), SECOND_STEP)
        auth = self.services.auth
        claims = auth.challenge_claims(body["challenge"])
        if claims is None:
            raise ApiError(401, "This sign-in expired; enter your email and password again")
        account_id, version = claims.account_id, claims.version
        state = await auth.two_factor(account_id)
        if state is None or state.get("session_version", 0) != version or claims.token_id is None:
            raise ApiError(401, "This sign-in expired; enter your email and password again")
        if await auth.challenge_spent(claims.token_id):  # before the code: a refused reuse spends none
            raise ApiError(401, _USED)
        method = await self.checked_code(account_id, body["code"])
        expires = datetime.fromtimestamp(claims.expires, UTC)
        if not await auth.spend_challenge(claims.token_id, account_id, expires):  # used at once elsewhere
            raise ApiError(401, _USED)
        await self.home_account(account_id)  # the person's: the account their new session acts for
        await self.audit("login", details={"second_factor": method})
        self.issue_session(account_id, version)


routes = [
    (r"/auth/2fa", StatusHandler),
    (r"/auth/2fa/setup", SetupHandler),
    (r"/auth/2fa/enable", EnableHandler),
    (r"/auth/2fa/recovery-codes", RecoveryCodesHandler),
    (r"/auth/2fa/disable", DisableHandler),
    (r"/auth/login/2fa", SecondStepHandler),
    (r"/portal/login/2fa", SecondStepHandler, {"cookie": True}),
]
