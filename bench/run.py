"""The gateway benchmark: gateway vs. a bare proxy with the same upstream client, in one run.

Starts SecantusDB, the sandbox upstream, the gateway (many accounts and keys) and the
baseline proxy as separate processes; drives both with the same requests (wrk when
installed, else bench/load.py); prints and saves requests/s, p50, p99, the ratio, the
gateway's p99 vs. the baseline's at half the baseline's saturation rate, and MongoDB
round trips per data call (the gateway's own PyMongo command-monitoring counter).

    ./dev bench [--seconds 10] [--connections 32] [--accounts 50] [--workers 1]

`./dev bench --static` measures the gateway's own cost instead: a static upstream (nginx), 300 keys of
10 accounts, the goals of issue 16 (bench/static.py). `./dev bench --latency` measures the real job: a
provider answering in ~0.7 s, the gateway against nginx proxy_pass at 400-1,200 calls in flight, and a
pool of provider keys (bench/latency.py). `./dev bench --clients [curl,h2] [--in-flight 100,400 ...]` measures the upstream
HTTP client candidates in a bare proxy against the same slow provider (bench/clients.py).
`./dev bench --cache [--seconds 120 --rate 300] [--workers 2] [--memory]` measures the answer cache against a
0.7 s provider: provider calls against the least any cache could make, hits' latency and CPU, coalescing, memory
and the money (bench/cache.py).
`./dev bench --streams [--rules 1000 --sockets 1000 --seconds 60] [--streams-workers 2]` measures filter rules,
WebSockets and webhooks, the data calls' p99 with and without the rules, and exactly once (with two workers
across a killed worker) (bench/streams.py).
`./dev bench --backup [--seconds 60 --rate 200 --rules 50]` takes a backup under that load with a 0.7 s provider, a
webhook receiver down and active rules, restores it and checks the books and that everything is there (bench/backup.py).
`./dev bench --mcp [--seconds 20 --rounds 4 --connections 200 --nice 10]` sets an MCP tool call beside the REST call it wraps
against a 0.7 s provider (the p50 and CPU it adds) and measures the compact answers' sizes (bench/mcp.py).
`./dev bench --failover [--rate 200 --seconds 60] [--workers 2]` runs two providers (PROVIDERS), kills the first
mid-run and brings it back: failed calls, p99 during the switch, double charges, traffic's return, then cost
routing and the margin view against the charges (bench/failover.py).
`./dev bench --journal [--models longtail --connections 400 --seconds 20 --rounds 1]` runs the `--latency` closed
loop with JOURNAL=on and off side by side, ABBA: the p50 and CPU per call the usage journal adds, the disk's fsync
latency and the journal's group sizes; `./dev bench --journal-soak [--kills 20 --connections 800]` kills a worker
of `serve --workers 2` again and again under that load and checks the books (bench/journal.py).
`./dev bench --reload [--rate 300 --sockets 100 --seconds 60]` sends SIGUSR2 to `serve --workers 2` under
data calls to a 0.7 s provider and resuming WebSocket clients: failed calls, socket errors, events missed or
doubled, and when the new code answered (bench/reload.py).
"""

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import urllib.request

from app.embedded import EmbeddedMongo, free_port
from bench import load
from bench.measure import HERE, UPSTREAM_KEY, children, cpu_seconds, db_commands, http, spawn, wrk
from gateway_testing.stack import wait_for


def request_paths(catalog: dict) -> list[str]:
    users = catalog["users"]
    paths = [f"/social/user/info?userName={u['userName']}" for u in users[:20]]
    paths += [f"/social/tweet/advanced_search?query=from%3A{u['userName']}" for u in users[:10]]
    paths += [f"/social/user/followers?userName={name}&pageSize=20" for name in catalog["big_accounts"][:3]]
    paths += [f"/social/tweets?tweet_ids={','.join(catalog['tweets'][i : i + 5])}" for i in range(0, 50, 5)]
    return paths


def saturate(
    port: int,
    raw: list[bytes],
    seconds: float,
    connections: int,
    lua_requests: list[tuple[str, str]],
    pids: tuple[int, ...] = (),
) -> dict:
    before = [cpu_seconds(p) for p in pids]
    if shutil.which("wrk"):
        figures = wrk(port, lua_requests, seconds, connections)
    else:
        figures = asyncio.run(load.run("127.0.0.1", port, raw, seconds, connections))
    if pids:
        used = sum(cpu_seconds(p) for p in pids) - sum(before)
        figures["cpu_ms_per_request"] = round(used * 1000 / max(figures["requests"], 1), 3)
    return figures


def publish(result: dict, out: str, table: str, readme=None) -> None:
    """Every benchmark's ending: the figures saved as JSON at `out`, their table printed, and with `readme`
    (`readme(table, command)`) the table written into the docs with the command that made it."""
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as fh:
        json.dump(result, fh, indent=2)
    print(table)
    print(f"(figures: {out})")
    if readme:
        readme(table, "./dev bench " + " ".join(sys.argv[1:]))


def main() -> None:
    if any(a == "--clients" or a.startswith("--clients=") for a in sys.argv[1:]):  # bench/clients.py, its options
        from bench import clients

        return clients.main(sys.argv[1:])
    if "--backup" in sys.argv[1:]:  # bench/backup.py, its options
        from bench import backup

        return backup.main(sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--connections", default=None, help="32; --latency: a list, 400,800")
    parser.add_argument("--accounts", type=int, default=50)
    parser.add_argument("--keys-per-account", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1, help="gateway processes on the port (serve --workers N)")
    parser.add_argument(
        "--latency", action="store_true", help="a slow provider, the gateway vs nginx proxy_pass (bench/latency.py)"
    )
    parser.add_argument(
        "--models",
        default="fixed,longtail,random",
        help="--latency: the provider's delay models (random: the long tail drawn at random per call)",
    )
    parser.add_argument("--warmup", type=float, default=3, help="--latency, --mcp: seconds of warm-up before each run")
    parser.add_argument("--timeout", type=float, default=10, help="--latency: wrk's timeout per call, seconds")
    parser.add_argument(
        "--workers-connections", default="600,1200", help="--latency: in flight against serve --workers 2 (a list)"
    )
    parser.add_argument(
        "--no-workers", dest="workers_scenario", action="store_false", help="--latency: skip the --workers 2 scenario"
    )
    parser.add_argument("--scenario", choices=["all", "closed", "keypool"], default="all", help="--latency: which")
    parser.add_argument("--keypool-rate", type=float, default=400, help="--latency: calls/s asked of the key pool")
    parser.add_argument(
        "--lift-caps",
        action="store_true",
        help="--latency: lift ACCOUNT_MAX_IN_FLIGHT, UPSTREAM_MAX_CONNECTIONS, MAX_CONNECTIONS_PER_ADDRESS (diagnosis)",
    )
    parser.add_argument(
        "--readme", action="store_true", help="--latency, --cache, --mcp: write the table into docs/benchmarks.md"
    )
    parser.add_argument("--out", default=None, help="where the JSON goes (bench/results/latest.json or static.json)")
    parser.add_argument(
        "--static", action="store_true", help="static upstream, the gateway's own cost (bench/static.py)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="--static, --mcp (default 4): alternating rounds of each side"
    )
    parser.add_argument(
        "--loop",
        choices=["asyncio", "uvloop"],
        default=None,
        help="--static, --latency: the event loop of the gateway and the bare proxy (default: the gateway's "
        "own default, EVENT_LOOP, and plain asyncio for the bare proxy, as a user would write it)",
    )
    parser.add_argument(
        "--restricted-keys",
        action="store_true",
        help="--static: every key with an expiry, an endpoint scope, an address allowlist and a credit budget",
    )
    parser.add_argument("--cache", action="store_true", help="the answer cache, a 0.7 s provider (bench/cache.py)")
    parser.add_argument(
        "--rate", type=float, default=300, help="--cache, --reload, --failover (default 200): calls/s (open loop)"
    )
    parser.add_argument(
        "--failover", action="store_true", help="two providers, the first killed mid-run (bench/failover.py)"
    )
    parser.add_argument("--memory", action="store_true", help="--cache: also RSS with the cache on and off")
    parser.add_argument("--streams", action="store_true", help="filter rules and WebSockets (bench/streams.py)")
    parser.add_argument("--rules", type=int, default=1000, help="--streams: active rules at 10 s")
    parser.add_argument("--sockets", type=int, default=1000, help="--streams: WebSocket clients, one key each")
    parser.add_argument(
        "--streams-workers", type=int, default=1, help="--streams: gateway workers; 2 also kills one (a restart)"
    )
    parser.add_argument("--interval", type=float, default=10, help="--streams: the rules' interval, seconds")
    parser.add_argument("--data-rate", type=float, default=50, help="--streams: data calls/s (open loop) per phase")
    parser.add_argument("--data-seconds", type=float, default=15, help="--streams: each data phase, seconds")
    parser.add_argument("--drain", type=float, default=15, help="--streams: seconds for deliveries still in retry")
    parser.add_argument(
        "--no-restart", dest="restart", action="store_false", help="--streams: with 2 workers, kill none"
    )
    parser.add_argument(
        "--reload", action="store_true", help="SIGUSR2 to serve --workers 2 under load (bench/reload.py)"
    )
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="--mcp, --journal: raise the measured processes' priority by N (root; busy machine)",
    )
    parser.add_argument(
        "--mcp", action="store_true", help="an MCP tool call beside its REST call, and answer sizes (bench/mcp.py)"
    )
    parser.add_argument(
        "--journal", action="store_true", help="JOURNAL=on vs off under the --latency load, ABBA (bench/journal.py)"
    )
    parser.add_argument(
        "--journal-soak", action="store_true", help="repeated SIGKILLs of a worker under load (bench/journal.py)"
    )
    parser.add_argument("--kills", type=int, default=20, help="--journal-soak: how many workers to kill")
    args = parser.parse_args()
    if args.journal or args.journal_soak:
        from bench import journal

        args.connections = [int(n) for n in (args.connections or ("800" if args.journal_soak else "400")).split(",")]
        if "--seconds" not in sys.argv:
            args.seconds = 20
        if "--rounds" not in sys.argv:
            args.rounds = 3
        if "--models" not in sys.argv:
            args.models = "fixed" if args.journal_soak else "longtail"
        args.models = [m for m in args.models.split(",") if m]
        if args.journal_soak:
            result = journal.soak(args)
            publish(result, args.out or os.path.join(HERE, "results", "journal-soak.json"), journal.soak_report(result))
        else:
            result = journal.run(args)
            publish(result, args.out or os.path.join(HERE, "results", "journal.json"), journal.report(result))
        return
    if args.mcp:
        from bench import mcp

        if "--seconds" not in sys.argv:
            args.seconds = 20
        if "--rounds" not in sys.argv:
            args.rounds = 4
        args.connections = int(args.connections or 200)
        result = mcp.run(args)
        out = args.out or os.path.join(HERE, "results", "mcp.json")
        publish(result, out, mcp.report(result), args.readme and mcp.write_benchmarks_doc)
        return
    if args.failover:
        from bench import failover

        if "--seconds" not in sys.argv:
            args.seconds = 60
        if "--rate" not in sys.argv:
            args.rate = 200
        result = failover.run(args)
        out = args.out or os.path.join(HERE, "results", f"failover-w{args.workers}.json")
        publish(result, out, failover.report(result))
        return
    if args.reload:
        from bench import reload

        if "--seconds" not in sys.argv:
            args.seconds = 60
        if "--sockets" not in sys.argv:
            args.sockets = 100
        args.out = args.out or os.path.join(HERE, "results", "reload.json")
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        result = reload.run(args)
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2, default=str)
        print(reload.report(result))
        print(f"(figures: {args.out})")
        return
    if args.cache:
        from bench import cache

        if "--seconds" not in sys.argv:
            args.seconds = 120
        result = cache.run(args)
        out = args.out or os.path.join(HERE, "results", f"cache-w{args.workers}.json")
        readme = args.readme and (lambda table, command: cache.write_benchmarks_doc(table, command, args.workers))
        publish(result, out, cache.report(result), readme)
        return
    if args.streams:
        from bench import streams

        if "--seconds" not in sys.argv:
            args.seconds = 60
        args.restart = args.restart and args.streams_workers > 1
        out = args.out or os.path.join(HERE, "results", f"streams-w{args.streams_workers}.json")
        args.out_dir = os.path.dirname(out)
        result = streams.run(args)
        streams.save(result, out)
        print(streams.report(result))
        print(f"(figures: {out})")
        return
    if args.latency:
        from bench import latency

        args.connections = [int(n) for n in (args.connections or "400,800").split(",")]
        args.workers_connections = [int(n) for n in args.workers_connections.split(",")]
        if "--seconds" not in sys.argv:
            args.seconds = latency.SECONDS
        args.models = [m for m in args.models.split(",") if m]
        result = latency.run(args)
        out = args.out or os.path.join(HERE, "results", "latency.json")
        publish(result, out, latency.report(result), args.readme and latency.write_benchmarks_doc)
        return
    args.connections = int(args.connections or 32)
    if args.static:
        from bench import static

        if "--seconds" not in sys.argv:
            args.seconds = 6
        result = static.run(args)
        suffix = "-restricted" if args.restricted_keys else ""
        out = args.out or os.path.join(HERE, "results", f"static-{args.loop or 'default'}{suffix}.json")
        publish(result, out, static.report(result))
        return
    args.out = args.out or os.path.join(HERE, "results", "latest.json")

    work = tempfile.mkdtemp(prefix="gw-bench-")
    mongo = EmbeddedMongo(os.path.join(work, "db")).start()
    procs = []
    try:
        sandbox_port, gateway_port, baseline_port = free_port(), free_port(), free_port()
        procs.append(spawn([sys.executable, "-m", "sandbox", "--port", str(sandbox_port), "--api-key", UPSTREAM_KEY]))
        upstream = f"http://127.0.0.1:{sandbox_port}"
        wait_for(upstream + "/healthz", procs[-1])
        procs.append(
            spawn(
                [
                    sys.executable,
                    os.path.join(os.path.dirname(HERE), "gateway.py"),
                    "serve",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(gateway_port),
                    "--workers",
                    str(args.workers),
                ],
                {
                    "MONGODB_URI": mongo.uri,
                    "UPSTREAM_URL": upstream,
                    "UPSTREAM_API_KEY": UPSTREAM_KEY,
                    "DATA_DIR": work,
                    "LOG_LEVEL": "WARNING",
                    "PLAN_RULES": json.dumps([{"name": "bench", "min_paid_usd": 0, "qps": 100000}]),
                    "LOGIN_MAX_ATTEMPTS_PER_ADDRESS": "100000",
                },
            )
        )  # one address registers every bench account
        gateway = f"http://127.0.0.1:{gateway_port}"
        wait_for(gateway + "/healthz", procs[-1])
        gateway_pids = (procs[1].pid, *children(procs[1].pid))  # with --workers N: the parent and its workers
        procs.append(
            spawn(
                [
                    sys.executable,
                    os.path.join(HERE, "baseline.py"),
                    "--port",
                    str(baseline_port),
                    "--upstream",
                    upstream,
                    "--upstream-key",
                    UPSTREAM_KEY,
                ],
                {"PYTHONPATH": os.path.dirname(HERE)},
            )
        )
        wait_for(f"http://127.0.0.1:{baseline_port}/social/nothing", procs[-1])
        simple_port = free_port()
        procs.append(
            spawn(
                [
                    sys.executable,
                    os.path.join(HERE, "baseline.py"),
                    "--port",
                    str(simple_port),
                    "--upstream",
                    upstream,
                    "--upstream-key",
                    UPSTREAM_KEY,
                    "--client",
                    "simple",
                ],
                {"PYTHONPATH": os.path.dirname(HERE)},
            )
        )
        wait_for(f"http://127.0.0.1:{simple_port}/social/nothing", procs[-1])

        catalog = json.loads(urllib.request.urlopen(upstream + "/sandbox/catalog").read())
        keys = []
        for i in range(args.accounts):
            user = http(
                "POST", gateway + "/auth/register", {"email": f"bench{i}@example.com", "password": "bench password 1"}
            )
            for _ in range(args.keys_per_account):
                key = http("POST", gateway + "/keys", {"name": "bench"}, user["token"])
                keys.append(key["key"])
            http("POST", f"{gateway}/keys/{key['key_id']}/topup", {"credits": 10**12}, user["token"])
        paths = request_paths(catalog)
        plan = [(paths[i % len(paths)], keys[i % len(keys)]) for i in range(max(len(paths), len(keys)) * 3)]
        gateway_raw = [
            load.request_bytes("127.0.0.1", p, {"X-API-Key": k, "Cache-Control": "no-cache"}) for p, k in plan
        ]
        baseline_raw = [load.request_bytes("127.0.0.1", p, {}) for p, _ in plan]

        # Warm both (lease refills, key caches, upstream connections), then measure.
        saturate(gateway_port, gateway_raw, 3, args.connections, plan)
        saturate(baseline_port, baseline_raw, 3, args.connections, [(p, "") for p, _ in plan])
        commands_before = db_commands(gateway)
        gw = saturate(gateway_port, gateway_raw, args.seconds, args.connections, plan, gateway_pids)
        gw_db = saturate(gateway_port, gateway_raw, args.seconds, args.connections, plan, (mongo.process.pid,))
        commands = {name: count - commands_before.get(name, 0) for name, count in db_commands(gateway).items()}
        commands = {name: int(count) for name, count in commands.items() if count}
        trips = sum(commands.values())
        base = saturate(
            baseline_port, baseline_raw, args.seconds, args.connections, [(p, "") for p, _ in plan], (procs[2].pid,)
        )
        # Why the gateway uses the curl client: the same bare proxy with Tornado's default client.
        simple = saturate(simple_port, baseline_raw, args.seconds, args.connections, [(p, "") for p, _ in plan])
        half = base["rps"] / 2
        base_fixed = asyncio.run(
            load.run("127.0.0.1", baseline_port, baseline_raw, args.seconds, args.connections, rate=half)
        )
        gw_fixed = asyncio.run(
            load.run("127.0.0.1", gateway_port, gateway_raw, args.seconds, args.connections, rate=half)
        )
        result = {
            "machine": {"cores": os.cpu_count()},
            "settings": vars(args),
            "baseline": base,
            "gateway": gw,
            "baseline_simple_client": simple,
            "ratio_rps": round(gw["rps"] / base["rps"], 3),
            "cpu_ratio": round(base["cpu_ms_per_request"] / gw["cpu_ms_per_request"], 3),
            "database_cpu_ms_per_request": gw_db["cpu_ms_per_request"],
            # /metrics covers every worker. The command window spans both gateway runs (the second one
            # measures the database's CPU).
            "db_round_trips_per_call": round(trips / max(gw["requests"] + gw_db["requests"], 1), 5),
            "db_commands_during_run": commands,
            "fixed_rate": {
                "rate": round(half, 1),
                "baseline": base_fixed,
                "gateway": gw_fixed,
                "p99_ratio": round(gw_fixed["p99_ms"] / base_fixed["p99_ms"], 3),
            },
            "goals": {"ratio_rps >= 0.90": None, "db_round_trips_per_call <= 0.02": None, "p99_ratio <= 1.5": None},
        }
        result["goals"] = {
            "ratio_rps >= 0.90": result["ratio_rps"] >= 0.90,
            "db_round_trips_per_call <= 0.02": (result["db_round_trips_per_call"] or 0) <= 0.02,
            "p99_ratio <= 1.5": result["fixed_rate"]["p99_ratio"] <= 1.5,
        }
        publish(result, args.out, json.dumps(result, indent=2))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(15)
        mongo.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
