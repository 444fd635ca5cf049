"""What the whole synthetic world is built on: its sizes, time span and id schemes, and the
deterministic hash every attribute is derived from."""

from __future__ import annotations

import calendar
import re

N_ACTIVE = 3000
N_LURKERS = 57000
N_USERS = N_ACTIVE + N_LURKERS
N_TWEETS = 30000
N_LISTS = 40
N_EMPTY_LISTS = 6
N_SPACES = 24
# Lurker followers of the big accounts (user indices 0..4), newest first.
BIG_LURKER_FOLLOWERS = (21000, 27000, 34000, 45000, 56000)
N_BIG = len(BIG_LURKER_FOLLOWERS)

START_S = calendar.timegm((2022, 6, 1, 0, 0, 0))
END_S = calendar.timegm((2024, 12, 31, 0, 0, 0))
# The platform started showing view counts in December 2022; older tweets have none.
VIEWS_SINCE_S = calendar.timegm((2022, 12, 15, 0, 0, 0))
TWEPOCH_MS = 1288834974657  # snowflake epoch

# User ids are BASE + index * STEP + jitter (jitter < STEP): they look arbitrary
# but decode back to the index with one division.
USER_ID_BASE = 12_000_000
USER_ID_STEP = 104_729

M64 = (1 << 64) - 1
LURKER_MUL = 7_654_321  # coprime with 10**8
LURKER_MUL_INV = pow(LURKER_MUL, -1, 10**8)


def h64(*parts: int) -> int:
    """A cheap, well-mixed deterministic hash: fold the parts, then splitmix64's finalizer."""
    x = 0
    for p in parts:
        x = (x * 0x100000001B3 + p) & M64
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & M64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & M64
    return x ^ (x >> 31)


B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def b62(n: int, width: int) -> str:
    out = []
    for _ in range(width):
        n, r = divmod(n, 62)
        out.append(B62[r])
    return "".join(out)


_WORD = re.compile(r"\w+")


def is_digits(s: str) -> bool:
    return s.isascii() and s.isdigit()


def log_uniform(bits: int, octaves: int) -> int:
    """An integer between 0 and 2**octaves, log-uniformly distributed (heavy-tailed counts)."""
    return int(2 ** ((bits & 0x3FF) / 1023 * octaves)) - 1


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())
