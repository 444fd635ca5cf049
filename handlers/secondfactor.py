"""The second factor of a sign-in, checked: shared by the login (handlers/auth.py) and the two-factor
endpoints (handlers/twofactor.py), which both build on it. The codes themselves: security/totp.py."""

import time

from handlers.base import ApiError, BaseHandler
from security import tokens, totp

CHALLENGE_TTL = 300  # seconds to type the code after the password was accepted


def enabled(account: dict | None) -> bool:
    return bool(account and (account.get("totp") or {}).get("enabled"))


def sealed_for(account_id: str) -> str:
    return f"totp:{account_id}"  # binds the sealed secret to its account (AES-GCM associated data)


def pepper(handler: BaseHandler) -> bytes:
    return totp.pepper(handler.ctx.settings.secrets_key)


def secret_of(handler: BaseHandler, account_id: str, sealed: str) -> str:
    return handler.ctx.vault.decrypt(sealed, sealed_for(account_id))


def challenge(handler: BaseHandler, account: dict) -> dict:
    """The first step's answer for an account with two-factor sign-in: no session yet, a challenge to send
    back with a code. It names the session version: a password change or reset voids it."""
    s = handler.ctx.settings
    token = tokens.issue_purpose(
        s.jwt_secret, tokens.CHALLENGE, account["_id"], CHALLENGE_TTL, account.get("session_version", 0)
    )
    return {"two_factor_required": True, "challenge": token, "expires_in": CHALLENGE_TTL}


async def check_code(handler: BaseHandler, account_id: str, code: str, recovery: bool = True) -> str:
    """Accepts a current TOTP code (once per time step) or, when `recovery`, an unused recovery code; what
    was used ("totp" or "recovery_code"). Throttled per account; a wrong code is 401 and audited."""
    throttle = handler.ctx.second_factor
    now = time.monotonic()
    wait = throttle.retry_after(account_id, now)
    if wait:
        handler.log_fields["throttled"] = True
        raise ApiError(429, "Too many wrong codes; retry later", {"Retry-After": str(max(1, int(wait) + 1))})
    throttle.add(account_id, now)  # counted until proven right: parallel guesses cannot all slip in
    state = await handler.ctx.signin.state(account_id)
    used = None
    if enabled(state):
        factor = state["totp"]
        secret = secret_of(handler, account_id, factor["sealed"])
        step = totp.matching_step(secret, code, factor.get("last_step", -1))
        if step is not None and await handler.ctx.signin.use_step(account_id, step):
            used = "totp"
        elif recovery and not totp.is_totp_code(code.strip()):
            left = await handler.ctx.signin.use_recovery(account_id, totp.recovery_digest(pepper(handler), code))
            if left is not None:
                used = "recovery_code"
                await handler.audit("2fa.recovery_used", account_id, {"recovery_codes_left": left})
    if used is None:
        await handler.audit("2fa.failed", account_id)
        raise ApiError(401, "Incorrect or already used code")
    throttle.clear(account_id)
    return used
