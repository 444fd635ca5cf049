"""The real job (README, Limits against abuse): a provider that answers in about 0.7 s, customers who keep
hundreds of calls in flight at their plan's rate, and a pool of provider keys with rates of their own.

Invariants written in the tests: a customer within its plan is never refused for calls in flight or for
connections; a provider refusal of one of our keys never reaches a customer and is never charged; when
demand exceeds the keys' rate, the account over its fair share gets the gateway's own 429 first and an
account within its share is served; credits charged = the sum of X-Credits-Charged of 200 answers."""

import asyncio
import time

import orjson
import pytest
import tornado.httpserver
import tornado.web
from support import Gateway, account_with_keys, ledger_of, use_upstream
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.testing import bind_unused_port

from social.pool import FairSlots, InFlight
from social.provider_keys import ProviderKeys, Saturated

pytestmark = pytest.mark.gen_test(timeout=180)
PROFILE = b'{"status":"success","msg":"","data":{"id":"1","userName":"someone"}}'
PLAN_1000 = '[{"name": "big", "min_paid_usd": 0, "qps": 1000, "account_qps": 10000}]'


class SlowProvider(tornado.web.RequestHandler):
    """Answers a profile after `delay` seconds, like the real provider's 0.7 s."""

    def initialize(self, delay: float, seen: dict) -> None:
        self.delay, self.seen = delay, seen

    async def get(self, path):
        self.seen["now"] += 1
        self.seen["most"] = max(self.seen["most"], self.seen["now"])
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.seen["now"] -= 1
        self.finish(PROFILE)


class RatedProvider(tornado.web.RequestHandler):
    """Enforces its own rules per provider key: `rules[key]` is 429, 402, or a rate (calls/s, burst = rate)."""

    def initialize(self, rules: dict, buckets: dict, refused: list) -> None:
        self.rules, self.buckets, self.refused = rules, buckets, refused

    def get(self, path):
        key = self.request.headers.get("X-API-Key", "")
        rule = self.rules.get(key, 401)
        if isinstance(rule, float):
            tokens, stamp = self.buckets.get(key, (rule, time.monotonic()))
            now = time.monotonic()
            tokens = min(rule, tokens + (now - stamp) * rule)
            if tokens >= 1:
                self.buckets[key] = (tokens - 1, now)
                return self.finish(PROFILE)
            self.buckets[key] = (tokens, now)
            rule = 429
        self.refused.append((key, rule))
        self.set_status(rule)
        if rule == 429:
            self.set_header("Retry-After", "1")
        self.finish(b'{"provider":"refused"}')


def provider(handler, **kw) -> tuple[tornado.httpserver.HTTPServer, str]:
    sock, port = bind_unused_port()
    server = tornado.httpserver.HTTPServer(tornado.web.Application([(r"(.*)", handler, kw)]))
    server.add_sockets([sock])
    return server, f"http://127.0.0.1:{port}"


LIVE = {"Cache-Control": "no-cache"}  # each call reaches the provider: identical calls in flight are not joined


async def many_calls(base: str, keys: list[str], count: int) -> list:
    """`count` calls at once, each on its own connection, from one client address."""
    client = AsyncHTTPClient(force_instance=True, max_clients=count)
    calls = [
        client.fetch(
            HTTPRequest(
                f"{base}/social/user/info?userName=someone",
                headers={"X-API-Key": keys[i % len(keys)], "Cache-Control": "no-cache"},  # live: never joined
                request_timeout=90,
            ),
            raise_error=False,
        )
        for i in range(count)
    ]
    try:
        return await asyncio.gather(*calls)
    finally:
        client.close()


# --- a customer at its plan's rate against a 0.7 s provider, on a served gateway ----------------------------------
async def test_a_customer_keeps_hundreds_of_calls_in_flight_at_its_plans_rate(mongo, tmp_path):
    """Before: 32 calls in flight per account (ACCOUNT_MAX_IN_FLIGHT), 256 connections per address and a pool
    of 64 connections served ~35 calls/s of one account from a 0.7 s provider. Defaults now carry 400."""
    seen = {"now": 0, "most": 0}
    # Slower than the real 0.7 s, so that a loaded test machine gets all 400 calls out while the first wait.
    server, url = provider(SlowProvider, delay=2.0, seen=seen)
    # The default limits; provider deadlines a loaded machine (the suite's other files beside this test's own 400
    # clients and provider in one process: 400 connections to open at once) cannot miss: the invariant is that no
    # call is refused, not its pace.
    gw = await Gateway(
        mongo.uri, url, "t_real_load", PLAN_RULES=PLAN_1000, UPSTREAM_TIMEOUT="60", UPSTREAM_CONNECT_TIMEOUT="30"
    ).launch()
    try:
        user, keys, auth = await account_with_keys(gw, 10**8, 10)
        await many_calls(gw.url, keys, 10)  # the account's plan and lease are loaded
        answers = await many_calls(gw.url, keys, 400)
        statuses = [a.code for a in answers]
        assert statuses.count(200) == 400, {s: statuses.count(s) for s in set(statuses)}
        assert seen["most"] >= 350  # at the provider at once, not queued behind a small pool
        await asyncio.sleep(1.0)  # a usage flush
        account, records = await ledger_of(mongo.uri, "t_real_load", user["account_id"])
        charged = sum(int(a.headers["X-Credits-Charged"]) for a in answers)
        assert charged == 400 * 18
        assert sum(r["credits"] for r in records) == charged + 10 * 18
    finally:
        await asyncio.to_thread(gw.stop)
        server.stop()


# --- in-flight limits follow the plan and the provider ------------------------------------------------------------
def test_an_accounts_in_flight_limit_is_its_rate_times_the_providers_latency():
    in_flight = InFlight(fixed=0, ceiling=2048)
    assert in_flight.limit(rate=1000, horizon=1.5) == 1500  # 1,000 calls/s x 1.5 s (twice a 0.75 s p99)
    assert in_flight.limit(rate=1, horizon=1.0) == 4  # the smallest plan still has a few
    assert in_flight.limit(rate=10_000, horizon=15) == 2048  # never more than half the pool
    assert InFlight(fixed=32, ceiling=2048).limit(rate=10_000, horizon=15) == 32  # ACCOUNT_MAX_IN_FLIGHT fixes it


def test_the_horizon_follows_the_providers_p99_within_one_second_and_the_timeout():
    from social.pool import Latency

    latency = Latency(timeout=15.0)
    assert latency.horizon == 15.0  # nothing seen yet: the longest a call may take
    for i in range(512):
        latency.observe(0.5 + (i % 100) / 100)  # 0.5 .. 1.49 s
    assert 2.9 <= latency.horizon <= 3.0  # twice the p99
    for _ in range(2048):
        latency.observe(0.01)
    assert latency.horizon == 1.0  # a fast provider: still a second's worth of calls
    for _ in range(2048):
        latency.observe(20.0)
    assert latency.horizon == 15.0


async def test_a_full_pool_gives_each_freed_connection_to_the_lightest_waiting_account():
    slots = FairSlots(2)
    await slots.acquire("heavy", 1.0, 1.0)
    await slots.acquire("heavy", 1.0, 1.0)
    heavy = asyncio.ensure_future(slots.acquire("heavy", 1.0, 5.0))  # waiting first
    light = asyncio.ensure_future(slots.acquire("light", 1.0, 5.0))
    await asyncio.sleep(0.01)
    slots.release("heavy")
    await asyncio.sleep(0.01)
    assert light.done() and not heavy.done()  # the light account holds none: it goes first
    slots.release("heavy")
    await asyncio.sleep(0.01)
    assert heavy.done()
    assert slots.busy == 2 and slots.held == {"heavy": 1, "light": 1}
    late = asyncio.ensure_future(slots.acquire("late", 1.0, 0.05))
    with pytest.raises(Exception) as refused:
        await late
    assert type(refused.value).__name__ == "PoolFull" and slots.waiting == {}


# --- a pool of provider keys --------------------------------------------------------------------------------------
@pytest.mark.settings(plan_rules=({"name": "fast", "min_paid_usd": 0, "qps": 100000},))
async def test_a_refused_provider_key_is_rested_and_the_call_served_with_another_never_charged_twice(api, ctx):
    refused = []
    rules = {"pk-limited": 429, "pk-broke": 402, "pk-good": 1000.0}
    server, url = provider(RatedProvider, rules=rules, buckets={}, refused=refused)
    use_upstream(ctx, url, keys=[("pk-limited", 0.0), ("pk-broke", 0.0), ("pk-good", 0.0)])
    try:
        user, key = await api.funded_key(10_000)
        answers = [await api.call("GET", "/social/user/info?userName=someone", key=key["key"]) for _ in range(5)]
        assert [status for status, _, _ in answers] == [200] * 5
        assert all(b"provider" not in orjson.dumps(body) for _, body, _ in answers)
        assert sorted(refused) == [("pk-broke", 402), ("pk-limited", 429)]  # each once, then rested
        assert (await api.call("GET", "/account", token=user["token"]))[1]["credits"] == 10_000 - 5 * 18
        usage = (await api.call("GET", "/usage", token=user["token"]))[1]
        assert [u["credits"] for u in usage] == [18] * 5  # one record per call: the refusals cost nothing
        metrics = (await api.http.fetch(api.base + "/metrics")).body.decode()
        assert 'gateway_provider_key_refusals_total{key="key1",status="429",worker="0"} 1.0' in metrics
        assert 'gateway_provider_key_refusals_total{key="key2",status="402",worker="0"} 1.0' in metrics
        assert 'gateway_provider_key_calls_total{key="key3",worker="0"} 5.0' in metrics
        assert "pk-" not in metrics  # labels, never the keys
    finally:
        server.stop()


@pytest.mark.settings(plan_rules=({"name": "fast", "min_paid_usd": 0, "qps": 100000},))
async def test_past_the_keys_rate_the_heaviest_account_gets_429_first_and_a_light_one_is_served(api, ctx):
    """3 provider keys of 5 calls/s (15/s in all; the provider itself refuses past 5/s per key). A heavy
    account asks for far more for 3 s; a light one asks 2 calls/s meanwhile, within its fair share."""
    refused = []
    rules = {"pk-a": 5.0, "pk-b": 5.0, "pk-c": 5.0}
    server, url = provider(RatedProvider, rules=rules, buckets={}, refused=refused)
    use_upstream(ctx, url, keys=[("pk-a", 5.0), ("pk-b", 5.0), ("pk-c", 5.0)])
    try:
        heavy_user, heavy = await api.funded_key(10**6)
        light_user, light = await api.funded_key(10**6)
        many = type(api)(AsyncHTTPClient(force_instance=True, max_clients=100), api.base)
        heavy_answers, light_answers = [], []
        deadline = time.monotonic() + 3.0

        async def hammer():
            while time.monotonic() < deadline:
                heavy_answers.append(
                    await many.call("GET", "/social/user/info?userName=x", key=heavy["key"], headers=LIVE)
                )

        async def politely():
            while time.monotonic() < deadline:
                light_answers.append(
                    await many.call("GET", "/social/user/info?userName=y", key=light["key"], headers=LIVE)
                )
                await asyncio.sleep(0.5)

        started = time.monotonic()
        await asyncio.gather(*[hammer() for _ in range(20)], politely())
        took = time.monotonic() - started
        many.http.close()
        assert {status for status, _, _ in light_answers} == {200}, (light_answers, refused)
        served = [a for a in heavy_answers + light_answers if a[0] == 200]
        assert len(served) <= 15 * (took + 1) + 1  # within the keys' rates (+ one second of burst)
        too_many = [a for a in heavy_answers if a[0] == 429]
        assert too_many and {a[0] for a in heavy_answers} == {200, 429}
        for _, body, headers in too_many:
            assert int(headers["Retry-After"]) >= 1 and "provider's rate" in body["msg"]  # ours, not theirs
        for user, answers in ((heavy_user, heavy_answers), (light_user, light_answers)):
            paid = sum(int(h["X-Credits-Charged"]) for s, _, h in answers if s == 200)
            assert paid == 18 * sum(1 for s, _, _ in answers if s == 200)
            assert (await api.call("GET", "/account", token=user["token"]))[1]["credits"] == 10**6 - paid
    finally:
        server.stop()


async def test_a_saturated_pool_refuses_at_once_over_the_share_and_queues_within_it():
    now = [100.0]
    keys = ProviderKeys([("a", 2.0), ("b", 2.0)], max_wait=1.0, clock=lambda: now[0])
    taken = [await keys.acquire("heavy") for _ in range(4)]  # the two keys' burst
    assert sorted(k.label for k in taken) == ["key1", "key1", "key2", "key2"]  # worn evenly
    for _ in range(10):
        with pytest.raises(Saturated) as refused:
            await keys.acquire("heavy")  # 14 calls in 2 s: 7/s over a share of 4/s
    assert refused.value.retry_after == 1 and keys.saturated == 10
    keys.rest(keys.keys[0], 429, "30")
    assert keys.keys[0].rested_until == 0.0 and keys.keys[0].tokens == 0.0  # paced again, not rested
    keys.rest(keys.keys[0], 401, None)
    assert keys.keys[0].rested_until == 160.0  # credentials: a minute
    keys.rest(keys.keys[1], 402, None)
    with pytest.raises(Saturated):
        await keys.acquire("light")  # every key rested: nobody can be served


def test_provider_keys_are_read_from_upstream_api_keys_and_never_echoed():
    from support import make_settings

    from config.settings import SettingsError

    assert make_settings(upstream_api_keys="k1:100, k2:50.5,k3").upstream_api_keys == (
        ("k1", 100.0),
        ("k2", 50.5),
        ("k3", 0.0),
    )
    for bad in ("secret-one:fast", "secret-one:-1", "secret-one:5,secret-one:6", ":5"):
        with pytest.raises(SettingsError) as refused:
            make_settings(upstream_api_keys=bad)
        assert "secret-one" not in str(refused.value) and "UPSTREAM_API_KEYS" in str(refused.value)
    assert make_settings(upstream_api_keys="k1:1").safe_items()["upstream_api_keys"] == "***"
    for bad in ({"upstream_api_key": "secret-one\r\nX-Evil: 1"}, {"upstream_api_keys": "secret-one\n:5"}):
        with pytest.raises(SettingsError) as refused:
            make_settings(**bad)  # sent as a header line: a line break would add headers of its own
        assert "secret-one" not in str(refused.value)
