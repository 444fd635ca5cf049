"""`./dev bench --static`: the gateway's own cost against a bare proxy, with an upstream that costs nothing.

nginx serves one recorded sandbox page (a 20-post `advanced_search` answer) for every path, so the
gateway and the bare Tornado proxy (bench/baseline.py, the same curl client) are measured on their own
work. wrk drives both with 32 connections, the gateway rotating over 300 keys of 10 accounts. In one run:

- saturation, in alternating rounds (gateway, bare, gateway, bare...) so that a neighbour's load on a
  shared machine hits both alike: the throughput ratio, and CPU ms per call of each process and of the
  database (from /proc), with the database round trips per call (the gateway's /metrics);
- p99 of both at a fixed rate of half the bare proxy's saturation (bench/load.py, open loop);
- whether each goal is met.

With --restricted-keys, 300 more keys of 10 more accounts carry every restriction of issue 14 (an expiry,
an endpoint scope, an address allowlist and a monthly credit budget), and each round measures both key
sets on the same gateway (unrestricted, restricted, bare...): what the checks and budgets cost.

Installs nginx and wrk with apt-get when they are missing and it runs as root; without nginx a small
asyncio server answers the recorded page instead, without wrk bench/load.py drives the load.
`--loop uvloop` runs both the gateway and the bare proxy on uvloop.

    ./dev bench --static [--seconds 6] [--rounds 3] [--loop asyncio|uvloop] [--restricted-keys]
"""

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable

from app.embedded import EmbeddedMongo, free_port
from bench import load
from bench.measure import (
    HERE,
    UPSTREAM_KEY,
    cpu_seconds,
    db_commands,
    ensure_packages,
    http,
    nginx_binary,
    spawn,
    start_nginx,
    wrk,
)
from config.settings import load as load_settings
from gateway_testing.stack import wait_for

ROOT = os.path.dirname(HERE)
ACCOUNTS, KEYS_PER_ACCOUNT = 10, 30
GOALS = {
    "throughput ratio gateway/bare >= 0.90": ("ratio_rps", 0.90, ">="),
    "gateway p99 <= 1.5 x bare p99 at half the bare saturation": ("p99_ratio", 1.5, "<="),
    "database round trips per call <= 0.02": ("db_round_trips_per_call", 0.02, "<="),
    "database CPU per call <= 0.05 ms": ("database_cpu_ms_per_call", 0.05, "<="),
}
# --restricted-keys (issue 14): the checks and budgets cost no measurable throughput. "Measurable" is the
# noise of this benchmark: adjacent rounds of the same gateway differ by a few per cent on a quiet machine.
RESTRICTED_GOALS = {
    "restricted keys keep >= 0.97 of the unrestricted throughput (median of paired rounds)": (
        "vs_unrestricted_rps_median",
        0.97,
    )
}
NGINX_CONF = """daemon off;
master_process off;
worker_processes 1;
error_log {work}/nginx-error.log;
pid {work}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {work}/nginx-tmp;
    proxy_temp_path {work}/nginx-tmp;
    fastcgi_temp_path {work}/nginx-tmp;
    uwsgi_temp_path {work}/nginx-tmp;
    scgi_temp_path {work}/nginx-tmp;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    server {{
        listen 127.0.0.1:{port};
        root {work};
        location / {{
            default_type application/json;
            try_files /page.json =404;
        }}
    }}
}}
"""
# Without nginx: the recorded page from a bare asyncio protocol (no HTTP framework), about as cheap.
STATIC_SERVER = """
import asyncio, sys
body = open(sys.argv[2], "rb").read()
answer = b"HTTP/1.1 200 OK\\r\\nContent-Type: application/json\\r\\nContent-Length: %d\\r\\n\\r\\n" % len(body) + body
class Static(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.data = transport, b""
    def data_received(self, data):
        self.data += data
        while b"\\r\\n\\r\\n" in self.data:
            _, self.data = self.data.split(b"\\r\\n\\r\\n", 1)
            self.transport.write(answer)
async def main():
    server = await asyncio.get_running_loop().create_server(Static, "127.0.0.1", int(sys.argv[1]))
    await server.serve_forever()
asyncio.run(main())
"""


def restrictions(args) -> dict:
    """With --restricted-keys, every check issue 14 adds runs on every call (none refuses one)."""
    if not getattr(args, "restricted_keys", False):
        return {}
    return {
        "expires_at": "2099-01-01T00:00:00Z",
        "allowed_endpoints": ["tweets", "users"],
        "allowed_ips": ["127.0.0.0/8", "::1/128"],
        "credit_limit": 10**14,
        "credit_limit_period": "month",
    }


def key_set(gateway_url: str, kind: str, properties: dict) -> tuple[list[tuple[str, str]], list[bytes]]:
    """ACCOUNTS new accounts of KEYS_PER_ACCOUNT keys with `properties`: the wrk plan and the raw requests
    (key i calls its own path: 300 distinct searches)."""
    plan = []
    for a in range(ACCOUNTS):
        user = http(
            "POST", gateway_url + "/auth/register", {"email": f"{kind}{a}@example.com", "password": "bench pass 1"}
        )
        for _ in range(KEYS_PER_ACCOUNT):
            key = http("POST", gateway_url + "/keys", {"name": "bench", **properties}, user["token"])
            plan.append((f"/social/tweet/advanced_search?query=from%3Auser{len(plan)}", key["key"]))
        http("POST", f"{gateway_url}/keys/{key['key_id']}/topup", {"credits": 10**12}, user["token"])
    return plan, [load.request_bytes("127.0.0.1", p, {"X-API-Key": k, "Cache-Control": "no-cache"}) for p, k in plan]


def ensure_tools() -> None:
    """nginx and wrk from apt when missing and we may install them (root); otherwise the fallbacks."""
    ensure_packages({"nginx": nginx_binary() is not None, "wrk": shutil.which("wrk") is not None})


def record_answer(work: str, call: Callable[[dict], str]) -> bytes:
    """The sandbox's own answer to `call(its catalog)` (a provider path and query), saved as the static upstream's
    one answer (`work`/page.json)."""
    port = free_port()
    sandbox = spawn([sys.executable, "-m", "sandbox", "--port", str(port), "--api-key", UPSTREAM_KEY])
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(base + "/healthz", sandbox)
        catalog = json.loads(urllib.request.urlopen(base + "/sandbox/catalog").read())
        request = urllib.request.Request(f"{base}/twitter{call(catalog)}", headers={"X-API-Key": UPSTREAM_KEY})
        body = urllib.request.urlopen(request).read()
    finally:
        sandbox.terminate()
        sandbox.wait(10)
    with open(os.path.join(work, "page.json"), "wb") as fh:
        fh.write(body)
    return body


def record_page(work: str) -> str:
    """A 20-post advanced_search page from the sandbox, saved as the static upstream's one answer."""
    body = record_answer(work, lambda catalog: f"/tweet/advanced_search?query=from%3A{catalog['big_accounts'][0]}")
    page = json.loads(body)
    assert page["status"] == "success" and len(page["tweets"]) == 20, "the recorded page must hold 20 posts"
    return os.path.join(work, "page.json")


def start_upstream(work: str, page: str) -> tuple[subprocess.Popen, int, str]:
    port = free_port()
    if nginx_binary():
        proc = start_nginx(work, "nginx", NGINX_CONF.format(work=work, port=port))
        kind = "nginx"
    else:
        proc = spawn([sys.executable, "-c", STATIC_SERVER, str(port), page])
        kind = "asyncio static server (nginx not installed)"
    wait_for(f"http://127.0.0.1:{port}/", proc)
    return proc, port, kind


def drive(port: int, plan: list[tuple[str, str]], raw: list[bytes], seconds: float, connections: int) -> dict:
    if shutil.which("wrk"):
        return wrk(port, plan, seconds, connections)
    figures = asyncio.run(load.run("127.0.0.1", port, raw, seconds, connections))
    figures["errors"] = sum(n for status, n in figures["statuses"].items() if status != 200)
    return figures


def measured(port, plan, raw, seconds, connections, pids) -> tuple[dict, list[float]]:
    before = [cpu_seconds(p) for p in pids]
    figures = drive(port, plan, raw, seconds, connections)
    return figures, [cpu_seconds(p) - b for p, b in zip(pids, before)]


def run(args) -> dict:
    ensure_tools()
    work = tempfile.mkdtemp(prefix="gw-bench-static-")
    # The database as `serve` starts it (start_helpers): at EMBEDDED_DB_NICE.
    mongo = EmbeddedMongo(os.path.join(work, "db"), nice=load_settings().embedded_db_nice).start()
    procs: list[subprocess.Popen] = []
    loop_env = {"EVENT_LOOP": args.loop} if args.loop else {}
    try:
        page = record_page(work)
        upstream_proc, upstream_port, upstream_kind = start_upstream(work, page)
        procs.append(upstream_proc)
        upstream = f"http://127.0.0.1:{upstream_port}"
        gateway_port, bare_port = free_port(), free_port()
        gateway_log = open(os.path.join(work, "gateway.log"), "wb")
        gateway_args = [sys.executable, os.path.join(ROOT, "gateway.py"), "serve"]
        gateway_args += ["--host", "127.0.0.1", "--port", str(gateway_port)]
        gateway = subprocess.Popen(
            gateway_args,
            env={
                **os.environ,
                **loop_env,
                "MONGODB_URI": mongo.uri,
                "UPSTREAM_URL": upstream,
                "UPSTREAM_API_KEY": UPSTREAM_KEY,
                "DATA_DIR": work,
                "LOG_LEVEL": "INFO",  # as deployed: the access log is on, written to a file here
                "PLAN_RULES": json.dumps([{"name": "bench", "min_paid_usd": 0, "qps": 100000}]),
                "LOGIN_MAX_ATTEMPTS_PER_ADDRESS": "100000",
                "SIGNUP_MAX_PER_NETWORK": "100000",
                "MAX_KEYS_PER_ACCOUNT": str(KEYS_PER_ACCOUNT),
            },
            stdout=gateway_log,
            stderr=gateway_log,
        )
        procs.append(gateway)
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        wait_for(gateway_url + "/healthz", gateway)
        bare_args = [sys.executable, os.path.join(HERE, "baseline.py"), "--port", str(bare_port)]
        bare_args += ["--upstream", upstream, "--upstream-key", UPSTREAM_KEY]
        bare = spawn(bare_args, {"PYTHONPATH": ROOT, **loop_env})
        procs.append(bare)
        wait_for(f"http://127.0.0.1:{bare_port}/social/nothing", bare)

        # One key set per kind of key, each of its own ACCOUNTS accounts: unrestricted, and with
        # --restricted-keys also every key restricted, measured in the same rounds on the same gateway.
        kinds = ["unrestricted"] + (["restricted"] if getattr(args, "restricted_keys", False) else [])
        sets = {kind: key_set(gateway_url, kind, restrictions(args) if kind == "restricted" else {}) for kind in kinds}
        paths = [f"/social/tweet/advanced_search?query=from%3Auser{i}" for i in range(ACCOUNTS * KEYS_PER_ACCOUNT)]
        bare_plan = [(p, "") for p in paths]
        bare_raw = [load.request_bytes("127.0.0.1", p, {}) for p in paths]

        # Warm: every key once (its cache entry, its account's lease, its budget's first slice), then
        # both at saturation (lease refills, upstream connections, the database's first writes).
        for plan, raw in sets.values():
            for path, key in plan:
                urllib.request.urlopen(
                    urllib.request.Request(gateway_url + path, headers={"X-API-Key": key, "Cache-Control": "no-cache"})
                ).read()
            drive(gateway_port, plan, raw, 3, args.connections)
        drive(bare_port, bare_plan, bare_raw, 3, args.connections)

        rounds = {kind: [] for kind in [*kinds, "bare"]}
        cpu = {kind: {"process": 0.0, "database": 0.0, "commands": {}} for kind in rounds}
        for i in range(args.rounds):
            # ABBA: the key sets swap places every round, so that whatever the previous round leaves behind
            # (a flush, the database's checkpoint) falls on both alike.
            for kind in kinds if i % 2 == 0 else kinds[::-1]:
                commands_before = db_commands(gateway_url)
                figures, (used, db_used) = measured(
                    gateway_port, *sets[kind], args.seconds, args.connections, (gateway.pid, mongo.process.pid)
                )
                rounds[kind].append(figures)
                cpu[kind]["process"] += used
                cpu[kind]["database"] += db_used
                for name, count in db_commands(gateway_url).items():
                    delta = count - commands_before.get(name, 0)
                    if delta:
                        cpu[kind]["commands"][name] = cpu[kind]["commands"].get(name, 0) + int(delta)
            figures, (used,) = measured(bare_port, bare_plan, bare_raw, args.seconds, args.connections, (bare.pid,))
            rounds["bare"].append(figures)
            cpu["bare"]["process"] += used
        calls = {kind: sum(r["requests"] for r in rounds[kind]) for kind in rounds}

        half = calls["bare"] / (args.seconds * args.rounds) / 2
        time.sleep(1)  # let the last saturation's queues drain
        fixed = {
            "bare": asyncio.run(load.run("127.0.0.1", bare_port, bare_raw, args.seconds, args.connections, rate=half))
        }
        for kind in kinds:
            raw = sets[kind][1]
            fixed[kind] = asyncio.run(
                load.run("127.0.0.1", gateway_port, raw, args.seconds, args.connections, rate=half)
            )

        def figures_of(kind: str) -> dict:
            n = max(calls[kind], 1)
            return {
                "rps": round(calls[kind] / (args.seconds * args.rounds), 1),
                "ratio_rps": round(calls[kind] / max(calls["bare"], 1), 3),
                # Per round, against the bare round beside it: how much the ratio moves on this machine.
                "round_ratios": [
                    round(g["requests"] / max(b["requests"], 1), 3) for g, b in zip(rounds[kind], rounds["bare"])
                ],
                "cpu_ms_per_call": round(cpu[kind]["process"] * 1000 / n, 3),
                "database_cpu_ms_per_call": round(cpu[kind]["database"] * 1000 / n, 4),
                "db_round_trips_per_call": round(sum(cpu[kind]["commands"].values()) / n, 5),
                "db_commands_during_saturation": cpu[kind]["commands"],
                "errors": sum(r.get("errors", 0) for r in rounds[kind]),
                "p99_ms": fixed[kind]["p99_ms"],
            }

        plain = figures_of("unrestricted")
        result = {
            "mode": "static upstream",
            "upstream": upstream_kind,
            "load": "wrk" if shutil.which("wrk") else "bench/load.py",
            "loop": args.loop or "defaults (gateway: EVENT_LOOP's default; bare proxy: asyncio)",
            "machine": {"cores": os.cpu_count()},
            "settings": {"seconds": args.seconds, "rounds": args.rounds, "connections": args.connections},
            "keys": ACCOUNTS * KEYS_PER_ACCOUNT,
            "restricted_keys": "restricted" in sets,
            "accounts": ACCOUNTS,
            "page_bytes": os.path.getsize(page),
            "gateway_rps": plain["rps"],
            "bare_rps": round(calls["bare"] / (args.seconds * args.rounds), 1),
            "ratio_rps": plain["ratio_rps"],
            "round_ratios": plain["round_ratios"],
            "gateway_cpu_ms_per_call": plain["cpu_ms_per_call"],
            "bare_cpu_ms_per_call": round(cpu["bare"]["process"] * 1000 / max(calls["bare"], 1), 3),
            "database_cpu_ms_per_call": plain["database_cpu_ms_per_call"],
            "db_round_trips_per_call": plain["db_round_trips_per_call"],
            "db_commands_during_saturation": plain["db_commands_during_saturation"],
            "errors": {kind: sum(r.get("errors", 0) for r in rounds[kind]) for kind in rounds},
            "rounds": rounds,
            "fixed_rate": {"rate": round(half, 1), **fixed},
        }
        result["cpu_ratio"] = round(result["bare_cpu_ms_per_call"] / max(result["gateway_cpu_ms_per_call"], 1e-9), 3)
        result["p99_ratio"] = round(fixed["unrestricted"]["p99_ms"] / max(fixed["bare"]["p99_ms"], 1e-9), 3)
        result["goals"] = {
            name: (result[field] >= bound if op == ">=" else result[field] <= bound)
            for name, (field, bound, op) in GOALS.items()
        }
        if "restricted" in sets:
            restricted = figures_of("restricted")
            restricted["vs_unrestricted_rps"] = round(calls["restricted"] / max(calls["unrestricted"], 1), 3)
            # Each restricted round against the unrestricted round just before it; the median is what a
            # neighbour's burst during one round cannot move.
            paired = [
                r["requests"] / max(u["requests"], 1) for r, u in zip(rounds["restricted"], rounds["unrestricted"])
            ]
            restricted["paired_rounds"] = [round(x, 3) for x in paired]
            restricted["vs_unrestricted_rps_median"] = round(statistics.median(paired), 3)
            restricted["vs_unrestricted_cpu"] = round(
                plain["cpu_ms_per_call"] / max(restricted["cpu_ms_per_call"], 1e-9), 3
            )
            result["restricted"] = restricted
            for name, (field, bound) in RESTRICTED_GOALS.items():
                result["goals"][name] = restricted[field] >= bound
        return result
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        mongo.stop()
        shutil.rmtree(work, ignore_errors=True)


def report(result: dict) -> str:
    fixed = result["fixed_rate"]
    lines = [
        f"static upstream ({result['upstream']}), {result['keys']} keys of {result['accounts']} accounts"
        f"{' (and as many restricted: expiry, scope, allowlist, budget)' if result.get('restricted_keys') else ''}, "
        f"{result['load']}, loop {result['loop']}",
        f"  saturation   gateway {result['gateway_rps']} req/s, bare proxy {result['bare_rps']} req/s, "
        f"ratio {result['ratio_rps']} (rounds {result['round_ratios']})",
        f"  CPU/call     gateway {result['gateway_cpu_ms_per_call']} ms, bare proxy {result['bare_cpu_ms_per_call']} ms, "
        f"database {result['database_cpu_ms_per_call']} ms (CPU ratio {result['cpu_ratio']})",
        f"  database     {result['db_round_trips_per_call']} round trips per call {result['db_commands_during_saturation']}",
        f"  at {fixed['rate']} req/s   p99 gateway {fixed['unrestricted']['p99_ms']} ms, bare {fixed['bare']['p99_ms']} ms "
        f"(ratio {result['p99_ratio']}); p50 {fixed['unrestricted']['p50_ms']} / {fixed['bare']['p50_ms']} ms",
    ]
    restricted = result.get("restricted")
    if restricted:
        lines += [
            f"  restricted   {restricted['rps']} req/s, ratio {restricted['ratio_rps']} (rounds {restricted['round_ratios']}), "
            f"{restricted['vs_unrestricted_rps']} of the unrestricted keys' throughput "
            f"(paired rounds {restricted['paired_rounds']}, median {restricted['vs_unrestricted_rps_median']})",
            f"               CPU/call {restricted['cpu_ms_per_call']} ms (unrestricted/restricted {restricted['vs_unrestricted_cpu']}), "
            f"database {restricted['database_cpu_ms_per_call']} ms, {restricted['db_round_trips_per_call']} round trips per call "
            f"{restricted['db_commands_during_saturation']}, p99 at {fixed['rate']} req/s {restricted['p99_ms']} ms",
        ]
    lines.append(f"  errors       {result['errors']}")
    lines += [f"  {'met   ' if ok else 'MISSED'} {name}" for name, ok in result["goals"].items()]
    return "\n".join(lines)
