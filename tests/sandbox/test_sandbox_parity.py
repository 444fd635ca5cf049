"""The sandbox's endpoints and filters beyond the spec, from the provider's current documentation
(issue 27): the six endpoints with realistic data and paging, and sinceTime / untilTime /
includeReplies on mentions, replies and quotes. Envelopes and objects are checked field by field
in test_sandbox.py (test_endpoint_matches_spec)."""

import calendar
import time
from urllib.parse import urlencode

import orjson
import pytest

import sandbox
from sandbox.world import get_world

KEY = "sandbox-parity-key"
AUTH = {"X-API-Key": KEY}


@pytest.fixture
def app():
    return sandbox.make_app(KEY)


async def call(http_client, base_url, path, expect=200, **params):
    response = await http_client.fetch(
        f"{base_url}/twitter/{path}?{urlencode(params)}", headers=AUTH, raise_error=False
    )
    assert response.code == expect, (path, params, response.body[:300])
    return orjson.loads(response.body)


async def every_page(http_client, base_url, path, key, **params):
    items, cursor, pages = [], None, 0
    while True:
        body = await call(http_client, base_url, path, **params, **({"cursor": cursor} if cursor else {}))
        pages += 1
        items += body[key]
        if not body["has_next_page"]:
            assert body["next_cursor"] == ""
            return items, pages
        cursor = body["next_cursor"]


async def catalog(http_client, base_url):
    return orjson.loads((await http_client.fetch(base_url + "/sandbox/catalog")).body)


def stamp(tweet) -> int:
    return calendar.timegm(time.strptime(tweet["createdAt"], "%a %b %d %H:%M:%S +0000 %Y"))


@pytest.mark.gen_test(timeout=60)
async def test_retweeters_page_through_the_reposts(http_client, base_url):
    cat = await catalog(http_client, base_url)
    tweet = (await call(http_client, base_url, "tweets", tweet_ids=cat["quoted_tweets"][0]))["tweets"][0]
    assert 100 < tweet["retweetCount"] < 5000, tweet["retweetCount"]  # a few pages, not hundreds
    users, pages = await every_page(http_client, base_url, "tweet/retweeters", "users", tweetId=tweet["id"])
    ids = [u["id"] for u in users]
    assert len(ids) == len(set(ids)) == tweet["retweetCount"]  # as many distinct accounts as reposts
    assert pages == -(-tweet["retweetCount"] // 100)  # about 100 a page, as the provider documents
    found = (await call(http_client, base_url, "tweet/advanced_search", query="lang:ja"))["tweets"]
    quiet = next(t for t in found if t["retweetCount"] < 100)
    none = await call(http_client, base_url, "tweet/retweeters", tweetId=quiet["id"])
    assert len(none["users"]) == quiet["retweetCount"] and none["status"] == "success"


@pytest.mark.gen_test(timeout=60)
async def test_list_members_and_followers(http_client, base_url):
    cat = await catalog(http_client, base_url)
    list_id = cat["lists"][0]
    members, _ = await every_page(http_client, base_url, "list/members", "members", list_id=list_id)
    # The list's timeline is its members' posts: every author there is a member.
    timeline = await call(http_client, base_url, "list/tweets_timeline", listId=list_id)
    assert {t["author"]["id"] for t in timeline["tweets"]} <= {m["id"] for m in members}
    followers, pages = await every_page(http_client, base_url, "list/followers", "followers", list_id=list_id)
    assert 10 <= len(followers) <= 600 and len({f["id"] for f in followers}) == len(followers)
    assert pages == -(-len(followers) // 20)
    empty = await call(http_client, base_url, "list/members", list_id=cat["empty_lists"][0])
    assert empty == {"members": [], "has_next_page": False, "next_cursor": "", "status": "success", "msg": ""}


@pytest.mark.gen_test(timeout=60)
async def test_community_members_match_its_member_count(http_client, base_url):
    world = get_world(7)
    small = min(world.communities, key=lambda c: c.member_count)
    first = await call(http_client, base_url, "community/members", community_id=small.id)
    assert len(first["members"]) == 20 and first["has_next_page"]
    members, _ = await every_page(http_client, base_url, "community/members", "members", community_id=small.id)
    assert len({m["id"] for m in members}) == small.member_count


@pytest.mark.gen_test(timeout=60)
async def test_check_follow_relationship_agrees_with_followings(http_client, base_url):
    cat = await catalog(http_client, base_url)
    name = cat["users"][0]["userName"]
    followings = (await call(http_client, base_url, "user/followings", userName=name))["followings"]
    followers = (await call(http_client, base_url, "user/followers", userName=name))["followers"]
    followed = followings[0]["userName"]
    body = await call(
        http_client, base_url, "user/check_follow_relationship", source_user_name=name, target_user_name=followed
    )
    assert body["status"] == "success" and body["data"]["following"] is True
    reverse = await call(
        http_client, base_url, "user/check_follow_relationship", source_user_name=followed, target_user_name=name
    )
    assert reverse["data"]["followed_by"] is True
    assert reverse["data"]["following"] == (followed in {f["userName"] for f in followers})
    world = get_world(7)
    u = world.user_by_handle(name)
    stranger = next(v for v in range(100, 3000) if v not in world.following(u) and u not in world.following(v))
    apart = await call(
        http_client,
        base_url,
        "user/check_follow_relationship",
        source_user_name=world.handle(stranger),
        target_user_name=name,
    )
    assert apart["data"] == {"following": False, "followed_by": False}
    missing = await call(http_client, base_url, "user/check_follow_relationship", expect=400, source_user_name=name)
    assert "target_user_name" in missing["msg"]


@pytest.mark.gen_test(timeout=60)
async def test_article_by_its_post(http_client, base_url):
    cat = await catalog(http_client, base_url)
    tid = cat["articles"][0]
    body = await call(http_client, base_url, "article", tweet_id=tid)
    post = (await call(http_client, base_url, "tweets", tweet_ids=tid))["tweets"][0]
    article = body["article"]
    assert body["status"] == "success" and article["author"]["id"] == post["author"]["id"]
    assert article["likeCount"] == post["likeCount"] and article["createdAt"] == post["createdAt"]
    assert article["title"] and len(article["contents"]) >= 3 and article["preview_text"]
    plain = cat["tweets"][0]  # a reply thread's root, not an article
    none = await call(http_client, base_url, "article", tweet_id=plain)
    assert none == {"article": None, "status": "error", "message": "article not found"}


@pytest.mark.gen_test(timeout=60)
async def test_time_filters_on_mentions_replies_and_quotes(http_client, base_url):
    cat = await catalog(http_client, base_url)
    big = cat["big_accounts"][0]
    # The example: sinceTime in 2100 answers no tweets and no next page.
    future = await call(http_client, base_url, "user/mentions", userName=big, sinceTime=4102444800)
    assert future["tweets"] == [] and future["has_next_page"] is False and future["next_cursor"] == ""
    t0, t1 = 1704067200, 1706745600  # January 2024
    window, _ = await every_page(
        http_client, base_url, "user/mentions", "tweets", userName=big, sinceTime=t0, untilTime=t1
    )
    assert window and all(t0 <= stamp(t) < t1 for t in window)
    everything, _ = await every_page(http_client, base_url, "user/mentions", "tweets", userName=big)
    assert [t["id"] for t in everything if t0 <= stamp(t) < t1] == [t["id"] for t in window]
    for path, key, tid in (
        ("tweet/replies", "replies", cat["tweets"][0]),
        ("tweet/quotes", "tweets", cat["quoted_tweets"][0]),
    ):
        whole, _ = await every_page(http_client, base_url, path, key, tweetId=tid)
        cut = stamp(whole[len(whole) // 2])
        newer, _ = await every_page(http_client, base_url, path, key, tweetId=tid, sinceTime=cut)
        older, _ = await every_page(http_client, base_url, path, key, tweetId=tid, untilTime=cut)
        assert newer and older and all(stamp(t) >= cut for t in newer) and all(stamp(t) < cut for t in older)
        assert [t["id"] for t in newer + older] == [t["id"] for t in whole], path
    quotes = await call(http_client, base_url, "tweet/quotes", tweetId=cat["quoted_tweets"][0], includeReplies="false")
    assert quotes["tweets"] and not any(t["isReply"] for t in quotes["tweets"])
    bad = await call(http_client, base_url, "user/mentions", expect=400, userName=big, sinceTime="yesterday")
    assert "sinceTime" in bad["msg"]
