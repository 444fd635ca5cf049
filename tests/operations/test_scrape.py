"""/metrics under `serve --workers 2` on the main port: whichever worker answers, the scrape holds every
worker's series (labelled worker), their totals equal the calls made, and no counter goes backwards
across scrapes, a worker killed and restarted included."""

import asyncio
import os
import signal
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import Gateway, account_with_keys

pytestmark = pytest.mark.gen_test(timeout=120)
ROUTE = "/social/user/info"


async def scrape(gw: Gateway) -> dict:
    """{(sample name, frozenset(labels)): value} of one scrape of the main port."""
    response = await gw.call("GET", "/metrics")
    assert response.code == 200
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.body.decode())
        for s in family.samples
    }


def total(values: dict, name: str, **labels) -> float:
    """The sum over workers: what `sum(...)` in Prometheus reads."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in values.items() if n == name and wanted <= ls)


def children(pid: int) -> set[int]:
    """The processes `pid` forked (here the workers: the database and upstream are the tests')."""
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        return {int(child) for child in fh.read().split()}


def per_worker(values: dict, name: str, **labels) -> dict:
    wanted = set(labels.items())
    return {dict(ls)["worker"]: v for (n, ls), v in values.items() if n == name and wanted <= ls}


async def test_two_workers_add_up_and_never_go_backwards(mongo, upstream_url, catalog):
    gw = await Gateway(mongo.uri, upstream_url, f"m_{uuid.uuid4().hex[:10]}", workers=2).launch()
    _, keys, _ = await account_with_keys(gw, 1_000_000, 1)
    path = f"{ROUTE}?userName={catalog['users'][0]['userName']}"
    calls = 0
    # One connection per call, 20 at a time, until both workers took some: the workers share one listening
    # socket, and the kernel may hand most connections to one of them.
    while calls < 400:
        for _ in range(20):
            assert (await gw.call("GET", path, **{"X-API-Key": keys[0], "Connection": "close"})).code == 200
        calls += 20
        served = per_worker(await scrape(gw), "gateway_requests_total", route=ROUTE, status="200")
        if served.get("0") and served.get("1"):
            break
    scrapes = [await scrape(gw) for _ in range(6)]
    for values in scrapes:
        assert per_worker(values, "gateway_scrape_worker_up") == {"0": 1, "1": 1}
        assert set(per_worker(values, "gateway_build_info")) == {"0", "1"}
        assert total(values, "gateway_requests_total", route=ROUTE, status="200") == calls
        assert total(values, "gateway_upstream_latency_seconds_count", route=ROUTE) == calls
        assert total(values, "gateway_request_duration_seconds_bucket", route=ROUTE, le="+Inf") == calls
    served = per_worker(scrapes[-1], "gateway_requests_total", route=ROUTE, status="200")
    assert set(served) == {"0", "1"} and all(served.values()), "both workers served calls"
    assert not any("worker-metrics" in str(labels) for _, labels in scrapes[-1])  # the hand-over is not a request

    # A worker killed: the parent starts it again, and its counters go on from what was last scraped.
    workers = children(gw.proc.pid)
    before = scrapes[-1]
    os.kill(min(workers), signal.SIGKILL)
    for _ in range(300):  # until the new worker answers its siblings
        if children(gw.proc.pid) - workers:
            if per_worker(await scrape(gw), "gateway_scrape_worker_up") == {"0": 1, "1": 1}:
                break
        await asyncio.sleep(0.1)
    for _ in range(5):
        assert (await gw.call("GET", path, **{"X-API-Key": keys[0], "Connection": "close"})).code == 200
    after = await scrape(gw)
    for (name, labels), value in before.items():
        if name.endswith(("_total", "_count", "_bucket", "_sum")) and not name.startswith("process_"):
            assert after.get((name, labels), 0) >= value, (name, labels)
    assert total(after, "gateway_requests_total", route=ROUTE, status="200") == calls + 5
    # rate() over two scrapes across the restart: the calls made between them, never a reset.
    assert (
        total(after, "gateway_requests_total", route=ROUTE, status="200")
        - total(before, "gateway_requests_total", route=ROUTE, status="200")
        == 5
    )
    assert gw.stop() == 0
