"""SocialData (docs.socialdata.tools; full example answers at socialdata.gitbook.io): Twitter v1.1-style objects at
its own paths under https://api.socialdata.tools/twitter (the provider's base URL, as twitterapi's is
https://api.twitterapi.io/twitter), `Authorization: Bearer <key>`.

What it can serve (SERVED) is what maps onto one of its GET paths with nothing lost: search, a profile by handle,
one post by id, a user's posts (by id), mentions, quotes, reposters, verified followers, and the posts and members
of a List or a Community. It cannot serve the rest: batch lookups (`/tweets` of several ids: one id a call;
`user/batch_info_by_ids`: a POST), anything that names a user by handle where SocialData wants the numeric id
(followers, followings, followers_ids, last_tweets without `userId`), or whose shape or order has no counterpart
(thread_context, replies, replies/v2, user/search, trends, spaces, user_about, community/info, article, List
followers, follow relationships). A call of a served endpoint with a parameter SocialData has no counterpart
for (sinceTime / untilTime, includeReplies=false on quotes, includeParentTweet, several ids) is refused by
`request` with LookupError, as a call to an unserved endpoint: the router asks another provider.

`answer` turns its answer into ours, field by field (docs/providers.md, "Kinds and what each can serve"): ids as
strings, ISO dates as `Www Mmm dd HH:MM:SS +0000 yyyy`, the HTML `source` as the app's name, the envelope of the
endpoint (status, message or msg, has_next_page, next_cursor, the results key). A field SocialData has no
counterpart for is null (UNFILLABLE), never made up. Statuses: 404 of the user, post, List or Community looked up
is our HTTP 200 "... not found" answer (for `/tweets`: the id left out); 400 and 422 are our 400; 401, 402 (out
of credit), 403 and 429 stay what they are (the provider refusing our key: the key pool rests it); 5xx stay;
a 2xx we cannot read is a 502. Cursors are SocialData's own `next_cursor`, passed back as `cursor` (what they
hold beyond printable ASCII, spaces included, escaped in ours and restored: `_outward`, `_inward`)."""

import functools
from datetime import UTC, datetime
from urllib.parse import parse_qsl, quote, unquote, urlencode

import orjson

from social.endpoints import Endpoint

# Our fields SocialData's documented objects have no counterpart for: always null in its answers (filled only
# where an answer happens to carry the v1.1 field: display_text_range, conversation_id_str, media_count,
# pinned_tweet_ids_str). The tests blank these on the twitterapi side and compare the rest field by field.
UNFILLABLE = {
    "tweet": ("displayTextRange", "isLimitedReply"),
    "reply": ("conversationId",),  # a reply's conversation root is not in the v1.1 object; a post is its own
    "user": (
        "verifiedType",
        "hasCustomTimelines",
        "isTranslator",
        "mediaCount",
        "withheldInCountries",
        "affiliatesHighlightedLabel",
        "possiblySensitive",
        "pinnedTweetIds",
        "isAutomated",
        "automatedBy",
        "unavailable",
        "message",
        "unavailableReason",
        "profile_bio",
    ),
    "media": ("features", "media_key", "media_results"),  # of each entities.media item
}

# Our endpoint -> (what SocialData answers: "tweets" / "users" pages, one "user", one "tweet"; what a 404 means:
# the kind of object looked up, None when the endpoint looks none up; the envelope's keys in our order, with R for
# the results key and M for the message key).
_LEAD = ("R", "status", "M", "has_next_page", "next_cursor")
_TRAIL = ("R", "has_next_page", "next_cursor", "status", "M")
SERVED: dict[str, tuple[str, str | None, tuple[str, ...]]] = {
    "/tweet/advanced_search": ("tweets", None, _LEAD),
    "/user/info": ("user", "user", ("status", "M", "R")),
    "/tweets": ("tweet", "tweet", ("status", "M", "R")),
    "/user/tweet_timeline": ("tweets", "user", _LEAD),
    "/user/last_tweets": ("tweets", "user", _LEAD),
    "/user/mentions": ("tweets", "user", _LEAD),
    "/tweet/quotes": ("tweets", "tweet", _LEAD),
    "/tweet/retweeters": ("users", "tweet", _LEAD),
    "/user/verifiedFollowers": ("users", "user", _LEAD),
    "/list/tweets_timeline": ("tweets", "list", _LEAD),
    "/list/members": ("users", "list", _TRAIL),
    "/community/tweets": ("tweets", "community", _LEAD),
    "/community/members": ("users", "community", _TRAIL),
}

_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_TRUE = ("true", "1")
_CURSOR_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")


def _seg(value: str) -> str:
    """One path segment, whatever the customer sent: every reserved character and the dots escaped, so a value
    can neither leave its segment nor climb out of it (`..`)."""
    return quote(value, safe="", encoding="latin-1").replace(".", "%2E")


def _outward(cursor: str) -> str:
    """SocialData's cursor as ours: unchanged but for what our cursors may not hold (docs/api.md: printable ASCII,
    no space), percent-escaped with `%` itself, so `_inward` gives back exactly what SocialData sent."""
    return quote(cursor, safe=_CURSOR_SAFE)


def _inward(cursor: str) -> str:
    """Our cursor as SocialData's, as Latin-1 text of its bytes (what `_query` sends)."""
    return unquote(cursor, encoding="latin-1")


def _query(pairs: dict[str, str]) -> str:
    return urlencode({k: v for k, v in pairs.items() if v}, quote_via=quote, safe="", encoding="latin-1")


class SocialData:
    kind = "socialdata"

    def serves(self, endpoint: Endpoint) -> bool:
        return endpoint.path in SERVED

    def headers(self, secret: str) -> bytes:
        return f"Authorization: Bearer {secret}\r\nAccept: application/json\r\n".encode("latin-1")

    def request(self, endpoint: Endpoint, query: str) -> tuple[str, str]:
        q = dict(parse_qsl(query, encoding="latin-1"))  # validated: each parameter once
        path, cursor = endpoint.path, {"cursor": _inward(q.get("cursor", ""))}
        if path == "/tweet/advanced_search":
            return "/search", _query({"query": q.get("query", ""), "type": q.get("queryType", "")} | cursor)
        if path == "/user/info":
            return f"/user/{_seg(q['userName'])}", ""
        if path == "/tweets":
            ids = list(dict.fromkeys(x.strip() for x in q["tweet_ids"].split(",") if x.strip()))
            if len(ids) != 1:
                raise LookupError("SocialData looks up one post a call")
            return f"/tweets/{_seg(ids[0])}", ""
        if path in ("/user/tweet_timeline", "/user/last_tweets"):
            if "userId" not in q:
                raise LookupError("SocialData lists a user's posts by id only")
            replies = q.get("includeReplies", "").lower() in _TRUE
            if replies and q.get("includeParentTweet", "").lower() in _TRUE:
                raise LookupError("SocialData does not put the parent before a reply")
            tab = "tweets-and-replies" if replies else "tweets"
            return f"/user/{_seg(q['userId'])}/{tab}", _query(cursor)
        if path in ("/user/mentions", "/tweet/quotes") and ("sinceTime" in q or "untilTime" in q):
            raise LookupError("SocialData has no time filter here")
        if path == "/user/mentions":
            return f"/user/{_seg(q['userName'])}/mentions", _query(cursor)
        if path == "/tweet/quotes":
            if q.get("includeReplies", "true").lower() not in _TRUE:
                raise LookupError("SocialData lists every quote")
            return f"/tweets/{_seg(q['tweetId'])}/quotes", _query(cursor)
        if path == "/tweet/retweeters":
            return f"/tweets/{_seg(q['tweetId'])}/retweeted_by", _query(cursor)
        if path == "/user/verifiedFollowers":
            return f"/user/{_seg(q['user_id'])}/verified-followers", _query(cursor)
        if path in ("/list/tweets_timeline", "/list/members"):
            lid = q.get("listId") or q["list_id"]
            return f"/list/{_seg(lid)}/{'tweets' if path.endswith('timeline') else 'members'}", _query(cursor)
        if path in ("/community/tweets", "/community/members"):
            return f"/community/{_seg(q['community_id'])}/{path.rsplit('/', 1)[1]}", _query(cursor)
        raise LookupError(path)

    def answer(self, endpoint: Endpoint, status: int, body: bytes) -> tuple[int, bytes]:
        served, looked_up, order = SERVED[endpoint.path]
        if 200 <= status < 300:
            try:
                return 200, orjson.dumps(_page(endpoint, served, order, orjson.loads(body)))
            except (orjson.JSONDecodeError, TypeError, KeyError, AttributeError, ValueError):
                return 502, _error("the provider's answer could not be read")
        if status == 404 and looked_up is not None:
            if served == "tweet":  # /tweets leaves an unknown id out, as it does any
                return 200, orjson.dumps({"status": "success", "message": "", "tweets": []})
            return 200, orjson.dumps(_envelope(endpoint, order, "error", f"{looked_up} not found", None, ""))
        if status in (400, 422):
            return 400, _error(_message(body) or "the provider refused the query")
        if status == 404:  # nothing looked up: its path is unknown there (a wrong base URL)
            return 502, _error("the provider does not know this path")
        return status, _error(_message(body) or f"provider error {status}")


def _page(endpoint: Endpoint, served: str, order: tuple[str, ...], body) -> dict:
    users: dict = {}  # an account met again in the page (a timeline's author) is normalized once
    if body.get("status") == "error":
        raise ValueError("not the documented answer")  # an error in a 2xx, or an object without its id
    if served == "user":
        return _envelope(endpoint, order, "success", "", _user(body, users), "")
    if served == "tweet":
        return _envelope(endpoint, order, "success", "", [_tweet(body, users)], "")
    items = body[served]
    results = [_tweet(t, users) for t in items] if served == "tweets" else [_user(u, users) for u in items]
    following = body.get("next_cursor")
    if following is not None and not isinstance(following, (str, int)):
        raise ValueError("next_cursor")
    # An empty page ends the list even with a cursor: following it would ask for empty pages for ever.
    return _envelope(endpoint, order, "success", "", results, _outward(str(following)) if following and results else "")


def _envelope(endpoint: Endpoint, order: tuple[str, ...], status: str, message: str, results, following: str) -> dict:
    values = {
        "R": results if results is not None else (None if endpoint.results == "data" else []),
        "status": status,
        "M": message,
        "has_next_page": bool(following),
        "next_cursor": following,
    }
    names = {"R": endpoint.results, "M": endpoint.msg_key}
    return {names.get(key, key): values[key] for key in order}


def _error(message: str) -> bytes:
    return orjson.dumps({"status": "error", "msg": message})


def _message(body: bytes) -> str:
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ""
    message = parsed.get("message") if isinstance(parsed, dict) else None
    return message[:500] if isinstance(message, str) else ""


def _id(obj: dict, name: str = "id") -> str | None:
    """An id as a string: the `_str` twin when sent, else the number (orjson reads an integer up to 2^64
    exactly). None for anything else: a float (orjson's reading of a larger integer, rounded), a boolean, an
    object, letters: what is not an id is never served as one."""
    value = obj.get(name + "_str")
    if value is None:
        value = obj.get(name)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    return value if isinstance(value, str) and value.isascii() and value.isdigit() else None


def _required(obj, name: str = "id") -> str:
    """The id of a post or account the answer is made of: without one it is not the documented answer (a 502,
    uncharged), never an item of nulls that is charged."""
    value = _id(obj)
    if value is None:
        raise ValueError(f"a {name} without its id")
    return value


def _int(value) -> int | None:
    """A count: an integer (not a boolean), else null: one shape whatever a provider gone wrong sends."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _bool(value) -> bool | None:
    return value if isinstance(value, bool) else None


def _text(value) -> str | None:
    return value if isinstance(value, str) else None


@functools.lru_cache(maxsize=4096)
def _date(value: str | None) -> str | None:
    """`2023-11-28T20:00:31.000000Z` or `2022-07-19T06:35:54+00:00` as `Tue Nov 28 20:00:31 +0000 2023`
    (independent of the locale); None for what is not a date."""
    if not isinstance(value, str):
        return None
    try:
        d = datetime.fromisoformat(value)
    except ValueError:
        return None
    d = d.astimezone(UTC) if d.tzinfo else d
    return f"{_DAYS[d.weekday()]} {_MONTHS[d.month - 1]} {d.day:02d} {d:%H:%M:%S} +0000 {d.year}"


def _source(value: str | None) -> str | None:
    """`<a href="…" rel="nofollow">Twitter for iPhone</a>` as `Twitter for iPhone`."""
    if not value or not value.startswith("<"):
        return value
    return value[value.find(">") + 1 : value.rfind("<")] or None


def _user(u: dict, users: dict) -> dict:
    uid = _required(u, "user")
    known = users.get(uid)
    if known is not None:
        return known
    handle = u.get("screen_name")
    handle = handle if isinstance(handle, str) and handle else None
    user = {
        "type": "user",
        "userName": handle,
        "url": f"https://x.com/{handle}" if handle else None,
        "id": uid,
        "name": _text(u.get("name")),
        "isBlueVerified": _bool(u.get("verified")),  # documented: "a verified account with a blue checkmark"
        "verifiedType": None,
        "profilePicture": _text(u.get("profile_image_url_https")),
        "coverPicture": _text(u.get("profile_banner_url")),
        "description": _text(u.get("description")),
        "location": _text(u.get("location")) or None,  # v1.1 sends "" for none; ours is null
        "followers": _int(u.get("followers_count")),
        "following": _int(u.get("friends_count")),
        "canDm": _bool(u.get("can_dm")),
        "createdAt": _date(u.get("created_at")),
        "favouritesCount": _int(u.get("favourites_count")),
        "hasCustomTimelines": None,
        "isTranslator": None,
        "mediaCount": _int(u.get("media_count")),
        "statusesCount": _int(u.get("statuses_count")),
        "withheldInCountries": None,
        "affiliatesHighlightedLabel": None,
        "possiblySensitive": None,
        "pinnedTweetIds": u.get("pinned_tweet_ids_str"),
        "isAutomated": None,
        "automatedBy": None,
        "unavailable": None,
        "message": None,
        "unavailableReason": None,
        "profile_bio": None,
    }
    users[uid] = user
    return user


def _tweet(t: dict, users: dict, nested: bool = False) -> dict:
    tid, author = _required(t, "post"), t["user"]
    handle = author.get("screen_name")
    parent = _id(t, "in_reply_to_status_id")
    views = t.get("views_count")
    quoted, reposted = t.get("quoted_status"), t.get("retweeted_status")
    return {
        "type": "tweet",
        "id": tid,
        "url": f"https://x.com/{handle}/status/{tid}" if isinstance(handle, str) and handle else None,
        "text": _text(t.get("full_text") or t.get("text")),
        "source": _source(_text(t.get("source"))),
        "retweetCount": _int(t.get("retweet_count")),
        "replyCount": _int(t.get("reply_count")),
        "likeCount": _int(t.get("favorite_count")),
        "quoteCount": _int(t.get("quote_count")),
        "viewCount": None if _int(views) is None else str(views),
        "createdAt": _date(t.get("tweet_created_at") or t.get("created_at")),
        "lang": _text(t.get("lang")),
        "bookmarkCount": _int(t.get("bookmark_count")),
        "isReply": parent is not None,
        "inReplyToId": parent,
        "conversationId": _id(t, "conversation_id") or (None if parent else tid),
        "displayTextRange": t.get("display_text_range"),
        "inReplyToUserId": _id(t, "in_reply_to_user_id"),
        "inReplyToUsername": _text(t.get("in_reply_to_screen_name")),
        "author": _user(author, users),
        "entities": _entities(t.get("entities")),
        "quoted_tweet": _tweet(quoted, users, True) if quoted and not nested else None,
        "retweeted_tweet": _tweet(reposted, users, True) if reposted and not nested else None,
        "isLimitedReply": None,
    }


def _entities(e: dict | None) -> dict | None:
    """v1.1 entities in our keys (the same names; an absent `media` is none)."""
    if e is None:
        return None
    return {
        "hashtags": [{"indices": h.get("indices"), "text": h.get("text")} for h in e.get("hashtags") or ()],
        "symbols": [{"indices": s.get("indices"), "text": s.get("text")} for s in e.get("symbols") or ()],
        "urls": [
            {
                "display_url": u.get("display_url"),
                "expanded_url": u.get("expanded_url"),
                "indices": u.get("indices"),
                "url": u.get("url"),
            }
            for u in e.get("urls") or ()
        ],
        "user_mentions": [
            {"id_str": _id(m), "indices": m.get("indices"), "name": m.get("name"), "screen_name": m.get("screen_name")}
            for m in e.get("user_mentions") or ()
        ],
        "media": [
            {
                "display_url": m.get("display_url"),
                "expanded_url": m.get("expanded_url"),
                "features": m.get("features"),
                "id_str": _id(m),
                "indices": m.get("indices"),
                "media_key": m.get("media_key"),
                "media_url_https": m.get("media_url_https"),
                "type": m.get("type"),
                "url": m.get("url"),
                "media_results": None,
            }
            for m in e.get("media") or ()
        ],
    }


ADAPTER = SocialData()
