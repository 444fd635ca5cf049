"""The operator's cost ledger (accounting/costs.py, storage/provider_costs.py), the margin view over it and the usage
records (GET /admin/margin), and the per-provider /metrics. Provider requests are recorded as the router records
them (CostLedger.record with social/providers Attempt), usage records with their `provider` written as the usage
flusher writes them."""

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client.parser import text_string_to_metric_families

import gateway
from accounting.costs import CostLedger
from app.embedded import free_port
from gateway_testing.helpers import UPSTREAM_KEY, make_settings
from runtime.metrics import Metrics
from runtime.state import State
from social.providers import Attempt
from storage import db as database
from storage.provider_costs import ProviderCostStore

pytestmark = pytest.mark.gen_test(timeout=60)
ADMIN = "boss@example.com"
ITEM_USD = 0.0002  # what B bills per item


@pytest.fixture
def settings(upstream_url):
    """Two providers: A, first in order, which nothing answers (a port nobody listens on), and B, the sandbox."""
    return make_settings(
        providers=(
            {"name": "a", "kind": "twitterapi", "url": f"http://127.0.0.1:{free_port()}", "keys": [UPSTREAM_KEY]},
            {
                "name": "b",
                "kind": "twitterapi",
                "url": upstream_url,
                "keys": [UPSTREAM_KEY],
                "costs": {"item": ITEM_USD},
            },
        )
    )


async def admin_token(api, ctx) -> str:
    token = (await api.register(ADMIN))["token"]
    assert await ctx.accounts.set_admin(ADMIN, True)
    return token


def attempt(at: datetime, provider: str, endpoint: str = "/user/info", status: int = 200, **extra) -> Attempt:
    figures = {"error": "", "items": 1, "cost_usd": 0.00015, "seconds": 0.7, "account": "acc-1"} | extra
    return Attempt(at.timestamp(), provider, endpoint, status, **figures)


def usage(at: datetime, provider: str | None, credits: int, endpoint: str = "/social/user/info") -> dict:
    """A usage record as accounting/meter.py makes it, with the provider that answered (absent: none did)."""
    record = {
        "_id": uuid.uuid4().hex,
        "account_id": "acc-1",
        "key_id": 1,
        "endpoint": endpoint,
        "ts": at,
        "credits": credits,
        "status": 200 if credits else 502,
        "lease": "test-process",
        "request_id": uuid.uuid4().hex,
    }
    return record | ({"provider": provider} if provider else {})


def in_period(moment: datetime, since: datetime, until: datetime) -> bool:
    return since <= moment <= until


async def test_margin_totals_equal_the_usage_records_and_the_ledger(api, ctx, http_client, base_url):
    """Records and attempts on both sides of each edge of the period, some in one batch across an edge (its rows
    are read one by one), a failed-over attempt, a call no provider answered: every figure is the sum of exactly
    the records and attempts inside, and a provider's and the whole period's totals the sums of their rows."""
    token = await admin_token(api, ctx)
    now = datetime.now(UTC).replace(microsecond=0)
    since, until = now - timedelta(hours=2), now - timedelta(hours=1)
    second = timedelta(seconds=1)
    moments = [since - second, since, since + second, until - second, until, until + second]
    attempts, records = [], []
    for i, moment in enumerate(moments):
        attempts.append(attempt(moment, "a", status=503, error="failed", items=0, cost_usd=0.0))  # failed over
        attempts.append(attempt(moment, "b", cost_usd=0.0002 * (i + 1), items=i + 1))
        attempts.append(attempt(moment, "a", "/twitter/tweet/advanced_search", cost_usd=0.00015 * 20, items=20))
        records.append(usage(moment, "b", 15 + i))
        records.append(usage(moment, "a", 300, "/social/twitter/tweet/advanced_search"))
        records.append(usage(moment, None, 0))  # every provider failed: charged nothing
    for i, a in enumerate(attempts):
        ctx.costs.record(a, failover=a.status == 503)
        if i == len(attempts) // 2:
            await ctx.costs.flush()  # two batches: buckets across both edges and one wholly inside
    await ctx.costs.flush()
    await ctx.usage.insert_batch("test-1", records)

    query = f"/admin/margin?from={since.isoformat()}&to={until.isoformat()}".replace("+", "%2B")
    status, body, _ = await api.call("GET", query, token=token)
    assert status == 200, body
    inside = [a for a in attempts if in_period(datetime.fromtimestamp(a.at, UTC), since, until)]
    charged = [r for r in records if in_period(r["ts"], since, until)]
    assert len(inside) == 4 * 3 and len(charged) == 4 * 3
    totals = body["totals"]
    assert totals["calls"] == len(charged)
    assert totals["charged_credits"] == sum(r["credits"] for r in charged)
    assert totals["charged_usd"] == pytest.approx(totals["charged_credits"] / ctx.settings.credits_per_usd)
    assert totals["provider_calls"] == len(inside)
    assert totals["failures"] == totals["failovers"] == sum(a.status == 503 for a in inside) == 4
    assert totals["paid_usd"] == pytest.approx(sum(a.cost_usd for a in inside), abs=1e-6)
    assert totals["margin_usd"] == pytest.approx(totals["charged_usd"] - totals["paid_usd"], abs=1e-6)

    rows = {(r["provider"], r["endpoint"]): r for r in body["rows"]}
    assert set(rows) == {
        ("a", "/social/user/info"),
        ("a", "/social/twitter/tweet/advanced_search"),
        ("b", "/social/user/info"),
        (None, "/social/user/info"),
    }
    b = rows["b", "/social/user/info"]
    assert b["calls"] == 4 and b["charged_credits"] == sum(15 + i for i in (1, 2, 3, 4))
    assert b["provider_calls"] == 4 and b["failures"] == 0
    assert b["paid_usd"] == pytest.approx(0.0002 * (2 + 3 + 4 + 5), abs=1e-9)
    a_info = rows["a", "/social/user/info"]  # A failed these calls over to B: paid nothing, charged nothing
    assert (a_info["calls"], a_info["provider_calls"], a_info["failovers"], a_info["paid_usd"]) == (0, 4, 4, 0)
    assert rows[None, "/social/user/info"]["calls"] == 4 and rows[None, "/social/user/info"]["charged_credits"] == 0
    providers = {p["provider"]: p for p in body["providers"]}
    for name in ("calls", "charged_credits", "provider_calls", "failures", "failovers"):
        assert sum(p[name] for p in providers.values()) == totals[name]
        assert providers["a"][name] == sum(r[name] for r in body["rows"] if r["provider"] == "a")

    # /metrics: each provider's requests, failures, failovers, cost and latency, as recorded (all of them).
    text = (await http_client.fetch(base_url + "/metrics")).body.decode()
    values = {
        (s.name, s.labels.get("provider"), s.labels.get("le")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    for provider in ("a", "b"):
        mine = [a for a in attempts if a.provider == provider]
        assert values["gateway_provider_calls_total", provider, None] == len(mine)
        assert values["gateway_provider_failures_total", provider, None] == sum(a.status == 503 for a in mine)
        assert values["gateway_provider_failovers_total", provider, None] == sum(a.status == 503 for a in mine)
        assert values["gateway_provider_cost_usd_total", provider, None] == pytest.approx(sum(a.cost_usd for a in mine))
        assert values["gateway_provider_latency_seconds_bucket", provider, "+Inf"] == len(mine)
        assert values["gateway_provider_latency_seconds_bucket", provider, "0.5"] == 0  # each took 0.7 s


async def test_a_failed_over_call_is_charged_once_and_costs_what_b_bills(api, ctx, catalog):
    """Through the router: A unreachable, B answers. Each call is charged once, to B's name; the ledger holds A's
    failed-over attempt (paid nothing) and B's answer (paid by its items); the margin view says so."""
    token = await admin_token(api, ctx)
    user, key = await api.funded_key()
    started = datetime.now(UTC)
    charged = 0
    for name in [u["userName"] for u in catalog["users"][:2]]:
        status, body, headers = await api.call("GET", f"/social/user/info?userName={name}", key=key["key"])
        assert status == 200 and headers["X-Provider"] == "b", body
        charged += int(headers["X-Credits-Charged"])
    await ctx.meter.flush()
    await ctx.costs.flush()
    records = await ctx.usage.records({"account_id": user["account_id"]})
    assert [r["provider"] for r in records] == ["b", "b"] and sum(r["credits"] for r in records) == charged
    query = f"/admin/margin?from={started.isoformat()}".replace("+", "%2B")
    status, body, _ = await api.call("GET", query, token=token)
    rows = {r["provider"]: r for r in body["rows"]}
    assert set(rows) == {"a", "b"} and {r["endpoint"] for r in body["rows"]} == {"/social/user/info"}
    assert (rows["a"]["provider_calls"], rows["a"]["failovers"], rows["a"]["calls"], rows["a"]["paid_usd"]) == (
        2,
        2,
        0,
        0,
    )
    assert (rows["b"]["provider_calls"], rows["b"]["failures"], rows["b"]["calls"]) == (2, 0, 2)
    assert rows["b"]["charged_credits"] == body["totals"]["charged_credits"] == charged
    assert rows["b"]["paid_usd"] == pytest.approx(2 * ITEM_USD)  # one profile each


async def test_margin_rights_and_period_validation(api, ctx):
    assert (await api.call("GET", "/admin/margin"))[0] == 401
    someone = await api.register()
    assert (await api.call("GET", "/admin/margin", token=someone["token"]))[0] == 403
    token = await admin_token(api, ctx)
    for query, type_ in (
        ("from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z", "value_error"),  # backwards
        ("from=yesterday", "value_error"),
        ("to=2026-13-01T00:00:00Z", "datetime_parsing"),
        ("from=0001-01-01T00:00:00%2B14:00", "datetime_parsing"),  # before the first moment a datetime holds
        ("from=1969-12-31T23:59:59Z", "value_error"),
    ):
        status, body, _ = await api.call("GET", "/admin/margin?" + query, token=token)
        assert status == 422 and body["detail"][0]["type"] == type_, (query, body)
    # Both ends are inclusive: one moment is a period (the fuzzer's from == to), and so is `to` at the earliest
    # moment, where the default `from` is held.
    for query in ("from=2026-01-01T00:00:00Z&to=2026-01-01T00:00:00Z", "to=1970-01-01T00:00:00Z"):
        status, body, _ = await api.call("GET", "/admin/margin?" + query, token=token)
        assert status == 200 and body["period"]["from"] == body["period"]["to"], (query, body)
    status, body, _ = await api.call("GET", "/admin/margin", token=token)  # the last 30 days, nothing yet
    assert status == 200 and body["rows"] == [] and body["totals"]["calls"] == 0
    assert datetime.fromisoformat(body["period"]["to"]) - datetime.fromisoformat(body["period"]["from"]) == timedelta(
        days=30
    )


async def test_the_ledger_stores_each_attempt_once_bounded_and_all_of_it_on_close(ctx):
    """A batch written twice (a retry after an unanswered write) is stored once; past its bound the ledger counts
    an attempt in /metrics and drops it rather than grow; close() writes every attempt it holds, batch by batch."""
    store = ProviderCostStore(ctx.client[ctx.settings.mongodb_db], retention_days=1)
    small = State(dataclasses.replace(ctx.settings, buffer_max=25, flush_batch=10))
    metrics = Metrics()
    ledger = CostLedger(small, store, metrics, "proc")
    now = datetime.now(UTC).replace(microsecond=0)  # the ledger keeps milliseconds
    for i in range(30):
        ledger.record(attempt(now + timedelta(milliseconds=i), "a", cost_usd=0.001))
    assert len(ledger.buffer) == 25 and metrics.provider_ledger_dropped == 5 and metrics.provider_calls["a"] == 30
    seq, batch = ledger.buffer.take(10)  # the first batch written, its answer lost: written again by close()
    await store.insert_batch(f"proc-{seq}", batch)
    await ledger.close()
    assert len(ledger.buffer) == 0
    week = (now - timedelta(days=1), now + timedelta(days=1))
    assert (await store.totals(*week))["a", "/user/info"]["n"] == 25
    # A period inside one bucket (across both its edges): its attempts once.
    within = (now + timedelta(milliseconds=5), now + timedelta(milliseconds=9))
    assert (await store.totals(*within))["a", "/user/info"]["n"] == 5
    doc = await store.buckets.find_one({})
    assert doc["expires_at"] - doc["ts"] == pytest.approx(timedelta(days=1), abs=timedelta(minutes=1))


async def test_a_graceful_stop_writes_every_ledger_entry(ctx, mongo):
    """Entries recorded an instant before the stop (none written yet) are in the database after it."""
    now = datetime.now(UTC)
    for _ in range(3):
        ctx.costs.record(attempt(now, "b"))
    await gateway.shutdown(ctx, [])
    ctx.client = database.connect(mongo.uri)  # shutdown closed the app's client
    store = ProviderCostStore(ctx.client[ctx.settings.mongodb_db], retention_days=1)
    minute = timedelta(minutes=1)
    assert (await store.totals(now - minute, now + minute))["b", "/user/info"]["n"] == 3
