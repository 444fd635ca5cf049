"""The socialdata dialect: the world as SocialData's API shows it (docs.socialdata.tools; the older copy at
socialdata.gitbook.io has full example answers). Its documented paths under the prefix (`/twitter` on
api.socialdata.tools), `Authorization: Bearer <key>`, Twitter v1.1-style objects and its status codes:

    GET search?query=&type=Latest|Top&cursor=        {"next_cursor", "tweets"}
    GET user/<user_id or screen_name>                the user object
    GET tweets/<id>, statuses/show?id=               the tweet object
    GET tweets/<id>/quotes, tweets/<id>/retweeted_by {"next_cursor", "tweets" | "users"}
    GET user/<user_id>/tweets, .../tweets-and-replies, .../verified-followers
    GET user/<screen_name>/mentions
    GET list/<id>/tweets, list/<id>/members, community/<id>/tweets, community/<id>/members

Errors are `{"status": "error", "message": ...}`: 401 without the key, 404 for an unknown user, tweet, list,
community or path, 422 for a missing or invalid parameter. The last page's `next_cursor` is null. Lists,
their order, paging and live posts are the world's (sandbox/endpoints.py), with the twitterapi dialect's page
sizes where SocialData's documentation names none; only the shape differs, rendered here from the same world
records (the entities are render.entities'). Faults and latency work as in every dialect (sandbox/faults.py).
"""

from __future__ import annotations

import hmac
import re
import time
from collections.abc import Callable

import orjson

from sandbox import render
from sandbox.app import ProviderHandler
from sandbox.args import Args, BadRequest, NotFound
from sandbox.basis import is_digits
from sandbox.endpoints import ENDPOINTS, MOVING
from sandbox.world import World

UNAUTHORIZED = orjson.dumps({"status": "error", "message": "Unauthorized"})
NO_PATH = orjson.dumps({"status": "error", "message": "Not found"})
# Where each app is said to post from (the v1.1 `source` is an HTML link to it).
APPS = {
    "Twitter for iPhone": "http://twitter.com/download/iphone",
    "Twitter for Android": "http://twitter.com/download/android",
    "Twitter Web App": "https://mobile.twitter.com",
    "Twitter for iPad": "http://twitter.com/#!/download/ipad",
    "TweetDeck Web App": "https://tweetdeck.twitter.com",
}
MEDIA_FIELDS = ("display_url", "expanded_url", "id_str", "indices", "media_url_https", "type", "url")


def iso(seconds: int) -> str:
    """SocialData's UTC datetime, `2023-11-28T20:00:31.000000Z`."""
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(seconds))


def user(w: World, u: int) -> dict:
    """The user object, in the order of SocialData's example."""
    p = w.profile(u)
    handle, name = w.identity(u)
    uid = w.user_id(u)
    site = render._site_entity(w, u)
    return {
        "id": int(uid),
        "id_str": uid,
        "name": name,
        "screen_name": handle,
        "location": p.location or "",
        "url": site["url"] if site else None,
        "description": p.description,
        "protected": False,
        "verified": w.is_blue(u),  # "a verified account with a blue checkmark"
        "followers_count": len(w.followers(u)),
        "friends_count": len(w.following(u)),
        "listed_count": p.listed,
        "favourites_count": p.favourites,
        "statuses_count": w.statuses_count(u),
        "created_at": iso(p.created_s),
        "profile_banner_url": render._banner(w, u),
        "profile_image_url_https": render.avatar(w, u),
        "can_dm": p.can_dm,
    }


def tweet(w: World, i: int, nested: bool = False) -> dict:
    """The tweet object; a quote carries its quoted tweet one level deep (`quoted_status`)."""
    t = w.tweet(i)
    parent = w.tweet(t.parent) if t.parent >= 0 else None
    quoted = w.tweet(t.quote) if t.quote >= 0 else None
    app = render.source(w, i)
    entities = render.entities(w, i)
    entities["media"] = [{k: m[k] for k in MEDIA_FIELDS} for m in entities["media"]]
    return {
        "tweet_created_at": iso(t.ms // 1000),
        "id": int(t.id),
        "id_str": t.id,
        "text": None,  # documented: deprecated, always null
        "full_text": w.content(i).text,
        "source": f'<a href="{APPS[app]}" rel="nofollow">{app}</a>',
        "truncated": False,
        "in_reply_to_status_id": int(parent.id) if parent else None,
        "in_reply_to_status_id_str": parent.id if parent else None,
        "in_reply_to_user_id": int(w.user_id(parent.author)) if parent else None,
        "in_reply_to_user_id_str": w.user_id(parent.author) if parent else None,
        "in_reply_to_screen_name": w.handle(parent.author) if parent else None,
        "user": user(w, t.author),
        "quoted_status_id": int(quoted.id) if quoted else None,
        "quoted_status_id_str": quoted.id if quoted else None,
        "is_quote_status": quoted is not None,
        "quoted_status": tweet(w, t.quote, nested=True) if quoted and not nested else None,
        "retweeted_status": None,  # the world holds no reposts
        "quote_count": w.quote_count(i),
        "reply_count": w.reply_count(i),
        "retweet_count": t.retweets,
        "favorite_count": t.likes,
        "views_count": t.views,
        "bookmark_count": t.bookmarks,
        "lang": t.lang,
        "entities": entities,
        "is_pinned": t.id in render._pinned(w, t.author),
    }


class V1Args(Args):
    """The world's endpoints, answering with this dialect's objects."""

    render_tweet = staticmethod(tweet)
    render_user = staticmethod(user)


# SocialData path -> (the world's endpoint, its parameters from the path's id and the query, the results key).
Params = Callable[[str, dict[str, str]], dict[str, str | None]]
LISTS: tuple[tuple[re.Pattern, str, Params, str], ...] = tuple(
    (re.compile(pattern), endpoint, params, key)
    for pattern, endpoint, params, key in (
        (
            "search",
            "tweet/advanced_search",
            lambda _, q: {"query": q.get("query"), "queryType": q.get("type")},
            "tweets",
        ),
        ("tweets/([^/]+)/quotes", "tweet/quotes", lambda i, _: {"tweetId": i}, "tweets"),
        ("tweets/([^/]+)/retweeted_by", "tweet/retweeters", lambda i, _: {"tweetId": i}, "users"),
        ("user/([^/]+)/tweets", "user/tweet_timeline", lambda i, _: {"userId": i}, "tweets"),
        (
            "user/([^/]+)/tweets-and-replies",
            "user/tweet_timeline",
            lambda i, _: {"userId": i, "includeReplies": "true"},
            "tweets",
        ),
        ("user/([^/]+)/mentions", "user/mentions", lambda i, _: {"userName": i}, "tweets"),
        ("user/([^/]+)/verified-followers", "user/verifiedFollowers", lambda i, _: {"user_id": i}, "users"),
        ("list/([^/]+)/tweets", "list/tweets_timeline", lambda i, _: {"listId": i}, "tweets"),
        ("list/([^/]+)/members", "list/members", lambda i, _: {"list_id": i}, "users"),
        ("community/([^/]+)/tweets", "community/tweets", lambda i, _: {"community_id": i}, "tweets"),
        ("community/([^/]+)/members", "community/members", lambda i, _: {"community_id": i}, "users"),
    )
)
USER = re.compile("user/([^/]+)")
TWEET = re.compile("tweets/([^/]+)")


class SocialDataHandler(ProviderHandler):
    """SocialData's paths, key and answers (the module's docstring)."""

    @staticmethod
    def error_body(message: str) -> bytes:
        return orjson.dumps({"status": "error", "message": message})

    def _answer(self, path: str) -> tuple[int, bytes]:
        sb = self.sandbox
        scheme, _, key = self.request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), sb.api_key):
            return 401, UNAUTHORIZED
        query = {k: v[-1].decode("utf-8", "replace") for k, v in self.request.query_arguments.items() if v}
        now = int(sb.clock())
        try:
            moving, render_page = route(sb.world, path, query, now)
        except LookupError:
            return 404, NO_PATH
        cache_key = ("socialdata", path, tuple(sorted(query.items())), now if moving else 0)
        body = sb.cache.get(cache_key)
        if body is None:
            try:
                body = orjson.dumps(render_page())
            except NotFound as e:
                return 404, self.error_body(str(e).capitalize())
            except BadRequest as e:
                return 422, self.error_body(str(e))
            sb.cache.put(cache_key, body)
        return 200, body


def route(w: World, path: str, query: dict[str, str], now: int) -> tuple[bool, Callable[[], dict]]:
    """(whether the answer lists live posts, so is kept per second; what renders it) for a SocialData path.
    Raises LookupError for a path SocialData does not have; the renderer raises NotFound or BadRequest."""
    for pattern, endpoint, params, key in LISTS:
        m = pattern.fullmatch(path)
        if m is not None:
            given = params(m.group(1) if m.groups() else "", query) | {"cursor": query.get("cursor")}
            a = V1Args({k: [v.encode()] for k, v in given.items() if v}, now)

            def page(endpoint=endpoint, a=a, key=key) -> dict:
                found = ENDPOINTS[endpoint][0](w, a)
                return {"next_cursor": found["cursor"] or None, key: found["items"]}

            return endpoint in MOVING, page
    if (m := USER.fullmatch(path)) is not None:
        return False, lambda: user(w, _user(w, m.group(1)))
    m = TWEET.fullmatch(path)
    if m is None and path != "statuses/show":
        raise LookupError(path)
    return True, lambda: tweet(w, _tweet(w, m.group(1) if m is not None else query.get("id"), now))


def _user(w: World, given: str) -> int:
    u = w.user_by_id(given) if is_digits(given) else w.user_by_handle(given)
    if u is None:
        raise NotFound("user not found")
    return u


def _tweet(w: World, given: str | None, now: int) -> int:
    if not given:
        raise BadRequest("The id field is required.")
    i = w.tweet_by_id(given, now)
    if i is None:
        raise NotFound("tweet not found")
    return i
