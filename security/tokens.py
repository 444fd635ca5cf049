"""Session tokens: HS256 JWTs with the algorithm pinned and exp/iat/sub required.

Each token carries a random id (`jti`, so POST /auth/logout can end just this one) and the
account's session version (`sv`: a password change increments it, ending every earlier token)."""

import secrets
import time
from dataclasses import dataclass

import jwt

ALGORITHM = "HS256"


@dataclass(frozen=True)
class Session:
    account_id: str
    version: int  # the account's session version when the token was issued
    token_id: str | None  # None: a token issued before tokens had ids
    expires: int  # unix seconds


def issue(secret: str, account_id: str, ttl_seconds: int, now: float | None = None, version: int = 0) -> str:
    now = int(time.time() if now is None else now)
    claims = {
        "sub": account_id,
        "iat": now,
        "exp": now + ttl_seconds,
        "typ": "session",
        "sv": version,
        "jti": secrets.token_urlsafe(12),
    }
    return jwt.encode(claims, secret, algorithm=ALGORITHM)


def _text(value, most: int = 64) -> bool:
    return isinstance(value, str) and 0 < len(value) <= most


def session_of(secret: str, token: str) -> Session | None:
    """The session a valid token names, else None (bad signature, alg, expiry, shape or claim types)."""
    try:
        claims = jwt.decode(
            token,
            secret,
            algorithms=[ALGORITHM],
            options={"require": ["sub", "iat", "exp"]},
            leeway=5,
        )
    except jwt.PyJWTError:
        return None
    version, token_id = claims.get("sv", 0), claims.get("jti")
    if (
        claims.get("typ") != "session"
        or not _text(claims["sub"])
        or type(version) is not int  # bool is an int to isinstance
        or not (token_id is None or _text(token_id))
    ):
        return None
    # A token issued in the future was not issued by us with a sane clock.
    if claims["iat"] > time.time() + 60:
        return None
    return Session(claims["sub"], version, token_id, int(claims["exp"]))
