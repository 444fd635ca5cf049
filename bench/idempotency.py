"""What an Idempotency-Key costs a data call: one gateway at a fixed rate against a static upstream (the recorded
page of bench/static.py), calls without the header and calls with a fresh key each, in alternating rounds on the
same gateway. Reports CPU per call of the gateway and of the database (from /proc) and database round trips per
call (the gateway's /metrics), and what the key adds. A fixed rate, well under saturation, keeps the run light
and the two kinds comparable; `./dev bench --static` measures the calls without the header at saturation.

    .venv/bin/python -m bench.idempotency [--rate 200] [--seconds 8] [--rounds 2]
"""

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid

from app.embedded import EmbeddedMongo, free_port
from bench import load
from bench.measure import UPSTREAM_KEY, cpu_seconds, db_commands, http
from bench.static import record_page, start_upstream
from config.settings import load as load_settings
from gateway_testing.stack import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ACCOUNTS, KEYS_PER_ACCOUNT = 4, 5


def key_plan(gateway_url: str) -> list[tuple[str, str]]:
    plan = []
    for a in range(ACCOUNTS):
        user = http("POST", gateway_url + "/auth/register", {"email": f"i{a}@example.com", "password": "bench pass 1"})
        for _ in range(KEYS_PER_ACCOUNT):
            key = http("POST", gateway_url + "/keys", {"name": "bench"}, user["token"])
            plan.append((f"/social/tweet/advanced_search?query=from%3Auser{len(plan)}", key["key"]))
        http("POST", f"{gateway_url}/keys/{key['key_id']}/topup", {"credits": 10**12}, user["token"])
    return plan


def requests(plan: list[tuple[str, str]], count: int, keyed: bool) -> list[bytes]:
    """`count` raw requests over the plan's keys; keyed: each with an Idempotency-Key of its own (a run sends at
    most `count`, so no key is sent twice)."""
    out = []
    for i in range(count):
        path, key = plan[i % len(plan)]
        # Live reads (not the answer cache): what the key adds to a provider-bound call.
        headers = {
            "X-API-Key": key,
            "Cache-Control": "no-cache",
            **({"Idempotency-Key": uuid.uuid4().hex} if keyed else {}),
        }
        out.append(load.request_bytes("127.0.0.1", path, headers))
    return out


def run(args) -> dict:
    work = tempfile.mkdtemp(prefix="gw-bench-idem-")
    mongo = EmbeddedMongo(os.path.join(work, "db"), nice=load_settings().embedded_db_nice).start()
    procs: list[subprocess.Popen] = []
    try:
        upstream, upstream_port, upstream_kind = start_upstream(work, record_page(work))
        procs.append(upstream)
        port = free_port()
        log = open(os.path.join(work, "gateway.log"), "wb")
        gateway = subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "gateway.py"), "serve", "--host", "127.0.0.1", "--port", str(port)],
            env={
                **os.environ,
                "MONGODB_URI": mongo.uri,
                "UPSTREAM_URL": f"http://127.0.0.1:{upstream_port}",
                "UPSTREAM_API_KEY": UPSTREAM_KEY,
                "DATA_DIR": work,
                "LOG_LEVEL": "INFO",
                "PLAN_RULES": json.dumps([{"name": "bench", "min_paid_usd": 0, "qps": 100000}]),
            },
            stdout=log,
            stderr=log,
        )
        procs.append(gateway)
        url = f"http://127.0.0.1:{port}"
        wait_for(url + "/healthz", gateway)
        plan = key_plan(url)
        count = int(args.rate * args.seconds * 1.2)
        asyncio.run(load.run("127.0.0.1", port, requests(plan, count, False), 3, 8, rate=args.rate))  # warm
        totals = {kind: {"calls": 0, "gateway": 0.0, "database": 0.0, "commands": {}} for kind in ("plain", "keyed")}
        for _ in range(args.rounds):
            for kind in ("plain", "keyed"):
                raw = requests(plan, count, kind == "keyed")
                before, commands = (cpu_seconds(gateway.pid), cpu_seconds(mongo.process.pid)), db_commands(url)
                figures = asyncio.run(load.run("127.0.0.1", port, raw, args.seconds, 8, rate=args.rate))
                total = totals[kind]
                total["calls"] += figures["statuses"].get(200, 0)
                total["gateway"] += cpu_seconds(gateway.pid) - before[0]
                total["database"] += cpu_seconds(mongo.process.pid) - before[1]
                for name, n in db_commands(url).items():
                    if n - commands.get(name, 0):
                        total["commands"][name] = total["commands"].get(name, 0) + int(n - commands.get(name, 0))
        result = {"upstream": upstream_kind, "rate": args.rate, "seconds": args.seconds, "rounds": args.rounds}
        for kind, total in totals.items():
            calls = max(total["calls"], 1)
            result[kind] = {
                "calls": total["calls"],
                "gateway_cpu_ms_per_call": round(total["gateway"] * 1000 / calls, 3),
                "database_cpu_ms_per_call": round(total["database"] * 1000 / calls, 3),
                "db_round_trips_per_call": round(sum(total["commands"].values()) / calls, 3),
                "db_commands": total["commands"],
            }
        result["added_by_a_fresh_key"] = {
            name: round(result["keyed"][name] - result["plain"][name], 3)
            for name in ("gateway_cpu_ms_per_call", "database_cpu_ms_per_call", "db_round_trips_per_call")
        }
        return result
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(15)
        mongo.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=200.0, help="calls per second (open loop)")
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds per round and kind")
    parser.add_argument("--rounds", type=int, default=2)
    print(json.dumps(run(parser.parse_args()), indent=2))


if __name__ == "__main__":
    main()
