"""Session tokens: HS256 JWTs with the algorithm pinned and exp/iat/sub required."""

import time

import jwt

ALGORITHM = "HS256"


def issue(secret: str, account_id: str, ttl_seconds: int, now: float | None = None) -> str:
    now = int(time.time() if now is None else now)
    return jwt.encode(
        {"sub": account_id, "iat": now, "exp": now + ttl_seconds, "typ": "session"}, secret, algorithm=ALGORITHM
    )


def account_of(secret: str, token: str) -> str | None:
    """The account id a valid token names, else None (bad signature, alg, expiry or shape)."""
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
    if claims.get("typ") != "session" or not isinstance(claims["sub"], str):
        return None
    # A token issued in the future was not issued by us with a sane clock.
    if claims["iat"] > time.time() + 60:
        return None
    return claims["sub"]
