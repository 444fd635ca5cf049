"""Fault injection: make the sandbox upstream misbehave the ways real upstreams do.

A fault spec is a comma-separated list of items:

    latency=MS       wait MS milliseconds before answering
    error=CODE:PROB  answer HTTP CODE (e.g. 500, 502, 503) with probability PROB (0..1,
                     default 1); several error items are tried in turn
    hang             never answer; hold the connection until the client gives up
                     (or the server stops)
    malformed        HTTP 200 whose body is not JSON (the first half of the real body)
    truncate         declare the full Content-Length, send half the body, close
    reset            close the TCP connection without any response (an RST)
    oversize=BYTES   the real JSON body, padded with whitespace to at least BYTES

The run-wide spec (make_app(faults=...), --faults, SANDBOX_FAULTS) applies to every
provider request; an `X-Sim-Fault` request header replaces it for that request
("none" or an empty value: no faults).  Latency comes first; then the first of reset,
hang, error, truncate and malformed that is present decides the outcome; oversize pads
the body of whatever 200 is sent.  Probabilities draw from a random.Random of their
own, so PROB 1 always and PROB 0 never fires.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from http.client import responses

from tornado.iostream import StreamClosedError
from tornado.web import RequestHandler

HEADER = "X-Sim-Fault"
HANG_SECONDS = 3600.0


@dataclass(frozen=True)
class Faults:
    latency_ms: float = 0.0
    errors: tuple[tuple[int, float], ...] = ()
    hang: bool = False
    malformed: bool = False
    truncate: bool = False
    reset: bool = False
    oversize: int = 0


def parse(spec: str) -> Faults | None:
    """The Faults of a spec, None when it asks for none.  Raises ValueError."""
    spec = spec.strip()
    if not spec or spec.lower() == "none":
        return None
    fields: dict = {"errors": []}
    for item in (x.strip() for x in spec.split(",")):
        name, _, value = item.partition("=")
        name = name.strip().lower()
        try:
            if name == "latency" and value:
                fields["latency_ms"] = float(value)
            elif name == "error" and value:
                code, _, prob = value.partition(":")
                p = float(prob) if prob else 1.0
                if not 400 <= int(code) <= 599 or not 0.0 <= p <= 1.0:
                    raise ValueError
                fields["errors"].append((int(code), p))
            elif name == "oversize" and value:
                fields["oversize"] = int(value)
            elif name in ("hang", "malformed", "truncate", "reset") and not value:
                fields[name] = True
            else:
                raise ValueError
        except ValueError:
            raise ValueError(f"bad fault item: {item!r}") from None
    fields["errors"] = tuple(fields["errors"])
    return Faults(**fields)


async def deliver(
    handler: RequestHandler,
    faults: Faults,
    rng: random.Random,
    hangs: set[asyncio.Future],
    status: int,
    body: bytes,
    error_body: Callable[[str], bytes],
) -> None:
    """Send (status, body) through `handler`, distorted as `faults` says; an injected error's body is
    `error_body(message)`, in the dialect's form."""
    if faults.latency_ms > 0:
        await asyncio.sleep(faults.latency_ms / 1000)
    if faults.reset:
        stream = handler.detach()
        if not stream.closed():  # the client may have given up during the latency
            # SO_LINGER with a zero timeout turns close() into an RST instead of a FIN.
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            stream.close()
        return
    if faults.hang:
        await _hang(handler, hangs)
        return
    for code, prob in faults.errors:
        if rng.random() < prob:
            handler.set_status(code)
            handler.finish(error_body(f"simulated upstream error {code}"))
            return
    if status == 200 and len(body) < faults.oversize:
        body += b" " * (faults.oversize - len(body))
    if faults.truncate:
        stream = handler.detach()
        head = (
            f"HTTP/1.1 {status} {responses.get(status, 'Unknown')}\r\n"
            f"Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        try:
            await stream.write(head + body[: len(body) // 2])
        except StreamClosedError:
            pass
        stream.close()
        return
    if faults.malformed:
        status, body = 200, body[: max(len(body) // 2, 1)]
    handler.set_status(status)
    handler.finish(body)


async def _hang(handler: RequestHandler, hangs: set[asyncio.Future]) -> None:
    """Wait until the client disconnects (the handler's on_connection_close resolves
    handler.hang) or the server stops (SandboxServer.stop resolves every hang)."""
    future = asyncio.get_running_loop().create_future()
    handler.hang = future
    hangs.add(future)
    try:
        await asyncio.wait([future], timeout=HANG_SECONDS)
    finally:
        hangs.discard(future)
    handler.detach().close()
