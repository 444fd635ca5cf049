"""The SocialData kind (issue 48): its adapter (social/providers/socialdata.py) against the sandbox speaking
SocialData's dialect (sandbox/dialects/socialdata.py), compared with the sandbox speaking twitterapi's, for the
same world objects at the same (fixed) second; its documented example answers normalized; its errors mapped.
No gateway is served here: the adapter's request is sent to the socialdata sandbox as the router sends it, and
its answer read back as the router reads it."""

import re
import urllib.parse
from pathlib import Path

import orjson
import pytest

import sandbox
from sandbox.server import SandboxServer
from social.endpoints import BY_PATH
from social.providers import adapter
from social.providers.socialdata import ADAPTER, SERVED, UNFILLABLE

KEY = "providers-test-key"
NOW = 1_767_225_600  # 2026-01-01: a fixed second, so live posts (and moving lists) are the same on both sides
DATA = Path(__file__).parent / "data"
CREATED_AT = re.compile(r"^(Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} \d{2} \d{2}:\d{2}:\d{2} \+0000 \d{4}$")


@pytest.fixture
def app():
    return sandbox.make_app(KEY, clock=lambda: NOW)


@pytest.fixture
def socialdata(io_loop):
    server = SandboxServer(sandbox.make_app(KEY, clock=lambda: NOW, dialect="socialdata"), "127.0.0.1", 0)
    yield server.url + "/twitter"
    server.stop()


async def ours(http_client, base_url, path, params) -> tuple[int, dict]:
    """The twitterapi dialect's answer to our call (the canonical shape)."""
    query = urllib.parse.urlencode(params, safe=",")
    response = await http_client.fetch(
        f"{base_url}/twitter{path}?{query}", headers={"X-API-Key": KEY}, raise_error=False
    )
    return response.code, orjson.loads(response.body)


async def theirs(http_client, url, path, params) -> tuple[int, dict]:
    """The same call through the socialdata adapter and the socialdata dialect."""
    endpoint = BY_PATH[path]
    assert ADAPTER.serves(endpoint)
    their_path, their_query = ADAPTER.request(endpoint, urllib.parse.urlencode(params, safe=","))
    response = await http_client.fetch(
        f"{url}{their_path}" + (f"?{their_query}" if their_query else ""),
        headers={"Authorization": f"Bearer {KEY}"},
        raise_error=False,
    )
    status, body = ADAPTER.answer(endpoint, response.code, response.body)
    return status, orjson.loads(body)


def blank(value):
    """The twitterapi answer with the fields SocialData cannot fill set to null (in place, keeping key order)."""
    if isinstance(value, list):
        for item in value:
            blank(item)
    elif isinstance(value, dict):
        if value.get("type") == "tweet":
            for name in UNFILLABLE["tweet"] + (UNFILLABLE["reply"] if value["isReply"] else ()):
                value[name] = None
            for media in (value["entities"] or {}).get("media", ()):
                for name in UNFILLABLE["media"]:
                    media[name] = None
        elif value.get("type") == "user":
            for name in UNFILLABLE["user"]:
                value[name] = None
        for item in value.values():
            if isinstance(item, (dict, list)):
                blank(item)
    return value


def catalog_calls(cat) -> list[tuple[str, dict]]:
    """For every endpoint SocialData serves: calls about real world objects (and unknown ones)."""
    user, big = cat["users"][0], cat["users"][-1]
    live = cat["live_users"][0]
    quoted, reply = cat["quoted_tweets"][0], cat["deep_replies"][0]
    return [
        ("/tweet/advanced_search", {"query": "coffee"}),
        ("/tweet/advanced_search", {"query": "python OR rust", "queryType": "Top"}),
        ("/tweet/advanced_search", {"query": "lang:en"}),  # live posts of the hour before NOW
        ("/tweet/advanced_search", {"query": "zzqxv_nothing"}),  # an empty page
        ("/user/info", {"userName": user["userName"]}),
        ("/user/info", {"userName": big["userName"]}),
        ("/user/info", {"userName": "no_such_user_here"}),
        ("/tweets", {"tweet_ids": quoted}),
        ("/tweets", {"tweet_ids": reply}),
        ("/tweets", {"tweet_ids": cat["articles"][0]}),
        ("/tweets", {"tweet_ids": "1"}),  # unknown: left out
        ("/user/tweet_timeline", {"userId": user["id"]}),
        ("/user/tweet_timeline", {"userId": user["id"], "includeReplies": "true"}),
        ("/user/tweet_timeline", {"userId": "1"}),
        ("/user/last_tweets", {"userId": user["id"]}),
        ("/user/mentions", {"userName": live}),
        ("/user/mentions", {"userName": "no_such_user_here"}),
        ("/tweet/quotes", {"tweetId": quoted}),
        ("/tweet/quotes", {"tweetId": "1"}),
        ("/tweet/retweeters", {"tweetId": quoted}),
        ("/user/verifiedFollowers", {"user_id": big["id"]}),
        ("/list/tweets_timeline", {"listId": cat["lists"][0]}),
        ("/list/tweets_timeline", {"listId": cat["empty_lists"][0]}),
        ("/list/tweets_timeline", {"listId": "1"}),
        ("/list/members", {"list_id": cat["lists"][0]}),
        ("/list/members", {"list_id": "1"}),
        ("/community/tweets", {"community_id": cat["communities"][0]}),
        ("/community/members", {"community_id": cat["communities"][0]}),
        ("/community/members", {"community_id": "1"}),
    ]


async def get_catalog(http_client, base_url) -> dict:
    return orjson.loads((await http_client.fetch(base_url + "/sandbox/catalog")).body)


@pytest.mark.gen_test(timeout=60)
async def test_same_answers_as_twitterapi_field_by_field(http_client, base_url, socialdata):
    calls = catalog_calls(await get_catalog(http_client, base_url))
    assert {path for path, _ in calls} == set(SERVED)  # every endpoint SocialData serves is walked
    seen = b""
    for path, params in calls:
        status, expected = await ours(http_client, base_url, path, params)
        got_status, got = await theirs(http_client, socialdata, path, params)
        assert got_status == status, (path, params)
        # Bytes, not dicts: the same keys in the same order, the same values, nulls where SocialData has none.
        seen += (compared := orjson.dumps(blank(expected)))
        assert orjson.dumps(got) == compared, (path, params)
    # The walk met what the mapping has to get right: photos, quotes, replies, live posts, empty and unknown.
    for part in (b'"media":[{', b'"quoted_tweet":{', b'"isReply":true', b'"viewCount":null', b'"tweets":[],'):
        assert part in seen, part
    assert expected["status"] == "error" and expected["msg"] == "community not found"


@pytest.mark.gen_test(timeout=60)
async def test_walking_cursors_through_the_adapter_visits_the_same_items(http_client, base_url, socialdata):
    cat = await get_catalog(http_client, base_url)
    for path, params, key, most in (
        ("/tweet/advanced_search", {"query": "lang:en"}, "tweets", 4),
        ("/user/verifiedFollowers", {"user_id": cat["users"][-1]["id"]}, "followers", 3),
        ("/community/members", {"community_id": cat["communities"][0]}, "members", 3),
        ("/user/tweet_timeline", {"userId": cat["users"][0]["id"]}, "tweets", 50),
    ):
        walked = {}
        for side, call, base in (("ours", ours, base_url), ("theirs", theirs, socialdata)):
            ids, cursor = [], None
            for _ in range(most):
                status, page = await call(http_client, base, path, params | ({"cursor": cursor} if cursor else {}))
                assert status == 200 and page["status"] == "success"
                ids += [item["id"] for item in page[key]]
                if not page["has_next_page"]:
                    assert page["next_cursor"] == ""
                    break
                cursor = page["next_cursor"]
            walked[side] = ids
        assert walked["theirs"] == walked["ours"] and len(walked["ours"]) > 20, path


def example(name: str) -> dict:
    documented = orjson.loads((DATA / f"socialdata_{name}.json").read_bytes())
    assert documented["source"].startswith("https://")
    return documented["answer"]


def normalized(path: str, answer: dict) -> dict:
    status, body = ADAPTER.answer(BY_PATH[path], 200, orjson.dumps(answer))
    assert status == 200
    return orjson.loads(body)


def check_user(user: dict, documented: dict) -> None:
    assert user["type"] == "user" and user["id"] == documented["id_str"] and isinstance(user["id"], str)
    assert user["userName"] == documented["screen_name"] and user["name"] == documented["name"]
    assert user["url"] == f"https://x.com/{documented['screen_name']}"
    assert user["followers"] == documented["followers_count"] and user["following"] == documented["friends_count"]
    assert user["statusesCount"] == documented["statuses_count"]
    assert user["favouritesCount"] == documented["favourites_count"]
    assert user["profilePicture"] == documented["profile_image_url_https"]
    assert user["coverPicture"] == documented["profile_banner_url"]
    assert user["description"] == documented["description"] and user["canDm"] == documented["can_dm"]
    assert user["location"] == (documented["location"] or None)
    assert user["isBlueVerified"] == documented["verified"]
    assert CREATED_AT.match(user["createdAt"])
    assert all(user[name] is None for name in UNFILLABLE["user"])


def test_documented_user_profile_normalizes():
    documented = example("user")
    body = normalized("/user/info", documented)
    assert list(body) == ["status", "msg", "data"] and body["status"] == "success" and body["msg"] == ""
    check_user(body["data"], documented)
    assert body["data"]["createdAt"] == "Tue Jun 02 20:12:29 +0000 2009"
    assert body["data"]["location"] == "\U0001d54f\u00d0"


def test_documented_tweet_details_normalize():
    documented = example("tweet")
    body = normalized("/tweets", documented)
    assert list(body) == ["status", "message", "tweets"] and body["status"] == "success"
    (tweet,) = body["tweets"]
    assert tweet["type"] == "tweet" and tweet["id"] == "1729591119699124560"
    assert tweet["url"] == "https://x.com/elonmusk/status/1729591119699124560"
    assert tweet["text"] == "Cybertruck deliveries start on Thursday"
    assert tweet["source"] == "Twitter for iPhone"
    assert tweet["createdAt"] == "Tue Nov 28 20:00:31 +0000 2023"
    assert (tweet["likeCount"], tweet["retweetCount"], tweet["replyCount"], tweet["quoteCount"]) == (
        documented["favorite_count"],
        documented["retweet_count"],
        documented["reply_count"],
        documented["quote_count"],
    )
    assert (
        tweet["viewCount"] == str(documented["views_count"]) and tweet["bookmarkCount"] == documented["bookmark_count"]
    )
    assert tweet["isReply"] is False and tweet["inReplyToId"] is None and tweet["conversationId"] == tweet["id"]
    assert tweet["lang"] == "en" and tweet["quoted_tweet"] is None and tweet["retweeted_tweet"] is None
    assert tweet["entities"] == {"hashtags": [], "symbols": [], "urls": [], "user_mentions": [], "media": []}
    check_user(tweet["author"], documented["user"])


def test_documented_search_results_normalize():
    documented = example("search")
    body = normalized("/tweet/advanced_search", documented)
    assert list(body) == ["tweets", "status", "message", "has_next_page", "next_cursor"]
    assert body["has_next_page"] is True and body["next_cursor"] == documented["next_cursor"]
    (tweet,) = body["tweets"]
    source = documented["tweets"][0]
    assert tweet["id"] == "1734810168053956719" and tweet["createdAt"] == "Wed Dec 13 05:39:09 +0000 2023"
    assert tweet["isReply"] is True and tweet["inReplyToId"] == "1734777084268920960"
    assert tweet["inReplyToUserId"] == "1311506622821400581" and tweet["inReplyToUsername"] == "TeslaHype"
    assert tweet["conversationId"] is None  # a reply's root is not in the v1.1 object: null, not guessed
    assert tweet["entities"]["user_mentions"] == source["entities"]["user_mentions"]
    check_user(tweet["author"], source["user"])
    # The thread example's other date form reads the same way.
    thread = normalized("/tweets", source | {"tweet_created_at": "2022-07-19T06:35:54+00:00"})
    assert thread["tweets"][0]["createdAt"] == "Tue Jul 19 06:35:54 +0000 2022"


def test_documented_followers_normalize():
    documented = example("followers")
    body = normalized("/user/verifiedFollowers", documented)
    assert list(body) == ["followers", "status", "message", "has_next_page", "next_cursor"]
    assert body["next_cursor"] == "4611686018541662731|1741080922217775060" and body["has_next_page"] is True
    (user,) = body["followers"]
    check_user(user, documented["users"][0])
    assert user["id"] == "1547124452596523008"
    # The last page: no cursor (or one offered with no users) ends the list.
    for last in ({"next_cursor": None, "users": []}, {"next_cursor": "x|y", "users": []}):
        assert normalized("/list/members", last) == {
            "members": [],
            "has_next_page": False,
            "next_cursor": "",
            "status": "success",
            "msg": "",
        }


def test_error_statuses_map_to_ours():
    def answer(path, status, body=b'{"status":"error","message":"Something"}'):
        code, text = ADAPTER.answer(BY_PATH[path], status, body)
        return code, orjson.loads(text)

    # A 404 of the object looked up is our HTTP 200 "... not found", in the endpoint's envelope.
    assert answer("/user/info", 404) == (200, {"status": "error", "msg": "user not found", "data": None})
    assert answer("/tweet/quotes", 404) == (
        200,
        {"tweets": [], "status": "error", "message": "tweet not found", "has_next_page": False, "next_cursor": ""},
    )
    assert answer("/tweets", 404) == (200, {"status": "success", "message": "", "tweets": []})
    assert answer("/tweet/advanced_search", 404)[0] == 502  # nothing looked up: a wrong path or base URL
    # Validation: our 400 with SocialData's reason.
    assert answer("/tweet/advanced_search", 422) == (400, {"status": "error", "msg": "Something"})
    assert answer("/user/info", 400, b"not json")[0] == 400
    # The provider refusing our key (401, 402 out of credit, 403) and its rate limit stay what they are, so the
    # key pool rests that key; 5xx stay 5xx (the call failed over or answered 502, never charged).
    for status in (401, 402, 403, 429, 500, 503):
        code, body = answer("/user/info", status)
        assert code == status and body["status"] == "error"
    # A 2xx that is not the documented shape is a failure, not an empty success.
    for broken in (
        b"<html>",
        b"[]",
        b'{"tweets": 3}',
        b'{"users": [{"id_str": "1"}]}',
        b'{"tweets": [], "next_cursor": {}}',
    ):
        assert answer("/tweet/advanced_search", 200, broken)[0] == 502
    for broken in (b'{"status": "error", "message": "x"}', b'{"name": "no id"}'):
        assert answer("/user/info", 200, broken)[0] == 502


@pytest.mark.gen_test(timeout=30)
async def test_the_dialect_answers_socialdata_errors(http_client, socialdata):
    async def get(path, key=KEY):
        response = await http_client.fetch(
            socialdata + path, headers={"Authorization": f"Bearer {key}"}, raise_error=False
        )
        return response.code, orjson.loads(response.body)

    assert await get("/user/elonmusk", key="wrong") == (401, {"status": "error", "message": "Unauthorized"})
    assert await get("/user/no_such_user_here") == (404, {"status": "error", "message": "User not found"})
    assert await get("/tweets/1") == (404, {"status": "error", "message": "Tweet not found"})
    assert (await get("/statuses/show"))[0] == 422
    assert (await get("/search?type=Latest"))[0] == 422  # no query
    assert (await get("/no/such/path"))[0] == 404
    response = await http_client.fetch(
        socialdata + "/search?query=coffee",
        headers={"Authorization": f"Bearer {KEY}", "X-Sim-Fault": "error=402:1"},
        raise_error=False,
    )
    assert response.code == 402 and orjson.loads(response.body) == {
        "status": "error",
        "message": "simulated upstream error 402",
    }


def test_what_it_serves_and_how_it_asks():
    assert adapter("socialdata") is ADAPTER
    assert {e.path for e in BY_PATH.values() if ADAPTER.serves(e)} == set(SERVED)
    for unserved in ("/user/followers", "/tweet/thread_context", "/user/batch_info_by_ids", "/trends"):
        assert not ADAPTER.serves(BY_PATH[unserved])
    assert ADAPTER.headers("k") == b"Authorization: Bearer k\r\nAccept: application/json\r\n"
    request = ADAPTER.request
    assert request(BY_PATH["/tweet/advanced_search"], "query=from%3Aelonmusk+doge&queryType=Top&cursor=a+b") == (
        "/search",
        "query=from%3Aelonmusk%20doge&type=Top&cursor=a%20b",
    )
    # Whatever is sent stays one path segment: no slash, no `..`, no query smuggled in.
    assert request(BY_PATH["/user/info"], "userName=..%2F..%2Fuser%2Fx%3Fy%3D1") == (
        "/user/%2E%2E%2F%2E%2E%2Fuser%2Fx%3Fy%3D1",
        "",
    )
    assert request(BY_PATH["/user/info"], "userName=..")[0] == "/user/%2E%2E"
    assert request(BY_PATH["/user/tweet_timeline"], "userId=42&includeReplies=true&cursor=c") == (
        "/user/42/tweets-and-replies",
        "cursor=c",
    )
    # SocialData's cursors "may contain spaces and other special characters": ours may not (printable ASCII, no
    # space), so what they hold beyond that is escaped going out and comes back to SocialData exactly as it sent it.
    odd = "4611686018541662731|17410 80922%2F\u00e9"
    page = normalized("/list/members", {"next_cursor": odd, "users": example("followers")["users"]})
    assert re.fullmatch(r"[!-~]+", page["next_cursor"])
    their_path, their_query = request(
        BY_PATH["/list/members"], urllib.parse.urlencode({"list_id": 7, "cursor": page["next_cursor"]})
    )
    assert their_path == "/list/7/members" and urllib.parse.parse_qs(their_query) == {"cursor": [odd]}
    # A call with a parameter SocialData has no counterpart for is refused, as an endpoint it cannot serve.
    for path, query in (
        ("/tweets", "tweet_ids=1,2"),
        ("/user/last_tweets", "userName=someone"),
        ("/user/tweet_timeline", "userId=42&includeReplies=true&includeParentTweet=true"),
        ("/user/mentions", "userName=a&sinceTime=1700000000"),
        ("/tweet/quotes", "tweetId=1&includeReplies=false"),
        ("/user/followers", "userName=a"),
    ):
        with pytest.raises(LookupError):
            request(BY_PATH[path], query)
