"""Where the gateway's cost goes: CPU per call at a fixed rate, with parts of the service turned off.

Runs the bare proxy and the gateway (fully on; without the change stream; without usage flushes;
without either) one after another at the same fixed rate of `user/info` calls, and prints each
process's CPU per call (from /proc) and the embedded database's, with p50/p99. A fixed rate below
saturation separates the gateway's own work from the queueing that saturation adds.

    .venv/bin/python -m bench.ablation [--rate 400] [--seconds 6]
"""

import argparse
import asyncio
import json
import os
import sys
import tempfile
import urllib.request

from app.embedded import EmbeddedMongo, free_port
from bench import load
from bench.measure import cpu_seconds, http, spawn
from gateway_testing.stack import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEY = "ablation-upstream-key"
VARIANTS = [
    ("gateway", {}),
    ("gateway, no change stream", {"COHERENCE": "off"}),
    ("gateway, no usage flushes", {"FLUSH_INTERVAL": "3600", "FLUSH_BATCH": "10000000", "BUFFER_MAX": "10000000"}),
    (
        "gateway, neither",
        {"COHERENCE": "off", "FLUSH_INTERVAL": "3600", "FLUSH_BATCH": "10000000", "BUFFER_MAX": "10000000"},
    ),
]


def measure(port: int, raw: list[bytes], pids: tuple[int, ...], rate: float, seconds: float) -> dict:
    asyncio.run(load.run("127.0.0.1", port, raw, 2, 16, rate=rate))  # warm up
    before = [cpu_seconds(p) for p in pids]
    figures = asyncio.run(load.run("127.0.0.1", port, raw, seconds, 16, rate=rate))
    used = [cpu_seconds(p) - b for p, b in zip(pids, before)]
    return {
        "cpu_ms_per_call": [round(u * 1000 / figures["requests"], 3) for u in used],
        "p50_ms": figures["p50_ms"],
        "p99_ms": figures["p99_ms"],
        "statuses": figures["statuses"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=400)
    parser.add_argument("--seconds", type=float, default=6)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="gw-ablation-")
    mongo = EmbeddedMongo(os.path.join(work, "db")).start()
    upstream_port = free_port()
    sandbox = spawn(
        [sys.executable, "-m", "sandbox", "--port", str(upstream_port), "--api-key", KEY], {"PYTHONPATH": ROOT}
    )
    upstream = f"http://127.0.0.1:{upstream_port}"
    wait_for(upstream + "/healthz", sandbox)
    names = [
        u["userName"] for u in json.loads(urllib.request.urlopen(upstream + "/sandbox/catalog").read())["users"][:20]
    ]
    paths = [f"/social/user/info?userName={n}" for n in names]
    results = {}
    try:
        port = free_port()
        proxy = spawn(
            [
                sys.executable,
                os.path.join(ROOT, "bench", "baseline.py"),
                "--port",
                str(port),
                "--upstream",
                upstream,
                "--upstream-key",
                KEY,
            ],
            {"PYTHONPATH": ROOT},
        )
        wait_for(f"http://127.0.0.1:{port}/social/x", proxy)
        raw = [load.request_bytes("127.0.0.1", p, {}) for p in paths]
        results["bare proxy"] = measure(port, raw, (proxy.pid,), args.rate, args.seconds)
        proxy.terminate()
        proxy.wait()
        for label, env in VARIANTS:
            port = free_port()
            gateway = spawn(
                [sys.executable, os.path.join(ROOT, "gateway.py"), "serve", "--host", "127.0.0.1", "--port", str(port)],
                {
                    "MONGODB_URI": mongo.uri,
                    "MONGODB_DB": f"ablation{port}",
                    "UPSTREAM_URL": upstream,
                    "UPSTREAM_API_KEY": KEY,
                    "DATA_DIR": work,
                    "LOG_LEVEL": "WARNING",
                    "LOGIN_MAX_ATTEMPTS_PER_ADDRESS": "100000",
                    "PLAN_RULES": json.dumps([{"name": "x", "min_paid_usd": 0, "qps": 100000}]),
                    **env,
                },
            )
            base = f"http://127.0.0.1:{port}"
            wait_for(base + "/healthz", gateway)
            keys = []
            for i in range(10):
                user = http(
                    "POST", base + "/auth/register", {"email": f"a{i}@example.com", "password": "ablation pass 1"}
                )
                key = http("POST", base + "/keys", {}, user["token"])
                http("POST", f"{base}/keys/{key['key_id']}/topup", {"credits": 10**12}, user["token"])
                keys.append(key["key"])
            raw = [
                load.request_bytes(
                    "127.0.0.1", paths[i % len(paths)], {"X-API-Key": keys[i % len(keys)], "Cache-Control": "no-cache"}
                )
                for i in range(len(paths) * len(keys))
            ]
            figures = measure(port, raw, (gateway.pid, mongo.process.pid), args.rate, args.seconds)
            figures["database_cpu_ms_per_call"] = figures["cpu_ms_per_call"].pop()
            results[label] = figures
            gateway.terminate()
            gateway.wait()
    finally:
        sandbox.terminate()
        mongo.stop()
    for label, figures in results.items():
        print(
            f"{label:28} cpu/call {figures['cpu_ms_per_call'][0]:.3f} ms"
            + (
                f" + database {figures['database_cpu_ms_per_call']:.3f} ms"
                if "database_cpu_ms_per_call" in figures
                else ""
            )
            + f"  p50 {figures['p50_ms']} ms  p99 {figures['p99_ms']} ms  {figures['statuses']}"
        )
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "ablation.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as fh:
        json.dump({"rate": args.rate, "seconds": args.seconds, "results": results}, fh, indent=2)


if __name__ == "__main__":
    main()
