"""Two-factor sign-in: TOTP (RFC 6238: SHA-1, 6 digits, 30 s, what every authenticator app reads) with
pyotp, its enrolment QR code, and recovery codes.

A code is accepted for the time step before, at and after now (clock drift of a phone), and only for a
step later than the last one used: the caller stores that step with a conditional write, so a code
(or an earlier one) cannot be replayed, not even by two requests at once. Recovery codes are 50
random bits each, shown once; only their keyed digests are kept (fast hashing is enough for random
values of that size, and the key makes a stolen database useless for guessing them offline)."""

import base64
import hashlib
import hmac
import io
import secrets
import time

import pyotp
import segno

ISSUER = "Social Gateway"
DIGITS, PERIOD, DRIFT_STEPS = 6, 30, 1
RECOVERY_CODES = 10
_RECOVERY_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"  # no 0/o, 1/l/i: read off paper and typed back


def new_secret() -> str:
    return pyotp.random_base32()  # 160 bits, as RFC 4226 recommends


def provisioning_uri(secret: str, email: str) -> str:
    return pyotp.TOTP(secret).provisioning_uri(name=email, issuer_name=ISSUER)


def qr_data_uri(uri: str) -> str:
    """The otpauth:// URI as an SVG QR code in a data: URI (the page policy allows data: images): made here,
    so the secret never reaches another service. CPU work of a few ms: callers use an executor."""
    out = io.BytesIO()
    segno.make(uri, error="m").save(out, kind="svg", scale=5, border=2, light="#fff", title="Authenticator QR code")
    return "data:image/svg+xml;base64," + base64.b64encode(out.getvalue()).decode()


def is_totp_code(code: str) -> bool:
    return len(code) == DIGITS and code.isascii() and code.isdigit()


def matching_step(secret: str, code: str, after_step: int = -1, now: float | None = None) -> int | None:
    """The time step `code` belongs to (drift of one step either way), if later than `after_step`; else None."""
    code = code.strip().replace(" ", "")
    if not is_totp_code(code):
        return None
    totp = pyotp.TOTP(secret)
    current = int((time.time() if now is None else now) // PERIOD)
    found = None
    for step in range(current - DRIFT_STEPS, current + DRIFT_STEPS + 1):
        # Every candidate is compared (constant work whichever matches).
        if hmac.compare_digest(totp.generate_otp(step), code) and step > after_step:
            found = step
    return found


def new_recovery_codes() -> list[str]:
    """Ten codes like `k7mq2-x9fdp`: 10 characters of a 31-letter alphabet, about 50 bits each."""
    codes = []
    for _ in range(RECOVERY_CODES):
        raw = "".join(secrets.choice(_RECOVERY_ALPHABET) for _ in range(10))
        codes.append(f"{raw[:5]}-{raw[5:]}")
    return codes


def recovery_digest(pepper: bytes, code: str) -> str:
    """The kept form of a recovery code; case, spaces and dashes as typed do not matter."""
    normal = code.strip().lower().replace("-", "").replace(" ", "")
    return hmac.new(pepper, normal.encode(), hashlib.sha256).hexdigest()


def pepper(secrets_key: str) -> bytes:
    return hmac.new(secrets_key.encode(), b"recovery-codes", hashlib.sha256).digest()
