"""The provider's data endpoints: the spec's 22 available ones here, the six beyond the spec
in more_endpoints.py; one table (ENDPOINTS) of both.

ENDPOINTS maps a path (after the prefix) to a function and to the top-level keys of
its response in the spec's (or the provider's documented) order.  A function returns the
variable parts of the envelope: {"items": [...], "has_next": bool, "cursor": str} for lists,
or {"data": ...}; `respond` adds status and message (`message` or `msg`, per endpoint).
Requests, lookups and paging are in args.py; unknown ids in the batch endpoints (/tweets,
batch_info_by_ids) are simply left out.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from . import more_endpoints as more
from . import render, search
from .args import (
    TWEET_PAGE,
    USER_PAGE,
    Args,
    BadRequest,
    Joined,
    NotFound,
    lookup,
    tweet_arg,
    tweets_page,
    user_arg,
    users_page,
)
from .groups import WOEIDS
from .world import World

__all__ = ["ENDPOINTS", "MOVING", "Args", "BadRequest", "respond"]


# ---- endpoints -----------------------------------------------------------------


def advanced_search(w: World, a: Args) -> dict:
    query, query_type = a.require("query"), a.choice("queryType", ("Latest", "Top"))
    query = search.absolute(query, a.asof())  # within_time: from the time the list is cut at
    try:
        archived = search.search_tweets(w, query, query_type)
    except search.QueryError as e:
        raise BadRequest(f"invalid query: {e}") from None
    if not search.moves(w, query):
        return tweets_page(w, a, archived)
    live = search.search_live(w, query, query_type, a.asof())
    if query_type == "Latest" or not live:
        return tweets_page(w, a, Joined(live, archived), moving=True)
    # Top: both lists are ranked; the first `end` of the merge come from live + archived[:end].
    end = a.offset() + TWEET_PAGE
    ranked = sorted(live + archived[:end], key=lambda i: (w.engagement(i), i), reverse=True)
    rest = range(max(len(live) + len(archived) - end, 0))  # only counted: pages never reach past `end`
    return tweets_page(w, a, Joined(ranked[:end], rest), moving=True)


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
    u = user_arg(w, a, by_id="userId")
    own = _own_tweets(w, a, u, a.boolean("includeReplies", False), a.boolean("includeParentTweet", False))
    return tweets_page(w, a, own, moving=u in w.live_poster_set)


def last_tweets(w: World, a: Args) -> dict:
    u = user_arg(w, a, by_name="userName", by_id="userId")
    own = _own_tweets(w, a, u, a.boolean("includeReplies", False))
    return tweets_page(w, a, own, moving=u in w.live_poster_set)


def thread_context(w: World, a: Args) -> dict:
    i = tweet_arg(w, a)
    return tweets_page(w, a, w.ancestors(i) + [i] + w.descendants(i))


def _in_time(w: World, a: Args, seq: Sequence[int]) -> Sequence[int]:
    """The provider's sinceTime (at or after) and untilTime (before), Unix seconds, when sent."""
    since, until = a.integer("sinceTime", 0), a.integer("untilTime", -1)
    if since <= 0 and until < 0:
        return seq
    lo, hi = since * 1000, until * 1000 if until >= 0 else None
    return [i for i in seq if w.tweet(i).ms >= lo and (hi is None or w.tweet(i).ms < hi)]


def replies(w: World, a: Args) -> dict:
    return tweets_page(w, a, _in_time(w, a, w.replies.get(tweet_arg(w, a), [])[::-1]))


def replies_v2(w: World, a: Args) -> dict:
    """Direct replies in queryType order, each followed by the replies below it."""
    i, order = tweet_arg(w, a), a.choice("queryType", ("Relevance", "Latest", "Likes"))
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
    return tweets_page(w, a, items)


def quotes(w: World, a: Args) -> dict:
    seq = _in_time(w, a, w.quotes.get(tweet_arg(w, a), [])[::-1])
    if not a.boolean("includeReplies", True):  # (in this world no quote is also a reply)
        seq = [i for i in seq if w.tweet(i).parent < 0]
    return tweets_page(w, a, seq)


def mentions(w: World, a: Args) -> dict:
    u = user_arg(w, a, by_name="userName")
    live = w.live_where(a.asof(), lambda t: t.mention == u) if u in w.live_poster_set else []
    seq = _in_time(w, a, Joined(live, w.mentions.get(u, [])[::-1]))
    return tweets_page(w, a, seq, moving=u in w.live_poster_set)


def list_timeline(w: World, a: Args) -> dict:
    return tweets_page(w, a, w.list_timeline(lookup(w.list_by_id, a.require("listId"), "list")))


def community_tweets(w: World, a: Args) -> dict:
    c = lookup(w.community_by_id, a.require("community_id"), "community")
    return tweets_page(w, a, w.communities[c].tweets)


def followers(w: World, a: Args) -> dict:
    u = user_arg(w, a, by_name="userName")
    return users_page(w, a, w.followers(u), a.integer("pageSize", 200, 1, 200))


def followings(w: World, a: Args) -> dict:
    u = user_arg(w, a, by_name="userName")
    return users_page(w, a, w.following(u), a.integer("pageSize", 200, 1, 200))


def verified_followers(w: World, a: Args) -> dict:
    u = user_arg(w, a, by_id="user_id")
    return users_page(w, a, w.verified_followers(u), USER_PAGE)


def followers_ids(w: World, a: Args) -> dict:
    """Large pages of ids; the cursor is the integer offset (-1 or 0 start)."""
    u = user_arg(w, a, by_name="userName", by_id="userId")
    count = a.integer("count", 5000, 50, 5000)
    offset = a.integer("cursor", 0, lo=0)
    seq = w.followers(u)
    chunk = seq[offset : offset + count]
    end = offset + len(chunk)
    more = end < len(seq)
    return {"items": [w.user_id(f) for f in chunk], "has_next": more, "cursor": str(end) if more else ""}


def user_search(w: World, a: Args) -> dict:
    return users_page(w, a, search.search_users(w, a.require("query")), USER_PAGE)


def user_info(w: World, a: Args) -> dict:
    return {"data": render.user(w, user_arg(w, a, by_name="userName"))}


def batch_info_by_ids(w: World, a: Args) -> dict:
    found = (w.user_by_id(uid) for uid in a.id_list("userIds"))
    return {"items": [render.user(w, u) for u in found if u is not None]}


def tweets(w: World, a: Args) -> dict:
    found = (w.tweet_by_id(tid, a.now) for tid in a.id_list("tweet_ids"))
    return {"items": [render.tweet(w, i) for i in found if i is not None]}


def user_about(w: World, a: Args) -> dict:
    u = user_arg(w, a, by_name="userName")
    return {"data": {"data": {"user_result_by_screen_name": render.user_about(w, u)}}}


def space_detail(w: World, a: Args) -> dict:
    s = lookup(w.space_by_id, a.require("space_id"), "space")
    return {"data": {"data": {"audio_space_by_rest_id": render.space_detail(w, s)}}}


def community_info(w: World, a: Args) -> dict:
    c = lookup(w.community_by_id, a.require("community_id"), "community")
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
    # Beyond the spec (more_endpoints.py), keys in the provider's documented order.
    "tweet/retweeters": (more.retweeters, ("users",) + _PAGED),
    "list/followers": (more.list_followers, ("followers", "has_next_page", "next_cursor", "status", "msg")),
    "list/members": (more.list_members, ("members", "has_next_page", "next_cursor", "status", "msg")),
    "community/members": (more.community_members, ("members", "has_next_page", "next_cursor", "status", "msg")),
    "user/check_follow_relationship": (more.check_follow_relationship, ("data", "status", "message")),
    "article": (more.article, ("article", "status", "message")),
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
        elif key in ("data", "article"):  # a single object: null when not found
            body[key] = result.get("data")
        else:
            body[key] = result.get("items", [])
    return body
