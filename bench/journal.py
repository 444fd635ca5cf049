"""`./dev bench --journal`: what the usage journal (accounting/journal.py) costs, and `--journal-soak`: that it loses
nothing across repeated kills.

--journal: the `--latency` closed loop (nginx `echo_sleep` provider, bench/latency.py; one model, one number of
calls in flight, one gateway process) with JOURNAL=on and JOURNAL=off side by side in one run, alternated ABBA
(on, off, off, on; `--rounds` blocks) so that a machine growing busier or quieter weighs on both alike. Reported:
each run's p50/p99 and CPU ms per 2xx answer, the p50 difference (per block, the mean of its on runs minus that of
its off runs; the median over blocks is judged: goal <= 2 ms) and the CPU per call difference (likewise, goal
<= 5 %), the disk's own fsync latency (400-byte appends
and fdatasync in the run's folder, before the runs) and the journal's fsync latency and group sizes as the
gateway measured them (gateway_journal_fsync_seconds, gateway_journal_group_records).

--journal-soak: `serve --workers 2` against the same provider (fixed 0.7 s: --models), `--connections` calls kept in
flight by a raw asyncio client (800 by default), and `--kills` times (20) SIGKILL of the worker with the most
connections, each once its predecessor's replacement is serving; then a clean stop and the books from the
database: every call answered 200 has exactly one usage record, no record is doubled, and for the account
credits added = balance + charged usage.

    ./dev bench --journal [--models longtail] [--connections 400] [--seconds 20] [--rounds 3] [--nice 10]
    ./dev bench --journal-soak [--kills 20] [--connections 800] [--models fixed] [--nice 10]
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.request

from app.embedded import EmbeddedMongo, free_port
from app.server import raise_open_file_limit
from bench import latency
from bench.measure import children
from config.settings import load as load_settings
from gateway_testing.stack import request, wait_for
from storage import db as database
from storage.usage import UsageStore

GOAL_P50_MS = 2.0
GOAL_CPU = 0.05


def disk_fsync(folder: str, count: int = 300) -> dict:
    """The disk's fdatasync latency for a small append, as the journal makes them (ms)."""
    path = os.path.join(folder, "fsync-probe")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    took = []
    try:
        for _ in range(count):
            os.write(fd, b"x" * 400)
            started = time.perf_counter()
            os.fdatasync(fd)
            took.append((time.perf_counter() - started) * 1000)
    finally:
        os.close(fd)
        os.remove(path)
    took.sort()
    return {"p50_ms": round(took[len(took) // 2], 3), "p99_ms": round(took[int(len(took) * 0.99)], 3)}


def histogram(url: str, name: str) -> tuple[list[tuple[float, float]], float, float]:
    """(cumulative buckets [(le, count)], sum, count) of one histogram on the gateway's /metrics."""
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    buckets = [
        (float(le), float(n))
        for le, n in re.findall(rf'^{name}_bucket\{{[^}}]*le="([^"]+)"[^}}]*\}} (\S+)$', text, re.M)
        if le != "+Inf"
    ]
    total = sum(float(v) for v in re.findall(rf"^{name}_sum(?:\{{[^}}]*\}})? (\S+)$", text, re.M))
    count = sum(float(v) for v in re.findall(rf"^{name}_count(?:\{{[^}}]*\}})? (\S+)$", text, re.M))
    return buckets, total, count


def quantile(buckets: list[tuple[float, float]], count: float, q: float) -> float | None:
    """The bucket bound under which the q-quantile falls."""
    return next((le for le, n in buckets if n >= q * count), None) if count else None


def journal_figures(before: tuple, after: tuple, scale: float) -> dict:
    buckets = [(le, n - nb) for (le, n), (_, nb) in zip(after[0], before[0] or [(0, 0)] * len(after[0]))]
    count = after[2] - before[2]
    return {
        "count": int(count),
        "mean": round((after[1] - before[1]) / count * scale, 3) if count else None,
        "p50_at_most": quantile(buckets, count, 0.5) and round(quantile(buckets, count, 0.5) * scale, 3),
        "p99_at_most": quantile(buckets, count, 0.99) and round(quantile(buckets, count, 0.99) * scale, 3),
    }


def one_run(work, mongo, upstream, keys, plan, args, on: bool) -> dict:
    settings = latency.gateway_settings(upstream, args, {"JOURNAL": "on" if on else "off"})
    gateway, pids = latency.start_gateway(work, mongo, 1, settings)
    try:
        for path, key in plan[: len(keys)]:
            request("GET", gateway.url + path, headers={"X-API-Key": key, "Cache-Control": "no-cache"})
        fsync_before = histogram(gateway.url, "gateway_journal_fsync_seconds")
        group_before = histogram(gateway.url, "gateway_journal_group_records")
        figures = latency.closed_loop(gateway.port, plan, args, args.connections[0], pids)
        run = {
            "journal": "on" if on else "off",
            "p50_ms": figures["p50_ms"],
            "p99_ms": figures["p99_ms"],
            "ok": figures["ok"],
            "cpu_ms_per_2xx": figures["cpu_ms_per_2xx"],
            "errors": {s: n for s, n in figures["statuses"].items() if not 200 <= int(s) < 300},
        }
        if on:
            run["fsync_ms"] = journal_figures(
                fsync_before, histogram(gateway.url, "gateway_journal_fsync_seconds"), 1000
            )
            run["group_records"] = journal_figures(
                group_before, histogram(gateway.url, "gateway_journal_group_records"), 1
            )
        return run
    finally:
        latency.stop_gateway(gateway)


def prioritize(nice: int) -> None:
    """This process and every process it starts from now on (the gateway, the provider, the database, wrk) at nice
    -`nice`: on a machine others share, their load weighs less on the figures (root)."""
    if nice:
        os.setpriority(os.PRIO_PROCESS, 0, -nice)


@contextlib.contextmanager
def stack(args, prefix: str):
    """A work directory, the embedded database and the nginx provider of `--latency`: (work, mongo, the provider's
    URL for the first model), all stopped and removed after."""
    latency.ensure_tools()
    raise_open_file_limit()
    prioritize(args.nice)
    work = tempfile.mkdtemp(prefix=prefix)
    mongo = EmbeddedMongo(os.path.join(work, "db"), nice=load_settings().embedded_db_nice).start()
    provider = None
    try:
        latency.record_page(work)
        ports = {name: free_port() for name in ("fixed", "longtail", "keypool")}
        provider = latency.start_nginx(work, "provider", latency.provider_conf(work, ports))
        for port in ports.values():
            wait_for(f"http://127.0.0.1:{port}/", provider)
        yield work, mongo, f"http://127.0.0.1:{ports[latency.PORT_OF[args.models[0]]]}"
    finally:
        if provider is not None:
            provider.terminate()
            provider.wait(15)
        mongo.stop()
        shutil.rmtree(work, ignore_errors=True)


def run(args) -> dict:
    with stack(args, "gw-bench-journal-") as (work, mongo, upstream):
        model = args.models[0]
        result = {
            "model": model,
            "connections": args.connections[0],
            "seconds": args.seconds,
            "machine": {"cores": os.cpu_count(), "load_average": os.getloadavg()},
            "disk_fsync": disk_fsync(work),
            "runs": [],
        }
        gateway, _ = latency.start_gateway(work, mongo, 1, latency.gateway_settings(upstream, args))
        try:
            _, keys = latency.customer(gateway.url, "journal@example.com", latency.KEYS)
        finally:
            latency.stop_gateway(gateway)
        plan = latency.request_plan(keys, model)
        for i in range(args.rounds):
            for on in (True, False, False, True):  # ABBA
                print(f"bench: journal {'on' if on else 'off'} (round {i + 1})...", file=sys.stderr, flush=True)
                result["runs"].append(one_run(work, mongo, upstream, keys, plan, args, on))
        # Each ABBA block gives one difference (the mean of its two on runs minus that of its two off runs): a
        # machine busier in one block than another moves both sides of it. The median over blocks is judged.
        blocks = [result["runs"][i : i + 4] for i in range(0, len(result["runs"]), 4)]
        p50s, cpus = [], []
        for block in blocks:
            on = [r for r in block if r["journal"] == "on"]
            off = [r for r in block if r["journal"] == "off"]
            p50s.append(statistics.fmean(r["p50_ms"] for r in on) - statistics.fmean(r["p50_ms"] for r in off))
            cpus.append(
                statistics.fmean(r["cpu_ms_per_2xx"] for r in on) / statistics.fmean(r["cpu_ms_per_2xx"] for r in off)
                - 1
            )
        p50, cpu = statistics.median(p50s), statistics.median(cpus)
        result["p50_added_ms_by_block"] = [round(x, 2) for x in p50s]
        result["cpu_added_by_block"] = [round(x, 4) for x in cpus]
        result["p50_added_ms"] = round(p50, 2)
        result["cpu_added"] = round(cpu, 4)
        result["nice"] = args.nice
        result["goals"] = {
            f"p50 <= off + {GOAL_P50_MS:g} ms": p50 <= GOAL_P50_MS,
            f"CPU per call <= off + {GOAL_CPU:.0%}": cpu <= GOAL_CPU,
            "0 errors": not any(r["errors"] for r in result["runs"]),
        }
        return result


def report(result: dict) -> str:
    disk = result["disk_fsync"]
    lines = [
        f"JOURNAL on vs off, ABBA: {result['model']} provider, {result['connections']} in flight, one process, "
        f"{result['seconds']:g} s per run; load average at start "
        f"{' / '.join(f'{x:.1f}' for x in result['machine']['load_average'])}; "
        f"the disk's fdatasync of a 400-byte append: p50 {disk['p50_ms']} ms, p99 {disk['p99_ms']} ms",
        "",
        "| run | journal | 2xx | p50 ms | p99 ms | CPU ms / 2xx | fsync mean / p50 ≤ / p99 ≤ ms | records per group mean / p50 ≤ |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(result["runs"], 1):
        fsync, group = r.get("fsync_ms"), r.get("group_records")
        lines.append(
            f"| {i} | {r['journal']} | {r['ok']} | {r['p50_ms']} | {r['p99_ms']} | {r['cpu_ms_per_2xx']} | "
            + (f"{fsync['mean']} / {fsync['p50_at_most']} / {fsync['p99_at_most']} | " if fsync else "– | ")
            + (f"{group['mean']} / {group['p50_at_most']} |" if group else "– |")
        )
    lines += [
        "",
        f"p50 added by the journal (median over ABBA blocks): {result['p50_added_ms']:+.2f} ms "
        f"(blocks: {', '.join(f'{x:+.2f}' for x in result['p50_added_ms_by_block'])}); CPU per 2xx added: "
        f"{result['cpu_added']:+.1%} (blocks: {', '.join(f'{x:+.1%}' for x in result['cpu_added_by_block'])})"
        + (f"; measured processes at nice -{result['nice']}" if result.get("nice") else ""),
        "",
    ]
    lines += [f"- {'met' if ok else 'MISSED'}: {goal}" for goal, ok in result["goals"].items()]
    return "\n".join(lines)


# --- the soak: repeated kills under load -------------------------------------------------------------------------
class Load:
    """`count` connections, each calling one after another (keep-alive, reconnecting when its worker dies)."""

    def __init__(self, port: int, plan: list[tuple[str, str]], count: int):
        self.port, self.plan, self.running = port, plan, True
        self.served: list[tuple[str, int]] = []  # (request id, credits charged) of each 200
        self.statuses: collections.Counter = collections.Counter()
        self.tasks = [asyncio.ensure_future(self._loop(i)) for i in range(count)]

    async def _loop(self, i: int) -> None:
        n = i
        while self.running:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                await asyncio.sleep(0.1)
                continue
            try:
                while self.running:
                    path, key = self.plan[n % len(self.plan)]
                    n += 1
                    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\n\r\n".encode())
                    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                    headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:] if h)}
                    await reader.readexactly(int(headers.get("content-length", "0")))
                    status = int(head[0][9:12])
                    self.statuses[status] += 1
                    if status == 200:
                        self.served.append((headers["x-request-id"], int(headers["x-credits-charged"])))
                    elif headers.get("connection", "").lower() == "close":
                        break
                    else:
                        await asyncio.sleep(0.05)
            except (OSError, asyncio.IncompleteReadError, ValueError):
                self.statuses["connection lost"] += 1
            finally:
                writer.close()

    async def stop(self) -> None:
        self.running = False
        await asyncio.wait(self.tasks, timeout=30)


def _sockets(pid: int) -> int:
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except FileNotFoundError:
            pass
    return count


async def _registered(uri: str, db_name: str) -> set[str]:
    client = database.connect(uri)
    try:
        return {p["_id"] async for p in client[db_name].processes.find()}
    finally:
        await client.close()


async def _soak(work, mongo, upstream, args) -> dict:
    settings = latency.gateway_settings(upstream, args, {"MONGODB_DB": "soak", "LEASE_TIMEOUT": "300"})
    gateway, _ = await asyncio.to_thread(latency.start_gateway, work, mongo, 2, settings)
    try:
        token, keys = await asyncio.to_thread(latency.customer, gateway.url, "soak@example.com", latency.KEYS)
        account_id = (await asyncio.to_thread(latency.http, "GET", gateway.url + "/account", None, token))["account_id"]
        load = Load(gateway.port, latency.request_plan(keys, args.models[0]), args.connections[0])
        kills, replaced_in = 0, []
        while kills < args.kills:
            before = await _registered(mongo.uri, "soak")
            await asyncio.sleep(1.5)  # calls answered and still unflushed, calls in flight
            workers = children(gateway.proc.pid)
            os.kill(max(workers, key=_sockets), signal.SIGKILL)
            kills += 1
            killed_at = time.monotonic()
            for _ in range(1200):  # its replacement registered (after replaying the journal), the dead one gone
                now = await _registered(mongo.uri, "soak")
                if len(now) == 2 and len(now - before) == 1:
                    break
                await asyncio.sleep(0.05)
            replaced_in.append(round(time.monotonic() - killed_at, 2))
            print(f"bench: kill {kills}: replaced in {replaced_in[-1]} s", file=sys.stderr, flush=True)
        await asyncio.sleep(2)
        await load.stop()
    finally:
        await asyncio.to_thread(latency.stop_gateway, gateway)
    client = database.connect(mongo.uri)
    try:
        account = await client["soak"].accounts.find_one({"_id": account_id})
        records = await UsageStore(client["soak"]).records({"account_id": account_id})
    finally:
        await client.close()
    stored = collections.Counter(r["request_id"] for r in records)
    missing = [rid for rid, _ in load.served if stored[rid] == 0]
    doubled = [rid for rid, n in stored.items() if n > 1]
    usage = sum(r["credits"] for r in records)
    return {
        "kills": kills,
        "connections": args.connections[0],
        "replaced_in_s": replaced_in,
        "statuses": {str(k): v for k, v in load.statuses.items()},
        "served_200": len(load.served),
        "charged_200": sum(c for _, c in load.served),
        "records": len(records),
        "served_without_record": len(missing),
        "records_doubled": len(doubled),
        "credits_added": account["credits_added"],
        "balance": account["credits"],
        "usage": usage,
        "leases_left": account.get("leases") or {},
        "goals": {
            "every 200 has exactly one record": not missing and not doubled,
            "credits added = balance + charged usage": account["credits_added"] == account["credits"] + usage,
            "every lease closed": not account.get("leases"),
        },
    }


def soak(args) -> dict:
    with stack(args, "gw-bench-journal-soak-") as (work, mongo, upstream):
        return {"model": args.models[0], **asyncio.run(_soak(work, mongo, upstream, args))}


def soak_report(result: dict) -> str:
    lines = [
        f"{result['kills']} SIGKILLs of a worker of serve --workers 2, {result['connections']} calls in flight "
        f"({result['model']} provider): {result['served_200']} calls answered 200, {result['records']} usage records, "
        f"{result['served_without_record']} answered without a record, {result['records_doubled']} doubled; "
        f"credits added {result['credits_added']} = balance {result['balance']} + usage {result['usage']}"
        f" ({'holds' if result['goals']['credits added = balance + charged usage'] else 'DOES NOT HOLD'}); "
        f"statuses {result['statuses']}; replaced in {result['replaced_in_s']} s",
        "",
    ]
    lines += [f"- {'met' if ok else 'MISSED'}: {goal}" for goal, ok in result["goals"].items()]
    return "\n".join(lines)
