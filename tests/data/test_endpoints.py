"""The data-endpoint table (social/endpoints.py) against the spec: paths, parameters, keys, page sizes."""

import pytest

from metering.pricing import Prices
from social.endpoints import BY_PATH, ENDPOINTS, count_items, page_size

# Transcribed from the spec's data-endpoint table (seeds/000_*.txt): path -> (query parameters with
# "req" for required, top-level response keys). The two unavailable endpoints show no response keys.
SPEC_TABLE = {
    "/tweet/advanced_search": (
        {"query": "req", "queryType": "", "cursor": ""},
        {"tweets", "status", "message", "has_next_page", "next_cursor"},
    ),
    "/user/tweet_timeline": (
        {"userId": "req", "cursor": "", "includeReplies": "", "includeParentTweet": ""},
        {"tweets", "status", "message", "has_next_page", "next_cursor"},
    ),
    "/tweet/thread_context": (
        {"tweetId": "req", "cursor": ""},
        {"replies", "has_next_page", "next_cursor", "status", "message"},
    ),
    "/user/verifiedFollowers": (
        {"user_id": "req", "cursor": ""},
        {"followers", "status", "message", "has_next_page", "next_cursor"},
    ),
    "/community/tweets": (
        {"community_id": "req", "cursor": ""},
        {"tweets", "status", "msg", "has_next_page", "next_cursor"},
    ),
    "/user/followers": (
        {"userName": "req", "cursor": "", "pageSize": ""},
        {"followers", "status", "message", "has_next_page", "next_cursor"},
    ),
    "/user/followings": (
        {"userName": "req", "cursor": "", "pageSize": ""},
        {"followings", "status", "message", "has_next_page", "next_cursor"},
    ),
    "/spaces/detail": ({"space_id": "req"}, {"status", "msg", "data"}),
    "/user_about": ({"userName": "req"}, {"status", "msg", "data"}),
    "/user/batch_info_by_ids": ({"userIds": "req"}, {"status", "msg", "users"}),
    "/user/info": ({"userName": "req"}, {"status", "msg", "data"}),
    "/trends": ({"woeid": "", "count": ""}, {"trends", "status", "msg"}),
    "/list/tweets_timeline": (
        {"listId": "req", "cursor": ""},
        {"tweets", "status", "message", "has_next_page", "next_cursor"},
    ),
    "/user/followers_ids": (
        {"userName": "", "userId": "", "count": "", "cursor": ""},
        {"ids", "has_next_page", "next_cursor", "status", "msg"},
    ),
    "/tweet/quotes": (
        {"tweetId": "req", "cursor": ""},
        {"tweets", "status", "message", "has_next_page", "next_cursor"},
    ),
    "/user/last_tweets": (
        {"userName": "", "userId": "", "cursor": "", "includeReplies": ""},
        {"tweets", "status", "message", "has_next_page", "next_cursor"},
    ),
    "/tweet/replies/v2": (
        {"tweetId": "req", "cursor": "", "queryType": ""},
        {"tweets", "status", "message", "has_next_page", "next_cursor"},
    ),
    "/tweet/replies": (
        {"tweetId": "req", "cursor": ""},
        {"replies", "status", "message", "has_next_page", "next_cursor"},
    ),
    "/user/mentions": (
        {"userName": "req", "cursor": ""},
        {"tweets", "status", "message", "has_next_page", "next_cursor"},
    ),
    "/user/search": ({"query": "req", "cursor": ""}, {"users", "status", "msg", "has_next_page", "next_cursor"}),
    "/tweets": ({"tweet_ids": "req"}, {"status", "message", "tweets"}),
    "/community/info": ({"community_id": "req"}, {"status", "msg", "data"}),
    "/community/get_tweets_from_all_community": ({"query": "req", "queryType": "", "cursor": ""}, None),
    "/community/moderators": ({"community_id": "req", "cursor": ""}, None),
}
# Typed parameters the spec names (boolean, integer, comma-separated ids); all others are strings.
SPEC_TYPES = {
    ("/user/tweet_timeline", "includeReplies"): "bool",
    ("/user/tweet_timeline", "includeParentTweet"): "bool",
    ("/user/followers", "pageSize"): "int",
    ("/user/followings", "pageSize"): "int",
    ("/user/batch_info_by_ids", "userIds"): "ids",
    ("/trends", "woeid"): "int",
    ("/trends", "count"): "int",
    ("/user/followers_ids", "count"): "int",
    ("/user/followers_ids", "cursor"): "int",
    ("/user/last_tweets", "includeReplies"): "bool",
    ("/tweets", "tweet_ids"): "ids",
}
# Beyond the spec, transcribed from the provider's current documentation (the public mirror
# dorukardahan/twitterapi-io-mcp, docs/endpoints/*.md, December 2025): six endpoints...
DOCUMENTED_TABLE = {
    "/tweet/retweeters": (
        {"tweetId": "req", "cursor": ""},
        {"users", "has_next_page", "next_cursor", "status", "message"},
    ),
    "/list/followers": (
        {"list_id": "req", "cursor": ""},
        {"followers", "has_next_page", "next_cursor", "status", "msg"},
    ),
    "/list/members": ({"list_id": "req", "cursor": ""}, {"members", "has_next_page", "next_cursor", "status", "msg"}),
    "/community/members": (
        {"community_id": "req", "cursor": ""},
        {"members", "has_next_page", "next_cursor", "status", "msg"},
    ),
    # target_user_name is not marked required there, but a relationship needs two users.
    "/user/check_follow_relationship": (
        {"source_user_name": "req", "target_user_name": "req"},
        {"data", "status", "message"},
    ),
    "/article": ({"tweet_id": "req"}, {"article", "status", "message"}),
}
# ...and the filters it documents on three of the spec's endpoints.
DOCUMENTED_PARAMS = {
    "/user/mentions": {"sinceTime": "", "untilTime": ""},
    "/tweet/replies": {"sinceTime": "", "untilTime": ""},
    "/tweet/quotes": {"sinceTime": "", "untilTime": "", "includeReplies": ""},
}
DOCUMENTED_TYPES = {
    **{(path, name): "int" for path in DOCUMENTED_PARAMS for name in ("sinceTime", "untilTime")},
    ("/tweet/quotes", "includeReplies"): "bool",
}
TABLE = {**SPEC_TABLE, **DOCUMENTED_TABLE}
RESULT_KEYS = {"tweets", "replies", "followers", "followings", "users", "ids", "trends", "data", "members", "article"}


def test_endpoint_table_has_the_24_spec_endpoints_and_6_documented_ones():
    assert len(SPEC_TABLE) == 24 and len(DOCUMENTED_TABLE) == 6
    assert len(ENDPOINTS) == len(BY_PATH) == 30
    assert set(BY_PATH) == set(TABLE)


def test_exactly_the_two_community_endpoints_are_unavailable():
    unavailable = {e.path for e in ENDPOINTS if not e.available}
    assert unavailable == {"/community/get_tweets_from_all_community", "/community/moderators"}


def test_every_price_names_an_existing_rule():
    prices = Prices()
    for endpoint in ENDPOINTS:
        assert endpoint.price in prices.rules, endpoint.path
        # Every available endpoint can price an empty and a full page.
        size = page_size(endpoint, {})
        if endpoint.available and size:
            assert prices.cost(endpoint.price, size, size) >= prices.cost(endpoint.price, 0, size) >= 15


@pytest.mark.parametrize("path", [p for p, (_, keys) in TABLE.items() if keys is not None])
def test_msg_key_and_results_key_match_the_spec(path):
    endpoint = BY_PATH[path]
    keys = TABLE[path][1]
    expected_msg = "msg" if "msg" in keys else "message"
    assert ("msg" in keys) != ("message" in keys)
    assert endpoint.msg_key == expected_msg
    (results,) = keys & RESULT_KEYS
    assert endpoint.results == results
    assert endpoint.paged == ("has_next_page" in keys)


@pytest.mark.parametrize("path", list(TABLE))
def test_params_and_required_params_match_the_spec(path):
    endpoint = BY_PATH[path]
    spec_params = {**TABLE[path][0], **DOCUMENTED_PARAMS.get(path, {})}
    assert {p.name for p in endpoint.params} == set(spec_params)
    assert {p.name for p in endpoint.params if p.required} == {n for n, r in spec_params.items() if r == "req"}
    for param in endpoint.params:
        kind = "str" if param.kind == "cursor" else param.kind  # a cursor is a string with its own checks
        assert kind == {**SPEC_TYPES, **DOCUMENTED_TYPES}.get((path, param.name), "str"), param.name


def test_page_sizes_follow_reference_defaults():
    assert page_size(BY_PATH["/tweet/advanced_search"], {}) == 20
    assert page_size(BY_PATH["/user/followers"], {}) == 200
    assert page_size(BY_PATH["/user/followers"], {"pageSize": 99}) == 99
    assert page_size(BY_PATH["/user/followers_ids"], {}) == 5000
    assert page_size(BY_PATH["/user/followers_ids"], {"count": 200}) == 200
    assert page_size(BY_PATH["/user/batch_info_by_ids"], {"userIds": ["1", "2", "3"]}) == 3
    assert page_size(BY_PATH["/tweets"], {"tweet_ids": [str(i) for i in range(100)]}) == 100
    assert page_size(BY_PATH["/trends"], {}) == 30
    assert page_size(BY_PATH["/user/info"], {}) == 1
    followers = BY_PATH["/user/followers"].param("pageSize")
    assert (followers.minimum, followers.maximum) == (1, 200)
    count = BY_PATH["/user/followers_ids"].param("count")
    assert (count.minimum, count.maximum) == (50, 5000)
    assert BY_PATH["/tweets"].param("tweet_ids").maximum == 100
    assert BY_PATH["/user/batch_info_by_ids"].param("userIds").maximum == 100


def test_count_items():
    followers = BY_PATH["/user/followers"]
    assert count_items(followers, {"followers": [{}, {}, {}], "tweets": [{}]}) == 3
    assert count_items(followers, {"followers": []}) == 0
    assert count_items(followers, {}) == 0
    info = BY_PATH["/user/info"]
    assert count_items(info, {"data": {"id": "1"}}) == 1
    assert count_items(info, {"data": None}) == 0
    assert count_items(info, {"data": {}}) == 0
