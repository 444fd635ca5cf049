"""A small keep-alive HTTP/1.1 load generator (used when wrk is absent, and for fixed-rate runs).

Closed loop (`rate=0`): each connection sends its next request when the last answer
arrived, which finds the saturation throughput. Open loop (`rate>0`): requests are
scheduled at a fixed rate and latency counts from the scheduled time, so a slow
server cannot hide its queueing (no coordinated omission).
"""

import asyncio
import itertools
import json
import sys
import time


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    if length:
        await reader.readexactly(length)
    return status


async def run(host: str, port: int, requests: list[bytes], seconds: float, connections: int, rate: float = 0.0) -> dict:
    """Drives `requests` (raw HTTP/1.1 request bytes, used round-robin) and returns the figures."""
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    cycle = itertools.cycle(requests)
    start = time.perf_counter()
    deadline = start + seconds
    interval = connections / rate if rate else 0.0

    async def connection(index: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        next_at = start + (index * interval / connections if rate else 0.0)
        try:
            while True:
                if rate:
                    delay = next_at - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    scheduled, next_at = next_at, next_at + interval
                else:
                    scheduled = time.perf_counter()
                if scheduled >= deadline:
                    return
                writer.write(next(cycle))
                status = await _read_response(reader)
                latencies.append(time.perf_counter() - scheduled)
                statuses[status] = statuses.get(status, 0) + 1
        finally:
            writer.close()

    await asyncio.gather(*[connection(i) for i in range(connections)])
    elapsed = time.perf_counter() - start
    latencies.sort()
    pick = lambda q: round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 3) if latencies else None
    return {
        "requests": len(latencies),
        "seconds": round(elapsed, 2),
        "rps": round(len(latencies) / elapsed, 1),
        "p50_ms": pick(0.50),
        "p99_ms": pick(0.99),
        "statuses": statuses,
    }


def request_bytes(host: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def main(argv: list[str]) -> None:
    """`python bench/load.py PORT RATE SECONDS CONNECTIONS PLAN.json` (PLAN: [[path, api key], ...]): the open loop
    in a process of its own, away from the caller's event loop (bench/streams.py runs its WebSocket clients on
    that); prints the figures as JSON."""
    port, rate, seconds, connections, plan = argv
    with open(plan) as fh:
        raw = [
            request_bytes("127.0.0.1", path, {"X-API-Key": key, "Cache-Control": "no-cache"})
            for path, key in json.load(fh)
        ]
    figures = asyncio.run(run("127.0.0.1", int(port), raw, float(seconds), int(connections), rate=float(rate)))
    print(json.dumps(figures))


if __name__ == "__main__":
    main(sys.argv[1:])
