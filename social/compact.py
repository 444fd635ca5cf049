"""Provider objects shaped for a language model (handlers/mcp/): the fields an agent uses, nothing else.

A raw post from the provider is about 2 KB (its author's whole profile inside it), so twenty are ~50 KB: more than
a model should hold to answer a question. A compact post keeps its id, link, text, time, author (id, handle,
name), counts, language, the ids that place it in a conversation and its media links (~300 bytes); a user its
profile's figures (~250 bytes). `fields` asks for more of the provider's own object, by its top-level names.

Text written by anyone (posts, bios, names) stays in data fields only: nothing here turns it into prose.
Pure functions, no I/O.
"""

import re
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

import orjson

_PROVIDER_TIME = "%a %b %d %H:%M:%S %z %Y"  # the provider's createdAt: "Sun Nov 29 05:28:28 +0000 2026"
_MONTHS = {m: n for n, m in enumerate("Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split(), 1)}
# The form the provider always sends, in UTC, read without strptime, which cost ~25-100 us a time here (its locale
# lock and format cache), for every post of a page (docs/benchmarks.md, "MCP tool calls"); another offset goes to
# strptime.
_UTC_TIME = re.compile(
    r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (" + "|".join(_MONTHS) + r") (\d\d?) (\d\d):(\d\d):(\d\d) \+0000 (\d{4})",
    re.ASCII,
)


def iso_time(value) -> str | None:
    """The provider's createdAt (or milliseconds since the epoch) as ISO 8601 UTC; None if unreadable."""
    try:
        if isinstance(value, int | float):
            moment = datetime.fromtimestamp(value / 1000, UTC)
        elif isinstance(value, str) and (m := _UTC_TIME.fullmatch(value)):
            month, day, hour, minute, second, year = m.groups()
            moment = datetime(int(year), _MONTHS[month], int(day), int(hour), int(minute), int(second))
        else:
            moment = datetime.strptime(value, _PROVIDER_TIME).astimezone(UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return None
    # Not strftime, which cost ~30 us a time here (and wrote years before 1000 with fewer than ISO 8601's 4 digits).
    return moment.replace(tzinfo=None).isoformat(timespec="seconds") + "Z"


def _count(value) -> int | None:
    """Counts come as numbers or numeric strings (viewCount)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def _extra(raw: dict, fields: Iterable[str], shaped: dict) -> dict:
    for name in fields:
        if name in raw and name not in shaped:
            shaped[name] = raw[name]
    return shaped


def _within(value, key: str):
    """`value[key]` when `value` is an object: an empty one may come as `[]` (as PHP writes it), or as anything."""
    return value.get(key) if isinstance(value, dict) else None


def _object(value) -> dict:
    """`value` when it is an object, else an empty one: a provider's panel may come as anything."""
    return value if isinstance(value, dict) else {}


def _pruned(shaped: dict) -> dict:
    """Absent rather than null or empty: every byte counts in a model's context."""
    return {k: v for k, v in shaped.items() if v not in (None, "", [], {})}


def tweet(raw: dict, fields: Iterable[str] = ()) -> dict:
    if not isinstance(raw, dict):
        return {}
    author = raw.get("author") if isinstance(raw.get("author"), dict) else {}
    media = _within(raw.get("entities"), "media") or _within(raw.get("extendedEntities"), "media")
    media = media if isinstance(media, list) else []
    quoted = raw.get("quoted_tweet")
    shaped = {
        "id": str(raw.get("id", "")),
        "url": raw.get("url"),
        "text": raw.get("text"),
        "created_at": iso_time(raw.get("createdAt")),
        "author": _pruned({"id": author.get("id"), "handle": author.get("userName"), "name": author.get("name")}),
        "likes": _count(raw.get("likeCount")),
        "replies": _count(raw.get("replyCount")),
        "reposts": _count(raw.get("retweetCount")),
        "quotes": _count(raw.get("quoteCount")),
        "views": _count(raw.get("viewCount")),
        "lang": raw.get("lang"),
        "reply_to": raw.get("inReplyToId"),
        "quote_of": quoted.get("id") if isinstance(quoted, dict) else None,
        # The conversation is worth a field only when it is not the post itself.
        "conversation_id": raw.get("conversationId") if raw.get("conversationId") != raw.get("id") else None,
        "media": [m.get("media_url_https") or m.get("url") for m in media if isinstance(m, dict)],
    }
    return _extra(raw, fields, _pruned(shaped))


def user(raw: dict, fields: Iterable[str] = ()) -> dict:
    if not isinstance(raw, dict):
        return {}
    shaped = {
        "id": str(raw.get("id", "")),
        "handle": raw.get("userName"),
        "name": raw.get("name"),
        "description": raw.get("description"),
        "location": raw.get("location"),
        "followers": _count(raw.get("followers")),
        "following": _count(raw.get("following")),
        "posts": _count(raw.get("statusesCount")),
        "verified": raw.get("isBlueVerified") or None,
        "created_at": iso_time(raw.get("createdAt")),
    }
    return _extra(raw, fields, _pruned(shaped))


def trend(raw: dict, fields: Iterable[str] = ()) -> dict:
    if not isinstance(raw, dict):
        return {}
    shaped = {"name": raw.get("name"), "query": raw.get("query"), "posts": _count(raw.get("tweet_volume"))}
    return _extra(raw, fields, _pruned(shaped))


def _find(node, key: str, depth: int = 0):
    """The first value under `key` anywhere in `node` (the provider's nested panels), breadth by nesting."""
    if depth > 8:
        return None
    if isinstance(node, dict):
        if key in node:
            return node[key]
        children = node.values()
    elif isinstance(node, list):
        children = node
    else:
        return None
    for child in children:
        found = _find(child, key, depth + 1)
        if found is not None:
            return found
    return None


def space(raw: dict, fields: Iterable[str] = ()) -> dict:
    meta = _object(_find(raw, "metadata"))
    host = _object(_find(meta.get("creator_results"), "core"))
    shaped = {
        "id": meta.get("rest_id"),
        "title": meta.get("title"),
        "state": meta.get("state"),
        "created_at": iso_time(meta.get("created_at")),
        "started_at": iso_time(meta.get("start")),
        "host": _pruned({"handle": host.get("screen_name"), "name": host.get("name")}),
        "listeners": _count(meta.get("total_live_listeners")),
        "replays": _count(meta.get("total_replay_watched")),
    }
    return _extra(meta, fields, _pruned(shaped))


def community(raw: dict, fields: Iterable[str] = ()) -> dict:
    found = _find(raw, "community_results_by_rest_id") or raw
    result = _object(found.get("result", found) if isinstance(found, dict) else None)
    shaped = {
        "id": result.get("rest_id"),
        "name": result.get("name"),
        "description": result.get("description"),
        "members": _count(result.get("member_count")),
        "moderators": _count(result.get("moderator_count")),
        "created_at": iso_time(result.get("created_at")),
        "join_policy": result.get("join_policy"),
    }
    return _extra(result, fields, _pruned(shaped))


def plain(raw, fields: Iterable[str] = ()):
    """An id (followers' ids) or any other value: as it came."""
    return raw


SHAPES = {"tweet": tweet, "user": user, "trend": trend, "space": space, "community": community, "id": plain}


def writable(item):
    """`item` as JSON can hold it: a value nested deeper than the JSON writer goes (a provider's field asked for by
    `fields`) is left out of an object, and such an item that is no object becomes null."""
    try:
        orjson.dumps(item)
        return item
    except TypeError:
        if not isinstance(item, dict):
            return None
    kept = {}
    for name, value in item.items():
        try:
            orjson.dumps(value)
        except TypeError:
            continue
        kept[name] = value
    return kept


def fit(items: list, budget: int, size: Callable[[object], int]) -> list:
    """The leading whole items whose sizes (`size`: an item's bytes with its separators) add up to at most `budget`
    bytes: at least none."""
    kept, used = [], 0
    for item in items:
        used += size(item)
        if used > budget:
            break
        kept.append(item)
    return kept


def cut(item, budget: int, size: Callable[[object], int]):
    """An item too large for a result on its own (a 25,000-character post, a large field asked for), made to fit
    `budget`: its longest texts shortened, each ending in "…", and `"cut": true`; at worst its id alone. Handed out
    so, it lets a cut page go on past it instead of stopping there."""
    if not isinstance(item, dict):
        return item
    shaped = orjson.loads(orjson.dumps(item))  # a deep copy to shorten
    shaped["cut"] = True
    while size(shaped) > budget:
        found = _longest_text(shaped)
        if found is None:
            return {"id": item.get("id"), "cut": True}
        holder, key, text = found
        holder[key] = text[: len(text) // 2] + "…"
    return shaped


def _longest_text(node):
    """(holder, key, text) of the longest string worth shortening anywhere in `node`: over 64 characters, so never an
    id and seldom a link. A walk with a stack of its own: a provider's object may nest deeper than recursion goes."""
    best, stack = None, [node]
    while stack:
        holder = stack.pop()
        pairs = holder.items() if isinstance(holder, dict) else enumerate(holder) if isinstance(holder, list) else ()
        for key, value in pairs:
            if isinstance(value, str):
                if len(value) > 64 and (best is None or len(value) > len(best[2])):
                    best = (holder, key, value)
            elif isinstance(value, dict | list):
                stack.append(value)
    return best
