"""Session tokens: HS256 JWTs with the algorithm pinned and exp/iat/sub required.

Each token carries a random id (`jti`, so POST /auth/logout can end just this one), the person who signed in
(`sub`: the id of their sign-in, storage/members.py), the person's session version (`sv`: a password change
increments it, ending every earlier token) and the account it acts for (`acc`, left out when it is the person's
own account: the tokens of a one-person account are what they were before members)."""

import secrets
import time
from dataclasses import dataclass

import jwt

ALGORITHM = "HS256"


@dataclass(frozen=True)
class Session:
    account_id: str  # the account the token acts for
    version: int  # the person's session version when the token was issued
    token_id: str | None  # None: a token issued before tokens had ids
    expires: int  # unix seconds
    person_id: str = ""  # who signed in ("" only before it is read: session_of always sets it)
    role: str | None = None  # the person's role in the account, set by the session check (services/sessions.py)
    member_id: str | None = None
    email: str | None = None  # the member's email


def issue(
    secret: str,
    person_id: str,
    ttl_seconds: int,
    now: float | None = None,
    version: int = 0,
    account_id: str | None = None,
) -> str:
    now = int(time.time() if now is None else now)
    claims = {
        "sub": person_id,
        "iat": now,
        "exp": now + ttl_seconds,
        "typ": "session",
        "sv": version,
        "jti": secrets.token_urlsafe(12),
    }
    if account_id is not None and account_id != person_id:
        claims["acc"] = account_id
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
    version, token_id, account_id = claims.get("sv", 0), claims.get("jti"), claims.get("acc", claims["sub"])
    if (
        claims.get("typ") != "session"
        or not _text(claims["sub"])
        or not _text(account_id)
        or type(version) is not int  # bool is an int to isinstance
        or not (token_id is None or _text(token_id))
    ):
        return None
    # A token issued in the future was not issued by us with a sane clock.
    if claims["iat"] > time.time() + 60:
        return None
    return Session(account_id, version, token_id, int(claims["exp"]), person_id=claims["sub"])


# --- purpose tokens: a pending second factor, a password reset ---------------------------------------------------
# Signed with the same key but typed: session_of refuses them (typ), and each reader refuses the others.
CHALLENGE, RESET = "2fa", "reset"


@dataclass(frozen=True)
class Purpose:
    account_id: str
    version: int  # the account's session version when it was issued
    bound: str  # the fingerprint it must still match ("" when none)
    token_id: str | None  # its random id: a challenge is spent under it (storage/signin.py); None before ids
    expires: int  # unix seconds


def issue_purpose(secret: str, purpose: str, account_id: str, ttl_seconds: int, version: int, bound: str = "") -> str:
    """A short-lived token for one purpose. `version`: the account's session version (a password change or a
    reset voids it); `bound`: a fingerprint it must still match when used (a reset: the password hash's);
    `jti`: a random id, under which a single-use token is spent."""
    now = int(time.time())
    claims = {"sub": account_id, "iat": now, "exp": now + ttl_seconds, "typ": purpose, "sv": version, "b": bound}
    claims["jti"] = secrets.token_urlsafe(16)
    return jwt.encode(claims, secret, algorithm=ALGORITHM)


def purpose_of(secret: str, purpose: str, token: str) -> Purpose | None:
    """The claims of a valid token of this purpose, else None."""
    try:
        claims = jwt.decode(
            token, secret, algorithms=[ALGORITHM], options={"require": ["sub", "iat", "exp", "typ", "sv"]}
        )
    except jwt.PyJWTError:
        return None
    bound, token_id = claims.get("b", ""), claims.get("jti")
    if (
        claims["typ"] != purpose
        or not _text(claims["sub"])
        or type(claims["sv"]) is not int
        or type(bound) is not str
        or not (token_id is None or _text(token_id))
    ):
        return None
    return Purpose(claims["sub"], claims["sv"], bound, token_id, int(claims["exp"]))
