"""Restarts that fail no call (issue 38's goal): `./dev bench --reload`.

`serve --workers 2` (SecantusDB and the sandbox, `--faults latency=700`: a 0.7 s provider, as their own
processes), one account with `--sockets` keys each with a resuming WebSocket client in this process
(bench/streams_clients.py) and busy filter rules feeding them, and another account's data calls at `--rate`
calls/s, open loop, on keep-alive connections (social/http1.py's pool: it honours `Connection: close` and, as
HTTP clients do, sends a GET again once when a reused idle connection was closed before any byte of its
answer) in a process of its own. A third of the way in, the CONFIG_FILE changes (`twitter_alias` from false to
true: a setting SIGHUP does not re-read) and the parent gets SIGUSR2. Reported:

- calls made, failed (not 200, or no answer: by kind), p50 / p99 / max, and the same for the calls scheduled
  in the 10 s after the signal;
- when the new code answered (the first `/twitter/...` answer that is not 404: a new worker) and when the last
  old worker had exited, in seconds after the signal;
- the WebSocket clients: reconnections, closes by code, connections lost without a close frame, reconnections
  refused (the key still held), events missed, received twice, and out of order (bench/streams_clients.tally),
  for every event written until the end;
- the gateway's log: warnings and errors.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime

import pymongo

from bench.measure import children
from bench.streams_clients import Client, tally
from gateway_testing.stack import GatewayProcess, Stack
from social.http1 import Http1Pool

LATENCY_MS = 700
RULES = 10  # busy rules (`lang:en`) feeding the sockets
RULE_INTERVAL = 2.0
AFTER_SIGNAL = 10.0  # seconds after SIGUSR2 whose calls are reported apart


class ReloadStack(Stack):
    def start_gateway(self) -> None:
        with open(self.log_path, "ab") as log:
            self.gateway = GatewayProcess(self.env(), self.port, 2, stdout=log, stderr=log).start()


# --- the data calls, in a process of their own -------------------------------------------------------------
async def _load(port: int, rate: float, seconds: float, plan: list[list[str]]) -> dict:
    """Open loop: call i is sent at start + i / rate whatever came back; its latency counts from then."""
    pool = Http1Pool(f"http://127.0.0.1:{port}", 10.0, 1 << 22)
    start = time.time()
    results: list[tuple[float, float, str]] = []  # (scheduled unix s, latency s, "200" or what went wrong)

    async def one(i: int, at: float) -> None:
        path, key = plan[i % len(plan)]
        headers = f"X-API-Key: {key}\r\nCache-Control: no-cache\r\n".encode()
        try:
            answer = await pool.get(f"http://127.0.0.1:{port}{path}", headers, 30.0)
            outcome = str(answer.status)
        except Exception as exc:
            outcome = type(exc).__name__
        results.append((at, time.time() - at, outcome))

    tasks, i = [], 0
    while (at := start + i / rate) < start + seconds:
        if (pause := at - time.time()) > 0:
            await asyncio.sleep(pause)
        tasks.append(asyncio.create_task(one(i, at)))
        i += 1
    await asyncio.gather(*tasks)
    pool.close()
    return {"results": results}


def _load_main(argv: list[str]) -> None:
    port, rate, seconds, plan_path = argv
    with open(plan_path) as fh:
        plan = json.load(fh)
    print(json.dumps(asyncio.run(_load(int(port), float(rate), float(seconds), plan))))


def _calls(results: list, since: float = 0.0, until: float = float("inf")) -> dict:
    chosen = [r for r in results if since <= r[0] < until]
    latencies = sorted(r[1] for r in chosen)
    failed: dict[str, int] = {}
    for _, _, outcome in chosen:
        if outcome != "200":
            failed[outcome] = failed.get(outcome, 0) + 1

    def pick(q: float) -> float | None:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 1) if latencies else None

    timeline: dict[int, dict[str, int]] = {}  # second since `since` -> {what went wrong: calls}
    for at, _, outcome in chosen:
        if outcome != "200":
            second = timeline.setdefault(int(at - since) if since else int(at - chosen[0][0]), {})
            second[outcome] = second.get(outcome, 0) + 1
    return {
        "calls": len(chosen),
        "failed": sum(failed.values()),
        "failed_by_kind": failed,
        "failed_by_second": timeline,
        "p50_ms": pick(0.5),
        "p99_ms": pick(0.99),
        "max_ms": round(latencies[-1] * 1000, 1) if latencies else None,
    }


# --- setup through the public API ----------------------------------------------------------------------------
def _ok(reply: tuple) -> dict:
    status, body, _ = reply
    if status != 200:
        raise RuntimeError(f"setup call answered {status}: {body}")
    return body


def _setup(stack: Stack, sockets: int) -> dict:
    user = _ok(stack.call("POST", "/auth/register", {"email": "reload@example.com", "password": "bench pass 1"}))
    token = user["token"]
    keys = [_ok(stack.call("POST", "/keys", {"name": f"k{i}"}, token=token)) for i in range(sockets)]
    _ok(stack.call("POST", f"/keys/{keys[0]['key_id']}/topup", {"credits": 10**12}, token=token))
    for n in range(RULES):
        body = {"tag": f"r{n}", "value": "lang:en", "interval_seconds": RULE_INTERVAL}
        rule_id = _ok(stack.call("POST", "/oapi/tweet_filter/add_rule", body, key=keys[0]["key"]))["rule_id"]
        body |= {"rule_id": rule_id, "is_effect": 1}
        _ok(stack.call("POST", "/oapi/tweet_filter/update_rule", body, key=keys[0]["key"]))
    data = _ok(stack.call("POST", "/auth/register", {"email": "data@example.com", "password": "bench pass 1"}))
    data_key = _ok(stack.call("POST", "/keys", {"name": "data"}, token=data["token"]))
    _ok(stack.call("POST", f"/keys/{data_key['key_id']}/topup", {"credits": 10**12}, token=data["token"]))
    catalog = json.loads(urllib.request.urlopen(stack.upstream + "/sandbox/catalog").read())
    paths = [f"/social/user/info?userName={u['userName']}" for u in catalog["users"][:50]]
    return {"keys": [k["key"] for k in keys], "plan": [[p, data_key["key"]] for p in paths]}


# --- the reload ----------------------------------------------------------------------------------------------
def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def _after(stamped: dict, event_id: str, signalled: float) -> float | None:
    return round(stamped[event_id] - signalled, 2) if event_id in stamped else None


def _zombie(pid: int) -> bool:
    """Exited, not yet reaped by its parent."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


async def _reload(stack: Stack, config_file: str) -> dict:
    """The CONFIG_FILE changed, SIGUSR2 to the parent; when the new code answered, when the old workers left."""
    parent = stack.gateway.proc.pid
    old = set(children(parent))
    with open(config_file, "w") as fh:
        fh.write("twitter_alias = true\n")
    signalled = time.time()
    os.kill(parent, signal.SIGUSR2)
    figures: dict = {"signalled_at": signalled, "old_pids": sorted(old)}
    probe = stack.url + "/twitter/user/info?userName=x"
    while time.time() - signalled < 120 and ("new_code_answered_s" not in figures or "old_exited_s" not in figures):
        if "new_code_answered_s" not in figures and await asyncio.to_thread(_status, probe) not in (404, 0):
            figures["new_code_answered_s"] = round(time.time() - signalled, 2)
        now = {pid for pid in children(parent) if not _zombie(pid)}
        if "old_exited_s" not in figures and not now & old and len(now) == len(old):
            figures["old_exited_s"] = round(time.time() - signalled, 2)
            figures["new_pids"] = sorted(now)
        await asyncio.sleep(0.05)
    return figures


async def _phases(stack: Stack, setup: dict, args, config_file: str, work: str) -> dict:
    url = stack.url.replace("http", "ws", 1) + "/social/tweet/websocket"
    clients = [Client(url, key) for key in setup["keys"]]
    tasks = [asyncio.create_task(c.run()) for c in clients]
    started = time.monotonic()
    while any(c.connections == 0 for c in clients) and time.monotonic() - started < 60:
        await asyncio.sleep(0.1)
    connected = sum(1 for c in clients if c.connections)
    all_connected = time.time()  # the events every client is to have: those written from here on
    plan_path = os.path.join(work, "plan.json")
    with open(plan_path, "w") as fh:
        json.dump(setup["plan"], fh)
    load = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.reload",
        "load",
        str(stack.port),
        str(args.rate),
        str(args.seconds),
        plan_path,
        stdout=asyncio.subprocess.PIPE,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # the project: bench.* imports from there
    )
    await asyncio.sleep(args.seconds / 3)
    reload = await _reload(stack, config_file)
    out, _ = await load.communicate()
    results = json.loads(out)["results"]
    db = pymongo.MongoClient(stack.mongo.uri, tz_aware=True)[stack.db_name]
    cutoff = time.time()
    await asyncio.sleep(3)  # the events written until the cut-off reach the clients
    window = {"$gt": datetime.fromtimestamp(all_connected, UTC), "$lte": datetime.fromtimestamp(cutoff, UTC)}
    events = list(db.stream_events.find({"created_at": window}))
    written = {e["_id"]: [(e["rule_id"], t["id"]) for t in e["tweets"]] for e in events}
    stamped = {e["_id"]: e["created_at"].timestamp() for e in events}
    deadline = time.monotonic() + 60  # a loaded machine: the resumes may take a while
    while time.monotonic() < deadline and any(set(written) - c.events.keys() for c in clients):
        await asyncio.sleep(0.5)
        for client in clients:
            client.drain()
    for client in clients:
        client.close()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    signalled = reload.pop("signalled_at")
    sockets = tally(clients, written, None)
    closes: dict[str, int] = {}
    for client in clients:
        for code in client.closes:
            closes[str(code)] = closes.get(str(code), 0) + 1
    sockets |= {"sockets_connected": connected, "closes_by_code": closes}
    waits = sorted(w for c in clients for w in c.reconnect_seconds)
    if waits:  # from the close to the resumed socket's `connected`
        sockets["reconnect_p50_s"] = round(waits[len(waits) // 2], 2)
        sockets["reconnect_max_s"] = round(waits[-1], 2)
    # Evidence: [client, event missed, its write (s after the signal), the events the client resumed from, theirs]
    missed = [(n, e) for n, c in enumerate(clients) for e in sorted(set(written) - c.events.keys())][:10]
    if missed:
        sockets["missed_sample"] = [
            [
                n,
                e,
                _after(stamped, e, signalled),
                clients[n].resumes,
                [_after(stamped, r, signalled) for r in clients[n].resumes],
            ]
            for n, e in missed
        ]
    sockets["lost_without_close_frame"] = closes.get("None", 0)
    return {
        "reload": reload,
        "calls": _calls(results, results[0][0] if results else 0.0),
        "calls_by_second_after_signal_failed": _calls(results, signalled)["failed_by_second"],
        "calls_in_10s_after_signal": _calls(results, signalled, signalled + AFTER_SIGNAL),
        "sockets": sockets,
    }


LOG_TROUBLE = re.compile(r"\b(ERROR|CRITICAL|Traceback|WARNING)\b")


def run(args) -> dict:
    work = tempfile.mkdtemp(prefix="gw-reload-")
    config_file = os.path.join(work, "gateway.toml")
    with open(config_file, "w") as fh:
        fh.write("twitter_alias = false\n")
    env = {
        # The machine's overload is not the reload's: a provider call the loaded sandbox answers late is not a
        # 504, and the account's calls are not refused for the provider's failures.
        "UPSTREAM_TIMEOUT": "60",
        "ACCOUNT_FAILURE_BUDGET": "1000000",
        "CONFIG_FILE": config_file,
        "MAX_KEYS_PER_ACCOUNT": str(args.sockets + 1),
        "STREAM_MIN_INTERVAL": str(RULE_INTERVAL),
        "LOG_LEVEL": "INFO",
    }
    stack = ReloadStack(work_dir=work, faults=f"latency={LATENCY_MS}", gateway_env=env)
    try:
        stack.start()
        setup = _setup(stack, args.sockets)
        result = {"rate": args.rate, "seconds": args.seconds, "sockets": args.sockets, "provider_ms": LATENCY_MS}
        result["load_average_before"] = os.getloadavg()[0]  # the machine is shared: its load, for the figures
        result |= asyncio.run(_phases(stack, setup, args, config_file, work))
        stack.stop_gateway()
        kept = os.path.join(os.path.dirname(args.out), "reload.log")
        shutil.copyfile(stack.log_path, kept)
        with open(kept, errors="replace") as fh:
            trouble = [line.rstrip() for line in fh if LOG_TROUBLE.search(line)]
        result["gateway_log"] = {"path": kept, "warnings_and_errors": len(trouble), "first": trouble[:5]}
        return result
    finally:
        stack.stop()
        shutil.rmtree(work, ignore_errors=True)


def report(result: dict) -> str:
    calls, after, reload, sockets = (
        result["calls"],
        result["calls_in_10s_after_signal"],
        result["reload"],
        result["sockets"],
    )
    rows = [
        (
            "data calls/s (open loop) / provider latency / seconds / the machine's load average at the start",
            f"{result['rate']:g} / {result['provider_ms']} ms / {result['seconds']:g} / "
            f"{result['load_average_before']:.1f}",
        ),
        ("calls / failed", f"{calls['calls']} / {calls['failed']} {calls['failed_by_kind'] or ''}".rstrip()),
        ("latency p50 / p99 / max (ms)", f"{calls['p50_ms']} / {calls['p99_ms']} / {calls['max_ms']}"),
        ("calls in the 10 s after SIGUSR2 / failed", f"{after['calls']} / {after['failed']}"),
        ("those: p50 / p99 / max (ms)", f"{after['p50_ms']} / {after['p99_ms']} / {after['max_ms']}"),
        ("new code (CONFIG_FILE change) answered after (s)", reload.get("new_code_answered_s")),
        ("old workers all exited after (s)", reload.get("old_exited_s")),
        ("worker pids before / after", f"{reload['old_pids']} / {reload.get('new_pids')}"),
        (
            "WebSocket clients connected / reconnected",
            f"{sockets['sockets_connected']} / {sockets['clients_reconnected']}",
        ),
        ("closes by code", sockets["closes_by_code"]),
        ("close to resumed, p50 / max (s)", f"{sockets.get('reconnect_p50_s')} / {sockets.get('reconnect_max_s')}"),
        ("connections lost without a close frame", sockets["lost_without_close_frame"]),
        ("reconnections refused (key still held)", sockets["reconnections_refused_while_held"]),
        (
            "events written / missed / received twice",
            f"{sockets['events_written']} / {sockets['socket_events_missed']} / {sockets['socket_events_twice']}",
        ),
        (
            "gateway log: warnings and errors",
            f"{result['gateway_log']['warnings_and_errors']} ({result['gateway_log']['path']})",
        ),
    ]
    lines = ["| `./dev bench --reload` | |", "|---|---|"]
    lines += [f"| {label} | {value} |" for label, value in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    _load_main(sys.argv[2:])
