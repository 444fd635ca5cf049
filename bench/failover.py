"""`./dev bench --failover`: two providers behind the gateway (PROVIDERS), one of them killed mid-run (issue 48).

Each provider is nginx with the echo module, like bench/latency.py's: a long-tail delay per call (the lognormal of
`longtail_delays`, median 0.6 s, mean 0.69 s, clamped at 1.8 s, drawn by the request id) and one page that every
endpoint reads as data (bench/cache.py's). Both are `twitterapi` providers: A first, B second. Calls are live reads
(no answer cache), 60 % profiles, 30 % searches, 10 % followers, from 5 accounts of 4 keys.

- **failover** (`PROVIDER_ROUTING=order`): `--rate` calls/s (200) for `--seconds` (60), open loop; A is killed
  (SIGKILL) a quarter into the run (KILL_AT) and started again a little before half-way (BACK_AT). Failed calls in all and from 5 s after the kill on; p99 of
  the calls sent during the switch (the kill to 5 s after) against the provider's own p99 and the steady p99 before
  the kill; every account's balance drop against the sum of its X-Credits-Charged, and its usage records against
  its admitted calls (no call charged twice); how long after A is back until 99 % of the calls of a second are A's
  again. The margin view over the run against the charges and the gateway's /metrics.
- **cost** (`PROVIDER_ROUTING=cost`, a gateway started again): B is cheaper for /user/info, the same price for the
  rest; `--rate` calls/s for COST_SECONDS: the share of /user/info provider requests B got (the cost ledger, read
  through the margin view), and of the other endpoints' A got.

    ./dev bench --failover [--rate 200] [--seconds 60] [--workers 2]
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
from datetime import UTC, datetime, timedelta

from app.embedded import EmbeddedMongo, free_port
from app.server import raise_open_file_limit
from bench.cache import page, percentile, refused, settle_money
from bench.latency import (
    ECHO_MODULE,
    PLAN,
    TEMP_PATHS,
    customer,
    ensure_tools,
    fixed_rate,
    longtail_delays,
    start_gateway,
    stop_gateway,
)
from bench.measure import HERE, http, metric_totals, start_nginx
from gateway_testing.stack import wait_for

ACCOUNTS, KEYS_PER_ACCOUNT = 5, 4
KILL_AT, BACK_AT = 0.25, 0.47  # of the failover run's seconds: at 60 s, A is killed at 15 s and back at 28 s
SWITCH = 5.0  # seconds after the kill that count as the switch
COST_SECONDS = 20.0
ITEM_USD = 0.00015  # both providers' price per item; B's for /user/info is CHEAP_USD
CHEAP_USD = 0.0001
ADMIN = "failover-admin@example.com"

PROVIDER_CONF = """load_module {echo_module};
daemon off;
master_process off;
worker_rlimit_nofile 65536;
error_log {work}/{name}-error.log;
pid {work}/{name}.pid;
events {{ worker_connections 20000; }}
http {{
    access_log {work}/{name}-access.log;
    {temp_paths}
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    map $request_id $delay {{
{buckets}
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        root {work};
        location = /page {{ internal; default_type application/json; try_files /page.json =404; }}
        location / {{ echo_sleep $delay; echo_exec /page; }}
    }}
}}
"""


def provider_p99() -> float:
    """The provider's own p99, seconds: of its delay table, each bucket equally likely."""
    delays = sorted(longtail_delays())
    return delays[int(len(delays) * 0.99)]


def start_provider(work: str, name: str, port: int) -> subprocess.Popen:
    buckets = "\n".join(f"        ~{i:02x}$ {delay};" for i, delay in enumerate(longtail_delays()))
    conf = PROVIDER_CONF.format(
        echo_module=ECHO_MODULE,
        work=work,
        name=name,
        temp_paths=TEMP_PATHS.format(work=work),
        buckets=buckets,
        port=port,
    )
    proc = start_nginx(work, name, conf)
    wait_for(f"http://127.0.0.1:{port}/", proc)
    return proc


def providers(ports: dict[str, int], cheap_profiles: bool = False) -> str:
    """PROVIDERS: A then B, priced per item; with `cheap_profiles`, B cheaper for /user/info."""
    entries = []
    for name in ("a", "b"):
        costs: dict = {"item": ITEM_USD}
        if cheap_profiles and name == "b":
            costs["by"] = {"user/info": {"item": CHEAP_USD}}
        entries.append(
            {"name": name, "kind": "twitterapi", "url": f"http://127.0.0.1:{ports[name]}", "keys": [f"key-{name}"]}
            | {"costs": costs}
        )
    return json.dumps(entries)


def settings(ports: dict[str, int], routing: str) -> dict:
    return {
        "UPSTREAM_URL": f"http://127.0.0.1:{ports['a']}",  # unused with PROVIDERS; a setting serve requires
        "PROVIDERS": providers(ports, cheap_profiles=routing == "cost"),
        "PROVIDER_ROUTING": routing,
        "PLAN_RULES": json.dumps(PLAN),
        "LOGIN_MAX_ATTEMPTS_PER_ADDRESS": "100000",
        "SIGNUP_MAX_PER_NETWORK": "100000",
        "MAX_CONNECTIONS_PER_ADDRESS": "100000",
        # A provider outage must not turn an account's later calls into 429s: this measures the failover.
        "ACCOUNT_FAILURE_BUDGET": "1000000",
        "LOG_LEVEL": "WARNING",
    }


def request_plan(keys: list[str], calls: int) -> list[tuple[str, str]]:
    """60 % profiles, 30 % searches, 10 % followers, each a distinct object, keys in turn."""
    plan = []
    for i in range(calls):
        kind = i % 10
        if kind < 6:
            path = f"/social/user/info?userName=user{i}"
        elif kind < 9:
            path = f"/social/tweet/advanced_search?query=from%3Auser{i}"
        else:
            path = f"/social/user/followers?userName=user{i}"
        plan.append((path, keys[i % len(keys)]))
    return plan


def grant_admin(gateway) -> str:
    """The bench's admin: registered, then granted by the operator's command (registering grants nothing)."""
    token = http("POST", gateway.url + "/auth/register", {"email": ADMIN, "password": "bench password 1"})["token"]
    done = subprocess.run(
        [sys.executable, os.path.join(os.path.dirname(HERE), "gateway.py"), "admin", "grant", ADMIN],
        env=gateway.env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    return token


def margin(gateway, token: str, since: datetime, until: datetime) -> dict:
    query = urllib.parse.urlencode({"from": since.isoformat(), "to": until.isoformat()})
    return http("GET", f"{gateway.url}/admin/margin?{query}", token=token)


def stored_margin(gateway, token: str, since: datetime, until: datetime, charged: int, admitted: int) -> dict:
    """The margin view once every worker has written its usage records and ledger entries (at most 30 s)."""
    deadline = time.monotonic() + 30
    while True:
        view = margin(gateway, token, since, until)
        totals = view["totals"]
        if (totals["charged_credits"], totals["calls"]) == (charged, admitted) or time.monotonic() > deadline:
            return view
        time.sleep(0.5)


def money(gateway, tokens, keys_of, plan, calls, before) -> dict:
    account_of = {k: i for i, ks in enumerate(keys_of) for k in ks}
    charged, admitted = [0] * len(tokens), [0] * len(tokens)
    for call, (_, key) in zip(sorted(calls, key=lambda c: c["at"]), plan, strict=False):
        charged[account_of[key]] += call.get("charged", 0)
        admitted[account_of[key]] += not refused(call)
    return settle_money(gateway, tokens, before, charged, admitted)


async def with_outage(port: int, plan, rate: float, seconds: float, work: str, ports: dict, procs: dict) -> dict:
    """The open-loop calls, and A killed at KILL_AT and started again at BACK_AT of the run."""
    times: dict[str, float] = {}

    async def outage() -> None:
        start = time.perf_counter()
        await asyncio.sleep(KILL_AT * seconds)
        procs["a"].kill()
        times["killed"] = time.perf_counter() - start
        await asyncio.to_thread(procs["a"].wait)
        await asyncio.sleep(max(0.0, BACK_AT * seconds - (time.perf_counter() - start)))
        procs["a"] = await asyncio.to_thread(start_provider, work, "a", ports["a"])
        times["back"] = time.perf_counter() - start

    calls, _ = await asyncio.gather(fixed_rate(port, plan, rate, seconds), outage())
    return {"calls": calls, **times}


def return_seconds(calls: list[dict], back: float, end: float) -> float | None:
    """Seconds from A's return to the start of the first whole second whose answered calls were 99 % A's."""
    second = back
    while second + 1 <= end:
        window = [c for c in calls if second <= c["at"] < second + 1 and c["status"] == 200]
        if window and sum(c["provider"] == "a" for c in window) >= 0.99 * len(window):
            return round(second - back, 1)
        second += 1
    return None


def run_failover(work, mongo, ports, procs, args) -> dict:
    gateway, _ = start_gateway(work, mongo, args.workers, settings(ports, "order"))
    try:
        admin = grant_admin(gateway)
        accounts = [
            customer(gateway.url, f"failover-{i}-{time.time_ns()}@example.com", KEYS_PER_ACCOUNT)
            for i in range(ACCOUNTS)
        ]
        tokens, keys_of = [t for t, _ in accounts], [k for _, k in accounts]
        plan = request_plan([k for ks in keys_of for k in ks], int(args.rate * args.seconds))
        before = [http("GET", gateway.url + "/account", token=t)["credits"] for t in tokens]
        calls_before = metric_totals(gateway.url, "gateway_provider_calls_total", "provider")
        since = datetime.now(UTC)
        run = asyncio.run(with_outage(gateway.port, plan, args.rate, args.seconds, work, ports, procs))
        until = datetime.now(UTC) + timedelta(seconds=1)
        calls, killed, back = run["calls"], run["killed"], run["back"]
        failed = [c for c in calls if c["status"] != 200]
        late = [c for c in failed if c["at"] >= killed + SWITCH]
        steady = [c["ms"] for c in calls if c["at"] < killed and c["status"] == 200]
        switch = [c["ms"] for c in calls if killed <= c["at"] < killed + SWITCH]
        money_ = money(gateway, tokens, keys_of, plan, calls, before)
        charged = sum(money_["sum_x_credits_charged"])
        view = stored_margin(gateway, admin, since, until, charged, sum(money_["calls"]))
        provider_calls = metric_totals(gateway.url, "gateway_provider_calls_total", "provider")
        statuses: dict[str, int] = {}
        for call in calls:
            statuses[str(call["status"])] = statuses.get(str(call["status"]), 0) + 1
        return {
            "calls": len(calls),
            "statuses": statuses,
            "killed_at_s": round(killed, 1),
            "back_at_s": round(back, 1),
            "failed": len(failed),
            "failed_share": round(len(failed) / max(len(calls), 1), 5),
            "failed_after_switch": len(late),
            "failed_examples": sorted({c.get("error", "")[:100] for c in failed})[:5],
            "answered_by": {p: sum(c.get("provider") == p for c in calls) for p in ("a", "b")},
            "provider_p99_ms": provider_p99() * 1000,
            "steady_p99_ms": percentile(steady, 0.99),
            "switch_p99_ms": percentile(switch, 0.99),
            "switch_calls": len(switch),
            "return_to_a_s": return_seconds(calls, back, args.seconds),
            "money": money_,
            "margin_totals": view["totals"],
            "margin_providers": view["providers"],
            "metrics_provider_calls": {
                p: provider_calls.get(p, 0) - calls_before.get(p, 0) for p in sorted(provider_calls)
            },
            "margin_equals_charges": (view["totals"]["charged_credits"], view["totals"]["calls"])
            == (charged, sum(money_["calls"])),
        }
    finally:
        stop_gateway(gateway)


def run_cost(work, mongo, ports, args) -> dict:
    gateway, _ = start_gateway(work, mongo, args.workers, settings(ports, "cost"))
    try:
        admin = http("POST", gateway.url + "/auth/login", {"email": ADMIN, "password": "bench password 1"})["token"]
        accounts = [
            customer(gateway.url, f"cost-{i}-{time.time_ns()}@example.com", KEYS_PER_ACCOUNT) for i in range(ACCOUNTS)
        ]
        tokens, keys_of = [t for t, _ in accounts], [k for _, k in accounts]
        plan = request_plan([k for ks in keys_of for k in ks], int(args.rate * COST_SECONDS))
        before = [http("GET", gateway.url + "/account", token=t)["credits"] for t in tokens]
        since = datetime.now(UTC)
        calls = asyncio.run(fixed_rate(gateway.port, plan, args.rate, COST_SECONDS))
        until = datetime.now(UTC) + timedelta(seconds=1)
        money_ = money(gateway, tokens, keys_of, plan, calls, before)
        charged = sum(money_["sum_x_credits_charged"])
        view = stored_margin(gateway, admin, since, until, charged, sum(money_["calls"]))
        to = {}
        for endpoint in ("/social/user/info", "/social/tweet/advanced_search", "/social/user/followers"):
            rows = {r["provider"]: r["provider_calls"] for r in view["rows"] if r["endpoint"] == endpoint}
            to[endpoint] = {**rows, "b_share": round(rows.get("b", 0) / max(sum(rows.values()), 1), 4)}
        return {
            "calls": len(calls),
            "failed": sum(c["status"] != 200 for c in calls),
            "provider_requests": to,
            "margin_totals": view["totals"],
            "money": money_,
            "margin_equals_charges": (view["totals"]["charged_credits"], view["totals"]["calls"])
            == (charged, sum(money_["calls"])),
        }
    finally:
        stop_gateway(gateway)


def run(args) -> dict:
    ensure_tools()
    raise_open_file_limit()
    work = tempfile.mkdtemp(prefix="gw-failover-bench-")
    with open(os.path.join(work, "page.json"), "wb") as fh:
        fh.write(page())
    mongo = EmbeddedMongo(os.path.join(work, "db")).start()
    ports = {"a": free_port(), "b": free_port()}
    procs = {name: start_provider(work, name, port) for name, port in ports.items()}
    result: dict = {"rate": args.rate, "seconds": args.seconds, "workers": args.workers}
    try:
        result["failover"] = run_failover(work, mongo, ports, procs, args)
        result["cost"] = run_cost(work, mongo, ports, args)
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(10)
        mongo.stop()
        shutil.rmtree(work, ignore_errors=True)
    result["goals"] = goals(result)
    return result


def goals(result: dict) -> dict:
    f, c = result["failover"], result["cost"]
    return {
        "failed calls <= 0.5 % in all": f["failed_share"] <= 0.005,
        f"no failed call from {SWITCH:g} s after the kill": f["failed_after_switch"] == 0,
        "p99 during the switch <= 2 x the provider's p99": (f["switch_p99_ms"] or 1e9) <= 2 * f["provider_p99_ms"],
        "no call charged twice (balance drops = X-Credits-Charged, usage records = calls)": f["money"]["exact"]
        and c["money"]["exact"],
        "traffic back to A within 30 s": f["return_to_a_s"] is not None and f["return_to_a_s"] <= 30,
        ">= 99 % of /user/info provider requests to the cheaper B": c["provider_requests"]["/social/user/info"][
            "b_share"
        ]
        >= 0.99,
        "margin view totals = the usage records": f["margin_equals_charges"] and c["margin_equals_charges"],
    }


def report(result: dict) -> str:
    f, c = result["failover"], result["cost"]
    lines = [
        f"bench --failover: {result['rate']:g} calls/s for {result['seconds']:g} s, --workers {result['workers']}; "
        f"A killed at {f['killed_at_s']} s, back at {f['back_at_s']} s",
        f"  calls {f['calls']}, failed {f['failed']} ({f['failed_share'] * 100:.2f} %), "
        f"{f['failed_after_switch']} from {SWITCH:g} s after the kill; statuses {f['statuses']}",
        f"  answered by A {f['answered_by']['a']}, by B {f['answered_by']['b']}; provider requests (/metrics) "
        f"{f['metrics_provider_calls']}",
        f"  p99: steady {f['steady_p99_ms']} ms, during the switch {f['switch_p99_ms']} ms "
        f"({f['switch_calls']} calls); the provider's own {f['provider_p99_ms']:.0f} ms",
        f"  traffic back to A {f['return_to_a_s']} s after its return",
        f"  money exact: {f['money']['exact']}; margin view = charges: {f['margin_equals_charges']} "
        f"(charged {f['margin_totals']['charged_usd']} USD, paid {f['margin_totals']['paid_usd']} USD, "
        f"failovers {f['margin_totals']['failovers']})",
        f"cost routing: {c['calls']} calls, failed {c['failed']}; provider requests by endpoint "
        f"{json.dumps(c['provider_requests'])}",
        f"  money exact: {c['money']['exact']}; margin view = charges: {c['margin_equals_charges']} "
        f"(charged {c['margin_totals']['charged_usd']} USD, paid {c['margin_totals']['paid_usd']} USD)",
        "goals:",
        *[f"  [{'x' if met else ' '}] {goal}" for goal, met in result["goals"].items()],
    ]
    return "\n".join(lines)
