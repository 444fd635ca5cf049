"""The shared answer cache (issue 36), against served gateways (one process and --workers 2) in front of a slow
provider stand-in that counts the calls it gets: hits, the request's Cache-Control, coalescing of identical
calls, stale answers while the provider fails, the crawl guard, the money (each account's balance drop is the
sum of its X-Credits-Charged, every call has its usage record) and what operators see."""

import asyncio
import re
import urllib.parse
import uuid
from collections import Counter

import orjson
import pytest
import tornado.httpserver
import tornado.testing
import tornado.web
from support import Gateway, account_with_keys
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.simple_httpclient import HTTPTimeoutError

CACHE_ON = {"CACHE_MAX_BYTES": str(8 * 1024 * 1024)}
DELAY = 0.3  # the provider's answer time: long enough for calls to meet in flight


class Provider:
    """A provider stand-in: answers each path after `delay`, counts its calls; `status` 503 makes it fail.
    A search or followers_ids page answers `cursors[asked cursor]` as its next cursor ("next" + a counter by
    default)."""

    def __init__(self, delay: float = DELAY):
        self.delay, self.status = delay, 200
        self.calls: Counter = Counter()
        self.cursors: dict[str, str] = {}
        provider = self

        class Handler(tornado.web.RequestHandler):
            async def get(self, path):
                provider.calls[path] += 1
                await asyncio.sleep(provider.delay)
                self.set_status(provider.status)
                self.finish(provider.body(path, self.request.query_arguments))

        sock, port = tornado.testing.bind_unused_port()
        self.server = tornado.httpserver.HTTPServer(tornado.web.Application([(r"/twitter/(.*)", Handler)]))
        self.server.add_sockets([sock])
        self.url = f"http://127.0.0.1:{port}"

    def body(self, path: str, args: dict) -> bytes:
        if self.status >= 500:
            return b'{"status":"error","msg":"down"}'
        asked = {k: v[-1].decode() for k, v in args.items()}
        if path in ("tweet/advanced_search", "user/followers_ids"):
            cursor = asked.get("cursor", "")
            following = self.cursors.get(cursor, f"next{sum(self.calls.values())}")
            if path == "user/followers_ids":  # its cursors are integers, its next cursor a string
                page = {"ids": list(range(500)), "has_next_page": True, "next_cursor": following}
            else:
                tweets = [{"id": str(i), "text": asked.get("query", "")} for i in range(20)]
                page = {"tweets": tweets, "has_next_page": True, "next_cursor": following}
            return orjson.dumps({**page, "status": "success", "msg": ""})
        return orjson.dumps({"status": "success", "msg": "", "data": {"id": "1", "asked": asked}})

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    def stop(self) -> None:
        self.server.stop()


@pytest.fixture
def provider(io_loop):
    started = Provider()  # listening on the test's loop
    yield started
    started.stop()


async def served(mongo, provider: Provider, workers: int = 1, **env) -> Gateway:
    return await Gateway(mongo.uri, provider.url, f"c_{uuid.uuid4().hex[:10]}", workers=workers, **env).launch()


async def balance(gw: Gateway, auth: dict, expected: int | None = None) -> int:
    """The account's balance; with `expected`, once it shows that (another worker's spend shows once its
    usage is flushed), or as it stands after a generous wait."""
    for _ in range(200):
        credits = orjson.loads((await gw.call("GET", "/account", **auth)).body)["credits"]
        if expected is None or credits == expected:
            break
        await asyncio.sleep(0.05)
    return credits


async def log_of(gw: Gateway, auth: dict, count: int) -> list[dict]:
    """The account's request log once it holds `count` records (buffered ones included)."""
    for _ in range(200):
        records = orjson.loads((await gw.call("GET", "/usage/log?limit=500", **auth)).body)["records"]
        if len(records) >= count:
            return records
        await asyncio.sleep(0.05)
    return records


def charged(response) -> int:
    return int(response.headers.get("X-Credits-Charged", "0"))  # an error answer: nothing charged


INFO = "/social/user/info?userName=aiko"


@pytest.mark.gen_test(timeout=120)
async def test_a_repeat_is_served_from_the_cache_free_and_recorded_as_a_hit(mongo, provider):
    gw = await served(mongo, provider, **CACHE_ON)
    _, (key,), auth = await account_with_keys(gw, 100_000, 1)
    before = await balance(gw, auth)
    first = await gw.call("GET", INFO, **{"X-API-Key": key})
    again = await gw.call("GET", INFO, **{"X-API-Key": key})
    assert (first.code, again.code) == (200, 200)
    assert first.headers["X-Cache"] == "MISS" and "Age" not in first.headers and charged(first) > 0
    assert again.headers["X-Cache"] == "HIT" and int(again.headers["Age"]) >= 0 and charged(again) == 0
    assert again.body == first.body
    assert provider.calls["user/info"] == 1
    assert before - await balance(gw, auth, before - charged(first)) == charged(first)
    records = await log_of(gw, auth, 2)
    assert sorted((r["cache"], r["credits"], r["credits_saved"]) for r in records) == [
        ("hit", 0, charged(first)),
        ("miss", charged(first), 0),
    ]


@pytest.mark.gen_test(timeout=120)
async def test_the_key_is_the_forwarded_query_whatever_its_order_encoding_or_caller(mongo, provider):
    """Parameter order and percent-encoding do not matter, nor the account or the API key; every forwarded
    parameter does."""
    gw = await served(mongo, provider, **CACHE_ON)
    _, (one,), _ = await account_with_keys(gw, 100_000, 1)
    _, (other,), _ = await account_with_keys(gw, 100_000, 1)
    path = "/social/tweet/advanced_search"
    first = await gw.call("GET", path + "?query=from%3Aaiko&queryType=Latest", **{"X-API-Key": one})
    same = await gw.call("GET", path + "?queryType=Latest&query=from:aiko", **{"X-API-Key": other})
    keyed = await gw.call(
        "GET", path + "?query=from%3Aaiko&queryType=Latest", **{"X-API-Key": one, "Idempotency-Key": "k-1"}
    )
    different = await gw.call("GET", path + "?query=from%3Aaiko&queryType=Top", **{"X-API-Key": one})
    paged = await gw.call("GET", path + "?query=from%3Aaiko&queryType=Latest&cursor=abc", **{"X-API-Key": one})
    assert [r.headers["X-Cache"] for r in (first, same, keyed, different, paged)] == [
        "MISS",
        "HIT",
        "HIT",
        "MISS",
        "MISS",
    ]
    assert provider.calls["tweet/advanced_search"] == 3


@pytest.mark.gen_test(timeout=120)
async def test_cache_control_no_cache_is_a_charged_live_read_and_max_age_bounds_the_age(mongo, provider):
    gw = await served(mongo, provider, **CACHE_ON)
    _, (key,), auth = await account_with_keys(gw, 100_000, 1)
    first = await gw.call("GET", INFO, **{"X-API-Key": key})
    live = await gw.call("GET", INFO, **{"X-API-Key": key, "Cache-Control": "no-cache"})
    assert live.headers["X-Cache"] == "MISS" and charged(live) == charged(first) > 0
    assert provider.calls["user/info"] == 2
    await asyncio.sleep(1.1)  # the cached answer is now at least a second old
    fresh_only = await gw.call("GET", INFO, **{"X-API-Key": key, "Cache-Control": "max-age=0"})
    assert fresh_only.headers["X-Cache"] == "MISS" and provider.calls["user/info"] == 3
    tolerant = await gw.call("GET", INFO, **{"X-API-Key": key, "Cache-Control": "max-age=600"})
    assert tolerant.headers["X-Cache"] == "HIT" and charged(tolerant) == 0
    assert provider.calls["user/info"] == 3


@pytest.mark.gen_test(timeout=120)
async def test_a_hit_is_charged_the_hit_price_and_every_balance_drop_is_its_charges(mongo, provider):
    """CACHE_HIT_PRICE 0.5: hits cost half; across two accounts each balance drops by exactly the sum of its
    answers' X-Credits-Charged, and each call has its usage record."""
    gw = await served(mongo, provider, CACHE_HIT_PRICE="0.5", **CACHE_ON)
    accounts = [await account_with_keys(gw, 100_000, 2) for _ in range(2)]
    before = [await balance(gw, auth) for _, _, auth in accounts]
    paths = [INFO, "/social/user/info?userName=ivan", "/social/tweet/advanced_search?query=x"]
    sums, full = [0, 0], {}
    for round_ in range(3):
        for i, (_, keys, _) in enumerate(accounts):
            answers = await asyncio.gather(*[gw.call("GET", p, **{"X-API-Key": keys[round_ % 2]}) for p in paths])
            sums[i] += sum(charged(a) for a in answers)
            if not (round_ or i):
                full = {p: charged(a) for p, a in zip(paths, answers, strict=True)}
                continue
            assert {a.headers["X-Cache"] for a in answers} == {"HIT"}
            assert [charged(a) for a in answers] == [round(full[p] * 0.5) for p in paths]
    assert provider.total == 3
    for (_, _, auth), was, spent in zip(accounts, before, sums, strict=True):
        assert was - await balance(gw, auth, was - spent) == spent
        records = await log_of(gw, auth, 9)
        assert len(records) == 9 and sum(r["credits"] for r in records) == spent


@pytest.mark.gen_test(timeout=120)
@pytest.mark.parametrize("workers", [1, 2])
async def test_identical_calls_at_once_make_one_provider_call(mongo, provider, workers):
    """100 identical calls at once (over as many connections, so both workers get some): one provider call,
    100 identical bodies, each charged a miss's price (the answer is fresh)."""
    gw = await served(mongo, provider, workers=workers, **CACHE_ON)
    _, keys, auth = await account_with_keys(gw, 1_000_000, 4)
    before = await balance(gw, auth)
    answers = await asyncio.gather(*[gw.call("GET", INFO, **{"X-API-Key": keys[i % 4]}) for i in range(100)])
    assert {a.code for a in answers} == {200}
    assert len({a.body for a in answers}) == 1
    assert provider.calls["user/info"] == 1
    kinds = Counter(a.headers["X-Cache"] for a in answers)
    assert kinds["MISS"] == 1 and kinds["MISS"] + kinds["COALESCED"] + kinds["HIT"] == 100, kinds
    price = charged(next(a for a in answers if a.headers["X-Cache"] == "MISS"))
    assert all(charged(a) == price for a in answers if a.headers["X-Cache"] == "COALESCED")
    spent = sum(charged(a) for a in answers)
    assert before - await balance(gw, auth, before - spent) == spent
    assert len(await log_of(gw, auth, 100)) == 100


@pytest.mark.gen_test(timeout=120)
@pytest.mark.parametrize("workers", [1, 2])
async def test_a_provider_failure_reaches_every_waiter_uncharged_and_is_never_served_again(mongo, provider, workers):
    provider.status = 503
    gw = await served(mongo, provider, workers=workers, **CACHE_ON)
    _, keys, auth = await account_with_keys(gw, 1_000_000, 4)
    before = await balance(gw, auth)
    # The failure is slow to come, so all 60 calls meet it in flight even on a busy machine (a failure is
    # remembered for a second only: a call arriving later is a new provider call, as it should be).
    provider.delay = 3.0
    answers = await asyncio.gather(*[gw.call("GET", INFO, **{"X-API-Key": keys[i % 4]}) for i in range(60)])
    assert {a.code for a in answers} == {502}
    assert {charged(a) for a in answers} == {0}
    assert provider.calls["user/info"] == 1
    provider.status, provider.delay = 200, DELAY
    await asyncio.sleep(1.1)  # a failed fill answers its other-process waiters for a second at most
    healthy = await gw.call("GET", INFO, **{"X-API-Key": keys[0]})
    assert healthy.code == 200 and healthy.headers["X-Cache"] == "MISS" and provider.calls["user/info"] == 2
    assert before - await balance(gw, auth, before - charged(healthy)) == charged(healthy)


@pytest.mark.gen_test(timeout=120)
async def test_while_the_provider_fails_a_recent_answer_is_served_stale_as_a_hit(mongo, provider):
    gw = await served(mongo, provider, CACHE_TTL='{"user/info": 1}', **CACHE_ON)
    _, (key,), auth = await account_with_keys(gw, 100_000, 1)
    first = await gw.call("GET", INFO, **{"X-API-Key": key})
    await asyncio.sleep(1.5)  # past its freshness (1 s), within CACHE_STALE_IF_ERROR
    provider.status = 503
    stale = await gw.call("GET", INFO, **{"X-API-Key": key})
    assert stale.code == 200 and stale.headers["X-Cache"] == "STALE" and int(stale.headers["Age"]) >= 1
    assert stale.body == first.body and charged(stale) == 0
    other = await gw.call("GET", "/social/user/info?userName=never-served", **{"X-API-Key": key})
    assert other.code == 502 and charged(other) == 0
    # A live read asked for the provider's answer: told there is none, not handed the kept one.
    live = await gw.call("GET", INFO, **{"X-API-Key": key, "Cache-Control": "no-cache"})
    assert live.code == 502 and charged(live) == 0 and live.headers.get("X-Cache") != "STALE"
    records = await log_of(gw, auth, 4)
    assert sorted(r["cache"] for r in records) == ["miss", "miss", "miss", "stale"]  # the live read: a failed miss


@pytest.mark.gen_test(timeout=120)
async def test_no_stale_answer_past_the_stale_window(mongo, provider):
    gw = await served(mongo, provider, CACHE_TTL='{"user/info": 1}', CACHE_STALE_IF_ERROR="1", **CACHE_ON)
    _, (key,), _ = await account_with_keys(gw, 100_000, 1)
    assert (await gw.call("GET", INFO, **{"X-API-Key": key})).code == 200
    await asyncio.sleep(2.2)
    provider.status = 503
    late = await gw.call("GET", INFO, **{"X-API-Key": key})
    assert late.code == 502 and charged(late) == 0


@pytest.mark.gen_test(timeout=120)
async def test_a_cursor_that_stops_advancing_ends_the_crawl_uncharged(mongo, provider):
    gw = await served(mongo, provider, **CACHE_ON)
    _, (key,), _ = await account_with_keys(gw, 100_000, 1)
    search = "/social/tweet/advanced_search?query=stuck"
    provider.cursors = {"": "c1", "c1": "c2", "c2": "c1", "c3": "c3"}

    async def page(cursor: str = ""):
        response = await gw.call("GET", search + (f"&cursor={cursor}" if cursor else ""), **{"X-API-Key": key})
        return response, orjson.loads(response.body)

    first, body = await page()
    assert body["next_cursor"] == "c1" and charged(first) > 0
    second, body = await page("c1")
    assert body["next_cursor"] == "c2" and "X-Crawl-Guard" not in second.headers
    looped, body = await page("c2")  # answers c1, which this crawl already followed to c2
    assert looped.headers["X-Crawl-Guard"] == "repeated-cursor" and charged(looped) == 0
    assert (body["has_next_page"], body["next_cursor"]) == (False, "") and len(body["tweets"]) == 20
    repeated, body = await page("c3")  # answers the very cursor it was asked for
    assert repeated.headers["X-Crawl-Guard"] == "repeated-cursor" and charged(repeated) == 0
    reread, body = await page("c1")  # a page already served: a hit, not a loop
    assert reread.headers["X-Cache"] == "HIT" and body["next_cursor"] == "c2"


@pytest.mark.gen_test(timeout=120)
async def test_pages_asked_out_of_order_are_each_charged_in_full(mongo, provider):
    """With cursors known in advance (replayed from an earlier crawl), asking a later page first never makes an
    earlier one free: backward (3, 2, 1) or the odd pages first (3, 1, then 2). Only a cycle of the provider's
    own cursors ends a crawl."""
    gw = await served(mongo, provider, **CACHE_ON)
    _, (key,), _ = await account_with_keys(gw, 100_000, 1)
    provider.cursors = {"": "p1", "p1": "p2", "p2": "p3", "p3": "p4"}
    full = charged(await gw.call("GET", "/social/tweet/advanced_search?query=first", **{"X-API-Key": key}))
    assert full > 0
    for query, order in (("backward", ["p3", "p2", "p1"]), ("odd-first", ["p3", "p1", "p2"])):
        for cursor in order:
            url = f"/social/tweet/advanced_search?query={query}&cursor={cursor}"
            answer = await gw.call("GET", url, **{"X-API-Key": key})
            body = orjson.loads(answer.body)
            assert "X-Crawl-Guard" not in answer.headers, (query, cursor)
            assert charged(answer) == full and answer.headers["X-Cache"] == "MISS", (query, cursor)
            assert (body["has_next_page"], body["next_cursor"]) == (True, provider.cursors[cursor])


@pytest.mark.gen_test(timeout=120)
async def test_a_page_that_ended_its_crawl_is_read_again_as_a_hit_at_the_hit_price(mongo, provider):
    """A guarded page is kept as served: reading it again is a cache hit charged CACHE_HIT_PRICE x its price,
    never a free provider call."""
    gw = await served(mongo, provider, CACHE_HIT_PRICE="0.5", **CACHE_ON)
    _, (key,), _ = await account_with_keys(gw, 100_000, 1)
    search = "/social/tweet/advanced_search?query=stuck"
    provider.cursors = {"": "c1", "c1": "c2", "c2": "c1", "c3": "c3"}

    async def page(cursor: str = ""):
        response = await gw.call("GET", search + (f"&cursor={cursor}" if cursor else ""), **{"X-API-Key": key})
        return response, orjson.loads(response.body)

    full = charged((await page())[0])
    assert charged((await page("c1"))[0]) == full
    for cursor in ("c2", "c3"):  # a cycle followed forward, and the very cursor back
        ended, _ = await page(cursor)
        assert ended.headers["X-Crawl-Guard"] == "repeated-cursor" and charged(ended) == 0
        asked = provider.total
        for _ in range(4):
            again, body = await page(cursor)
            assert again.headers["X-Cache"] == "HIT" and again.headers["X-Crawl-Guard"] == "repeated-cursor"
            assert charged(again) == round(full * 0.5) and again.body == ended.body
            assert (body["has_next_page"], body["next_cursor"]) == (False, "") and len(body["tweets"]) == 20
        assert provider.total == asked


@pytest.mark.gen_test(timeout=120)
async def test_followers_ids_is_guarded_and_a_guarded_page_read_again_is_charged(mongo, provider):
    """followers_ids' integer cursor (0 and -1 included) is compared with the provider's string next cursor; with
    the cache off, reading a guarded page again asks the provider and is charged in full (the crawl still ends)."""
    gw = await served(mongo, provider)  # the harness's default: CACHE_MAX_BYTES=0
    _, (key,), _ = await account_with_keys(gw, 1_000_000, 1)
    ids = "/social/user/followers_ids?userName=aiko&count=5000"
    provider.cursors = {"5000": "5000", "0": "0", "-1": "-1"}
    answers = []
    for cursor in ("5000", "0", "-1", "5000"):
        answer = await gw.call("GET", f"{ids}&cursor={cursor}", **{"X-API-Key": key})
        body = orjson.loads(answer.body)
        assert answer.headers.get("X-Crawl-Guard") == "repeated-cursor", cursor
        assert (body["has_next_page"], body["next_cursor"]) == (False, "") and len(body["ids"]) == 500
        answers.append(charged(answer))
    assert answers[:3] == [0, 0, 0] and answers[3] > 0
    assert provider.calls["user/followers_ids"] == 4


@pytest.mark.gen_test(timeout=120)
async def test_the_crawl_guards_memory_stays_within_its_bound(mongo, provider):
    """CRAWL_GUARD_MAX_BYTES bounds what the guard remembers, long queries and cursors counted; the least recently
    paged crawls are forgotten, the current one still guarded."""
    provider.delay = 0
    gw = await served(mongo, provider, CRAWL_GUARD_MAX_BYTES="65536", CACHE_SHARED="false", **CACHE_ON)
    _, (key,), _ = await account_with_keys(gw, 1_000_000, 1)
    long_cursor = "k" * 1000
    for i in range(40):  # about 3.5 KB each with its 900-character query: twice what the bound holds
        url = f"/social/tweet/advanced_search?query={i}-{'x' * 900}&cursor={long_cursor}"
        assert (await gw.call("GET", url, **{"X-API-Key": key})).code == 200
    provider.cursors = {"s1": "s2", "s2": "s1"}
    for cursor, guarded in (("s1", False), ("s2", True)):
        url = f"/social/tweet/advanced_search?query=last&cursor={cursor}"
        answer = await gw.call("GET", url, **{"X-API-Key": key})
        assert ("X-Crawl-Guard" in answer.headers) == guarded
    metrics = (await gw.call("GET", "/metrics")).body.decode()
    held = float(re.search(r"^gateway_crawl_guard_bytes\{[^}]*\} (\S+)$", metrics, re.M).group(1))
    assert 40_000 < held <= 65536


@pytest.mark.gen_test(timeout=120)
async def test_with_the_cache_off_identical_calls_still_make_one_provider_call(mongo, provider):
    gw = await served(mongo, provider)  # the harness's default: CACHE_MAX_BYTES=0
    _, (key,), _ = await account_with_keys(gw, 1_000_000, 1)
    answers = await asyncio.gather(*[gw.call("GET", INFO, **{"X-API-Key": key}) for _ in range(20)])
    assert provider.calls["user/info"] == 1 and {a.code for a in answers} == {200}
    again = await gw.call("GET", INFO, **{"X-API-Key": key})
    assert again.headers["X-Cache"] == "MISS" and provider.calls["user/info"] == 2


@pytest.mark.gen_test(timeout=120)
async def test_memory_stays_within_cache_max_bytes_and_operators_see_the_cache(mongo, provider):
    provider.delay = 0
    gw = await served(mongo, provider, CACHE_MAX_BYTES="4000", CACHE_SHARED="false")
    _, (key,), _ = await account_with_keys(gw, 1_000_000, 1)
    for i in range(150):  # about 300 bytes each with the key and the entry: eleven times what the bound holds
        assert (await gw.call("GET", f"/social/user/info?userName=u{i}", **{"X-API-Key": key})).code == 200
    assert (await gw.call("GET", "/social/user/info?userName=u149", **{"X-API-Key": key})).headers["X-Cache"] == "HIT"
    assert (await gw.call("GET", "/social/user/info?userName=u0", **{"X-API-Key": key})).headers["X-Cache"] == "MISS"
    metrics = (await gw.call("GET", "/metrics")).body.decode()
    held = float(re.search(r"^gateway_cache_bytes\{[^}]*\} (\S+)$", metrics, re.M).group(1))
    assert 0 < held <= 4000
    assert re.search(r'^gateway_cache_requests_total\{[^}]*result="hit"[^}]*\} 1\.0$', metrics, re.M)
    assert re.search(r'^gateway_cache_requests_total\{[^}]*result="miss"[^}]*\} 151\.0$', metrics, re.M)
    assert re.search(r"^gateway_cache_provider_calls_saved_total\{[^}]*\} 1\.0$", metrics, re.M)


@pytest.mark.gen_test(timeout=120)
async def test_two_workers_share_their_answers(mongo, provider):
    """--workers 2: what one worker fetched, the other serves (from the key's owner worker); never a second provider
    call."""
    gw = await served(mongo, provider, workers=2, **CACHE_ON)
    _, keys, _ = await account_with_keys(gw, 1_000_000, 1)
    paths = [f"/social/user/info?userName={urllib.parse.quote(f'p{i}')}" for i in range(10)]
    for path in paths:
        assert (await gw.call("GET", path, **{"X-API-Key": keys[0]})).headers["X-Cache"] == "MISS"
    # Many connections at once: the kernel spreads them over both workers.
    again = await asyncio.gather(*[gw.call("GET", p, **{"X-API-Key": keys[0]}) for p in paths for _ in range(6)])
    assert {a.headers["X-Cache"] for a in again} == {"HIT"}
    assert provider.total == 10


@pytest.mark.gen_test(timeout=120)
async def test_a_caller_that_leaves_does_not_cancel_the_call_it_shares(mongo, provider):
    """The first caller gives up (its client times out and closes the connection) while another caller waits for
    the same call: that call goes on, once, and the one who stayed gets its answer."""
    provider.delay = 1.5
    gw = await served(mongo, provider, **CACHE_ON)
    _, (key,), _ = await account_with_keys(gw, 100_000, 1)
    leaving = asyncio.ensure_future(
        AsyncHTTPClient(force_instance=True).fetch(
            HTTPRequest(gw.url + INFO, headers={"X-API-Key": key}, request_timeout=0.5)
        )
    )
    for _ in range(200):  # the first call reached the provider
        if provider.calls["user/info"]:
            break
        await asyncio.sleep(0.02)
    staying = await gw.call("GET", INFO, **{"X-API-Key": key})
    with pytest.raises(HTTPTimeoutError):  # the client gave up, and closed its connection
        await leaving
    assert staying.code == 200 and staying.headers["X-Cache"] == "COALESCED" and charged(staying) > 0
    assert provider.calls["user/info"] == 1


@pytest.mark.gen_test(timeout=120)
async def test_an_answer_fetched_again_once_stale_is_kept_in_its_place(mongo, provider):
    gw = await served(mongo, provider, CACHE_TTL='{"user/info": 1}', **CACHE_ON)
    _, (key,), _ = await account_with_keys(gw, 100_000, 1)
    assert (await gw.call("GET", INFO, **{"X-API-Key": key})).headers["X-Cache"] == "MISS"
    await asyncio.sleep(1.5)  # past its freshness
    assert (await gw.call("GET", INFO, **{"X-API-Key": key})).headers["X-Cache"] == "MISS"
    again = await gw.call("GET", INFO, **{"X-API-Key": key})
    assert again.headers["X-Cache"] == "HIT" and int(again.headers["Age"]) < 1
    assert provider.calls["user/info"] == 2
