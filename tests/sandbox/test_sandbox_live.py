"""The sandbox in motion (sandbox/live.py): posts appear as the clock moves, the same in every
process; polls that ask only for what is new (since_time, since_id) get only that."""

import asyncio
import calendar
import time
from urllib.parse import urlencode

import orjson
import pytest
from tornado.httpclient import AsyncHTTPClient

import sandbox

KEY = "sandbox-live-key"
AUTH = {"X-API-Key": KEY}
T0 = 1_795_000_000  # 2026-11-18: a fixed clock, so a test never straddles a second's edge


class Clock:
    def __init__(self, now: float = T0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def app(clock):
    return sandbox.make_app(KEY, clock=clock)


async def get(http_client, base_url, path, **params):
    response = await http_client.fetch(
        f"{base_url}/twitter/{path}?{urlencode(params)}", headers=AUTH, raise_error=False
    )
    assert response.code == 200, (path, params, response.body[:300])
    return orjson.loads(response.body)


async def catalog(http_client, base_url):
    return orjson.loads((await http_client.fetch(base_url + "/sandbox/catalog")).body)


def stamp(tweet) -> float:
    return calendar.timegm(time.strptime(tweet["createdAt"], "%a %b %d %H:%M:%S +0000 %Y"))


@pytest.mark.gen_test(timeout=60)
async def test_new_posts_appear_as_the_clock_moves(http_client, base_url, clock):
    cat = await catalog(http_client, base_url)
    before = await get(http_client, base_url, "tweet/advanced_search", query="lang:en", queryType="Latest")
    clock.now += 4
    after = await get(http_client, base_url, "tweet/advanced_search", query="lang:en", queryType="Latest")
    old_ids = [t["id"] for t in before["tweets"]]
    new = [t for t in after["tweets"] if t["id"] not in old_ids]
    # At least one English post a second, newest first, ids growing with time.
    assert len(new) >= 4 and after["tweets"][: len(new)] == new
    ids = [int(t["id"]) for t in after["tweets"]]
    assert ids == sorted(ids, reverse=True) and int(new[-1]["id"]) > int(old_ids[0])
    assert all(T0 < stamp(t) <= T0 + 4 for t in new) and all(t["lang"] == "en" for t in new)
    # A live user's latest tweets gain a post (each posts every 4 seconds), found by id too.
    user = cat["live_users"][0]
    first = await get(http_client, base_url, "user/last_tweets", userName=user)
    clock.now += 4
    second = await get(http_client, base_url, "user/last_tweets", userName=user)
    fresh = second["tweets"][0]
    assert fresh["id"] != first["tweets"][0]["id"] and fresh["author"]["userName"] == user
    assert second["tweets"][1:] == first["tweets"][:-1]
    found = await get(http_client, base_url, "tweets", tweet_ids=fresh["id"])
    assert found["tweets"][0]["id"] == fresh["id"] and found["tweets"][0]["text"] == fresh["text"]
    # Common words match live posts too: some search for a topic word gains a post within a minute.
    words = {w.strip(".,!?#").lower() for t in new for w in t["text"].split() if len(w) > 5 and "/" not in w}
    word = sorted(words)[0]
    hits = await get(http_client, base_url, "tweet/advanced_search", query=word)
    assert any(t["id"] in {n["id"] for n in new} for t in hits["tweets"]), word


@pytest.mark.gen_test(timeout=60)
async def test_a_poll_gets_only_what_is_new(http_client, base_url, clock):
    recent = await get(http_client, base_url, "tweet/advanced_search", query=f"lang:en since_time:{T0 - 5}")
    assert recent["tweets"] and all(stamp(t) >= T0 - 5 for t in recent["tweets"])
    newest = recent["tweets"][0]["id"]
    # Nothing new yet: an empty page that says so (a quiet rule's poll).
    quiet = await get(http_client, base_url, "tweet/advanced_search", query=f"lang:en since_id:{newest}")
    assert quiet == {"tweets": [], "status": "success", "message": "", "has_next_page": False, "next_cursor": ""}
    clock.now += 3
    fresh = await get(http_client, base_url, "tweet/advanced_search", query=f"lang:en since_id:{newest}")
    ids = [int(t["id"]) for t in fresh["tweets"]]
    assert ids and all(i > int(newest) for i in ids) and ids == sorted(ids, reverse=True)
    later = await get(http_client, base_url, "tweet/advanced_search", query=f"since_time:{T0 + 1} until_time:{T0 + 3}")
    assert later["tweets"] and all(T0 + 1 <= stamp(t) < T0 + 3 for t in later["tweets"])
    bad = await http_client.fetch(
        f"{base_url}/twitter/tweet/advanced_search?{urlencode({'query': 'since_id:12ab'})}",
        headers=AUTH,
        raise_error=False,
    )
    assert bad.code == 400 and b"bad id" in bad.body


@pytest.mark.gen_test(timeout=60)
async def test_paging_a_moving_list_never_repeats(http_client, base_url, clock):
    first = await get(http_client, base_url, "tweet/advanced_search", query="lang:en")
    clock.now += 5  # posts arrive between the pages
    second = await get(http_client, base_url, "tweet/advanced_search", query="lang:en", cursor=first["next_cursor"])
    ids = [t["id"] for t in first["tweets"] + second["tweets"]]
    assert len(ids) == len(set(ids)) == 40
    assert [int(i) for i in ids] == sorted((int(i) for i in ids), reverse=True)


@pytest.mark.gen_test(timeout=60)
async def test_a_post_is_found_by_id_only_once_made(http_client, base_url, clock):
    clock.now += 10
    made = await get(http_client, base_url, "tweet/advanced_search", query=f"since_time:{T0 + 9}")
    tid = made["tweets"][0]["id"]
    clock.now -= 10
    assert (await get(http_client, base_url, "tweets", tweet_ids=tid))["tweets"] == []
    clock.now += 10
    assert [t["id"] for t in (await get(http_client, base_url, "tweets", tweet_ids=tid))["tweets"]] == [tid]


@pytest.mark.gen_test(timeout=60)
async def test_every_process_sees_the_same_posts(io_loop):
    """Two sandboxes (as two gateway workers, or one restarted) agree at the real clock's second."""
    servers = [sandbox.start("127.0.0.1", 0, KEY) for _ in range(2)]
    client = AsyncHTTPClient()
    try:
        for _ in range(3):  # a pair of answers straddling a second's edge is retried
            now = int(time.time())
            query = {"query": f"lang:en since_time:{now - 30} until_time:{now}"}
            bodies = await asyncio.gather(
                *(
                    client.fetch(f"{s.url}/twitter/tweet/advanced_search?{urlencode(query)}", headers=AUTH)
                    for s in servers
                )
            )
            if int(time.time()) == now:
                break
        assert bodies[0].body == bodies[1].body and len(orjson.loads(bodies[0].body)["tweets"]) == 20
    finally:
        for server in servers:
            server.stop()


@pytest.mark.gen_test(timeout=20)
async def test_the_real_clock_moves_the_sandbox(http_client, base_url):
    """Without an injected clock: over two real seconds, search gains posts."""
    server = sandbox.start("127.0.0.1", 0, KEY)
    client = AsyncHTTPClient()
    try:
        url = f"{server.url}/twitter/tweet/advanced_search?{urlencode({'query': 'lang:en'})}"
        newest = orjson.loads((await client.fetch(url, headers=AUTH)).body)["tweets"][0]["id"]
        await asyncio.sleep(2.1)
        poll = f"{server.url}/twitter/tweet/advanced_search?{urlencode({'query': f'lang:en since_id:{newest}'})}"
        assert len(orjson.loads((await client.fetch(poll, headers=AUTH)).body)["tweets"]) >= 2
    finally:
        server.stop()


@pytest.mark.gen_test(timeout=60)
async def test_every_endpoint_taking_a_post_answers_for_a_live_post(http_client, base_url):
    """A live post's id (past the archive) is a post like any other: its thread, replies, quotes and
    reposters answer, rather than the thread failing with a 500 (found by the fuzzer)."""
    live = (await get(http_client, base_url, "tweet/advanced_search", query="lang:en", queryType="Latest"))["tweets"][0]
    thread = await get(http_client, base_url, "tweet/thread_context", tweetId=live["id"])
    assert [t["id"] for t in thread["replies"]] == [live["id"]]
    for path in ("tweet/replies", "tweet/quotes", "tweet/retweeters"):
        await get(http_client, base_url, path, tweetId=live["id"])
