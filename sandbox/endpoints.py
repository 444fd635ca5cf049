"""The provider's 22 data endpoints: parameters, paging and envelopes.

ENDPOINTS maps a path (after the prefix) to a function and to the top-level keys of
its response in the spec's order.  A function returns the variable parts of the
envelope: {"items": [...], "has_next": bool, "cursor": str} for lists, or
{"data": ...}; `respond` adds status and message (`message` or `msg`, per endpoint).

Behaviour where the spec is silent (documented in docs/api.md, The sandbox upstream):
* Unknown user/tweet/list/community/space/woeid: HTTP 200 with status "error", a
  "... not found" message, an empty results array (or data null) and, on paged
  endpoints, has_next_page false and next_cursor "".  Unknown ids in the batch
  endpoints (/tweets, batch_info_by_ids) are simply left out.
* Bad input (missing required parameter, a non-integer where an integer is expected,
  an undecodable cursor, an unknown queryType, too many ids): HTTP 400 with
  {"status": "error", "msg": ...}.
* Cursors are opaque (base64 of an offset), except followers_ids whose cursor is the
  integer offset, sent back as a string.
"""

from __future__ import annotations

import base64
import binascii
import functools
from collections.abc import Callable, Sequence

from . import render, search
from .basis import is_digits
from .groups import WOEIDS
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
    """Query parameters (the last value of each wins; empty means absent)."""

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

    def __getitem__(self, s: slice) -> list:
        n = len(self.head)
        start, stop = s.start or 0, s.stop
        out = list(self.head[start:stop])
        return out + list(self.tail[max(start - n, 0) : max(stop - n, 0)])


# ---- lookups -------------------------------------------------------------------


def _user(w: World, a: Args, by_name: str | None = None, by_id: str | None = None) -> int:
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


def _tweet(w: World, a: Args) -> int:
    i = w.tweet_by_id(a.require("tweetId"), a.now)
    if i is None:
        raise NotFound("tweet not found")
    return i


def _in(table: dict[str, int], key: str, what: str) -> int:
    if key not in table:
        raise NotFound(f"{what} not found")
    return table[key]


def _tweets_page(w: World, a: Args, seq: Sequence[int], moving: bool = False) -> dict:
    """A page of tweets; a moving list (one with live posts) carries its time in the cursor."""
    return page(seq, a.offset(), TWEET_PAGE, lambda i: render.tweet(w, i), a.asof() if moving else None)


def _users_page(w: World, a: Args, seq: Sequence[int], size: int) -> dict:
    return page(seq, a.offset(), size, lambda u: render.user(w, u))


# ---- endpoints -----------------------------------------------------------------


def advanced_search(w: World, a: Args) -> dict:
    query, query_type = a.require("query"), a.choice("queryType", ("Latest", "Top"))
    try:
        archived = search.search_tweets(w, query, query_type)
    except search.QueryError as e:
        raise BadRequest(f"invalid query: {e}") from None
    if not search.moves(w, query):
        return _tweets_page(w, a, archived)
    live = search.search_live(w, query, query_type, a.asof())
    if query_type == "Latest" or not live:
        return _tweets_page(w, a, Joined(live, archived), moving=True)
    # Top: both lists are ranked; the first `end` of the merge come from live + archived[:end].
    end = a.offset() + TWEET_PAGE
    ranked = sorted(live + archived[:end], key=lambda i: (w.engagement(i), i), reverse=True)
    rest = range(max(len(live) + len(archived) - end, 0))  # only counted: pages never reach past `end`
    return _tweets_page(w, a, Joined(ranked[:end], rest), moving=True)


def _own_tweets(w: World, a: Args, u: int, replies: bool, parents: bool = False) -> Joined:
    """A user's timeline: their live posts (never replies), then the archive's."""
    live = w.live_where(a.asof(), lambda t: t.author == u) if u in w.live_poster_set else []
    return Joined(live, _archived_tweets(w, u, replies, parents))


@functools.lru_cache(maxsize=1024)
def _archived_tweets(w: World, u: int, replies: bool, parents: bool) -> list[int]:
    out = []
    # Lurkers (ids past the active users) have never posted: an empty timeline, not an IndexError (500).
    for i in reversed(w.by_author[u] if u < len(w.by_author) else ()):
        parent = w.tweets[i].parent
        if parent >= 0 and not replies:
            continue
        if parent >= 0 and parents:
            out.append(parent)  # shown above the reply, as in the posts-and-replies tab
        out.append(i)
    return out


def tweet_timeline(w: World, a: Args) -> dict:
    u = _user(w, a, by_id="userId")
    own = _own_tweets(w, a, u, a.boolean("includeReplies", False), a.boolean("includeParentTweet", False))
    return _tweets_page(w, a, own, moving=u in w.live_poster_set)


def last_tweets(w: World, a: Args) -> dict:
    u = _user(w, a, by_name="userName", by_id="userId")
    own = _own_tweets(w, a, u, a.boolean("includeReplies", False))
    return _tweets_page(w, a, own, moving=u in w.live_poster_set)


def thread_context(w: World, a: Args) -> dict:
    i = _tweet(w, a)
    return _tweets_page(w, a, w.ancestors(i) + [i] + w.descendants(i))


def replies(w: World, a: Args) -> dict:
    return _tweets_page(w, a, w.replies.get(_tweet(w, a), [])[::-1])


def replies_v2(w: World, a: Args) -> dict:
    """Direct replies in queryType order, each followed by the replies below it."""
    i, order = _tweet(w, a), a.choice("queryType", ("Relevance", "Latest", "Likes"))
    direct = w.replies.get(i, [])
    author = w.tweet(i).author
    if order == "Latest":
        key = lambda j: j  # noqa: E731
    elif order == "Likes":
        key = lambda j: (w.tweets[j].likes, j)  # noqa: E731
    else:  # the author's own follow-ups first, then by engagement
        key = lambda j: (w.tweets[j].author == author, w.engagement(j), j)  # noqa: E731
    items = []
    for j in sorted(direct, key=key, reverse=True):
        items.append(j)
        items.extend(w.descendants(j))
    return _tweets_page(w, a, items)


def quotes(w: World, a: Args) -> dict:
    return _tweets_page(w, a, w.quotes.get(_tweet(w, a), [])[::-1])


def mentions(w: World, a: Args) -> dict:
    u = _user(w, a, by_name="userName")
    live = w.live_where(a.asof(), lambda t: t.mention == u) if u in w.live_poster_set else []
    return _tweets_page(w, a, Joined(live, w.mentions.get(u, [])[::-1]), moving=u in w.live_poster_set)


def list_timeline(w: World, a: Args) -> dict:
    return _tweets_page(w, a, w.list_timeline(_in(w.list_by_id, a.require("listId"), "list")))


def community_tweets(w: World, a: Args) -> dict:
    c = _in(w.community_by_id, a.require("community_id"), "community")
    return _tweets_page(w, a, w.communities[c].tweets)


def followers(w: World, a: Args) -> dict:
    u = _user(w, a, by_name="userName")
    return _users_page(w, a, w.followers(u), a.integer("pageSize", 200, 1, 200))


def followings(w: World, a: Args) -> dict:
    u = _user(w, a, by_name="userName")
    return _users_page(w, a, w.following(u), a.integer("pageSize", 200, 1, 200))


def verified_followers(w: World, a: Args) -> dict:
    u = _user(w, a, by_id="user_id")
    return _users_page(w, a, w.verified_followers(u), USER_PAGE)


def followers_ids(w: World, a: Args) -> dict:
    """Large pages of ids; the cursor is the integer offset (-1 or 0 start)."""
    u = _user(w, a, by_name="userName", by_id="userId")
    count = a.integer("count", 5000, 50, 5000)
    offset = a.integer("cursor", 0, lo=0)
    seq = w.followers(u)
    chunk = seq[offset : offset + count]
    end = offset + len(chunk)
    more = end < len(seq)
    return {"items": [w.user_id(f) for f in chunk], "has_next": more, "cursor": str(end) if more else ""}


def user_search(w: World, a: Args) -> dict:
    return _users_page(w, a, search.search_users(w, a.require("query")), USER_PAGE)


def user_info(w: World, a: Args) -> dict:
    return {"data": render.user(w, _user(w, a, by_name="userName"), full=True)}


def batch_info_by_ids(w: World, a: Args) -> dict:
    found = (w.user_by_id(uid) for uid in a.id_list("userIds"))
    return {"items": [render.user(w, u, full=True) for u in found if u is not None]}


def tweets(w: World, a: Args) -> dict:
    found = (w.tweet_by_id(tid, a.now) for tid in a.id_list("tweet_ids"))
    return {"items": [render.tweet(w, i) for i in found if i is not None]}


def user_about(w: World, a: Args) -> dict:
    u = _user(w, a, by_name="userName")
    return {"data": {"data": {"user_result_by_screen_name": render.user_about(w, u)}}}


def space_detail(w: World, a: Args) -> dict:
    s = _in(w.space_by_id, a.require("space_id"), "space")
    return {"data": {"data": {"audio_space_by_rest_id": render.space_detail(w, s)}}}


def community_info(w: World, a: Args) -> dict:
    c = _in(w.community_by_id, a.require("community_id"), "community")
    return {"data": {"data": {"community_results_by_rest_id": render.community_info(w, c)}}}


def trends(w: World, a: Args) -> dict:
    woeid = a.integer("woeid", 1)
    count = a.integer("count", 30, 1, 50)
    if woeid not in WOEIDS:
        raise NotFound(f"woeid {woeid} not found")
    return {"items": render.trends(w, woeid, count)}


# Answers that change as live posts appear: cached per wall-clock second, not for ever.
MOVING = frozenset(("tweet/advanced_search", "user/tweet_timeline", "user/last_tweets", "user/mentions", "tweets"))

_PAGED = ("status", "message", "has_next_page", "next_cursor")
ENDPOINTS: dict[str, tuple[Callable[[World, Args], dict], tuple[str, ...]]] = {
    "tweet/advanced_search": (advanced_search, ("tweets",) + _PAGED),
    "user/tweet_timeline": (tweet_timeline, ("tweets",) + _PAGED),
    "tweet/thread_context": (thread_context, ("replies", "has_next_page", "next_cursor", "status", "message")),
    "user/verifiedFollowers": (verified_followers, ("followers",) + _PAGED),
    "community/tweets": (community_tweets, ("tweets", "status", "msg", "has_next_page", "next_cursor")),
    "user/followers": (followers, ("followers",) + _PAGED),
    "user/followings": (followings, ("followings",) + _PAGED),
    "spaces/detail": (space_detail, ("status", "msg", "data")),
    "user_about": (user_about, ("status", "msg", "data")),
    "user/batch_info_by_ids": (batch_info_by_ids, ("status", "msg", "users")),
    "user/info": (user_info, ("status", "msg", "data")),
    "trends": (trends, ("trends", "status", "msg")),
    "list/tweets_timeline": (list_timeline, ("tweets",) + _PAGED),
    "user/followers_ids": (followers_ids, ("ids", "has_next_page", "next_cursor", "status", "msg")),
    "tweet/quotes": (quotes, ("tweets",) + _PAGED),
    "user/last_tweets": (last_tweets, ("tweets",) + _PAGED),
    "tweet/replies/v2": (replies_v2, ("tweets",) + _PAGED),
    "tweet/replies": (replies, ("replies",) + _PAGED),
    "user/mentions": (mentions, ("tweets",) + _PAGED),
    "user/search": (user_search, ("users", "status", "msg", "has_next_page", "next_cursor")),
    "tweets": (tweets, ("status", "message", "tweets")),
    "community/info": (community_info, ("status", "msg", "data")),
}


def respond(w: World, path: str, a: Args) -> dict:
    """The response body of a known endpoint.  Raises BadRequest."""
    func, keys = ENDPOINTS[path]
    try:
        result, status, message = func(w, a), "success", ""
    except NotFound as e:
        result, status, message = {}, "error", str(e)
    body = {}
    for key in keys:
        if key == "status":
            body[key] = status
        elif key in ("message", "msg"):
            body[key] = message
        elif key == "has_next_page":
            body[key] = result.get("has_next", False)
        elif key == "next_cursor":
            body[key] = result.get("cursor", "")
        elif key == "data":
            body[key] = result.get("data")
        else:
            body[key] = result.get("items", [])
    return body
