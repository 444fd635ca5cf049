"""The sandbox upstream against the spec: every endpoint's envelope and objects (checked
field by field against schemas written from the spec's tables), paging, search operators,
orderings, unknown ids, bad input, determinism, fault injection and connection counting."""

import asyncio
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from urllib.parse import urlencode

import orjson
import pytest
from tornado.curl_httpclient import CurlAsyncHTTPClient
from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from tornado.simple_httpclient import HTTPTimeoutError

import sandbox

KEY = "sandbox-test-key"
AUTH = {"X-API-Key": KEY}


@pytest.fixture
def app():
    return sandbox.make_app(KEY)


# ---- schemas, written from the spec's field tables ------------------------------------


class Nullable:
    def __init__(self, inner):
        self.inner = inner


class Const:
    def __init__(self, value):
        self.value = value


NUMBER = (int, float)
_CREATED_AT = re.compile(
    r"^(Mon|Tue|Wed|Thu|Fri|Sat|Sun) (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
    r" \d\d \d\d:\d\d:\d\d \+0000 \d{4}$"
)


def parse_created_at(value):
    return datetime.strptime(value, "%a %b %d %H:%M:%S %z %Y")


def created_at(value, path):
    assert isinstance(value, str) and _CREATED_AT.match(value), (path, value)
    assert parse_created_at(value).strftime("%a") == value[:3], (path, "weekday", value)


def int_pair(value, path):
    assert isinstance(value, list) and len(value) == 2, (path, value)
    assert all(type(x) is int for x in value) and value[0] <= value[1], (path, value)


def digits(value, path):
    assert isinstance(value, str) and value.isdigit(), (path, value)


def url_encoded(value, path):
    assert isinstance(value, str) and value and not re.search(r"[\s#\"]", value), (path, value)


URL_ENTITY = {"display_url": str, "expanded_url": str, "indices": int_pair, "url": str}
MEDIA = {
    "display_url": str,
    "expanded_url": str,
    "features": dict,
    "id_str": digits,
    "indices": int_pair,
    "url": str,
    "media_results": {
        "id": str,
        "result": {
            "__typename": str,
            "id": str,
            "media_availability_v2": {"status": str},
            "media_id": digits,
            "media_info": {
                "__typename": str,
                "alt_text": Nullable(str),
                "color_info": {"palette": [{"percentage": NUMBER, "rgb": {"red": int, "green": int, "blue": int}}]},
                "original_img_height": int,
                "original_img_url": str,
                "original_img_width": int,
            },
        },
    },
}
ENTITIES = {
    "hashtags": list,
    "symbols": list,
    "urls": [URL_ENTITY],
    "user_mentions": [{"id_str": digits, "indices": int_pair, "name": str, "screen_name": str}],
    "media": [MEDIA],
}
USER = {
    "type": Const("user"),
    "userName": str,
    "url": str,
    "id": digits,
    "name": str,
    "isBlueVerified": bool,
    "description": str,
    "location": Nullable(str),
    "followers": int,
    "following": int,
    "statusesCount": int,  # filled everywhere (the spec allows null; the provider's documentation fills it)
    "createdAt": created_at,
    "profilePicture": str,
    "coverPicture": Nullable(str),
    "canDm": bool,
    "pinnedTweetIds": [digits],
    # The provider's documented fields beyond the spec's table.
    "verifiedType": Nullable(str),
    "favouritesCount": int,
    "hasCustomTimelines": bool,
    "isTranslator": bool,
    "mediaCount": int,
    "withheldInCountries": [str],
    "affiliatesHighlightedLabel": dict,
    "possiblySensitive": bool,
    "isAutomated": bool,
    "automatedBy": Nullable(str),
    "unavailable": bool,
    "message": str,
    "unavailableReason": str,
    "profile_bio": Nullable({"description": str, "entities": {"description": dict, "url": {"urls": [URL_ENTITY]}}}),
}
TWEET = {
    "type": Const("tweet"),
    "id": digits,
    "url": str,
    "text": str,
    "retweetCount": int,
    "replyCount": int,
    "likeCount": int,
    "quoteCount": int,
    "bookmarkCount": int,
    "viewCount": Nullable(digits),
    "createdAt": created_at,
    "lang": str,
    "isReply": bool,
    "inReplyToId": Nullable(digits),
    "conversationId": Nullable(digits),
    "displayTextRange": Nullable(int_pair),
    "entities": Nullable(ENTITIES),
    "author": USER,
    "source": str,
    "inReplyToUserId": Nullable(digits),
    "inReplyToUsername": Nullable(str),
    "isLimitedReply": bool,
}
TWEET["quoted_tweet"] = Nullable(TWEET)
TWEET["retweeted_tweet"] = Nullable(TWEET)
TREND = {"name": str, "url": str, "query": url_encoded, "tweet_volume": Nullable(int)}
VERIFICATION = {
    "is_blue_verified": bool,
    "is_verified_organization": bool,
    "is_verified_organization_affiliate": bool,
    "verified": bool,
}
PROFILE = {  # the user-profile object inside a Space
    "__typename": str,
    "avatar": {"image_url": str},
    "banner": {"image_url": Nullable(str)},
    "core": {"created_at_ms": int, "name": str, "screen_name": str},
    "dm_permissions": {"can_dm": bool},
    "legacy": dict,
    "media_permissions": dict,
    "notifications_settings": dict,
    "pinned_items": {"tweet_ids_str": [digits]},
    "privacy": {"protected": bool, "suspended": bool},
    "profile_bio": dict,
    "profile_image_shape": str,
    "relationship_counts": {"followers": int, "following": int},
    "relationship_perspectives": dict,
    "rest_id": digits,
    "verification": VERIFICATION,
}
PARTICIPANT = {
    "avatar_url": str,
    "display_name": str,
    "is_muted_by_admin": bool,
    "is_muted_by_guest": bool,
    "social_screen_name": str,
    "user_id": str,
    "user_results": {"rest_id": digits, "result": PROFILE},
}
SPACE = {
    "is_subscribed": bool,
    "metadata": {
        "conversation_controls": int,
        "creator_results": {"rest_id": digits, "result": PROFILE},
        "creator_user_id": digits,
        "disallow_join": bool,
        "is_muted": bool,
        "no_incognito": bool,
        "is_space_available_for_clipping": bool,
        "is_space_available_for_replay": bool,
        "max_admin_capacity": int,
        "media_key": str,
        "narrow_cast_space_type": int,
        "participants": {
            "admins": [PARTICIPANT],
            "listeners": [PARTICIPANT],
            "speakers": [PARTICIPANT],
            "total": int,
            "poll_interval_sec": int,
        },
        "primary_admin_user_id": digits,
        "start": int,
        "state": Const("Running"),
        "total_live_listeners": int,
        "total_participated": int,
        "total_replay_watched": int,
        "tweet_results": {"rest_id": digits},
    },
}
USER_ABOUT = {
    "rest_id": digits,
    "result": {
        "__typename": str,
        "about_profile": {
            "account_based_in": str,
            "affiliate_url": str,
            "affiliate_username": str,
            "created_country_accurate": bool,
            "learn_more_url": str,
            "location_accurate": bool,
            "report_problem_url": str,
            "source": str,
            "username_changes": {"count": digits},
            "verified_since_msec": digits,
        },
        "affiliates_highlighted_label": {
            "label": {
                "badge": {"url": str},
                "description": str,
                "url": {"url": str, "url_type": str},
                "user_label_display_type": str,
                "user_label_type": str,
            }
        },
        "avatar": {"image_url": str},
        "core": {"created_at_ms": int, "name": str, "screen_name": str},
        "is_blue_verified": bool,
        "privacy": {"protected": bool, "suspended": bool},
        "profile_image_shape": str,
        "verification": VERIFICATION,
        "verification_info": {"is_identity_verified": bool, "reason": dict},
    },
}
BANNER_INFO = {"__typename": str, "original_img_height": int, "original_img_url": str, "original_img_width": int}
COMMUNITY = {
    "rest_id": digits,
    "result": {
        "__typename": Const("Community"),
        "actions": {
            "join_action_result": {"__typename": str, "message": str, "reason": Const("ViewerRequestRequired")},
            "leave_action_result": {"__typename": str, "message": str, "reason": Const("ViewerNotMember")},
        },
        "created_at": int,
        "creator_results": {"result": {"__typename": str}},
        "custom_banner_media_results": {
            "result": {
                "__typename": str,
                "id": str,
                "media_info": {**BANNER_INFO, "salient_rect": {"height": int, "left": int, "top": int, "width": int}},
            }
        },
        "default_banner_media_results": {"result": {"__typename": str, "id": str, "media_info": BANNER_INFO}},
        "description": str,
        "is_pinned": bool,
        "member_count": int,
        "moderator_count": int,
        "name": str,
        "rest_id": digits,
        "role": Const("NonMember"),
        "rules": [{"name": str, "rest_id": str}],
    },
}


def check(value, schema, path="$"):
    """Assert that value has every field of schema with the right type and nullability."""
    if isinstance(schema, Nullable):
        if value is None:
            return
        schema = schema.inner
    if isinstance(schema, Const):
        assert value == schema.value, (path, value)
    elif schema is int or schema is bool:
        assert type(value) is schema, (path, value)
    elif schema is NUMBER:
        assert isinstance(value, NUMBER) and not isinstance(value, bool), (path, value)
    elif schema in (str, list, dict):
        assert isinstance(value, schema), (path, value)
    elif isinstance(schema, list):
        assert isinstance(value, list), (path, value)
        for n, item in enumerate(value):
            check(item, schema[0], f"{path}[{n}]")
    elif isinstance(schema, dict):
        assert isinstance(value, dict), (path, value)
        for key, sub in schema.items():
            assert key in value, f"{path}.{key} missing"
            check(value[key], sub, f"{path}.{key}")
    else:
        schema(value, path)


# ---- the spec's endpoint table ---------------------------------------------------------

PAGED = "status message has_next_page next_cursor"
SPEC_KEYS = {
    "tweet/advanced_search": f"tweets {PAGED}",
    "user/tweet_timeline": f"tweets {PAGED}",
    "tweet/thread_context": "replies has_next_page next_cursor status message",
    "user/verifiedFollowers": f"followers {PAGED}",
    "community/tweets": "tweets status msg has_next_page next_cursor",
    "user/followers": f"followers {PAGED}",
    "user/followings": f"followings {PAGED}",
    "spaces/detail": "status msg data",
    "user_about": "status msg data",
    "user/batch_info_by_ids": "status msg users",
    "user/info": "status msg data",
    "trends": "trends status msg",
    "list/tweets_timeline": f"tweets {PAGED}",
    "user/followers_ids": "ids has_next_page next_cursor status msg",
    "tweet/quotes": f"tweets {PAGED}",
    "user/last_tweets": f"tweets {PAGED}",
    "tweet/replies/v2": f"tweets {PAGED}",
    "tweet/replies": f"replies {PAGED}",
    "user/mentions": f"tweets {PAGED}",
    "user/search": "users status msg has_next_page next_cursor",
    "tweets": "status message tweets",
    "community/info": "status msg data",
    # Beyond the spec: the provider's current documentation.
    "tweet/retweeters": f"users {PAGED}",
    "list/followers": "followers has_next_page next_cursor status msg",
    "list/members": "members has_next_page next_cursor status msg",
    "community/members": "members has_next_page next_cursor status msg",
    "user/check_follow_relationship": "data status message",
    "article": "article status message",
}
ARTICLE = {
    "author": USER,
    "replyCount": int,
    "likeCount": int,
    "quoteCount": int,
    "viewCount": int,  # an integer, as the provider documents it (a tweet's stays the spec's string)
    "createdAt": created_at,
    "title": str,
    "preview_text": str,
    "cover_media_img_url": str,
    "contents": [{"text": str}],
}
RESULT_SCHEMAS = {
    "tweets": TWEET,
    "replies": TWEET,
    "followers": USER,
    "followings": USER,
    "users": USER,
    "ids": digits,
    "trends": TREND,
    "members": USER,
    "article": ARTICLE,
}
DATA_SCHEMAS = {
    "user/info": (lambda d: d, USER),
    "spaces/detail": (lambda d: d["data"]["audio_space_by_rest_id"], SPACE),
    "user_about": (lambda d: d["data"]["user_result_by_screen_name"], USER_ABOUT),
    "community/info": (lambda d: d["data"]["community_results_by_rest_id"], COMMUNITY),
    "user/check_follow_relationship": (lambda d: d, {"following": bool, "followed_by": bool}),
}


def valid_params(path, cat):
    user, big = cat["users"][0], cat["big_accounts"][0]
    big_id = next(u["id"] for u in cat["users"] if u["userName"] == big)
    return {
        "tweet/advanced_search": {"query": "coffee"},
        "user/tweet_timeline": {"userId": user["id"]},
        "tweet/thread_context": {"tweetId": cat["deep_replies"][0]},
        "user/verifiedFollowers": {"user_id": big_id},
        "community/tweets": {"community_id": cat["communities"][0]},
        "user/followers": {"userName": user["userName"]},
        "user/followings": {"userName": user["userName"]},
        "spaces/detail": {"space_id": cat["spaces"][0]},
        "user_about": {"userName": user["userName"]},
        "user/batch_info_by_ids": {"userIds": ",".join(u["id"] for u in cat["users"][:5])},
        "user/info": {"userName": user["userName"]},
        "trends": {},
        "list/tweets_timeline": {"listId": cat["lists"][0]},
        "user/followers_ids": {"userName": user["userName"]},
        "tweet/quotes": {"tweetId": cat["quoted_tweets"][0]},
        "user/last_tweets": {"userName": user["userName"]},
        "tweet/replies/v2": {"tweetId": cat["tweets"][0]},
        "tweet/replies": {"tweetId": cat["tweets"][0]},
        "user/mentions": {"userName": big},
        "user/search": {"query": "maria"},
        "tweets": {"tweet_ids": ",".join(cat["tweets"][:5])},
        "community/info": {"community_id": cat["communities"][0]},
        "tweet/retweeters": {"tweetId": cat["quoted_tweets"][0]},
        "list/followers": {"list_id": cat["lists"][0]},
        "list/members": {"list_id": cat["lists"][0]},
        "community/members": {"community_id": cat["communities"][0]},
        "user/check_follow_relationship": {"source_user_name": user["userName"], "target_user_name": big},
        "article": {"tweet_id": cat["articles"][0]},
    }[path]


# ---- helpers ---------------------------------------------------------------------------


async def fetch(client, base_url, path, params=None, headers=AUTH, **kwargs):
    url = base_url + path + ("?" + urlencode(params) if params else "")
    return await client.fetch(url, headers=headers, raise_error=False, **kwargs)


async def api(client, base_url, path, **params):
    response = await fetch(client, base_url, "/twitter/" + path, params)
    assert response.code == 200, (path, params, response.code, response.body[:300])
    assert response.headers["Content-Type"] == "application/json"
    return orjson.loads(response.body)


async def get_catalog(client, base_url):
    response = await fetch(client, base_url, "/sandbox/catalog", headers={})
    assert response.code == 200
    return orjson.loads(response.body)


async def all_pages(client, base_url, path, key, max_pages=400, **params):
    """Follow next_cursor to the end, checking the chain; returns (items, pages)."""
    items, cursor, pages = [], None, 0
    while True:
        query = dict(params, **({"cursor": cursor} if cursor else {}))
        body = await api(client, base_url, path, **query)
        pages += 1
        items.extend(body[key])
        if not body["has_next_page"]:
            assert body["next_cursor"] == ""
            return items, pages
        assert isinstance(body["next_cursor"], str) and body["next_cursor"] not in ("", cursor)
        cursor = body["next_cursor"]
        assert pages < max_pages


def engagement(t):
    return t["likeCount"] + 2 * t["retweetCount"] + t["replyCount"] + t["quoteCount"]


def created(t):
    return parse_created_at(t["createdAt"])


# ---- catalog, health, auth -------------------------------------------------------------


@pytest.mark.gen_test(timeout=60)
async def test_catalog_contract(http_client, base_url):
    cat = await get_catalog(http_client, base_url)
    for key in ("users", "tweets", "lists", "empty_lists", "communities", "spaces", "big_accounts"):
        assert cat[key], key
    assert len(cat["users"]) >= 2000
    assert all(set(u) >= {"userName", "id"} and u["id"].isdigit() for u in cat["users"])
    names = {u["userName"] for u in cat["users"]}
    assert set(cat["big_accounts"]) <= names
    assert not set(cat["lists"]) & set(cat["empty_lists"])
    for name in cat["big_accounts"]:
        info = await api(http_client, base_url, "user/info", userName=name)
        assert 20000 <= info["data"]["followers"] <= 60000


@pytest.mark.gen_test(timeout=60)
async def test_health_and_stats_need_no_key(http_client, base_url):
    response = await fetch(http_client, base_url, "/healthz", headers={})
    assert (response.code, orjson.loads(response.body)) == (200, {"status": "ok"})
    response = await fetch(http_client, base_url, "/sandbox/stats", headers={})
    assert response.code == 200 and set(orjson.loads(response.body)) == {"connections", "requests"}


@pytest.mark.gen_test(timeout=60)
@pytest.mark.parametrize("headers", [{}, {"X-API-Key": "wrong"}])
async def test_provider_paths_need_the_upstream_key(http_client, base_url, headers):
    response = await fetch(http_client, base_url, "/twitter/user/info", {"userName": "x"}, headers=headers)
    assert response.code == 401
    assert orjson.loads(response.body) == {"status": "error", "msg": "invalid upstream api key"}


@pytest.mark.gen_test(timeout=60)
@pytest.mark.parametrize(
    "path", ["community/get_tweets_from_all_community", "community/moderators", "no/such/endpoint"]
)
async def test_unavailable_endpoints_are_not_served(http_client, base_url, path):
    response = await fetch(http_client, base_url, "/twitter/" + path, {"query": "a", "community_id": "1"})
    assert response.code == 404
    assert orjson.loads(response.body)["status"] == "error"


# ---- every endpoint against the spec ---------------------------------------------------


@pytest.mark.gen_test(timeout=60)
@pytest.mark.parametrize("path", sorted(SPEC_KEYS))
async def test_endpoint_matches_spec(http_client, base_url, path):
    cat = await get_catalog(http_client, base_url)
    body = await api(http_client, base_url, path, **valid_params(path, cat))
    assert set(body) == set(SPEC_KEYS[path].split()), sorted(body)
    assert body["status"] == "success"
    assert body.get("message", body.get("msg")) == ""
    if "has_next_page" in body:
        assert type(body["has_next_page"]) is bool and isinstance(body["next_cursor"], str)
        assert body["has_next_page"] == (body["next_cursor"] != "")
    if "data" in body:
        extract, schema = DATA_SCHEMAS[path]
        check(extract(body["data"]), schema)
        return
    if "article" in body:
        check(body["article"], ARTICLE)
        return
    key = next(k for k in body if k in RESULT_SCHEMAS)
    assert body[key], f"{path} returned no {key}"
    check(body[key], [RESULT_SCHEMAS[key]], key)


@pytest.mark.gen_test(timeout=60)
async def test_media_and_links_are_complete(http_client, base_url):
    body = await api(http_client, base_url, "tweet/advanced_search", query="has:media has:links")
    assert body["tweets"]
    check(body["tweets"], [TWEET])
    for t in body["tweets"]:
        entities = t["entities"]
        assert entities["media"] and entities["urls"]
        for m in entities["media"]:
            assert m["media_results"]["result"]["media_info"]["color_info"]["palette"]
            s, e = m["indices"]
            assert t["text"][s:e] == m["url"]
        for u in entities["urls"]:
            s, e = u["indices"]
            assert t["text"][s:e] == u["url"]
        for mention in entities["user_mentions"]:
            s, e = mention["indices"]
            assert t["text"][s:e] == "@" + mention["screen_name"]
        start, end = t["displayTextRange"]
        assert end <= entities["media"][0]["indices"][0]  # the media link is not displayed


@pytest.mark.gen_test(timeout=60)
async def test_statuses_count_is_filled_everywhere(http_client, base_url):
    cat = await get_catalog(http_client, base_url)
    name = cat["users"][0]["userName"]
    info = await api(http_client, base_url, "user/info", userName=name)
    assert type(info["data"]["statusesCount"]) is int and info["data"]["statusesCount"] > 0
    followers = await api(http_client, base_url, "user/followers", userName=name)
    timeline = await api(http_client, base_url, "user/last_tweets", userName=name)
    found = await api(http_client, base_url, "user/search", query="maria")
    assert timeline["tweets"][0]["author"]["statusesCount"] == info["data"]["statusesCount"]
    listed = followers["followers"] + [t["author"] for t in timeline["tweets"]] + found["users"]
    assert listed and all(type(u["statusesCount"]) is int and u["statusesCount"] >= 0 for u in listed)


@pytest.mark.gen_test(timeout=60)
async def test_tweets_hydrates_ids_without_paging(http_client, base_url):
    cat = await get_catalog(http_client, base_url)
    ids = cat["tweets"][:3]
    body = await api(http_client, base_url, "tweets", tweet_ids=",".join(ids[:2] + ["123", ids[2]]))
    assert "has_next_page" not in body and "next_cursor" not in body
    assert [t["id"] for t in body["tweets"]] == ids  # the unknown id is simply absent
    too_many = ",".join(cat["tweets"][:101])
    response = await fetch(http_client, base_url, "/twitter/tweets", {"tweet_ids": too_many})
    assert response.code == 400


@pytest.mark.gen_test(timeout=60)
async def test_batch_info_by_ids_resolves_full_profiles(http_client, base_url):
    cat = await get_catalog(http_client, base_url)
    users = cat["users"][:100]
    body = await api(
        http_client, base_url, "user/batch_info_by_ids", userIds=",".join(u["id"] for u in users[:99]) + ",1"
    )
    assert [u["id"] for u in body["users"]] == [u["id"] for u in users[:99]]
    assert [u["userName"] for u in body["users"]] == [u["userName"] for u in users[:99]]


@pytest.mark.gen_test(timeout=60)
async def test_quotes_carry_the_quoted_tweet(http_client, base_url):
    cat = await get_catalog(http_client, base_url)
    quoted = cat["quoted_tweets"][0]
    items, pages = await all_pages(http_client, base_url, "tweet/quotes", "tweets", tweetId=quoted)
    original = (await api(http_client, base_url, "tweets", tweet_ids=quoted))["tweets"][0]
    assert len(items) == original["quoteCount"] > 0
    for t in items:
        assert t["quoted_tweet"]["id"] == quoted
        assert t["quoted_tweet"]["quoted_tweet"] is None
        check(t, TWEET)
    assert [created(t) for t in items] == sorted((created(t) for t in items), reverse=True)


@pytest.mark.gen_test(timeout=60)
async def test_thread_context_has_ancestors_and_replies(http_client, base_url):
    cat = await get_catalog(http_client, base_url)
    target = cat["deep_replies"][0]
    items, _ = await all_pages(http_client, base_url, "tweet/thread_context", "replies", tweetId=target)
    by_id = {t["id"]: t for t in items}
    position = [t["id"] for t in items].index(target)
    chain, current = [], by_id[target]
    while current["isReply"]:
        chain.append(current["inReplyToId"])
        current = by_id[current["inReplyToId"]]  # every ancestor is present
    assert len(chain) >= 3 and current["id"] == by_id[target]["conversationId"]
    assert all([t["id"] for t in items].index(a) < position for a in chain)
    middle = chain[0]  # an ancestor with replies: its thread context includes them
    items, _ = await all_pages(http_client, base_url, "tweet/thread_context", "replies", tweetId=middle)
    assert target in {t["id"] for t in items}
    assert any(t["inReplyToId"] == middle for t in items)


# ---- paging ----------------------------------------------------------------------------


@pytest.mark.gen_test(timeout=60)
async def test_big_account_followers_page_to_the_end(http_client, base_url):
    cat = await get_catalog(http_client, base_url)
    big = cat["big_accounts"][0]
    total = (await api(http_client, base_url, "user/info", userName=big))["data"]["followers"]
    items, pages = await all_pages(http_client, base_url, "user/followers", "followers", userName=big, pageSize=200)
    ids = [u["id"] for u in items]
    assert len(ids) == len(set(ids)) == total > 20000
    assert pages == -(-total // 200)
    check(items[:5] + items[-5:], [USER])


@pytest.mark.gen_test(timeout=60)
async def test_followers_ids_integer_cursor(http_client, base_url):
    cat = await get_catalog(http_client, base_url)
    big = cat["big_accounts"][1]
    total = (await api(http_client, base_url, "user/info", userName=big))["data"]["followers"]
    ids, cursor, pages = [], None, 0
    while True:
        body = await api(
            http_client, base_url, "user/followers_ids", userName=big, **({"cursor": int(cursor)} if cursor else {})
        )
        pages += 1
        assert len(body["ids"]) <= 5000
        ids.extend(body["ids"])
        if not body["has_next_page"]:
            assert body["next_cursor"] == ""
            break
        assert body["next_cursor"].isdigit()
        cursor = body["next_cursor"]
    assert len(ids) == len(set(ids)) == total and pages == -(-total // 5000)
    first = await api(http_client, base_url, "user/followers", userName=big)
    assert [u["id"] for u in first["followers"]] == ids[:200]  # same order, newest first
    small = await api(http_client, base_url, "user/followers_ids", userName=big, count=10)
    assert len(small["ids"]) == 50  # count is clamped to 50..5000
    response = await fetch(http_client, base_url, "/twitter/user/followers_ids", {"userName": big, "cursor": "abc"})
    assert response.code == 400


@pytest.mark.gen_test(timeout=60)
async def test_page_sizes(http_client, base_url):
    cat = await get_catalog(http_client, base_url)
    big = cat["big_accounts"][0]
    default = await api(http_client, base_url, "user/followers", userName=big)
    assert len(default["followers"]) == 200
    clamped = await api(http_client, base_url, "user/followings", userName=cat["users"][0]["userName"], pageSize=500)
    assert 0 < len(clamped["followings"]) <= 200
    seven = await api(http_client, base_url, "user/followers", userName=big, pageSize=7)
    assert len(seven["followers"]) == 7 and seven["has_next_page"]
    for path, params in [
        ("tweet/advanced_search", {"query": "coffee"}),
        ("user/mentions", {"userName": big}),
        ("user/verifiedFollowers", {"user_id": cat["users"][-5]["id"]}),
        ("user/search", {"query": "a"}),
    ]:
        body = await api(http_client, base_url, path, **params)
        key = next(k for k in body if isinstance(body[k], list))
        assert len(body[key]) == 20 and body["has_next_page"], path
    trends = await api(http_client, base_url, "trends")
    assert len(trends["trends"]) == 30
    assert len((await api(http_client, base_url, "trends", woeid=23424977, count=5))["trends"]) == 5


@pytest.mark.gen_test(timeout=60)
async def test_timelines_page_newest_first(http_client, base_url):
    cat = await get_catalog(http_client, base_url)
    user = cat["users"][0]
    for path, params in [
        ("user/last_tweets", {"userName": user["userName"]}),
        ("user/tweet_timeline", {"userId": user["id"], "includeReplies": "True"}),
        ("list/tweets_timeline", {"listId": cat["lists"][0]}),
        ("community/tweets", {"community_id": cat["communities"][0]}),
    ]:
        items, pages = await all_pages(http_client, base_url, path, "tweets", **params)
        assert pages > 1, path
        ids = [t["id"] for t in items]
        assert len(ids) == len(set(ids)), path
        assert [created(t) for t in items] == sorted((created(t) for t in items), reverse=True), path
    own, _ = await all_pages(http_client, base_url, "user/last_tweets", "tweets", userName=user["userName"])
    assert all(not t["isReply"] and t["author"]["id"] == user["id"] for t in own)
    # The user posts live (catalog live_users): their replies come after the hour's live posts.
    params, replies = {"userId": user["id"], "includeReplies": "true", "includeParentTweet": "true"}, []
    while not replies:
        mixed = await api(http_client, base_url, "user/tweet_timeline", **params)
        replies = [n for n, t in enumerate(mixed["tweets"]) if t["isReply"] and t["author"]["id"] == user["id"]]
        params["cursor"] = mixed["next_cursor"]
    assert all(mixed["tweets"][n - 1]["id"] == mixed["tweets"][n]["inReplyToId"] for n in replies if n > 0)


@pytest.mark.gen_test(timeout=60)
async def test_empty_list(http_client, base_url):
    cat = await get_catalog(http_client, base_url)
    body = await api(http_client, base_url, "list/tweets_timeline", listId=cat["empty_lists"][0])
    assert body == {"tweets": [], "status": "success", "message": "", "has_next_page": False, "next_cursor": ""}


# ---- search ----------------------------------------------------------------------------


def words(text):
    return re.findall(r"\w+", re.sub(r"https?://\S+", " ", text.lower()))


def day(value):
    return datetime.strptime(value, "%Y-%m-%d").replace(tzinfo=UTC)


@pytest.mark.gen_test(timeout=60)
async def test_search_operators(http_client, base_url):
    cat = await get_catalog(http_client, base_url)
    user = cat["users"][0]["userName"]
    big = cat["big_accounts"][2]
    t0, t1 = 1704067200, 1704067200 + 5 * 86400  # 2024-01-01 .. 2024-01-06 UTC

    async def parents(tweets):
        ids = ",".join(t["inReplyToId"] for t in tweets)
        return (await api(http_client, base_url, "tweets", tweet_ids=ids))["tweets"]

    cases = {
        f"from:{user}": lambda t: t["author"]["userName"] == user,
        "lang:es": lambda t: t["lang"] == "es",
        "since:2024-03-01 until:2024-03-04": lambda t: day("2024-03-01") <= created(t) < day("2024-03-04"),
        f"since_time:{t0} until_time:{t1}": lambda t: t0 <= created(t).timestamp() < t1,
        "min_faves:2000": lambda t: t["likeCount"] >= 2000,
        "min_retweets:500": lambda t: t["retweetCount"] >= 500,
        "coffee filter:replies": lambda t: t["isReply"] and "coffee" in words(t["text"]),
        "coffee -filter:replies": lambda t: not t["isReply"] and "coffee" in words(t["text"]),
        "has:media": lambda t: bool(t["entities"]["media"]),
        "jazz filter:media": lambda t: bool(t["entities"]["media"]) and "jazz" in words(t["text"]),
        '"machine learning"': lambda t: "machine learning" in " ".join(words(t["text"])),
        "coffee -today": lambda t: "coffee" in words(t["text"]) and "today" not in words(t["text"]),
        "chess OR jazz": lambda t: {"chess", "jazz"} & set(words(t["text"])),
        "(chess OR jazz) lang:en -filter:replies": lambda t: (
            {"chess", "jazz"} & set(words(t["text"])) and t["lang"] == "en" and not t["isReply"]
        ),
        "#Coffee": lambda t: "Coffee" in [h["text"] for h in t["entities"]["hashtags"]],
    }
    for query, predicate in cases.items():
        body = await api(http_client, base_url, "tweet/advanced_search", query=query)
        assert body["tweets"], query
        assert all(predicate(t) for t in body["tweets"]), query
    body = await api(http_client, base_url, "tweet/advanced_search", query=f"to:{big}")
    assert body["tweets"] and all(t["isReply"] for t in body["tweets"])
    assert {p["author"]["userName"] for p in await parents(body["tweets"])} == {big}
    # A whole result: every tweet of the user, each once.
    items, _ = await all_pages(http_client, base_url, "tweet/advanced_search", "tweets", query=f"from:{user}")
    timeline, _ = await all_pages(
        http_client, base_url, "user/tweet_timeline", "tweets", userId=cat["users"][0]["id"], includeReplies="true"
    )
    archived = lambda tweets: sorted(t["id"] for t in tweets if created(t).year < 2025)  # noqa: E731 - live posts move
    assert archived(items) == archived(timeline) and len(archived(items)) > 20
    response = await fetch(http_client, base_url, "/twitter/tweet/advanced_search", {"query": "since:yesterday"})
    assert response.code == 400


# The provider's search operators beyond those above: its docs link github.com/igorbrigadir/twitter-advanced-search
# for them, and its own examples use include:nativeretweets and within_time:, which found nothing here. Each is
# honoured (every tweet found has the property, and some are found), or, where it means nothing in this world,
# ignored (the same tweets as without it). Searches end before 2025 where two are compared: live posts move.
STATIC = "coffee until:2024-06-01"
ARCHIVE = "until:2024-06-01"


def _quoted(t):
    return t["quoted_tweet"] or {}


def _ago(t, seconds):
    return time.time() - created(t).timestamp() <= seconds + 5


HONOURED = {
    "within_time": ("coffee within_time:1h", lambda t, c: "coffee" in words(t["text"]) and _ago(t, 3600)),
    "within_time_seconds": ("lang:en within_time:30s", lambda t, c: _ago(t, 30)),
    "filter_self_threads": (
        f"filter:self_threads {ARCHIVE}",
        lambda t, c: t["isReply"] and t["inReplyToUsername"] == t["author"]["userName"],
    ),
    "exclude": (f"coffee exclude:replies {ARCHIVE}", lambda t, c: not t["isReply"]),
    "filter_twimg": (f"filter:twimg {ARCHIVE}", lambda t, c: bool(t["entities"].get("media"))),
    "filter_retweets": (f"filter:retweets {ARCHIVE}", lambda t, c: bool(_quoted(t))),
    "filter_has_engagement": (
        f"filter:has_engagement {ARCHIVE}",
        lambda t, c: t["likeCount"] + t["retweetCount"] + t["replyCount"] > 0,
    ),
    "quoted_tweet_id": ("quoted_tweet_id:{quoted}", lambda t, c: _quoted(t).get("id") == c["quoted"]),
    "quoted_user_id": ("quoted_user_id:{quoted_author}", lambda t, c: _quoted(t)["author"]["id"] == c["quoted_author"]),
    "list": ("list:{list}", lambda t, c: t["author"]["id"] in c["members"]),
    "url": (
        f"url:github.com {ARCHIVE}",
        lambda t, c: any("github.com" in u["expanded_url"] for u in t["entities"]["urls"]),
    ),
    "source": (f"source:Twitter_for_iPhone {ARCHIVE}", lambda t, c: t["source"] == "Twitter for iPhone"),
    "plus": ("+coffee", lambda t, c: "coffee" in words(t["text"])),
    "wildcard_phrase": ('"{first} * {third}"', lambda t, c: re.search(c["gap"], " ".join(words(t["text"])))),
}
IGNORED = {
    "include_nativeretweets": "include:nativeretweets",
    "filter_follows": "filter:follows",
    "negated_filter_follows": "-filter:follows",
    "filter_social": "filter:social",
    "filter_trusted": "filter:trusted",
    "near": "near:London",
    "within": "near:London within:10km",
    "geocode": "geocode:37.7764685,-122.4172004,10km",
    "place": "place:96683cc9126741d1",
    "filter_safe": "filter:safe",
}
NEVER = {
    "filter_nativeretweets": "filter:nativeretweets",
    "filter_videos": "filter:videos",
    "filter_native_video": "filter:native_video",
    "filter_consumer_video": "filter:consumer_video",
    "filter_pro_video": "filter:pro_video",
    "filter_vine": "filter:vine",
    "filter_periscope": "filter:periscope",
    "filter_spaces": "filter:spaces",
    "filter_news": "filter:news",
    "card_name": "card_name:animated_gif",
    "card_domain": "card_domain:pscp.tv",
    "card_url": "card_url:pscp.tv",
}


async def operator_values(client, base_url) -> dict:
    cat = await get_catalog(client, base_url)
    quote = (await api(client, base_url, "tweet/advanced_search", query=f"filter:quote {ARCHIVE}"))["tweets"][0]
    members = await api(client, base_url, "list/members", list_id=cat["lists"][0])
    text = " ".join(words((await api(client, base_url, "tweet/advanced_search", query=STATIC))["tweets"][0]["text"]))
    first, _, third = text.split()[:3]
    return {
        "quoted": cat["quoted_tweets"][0],
        "quoted_author": quote["quoted_tweet"]["author"]["id"],
        "list": cat["lists"][0],
        "members": {u["id"] for u in members.get("members") or members.get("users")},
        "first": first,
        "third": third,
        "gap": rf"\b{first} \S+ {third}\b",
    }


@pytest.mark.gen_test(timeout=60)
@pytest.mark.parametrize("name", HONOURED)
async def test_a_documented_search_operator_is_honoured(http_client, base_url, name):
    values = await operator_values(http_client, base_url)
    query, predicate = HONOURED[name]
    tweets = (await api(http_client, base_url, "tweet/advanced_search", query=query.format(**values)))["tweets"]
    assert tweets, query
    assert all(predicate(t, values) for t in tweets), (query, [t["text"] for t in tweets[:3]])


@pytest.mark.gen_test(timeout=60)
@pytest.mark.parametrize("name", IGNORED)
async def test_a_documented_search_operator_meaningless_here_is_ignored(http_client, base_url, name):
    without = await api(http_client, base_url, "tweet/advanced_search", query=STATIC)
    with_it = await api(http_client, base_url, "tweet/advanced_search", query=f"{STATIC} {IGNORED[name]}")
    assert without["tweets"] and [t["id"] for t in with_it["tweets"]] == [t["id"] for t in without["tweets"]]


@pytest.mark.gen_test(timeout=60)
@pytest.mark.parametrize("name", NEVER)
async def test_a_documented_search_operator_for_what_this_world_lacks_finds_none_and_negated_all(
    http_client, base_url, name
):
    found = await api(http_client, base_url, "tweet/advanced_search", query=f"{STATIC} {NEVER[name]}")
    assert found["tweets"] == [] and found["has_next_page"] is False
    without = await api(http_client, base_url, "tweet/advanced_search", query=STATIC)
    negated = await api(http_client, base_url, "tweet/advanced_search", query=f"{STATIC} -{NEVER[name]}")
    assert [t["id"] for t in negated["tweets"]] == [t["id"] for t in without["tweets"]]


@pytest.mark.gen_test(timeout=60)
async def test_the_provider_s_monitoring_example_finds_the_account_s_posts(http_client, base_url):
    """Its blog's monitoring query: from:X since:.. until:.. include:nativeretweets (it found 0, 20 without)."""
    cat = await get_catalog(http_client, base_url)
    user = cat["live_users"][0]
    now = datetime.now(UTC)
    since, until = (now.timestamp() - 1800, now.timestamp() + 60)
    stamp = lambda s: datetime.fromtimestamp(s, UTC).strftime("%Y-%m-%d_%H:%M:%S_UTC")  # noqa: E731 - as its example
    query = f"from:{user} since:{stamp(since)} until:{stamp(until)} include:nativeretweets"
    tweets = (await api(http_client, base_url, "tweet/advanced_search", query=query, queryType="Latest"))["tweets"]
    assert len(tweets) == 20 and all(t["author"]["userName"] == user for t in tweets)


@pytest.mark.gen_test(timeout=60)
async def test_search_latest_and_top_orderings(http_client, base_url):
    # Latest is the default. Lists show the live posts of the hour before the request, so a pair of calls that
    # straddles a second can differ by a post (a busy machine made it happen): the same answer within a few pairs.
    for _ in range(5):
        latest = await api(http_client, base_url, "tweet/advanced_search", query="coffee")
        latest2 = await api(http_client, base_url, "tweet/advanced_search", query="coffee", queryType="Latest")
        if latest == latest2:
            break
    assert latest == latest2
    top = await api(http_client, base_url, "tweet/advanced_search", query="coffee", queryType="Top")
    dates = [created(t) for t in latest["tweets"]]
    assert dates == sorted(dates, reverse=True)
    scores = [engagement(t) for t in top["tweets"]]
    assert scores == sorted(scores, reverse=True)
    top_ids = {t["id"] for t in top["tweets"]}
    assert all(engagement(t) <= min(scores) for t in latest["tweets"] if t["id"] not in top_ids)
    response = await fetch(
        http_client, base_url, "/twitter/tweet/advanced_search", {"query": "coffee", "queryType": "Sideways"}
    )
    assert response.code == 400


@pytest.mark.gen_test(timeout=60)
async def test_replies_and_their_orderings(http_client, base_url):
    cat = await get_catalog(http_client, base_url)
    tid = cat["tweets"][0]
    root = (await api(http_client, base_url, "tweets", tweet_ids=tid))["tweets"][0]
    direct, _ = await all_pages(http_client, base_url, "tweet/replies", "replies", tweetId=tid)
    assert len(direct) == root["replyCount"] > 20
    assert all(t["inReplyToId"] == tid for t in direct)
    assert [created(t) for t in direct] == sorted((created(t) for t in direct), reverse=True)
    orders = {}
    for query_type in ("Relevance", "Latest", "Likes"):
        items, _ = await all_pages(
            http_client, base_url, "tweet/replies/v2", "tweets", tweetId=tid, queryType=query_type
        )
        assert all(t["conversationId"] == root["conversationId"] for t in items)
        orders[query_type] = [t for t in items if t["inReplyToId"] == tid]
        assert {t["id"] for t in orders[query_type]} == {t["id"] for t in direct}
    default, _ = await all_pages(http_client, base_url, "tweet/replies/v2", "tweets", tweetId=tid)
    assert [t["id"] for t in default if t["inReplyToId"] == tid] == [t["id"] for t in orders["Relevance"]]
    latest = [created(t) for t in orders["Latest"]]
    assert latest == sorted(latest, reverse=True)
    likes = [t["likeCount"] for t in orders["Likes"]]
    assert likes == sorted(likes, reverse=True)
    relevance = [(t["author"]["id"] == root["author"]["id"], engagement(t)) for t in orders["Relevance"]]
    assert relevance == sorted(relevance, reverse=True)


@pytest.mark.gen_test(timeout=60)
async def test_mentions_and_user_search(http_client, base_url):
    cat = await get_catalog(http_client, base_url)
    big = cat["big_accounts"][0]
    body = await api(http_client, base_url, "user/mentions", userName=big)
    assert all(big in [m["screen_name"] for m in t["entities"]["user_mentions"]] for t in body["tweets"])
    found = await api(http_client, base_url, "user/search", query="maria")
    for u in found["users"]:
        assert "maria" in (u["userName"] + " " + u["name"] + " " + u["description"]).lower()
    exact = await api(http_client, base_url, "user/search", query=big)
    assert exact["users"][0]["userName"] == big


# ---- unknown ids, bad input, determinism, prefix -----------------------------------------


@pytest.mark.gen_test(timeout=60)
async def test_unknown_ids_answer_status_error(http_client, base_url):
    cases = [
        ("user/info", {"userName": "nobody_at_all_x"}, "msg", "data", None),
        ("user_about", {"userName": "nobody_at_all_x"}, "msg", "data", None),
        ("spaces/detail", {"space_id": "1NOPE"}, "msg", "data", None),
        ("community/info", {"community_id": "42"}, "msg", "data", None),
        ("user/followers", {"userName": "nobody_at_all_x"}, "message", "followers", []),
        ("user/followers_ids", {"userId": "42"}, "msg", "ids", []),
        ("tweet/replies", {"tweetId": "42"}, "message", "replies", []),
        ("tweet/thread_context", {"tweetId": "42"}, "message", "replies", []),
        ("list/tweets_timeline", {"listId": "42"}, "message", "tweets", []),
        ("community/tweets", {"community_id": "42"}, "msg", "tweets", []),
        ("trends", {"woeid": "42"}, "msg", "trends", []),
        ("tweet/retweeters", {"tweetId": "42"}, "message", "users", []),
        ("list/followers", {"list_id": "42"}, "msg", "followers", []),
        ("list/members", {"list_id": "42"}, "msg", "members", []),
        ("community/members", {"community_id": "42"}, "msg", "members", []),
        (
            "user/check_follow_relationship",
            {"source_user_name": "nobody_at_all_x", "target_user_name": "NewsWireDaily"},
            "message",
            "data",
            None,
        ),
        ("article", {"tweet_id": "42"}, "message", "article", None),
    ]
    for path, params, msg_key, key, empty in cases:
        body = await api(http_client, base_url, path, **params)
        assert set(body) == set(SPEC_KEYS[path].split()), path
        assert body["status"] == "error" and "not found" in body[msg_key], path
        assert body[key] == empty, path
        if "has_next_page" in body:
            assert (body["has_next_page"], body["next_cursor"]) == (False, ""), path


@pytest.mark.gen_test(timeout=60)
async def test_bad_input_is_a_400(http_client, base_url):
    cat = await get_catalog(http_client, base_url)
    name = cat["users"][0]["userName"]
    for path, params in [
        ("user/followers", {"userName": name, "pageSize": "many"}),
        ("user/followers", {"userName": name, "cursor": "not-a-cursor!"}),
        ("user/info", {}),
        ("tweet/advanced_search", {"query": "  "}),
        ("trends", {"count": "1.5"}),
        ("user/tweet_timeline", {"userId": cat["users"][0]["id"], "includeReplies": "maybe"}),
    ]:
        response = await fetch(http_client, base_url, "/twitter/" + path, params)
        assert response.code == 400, path
        body = orjson.loads(response.body)
        assert body["status"] == "error" and body["msg"], path


@pytest.mark.gen_test(timeout=60)
async def test_same_request_same_bytes(http_client, base_url):
    cat = await get_catalog(http_client, base_url)
    name = cat["big_accounts"][0]
    first = await fetch(http_client, base_url, "/twitter/user/followers", {"userName": name, "pageSize": 50})
    second = await fetch(http_client, base_url, "/twitter/user/followers", {"pageSize": 50, "userName": name})
    assert first.code == 200 and first.body == second.body
    cursor = orjson.loads(first.body)["next_cursor"]
    page2 = [
        await fetch(
            http_client, base_url, "/twitter/user/followers", {"userName": name, "pageSize": 50, "cursor": cursor}
        )
        for _ in range(2)
    ]
    assert page2[0].body == page2[1].body != first.body


@pytest.mark.gen_test(timeout=60)
async def test_the_seed_picks_the_world(io_loop):
    servers = [sandbox.start("127.0.0.1", 0, KEY, seed=s) for s in (7, 8)]
    client = AsyncHTTPClient()
    try:
        bodies = [
            (await fetch(client, server.url, "/twitter/user/info", {"userName": "NewsWireDaily"})).body
            for server in servers
        ]
        assert orjson.loads(bodies[1])["status"] == "success" and bodies[0] != bodies[1]
    finally:
        for server in servers:
            server.stop()


@pytest.mark.gen_test(timeout=60)
async def test_prefix_is_configurable(io_loop):
    server = sandbox.start("127.0.0.1", 0, KEY, prefix="/api/v2/")
    client = AsyncHTTPClient()
    try:
        response = await fetch(client, server.url, "/api/v2/user/info", {"userName": "NewsWireDaily"})
        assert response.code == 200 and orjson.loads(response.body)["data"]["userName"] == "NewsWireDaily"
        response = await fetch(client, server.url, "/twitter/user/info", {"userName": "NewsWireDaily"})
        assert response.code == 404
    finally:
        server.stop()


# ---- faults ----------------------------------------------------------------------------


@pytest.fixture
def server(io_loop):
    server = sandbox.start("127.0.0.1", 0, KEY)
    yield server
    server.stop()


async def faulty(server, fault, **kwargs):
    return await fetch(
        AsyncHTTPClient(),
        server.url,
        "/twitter/user/info",
        {"userName": "CodeDigest"},
        headers={**AUTH, "X-Sim-Fault": fault},
        **kwargs,
    )


@pytest.mark.gen_test(timeout=60)
async def test_fault_latency(server):
    await faulty(server, "none")  # warm the page cache
    began = time.monotonic()
    assert (await faulty(server, "none")).code == 200
    fast = time.monotonic() - began
    began = time.monotonic()
    response = await faulty(server, "latency=300")
    assert response.code == 200 and orjson.loads(response.body)["status"] == "success"
    assert time.monotonic() - began >= 0.3 > fast


@pytest.mark.gen_test(timeout=60)
async def test_fault_errors(server):
    for code in (500, 502, 503):
        response = await faulty(server, f"error={code}:1")
        assert response.code == code and orjson.loads(response.body)["status"] == "error"
    assert (await faulty(server, "error=503:0")).code == 200
    codes = {(await faulty(server, "error=503:0.5")).code for _ in range(40)}
    assert codes == {200, 503}
    assert (await faulty(server, "error=banana")).code == 400


@pytest.mark.gen_test(timeout=60)
async def test_fault_hang_outlasts_the_client_timeout(server):
    began = time.monotonic()
    with pytest.raises(HTTPTimeoutError):
        await faulty(server, "hang", request_timeout=0.5)
    assert time.monotonic() - began >= 0.5
    assert (await faulty(server, "none")).code == 200  # the server is still serving


@pytest.mark.gen_test(timeout=60)
async def test_hang_is_released_by_stop(io_loop):
    server = sandbox.start("127.0.0.1", 0, KEY)
    request = asyncio.ensure_future(faulty(server, "hang", request_timeout=30))
    await asyncio.sleep(0.3)
    began = time.monotonic()
    server.stop()
    with pytest.raises(HTTPClientError):  # the connection is closed, not left hanging
        await request
    assert time.monotonic() - began < 5


@pytest.mark.gen_test(timeout=60)
async def test_fault_malformed_body(server):
    response = await faulty(server, "malformed")
    assert response.code == 200 and response.body
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(response.body)


@pytest.mark.gen_test(timeout=60)
@pytest.mark.parametrize("fault", ["truncate", "reset"])
async def test_fault_broken_connections_make_the_client_fail(server, fault):
    for client in (AsyncHTTPClient(force_instance=True), CurlAsyncHTTPClient(force_instance=True)):
        try:
            with pytest.raises((HTTPClientError, OSError)):
                await client.fetch(
                    server.url + "/twitter/user/info?userName=CodeDigest", headers={**AUTH, "X-Sim-Fault": fault}
                )
        finally:
            client.close()
    assert (await faulty(server, "none")).code == 200


@pytest.mark.gen_test(timeout=60)
async def test_fault_oversize(server):
    normal = await faulty(server, "none")
    response = await faulty(server, "oversize=300000")
    assert response.code == 200 and len(response.body) >= 300000
    assert orjson.loads(response.body) == orjson.loads(normal.body)


@pytest.mark.gen_test(timeout=60)
async def test_run_wide_faults_and_header_override(io_loop):
    server = sandbox.start("127.0.0.1", 0, KEY, faults="error=502:1")
    client = AsyncHTTPClient()
    try:
        url = server.url + "/twitter/trends"
        assert (await client.fetch(url, headers=AUTH, raise_error=False)).code == 502
        response = await client.fetch(url, headers={**AUTH, "X-Sim-Fault": "none"}, raise_error=False)
        assert response.code == 200
        healthz = await client.fetch(server.url + "/healthz", raise_error=False)
        assert healthz.code == 200  # faults are for provider paths only
    finally:
        server.stop()
    with pytest.raises(ValueError):
        sandbox.make_app(KEY, faults="explode")


# ---- connections, stats, command ---------------------------------------------------------


@pytest.mark.gen_test(timeout=60)
async def test_keep_alive_requests_count_as_one_connection(server):
    client = CurlAsyncHTTPClient(force_instance=True)
    try:
        for _ in range(5):
            response = await client.fetch(server.url + "/twitter/trends", headers=AUTH)
            assert response.code == 200
    finally:
        client.close()
    assert (server.stats["connections"], server.stats["requests"]) == (1, 5)
    simple = AsyncHTTPClient(force_instance=True)
    try:
        for _ in range(3):
            await simple.fetch(server.url + "/twitter/trends", headers=AUTH)
        stats = orjson.loads((await simple.fetch(server.url + "/sandbox/stats")).body)
    finally:
        simple.close()
    assert stats == {"connections": 5, "requests": 8}  # one connection per request, stats not counted
    assert server.stats == stats


@pytest.mark.gen_test(timeout=30)
async def test_command_line_serves_the_same_world_and_stops_on_sigterm(http_client, base_url):
    """`python -m sandbox` in another process (another hash seed) serves byte-identical pages."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandbox", "--port", "0", "--api-key", KEY], stdout=subprocess.PIPE, text=True
    )
    try:
        line = await asyncio.get_running_loop().run_in_executor(None, proc.stdout.readline)
        url = re.search(r"http://127\.0\.0\.1:\d+", line).group(0)
        for path, params in [
            # Before the live posts (sandbox.live), which could differ across the edge of a second.
            ("/twitter/tweet/advanced_search", {"query": "jazz OR chess until:2024-12-01"}),
            ("/twitter/user/followers", {"userName": "OrbitalFacts"}),
            ("/sandbox/catalog", None),
        ]:
            theirs = await fetch(http_client, url, path, params)
            ours = await fetch(http_client, base_url, path, params)
            assert theirs.code == 200 and theirs.body == ours.body, path
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.get_running_loop().run_in_executor(None, proc.wait, 10) == 0
    finally:
        proc.kill()
