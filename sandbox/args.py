"""A sandbox request: its parameters, cursors, the lookups every endpoint starts with, and paging.

Behaviour where the spec is silent (documented in sandbox/README.md):
* Unknown user/tweet/list/community/space/woeid: HTTP 200 with status "error", a
  "... not found" message (NotFound), an empty results array (or data null) and, on paged
  endpoints, has_next_page false and next_cursor "".
* Bad input (missing required parameter, a non-integer where an integer is expected,
  an undecodable cursor, an unknown queryType, too many ids): HTTP 400 with
  {"status": "error", "msg": ...} (BadRequest).
* Cursors are opaque (base64 of an offset, and for a list that moves with time, of the time
  of its first page), except followers_ids whose cursor is the integer offset.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Sequence

from . import render
from .basis import is_digits
from .world import World

TWEET_PAGE = 20
USER_PAGE = 20
MAX_IDS = 100


class BadRequest(Exception):
    """Answered with HTTP 400."""


class NotFound(Exception):
    """Answered with HTTP 200 and status "error", as the provider does."""


def encode_cursor(offset: int, asof: int | None = None) -> str:
    """A list that moves with time carries the time of its first page (asof), so that later
    pages are cut from the same list and never repeat or skip a post."""
    raw = f"sbx1:{offset}" if asof is None else f"sbx1:{offset}:{asof}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, int | None]:
    """(offset, asof or None)."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        tag, offset, *asof = raw.split(":")
        if tag == "sbx1" and is_digits(offset) and len(asof) <= 1 and all(is_digits(x) for x in asof):
            return int(offset), int(asof[0]) if asof else None
    except (binascii.Error, UnicodeDecodeError, ValueError):
        pass
    raise BadRequest("invalid cursor")


class Args:
    """Query parameters (the last value of each wins; empty means absent), and how the answer renders the
    world's posts and accounts: the twitterapi dialect's objects here, another dialect's in a subclass
    (sandbox.dialects)."""

    render_tweet = staticmethod(render.tweet)
    render_user = staticmethod(render.user)

    def __init__(self, query_arguments: dict[str, list[bytes]], now: int):
        self._args = query_arguments
        self.now = now  # the request's wall-clock second: what the moving lists show

    def get(self, name: str) -> str | None:
        values = self._args.get(name)
        if not values:
            return None
        value = values[-1].decode("utf-8", "replace").strip()
        return value or None

    def require(self, name: str) -> str:
        value = self.get(name)
        if value is None:
            raise BadRequest(f"missing required parameter: {name}")
        return value

    def integer(self, name: str, default: int, lo: int | None = None, hi: int | None = None) -> int:
        """An integer parameter, clamped to [lo, hi] like the provider's page sizes."""
        value = self.get(name)
        if value is None:
            return default
        try:
            n = int(value)
        except ValueError:
            raise BadRequest(f"{name} must be an integer") from None
        n = n if lo is None else max(n, lo)
        return n if hi is None else min(n, hi)

    def boolean(self, name: str, default: bool) -> bool:
        value = self.get(name)
        if value is None:
            return default
        if value.lower() in ("true", "1"):
            return True
        if value.lower() in ("false", "0"):
            return False
        raise BadRequest(f"{name} must be true or false")

    def choice(self, name: str, options: tuple[str, ...]) -> str:
        value = self.get(name)
        if value is None:
            return options[0]
        for option in options:
            if option.lower() == value.lower():
                return option
        raise BadRequest(f"{name} must be one of {', '.join(options)}")

    def offset(self) -> int:
        cursor = self.get("cursor")
        return 0 if cursor is None else decode_cursor(cursor)[0]

    def asof(self) -> int:
        """The time a moving list is cut at: its first page's (from the cursor), else now."""
        cursor = self.get("cursor")
        asof = None if cursor is None else decode_cursor(cursor)[1]
        return self.now if asof is None else min(asof, self.now)

    def id_list(self, name: str) -> list[str]:
        ids = list(dict.fromkeys(x.strip() for x in self.require(name).split(",") if x.strip()))
        if len(ids) > MAX_IDS:
            raise BadRequest(f"at most {MAX_IDS} ids in {name}")
        return ids


def page(seq: Sequence, offset: int, size: int, item: Callable, asof: int | None = None) -> dict:
    chunk = seq[offset : offset + size]
    end = offset + len(chunk)
    more = end < len(seq)
    return {"items": [item(x) for x in chunk], "has_next": more, "cursor": encode_cursor(end, asof) if more else ""}


class Joined:
    """Two result lists read as one (live posts, then the archive) without copying the archive."""

    def __init__(self, head: Sequence, tail: Sequence):
        self.head, self.tail = head, tail

    def __len__(self) -> int:
        return len(self.head) + len(self.tail)

    def __iter__(self):
        yield from self.head
        yield from self.tail

    def __getitem__(self, s: slice) -> list:
        n = len(self.head)
        start, stop = s.start or 0, s.stop
        out = list(self.head[start:stop])
        return out + list(self.tail[max(start - n, 0) : max(stop - n, 0)])


# ---- lookups -------------------------------------------------------------------


def user_arg(w: World, a: Args, by_name: str | None = None, by_id: str | None = None) -> int:
    """The user given by id or by handle (the id wins when both are sent)."""
    uid = a.get(by_id) if by_id else None
    handle = a.get(by_name) if by_name else None
    if uid is not None:
        u = w.user_by_id(uid)
    elif handle is not None:
        u = w.user_by_handle(handle)
    else:
        raise BadRequest("missing required parameter: " + " or ".join(p for p in (by_name, by_id) if p))
    if u is None:
        raise NotFound("user not found")
    return u


def tweet_arg(w: World, a: Args) -> int:
    i = w.tweet_by_id(a.require("tweetId"), a.now)
    if i is None:
        raise NotFound("tweet not found")
    return i


def lookup(table: dict[str, int], key: str, what: str) -> int:
    if key not in table:
        raise NotFound(f"{what} not found")
    return table[key]


def tweets_page(w: World, a: Args, seq: Sequence[int], moving: bool = False) -> dict:
    """A page of tweets; a moving list (one with live posts) carries its time in the cursor."""
    return page(seq, a.offset(), TWEET_PAGE, lambda i: a.render_tweet(w, i), a.asof() if moving else None)


def users_page(w: World, a: Args, seq: Sequence[int], size: int) -> dict:
    return page(seq, a.offset(), size, lambda u: a.render_user(w, u))
