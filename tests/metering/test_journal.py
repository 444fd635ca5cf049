"""The usage journal (accounting/journal.py): no call answered without its usage record, whatever kills the
process. A worker of `serve --workers 2` killed under calls in flight, again and again: every call a client saw
answered 200 has exactly one record once the worker is replaced, and credits added = balance + charged usage.
A journal left by a process that is gone is replayed once, however often it is replayed (a replay cut short, two
starts racing for it); a write cut short at its end is read up to it; a corrupt chunk in its middle stops the
replay loudly and the journal is kept for the operator. A power loss (every process killed at once, the
database's included) loses no answered call either."""

import asyncio
import collections
import os
import signal
import subprocess
import uuid

import pytest
from support import Gateway, account_with_keys, ledger_of

import sandbox
from accounting import journal
from app.context import build_context
from app.embedded import EmbeddedMongo, free_port
from gateway_testing.helpers import FAST, UPSTREAM_KEY, make_settings
from storage import db as database

pytestmark = pytest.mark.gen_test(timeout=120)


@pytest.fixture
def settings(tmp_path):
    """The in-process gateway with its journal on, under a DATA_DIR of its own; it flushes only when a test says,
    and looks for other processes' journals only at start (its upkeep comes every LEASE_TIMEOUT / 6)."""
    return make_settings(
        journal=True, data_dir=str(tmp_path), plan_rules=FAST, flush_interval=3600.0, lease_timeout=600.0
    )


# --- a worker killed under load ----------------------------------------------------------------------------------
async def test_sigkill_of_a_worker_under_calls_in_flight_loses_no_answered_call(mongo, catalog, tmp_path):
    provider = sandbox.start("127.0.0.1", 0, UPSTREAM_KEY, faults="latency=150")
    db_name = f"j_{uuid.uuid4().hex[:10]}"
    gw = Gateway(mongo.uri, provider.url, db_name, workers=2, DATA_DIR=str(tmp_path), LEASE_TIMEOUT="300")
    try:
        await gw.launch()
        user, keys, _ = await account_with_keys(gw, 1_000_000, 2)
        path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
        answers = []
        for _ in range(3):
            workers = await live_workers(mongo.uri, db_name, 2)
            calls = [asyncio.ensure_future(call(gw, path, keys[i % 2])) for i in range(150)]
            while sum(c.done() for c in calls) < 20:  # answers are leaving: the killed worker's buffer holds some
                await asyncio.sleep(0.005)
            os.kill(max(worker_pids(gw), key=sockets), signal.SIGKILL)  # the one with the most clients
            answers += await asyncio.gather(*calls)
            # Its replacement replays its journal, then reclaims its lease (one process id gone, a new one).
            await live_workers(mongo.uri, db_name, 2, replacing=workers)
        served = [a for a in answers if a is not None and a.code == 200]
        assert len(served) >= 3 * 20
        assert await asyncio.to_thread(gw.stop) == 0
        account, records = await ledger_of(mongo.uri, db_name, user["account_id"])
        seen = collections.Counter(r["request_id"] for r in records)
        assert [a.headers["X-Request-ID"] for a in served if seen[a.headers["X-Request-ID"]] != 1] == []
        assert account["leases"] == {}
        assert account["credits_added"] == account["credits"] + sum(r["credits"] for r in records)
        assert os.listdir(tmp_path / journal.FOLDER) == []  # replayed, then every worker stopped cleanly
    finally:
        provider.stop()


async def test_power_loss_every_process_killed_database_included_loses_no_answered_call(catalog, tmp_path):
    """A gateway on SecantusDB, calls in flight against a slow provider, then SIGKILL of every process at once (the
    gateway's, the database's), as a power loss stops them; the database and the gateway start again on the same
    DATA_DIR: the journal is replayed before the dead process's lease is reclaimed."""
    provider = sandbox.start("127.0.0.1", 0, UPSTREAM_KEY, faults="latency=150")
    database = EmbeddedMongo(str(tmp_path / "db")).start()
    try:
        port, env = free_port(), {"DATA_DIR": str(tmp_path), "LEASE_TIMEOUT": "300"}
        gw = await Gateway(database.uri, provider.url, "j", port, **env).launch()
        user, (key,), _ = await account_with_keys(gw, 1_000_000, 1)
        path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
        calls = [asyncio.ensure_future(call(gw, path, key)) for _ in range(150)]
        while sum(c.done() for c in calls) < 30:
            await asyncio.sleep(0.005)
        for pid in (database.process.pid, gw.proc.pid):
            os.kill(pid, signal.SIGKILL)
        served = [a for a in await asyncio.gather(*calls) if a is not None and a.code == 200]
        database.kill()
        await asyncio.to_thread(gw.proc.wait, 10)
        database = EmbeddedMongo(str(tmp_path / "db")).start()
        again = await Gateway(database.uri, provider.url, "j", port, **env).launch()  # the same node name
        assert await asyncio.to_thread(again.stop) == 0
        account, records = await ledger_of(database.uri, "j", user["account_id"])
        seen = collections.Counter(r["request_id"] for r in records)
        assert [a.headers["X-Request-ID"] for a in served if seen[a.headers["X-Request-ID"]] != 1] == []
        assert account["leases"] == {}
        assert account["credits_added"] == account["credits"] + sum(r["credits"] for r in records)
        assert os.listdir(tmp_path / journal.FOLDER) == []
    finally:
        database.kill()
        provider.stop()


async def call(gw: Gateway, path: str, key: str):
    try:
        return await gw.call("GET", path, **{"X-API-Key": key})
    except Exception:  # the worker serving it was killed
        return None


def worker_pids(gw: Gateway) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(gw.proc.pid)], capture_output=True, text=True).stdout.split()
    return sorted(int(pid) for pid in found if b"secantus" not in open(f"/proc/{pid}/cmdline", "rb").read())


def sockets(pid: int) -> int:
    """How many sockets a worker has open: its clients' connections, mostly."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except FileNotFoundError:  # closed meanwhile
            pass
    return count


async def live_workers(mongo_uri: str, db_name: str, count: int, replacing: set[str] = frozenset()) -> set[str]:
    """The registered processes, once there are `count`, one of them in place of one of `replacing` (a bound on
    a hang, not on time)."""
    client = database.connect(mongo_uri)
    try:
        for _ in range(600):
            found = {p["_id"] async for p in client[db_name].processes.find()}
            if len(found) == count and (not replacing or len(found - replacing) == 1):
                return found
            await asyncio.sleep(0.1)
        raise AssertionError(f"processes {found}, {count} expected, one in place of one of {replacing}")
    finally:
        await client.close()


# --- replaying a journal left behind -----------------------------------------------------------------------------
async def calls_left_behind(api, ctx, catalog, monkeypatch) -> tuple[list[str], str]:
    """25 answered calls of a process that then dies (its journal's lock let go, its buffer never flushed): 10
    confirmed by the database, 10 in a batch the database took without the process hearing it did, 5 in no batch.
    (the request ids answered, the journal's path)."""
    _, key = await api.funded_key()
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"

    async def some(count: int) -> list[str]:
        answers = [await api.call("GET", path, key=key["key"]) for _ in range(count)]
        assert [status for status, _, _ in answers] == [200] * count
        return [headers["X-Request-ID"] for _, _, headers in answers]

    answered = await some(10)
    assert await ctx.meter.flush() == 10
    answered += await some(10)
    insert = ctx.meter.usage.insert_batch

    async def unheard(batch_id, records):  # written, and the acknowledgment lost
        await insert(batch_id, records)
        raise ConnectionError("the answer never came")

    monkeypatch.setattr(ctx.meter.usage, "insert_batch", unheard)
    with pytest.raises(ConnectionError):
        await ctx.meter.flush()
    monkeypatch.setattr(ctx.meter.usage, "insert_batch", insert)
    answered += await some(5)
    path = ctx.meter.journal.path
    await ctx.meter.journal.close(remove=False)  # the process is gone: nothing more of it is written
    ctx.meter.journal = None  # (its buffer is never flushed: FLUSH_INTERVAL is an hour)
    return answered, path


async def stored_request_ids(ctx) -> collections.Counter:
    return collections.Counter(r["request_id"] for r in await ctx.usage.records({}))


async def test_a_journal_replayed_after_a_crash_mid_replay_and_by_racing_starts_writes_each_record_once(
    api, ctx, second, catalog, monkeypatch
):
    answered, path = await calls_left_behind(api, ctx, catalog, monkeypatch)
    insert, written = second.meter.usage.insert_batch, []

    async def dies_after_one(batch_id, records):
        if written:
            raise SystemError("killed mid-replay")
        written.append(batch_id)
        await insert(batch_id, records)

    monkeypatch.setattr(second.meter.usage, "insert_batch", dies_after_one)
    with pytest.raises(SystemError):
        await second.meter.write_unwritten()
    assert os.path.isdir(path)  # kept: the next start replays it all again
    starts = await asyncio.gather(*(build_context(ctx.settings, worker=n) for n in (2, 3)))  # racing for it
    for other in starts:
        await other.meter.close()
        await other.client.close()
        other.upstream.close()
        other.executor.shutdown(wait=False)
    assert not os.path.exists(path)
    stored = await stored_request_ids(ctx)
    assert sorted(stored) == sorted(answered) and set(stored.values()) == {1}


async def test_a_torn_write_at_the_journals_end_is_read_up_to_it(api, ctx, second, catalog, monkeypatch):
    answered, path = await calls_left_behind(api, ctx, catalog, monkeypatch)
    last = os.path.join(path, max(os.listdir(path)))
    torn = journal.chunk(b'{"r": {"_id": "never-acknowledged"}}')
    with open(last, "ab") as fh:
        fh.write(torn[: len(torn) - 7])  # the crash came mid-write
    await second.meter.write_unwritten()
    assert not os.path.exists(path)
    stored = await stored_request_ids(ctx)
    assert sorted(stored) == sorted(answered) and set(stored.values()) == {1}


async def test_a_corrupt_chunk_mid_journal_stops_its_replay_and_the_journal_is_kept(
    api, ctx, second, catalog, monkeypatch, caplog
):
    answered, path = await calls_left_behind(api, ctx, catalog, monkeypatch)
    first = os.path.join(path, min(name for name in os.listdir(path) if name.endswith(".log")))
    with open(first, "r+b") as fh:
        fh.seek(journal.HEADER.size + 3)  # inside the first chunk's payload; whole chunks follow
        fh.write(b"#")
    with open(first, "rb") as fh:
        damaged = fh.read()
    before = await stored_request_ids(ctx)
    await second.meter.write_unwritten()
    assert await stored_request_ids(ctx) == before  # nothing of it replayed
    kept = path + ".corrupt"
    with open(os.path.join(kept, os.path.basename(first)), "rb") as fh:
        assert fh.read() == damaged  # as found, for the operator
    assert second.metrics.journals_corrupt == 1
    assert any(r.levelname == "CRITICAL" and "corrupt" in r.getMessage() for r in caplog.records)
    await second.meter.write_unwritten()  # not tried again at every upkeep
    assert second.metrics.journals_corrupt == 1 and os.path.isdir(kept)
    assert len(set(answered) - set(before)) == 5  # the calls the journal alone still knows


async def test_a_failed_journal_write_leaves_a_journal_that_replays(tmp_path, monkeypatch):
    """A write cut short (a full disk) fails its group's protection, not the journal: the half chunk is cut off,
    the next group goes to a new segment, and the journal replays (a half chunk with whole ones after it would read
    as corruption: nothing replayed)."""
    kept = journal.Journal(str(tmp_path), "db", "p1", group_ms=0, group_records=100)
    kept.open()
    record = {"_id": "p1-1", "account_id": "a", "lease": "p1", "ts": "2026-01-01T00:00:00+00:00", "credits": 1}
    await kept.append(record)
    real = os.write

    def full(fd, data):  # the disk takes half of the group
        monkeypatch.setattr(os, "write", real)  # once
        return real(fd, data[: len(data) // 2])

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError):
        await kept.append({**record, "_id": "p1-2"})
    await kept.append({**record, "_id": "p1-3"})
    assert kept.failures == 1
    await kept.close(remove=False)
    claim = journal.claim(kept.path)
    [(batch_id, records)] = claim.batches()
    assert batch_id == "p1-j0" and [r["_id"] for r in records] == ["p1-1", "p1-3"]
    claim.release()


async def test_a_kill_between_a_batchs_writes_is_made_whole_by_the_replay(api, ctx, second, catalog, monkeypatch):
    """A batch's writes are three (buckets, totals, the usage by month: storage/usage.py insert_batch). A process
    killed between them leaves the batch taken and unconfirmed in its journal; the replay writes the batch again
    under its id, which adds what was missing and nothing twice: the month's statement then agrees with /usage and
    with the books (with JOURNAL=off the gap stays: tests/billing/test_statement_attacks.py)."""
    user, key = await api.funded_key()
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    answers = [await api.call("GET", path, key=key["key"]) for _ in range(6)]
    assert [status for status, _, _ in answers] == [200] * 6
    charged = sum(int(headers["X-Credits-Charged"]) for _, _, headers in answers)

    async def killed(batch_id, records):
        raise SystemError("killed between the batch's totals and its usage by month")

    monkeypatch.setattr(ctx.meter.usage.months, "add_batch", killed)
    with pytest.raises(SystemError):
        await ctx.meter.flush()  # buckets and totals written, the usage by month not
    monkeypatch.undo()
    await ctx.meter.journal.close(remove=False)  # the process is gone
    ctx.meter.journal = None
    await second.meter.write_unwritten()  # the next start (or a lease upkeep) replays what it left
    # Read by the other process: the dead one's buffer is gone with it.
    account_id = (await api.call("GET", "/auth/me", token=user["token"]))[1]["account_id"]
    statements = second.view.services.statements
    statement = await statements.statement(account_id, (await statements.available(account_id))[0])
    assert statement.reconciled is True, statement.differences
    assert statement.credits_charged == charged > 0 and statement.calls == 6
    assert sorted((await stored_request_ids(ctx)).values()) == [1] * 6
