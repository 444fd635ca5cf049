"""Run the sandbox upstream: in-process (start) or as a command (main)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import weakref

import tornado.web
from tornado.httpserver import HTTPServer
from tornado.iostream import IOStream
from tornado.netutil import bind_sockets

from . import faults as faultlib
from .app import make_app
from .dialects import DIALECTS


class _CountingHTTPServer(HTTPServer):
    """Counts accepted TCP connections, so tests can see keep-alive reuse."""

    def initialize(self, *args, stats: dict, **kwargs) -> None:
        super().initialize(*args, **kwargs)
        self.stats = stats
        self.streams: weakref.WeakSet[IOStream] = weakref.WeakSet()

    def handle_stream(self, stream: IOStream, address: tuple) -> None:
        self.stats["connections"] += 1
        self.streams.add(stream)
        super().handle_stream(stream, address)


class SandboxServer:
    """A listening sandbox: .port, .url, .stats ({"connections", "requests"}), .stop()."""

    def __init__(self, app: tornado.web.Application, host: str, port: int):
        self.app = app
        self._sandbox = app.settings["sandbox"]
        self.stats = self._sandbox.stats
        self._server = _CountingHTTPServer(app, stats=self.stats)
        sockets = bind_sockets(port, host)
        self._server.add_sockets(sockets)
        self.port = sockets[0].getsockname()[1]
        shown = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
        self.url = f"http://[{shown}]:{self.port}" if ":" in shown else f"http://{shown}:{self.port}"

    def stop(self) -> None:
        """Stop listening, release hanging requests and close open connections."""
        self._server.stop()
        for future in list(self._sandbox.hangs):
            if not future.done():
                future.set_result(None)
        for stream in list(self._server.streams):
            stream.close()


def start(
    host: str,
    port: int,
    api_key: str,
    prefix: str = "/twitter",
    seed: int = 7,
    faults: str = "",
    dialect: str = "twitterapi",
) -> SandboxServer:
    """Listen on the current asyncio loop (port 0 picks a free port), speaking `dialect` (sandbox.dialects)."""
    return SandboxServer(make_app(api_key, prefix, seed, faults, dialect=dialect), host, port)


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The sandbox's options, for `python -m sandbox` and `social-gateway simulate-upstream` alike."""
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8100, help="port to listen on (default 8100)")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("UPSTREAM_API_KEY") or "sandbox-upstream-key",
        help="the provider key a request must carry: X-API-Key, or Authorization: Bearer in the socialdata dialect"
        " (env UPSTREAM_API_KEY)",
    )
    parser.add_argument(
        "--prefix",
        default=os.environ.get("UPSTREAM_PATH_PREFIX") or "/twitter",
        help="path prefix of the provider endpoints (env UPSTREAM_PATH_PREFIX)",
    )
    parser.add_argument("--seed", type=int, default=7, help="seed of the synthetic world")
    parser.add_argument(
        "--dialect",
        choices=DIALECTS,
        default="twitterapi",
        help="the kind of provider it speaks as: its paths, shapes, key header and errors (default twitterapi)",
    )
    parser.add_argument(
        "--faults",
        default=os.environ.get("SANDBOX_FAULTS", ""),
        help="run-wide fault spec, e.g. 'latency=50,error=503:0.1' (env SANDBOX_FAULTS)",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    try:
        faultlib.parse(args.faults)
    except ValueError as e:
        print(f"simulate-upstream: {e}", file=sys.stderr)
        return 2
    asyncio.run(_serve(args))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = add_arguments(
        argparse.ArgumentParser(
            prog="python -m sandbox",
            description="Serve the sandbox upstream: a deterministic simulated social-data provider.",
        )
    )
    return run(parser.parse_args(argv))


async def _serve(args: argparse.Namespace) -> None:
    server = start(args.host, args.port, args.api_key, args.prefix, args.seed, args.faults, args.dialect)
    print(
        f"sandbox upstream listening on {server.url} ({args.dialect}, prefix {args.prefix}, seed {args.seed}"
        f"{', faults ' + args.faults if args.faults else ''})",
        flush=True,
    )
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    server.stop()
