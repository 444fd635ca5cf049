"""Several providers behind the one API (docs/providers.md): failover to the next provider on a 5xx, a time-out or a
refused connection, charged once and named in X-Provider; no failover on a 4xx or an empty page; cost routing;
cursors pinned to the provider that issued them; traffic back to the first provider once it answers again; the
default (PROVIDERS unset) as it was; `--workers 2`; and real-time rules through a failover.

Each provider is a sandbox (or the scripted search provider) of its own, started here, so one can fail or stop."""

import asyncio
import dataclasses
import time
import urllib.request

import orjson
import pytest
from support import FAST, UPSTREAM_KEY, Gateway, SearchProvider, account_with_keys, charged, make_settings, qs
from test_answer_cache import balance

import sandbox
from app.embedded import free_port
from config.settings import SettingsError, problems
from sandbox import faults as faultlib
from social.providers import router as routing
from social.providers.ledger import MemoryLedger

pytestmark = pytest.mark.gen_test(timeout=60)

QUICK = dict(plan_rules=FAST, upstream_timeout=2.0, breaker_reset_seconds=0.3)


def entry(name: str, url: str, kind: str = "twitterapi", **costs) -> dict:
    found = {"name": name, "kind": kind, "url": url, "keys": [UPSTREAM_KEY]}
    return {**found, "costs": costs} if costs else found


def use_providers(ctx, *entries: dict, routing_rule: str = "order") -> MemoryLedger:
    """Points the app under test (and its poller) at PROVIDERS = `entries`, built as app/context.py builds them."""
    settings = dataclasses.replace(ctx.settings, providers=tuple(entries), provider_routing=routing_rule)
    assert problems(settings) == []
    ledger = MemoryLedger()
    ctx.upstream.close()
    ctx.upstream = routing.build(settings, ledger)
    ctx.poller.upstream = ctx.upstream
    return ledger


def dead() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there: connection refused


async def search(api, key: str, query: str = "coffee", **extra):
    return await api.call("GET", f"/social/tweet/advanced_search?{qs({'query': query, **extra})}", key=key)


async def log_of(api, user) -> list[dict]:
    return (await api.call("GET", "/usage/log", token=user["token"]))[1]["records"]


@pytest.mark.parametrize(
    "providers,says",
    [
        ('[{"name": "a", "kind": "twitterapi", "url": "http://x", "keys": ["sekrit"]}] x', "cannot read"),
        ('[{"name": "a", "kind": "twitterapi", "url": "http://x"}]', "needs name, kind, url and keys"),
        ('[{"name": "A B", "kind": "twitterapi", "url": "http://x", "keys": ["sekrit"]}]', "unique names"),
        (
            '[{"name": "a", "kind": "twitterapi", "url": "http://x", "keys": ["sekrit"]},'
            ' {"name": "a", "kind": "socialdata", "url": "http://y", "keys": ["sekrit"]}]',
            "unique names",
        ),
        ('[{"name": "a", "kind": "twitterapi", "url": "ftp://x", "keys": ["sekrit"]}]', "url must start"),
        ('[{"name": "a", "kind": "twitterapi", "url": "http://x", "keys": ["sek\\u0007rit"]}]', "keys must be"),
        ('[{"name": "a", "kind": "twitterapi", "url": "http://x", "keys": ["sekrit"], "costs": {"item": -1}}]', "USD"),
        ('[{"name": "a", "kind": "x-api", "url": "http://x", "keys": ["sekrit"]}]', "kind must be one of"),
    ],
)
def test_providers_the_gateway_cannot_use_are_refused_at_start_without_their_keys(providers, says):
    with pytest.raises(SettingsError) as refused:
        routing.build(make_settings(providers=providers), MemoryLedger())
    assert says in str(refused.value) and "sekrit" not in str(refused.value)


@pytest.mark.settings(**QUICK)
@pytest.mark.parametrize("fault", ["error=503:1", "latency=3000", "refused"])
async def test_a_failing_provider_fails_over_to_the_next_charged_once(api, ctx, catalog, fault):
    a = None if fault == "refused" else sandbox.start("127.0.0.1", 0, UPSTREAM_KEY, faults=fault)
    b = sandbox.start("127.0.0.1", 0, UPSTREAM_KEY)
    ledger = use_providers(ctx, entry("a", a.url if a else dead()), entry("b", b.url))
    try:
        user, key = await api.funded_key(10_000)
        status, body, headers = await api.call(
            "GET", f"/social/user/info?userName={catalog['users'][0]['userName']}", key=key["key"]
        )
    finally:
        b.stop()
        if a:
            a.stop()
    assert status == 200 and body["data"]["userName"] == catalog["users"][0]["userName"]
    assert headers["X-Provider"] == "b"
    cost = int(headers["X-Credits-Charged"])
    assert cost > 0 and (await api.call("GET", "/account", token=user["token"]))[1]["credits"] == 10_000 - cost
    assert [(r["credits"], r["provider"]) for r in await log_of(api, user)] == [(cost, "b")]
    # The cost ledger has both attempts: A's failure, then B's answer (one request each, B's only once).
    assert [(t.provider, t.status == 200) for t in ledger.recent] == [("a", False), ("b", True)]
    assert b.stats["requests"] == 1


@pytest.mark.settings(**QUICK, cache_max_bytes=10_000_000, cache_hit_price=0.5)
async def test_a_kept_answer_names_the_provider_that_produced_it(api, ctx, catalog):
    b = sandbox.start("127.0.0.1", 0, UPSTREAM_KEY)
    use_providers(ctx, entry("a", dead()), entry("b", b.url))
    path = f"/social/user/info?userName={catalog['users'][1]['userName']}"
    try:
        user, key = await api.funded_key(10_000)
        answers = [await api.call("GET", path, key=key["key"]) for _ in range(2)]
    finally:
        b.stop()
    assert [(h["X-Cache"], h["X-Provider"]) for _, _, h in answers] == [("MISS", "b"), ("HIT", "b")]
    assert answers[0][1] == answers[1][1] and b.stats["requests"] == 1
    assert [r["provider"] for r in await log_of(api, user)] == ["b", "b"]


@pytest.mark.settings(**QUICK)
async def test_a_4xx_or_an_empty_page_is_an_answer_never_a_failover(api, ctx):
    a = sandbox.start("127.0.0.1", 0, UPSTREAM_KEY)
    b = sandbox.start("127.0.0.1", 0, UPSTREAM_KEY)
    use_providers(ctx, entry("a", a.url), entry("b", b.url))
    try:
        _, key = await api.funded_key(10_000)
        status, body, headers = await search(api, key["key"], "from:nobody_at_all_here")
        assert status == 200 and body["tweets"] == [] and headers["X-Provider"] == "a"
        a.app.settings["sandbox"].faults = faultlib.parse("error=400:1")  # A refuses the query from now on
        # A query no other test of the module asks: never a kept answer (the shared tier outlives a test).
        status, _, headers = await search(api, key["key"], "refused by the first provider")
        assert status == 400 and headers["X-Provider"] == "a" and headers["X-Credits-Charged"] == "0"
    finally:
        a.stop()
        b.stop()
    assert b.stats["requests"] == 0


@pytest.mark.settings(**QUICK)
async def test_cost_routing_sends_each_call_to_the_cheapest_provider(api, ctx, catalog):
    a = sandbox.start("127.0.0.1", 0, UPSTREAM_KEY)
    b = sandbox.start("127.0.0.1", 0, UPSTREAM_KEY)
    # B is cheaper per item, except for profiles, where its table says it costs more than A.
    ledger = use_providers(
        ctx,
        entry("a", a.url, item=0.001),
        entry("b", b.url, item=0.0002, by={"user/info": {"item": 0.01}}),
        routing_rule="cost",
    )
    try:
        _, key = await api.funded_key(100_000)
        tweets = [(await search(api, key["key"], f"coffee {i}"))[2]["X-Provider"] for i in range(3)]
        status, _, headers = await api.call(
            "GET", f"/social/user/info?userName={catalog['users'][0]['userName']}", key=key["key"]
        )
    finally:
        a.stop()
        b.stop()
    assert tweets == ["b", "b", "b"] and status == 200 and headers["X-Provider"] == "a"
    paid = {(t.provider, t.endpoint): t.cost_usd for t in ledger.recent}
    assert paid[("a", "/user/info")] == pytest.approx(0.001)  # one profile at A's item price
    assert all(t.cost_usd == pytest.approx(0.0002 * t.items) for t in ledger.recent if t.provider == "b")


@pytest.mark.settings(**QUICK)
async def test_a_cursor_stays_with_the_provider_that_issued_it(api, ctx):
    a = sandbox.start("127.0.0.1", 0, UPSTREAM_KEY)
    b = sandbox.start("127.0.0.1", 0, UPSTREAM_KEY)
    use_providers(ctx, entry("a", a.url), entry("b", b.url))
    try:
        _, key = await api.funded_key(100_000)
        status, first, headers = await search(api, key["key"], "the")
        assert status == 200 and headers["X-Provider"] == "a" and first["has_next_page"]
        cursor = first["next_cursor"]
        assert cursor.startswith("a~") and cursor.isprintable() and cursor.isascii()
        # The provider got its own cursor back: the second page follows the first.
        status, second, headers = await search(api, key["key"], "the", cursor=cursor)
        assert status == 200 and headers["X-Provider"] == "a" and second["tweets"] != first["tweets"]
        a.stop()
        status, _, headers = await search(api, key["key"], "the", cursor=second["next_cursor"])
        assert status in (502, 503, 504) and headers.get("X-Credits-Charged", "0") == "0"
        # A cursor naming no provider (handed out before B was listed) is the first provider's, A's.
        status, _, _ = await search(api, key["key"], "the", cursor="DAACCgACGdy")
        assert status in (502, 503, 504)
        assert b.stats["requests"] == 0  # the crawl never went on at B with A's cursor
        status, fresh, headers = await search(api, key["key"], "the")  # a new crawl goes to B
        assert status == 200 and headers["X-Provider"] == "b" and fresh["next_cursor"].startswith("b~")
    finally:
        a.stop()
        b.stop()


@pytest.mark.settings(**QUICK)
async def test_between_two_dialects_calls_fail_over_and_cost_route_in_one_shape(api, ctx, catalog):
    """A twitterapi provider that is down, then the dearer one, and a socialdata one: answers in our shape from
    either (tests/providers/ compares them field by field), a crawl's pages through the provider that started it,
    and an endpoint SocialData cannot serve always at the other."""
    port = free_port()
    b = sandbox.start("127.0.0.1", 0, UPSTREAM_KEY, dialect="socialdata")
    use_providers(ctx, entry("a", f"http://127.0.0.1:{port}"), entry("b", b.url, kind="socialdata"))
    a = None
    try:
        user, key = await api.funded_key(1_000_000)
        name = catalog["users"][0]["userName"]
        status, via_b, headers = await api.call("GET", f"/social/user/info?userName={name}", key=key["key"])
        assert status == 200 and headers["X-Provider"] == "b" and via_b["data"]["userName"] == name
        status, first, headers = await search(api, key["key"], "the")
        assert status == 200 and headers["X-Provider"] == "b" and first["next_cursor"].startswith("b~")
        a = sandbox.start("127.0.0.1", port, UPSTREAM_KEY)
        use_providers(
            ctx,
            entry("a", a.url, item=0.001),
            entry("b", b.url, kind="socialdata", item=0.0002),
            routing_rule="cost",
        )
        status, second, headers = await search(api, key["key"], "the", cursor=first["next_cursor"])
        assert status == 200 and headers["X-Provider"] == "b" and second["tweets"] != first["tweets"]
        status, _, headers = await api.call(
            "GET", f"/social/user/info?userName={name}", key=key["key"], headers={"Cache-Control": "no-cache"}
        )
        assert status == 200 and headers["X-Provider"] == "b"  # the cheaper one
        query = qs({"userName": catalog["big_accounts"][0]})
        status, _, headers = await api.call("GET", f"/social/user/followers?{query}", key=key["key"])
        assert status == 200 and headers["X-Provider"] == "a"  # SocialData cannot serve it: never routed there
        assert a.stats["requests"] == 1
    finally:
        b.stop()
        if a:
            a.stop()
    assert {r["provider"] for r in await log_of(api, user)} == {"a", "b"}


@pytest.mark.settings(**QUICK)
async def test_traffic_returns_to_the_first_provider_once_it_answers_again(api, ctx, catalog):
    port = free_port()
    b = sandbox.start("127.0.0.1", 0, UPSTREAM_KEY)
    use_providers(ctx, entry("a", f"http://127.0.0.1:{port}"), entry("b", b.url))
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    _, key = await api.funded_key(1_000_000)
    a = None
    try:
        for _ in range(4):  # A refuses connections: every call answered by B
            status, _, headers = await api.call("GET", path, key=key["key"])
            assert status == 200 and headers["X-Provider"] == "b"
        a = sandbox.start("127.0.0.1", port, UPSTREAM_KEY)
        back = None
        deadline = time.monotonic() + 30  # the bound; a live cooldown of 0.3 s takes far less
        while back is None and time.monotonic() < deadline:
            status, _, headers = await api.call("GET", path, key=key["key"])
            assert status == 200
            back = headers["X-Provider"] if headers["X-Provider"] == "a" else None
            await asyncio.sleep(0.1)
        assert back == "a"
        assert a.stats["requests"] >= 1
    finally:
        b.stop()
        if a:
            a.stop()


@pytest.mark.settings(plan_rules=FAST)
async def test_without_providers_the_one_provider_passes_answers_and_cursors_untouched(api, ctx, upstream_url, catalog):
    _, key = await api.funded_key(100_000)
    query = qs({"userName": catalog["big_accounts"][0]})
    status, body, headers = await api.call("GET", f"/social/user/followers?{query}", key=key["key"])
    assert status == 200 and headers["X-Provider"] == "twitterapi" and body["has_next_page"]
    direct = urllib.request.Request(
        f"{upstream_url}{ctx.settings.upstream_path_prefix}/user/followers?{query}", headers={"X-API-Key": UPSTREAM_KEY}
    )
    with urllib.request.urlopen(direct) as answer:
        assert body == orjson.loads(answer.read())  # the cursor as the provider wrote it


async def test_two_workers_fail_over_and_charge_each_call_once(mongo, catalog):
    b = sandbox.start("127.0.0.1", 0, UPSTREAM_KEY)
    providers = orjson.dumps([entry("a", dead()), entry("b", b.url)]).decode()
    gw = await Gateway(mongo.uri, b.url, f"t_providers_{time.time_ns()}", workers=2, PROVIDERS=providers).launch()
    try:
        _, (key,), auth = await account_with_keys(gw, 1_000_000, 1)
        names = [u["userName"] for u in catalog["users"][:12]]
        answers = await asyncio.gather(
            *[gw.call("GET", f"/social/user/info?userName={n}", **{"X-API-Key": key}) for n in names]
        )
        assert {(r.code, r.headers["X-Provider"]) for r in answers} == {(200, "b")}
        spent = await balance(gw, auth, 1_000_000 - charged(answers))  # both workers' spend, once flushed
    finally:
        gw.stop()
        b.stop()
    assert spent == 1_000_000 - charged(answers)
    assert b.stats["requests"] == len(names)


@pytest.mark.settings(plan_rules=FAST, stream_min_interval=0.3, stream_tick_seconds=0.05, breaker_reset_seconds=0.3)
async def test_a_rule_delivers_every_tweet_once_through_a_failover(api, ctx, base_url):
    a, b = SearchProvider(), SearchProvider()
    b.tweets = a.tweets  # one world, two providers
    use_providers(ctx, entry("a", a.url), entry("b", b.url))
    try:
        user, key = await api.funded_key(1_000_000)
        status, body, _ = await api.call(
            "POST",
            "/oapi/tweet_filter/add_rule",
            {"tag": "t", "value": "hello", "interval_seconds": 0.3},
            key=key["key"],
        )
        rule_id = body["rule_id"]
        update = {"rule_id": rule_id, "tag": "t", "value": "hello", "interval_seconds": 0.3, "is_effect": 1}
        assert (await api.call("POST", "/oapi/tweet_filter/update_rule", update, key=key["key"]))[0] == 200
        await asyncio.sleep(0.8)
        posted = [a.post() for _ in range(3)]
        await asyncio.sleep(0.8)
        a.fail = True  # A answers 500 from now on: the polls go on at B
        posted += [a.post() for _ in range(3)]
        await asyncio.sleep(1.2)
        assert b.queries, "no poll failed over to B"
        assert {"a", "b"} <= {r["provider"] for r in await log_of(api, user)}  # the polls' usage records
    finally:
        a.stop()
        b.stop()
    events = await ctx.stream_store.events.find({"rule_id": rule_id}).to_list(None)
    delivered = [t["id"] for e in events for t in e["tweets"]]
    assert sorted(delivered) == sorted(posted)
