"""scrypt password hashes (hashlib; OWASP parameters by default), verified in constant time.

Hashing costs ~100 MiB and a good fraction of a second, so callers run these
functions in an executor, never on the event loop.
"""

import base64
import functools
import hashlib
import hmac
import os

_R, _P, _DKLEN = 8, 1, 32


def _scrypt(password: str, salt: bytes, n: int) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=n, r=_R, p=_P, dklen=_DKLEN, maxmem=256 * _R * n + (1 << 20))


def hash_password(password: str, n: int) -> str:
    salt = os.urandom(16)
    digest = _scrypt(password, salt, n)
    return f"scrypt${n}${_R}${_P}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def verify_password(password: str, stored: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt" or int(r) != _R or int(p) != _P:
            return False
        expected = base64.b64decode(digest)
        actual = _scrypt(password, base64.b64decode(salt), int(n))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(actual, expected)


# A real hash of a random password, checked when the email is unknown so that
# "no such account" takes as long as "wrong password" (no user enumeration by timing).
def decoy_hash(n: int) -> str:
    return hash_password(base64.b64encode(os.urandom(12)).decode(), n)


@functools.cache
def _common() -> frozenset[str]:
    # zxcvbn ships the 30,000 most common passwords of real breaches (lower case); loaded on first use.
    from zxcvbn.frequency_lists import FREQUENCY_LISTS

    return frozenset(FREQUENCY_LISTS["passwords"])


def is_common(password: str) -> bool:
    """Whether the password (in any case) is on the list of the most common ones."""
    return password.lower() in _common()
