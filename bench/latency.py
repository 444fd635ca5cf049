"""`./dev bench --latency`: the real job. The gateway against nginx `proxy_pass`, both in front of a slow provider.

The provider answers in ~0.7 s (reference.md, "The provider's latency and the real load"): an nginx with the
echo module serves one recorded sandbox page (a 20-post `advanced_search` answer) after `echo_sleep`, either a
`fixed` 0.7 s or a `longtail` delay per call (256 buckets of a lognormal, median 0.6 s, sigma 0.55, clamped at
1.8 s: mean 0.69 s; each call names its bucket, so every run draws the same delays: `request_plan`), or the same
long tail drawn at random per call (`random`: as a customer's load test would draw it; the provider picks the
bucket from its own request id). The reference is nginx `proxy_pass` with a keep-alive pool to the same
provider. wrk drives each scenario closed loop (every connection one call in flight: 400 and 800 in flight,
and 600 and 1,200 against `serve --workers 2` and nginx with 2 workers), the reference then the gateway, back
to back. Reported per scenario: 2xx answers/s and the ratio, p50/p99 and the gateway's added ms, errors by
status and socket errors, the CPU ms per call of the gateway and of the reference (their processes' /proc
times over the measured run), the gateway's RSS growth per call in flight, and the goals met or missed.
Throughput is counted over the whole seconds of each measured run after its first two: wrk opens every connection at once,
and those a full listen queue turned away come a SYN retry (1-3 s) later, a start-up effect reported apart.

The gateway runs with DEFAULT settings but for a plan that allows the rate (1,000/s per key, 10,000/s per
account; one account, 10 keys): the caps on calls in flight (ACCOUNT_MAX_IN_FLIGHT, UPSTREAM_MAX_CONNECTIONS,
MAX_CONNECTIONS_PER_ADDRESS) are the defaults', since the point is that the defaults carry the load.
`--lift-caps` lifts them, for diagnosis only.

The key-pool scenario (`--scenario keypool`): the provider allows 100 calls/s per provider key (429 past it,
with a body of its own), the gateway has three (`UPSTREAM_API_KEYS="pk1:100,pk2:100,pk3:100"`), customers ask
for 400 calls/s (open loop, fixed rate): served 2xx/s, the 429s customers got and whether any was the
provider's, and whether the credits charged equal the `X-Credits-Charged` of the 2xx answers.

Installs nginx, its echo module and wrk with apt-get when they are missing and it runs as root (all three
are needed: there is no fallback). Writes bench/results/latency.json; `--readme` puts the table into docs/benchmarks.md.

    ./dev bench --latency                       # everything, about 15 minutes (30 s per measured run)
    ./dev bench --latency --models longtail,random --no-workers --scenario closed --connections 800
    ./dev bench --latency --seconds 2 --warmup 1 --connections 50 --models longtail --no-workers --scenario closed
    [--loop asyncio|uvloop] [--lift-caps] [--timeout 10] [--workers-connections 600,1200] [--readme]
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from app.embedded import EmbeddedMongo, free_port
from app.server import raise_open_file_limit
from bench.measure import (
    HERE,
    children,
    cpu_seconds,
    ensure_packages,
    http,
    nginx_binary,
    rss_bytes,
    start_nginx,
    wrk,
)
from bench.static import record_page
from config.settings import fields
from config.settings import load as load_settings
from gateway_testing.stack import GatewayProcess, request, wait_for

ROOT = os.path.dirname(HERE)
ECHO_MODULE = "/usr/lib/nginx/modules/ngx_http_echo_module.so"  # Debian's libnginx-mod-http-echo
KEYS = 10  # one account's keys, rotated by wrk
# Seconds per measured run. A long-tail provider's p50 sampled over 10 s moved by 10-20 ms between runs, nginx's
# included (the calls still in flight at the end, the longer ones, are left out): 30 s keeps it to a few ms.
SECONDS = 30
SETTLE = 2  # seconds at the start of each measured wrk run left out of its throughput (steady_per_s)
PLAN = [{"name": "bench", "min_paid_usd": 0, "qps": 1000, "account_qps": 10000}]
# The caps that decide whether the defaults carry the load; lifted only with --lift-caps.
LIFTED_CAPS = {
    "ACCOUNT_MAX_IN_FLIGHT": "100000",
    "UPSTREAM_MAX_CONNECTIONS": "5000",
    "MAX_CONNECTIONS_PER_ADDRESS": "100000",
}
PROVIDER_KEYS = {"pk1": 100, "pk2": 100, "pk3": 100}
PROVIDER_429 = b'{"provider":"rate limited"}'  # tells a provider 429 passed through from the gateway's own
README_START, README_END = "<!-- latency-bench:start -->", "<!-- latency-bench:end -->"

# What both nginx servers share: thousands of connections each, logs and temporary files in our folder,
# keep-alive connections that outlive any run.
_PROLOGUE = """worker_rlimit_nofile 65536;
error_log {work}/{name}-error.log;
pid {work}/{name}.pid;
events {{{{ worker_connections 20000; }}}}
http {{{{
    access_log off;
    {{temp_paths}}
    keepalive_requests 10000000;
    keepalive_timeout 300s;
"""


# The provider: one nginx process (master_process off: it reads the page from our private temp dir), one
# server per delay model. echo_sleep takes a variable; echo_exec then redirects internally to the page, which
# nginx's static handler serves with its exact bytes, Content-Length and default_type (echo_location would
# answer the same bytes chunked). limit_req runs before the content phase, so a 429 answers at once.
PROVIDER_CONF = (
    """load_module {echo_module};
daemon off;
master_process off;
"""
    + _PROLOGUE.format(work="{work}", name="provider")
    + """    limit_req_zone $http_x_api_key zone=perkey:10m rate={per_key_qps}r/s;
    map $request_id $random_delay {{
{random_buckets}
    }}
    map $arg_cursor $longtail {{
        default $random_delay;
{buckets}
    }}
    server {{
        listen 127.0.0.1:{fixed_port} backlog=4096;
        root {work};
        location = /page {{ internal; default_type application/json; try_files /page.json =404; }}
        location / {{ echo_sleep 0.7; echo_exec /page; }}
    }}
    server {{
        listen 127.0.0.1:{longtail_port} backlog=4096;
        root {work};
        location = /page {{ internal; default_type application/json; try_files /page.json =404; }}
        location / {{ echo_sleep $longtail; echo_exec /page; }}
    }}
    server {{
        listen 127.0.0.1:{keypool_port} backlog=4096;
        root {work};
        location = /page {{ internal; default_type application/json; try_files /page.json =404; }}
        location / {{
            # A burst of 10 absorbs the jitter of arrivals; past it the key gets 100/s, and 429 at once.
            limit_req zone=perkey burst=10 nodelay;
            limit_req_status 429;
            error_page 429 = @limited;
            echo_sleep $longtail;
            echo_exec /page;
        }}
        location @limited {{ default_type application/json; return 429 '{provider_429}'; }}
    }}
}}
"""
)
# The reference: nginx proxy_pass with a keep-alive pool. With a master (for worker_processes 2); as root its
# workers would switch to nobody, so they stay root (they only proxy: no file of ours is read).
REFERENCE_CONF = (
    """daemon off;
{user}
worker_processes {workers};
"""
    + _PROLOGUE.format(work="{work}", name="reference")
    + """    upstream provider {{
        server 127.0.0.1:{provider_port} max_fails=0;
        keepalive 2000;
        keepalive_requests 10000000;
        keepalive_timeout 300s;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            proxy_pass http://provider;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            # The 38 KB page fits the buffers: no temporary file per answer.
            proxy_buffer_size 16k;
            proxy_buffers 8 16k;
            proxy_max_temp_file_size 0;
        }}
    }}
}}
"""
)
TEMP_PATHS = " ".join(
    f"{kind}_temp_path {{work}}/nginx-tmp;" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
)


# The provider's server of each delay model (random: the long tail's server, its delays drawn at random per call).
PORT_OF = {"fixed": "fixed", "longtail": "longtail", "random": "longtail"}


@dataclasses.dataclass
class Scenario:
    model: str  # fixed | longtail | random
    workers: int  # gateway processes, and nginx worker_processes of the reference
    connections: int

    @property
    def name(self) -> str:
        return f"{self.model}, {self.connections} in flight, {self.workers} worker{'s' if self.workers > 1 else ''}"


def longtail_delays(buckets: int = 256, median: float = 0.6, sigma: float = 0.55, top: float = 1.8) -> list[float]:
    """One delay per bucket: the lognormal's quantiles at the buckets' midpoints, clamped at `top`. Quantiles rather
    than random draws: fixed, and the same mean (0.69 s) as the distribution, so no run depends on a seed's luck."""
    normal = statistics.NormalDist(0, sigma)
    return [
        round(min(top, median * 2.718281828459045 ** normal.inv_cdf((i + 0.5) / buckets)), 3) for i in range(buckets)
    ]


def provider_conf(work: str, ports: dict[str, int]) -> str:
    # The bench's own calls name their bucket (cursor=dXX, see request_plan); any other call gets one at random,
    # by the last two hex digits of $request_id.
    delays = list(enumerate(longtail_delays()))
    buckets = "\n".join(f"        d{i:02x} {delay};" for i, delay in delays)
    random_buckets = "\n".join(f"        ~{i:02x}$ {delay};" for i, delay in delays)
    return PROVIDER_CONF.format(
        echo_module=ECHO_MODULE,
        work=work,
        temp_paths=TEMP_PATHS.format(work=work),
        per_key_qps=next(iter(PROVIDER_KEYS.values())),
        buckets=buckets,
        random_buckets=random_buckets,
        fixed_port=ports["fixed"],
        longtail_port=ports["longtail"],
        keypool_port=ports["keypool"],
        provider_429=PROVIDER_429.decode(),
    )


def start_reference(work: str, provider_port: int, workers: int) -> tuple[subprocess.Popen, int]:
    port = free_port()
    conf = REFERENCE_CONF.format(
        user="user root;" if os.geteuid() == 0 else "",
        workers=workers,
        work=work,
        temp_paths=TEMP_PATHS.format(work=work),
        provider_port=provider_port,
        port=port,
    )
    proc = start_nginx(work, "reference", conf)
    wait_for(f"http://127.0.0.1:{port}/", proc)
    return proc, port


def ensure_tools() -> None:
    ensure_packages(
        {
            "nginx": nginx_binary() is not None,
            "libnginx-mod-http-echo": os.path.exists(ECHO_MODULE),
            "wrk": shutil.which("wrk") is not None,
        }
    )
    missing = [
        what
        for what, there in (
            ("nginx", nginx_binary()),
            ("the echo module", os.path.exists(ECHO_MODULE)),
            ("wrk", shutil.which("wrk")),
        )
        if not there
    ]
    if missing:
        raise SystemExit(
            f"bench --latency needs {', '.join(missing)}: run it as root once, or apt-get install "
            "nginx libnginx-mod-http-echo wrk"
        )


def gateway_settings(upstream: str, args, extra: dict | None = None) -> dict:
    """DEFAULT settings but for the plan, what a benchmark from one address needs to set itself up (sign-ups and
    logins from 127.0.0.1), the event loop, and --lift-caps."""
    return {
        "UPSTREAM_URL": upstream,
        **({"EVENT_LOOP": args.loop} if args.loop else {}),
        "PLAN_RULES": json.dumps(PLAN),
        "LOGIN_MAX_ATTEMPTS_PER_ADDRESS": "100000",
        "SIGNUP_MAX_PER_NETWORK": "100000",
        "LOG_LEVEL": "INFO",  # as deployed: the access log is on, written to a file here
        **(LIFTED_CAPS if args.lift_caps else {}),
        **(extra or {}),
    }


def start_gateway(work: str, mongo: EmbeddedMongo, workers: int, settings: dict) -> tuple[GatewayProcess, list[int]]:
    """`serve [--workers N]` with an external database (so that its own children are its workers only)."""
    env = {**os.environ, "MONGODB_URI": mongo.uri, "DATA_DIR": work, **settings}
    for name in ("UPSTREAM_API_KEYS", *LIFTED_CAPS):  # ours, not the shell's
        if name not in settings:
            env.pop(name, None)
    log = open(os.path.join(work, "gateway.log"), "ab")
    gateway = GatewayProcess(env, workers=workers, stdout=log, stderr=log).start()
    log.close()  # the child keeps its own copy
    pids = [gateway.proc.pid]
    if workers > 1:
        deadline = time.monotonic() + 10
        while len(children(gateway.proc.pid)) < workers and time.monotonic() < deadline:
            time.sleep(0.1)
        pids += children(gateway.proc.pid)
    return gateway, pids


def stop_gateway(gateway: GatewayProcess) -> None:
    """SIGTERM (it drains its calls and returns its leases), killed if it takes longer than 30 s."""
    try:
        gateway.stop(timeout=30)
    except subprocess.TimeoutExpired:
        gateway.kill()


def customer(gateway_url: str, email: str, keys: int) -> tuple[str, list[str]]:
    """An account with `keys` keys and credits for any run (the development top-up, as the other benches)."""
    user = http("POST", gateway_url + "/auth/register", {"email": email, "password": "bench password 1"})
    secrets = []
    for i in range(keys):
        key = http("POST", gateway_url + "/keys", {"name": f"bench {i}"}, user["token"])
        secrets.append(key["key"])
    http("POST", f"{gateway_url}/keys/{key['key_id']}/topup", {"credits": 10**12}, user["token"])
    return user["token"], secrets


def request_plan(keys: list[str], model: str = "longtail") -> list[tuple[str, str]]:
    """The data path of the gateway's customers, the same for the reference (which ignores the key).

    Each call names its long-tail delay bucket (`cursor=dXX`, which the provider maps to the delay): every 256
    calls in a row take each bucket once, in an order that spreads short and long delays evenly (a stride of 97,
    prime to 256). So every run, the reference's and the gateway's alike, draws the same delays in the same
    proportions: a p50 compared between two runs differs by what the server in front added, not by which delays
    chance dealt each run (drawn at random, 30 s of calls moved the median by ~3 ms either way).

    `random`: the same calls with cursors the provider does not know (`r` for `d`): it draws each call's delay
    at random, as a customer's load test would meet it."""
    prefix = "r" if model == "random" else "d"
    return [
        (
            f"/social/tweet/advanced_search?query=from%3Auser{i % 100}&cursor={prefix}{i * 97 % 256:02x}",
            keys[i % len(keys)],
        )
        for i in range(len(keys) * 256)
    ]


class RssSampler(threading.Thread):
    """The gateway's RSS (summed over its processes) every 0.5 s while a run lasts, from its second quarter on."""

    def __init__(self, pids: list[int], seconds: float):
        super().__init__(daemon=True)
        self.pids, self.seconds, self.samples = pids, seconds, []
        self.stopped = threading.Event()

    def run(self) -> None:
        self.stopped.wait(self.seconds / 4)
        while not self.stopped.wait(0.5):
            self.samples.append(sum(rss_bytes(p) for p in self.pids))


def listen_overflows() -> int:
    """Connections the kernel refused because a listen queue was full (TcpExt ListenOverflows, all sockets)."""
    with open("/proc/net/netstat") as fh:
        names, values = [line.split() for line in fh if line.startswith("TcpExt:")][:2]
    return int(values[names.index("ListenOverflows")])


def steady_per_s(by_second: dict[str, int]) -> float:
    """Answers per second over the whole seconds of a run after its first SETTLE ones (wrk's connections all
    open at once: a server whose listen queue overflows gets some of them a second or three later, which is
    a start-up effect, counted apart as listen overflows) and before its last, partial, one."""
    seconds = sorted(int(t) for t in by_second)
    if not seconds:
        return 0.0
    kept = [t for t in range(seconds[0] + SETTLE, seconds[-1])]
    return round(sum(by_second.get(str(t), 0) for t in kept) / max(len(kept), 1), 1)


def closed_loop(port: int, plan: list[tuple[str, str]], args, connections: int, pids: list[int] = ()) -> dict:
    """A warm-up, then the measured wrk run; with `pids` (the server's processes) also their CPU and RSS under
    load."""
    wrk(port, plan, args.warmup, connections, timeout=args.timeout)
    seconds = args.seconds + SETTLE
    before = [cpu_seconds(p) for p in pids]
    overflows = listen_overflows()
    sampler = RssSampler(list(pids), seconds)
    if pids:
        sampler.start()
    figures = wrk(port, plan, seconds, connections, timeout=args.timeout, statuses=True)
    sampler.stopped.set()
    figures["listen_overflows"] = listen_overflows() - overflows
    ok = sum(n for status, n in figures["statuses"].items() if 200 <= int(status) < 300)
    figures["ok"] = ok
    figures["ok_per_s"] = steady_per_s(figures.pop("ok_at"))
    figures["answers_per_s"] = steady_per_s(figures.pop("all_at"))
    if pids:
        used = sum(cpu_seconds(p) for p in pids) - sum(before)
        figures["cpu_ms_per_call"] = round(used * 1000 / max(figures["requests"], 1), 3)  # every answer, 429s too
        figures["cpu_ms_per_2xx"] = round(used * 1000 / max(ok, 1), 3)
        figures["rss_under_load"] = max(sampler.samples, default=0)
    return figures


def compare(
    scenario: Scenario, nginx: dict, gateway: dict, rss_idle: int, previous: tuple[int, int] | None = None
) -> dict:
    """The figures of one scenario and its goals (p99 is judged on the long tail only: a fixed delay keeps a
    closed loop in waves, where any single event loop's p99 grows with the wave; reference.md).

    Memory: RSS under load minus RSS idle, per call in flight, holds what a process needs once to serve at
    all (its connection pool and session, the usage buffer, the access log's batch, the allocator's arenas)
    beside what each call holds. What each further call in flight costs is the slope between two levels
    measured on the same process (`previous`: the level before and its RSS): the goal is judged on it."""
    errors = {s: n for s, n in gateway["statuses"].items() if not 200 <= int(s) < 300}
    sockets = {k: v for k, v in gateway["socket_errors"].items() if v}
    result = {
        "model": scenario.model,
        "workers": scenario.workers,
        "connections": scenario.connections,
        "nginx": nginx,
        "gateway": gateway,
        "ratio_2xx": round(gateway["ok_per_s"] / max(nginx["ok_per_s"], 1e-9), 3),
        "added_p50_ms": round(gateway["p50_ms"] - nginx["p50_ms"], 1),
        "added_p99_ms": round(gateway["p99_ms"] - nginx["p99_ms"], 1),
        "gateway_errors": {"statuses": errors, "sockets": sockets},
        # Not errors: connections the kernel made wait (a SYN retried 1-3 s later), the gateway's listen queue full.
        "listen_overflows": gateway["listen_overflows"],
        "rss_idle_mb": round(rss_idle / 2**20, 1),
        "rss_under_load_mb": round(gateway["rss_under_load"] / 2**20, 1),
        "rss_kb_per_call_in_flight": round((gateway["rss_under_load"] - rss_idle) / 1024 / scenario.connections, 1),
    }
    if previous is not None:
        more, rss_before = scenario.connections - previous[0], previous[1]
        result["rss_kb_per_added_call"] = round((gateway["rss_under_load"] - rss_before) / 1024 / more, 1)
    goals = {
        "0 errors": not errors and not sockets,
        "2xx throughput >= 0.95 x nginx": result["ratio_2xx"] >= 0.95,
        "p50 <= nginx + 10 ms": result["added_p50_ms"] <= 10,
    }
    if previous is not None:
        goals["RSS grows <= 50 KB per call in flight"] = result["rss_kb_per_added_call"] <= 50
    if scenario.model != "fixed":
        goals["p99 <= nginx + 50 ms"] = result["added_p99_ms"] <= 50
    result["goals"] = goals
    return result


def run_group(work, mongo, provider_ports, model, workers, connections, keys, args) -> list[dict]:
    """One gateway and one reference for a (model, workers) pair, measured at each connection count."""
    upstream = f"http://127.0.0.1:{provider_ports[PORT_OF[model]]}"
    reference, reference_port = start_reference(work, provider_ports[PORT_OF[model]], workers)
    reference_pids = [reference.pid, *children(reference.pid)]  # the master and its workers
    gateway, pids = start_gateway(work, mongo, workers, gateway_settings(upstream, args))
    try:
        plan = request_plan(keys, model)
        for path, key in plan[: len(keys)]:  # each key once: its cache entry and its account's lease
            request("GET", gateway.url + path, headers={"X-API-Key": key, "Cache-Control": "no-cache"})
        time.sleep(1)
        rss_idle = sum(rss_bytes(p) for p in pids)
        results, previous = [], None
        for n in connections:
            scenario = Scenario(model, workers, n)
            print(f"bench: {scenario.name}...", file=sys.stderr, flush=True)
            nginx = closed_loop(reference_port, plan, args, n, reference_pids)
            figures = closed_loop(gateway.port, plan, args, n, pids)
            results.append(compare(scenario, nginx, figures, rss_idle, previous))
            previous = (n, figures["rss_under_load"])
        return results
    finally:
        stop_gateway(gateway)
        reference.terminate()
        reference.wait(15)


# --- the provider key pool ---------------------------------------------------------------------------------


async def fixed_rate(
    port: int, plan: list[tuple[str, str]], rate: float, seconds: float, live: bool = True
) -> list[dict]:
    """Open loop: one call every 1/rate s whatever the answers, each on an idle keep-alive connection or a new one.
    The connections come from several loopback addresses (127.0.0.2...) as several customers would, so that the
    per-address connection cap (MAX_CONNECTIONS_PER_ADDRESS) is not what is measured. Returns one dict per call:
    status, the X-Credits-Charged header, whether the body is the provider's 429, when it was scheduled and when
    answered (seconds from the start), the latency from the scheduled time (no coordinated omission), how the
    answer cache answered (X-Cache) and which provider produced the answer (X-Provider). `live`: each call a live read (Cache-Control: no-cache), as for the
    provider-bound job; bench/cache.py lets the cache answer."""
    fresh = "Cache-Control: no-cache\r\n" if live else ""
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    calls: list[dict] = []
    opened = 0

    async def one(path: str, key: str, scheduled: float) -> None:
        nonlocal opened
        if idle:
            reader, writer = idle.pop()
        else:
            opened += 1
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, local_addr=(f"127.0.0.{2 + opened % 8}", 0)
            )
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-API-Key: {key}\r\n{fresh}\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            writer.close()
            now = time.perf_counter()
            calls.append(
                {"status": 0, "error": type(exc).__name__, "at": scheduled - start, "done": now - start, "ms": 0}
            )
            return
        calls.append(
            {
                "status": int(lines[0][9:12]),
                "charged": int(headers.get("x-credits-charged", "0") or 0),
                "provider_429": PROVIDER_429 in body,
                "retry_after": "retry-after" in headers,
                "cache": headers.get("x-cache", ""),
                "provider": headers.get("x-provider", ""),
                **({"error": body[:160].decode("utf-8", "replace")} if lines[0][9:10] != "2" else {}),
                "at": scheduled - start,
                "done": time.perf_counter() - start,
                "ms": (time.perf_counter() - scheduled) * 1000,
            }
        )
        if headers.get("connection", "").lower() == "close":
            writer.close()
        else:
            idle.append((reader, writer))

    tasks = []
    start = time.perf_counter()
    for i in range(int(rate * seconds)):
        scheduled = start + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        path, key = plan[i % len(plan)]
        tasks.append(asyncio.ensure_future(one(path, key, scheduled)))
    await asyncio.gather(*tasks)
    for _, writer in idle:
        writer.close()
    return calls


def balances(gateway_url: str, tokens: list[str]) -> int:
    return sum(http("GET", gateway_url + "/account", token=t)["credits"] for t in tokens)


def keypool(work, mongo, provider_ports, args) -> dict:
    """400 calls/s asked of a provider that serves 3 keys x 100/s: served, 429s and whose, and the charges."""
    supported = "UPSTREAM_API_KEYS" in {f.metadata["env"] for f in fields()}
    upstream = f"http://127.0.0.1:{provider_ports['keypool']}"
    pool = ",".join(f"{k}:{q}" for k, q in PROVIDER_KEYS.items())
    # Without the pool (a build before it), every call goes with the first key: what one key gives.
    settings = gateway_settings(
        upstream, args, {"UPSTREAM_API_KEYS": pool, "UPSTREAM_API_KEY": next(iter(PROVIDER_KEYS))}
    )
    result = {"rate": args.keypool_rate, "provider_keys": pool, "pool_setting_known": supported}
    try:
        gateway, _ = start_gateway(work, mongo, 1, settings)
    except RuntimeError as exc:
        return {**result, "failed": f"the gateway did not start with UPSTREAM_API_KEYS={pool}: {exc}"}
    try:
        # Customers: 20 accounts of 2 keys, 20 calls/s each, ~14 in flight each (below ACCOUNT_MAX_IN_FLIGHT).
        customers = [customer(gateway.url, f"pool{i}@example.com", 2) for i in range(20)]
        tokens = [t for t, _ in customers]
        plan = request_plan([k for _, keys in customers for k in keys])
        # One run: the warm-up then the measured window, so that the window sees the steady state (the calls
        # of the warm-up still in flight, the gateway's queues if any, the provider's buckets drained).
        before = balances(gateway.url, tokens)
        every = asyncio.run(fixed_rate(gateway.port, plan, args.keypool_rate, args.warmup + args.seconds))
        time.sleep(0.5)
        charged = before - balances(gateway.url, tokens)
    finally:
        stop_gateway(gateway)
    window = (args.warmup, args.warmup + args.seconds)
    calls = [c for c in every if window[0] <= c["at"] < window[1]]  # asked in the window
    statuses: dict[str, int] = {}
    for call in calls:
        statuses[str(call["status"])] = statuses.get(str(call["status"]), 0) + 1
    ok = [c for c in calls if 200 <= c["status"] < 300]
    too_many = [c for c in calls if c["status"] == 429]
    # Served: 2xx answered in the window, whenever asked (a gateway that queues serves what its queue lets out).
    served = sum(1 for c in every if 200 <= c["status"] < 300 and window[0] <= c["done"] < window[1])
    ok_ms = sorted(c["ms"] for c in ok)
    result.update(
        {
            "calls": len(calls),
            "statuses": statuses,
            "served_2xx_per_s": round(served / args.seconds, 1),
            "p50_ms_2xx": round(ok_ms[len(ok_ms) // 2], 1) if ok_ms else None,
            "p99_ms_2xx": round(ok_ms[int(len(ok_ms) * 0.99)], 1) if ok_ms else None,
            "customer_429": len(too_many),
            "customer_429_from_provider": sum(c["provider_429"] for c in too_many),
            "customer_429_from_gateway": sum(not c["provider_429"] and c["retry_after"] for c in too_many),
            "credits_charged": charged,
            # Over the whole run, as the balances are.
            "x_credits_charged_2xx": sum(c["charged"] for c in every if 200 <= c["status"] < 300),
            "x_credits_charged_other": sum(c.get("charged", 0) for c in every if not 200 <= c["status"] < 300),
        }
    )
    result["goals"] = {
        "served >= 285 2xx/s (3 keys x 100/s, ~300)": result["served_2xx_per_s"] >= 285,
        "no provider 429 reaches a customer": result["customer_429_from_provider"] == 0,
        "credits charged == sum of X-Credits-Charged on 2xx answers": charged == result["x_credits_charged_2xx"]
        and result["x_credits_charged_other"] == 0,
    }
    if not supported:
        result["note"] = (
            "this build has no UPSTREAM_API_KEYS setting: every call goes to the provider with one key "
            f"({next(iter(PROVIDER_KEYS))}): at most 100/s can be served, the rest are the provider's 429s passed on"
        )
    return result


# --- the run ----------------------------------------------------------------------------------------------


def run(args) -> dict:
    ensure_tools()
    raise_open_file_limit()
    work = tempfile.mkdtemp(prefix="gw-bench-latency-")
    mongo = EmbeddedMongo(os.path.join(work, "db"), nice=load_settings().embedded_db_nice).start()
    procs: list[subprocess.Popen] = []
    try:
        record_page(work)
        ports = {name: free_port() for name in ("fixed", "longtail", "keypool")}
        procs.append(start_nginx(work, "provider", provider_conf(work, ports)))
        for port in ports.values():
            wait_for(f"http://127.0.0.1:{port}/", procs[-1])
        result = {
            "mode": "slow provider (nginx echo_sleep), closed loop",
            "loop": args.loop or "the gateway's default",
            "caps": "lifted (--lift-caps)" if args.lift_caps else "defaults",
            "machine": {"cores": os.cpu_count(), "load_average": os.getloadavg()},
            "settings": {
                "seconds": args.seconds,
                "warmup": args.warmup,
                "timeout": args.timeout,
                "plan": PLAN,
                "keys": KEYS,
                "page_bytes": os.path.getsize(os.path.join(work, "page.json")),
            },
            "longtail_mean_s": round(statistics.fmean(longtail_delays()), 3),
            "scenarios": [],
        }
        if args.scenario in ("all", "closed"):
            gateway, _ = start_gateway(work, mongo, 1, gateway_settings(f"http://127.0.0.1:{ports['fixed']}", args))
            try:
                _, keys = customer(gateway.url, "latency@example.com", KEYS)
            finally:
                stop_gateway(gateway)
            groups = [(model, 1, args.connections) for model in args.models]
            if args.workers_scenario:
                groups += [(model, 2, args.workers_connections) for model in args.models]
            for model, workers, connections in groups:
                result["scenarios"] += run_group(work, mongo, ports, model, workers, connections, keys, args)
        if args.scenario in ("all", "keypool"):
            print("bench: provider key pool...", file=sys.stderr, flush=True)
            try:
                result["keypool"] = keypool(work, mongo, ports, args)
            except Exception as exc:  # a build without the pool may fail in ways of its own: reported, not raised
                result["keypool"] = {
                    "failed": f"{type(exc).__name__}: {exc}",
                    "goals": {"key pool scenario ran": False},
                }
        return result
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(15)
        mongo.stop()
        shutil.rmtree(work, ignore_errors=True)


# --- the report -------------------------------------------------------------------------------------------


def _errors(s: dict) -> str:
    e = s["gateway_errors"]
    parts = [f"{n}×{status}" for status, n in sorted(e["statuses"].items())]
    parts += [f"{n} {kind}" for kind, n in e["sockets"].items()]
    text = ", ".join(parts) or "0"
    if s.get("listen_overflows"):
        text += f" (and {s['listen_overflows']} connections delayed: listen queue full)"
    return text


def _cpu(figures: dict) -> str:
    return f"{figures['cpu_ms_per_call']:.2f}" if "cpu_ms_per_call" in figures else "–"  # a run before nginx's


def _slope(s: dict) -> str:
    return f"{s['rss_kb_per_added_call']:.0f} KB" if "rss_kb_per_added_call" in s else "–"


def report(result: dict) -> str:
    """Markdown: one row per closed-loop scenario, the key pool's figures, then every goal met or missed."""
    lines = [
        f"Slow provider (nginx `echo_sleep`: fixed 0.7 s, or long tail with mean {result['longtail_mean_s']} s), "
        f"{result['settings']['warmup']:g} s warm-up then {result['settings']['seconds']:g} s; "
        f"gateway caps: {result['caps']}, loop {result['loop']}; load average at start "
        f"{' / '.join(f'{x:.1f}' for x in result['machine']['load_average'])}",
    ]
    if result["scenarios"]:
        lines += [
            "",
            "| delay | in flight | gateway procs | nginx 2xx/s | gateway 2xx/s | ratio | p50 nginx / gateway (added) "
            "| p99 nginx / gateway (added) | gateway errors | CPU/answer nginx / gateway "
            "| RSS per call in flight: from idle / per further call |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for s in result["scenarios"]:
            n, g = s["nginx"], s["gateway"]
            lines.append(
                f"| {s['model']} | {s['connections']} | {s['workers']} | {n['ok_per_s']:.0f} | {g['ok_per_s']:.0f} | "
                f"**{s['ratio_2xx']:.2f}** | {n['p50_ms']:.0f} / {g['p50_ms']:.0f} ({s['added_p50_ms']:+.0f} ms) | "
                f"{n['p99_ms']:.0f} / {g['p99_ms']:.0f} ({s['added_p99_ms']:+.0f} ms) | {_errors(s)} | "
                f"{_cpu(n)} / {g['cpu_ms_per_call']:.2f} ms | {s['rss_kb_per_call_in_flight']:.0f} KB / "
                f"{_slope(s)} |"
            )
        lines += [
            "",
            "wrk closed loop (every connection one call in flight). p50/p99 are wrk's, over every answer (a quick 429 "
            "counts too); CPU per answer: of the reference's and the gateway's processes (/proc, user + system, over "
            "the measured run); `random`: the long tail's delays drawn at random per call; RSS per call in flight: "
            "the gateway's RSS under load minus its RSS idle, divided by the calls in flight (what serving at all costs once "
            "included), and per further call: the RSS difference from the level above on the same processes, "
            "divided by the difference in calls in flight (the goal is judged on it).",
        ]
    pool = result.get("keypool")
    if pool:
        lines += ["", f"| key pool: 3 provider keys × 100/s, {pool.get('rate', '?')} calls/s asked (open loop) | |"]
        lines.append("|---|---|")
        if "failed" in pool:
            lines.append(f"| did not run | {pool['failed']} |")
        else:
            lines += [
                f"| 2xx answered per s | **{pool['served_2xx_per_s']}** "
                f"(p50 {pool['p50_ms_2xx']} ms, p99 {pool['p99_ms_2xx']} ms) |",
                f"| answers by status | {', '.join(f'{n}×{st}' for st, n in sorted(pool['statuses'].items()))} |",
                f"| 429s to customers | {pool['customer_429']} ({pool['customer_429_from_provider']} the provider's, "
                f"{pool['customer_429_from_gateway']} the gateway's) |",
                f"| credits charged / X-Credits-Charged on 2xx | {pool['credits_charged']} / "
                f"{pool['x_credits_charged_2xx']} |",
            ]
            if pool.get("note"):
                lines.append(f"| note | {pool['note']} |")
    lines.append("")
    for s in result["scenarios"]:
        missed = [name for name, ok in s["goals"].items() if not ok]
        state = "met" if not missed else "MISSED: " + "; ".join(missed)
        lines.append(f"- {s['model']}, {s['connections']} in flight, {s['workers']} process(es): {state}")
    if pool:
        for name, ok in pool["goals"].items():
            lines.append(f"- key pool, {name}: {'met' if ok else 'MISSED'}")
    return "\n".join(lines)


def write_benchmarks_doc(table: str, command: str) -> None:
    path = os.path.join(ROOT, "docs", "benchmarks.md")
    with open(path) as fh:
        text = fh.read()
    if README_START not in text:
        raise SystemExit(f"docs/benchmarks.md has no {README_START} marker")
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with open(path, "w") as fh:
        fh.write(f"{head}{README_START}\nLatest run ({when}, `{command}`):\n\n{table}\n{README_END}{tail}")
