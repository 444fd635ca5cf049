"""The database stopped, slowed and restarted under the data plane: known keys keep being served
while the usage buffer has room, calls fail closed (503, uncharged, not forwarded) past it, and
once the database is back every buffered record and charge is persisted exactly once.

Each test runs its own SecantusDB on a real directory, so a restart on the same port finds the
data again (the session-wide in-memory server of conftest is not touched)."""

import asyncio
import os
import signal
import time
import urllib.request

import orjson
import pytest
from support import FAST

import gateway
from app.embedded import EmbeddedMongo, free_port
from storage import db as database

pytestmark = pytest.mark.gen_test(timeout=90)

INITIAL = 1_000_000


@pytest.fixture
def mongo(tmp_path):
    """Overrides conftest's server: this one may be killed, stopped and restarted by the test."""
    server = EmbeddedMongo(str(tmp_path / "db"), port=free_port()).start()
    yield server
    server.stop()


def upstream_requests(upstream_url: str) -> int:
    with urllib.request.urlopen(upstream_url + "/sandbox/stats") as response:
        return orjson.loads(response.read())["requests"]


async def stored(ctx, account_id: str) -> list[dict]:
    return await ctx.usage.records({"account_id": account_id})


async def drained(ctx, seconds: float = 30) -> None:
    """Waits for the background flusher to empty the buffer (the database is back)."""
    deadline = time.monotonic() + seconds
    while len(ctx.meter.buffer) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert len(ctx.meter.buffer) == 0, f"{len(ctx.meter.buffer)} records still buffered"


async def reconcile(api, ctx, mongo, user: dict, served: list) -> None:
    """Exactly once: one stored record per served call, the charges the client saw, the balance."""
    charged = sum(int(r[2]["X-Credits-Charged"]) for r in served)
    records = await stored(ctx, user["account_id"])
    ok = [r for r in records if r["status"] == 200]
    assert len(ok) == len(served) and len({r["_id"] for r in records}) == len(records)
    assert sum(r["credits"] for r in records) == charged
    assert sorted(r["request_id"] for r in ok) == sorted(r[2]["X-Request-ID"] for r in served)
    assert (await api.call("GET", "/account", token=user["token"]))[1]["credits"] == INITIAL - charged
    # Shut down cleanly: the lease goes back and the stored ledger alone balances.
    await gateway.shutdown(ctx, [])
    ctx.client = database.connect(mongo.uri)
    account = await ctx.client[ctx.settings.mongodb_db].accounts.find_one({"_id": user["account_id"]})
    assert account["leases"] == {} and account["credits"] == INITIAL - charged


def data_path(catalog) -> str:
    return f"/social/user/info?userName={catalog['users'][0]['userName']}"


@pytest.mark.settings(plan_rules=FAST, buffer_max=10, flush_interval=0.05)
async def test_outage_serves_known_keys_until_the_buffer_is_full_then_fails_closed(
    api, ctx, mongo, catalog, upstream_url
):
    user, key = await api.funded_key(INITIAL)
    path = data_path(catalog)
    before = [await api.call("GET", path, key=key["key"]) for _ in range(3)]
    assert [r[0] for r in before] == [200] * 3
    await ctx.meter.flush()
    mongo.kill()
    # A call with an Idempotency-Key needs its claim in the database: 503 once the driver gives up, never
    # forwarded nor charged (reconcile below); the client retries it with the same key later.
    status, _, headers = await api.call("GET", path, key=key["key"], headers={"Idempotency-Key": "in-the-outage"})
    assert status == 503 and headers["Retry-After"] == "1"
    during = [await api.call("GET", path, key=key["key"]) for _ in range(10)]
    assert [r[0] for r in during] == [200] * 10  # from memory: key, plan and lease are cached
    forwarded = upstream_requests(upstream_url)
    for _ in range(5):
        started = time.monotonic()
        status, body, headers = await api.call("GET", path, key=key["key"])
        assert status == 503 and headers["Retry-After"] == "1" and "recorded" in body["msg"]
        assert time.monotonic() - started < 1.0  # refused at once, not after a database timeout
    assert upstream_requests(upstream_url) == forwarded  # fail closed: nothing forwarded...
    assert len(ctx.meter.buffer) == 10  # ...nothing recorded, nothing charged
    # What needs the database answers 503 too (not 500), after the driver's server selection timeout.
    assert (await api.call("GET", "/account", token=user["token"]))[0] == 503
    assert (await api.call("GET", path, key=ctx.vault.generate()))[0] == 503  # a key never seen: cannot check it
    mongo.start()
    await drained(ctx)
    await reconcile(api, ctx, mongo, user, before + during)


@pytest.mark.settings(plan_rules=FAST, flush_interval=0.05)
async def test_database_killed_and_restarted_under_load_loses_and_doubles_nothing(api, ctx, mongo, catalog):
    user, key = await api.funded_key(INITIAL)
    path = data_path(catalog)
    results, stop = [], asyncio.Event()

    async def client():
        while not stop.is_set():
            results.append(await api.call("GET", path, key=key["key"]))

    workers = [asyncio.ensure_future(client()) for _ in range(4)]
    await asyncio.sleep(0.6)
    mongo.kill()  # whatever the flusher was writing is left uncertain
    await asyncio.sleep(0.6)
    mongo.start()
    await asyncio.sleep(0.6)
    stop.set()
    await asyncio.gather(*workers)
    served = [r for r in results if r[0] == 200]
    assert len(served) > 20 and {r[0] for r in results} <= {200, 503}
    await drained(ctx)
    await reconcile(api, ctx, mongo, user, served)


@pytest.mark.settings(plan_rules=FAST, flush_interval=0.05)
async def test_a_frozen_database_does_not_slow_known_keys(api, ctx, mongo, catalog):
    user, key = await api.funded_key(INITIAL)
    path = data_path(catalog)
    before = [await api.call("GET", path, key=key["key"]) for _ in range(3)]
    os.kill(mongo.process.pid, signal.SIGSTOP)  # connections stay open, nothing answers: the slowest database
    try:
        during, slowest = [], 0.0
        for _ in range(10):
            started = time.monotonic()
            during.append(await api.call("GET", path, key=key["key"]))
            slowest = max(slowest, time.monotonic() - started)
            await asyncio.sleep(0.1)
    finally:
        os.kill(mongo.process.pid, signal.SIGCONT)
    assert [r[0] for r in during] == [200] * 10 and slowest < 0.5, slowest
    await drained(ctx)
    await reconcile(api, ctx, mongo, user, before + during)


@pytest.mark.settings(plan_rules=FAST, lease_timeout=3, flush_interval=0.05)
async def test_without_heartbeats_leases_stop_being_spent_after_half_the_lease_timeout(api, ctx, mongo, catalog):
    """By design: another process may reclaim this one's leases LEASE_TIMEOUT after its last heartbeat,
    so it stops spending them at half that, even with room in the buffer; it resumes when the database is back."""
    user, key = await api.funded_key(INITIAL)
    path = data_path(catalog)
    await asyncio.sleep(0.7)  # a heartbeat has run (every LEASE_TIMEOUT / 6)
    served = [await api.call("GET", path, key=key["key"])]
    mongo.kill()
    killed = time.monotonic()
    served.append(await api.call("GET", path, key=key["key"]))
    assert served[-1][0] == 200
    await asyncio.sleep(2.0)  # > LEASE_TIMEOUT / 2 since the last heartbeat
    status, body, headers = await api.call("GET", path, key=key["key"])
    assert status == 503 and "Credits cannot be checked" in body["msg"] and headers["Retry-After"] == "1"
    assert time.monotonic() - killed < 3.0  # before anyone could have reclaimed the lease
    mongo.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        answer = await api.call("GET", path, key=key["key"])
        if answer[0] == 200:
            served.append(answer)
            break
        await asyncio.sleep(0.2)
    assert served[-1] is answer, "calls did not resume once the database was back"
    await drained(ctx)
    await reconcile(api, ctx, mongo, user, [r for r in served if r[0] == 200])


@pytest.mark.settings(lease_timeout=60)
async def test_a_new_process_may_spend_only_until_its_first_heartbeat_is_due(ctx):
    """Registering counts as the first heartbeat: a process whose database is gone before its first
    maintenance round must not go on spending leases that others will reclaim."""
    ledger = ctx.meter.ledger
    assert ledger.valid_until <= ctx.meter.clock() + 30
    assert not ledger.usable(ctx.meter.clock() + 30.1)


@pytest.mark.settings(plan_rules=FAST, key_cache_ttl=0.5, flush_interval=0.05)
async def test_expired_cache_entries_are_served_stale_at_once_during_an_outage(api, ctx, mongo, catalog):
    user, key = await api.funded_key(INITIAL)
    path = data_path(catalog)
    served = [await api.call("GET", path, key=key["key"])]
    mongo.kill()
    await asyncio.sleep(0.6)  # the key and account entries are now past KEY_CACHE_TTL
    times = []
    for _ in range(8):
        started = time.monotonic()
        served.append(await api.call("GET", path, key=key["key"]))
        times.append(time.monotonic() - started)
        await asyncio.sleep(0.1)
    assert [r[0] for r in served] == [200] * 9, [(r[0], r[1], round(t, 2)) for r, t in zip(served[1:], times)]
    assert max(times) < 1.0, times  # never the driver's 5 s server selection timeout
    assert ctx.key_cache.stats.stale_served >= 1
    mongo.start()
    await drained(ctx)
    await reconcile(api, ctx, mongo, user, served)
