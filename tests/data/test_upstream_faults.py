"""Every fault mode of the sandbox upstream, each through the whole data plane: the answer the client
gets, how fast (within the gateway's timeouts), and that nothing is charged. test_social.py covers
hangs (504), 503 bursts and the breaker, connection refused, oversize and malformed bodies from a
recording upstream; these add resets, truncated bodies and latency, from the real sandbox."""

import time

import pytest
from support import FAST, use_upstream

import sandbox

pytestmark = pytest.mark.gen_test(timeout=60)


@pytest.mark.settings(plan_rules=FAST)
@pytest.mark.parametrize(
    "faults,expected,kind",
    [
        ("reset", 502, "connection reset, no answer"),
        ("truncate", 502, "Content-Length promised, half the body, closed"),
        ("malformed", 502, "200 whose body is not JSON"),
        ("oversize=20000", 502, "valid JSON past UPSTREAM_MAX_BODY_BYTES"),
        ("error=500:1", 502, "provider 500"),
        ("error=429:1", 429, "provider rate limit: the gateway's own 429, its Retry-After"),
        ("latency=1500", 504, "slower than UPSTREAM_TIMEOUT"),
    ],
    ids=["reset", "truncate", "malformed", "oversize", "500", "429", "latency"],
)
async def test_each_upstream_fault_is_answered_in_time_and_never_charged(api, ctx, catalog, faults, expected, kind):
    sim = sandbox.start("127.0.0.1", 0, ctx.settings.upstream_api_key, faults=faults)
    use_upstream(ctx, sim.url, timeout=1.0, max_body=10_000)
    user, key = await api.funded_key(10_000)
    started = time.monotonic()
    status, body, headers = await api.call(
        "GET", f"/social/user/info?userName={catalog['users'][0]['userName']}", key=key["key"]
    )
    took = time.monotonic() - started
    sim.stop()
    assert status == expected, (kind, status, body)
    assert took < 1.0 + 0.5, (kind, took)  # never longer than UPSTREAM_TIMEOUT (+ scheduling)
    assert headers.get("X-Credits-Charged", "0") == "0"
    if status == 429:  # the provider's refusal never reaches the client as it is
        assert int(headers["Retry-After"]) >= 1 and "provider's rate" in body["msg"]
    assert (await api.call("GET", "/account", token=user["token"]))[1]["credits"] == 10_000
    usage = (await api.call("GET", "/usage", token=user["token"]))[1]
    assert [u["credits"] for u in usage] == [0], kind


@pytest.mark.settings(plan_rules=FAST)
async def test_moderate_latency_is_served_and_charged_normally(api, ctx, catalog):
    sim = sandbox.start("127.0.0.1", 0, ctx.settings.upstream_api_key, faults="latency=200")
    use_upstream(ctx, sim.url, timeout=1.0)
    user, key = await api.funded_key(10_000)
    started = time.monotonic()
    status, _, headers = await api.call(
        "GET", f"/social/user/info?userName={catalog['users'][0]['userName']}", key=key["key"]
    )
    sim.stop()
    assert status == 200 and 0.2 <= time.monotonic() - started < 1.0
    assert (await api.call("GET", "/account", token=user["token"]))[1]["credits"] == 10_000 - int(
        headers["X-Credits-Charged"]
    )
