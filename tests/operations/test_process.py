"""The gateway as a real process: SIGTERM under load loses nothing; SIGKILL loses at most the
flush window, never leaves a charge without its record, and a restart returns the dead lease."""

import asyncio
import re
import signal
import uuid

import orjson
import pytest
from support import Gateway, account_with_keys, ledger_of
from tornado.httpclient import HTTPClientError

from app.embedded import free_port

pytestmark = pytest.mark.gen_test(timeout=120)
INITIAL = 1_000_000


async def load(gw: Gateway, key: str, catalog: dict, count: int):
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"

    async def one():
        try:
            return await gw.call("GET", path, **{"X-API-Key": key})
        except (OSError, HTTPClientError):  # the connection died with the process
            return None

    return [asyncio.ensure_future(one()) for _ in range(count)]


async def served_some(calls, at_least: int = 20) -> None:
    """Waits until the load is really under way, however slow the machine."""
    for _ in range(600):
        if sum(c.done() for c in calls) >= at_least:
            return
        await asyncio.sleep(0.02)


async def test_sigterm_under_load_loses_nothing(mongo, upstream_url, catalog):
    db_name = f"p_{uuid.uuid4().hex[:10]}"
    gw = await Gateway(mongo.uri, upstream_url, db_name).launch()
    user, (key,), _ = await account_with_keys(gw, INITIAL, 1)
    calls = await load(gw, key, catalog, 300)
    await served_some(calls)
    gw.proc.send_signal(signal.SIGTERM)
    responses = await asyncio.gather(*calls)
    assert gw.proc.wait(30) == 0
    served = [r for r in responses if r is not None and r.code == 200]
    charged = sum(int(r.headers["X-Credits-Charged"]) for r in served)
    assert served, "some calls were served before the signal"
    assert all(r is None or r.code in (200, 503, 599) for r in responses)
    account, records = await ledger_of(mongo.uri, db_name, user["account_id"])
    assert len([r for r in records if r["status"] == 200]) == len(served)
    assert sum(r["credits"] for r in records) == charged
    assert account["leases"] == {} and account["credits"] == INITIAL - charged


async def test_sigkill_then_restart_reconciles(mongo, upstream_url, catalog):
    db_name = f"p_{uuid.uuid4().hex[:10]}"
    port = free_port()
    gw = await Gateway(mongo.uri, upstream_url, db_name, port).launch()
    user, (key,), _ = await account_with_keys(gw, INITIAL, 1)
    calls = await load(gw, key, catalog, 300)
    await served_some(calls)
    gw.proc.send_signal(signal.SIGKILL)
    responses = await asyncio.gather(*calls)
    gw.proc.wait(10)
    served = [r for r in responses if r is not None and r.code == 200]
    account, records = await ledger_of(mongo.uri, db_name, user["account_id"])
    assert len(records) <= len(served)  # at most the flush window is lost...
    assert account["leases"]  # ...and the dead process still holds its lease
    # A restart on the same node returns the dead lease at once, counting only persisted usage.
    gw2 = await Gateway(mongo.uri, upstream_url, db_name, port).launch()
    account, records = await ledger_of(mongo.uri, db_name, user["account_id"])
    assert account["leases"] == {}
    assert account["credits"] == INITIAL - sum(r["credits"] for r in records)
    status = orjson.loads(
        (await gw2.call("POST", "/auth/login", {"email": "x@example.com", "password": "nope nope"})).body
    )
    assert "detail" in status
    gw2.proc.send_signal(signal.SIGTERM)
    assert gw2.proc.wait(30) == 0


async def test_served_access_log_lines_are_batched_in_the_log_format(mongo, upstream_url, catalog, tmp_path):
    log_path = tmp_path / "gateway.log"
    gw = Gateway(mongo.uri, upstream_url, f"p_{uuid.uuid4().hex[:10]}", LOG_LEVEL="INFO")
    with open(log_path, "wb") as log:
        gw.stderr = log
        await gw.launch()
    user, keys, _ = await account_with_keys(gw, INITIAL, 1)
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    response = await gw.call("GET", path, **{"X-API-Key": keys[0], "X-Request-ID": "served-1"})
    assert response.code == 200

    def access_lines() -> list[str]:
        return [line for line in log_path.read_text().splitlines() if " INFO gateway.access: " in line]

    for _ in range(100):  # written within the access log's flush interval, while the process runs
        if any('"served-1"' in line for line in access_lines()):
            break
        await asyncio.sleep(0.05)
    line = next(line for line in access_lines() if '"served-1"' in line)
    # The shape every other log line has (LOG_FORMAT): date, time with milliseconds, level, logger.
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO gateway\.access: \{.*\}", line)
    data = orjson.loads(line.split(": ", 1)[1])
    assert list(data)[:7] == ["request_id", "method", "route", "status", "ms", "ip", "account"]
    assert data["route"] == "/social/user/info" and data["status"] == 200 and data["account"] == user["account_id"]
    assert data["credits"] == int(response.headers["X-Credits-Charged"]) and keys[0] not in log_path.read_text()
    # The lines of the last calls are written on shutdown, not lost with the buffer.
    last = await gw.call("GET", "/healthz", **{"X-Request-ID": "served-last"})
    assert last.code == 200
    assert gw.stop() == 0
    assert any('"served-last"' in line for line in access_lines())


async def test_json_logs_are_one_object_per_line_without_secrets(mongo, upstream_url, catalog, tmp_path):
    """LOG_FORMAT=json at DEBUG: every line the process logs, access and application alike, is one JSON
    object (time in ISO 8601 UTC, level, logger, message), and none holds a key or a password."""
    log_path = tmp_path / "gateway.log"
    gw = Gateway(mongo.uri, upstream_url, f"j_{uuid.uuid4().hex[:10]}", LOG_LEVEL="DEBUG", LOG_FORMAT="json")
    with open(log_path, "wb") as log:
        gw.stderr = log
        await gw.launch()
    user, keys, _ = await account_with_keys(gw, INITIAL, 1)
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    assert (await gw.call("GET", path, **{"X-API-Key": keys[0], "X-Request-ID": "json-1"})).code == 200
    assert gw.stop() == 0
    lines = [orjson.loads(line) for line in log_path.read_text().splitlines()]  # each line parses alone
    assert all(list(line)[:4] == ["time", "level", "logger", "message"] for line in lines)
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["time"]) for line in lines)
    access = next(line for line in lines if line.get("request_id") == "json-1")
    assert access["logger"] == "gateway.access" and access["message"] == "GET /social/user/info 200"
    assert access["account"] == user["account_id"] and any(line["logger"] != "gateway.access" for line in lines)
    assert any(line["message"].startswith("social-gateway listening on") for line in lines)  # start-up too
    assert keys[0] not in log_path.read_text() and "process test pass" not in log_path.read_text()
