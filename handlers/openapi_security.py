"""The OpenAPI operations and schemas of account security: two-factor sign-in (handlers/twofactor.py) and password
reset (handlers/reset.py); the audit log's are in handlers/audit/openapi.py."""

from handlers import reset, twofactor
from handlers.openapi_operations import Operation
from handlers.openapi_schema import (
    TIME,
    B,
    I,
    S,
    array,
    body_schema,
    nullable,
    obj,
    ref,
    with_properties,
)
from security import roles

SECURITY_SCHEMAS = {
    "TwoFactorChallenge": obj(
        ("two_factor_required", "challenge", "expires_in"),
        two_factor_required={"const": True},
        challenge={"type": "string", "description": "Send it back to /auth/login/2fa with a code"},
        expires_in=I,
    ),
    "TwoFactorStep": body_schema(twofactor.SECOND_STEP),
    "TwoFactorSetup": body_schema(twofactor.SETUP),
    "TwoFactorEnrolment": obj(
        ("secret", "otpauth_uri", "qr_svg", "digits", "period"),
        secret={"type": "string", "description": "Base32, for typing into an authenticator app"},
        otpauth_uri=S,
        qr_svg={"type": "string", "description": "The otpauth URI as an SVG QR code, a data: URI"},
        digits=I,
        period=I,
    ),
    "TwoFactorEnable": body_schema(twofactor.ENABLE),
    "RecoveryCodes": obj(
        ("recovery_codes",),
        recovery_codes={**array(S), "description": "Ten single-use codes, shown this once"},
        enabled=B,
    ),
    "TwoFactorDisable": {
        **body_schema(twofactor.DISABLE),
        "anyOf": [{"required": [name], "properties": {name: S}} for name in ("code", "password")],
    },
    "TwoFactorRegenerate": body_schema(twofactor.RECOVERY),
    "TwoFactorStatus": with_properties(
        obj(
            ("enabled", "enrolled_at", "recovery_codes_left", "required"),
            enabled=B,
            enrolled_at=nullable(TIME),
            recovery_codes_left=I,
        ),
        # "required" is also obj()'s own parameter: added after.
        required={"type": "boolean", "description": "An admin while ADMIN_REQUIRE_2FA is on"},
    ),
    "TwoFactorOff": obj(("enabled",), enabled={"const": False}),
    "PasswordForgot": body_schema(reset.FORGOT),
    "PasswordReset": body_schema(reset.RESET),
    "Detail": obj(("detail",), detail=S),
    "PasswordResetDone": obj(("ok", "detail"), ok=B, detail=S),
}

SECURITY_OPERATIONS = [
    Operation(
        "post",
        "/auth/login/2fa",
        "The second step of a login with two-factor sign-in: the challenge and a current or recovery code",
        "auth",
        ref("Session"),
        security=None,
        body="TwoFactorStep",
        errors=(401, 413, 422, 429),
    ),
    Operation(
        "post",
        "/portal/login/2fa",
        "The portal's second step; the session goes to the HttpOnly cookie (needs the XSRF token)",
        "portal",
        ref("CookieSession"),
        security=None,
        body="TwoFactorStep",
        errors=(401, 403, 413, 422, 429),
    ),
    Operation(
        "get", "/auth/2fa", "Whether two-factor sign-in is on", "auth", ref("TwoFactorStatus"), role=roles.VIEWER
    ),
    Operation(
        "post",
        "/auth/2fa/setup",
        "Start enrolling an authenticator (asks the password): its secret and QR code",
        "auth",
        ref("TwoFactorEnrolment"),
        body="TwoFactorSetup",
        errors=(401, 403, 409, 413, 422, 429),
        role=roles.VIEWER,
    ),
    Operation(
        "post",
        "/auth/2fa/enable",
        "Confirm the enrolment with a first code; answers ten recovery codes, shown once",
        "auth",
        ref("RecoveryCodes"),
        body="TwoFactorEnable",
        errors=(401, 409, 413, 422),
        role=roles.VIEWER,
    ),
    Operation(
        "post",
        "/auth/2fa/recovery-codes",
        "Ten new recovery codes for a current code (the old ones stop working)",
        "auth",
        ref("RecoveryCodes"),
        body="TwoFactorRegenerate",
        errors=(401, 409, 413, 422, 429),
        role=roles.VIEWER,
    ),
    Operation(
        "post",
        "/auth/2fa/disable",
        "Turn two-factor sign-in off: a current code, a recovery code or the password",
        "auth",
        ref("TwoFactorOff"),
        body="TwoFactorDisable",
        errors=(401, 403, 409, 413, 422, 429),
        role=roles.VIEWER,
    ),
    Operation(
        "post",
        "/auth/password/forgot",
        "Email a single-use reset link (with SMTP_URL); the same 202 whether or not the address has an account",
        "auth",
        ref("Detail"),
        status=202,
        security=None,
        body="PasswordForgot",
        errors=(413, 422, 429),
    ),
    Operation(
        "post",
        "/auth/password/reset",
        "Set a new password with the emailed link's token; every session of the account ends",
        "auth",
        ref("PasswordResetDone"),
        security=None,
        body="PasswordReset",
        errors=(413, 422),
    ),
]
