"""Several gateway processes on one database (README, Scale-out): concurrent calls from keys of
one account spread over all processes never overspend; a revocation made through one process stops
the key in the others within a second; a killed process's lease goes back to the balance after
LEASE_TIMEOUT and the ledger reconciles; `serve --workers N` drains all workers on SIGTERM."""

import asyncio
import os
import signal
import socket
import subprocess
import time
import uuid
from datetime import UTC, datetime, timedelta

import orjson
import pytest
from support import Gateway, account_with_keys, charged, ledger_of, storm

from accounting.keys import KeyEntry
from storage import db as database

pytestmark = pytest.mark.gen_test(timeout=90)
PRICE = 18  # user/info, one profile


async def start_all(*gateways: Gateway) -> None:
    await asyncio.gather(*(g.launch() for g in gateways))


async def process_ids(mongo_uri: str, db_name: str) -> dict[str, str]:
    """node name -> process id of the live gateway processes."""
    client = database.connect(mongo_uri)
    found = {p["node"]: p["_id"] async for p in client[db_name].processes.find()}
    await client.close()
    return found


async def heartbeat_of(mongo_uri: str, db_name: str, process_id: str) -> datetime:
    client = database.connect(mongo_uri)
    doc = await client[db_name].processes.find_one({"_id": process_id})
    await client.close()
    return doc["heartbeat_at"]


async def test_concurrent_calls_over_three_processes_never_overspend(mongo, upstream_url, catalog):
    """`--workers 2` on one port and a single process on another, one account with three keys and
    credits for about 160 calls, 450 concurrent calls spread over all of them."""
    db_name = f"s_{uuid.uuid4().hex[:10]}"
    pair, single = Gateway(mongo.uri, upstream_url, db_name, workers=2), Gateway(mongo.uri, upstream_url, db_name)
    await start_all(pair, single)
    initial = 160 * PRICE + 7
    user, keys, _ = await account_with_keys(single, initial, 3)
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    targets = [(gw, key) for gw in (pair, pair, single) for key in keys]
    # One call through each port first, so that each holds a lease when the storm starts: which process then
    # serves how many is the lease sharing's business, and the single one served at least this call.
    responses = list(await asyncio.gather(*await storm([(single, keys[0]), (pair, keys[1])], path, 2)))
    assert [r.code for r in responses] == [200, 200]
    responses += await asyncio.gather(*await storm(targets, path, 450))
    assert {r.code for r in responses} <= {200, 402}
    assert charged(responses) <= initial
    # A process may answer 402 while another still holds credits; asked for them, the holder gives
    # half back, so waves a moment apart spend the balance down to less than a call per process.
    deadline = time.monotonic() + 60  # a few waves on a quiet machine; more when other work shares the cores
    while initial - charged(responses) >= 3 * PRICE and time.monotonic() < deadline:
        await asyncio.sleep(1.2)
        responses += await asyncio.gather(*await storm(targets, path, 30))
    assert {r.code for r in responses} <= {200, 402}
    left = initial - charged(responses)
    if left >= 3 * PRICE:  # where the credits stayed, for the failure's message
        account, _ = await ledger_of(mongo.uri, db_name, user["account_id"])
        pytest.fail(f"{left} credits unspent after the waves: balance {account['credits']}, leases {account['leases']}")
    assert left >= 0
    ids = [r.headers["X-Request-ID"] for r in responses]
    assert len(set(ids)) == len(ids), "two answers carried the same request id"  # the pair's workers included
    nodes = await process_ids(mongo.uri, db_name)
    assert pair.stop() == 0 and single.stop() == 0
    account, records = await ledger_of(mongo.uri, db_name, user["account_id"])
    assert sum(r["credits"] for r in records) == charged(responses)
    served = sorted(r.headers["X-Request-ID"] for r in responses if r.code == 200)
    assert sorted(r["request_id"] for r in records) == served  # each record matches exactly one answer
    assert account["leases"] == {} and account["credits"] == initial - charged(responses)
    # Both ports served calls (which of the pair's workers accepts a connection is the kernel's choice).
    single_id = nodes[f"{socket.gethostname()}:{single.port}"]
    served_by = {r["lease"] for r in records if r["credits"]}
    assert single_id in served_by and served_by - {single_id}


@pytest.mark.parametrize("coherence", ["changestream", "poll"])
async def test_revocation_through_one_process_stops_the_key_in_another_within_a_second(
    mongo, upstream_url, catalog, coherence
):
    db_name = f"s_{uuid.uuid4().hex[:10]}"
    env = {"COHERENCE": coherence, "COHERENCE_POLL_SECONDS": "0.2"}
    a, b = Gateway(mongo.uri, upstream_url, db_name, **env), Gateway(mongo.uri, upstream_url, db_name, **env)
    await start_all(a, b)
    user, (key,), auth = await account_with_keys(a, 100_000, 1)
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    assert (await b.call("GET", path, **{"X-API-Key": key})).code == 200  # B has the key cached now
    key_id = orjson.loads((await a.call("GET", "/keys", **auth)).body)[0]["key_id"]
    assert (await a.call("POST", f"/keys/{key_id}/revoke", {}, **auth)).code == 200
    revoked_at = time.monotonic()
    while (response := await b.call("GET", path, **{"X-API-Key": key})).code == 200:
        assert time.monotonic() - revoked_at < 1.0, "B still accepts the key a second after its revocation"
        await asyncio.sleep(0.05)
    assert response.code == 401 and time.monotonic() - revoked_at < 1.0
    assert a.stop() == 0 and b.stop() == 0


async def test_sigkill_mid_load_the_survivor_reclaims_the_lease_and_the_ledger_reconciles(mongo, upstream_url, catalog):
    db_name = f"s_{uuid.uuid4().hex[:10]}"
    timeout = 3.0  # LEASE_TIMEOUT; maintenance (heartbeat, reclaim) runs every timeout / 6
    a = Gateway(mongo.uri, upstream_url, db_name, LEASE_TIMEOUT=str(timeout))
    b = Gateway(mongo.uri, upstream_url, db_name, LEASE_TIMEOUT=str(timeout))
    await start_all(a, b)
    initial = 1_000_000
    user, keys, _ = await account_with_keys(a, initial, 2)
    victim = (await process_ids(mongo.uri, db_name))[f"{socket.gethostname()}:{a.port}"]
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    calls = await storm([(a, keys[0]), (b, keys[1])], path, 400)
    account, _ = await ledger_of(mongo.uri, db_name, user["account_id"])
    for _ in range(100):  # mid-load: once the process to kill has taken a lease
        if victim in account["leases"]:
            break
        await asyncio.sleep(0.1)
        account, _ = await ledger_of(mongo.uri, db_name, user["account_id"])
    assert victim in account["leases"]
    a.stop(signal.SIGKILL)
    killed_at = time.monotonic()
    last_heartbeat = await heartbeat_of(mongo.uri, db_name, victim)
    responses = await asyncio.gather(*calls)
    while victim in account["leases"]:
        assert time.monotonic() - killed_at < timeout + 2 * timeout / 6 + 1.5, "the dead lease was not reclaimed"
        await asyncio.sleep(0.1)
        account, _ = await ledger_of(mongo.uri, db_name, user["account_id"])
    # Not before the timeout either, counted from the last heartbeat (which a busy process may send late).
    assert datetime.now(UTC) - last_heartbeat >= timedelta(seconds=timeout)
    assert b.stop() == 0
    account, records = await ledger_of(mongo.uri, db_name, user["account_id"])
    assert account["leases"] == {}
    persisted = sum(r["credits"] for r in records)
    # Only what the killed process had not flushed yet is missing: never a charge without its record.
    assert persisted <= charged(responses)
    assert account["credits"] == initial - persisted


async def test_workers_restart_after_a_crash_and_drain_on_sigterm(mongo, upstream_url, catalog):
    """A worker killed by SIGKILL is started again under its index and reclaims its predecessor's
    lease at once (no LEASE_TIMEOUT wait); SIGTERM to the parent drains every worker."""
    db_name = f"s_{uuid.uuid4().hex[:10]}"
    # A LEASE_TIMEOUT far beyond the wait below: only the restart can have returned the lease, however
    # slowly a loaded machine restarts the workers (the parent pauses QUICK_DEATH per early death).
    gw = Gateway(mongo.uri, upstream_url, db_name, workers=2, LEASE_TIMEOUT="300")
    await gw.launch()
    user, (key,), _ = await account_with_keys(gw, 1_000_000, 1)
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    await asyncio.gather(*await storm([(gw, key)], path, 100))
    workers = await process_ids(mongo.uri, db_name)
    account, _ = await ledger_of(mongo.uri, db_name, user["account_id"])
    node, dead = next((n, p) for n, p in workers.items() if p in account["leases"])
    worker_pids = subprocess.run(["pgrep", "-P", str(gw.proc.pid)], capture_output=True, text=True).stdout.split()
    assert len(worker_pids) == 2
    # Which worker holds the lease is not known from outside: kill both, one after the other.
    os.kill(int(worker_pids[0]), signal.SIGKILL)
    os.kill(int(worker_pids[1]), signal.SIGKILL)
    deadline = time.monotonic() + 60  # well under LEASE_TIMEOUT
    while dead in account["leases"]:
        assert time.monotonic() < deadline, "the restarted worker did not reclaim its predecessor's lease"
        await asyncio.sleep(0.2)
        account, _ = await ledger_of(mongo.uri, db_name, user["account_id"])
    assert (await gw.call("GET", path, **{"X-API-Key": key})).code == 200
    assert node in await process_ids(mongo.uri, db_name)  # the same node name, a new process
    assert gw.stop() == 0
    account, records = await ledger_of(mongo.uri, db_name, user["account_id"])
    assert account["leases"] == {} and await process_ids(mongo.uri, db_name) == {}
    assert account["credits"] == 1_000_000 - sum(r["credits"] for r in records)


async def test_sigterm_while_a_restarted_worker_starts_still_drains_it(mongo, upstream_url):
    """The parent is stopped just as a restarted worker has registered and is still starting: that worker
    shuts down cleanly too (it used to die by the default SIGTERM action, leaving its registration)."""
    db_name = f"s_{uuid.uuid4().hex[:10]}"
    gw = Gateway(mongo.uri, upstream_url, db_name, workers=2)
    await gw.launch()
    client = database.connect(mongo.uri)
    try:
        processes = client[db_name].processes
        before = {p["_id"] async for p in processes.find()}
        worker_pids = subprocess.run(["pgrep", "-P", str(gw.proc.pid)], capture_output=True, text=True).stdout.split()
        os.kill(int(worker_pids[0]), signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not {p["_id"] async for p in processes.find()} - before:  # the restarted worker registered
            assert time.monotonic() < deadline, "the killed worker was not started again"
            await asyncio.sleep(0.005)
        assert gw.stop() == 0
        assert [p async for p in processes.find()] == []
    finally:
        await client.close()


async def eventually(check, within: float = 1.0) -> None:
    """Waits for `check()` (a coroutine function) to hold, for at most `within` seconds."""
    started = time.monotonic()
    while not await check():
        assert time.monotonic() - started < within, "not within a second"
        await asyncio.sleep(0.02)


async def test_topups_and_plans_made_elsewhere_apply_within_a_second(ctx, second):
    account = await ctx.accounts.create(f"c{uuid.uuid4().hex[:8]}@example.com", "unused", 0)
    aid = account["_id"]
    assert (await second.meter.account_view(aid)).plan.name == "free"
    assert await second.meter.reserve(aid, PRICE, PRICE) is None  # 402, and remembered for a second
    await ctx.meter.add_credits(aid, 1000, topup_credits=1000)  # through the other process

    async def seen():
        return second.account_cache.peek(aid).plan.name == "paid" and not second.meter.ledger.is_known_empty(
            aid, second.meter.clock()
        )

    await eventually(seen)
    assert await second.meter.reserve(aid, PRICE, PRICE) is not None


async def test_a_process_finding_the_balance_empty_gets_half_of_what_another_holds(ctx, second):
    account = await ctx.accounts.create(f"w{uuid.uuid4().hex[:8]}@example.com", "unused", 1000)
    aid = account["_id"]
    held = await second.meter.reserve(aid, 1000, PRICE)  # its take moves the whole balance into its lease
    second.meter.release(held)
    assert await ctx.meter.reserve(aid, PRICE, PRICE) is None  # nothing left in the balance: 402, ask

    async def given_back():
        return (await ctx.accounts.get(aid))["credits"] == 500

    await eventually(given_back)
    assert second.meter.ledger.purses[aid].leased == 500
    # The giver does not lease it back at once; the asker finds it when it asks again.
    ctx.meter.ledger.forget_empty(aid)
    assert await ctx.meter.reserve(aid, PRICE, PRICE) is not None


async def test_a_process_declared_dead_and_back_charges_each_call_once(ctx, second):
    """Its leases are reclaimed by another process (one of its lease takes landing just after), it
    registers again and spends from a new lease, and that lease is reclaimed in turn: the balance pays
    each call exactly once."""
    account = await ctx.accounts.create(f"d{uuid.uuid4().hex[:8]}@example.com", "unused", 10_000)
    aid = account["_id"]
    key = KeyEntry(4242, aid, False)

    async def calls(n: int) -> None:
        for _ in range(n):
            reservation = await ctx.meter.reserve(aid, PRICE, PRICE)
            ctx.meter.record(key, "/user/info", 200, ctx.meter.settle(reservation, PRICE), uuid.uuid4().hex)
        await ctx.meter.flush()

    await calls(3)
    in_flight = await ctx.meter.reserve(aid, PRICE, PRICE)
    assert await second.meter.leases.reclaim_dead(-1) >= 1  # silent too long, as far as `second` can tell
    assert (await ctx.accounts.get(aid))["credits"] == 10_000 - 3 * PRICE
    await ctx.meter.leases.take(aid, 100, PRICE)  # a take of it that was on its way lands after the reclaim
    await ctx.meter.heartbeat()  # its heartbeat finds it declared dead: it registers again
    # The call in flight was counted as unspent by the reclaim: it is not charged.
    assert ctx.meter.settle(in_flight, PRICE) == 0
    await calls(2)
    assert await second.meter.leases.reclaim_dead(-1) >= 1
    assert (await ctx.accounts.get(aid))["credits"] == 10_000 - 5 * PRICE


@pytest.mark.parametrize(
    "coherence",
    ["changestream", pytest.param("poll", marks=pytest.mark.settings(coherence="poll", coherence_poll_seconds=0.2))],
)
async def test_a_logout_through_one_process_ends_the_token_in_another_within_a_second(api, ctx, second, coherence):
    assert ctx.settings.coherence == second.settings.coherence == coherence
    user = await api.register()
    assert await second.sessions.check(user["token"]) is not None  # known there as not ended (remembered)
    assert (await api.call("POST", "/auth/logout", token=user["token"]))[0] == 200

    async def ended_there():
        return await second.sessions.check(user["token"]) is None

    await eventually(ended_there)


async def test_after_registering_again_a_batch_being_written_is_counted_once(ctx, second, monkeypatch):
    """Usage summaries count buffered calls and skip their batches' stored totals; batches keep the
    process's first id, and the skip must follow them, not the new lease id."""
    account = await ctx.accounts.create(f"s{uuid.uuid4().hex[:8]}@example.com", "unused", 10_000)
    aid = account["_id"]
    key = KeyEntry(4343, aid, False)
    assert await second.meter.leases.reclaim_dead(-1) >= 0
    await ctx.meter.heartbeat()  # declared dead: registers again
    for _ in range(3):
        reservation = await ctx.meter.reserve(aid, PRICE, PRICE)
        ctx.meter.record(key, "/user/info", 200, ctx.meter.settle(reservation, PRICE), uuid.uuid4().hex)
    seen = []
    write = ctx.meter.usage.insert_batch

    async def write_then_read(batch_id, batch):
        await write(batch_id, batch)
        seen.append(await ctx.meter.reads.summary(aid, "", ("key_id",)))  # written, still buffered

    monkeypatch.setattr(ctx.meter.usage, "insert_batch", write_then_read)
    await ctx.meter.flush()
    assert seen == [{(4343,): [3, 3 * PRICE, 0, 0, 0]}]  # calls, credits, errors, from the cache, credits saved
