"""Which upstream HTTP client: the candidates measured against a slow provider, each in the same bare proxy.

The provider and the reference are bench/latency.py's: an nginx with the echo module serving one recorded
20-post page after `echo_sleep` (`fixed` 0.7 s, or `longtail`: median 0.6 s, long tail to 1.8 s, mean 0.69 s),
and nginx `proxy_pass` with a keep-alive pool in front of it. For each delay model and each level of calls in
flight, wrk drives (closed loop, bench/measure.py `wrk`) the reference, then a bare Tornado proxy per client
candidate, each in its own process (`--serve`: one handler, GET in, GET to the provider with an X-API-Key
header, the body out; uvloop, listen backlog 4096, RLIMIT_NOFILE raised), back to back:

- `curl`: Tornado's CurlAsyncHTTPClient (libcurl), max_clients = the calls in flight; `curl-4x`: 4 times that
  (Tornado's one tuning knob that matters here: a free easy handle is always there when a call comes in);
- `aiohttp`: aiohttp's ClientSession, TCPConnector(limit=0), a DummyCookieJar, URLs not re-quoted;
- `httptools`: the gateway's own keep-alive pool (social/http1.py): asyncio protocol, httptools' parser, idle LIFO;
- `h2`: httpx over HTTP/2 to the provider (cleartext, prior knowledge: nginx `listen ... http2`); httpcore
  multiplexes at most 100 streams on its one connection per client, so the proxy spreads its calls over
  ceil(in flight / 100) AsyncClients, the least busy first;
- `curl-h2` (not in the default list): libcurl over HTTP/2 with prior knowledge (prepare_curl_callback), multiplexed.

Reported per (model, in flight, client): 2xx/s and the ratio to nginx, p50/p99 and what the proxy adds over
nginx's, errors, the proxy process's CPU ms per call (/proc) and its RSS per call in flight (RSS under load minus
idle, over the calls in flight). Writes bench/results/clients.json and prints a Markdown table.

    .venv/bin/python -m bench.clients [--seconds 10] [--warmup 3] [--in-flight 100,400,1000,2000]
        [--models longtail,fixed] [--clients curl,curl-4x,aiohttp,httptools,h2]    # the defaults: ~15 minutes
    ./dev bench --clients [curl,h2] [the other options]

httptools is the gateway's own (its candidate is social/http1.py itself), aiohttp comes with the
test extra; httpx[http2] is not installed: `.venv/bin/pip install 'httpx[http2]'` (a candidate whose package is
missing is reported as failed, its proxy's error in the row).

Reading it: the long-tail rows judge p99 (a fixed delay keeps a closed loop in waves); both models judge
throughput and p50, and CPU per call says what is left for the gateway's own work.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

from app.server import LISTEN_BACKLOG, raise_open_file_limit
from bench.measure import HERE, UPSTREAM_KEY, rss_bytes, start_nginx

CLIENTS = ("curl", "curl-4x", "aiohttp", "httptools", "h2", "curl-h2")
HEADERS = {"X-API-Key": UPSTREAM_KEY, "Accept": "application/json"}
CONNECT_TIMEOUT, REQUEST_TIMEOUT = 2.0, 15.0
H2_STREAMS = 100  # httpcore's cap on concurrent streams per HTTP/2 connection (its local MAX_CONCURRENT_STREAMS)
# The provider's HTTP/2 servers, added to bench/latency.py's provider configuration (same page, same delays).
H2_SERVER = """    server {{
        listen 127.0.0.1:{port} http2 backlog=4096;
        http2_max_concurrent_streams 4000;
        root {work};
        location = /page {{ internal; default_type application/json; try_files /page.json =404; }}
        location / {{ echo_sleep {delay}; echo_exec /page; }}
    }}
"""
DELAYS = {"fixed": "0.7", "longtail": "$longtail"}


# --- the proxy (one process per candidate: `--serve`) ---------------------------------------------------


def make_fetch(client: str, upstream: str, max_clients: int):
    """`async fetch(uri) -> (status, body)` for the candidate, created on the running loop."""
    base = upstream.rstrip("/")
    if client.startswith("curl"):
        import pycurl
        from tornado.curl_httpclient import CurlAsyncHTTPClient
        from tornado.httpclient import HTTPRequest

        size = max_clients * (4 if client == "curl-4x" else 1)
        http = CurlAsyncHTTPClient(force_instance=True, max_clients=size)
        prepare = None
        if client == "curl-h2":
            prepare = lambda curl: curl.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE)

        async def fetch(uri: str) -> tuple[int, bytes]:
            request = HTTPRequest(
                base + uri,
                headers=HEADERS,
                connect_timeout=CONNECT_TIMEOUT,
                request_timeout=REQUEST_TIMEOUT,
                follow_redirects=False,
                prepare_curl_callback=prepare,
            )
            response = await http.fetch(request, raise_error=False)
            return (response.code if response.code != 599 else 502), response.body or b""

        return fetch
    if client == "aiohttp":
        import aiohttp
        from yarl import URL

        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=300),
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT, connect=CONNECT_TIMEOUT),
            auto_decompress=False,
        )

        async def fetch(uri: str) -> tuple[int, bytes]:
            async with session.get(URL(base + uri, encoded=True), headers=HEADERS, allow_redirects=False) as response:
                return response.status, await response.read()

        return fetch
    if client == "httptools":
        from social.http1 import Http1Pool  # the gateway's own connections to the provider

        pool = Http1Pool(base, CONNECT_TIMEOUT, 64 << 20)
        lines = "".join(f"{name}: {value}\r\n" for name, value in HEADERS.items()).encode("latin-1")

        async def fetch(uri: str) -> tuple[int, bytes]:
            answer = await pool.get(base + uri, lines, REQUEST_TIMEOUT)
            return answer.status, answer.body

        return fetch
    if client == "h2":
        import httpx

        shards = [
            httpx.AsyncClient(
                http1=False,
                http2=True,
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=None, keepalive_expiry=300),
                timeout=httpx.Timeout(REQUEST_TIMEOUT, connect=CONNECT_TIMEOUT),
            )
            for _ in range(max(1, math.ceil(max_clients / H2_STREAMS)))
        ]
        busy = [0] * len(shards)

        async def fetch(uri: str) -> tuple[int, bytes]:
            i = busy.index(min(busy))
            busy[i] += 1
            try:
                response = await shards[i].get(base + uri, headers=HEADERS)
            finally:
                busy[i] -= 1
            return response.status_code, response.content

        return fetch
    raise SystemExit(f"unknown client {client!r}: one of {', '.join(CLIENTS)}")


async def serve(client: str, port: int, upstream: str, max_clients: int) -> None:
    import tornado.web

    fetch = make_fetch(client, upstream, max_clients)

    class Proxy(tornado.web.RequestHandler):
        def compute_etag(self) -> None:  # a proxy does not hash each answer
            return None

        async def get(self) -> None:
            if self.request.path == "/ready":
                self.finish(b"ok")
                return
            try:
                status, body = await fetch(self.request.uri)
            except Exception as exc:  # every candidate's failures alike: a 502 (wrk counts it)
                status, body = 502, f"{type(exc).__name__}: {exc}".encode()
            self.set_status(status)
            self.set_header("Content-Type", "application/json")
            self.finish(body)

    tornado.web.Application([(r"/.*", Proxy)]).listen(port, "127.0.0.1", backlog=LISTEN_BACKLOG)
    await asyncio.Event().wait()


# --- the measurement ----------------------------------------------------------------------------------------


def start_proxy(work: str, client: str, upstream: str, in_flight: int) -> tuple[subprocess.Popen, int]:
    from app.embedded import free_port
    from gateway_testing.stack import request, wait_for

    port = free_port()
    log = open(os.path.join(work, f"proxy-{client}.log"), "ab")
    command = [sys.executable, "-m", "bench.clients", "--serve", client, "--port", str(port)]
    command += ["--upstream", upstream, "--max-clients", str(in_flight)]
    proc = subprocess.Popen(command, stdout=log, stderr=log, cwd=os.path.dirname(HERE))  # the project: bench.*
    log.close()
    wait_for(f"http://127.0.0.1:{port}/ready", proc, seconds=30)
    for i in range(5):  # the client's first connections and lazy set-up, before the idle RSS
        request("GET", f"http://127.0.0.1:{port}/social/tweet/advanced_search?query=warm{i}", timeout=10)
    return proc, port


def run(args) -> dict:
    from app.embedded import free_port
    from bench import latency
    from bench.static import record_page
    from gateway_testing.stack import wait_for

    latency.ensure_tools()
    raise_open_file_limit()
    plan = [(f"/social/tweet/advanced_search?query=from%3Auser{i}", "") for i in range(100)]
    work = tempfile.mkdtemp(prefix="gw-bench-clients-")
    procs: list[subprocess.Popen] = []
    try:
        record_page(work)
        ports = {name: free_port() for name in ("fixed", "longtail", "keypool", "h2-fixed", "h2-longtail")}
        conf = latency.provider_conf(work, ports).rstrip()
        assert conf.endswith("}"), "the provider configuration ends with its http block"
        h2 = "".join(H2_SERVER.format(port=ports[f"h2-{m}"], work=work, delay=d) for m, d in DELAYS.items())
        procs.append(start_nginx(work, "provider", conf[:-1] + h2 + "}\n"))
        for model in DELAYS:  # (the HTTP/2 ports, of the same process, would not answer HTTP/1)
            wait_for(f"http://127.0.0.1:{ports[model]}/", procs[-1])
        result = {
            "mode": "bare proxy per upstream client vs nginx proxy_pass, slow provider, closed loop",
            "machine": {"cores": os.cpu_count(), "load_average": os.getloadavg()},
            "settings": {
                "seconds": args.seconds,
                "warmup": args.warmup,
                "timeout": args.timeout,
                "page_bytes": os.path.getsize(os.path.join(work, "page.json")),
            },
            "versions": versions(),
            "note": "each scenario's `gateway` figures are the bare proxy's (bench/latency.py's compare())",
            "longtail_mean_s": round(sum(latency.longtail_delays()) / 256, 3),
            "scenarios": [],
        }
        for model in args.models:
            reference, reference_port = latency.start_reference(work, ports[model], 1)
            try:
                for n in args.in_flight:
                    print(f"bench: {model}, {n} in flight: nginx...", file=sys.stderr, flush=True)
                    nginx = latency.closed_loop(reference_port, plan, args, n)
                    for client in args.clients:
                        print(f"bench: {model}, {n} in flight: {client}...", file=sys.stderr, flush=True)
                        h2 = client in ("h2", "curl-h2")
                        upstream = f"http://127.0.0.1:{ports[('h2-' if h2 else '') + model]}"
                        result["scenarios"].append(measure(work, client, upstream, model, n, nginx, plan, args))
            finally:
                reference.terminate()
                reference.wait(15)
        return result
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(15)
        shutil.rmtree(work, ignore_errors=True)


def measure(work, client, upstream, model, n, nginx, plan, args) -> dict:
    from bench import latency

    try:
        proc, port = start_proxy(work, client, upstream, n)
    except Exception as exc:
        with open(os.path.join(work, f"proxy-{client}.log"), errors="replace") as fh:
            tail = fh.read()[-400:]
        return {"model": model, "connections": n, "client": client, "failed": f"{exc}; {tail}"}
    try:
        time.sleep(1)
        rss_idle = rss_bytes(proc.pid)
        figures = latency.closed_loop(port, plan, args, n, [proc.pid])
        scenario = latency.compare(latency.Scenario(model, 1, n), nginx, figures, rss_idle)
        del scenario["goals"], scenario["workers"]
        return {"client": client, **scenario}
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("tornado", "pycurl", "aiohttp", "httptools", "httpx", "h2", "uvloop"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    try:
        import pycurl

        found["libcurl"] = pycurl.version.split()[1]
    except ImportError:
        pass
    found["nginx"] = subprocess.run(["nginx", "-v"], capture_output=True, text=True).stderr.strip()
    return found


def report(result: dict) -> str:
    from bench.latency import _errors

    lines = [
        f"Bare proxy per upstream client vs nginx `proxy_pass`; provider: nginx `echo_sleep` (fixed 0.7 s, or long "
        f"tail, mean {result['longtail_mean_s']} s); {result['settings']['warmup']:g} s warm-up then "
        f"{result['settings']['seconds']:g} s per row; load average at start "
        f"{' / '.join(f'{x:.1f}' for x in result['machine']['load_average'])}",
        "",
        "| delay | in flight | client | 2xx/s | ratio to nginx | p50 (added) | p99 (added) | errors "
        "| CPU ms/call | RSS KB per call in flight |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    shown = set()
    for s in result["scenarios"]:
        key = (s["model"], s["connections"])
        if key not in shown and "nginx" in s:
            shown.add(key)
            n = s["nginx"]
            lines.append(
                f"| {s['model']} | {s['connections']} | nginx | {n['ok_per_s']:.0f} | 1.00 | {n['p50_ms']:.0f} ms "
                f"| {n['p99_ms']:.0f} ms | {n['errors']} | | |"
            )
        if "failed" in s:
            lines.append(f"| {s['model']} | {s['connections']} | {s['client']} | failed: {s['failed'][:200]} |")
            continue
        g = s["gateway"]
        lines.append(
            f"| {s['model']} | {s['connections']} | {s['client']} | {g['ok_per_s']:.0f} | **{s['ratio_2xx']:.2f}** "
            f"| {g['p50_ms']:.0f} ms ({s['added_p50_ms']:+.0f}) | {g['p99_ms']:.0f} ms ({s['added_p99_ms']:+.0f}) "
            f"| {_errors(s)} | {g['cpu_ms_per_call']:.2f} | {s['rss_kb_per_call_in_flight']:.0f} |"
        )
    lines += [
        "",
        "wrk closed loop (each connection one call in flight); 2xx/s over the whole seconds of each run after its "
        "first two; CPU per call of the proxy process (/proc); RSS per call in flight: under load minus idle, over "
        "the calls in flight. Long tail judges p99; both models judge throughput and p50.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--warmup", type=float, default=3)
    parser.add_argument("--timeout", type=float, default=10, help="wrk's timeout per call, seconds")
    parser.add_argument("--in-flight", default="100,400,1000,2000")
    parser.add_argument("--models", default="longtail,fixed")
    default = "curl,curl-4x,aiohttp,httptools,h2"
    parser.add_argument("--clients", nargs="?", const=default, default=default, help=f"of {','.join(CLIENTS)}")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "clients.json"))
    parser.add_argument("--serve", choices=CLIENTS, help=argparse.SUPPRESS)  # the proxy process
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    parser.add_argument("--max-clients", type=int, default=100, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        import uvloop

        raise_open_file_limit()
        uvloop.install()
        asyncio.run(serve(args.serve, args.port, args.upstream, args.max_clients))
        return
    args.in_flight = [int(n) for n in args.in_flight.split(",") if n]
    args.models = [m for m in args.models.split(",") if m]
    args.clients = [c for c in args.clients.split(",") if c]
    unknown = set(args.clients) - set(CLIENTS)
    if unknown:
        parser.error(f"unknown clients {', '.join(sorted(unknown))}: of {', '.join(CLIENTS)}")
    result = run(args)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=2)
    print(report(result))
    print(f"(figures: {args.out})")


if __name__ == "__main__":
    main()
