"""Analytics and the request log: GET /usage/log filters (key, endpoint, status, REST or MCP, time, request id) and pages
over stored and buffered records, each once; /usage/summary per endpoint carries p50/p95 of the provider's
answer time as the records keep it; a revoked key's secret is never revealed again (410)."""

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from support import FAST

pytestmark = pytest.mark.gen_test(timeout=60)


def info(catalog, n: int = 0) -> str:
    return f"/social/user/info?userName={catalog['users'][n]['userName']}"


async def page_through(api, token: str, query: str, limit: int) -> list[dict]:
    seen, cursor = [], ""
    while True:
        status, page, _ = await api.call("GET", f"/usage/log?limit={limit}&cursor={cursor}&{query}", token=token)
        assert status == 200, page
        assert len(page["records"]) <= limit
        seen += page["records"]
        if not page["has_next_page"]:
            assert page["next_cursor"] == ""
            return seen
        cursor = page["next_cursor"]


@pytest.mark.settings(plan_rules=FAST)
async def test_request_log_filters_and_pages_over_stored_and_buffered_records(api, ctx, catalog):
    user, key = await api.funded_key(1_000_000)
    other = await api.new_key(user["token"], "second")
    token = user["token"]
    sent = await asyncio.gather(*(api.call("GET", info(catalog), key=key["key"]) for _ in range(14)))
    await ctx.meter.flush()  # these are stored; the next ones stay buffered
    sent += await asyncio.gather(*(api.call("GET", info(catalog), key=other["key"]) for _ in range(5)))
    refused = await api.call("GET", "/social/user/info?userName=", key=key["key"])  # 422: never recorded
    missing = await api.call("GET", "/social/user/info?userName=no_such_user_xyz", key=key["key"])
    assert refused[0] == 422 and {s for s, _, _ in sent} == {200}
    ids = [h["X-Request-ID"] for _, _, h in sent] + [missing[2]["X-Request-ID"]]

    every = await page_through(api, token, "", 4)
    assert sorted(r["request_id"] for r in every) == sorted(ids)  # each call once, across pages and the buffer
    stamps = [r["timestamp"] for r in every]
    assert stamps == sorted(stamps, reverse=True)
    assert all(r["upstream_ms"] is not None and r["upstream_ms"] >= 0 for r in every)

    by_key = await page_through(api, token, f"key_id={other['key_id']}", 2)
    assert len(by_key) == 5 and {r["key_id"] for r in by_key} == {other["key_id"]}
    one = await page_through(api, token, f"request_id={ids[3]}", 50)
    assert [r["request_id"] for r in one] == [ids[3]]
    assert await page_through(api, token, "endpoint=/social/user/followers", 50) == []
    assert len(await page_through(api, token, "endpoint=/social/user/info", 50)) == len(ids)
    assert len(await page_through(api, token, "status=2xx", 50)) == len(ids)  # the sandbox answers 200 throughout
    assert len(await page_through(api, token, "status=200", 50)) == len(ids)
    assert await page_through(api, token, "status=4xx", 50) == []
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    assert await page_through(api, token, f"since={future.replace('+', '%2B')}", 50) == []
    # Another account sees none of it.
    stranger = await api.register()
    assert await page_through(api, stranger["token"], f"request_id={ids[0]}", 50) == []

    for query, loc in (
        ("status=2x", "status"),
        ("status=402", "status"),  # refused before forwarding: never a usage record
        ("status=600", "status"),
        ("since=yesterday", "since"),
        ("limit=0", "limit"),
        ("limit=501", "limit"),
        ("key_id=abc", "key_id"),
        ("cursor=%21%21", "cursor"),
    ):
        status, body, _ = await api.call("GET", f"/usage/log?{query}", token=token)
        assert status == 422 and body["detail"][0]["loc"] == ["query", loc], query
    assert (await api.call("GET", "/usage/log"))[0] == 401


@pytest.mark.settings(plan_rules=FAST)
async def test_request_log_tells_an_agents_tool_calls_from_rest_calls(api, catalog):
    user, key = await api.funded_key(1_000_000)
    rest = await api.call("GET", info(catalog), key=key["key"])
    arguments = {"user_name": catalog["users"][0]["userName"]}
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "get_user", "arguments": arguments}}
    status, answer, _ = await api.call("POST", "/mcp", call, key=key["key"])
    assert status == 200 and not answer["result"].get("isError"), answer
    token = user["token"]
    tools = await page_through(api, token, "via=mcp", 50)
    assert [(r["via"], r["tool"], r["endpoint"]) for r in tools] == [("mcp", "get_user", "/social/user/info")]
    rests = await page_through(api, token, "via=rest", 50)
    assert [(r["request_id"], r["via"], r["tool"]) for r in rests] == [(rest[2]["X-Request-ID"], "rest", None)]
    assert len(await page_through(api, token, "", 50)) == 2
    status, body, _ = await api.call("GET", "/usage/log?via=soap", token=token)
    assert status == 422 and body["detail"][0]["loc"] == ["query", "via"]


@pytest.mark.settings(plan_rules=FAST)
async def test_per_endpoint_summary_has_latency_percentiles_and_per_key_totals(api, ctx, catalog):
    user, key = await api.funded_key(1_000_000)
    await asyncio.gather(*(api.call("GET", info(catalog, i % 3), key=key["key"]) for i in range(20)))
    await ctx.meter.flush()
    stored = await ctx.usage.records(
        {"account_id": (await api.call("GET", "/account", token=user["token"]))[1]["account_id"]}
    )
    times = sorted(r["ms"] for r in stored)  # what the meter measured, kept with each record
    assert len(times) == 20
    status, rows, _ = await api.call("GET", "/usage/summary?days=7&group_by=endpoint", token=user["token"])
    assert status == 200 and len(rows) == 1
    row = rows[0]
    assert row["endpoint"] == "/social/user/info" and row["calls"] == 20 and row["samples"] == 20
    assert row["p50_ms"] == times[9] and row["p95_ms"] == times[18]  # nearest rank
    rows = (await api.call("GET", "/usage/summary?days=7&group_by=key", token=user["token"]))[1]
    assert rows == [
        {
            "key_id": key["key_id"],
            "calls": 20,
            "credits": rows[0]["credits"],
            "errors": 0,
            "from_cache": 0,  # the cache is off in these tests
            "credits_saved": 0,
        }
    ]
    assert "p50_ms" not in rows[0]  # percentiles only per endpoint


async def test_a_revoked_key_is_never_revealed_again(api):
    user = await api.register()
    key = await api.new_key(user["token"], "old")
    status, body, _ = await api.call("GET", f"/keys/{key['key_id']}/reveal", token=user["token"])
    assert status == 200 and body["key"] == key["key"]
    assert (await api.call("POST", f"/keys/{key['key_id']}/revoke", token=user["token"]))[0] == 200
    status, body, _ = await api.call("GET", f"/keys/{key['key_id']}/reveal", token=user["token"])
    assert status == 410 and body == {"detail": "This key is revoked: its secret is no longer shown"}
    assert key["key"] not in str(body)
