"""`./dev bench --cache`: the shared answer cache (issue 36) in front of a provider answering in 0.7 s.

The provider is nginx with the echo module: every call waits 0.7 s (`echo_sleep`) and gets one page that every
endpoint reads as data (a profile, 20 posts, users), about 8 KB; a userName starting with `down` is answered
503 after the same wait. Its access log counts the provider calls.

Phases, on one gateway (`--workers N`), 20 keys of 5 accounts (a plan allowing the rate):
- **mix**: `--rate` calls/s (300) for `--seconds` (120), open loop, Zipf-distributed (s = 1.1) over 20,000
  profiles and 2,000 searches, 60 % profiles, 30 % searches, 10 % other endpoints (followers, tweets by id, last
  tweets, over 2,000 objects each). The least number of provider calls any cache could make for that very
  sequence (each distinct request once per freshness window, the docs' table) against the provider calls the
  gateway made; latency of hits and misses; every account's balance drop against the sum of its
  X-Credits-Charged, and its usage records against its calls.
- **burst**: 200 identical calls at once, then 200 identical calls the provider fails: provider calls, distinct
  bodies, what was charged.
- **cpu** (one process): the gateway's CPU per call for 10 s of misses at the mix's rate, then for the same
  calls as hits.
- **memory** (one process, `--memory`): RSS after a workload whose distinct answers are ten times
  CACHE_MAX_BYTES (8 MiB), against the same workload with the cache off.

    ./dev bench --cache [--seconds 120] [--rate 300] [--workers 2] [--memory] [--readme]
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import json
import os
import random
import re
import shutil
import tempfile
import time
from collections import Counter

from app.embedded import EmbeddedMongo, free_port
from app.server import raise_open_file_limit
from bench.latency import ECHO_MODULE, TEMP_PATHS, customer, ensure_tools, fixed_rate, start_gateway, stop_gateway
from bench.measure import HERE, cpu_seconds, http, metric_totals, rss_bytes, start_nginx
from gateway_testing.stack import wait_for
from social.answer_cache import DEFAULT_TTL

DELAY = 0.7
ACCOUNTS, KEYS_PER_ACCOUNT = 5, 4
PROFILES, SEARCHES, OTHERS = 20_000, 2_000, 2_000
ZIPF_S = 1.1
PLAN = [{"name": "bench", "min_paid_usd": 0, "qps": 1000, "account_qps": 10000}]
MEMORY_CACHE_BYTES = 8 * 1024 * 1024
WARMUP = 10  # seconds at the start of the mix left out of the hits' steady-state latency

PROVIDER_CONF = """load_module {echo_module};
daemon off;
master_process off;
worker_rlimit_nofile 65536;
error_log {work}/provider-error.log;
pid {work}/provider.pid;
events {{ worker_connections 20000; }}
http {{
    access_log {work}/provider-access.log;
    {temp_paths}
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    map $arg_userName $down {{ default 0; ~^down 1; }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        root {work};
        location = /page {{ internal; default_type application/json; try_files /page.json =404; }}
        location / {{
            if ($down) {{ echo_sleep {delay}; echo_status 503; echo '{{"status":"error","msg":"down"}}'; }}
            echo_sleep {delay};
            echo_exec /page;
        }}
    }}
}}
"""


def page() -> bytes:
    """One answer every endpoint reads as data: a profile (`data`), 20 posts, users, ids."""
    tweets = [
        {"id": str(10**17 + i), "text": "a post of the benchmark " * 12, "author": {"id": "7"}} for i in range(20)
    ]
    users = [{"id": str(1000 + i), "userName": f"user{i}"} for i in range(20)]
    return json.dumps(
        {
            "status": "success",
            "msg": "",
            "data": {"id": "7", "userName": "bench", "description": "x" * 200},
            "tweets": tweets,
            "followers": users,
            "users": users,
            "ids": list(range(20)),
            "has_next_page": True,
            "next_cursor": "benchcursor",
        }
    ).encode()


class Zipf:
    def __init__(self, n: int, s: float, rng: random.Random):
        weights = [1 / (k**s) for k in range(1, n + 1)]
        total = sum(weights)
        self.cumulative, running = [], 0.0
        for w in weights:
            running += w / total
            self.cumulative.append(running)
        self.rng = rng

    def draw(self) -> int:
        return min(bisect.bisect_left(self.cumulative, self.rng.random()), len(self.cumulative) - 1)


def mix(calls: int, keys: list[str], seed: int = 36) -> list[tuple[str, str, str]]:
    """(path, key, endpoint) for each call of the mix, in order."""
    rng = random.Random(seed)
    profiles, searches = Zipf(PROFILES, ZIPF_S, rng), Zipf(SEARCHES, ZIPF_S, rng)
    others = Zipf(OTHERS, ZIPF_S, rng)
    out = []
    for _ in range(calls):
        kind = rng.random()
        if kind < 0.6:
            endpoint, path = "user/info", f"/social/user/info?userName=p{profiles.draw()}"
        elif kind < 0.9:
            endpoint = "tweet/advanced_search"
            path = f"/social/tweet/advanced_search?query=q{searches.draw()}&queryType=Latest"
        else:
            endpoint, query = rng.choice(
                (
                    ("user/followers", "userName=f{}"),
                    ("tweets", "tweet_ids={}"),
                    ("user/last_tweets", "userName=t{}"),
                )
            )
            path = f"/social/{endpoint}?" + query.format(others.draw() + 1)
        out.append((path, keys[rng.randrange(len(keys))], endpoint))
    return out


def least_calls(plan: list[tuple[str, str, str]], rate: float) -> int:
    """The fewest provider calls any cache could make for the sequence: each distinct request once per freshness
    window (identical calls in flight at once are within it)."""
    fetched: dict[str, float] = {}
    count = 0
    for i, (path, _, endpoint) in enumerate(plan):
        at = i / rate
        last = fetched.get(path)
        if last is None or at - last >= DEFAULT_TTL[endpoint]:
            fetched[path] = at
            count += 1
    return count


def provider_calls(work: str) -> int:
    with open(os.path.join(work, "provider-access.log"), "rb") as fh:
        return sum(1 for _ in fh)


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * p))], 1)


async def burst(port: int, path: str, key: str, n: int) -> list[tuple[int, int, str]]:
    """`n` identical calls at once, each on its own connection: (status, charged, body digest) of each."""

    async def one() -> tuple[int, int, str]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-API-Key: {key}\r\nConnection: close\r\n\r\n".encode()
        )
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        writer.close()
        return int(lines[0][9:12]), int(headers.get("x-credits-charged", "0") or 0), hashlib.sha1(body).hexdigest()

    return await asyncio.gather(*[one() for _ in range(n)])


def run_mix(work: str, gateway, tokens: list[str], keys_of: list[list[str]], args) -> dict:
    keys = [k for ks in keys_of for k in ks]
    account_of = {k: i for i, ks in enumerate(keys_of) for k in ks}
    plan = mix(int(args.rate * args.seconds), keys)
    least = least_calls(plan, args.rate)
    before_balance = [http("GET", gateway.url + "/account", token=t)["credits"] for t in tokens]
    before_calls = provider_calls(work)
    calls = asyncio.run(fixed_rate(gateway.port, [(p, k) for p, k, _ in plan], args.rate, args.seconds, live=False))
    time.sleep(1.0)  # the access log line of the last answer
    made = provider_calls(work) - before_calls
    by_cache: dict[str, list[float]] = {}
    for call in calls:
        by_cache.setdefault(call.get("cache") or f"status {call['status']}", []).append(call["ms"])
    # After WARMUP seconds: the first ones open every connection and fill an empty cache (all misses).
    steady_hits = [c["ms"] for c in calls if c.get("cache") == "HIT" and c["at"] >= WARMUP]
    # Money: each account's balance drop against the charges its answers carried, and its usage records.
    charged, admitted = [0] * len(tokens), [0] * len(tokens)
    for call, (_, key, _) in zip(calls_in_order(calls), plan, strict=False):
        charged[account_of[key]] += call.get("charged", 0)
        admitted[account_of[key]] += not refused(call)
    money = settle_money(gateway, tokens, before_balance, charged, admitted)
    statuses: dict[str, int] = {}
    for call in calls:
        statuses[str(call["status"])] = statuses.get(str(call["status"]), 0) + 1
    return {
        "calls": len(calls),
        "distinct_requests": len({p for p, _, _ in plan}),
        "statuses": statuses,
        "x_cache": {name: len(v) for name, v in sorted(by_cache.items())},
        "provider_calls": made,
        "least_provider_calls": least,
        "ratio_to_least": round(made / max(least, 1), 3),
        "hit_p50_ms": percentile(by_cache.get("HIT", []), 0.5),
        "hit_p99_ms": percentile(by_cache.get("HIT", []), 0.99),
        "hit_p99_ms_after_warmup": percentile(steady_hits, 0.99),
        "hit_p999_ms_after_warmup": percentile(steady_hits, 0.999),
        "miss_p50_ms": percentile(by_cache.get("MISS", []), 0.5),
        "miss_p99_ms": percentile(by_cache.get("MISS", []), 0.99),
        "late_calls": sum(1 for c in calls if c["done"] - c["at"] > 5),
        "money": money,
    }


def loop_stalls(work: str) -> list[int]:
    """How late the gateway's periodic callbacks ran, each time past 100 ms (its log's stall warnings)."""
    with open(os.path.join(work, "gateway.log"), errors="replace") as fh:
        return [int(m) for m in re.findall(r"event loop stalled: a periodic callback ran (\d+) ms late", fh.read())]


def refused(call: dict) -> bool:
    """A call refused before it was admitted (a 402, a rate limit, credits or usage that cannot be checked or
    recorded right now): it has no usage record, today as before the cache. The provider's own failures have."""
    return call["status"] in (0, 402, 429, 503) and "data provider" not in call.get("error", "")


def calls_in_order(calls: list[dict]) -> list[dict]:
    """fixed_rate appends each call when it is answered: back into the order they were scheduled."""
    return sorted(calls, key=lambda c: c["at"])


def settle_money(gateway, tokens: list[str], before: list[int], charged: list[int], made: list[int]) -> dict:
    """Every account's balance drop equals the sum of its X-Credits-Charged, and it has one usage record per
    admitted call: read once every worker has flushed (waited for, at most 30 s)."""
    deadline = time.monotonic() + 30
    while True:
        drops = [
            b - http("GET", gateway.url + "/account", token=t)["credits"] for t, b in zip(tokens, before, strict=True)
        ]
        records = [sum(r["calls"] for r in http("GET", gateway.url + "/usage/summary?days=1", token=t)) for t in tokens]
        if (drops == charged and records == made) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    return {
        "balance_drop": drops,
        "sum_x_credits_charged": charged,
        "usage_records": records,
        "calls": made,
        "exact": drops == charged and records == made,
    }


def run_bursts(work: str, gateway, key: str) -> dict:
    out = {}
    for name, path in (("ok", "/social/user/info?userName=burst"), ("failing", "/social/user/info?userName=down1")):
        before = provider_calls(work)
        answers = asyncio.run(burst(gateway.port, path, key, 200))
        time.sleep(1.0)
        out[name] = {
            "calls": len(answers),
            "provider_calls": provider_calls(work) - before,
            "statuses": sorted({a[0] for a in answers}),
            "distinct_bodies": len({a[2] for a in answers}),
            "charged": sum(a[1] for a in answers),
        }
    return out


def run_cpu(gateway, pids: list[int], keys: list[str], rate: float) -> dict:
    """CPU per call of 10 s of misses at the mix's rate, then of the same calls answered from the cache, each phase
    counted until the process is idle again (`quiet`): as used (`cpu_ms_per_call`), and net of what the idle
    process spends meanwhile (its timers, heartbeat, usage flushes, the stream scheduler's look for due polls:
    measured over 5 s without calls first), which no call causes."""
    plan = [(f"/social/user/info?userName=cpu{i}", keys[i % len(keys)]) for i in range(int(rate * 10))]
    before = sum(cpu_seconds(p) for p in pids)
    time.sleep(5)
    idle_per_s = (sum(cpu_seconds(p) for p in pids) - before) / 5
    out: dict = {"idle_cpu_ms_per_s": round(idle_per_s * 1000, 1)}
    for phase in ("miss", "hit"):
        before, started = sum(cpu_seconds(p) for p in pids), time.monotonic()
        calls = asyncio.run(fixed_rate(gateway.port, plan, rate, 10, live=False))
        settled = quiet(pids, idle_per_s)
        used = sum(cpu_seconds(p) for p in pids) - before
        net = used - idle_per_s * (time.monotonic() - started)
        out[phase] = {
            "cpu_ms_per_call": round(used * 1000 / len(calls), 3),
            "net_cpu_ms_per_call": round(net * 1000 / len(calls), 3),
            "settled_s": settled,
            "answers": dict(Counter(c.get("cache") or c.get("error", str(c["status"])) for c in calls)),
        }
    out["hit_to_miss"] = round(out["hit"]["cpu_ms_per_call"] / max(out["miss"]["cpu_ms_per_call"], 1e-9), 3)
    out["net_hit_to_miss"] = round(out["hit"]["net_cpu_ms_per_call"] / max(out["miss"]["net_cpu_ms_per_call"], 1e-9), 3)
    return out


def quiet(pids: list[int], idle_per_s: float, longest: float = 30) -> float:
    """Waits until the gateway is back to its idle CPU (at most `longest` s), and says how long that took: what a
    phase's calls left to do (the misses' shared-tier writes, a usage flush) belongs to that phase, not to the
    next (the misses' writes to a loaded database ran on into the hits' phase: 12 % of its samples)."""
    started = time.monotonic()
    while time.monotonic() - started < longest:
        before = sum(cpu_seconds(p) for p in pids)
        time.sleep(0.5)
        if (sum(cpu_seconds(p) for p in pids) - before) / 0.5 <= idle_per_s * 1.5 + 0.005:
            break
    return round(time.monotonic() - started, 1)


def run_memory(work: str, mongo, upstream: str, args) -> dict:
    """RSS after 10 x MEMORY_CACHE_BYTES of distinct answers, with the cache on and off."""
    size = len(page())
    distinct = 10 * MEMORY_CACHE_BYTES // size
    out = {"cache_max_bytes": MEMORY_CACHE_BYTES, "distinct_answers": distinct, "answer_bytes": size}
    for name, limit in (("off", 0), ("on", MEMORY_CACHE_BYTES)):
        gateway, pids = start_gateway(
            work, mongo, 1, settings(upstream, args, CACHE_MAX_BYTES=str(limit), CACHE_SHARED="false")
        )
        try:
            _, keys = customer(gateway.url, f"mem-{name}-{time.time_ns()}@example.com", 4)
            plan = [(f"/social/user/info?userName=m{name}{i}", keys[i % 4]) for i in range(distinct)]
            asyncio.run(fixed_rate(gateway.port, plan, args.rate, distinct / args.rate, live=False))
            out[f"rss_{name}_bytes"] = rss_bytes(pids[0])
        finally:
            stop_gateway(gateway)
    out["rss_added_bytes"] = out["rss_on_bytes"] - out["rss_off_bytes"]
    out["within_bound"] = out["rss_added_bytes"] <= MEMORY_CACHE_BYTES
    return out


def settings(upstream: str, args, **extra: str) -> dict:
    return {
        "UPSTREAM_URL": upstream,
        "PLAN_RULES": json.dumps(PLAN),
        "LOGIN_MAX_ATTEMPTS_PER_ADDRESS": "100000",
        "SIGNUP_MAX_PER_NETWORK": "100000",
        "MAX_CONNECTIONS_PER_ADDRESS": "100000",
        # A provider time-out on a loaded machine must not turn an account's later calls into 429s: this measures
        # the cache, not the failure budget.
        "ACCOUNT_FAILURE_BUDGET": "1000000",
        "LOG_LEVEL": "WARNING",
        **extra,
    }


def run(args) -> dict:
    ensure_tools()
    raise_open_file_limit()
    work = tempfile.mkdtemp(prefix="gw-cache-bench-")
    with open(os.path.join(work, "page.json"), "wb") as fh:
        fh.write(page())
    mongo = EmbeddedMongo(os.path.join(work, "db")).start()
    port = free_port()
    conf = PROVIDER_CONF.format(
        echo_module=ECHO_MODULE, work=work, temp_paths=TEMP_PATHS.format(work=work), port=port, delay=DELAY
    )
    provider = start_nginx(work, "provider", conf)
    upstream = f"http://127.0.0.1:{port}"
    result: dict = {"rate": args.rate, "seconds": args.seconds, "workers": args.workers, "provider_delay_s": DELAY}
    try:
        wait_for(upstream + "/", provider)
        gateway, pids = start_gateway(work, mongo, args.workers, settings(upstream, args))
        try:
            accounts = [
                customer(gateway.url, f"cache-{i}-{time.time_ns()}@example.com", KEYS_PER_ACCOUNT)
                for i in range(ACCOUNTS)
            ]
            tokens, keys_of = [t for t, _ in accounts], [k for _, k in accounts]
            cpu_before = sum(cpu_seconds(p) for p in pids)
            result["mix"] = run_mix(work, gateway, tokens, keys_of, args)
            result["mix"]["gateway_cpu_s"] = round(sum(cpu_seconds(p) for p in pids) - cpu_before, 1)
            for name in ("gateway_cache_claims_skipped_total", "gateway_db_round_trips_total"):
                result["mix"][name] = sum(metric_totals(gateway.url, name, "worker").values())
            result["burst"] = run_bursts(work, gateway, keys_of[0][0])
            skipped = metric_totals(gateway.url, "gateway_cache_claims_skipped_total", "worker")
            result["burst"]["claims_skipped_since_mix"] = (
                sum(skipped.values()) - result["mix"]["gateway_cache_claims_skipped_total"]
            )
            if args.workers == 1:
                result["cpu"] = run_cpu(gateway, pids, keys_of[1], args.rate)
        finally:
            stop_gateway(gateway)
        result["loop_stalls_ms"] = loop_stalls(work)
        if args.memory:
            result["memory"] = run_memory(work, mongo, upstream, args)
    finally:
        provider.terminate()
        provider.wait(10)
        mongo.stop()
        shutil.rmtree(work, ignore_errors=True)
    result["goals"] = goals(result)
    return result


def goals(result: dict) -> dict:
    mix_, burst_ = result["mix"], result["burst"]
    found = {
        "provider calls <= 1.10 x the least": mix_["ratio_to_least"] <= 1.10,
        "hit p99 <= 10 ms (after the first 10 s)": (mix_["hit_p99_ms_after_warmup"] or 1e9) <= 10,
        "200 identical calls: 1 provider call, 1 body": burst_["ok"]["provider_calls"] == 1
        and burst_["ok"]["distinct_bodies"] == 1,
        "failing: 200 uncharged errors from 1 provider call": burst_["failing"]["provider_calls"] == 1
        and burst_["failing"]["charged"] == 0
        and all(s >= 500 for s in burst_["failing"]["statuses"]),
        "money exact (balance drops, usage records)": mix_["money"]["exact"],
    }
    if "cpu" in result:
        found["CPU per hit <= 1/3 of per miss (net of the idle process's)"] = result["cpu"]["net_hit_to_miss"] <= 1 / 3
    if "memory" in result:
        found["RSS within CACHE_MAX_BYTES + no-cache RSS"] = result["memory"]["within_bound"]
    return found


def report(result: dict) -> str:
    mix_ = result["mix"]
    lines = [
        f"bench --cache: {result['rate']:g} calls/s for {result['seconds']:g} s, --workers {result['workers']}, "
        f"provider {result['provider_delay_s']} s",
        "| calls | distinct | provider calls | least possible | ratio | X-Cache | hit p50 / p99 ms | miss p50 / p99 ms |",
        "|---|---|---|---|---|---|---|---|",
        f"| {mix_['calls']:,} | {mix_['distinct_requests']:,} | {mix_['provider_calls']:,} | "
        f"{mix_['least_provider_calls']:,} | {mix_['ratio_to_least']} | "
        + ", ".join(f"{k} {v:,}" for k, v in mix_["x_cache"].items())
        + f" | {mix_['hit_p50_ms']} / {mix_['hit_p99_ms']} (after 10 s: {mix_['hit_p99_ms_after_warmup']})"
        + f" | {mix_['miss_p50_ms']} / {mix_['miss_p99_ms']} |",
        "",
        f"burst: {json.dumps(result['burst'])}",
        f"money: {json.dumps(mix_['money'])}",
    ]
    if "cpu" in result:
        lines.append(f"cpu: {json.dumps(result['cpu'])}")
    if "memory" in result:
        lines.append(f"memory: {json.dumps(result['memory'])}")
    lines += [f"- {'met' if ok else 'MISSED'}: {goal}" for goal, ok in result["goals"].items()]
    return "\n".join(lines)


def write_benchmarks_doc(table: str, command: str, workers: int) -> None:
    """The run's figures between its markers in docs/benchmarks.md (one block per --workers)."""
    start, end = f"<!-- cache-bench-w{workers}:start -->", f"<!-- cache-bench-w{workers}:end -->"
    path = os.path.join(os.path.dirname(HERE), "docs", "benchmarks.md")
    with open(path) as fh:
        text = fh.read()
    head, rest = text.split(start, 1)
    with open(path, "w") as fh:
        fh.write(f"{head}{start}\n`{command}`\n\n```\n{table}\n```\n{end}{rest.split(end, 1)[1]}")
