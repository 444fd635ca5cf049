"""A gateway that owns its embedded database (no MONGODB_URI) supervises it: a database that dies is started
again on the same port and data, counted on /metrics, and calls go on; a stop while the database cannot
answer ends within the drain time, keeps the unwritten usage under DATA_DIR (its journal, or with JOURNAL=off
unwritten-usage/), and the next start writes it once, so every served call is billed exactly once and the lease
accounting adds up (a power loss, every process killed at once: tests/metering/test_journal.py)."""

import asyncio
import os
import re
import signal

import pytest
from support import Gateway, account_with_keys, ledger_of
from tornado.httpclient import HTTPClientError

from accounting import journal, unwritten
from app.embedded import EmbeddedMongo, free_port

pytestmark = pytest.mark.gen_test(timeout=240)
INITIAL = 1_000_000
DB = "gw"


def database_pid(gw: Gateway) -> int:
    """The embedded database's process: a child of the gateway (of its parent with --workers) running secantus."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                parent = int(fh.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                command = fh.read()
        except OSError:
            continue
        if parent == gw.proc.pid and b"secantus" in command:
            return int(pid)
    raise AssertionError("no embedded database process")


class Clients:
    """Four clients calling one after another until stopped; each answer kept (None: no answer at all)."""

    def __init__(self, gw: Gateway, key: str, path: str):
        self.answers: list = []
        self.running = True
        self.tasks = [asyncio.ensure_future(self._call(gw, key, path)) for _ in range(4)]

    async def _call(self, gw: Gateway, key: str, path: str) -> None:
        while self.running:
            try:
                answer = await gw.call("GET", path, **{"X-API-Key": key})
            except (OSError, HTTPClientError):
                answer = None
            self.answers.append(answer)
            if answer is None or answer.code != 200:
                await asyncio.sleep(0.1)

    @property
    def served(self) -> list:
        return [a for a in self.answers if a is not None and a.code == 200]

    async def until_served(self, count: int) -> None:
        for _ in range(1200):
            if len(self.served) >= count:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{len(self.served)} calls served, {count} expected; answers {self.codes()}")

    def codes(self) -> set:
        return {a.code if a is not None else None for a in self.answers}

    async def stop(self) -> None:
        self.running = False
        await asyncio.gather(*self.tasks)


async def metric(gw: Gateway, name: str) -> float | None:
    body = (await gw.call("GET", "/metrics")).body.decode()
    values = re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", body, re.M)
    return sum(float(v) for v in values) if values else None


async def eventually(check, what: str, seconds: float = 90) -> None:
    """Waits for `check()` (async) to hold: a bound on a hang, not a timing assertion."""
    for _ in range(int(seconds / 0.2)):
        if await check():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"never: {what}")


async def reconcile(data_dir: str, account_id: str, served: list) -> None:
    """Exactly once: one stored record per served call, the charges the clients saw, every lease closed, and
    credits added = balance + charged usage."""
    database = EmbeddedMongo(os.path.join(data_dir, "db")).start()
    try:
        account, records = await ledger_of(database.uri, DB, account_id)
    finally:
        database.stop()
    charged = sum(int(a.headers["X-Credits-Charged"]) for a in served)
    assert sorted(r["request_id"] for r in records if r["status"] == 200) == sorted(
        a.headers["X-Request-ID"] for a in served
    )
    assert len({r["_id"] for r in records}) == len(records)
    assert sum(r["credits"] for r in records) == charged
    assert account["leases"] == {} and account["credits"] == INITIAL - charged


@pytest.mark.parametrize("workers", [1, 2])
async def test_a_killed_embedded_database_is_started_again_and_calls_go_on(workers, upstream_url, catalog, tmp_path):
    gw = await Gateway("", upstream_url, DB, workers=workers, DATA_DIR=str(tmp_path)).launch()
    user, (key,), _ = await account_with_keys(gw, INITIAL, 1)
    clients = Clients(gw, key, f"/social/user/info?userName={catalog['users'][0]['userName']}")
    await clients.until_served(20)
    assert await metric(gw, "gateway_embedded_db_restarts_total") == 0
    killed = database_pid(gw)
    os.kill(killed, signal.SIGKILL)

    async def back() -> bool:
        return await metric(gw, "gateway_embedded_db_restarts_total") == 1

    await eventually(back, "the database restarted")
    assert database_pid(gw) != killed
    await eventually(lambda: ready(gw), "/readyz says ready")
    await clients.until_served(len(clients.served) + 20)  # served again, through the restarted database
    await clients.stop()
    assert clients.codes() <= {200, 503}  # the database-down mode meanwhile: served from memory, or 503
    assert await asyncio.to_thread(gw.stop) == 0
    await reconcile(str(tmp_path), user["account_id"], clients.served)


async def ready(gw: Gateway) -> bool:
    return (await gw.call("GET", "/readyz")).code == 200


@pytest.mark.parametrize(("workers", "kept_in"), [(1, unwritten.FOLDER), (2, journal.FOLDER)])
async def test_a_stop_while_the_database_cannot_answer_keeps_the_usage_and_the_next_start_writes_it_once(
    workers, kept_in, upstream_url, catalog, tmp_path
):
    on = "on" if kept_in == journal.FOLDER else "off"
    port, env = free_port(), {"DATA_DIR": str(tmp_path), "DRAIN_SECONDS": "2", "JOURNAL": on}
    gw = await Gateway("", upstream_url, DB, port, workers, **env).launch()
    user, (key,), _ = await account_with_keys(gw, INITIAL, 1)
    clients = Clients(gw, key, f"/social/user/info?userName={catalog['users'][0]['userName']}")
    await clients.until_served(60)
    os.kill(database_pid(gw), signal.SIGSTOP)  # frozen: not exited, so not restarted; nothing it is sent returns
    await clients.until_served(len(clients.served) + 20)  # served from memory, their usage only in the buffer
    await clients.stop()
    gw.proc.send_signal(signal.SIGTERM)
    # Generous bound (DRAIN_SECONDS is 2): before, the final flush was retried for minutes.
    assert await asyncio.to_thread(gw.proc.wait, 60) == 0
    kept = os.listdir(tmp_path / kept_in)  # one file (or journal) per process that had records left
    assert 1 <= len(kept) <= workers and all(name.startswith(DB + ".") for name in kept), kept
    again = await Gateway("", upstream_url, DB, port, workers, **env).launch()  # writes them, reclaims the old leases
    assert set(os.listdir(tmp_path / kept_in)) & set(kept) == set()
    assert await asyncio.to_thread(again.stop) == 0
    await reconcile(str(tmp_path), user["account_id"], clients.served)


async def test_usage_kept_on_disk_is_charged_once_when_another_process_reclaimed_its_lease_meanwhile(
    upstream_url, catalog, tmp_path
):
    database = EmbeddedMongo(str(tmp_path / "db")).start()  # the test's own, to freeze under one gateway of two
    try:
        env = {"DATA_DIR": str(tmp_path / "first"), "DRAIN_SECONDS": "2"}
        first = await Gateway(database.uri, upstream_url, DB, **env).launch()
        user, (key,), _ = await account_with_keys(first, INITIAL, 1)
        clients = Clients(first, key, f"/social/user/info?userName={catalog['users'][0]['userName']}")
        await clients.until_served(60)
        os.kill(database.process.pid, signal.SIGSTOP)
        await clients.until_served(len(clients.served) + 20)
        await clients.stop()
        assert await asyncio.to_thread(first.stop) == 0
        kept = os.listdir(tmp_path / "first" / journal.FOLDER)
        assert len(kept) == 1
        os.kill(database.process.pid, signal.SIGCONT)
        # Another gateway finds the stopped one silent and reclaims its lease, counting only the usage stored.
        other = await Gateway(
            database.uri, upstream_url, DB, DATA_DIR=str(tmp_path / "other"), LEASE_TIMEOUT="3"
        ).launch()

        async def reclaimed() -> bool:
            return (await ledger_of(database.uri, DB, user["account_id"]))[0]["leases"] == {}

        await eventually(reclaimed, "the stopped gateway's lease was reclaimed")
        again = await Gateway(database.uri, upstream_url, DB, **env).launch()  # writes the kept usage
        assert kept[0] not in os.listdir(tmp_path / "first" / journal.FOLDER)
        for gw in (again, other):
            assert await asyncio.to_thread(gw.stop) == 0
        account, records = await ledger_of(database.uri, DB, user["account_id"])
        charged = sum(int(a.headers["X-Credits-Charged"]) for a in clients.served)
        assert len([r for r in records if r["status"] == 200]) == len(clients.served)
        assert sum(r["credits"] for r in records) == charged
        assert account["leases"] == {} and account["credits"] == INITIAL - charged
    finally:
        database.stop()
