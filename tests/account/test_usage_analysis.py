"""GET /usage/summary and GET /usage/export against a known set of calls: sums by day, endpoint and
key from the stored buckets plus what is still buffered, and every record exported exactly once."""

import csv
import io
from datetime import UTC, datetime, timedelta

import openapi_schema_validator
import orjson
import pytest
from support import FAST
from tornado.httpclient import HTTPRequest

from storage.usage import buckets_of

pytestmark = pytest.mark.gen_test(timeout=60)


async def known_calls(api, ctx, catalog) -> tuple[dict, dict, dict, dict]:
    """Two keys: A calls user/info 3x and a 501 endpoint once; B calls user/info once and trends 2x.
    A flush between them: part of the usage is stored, part still buffered."""
    user, a = await api.funded_key(1_000_000)
    b = await api.new_key(user["token"])
    charges: dict = {}
    info = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    for key, path in [(a, info)] * 3 + [(a, "/social/community/moderators?community_id=1")]:
        status, _, headers = await api.call("GET", path, key=key["key"])
        charges.setdefault((key["key_id"], path.split("?")[0]), []).append(
            (status, int(headers.get("X-Credits-Charged", 0)))
        )
    await ctx.meter.flush()
    for key, path in [(b, info), (b, "/social/trends"), (b, "/social/trends")]:
        status, _, headers = await api.call("GET", path, key=key["key"])
        charges.setdefault((key["key_id"], path.split("?")[0]), []).append(
            (status, int(headers.get("X-Credits-Charged", 0)))
        )
    assert len(ctx.meter.buffer) == 3 and (await ctx.usage.records({"account_id": user["account_id"]}))
    return user, a, b, charges


@pytest.mark.settings(plan_rules=FAST, flush_interval=3600)
async def test_summary_by_key_endpoint_and_day(api, ctx, catalog):
    user, a, b, charges = await known_calls(api, ctx, catalog)
    today = datetime.now(UTC).date().isoformat()
    expected = {
        (key_id, endpoint): (len(calls), sum(c for _, c in calls), sum(1 for s, _ in calls if s != 200))
        for (key_id, endpoint), calls in charges.items()
    }
    assert expected[(a["key_id"], "/social/community/moderators")] == (1, 0, 1)  # a 501: an error, not charged

    status, rows, _ = await api.call("GET", "/usage/summary?days=7&group_by=key&group_by=endpoint", token=user["token"])
    assert status == 200
    assert {(r["key_id"], r["endpoint"]): (r["calls"], r["credits"], r["errors"]) for r in rows} == expected
    assert all("day" not in r for r in rows)
    assert [r["credits"] for r in rows] == sorted((r["credits"] for r in rows), reverse=True)

    rows = (await api.call("GET", "/usage/summary?group_by=day", token=user["token"]))[1]
    total = [sum(v[i] for v in expected.values()) for i in range(3)]
    assert rows == [
        {"day": today, "calls": total[0], "credits": total[1], "errors": total[2], "from_cache": 0, "credits_saved": 0}
    ]
    # Comma-separated works too, and the default is by day.
    by_key = (await api.call("GET", "/usage/summary?group_by=day,key", token=user["token"]))[1]
    assert {r["key_id"]: r["calls"] for r in by_key} == {a["key_id"]: 4, b["key_id"]: 3}
    assert (await api.call("GET", "/usage/summary", token=user["token"]))[1] == rows
    # Another account sees none of it.
    other = await api.register()
    assert (await api.call("GET", "/usage/summary?group_by=key", token=other["token"]))[1] == []


@pytest.mark.settings(plan_rules=FAST, flush_interval=3600, cache_max_bytes=1 << 20)
async def test_summary_counts_calls_served_from_the_cache_and_the_credits_they_saved(api, ctx, catalog):
    """Issue 47 (8): the period's savings and, per endpoint, the calls the cache answered; stored and buffered calls
    alike, each once."""
    user, key = await api.funded_key(1_000_000)
    info = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    answers = [await api.call("GET", info, key=key["key"]) for _ in range(2)]
    await ctx.meter.flush()  # the miss and the first hit stored, the next hit buffered
    answers.append(await api.call("GET", info, key=key["key"]))
    await api.call("GET", "/social/trends", key=key["key"])  # a miss of another endpoint
    assert [h["X-Cache"] for _, _, h in answers] == ["MISS", "HIT", "HIT"]
    price = int(answers[0][2]["X-Credits-Charged"])
    rows = (await api.call("GET", "/usage/summary?days=7&group_by=endpoint", token=user["token"]))[1]
    by_endpoint = {r["endpoint"]: (r["calls"], r["from_cache"], r["credits_saved"]) for r in rows}
    assert by_endpoint == {"/social/user/info": (3, 2, 2 * price), "/social/trends": (1, 0, 0)}
    (day,) = (await api.call("GET", "/usage/summary?days=7&group_by=day", token=user["token"]))[1]
    assert (day["calls"], day["from_cache"], day["credits_saved"]) == (4, 2, 2 * price)
    await ctx.meter.flush()  # all stored now: the same figures
    assert (await api.call("GET", "/usage/summary?days=7&group_by=day", token=user["token"]))[1] == [day]


@pytest.mark.settings(plan_rules=FAST, flush_interval=3600)
async def test_summary_reads_older_days_and_folds_buckets_written_before_rollups(api, ctx, catalog):
    user, a, b, charges = await known_calls(api, ctx, catalog)
    old = datetime.now(UTC) - timedelta(days=10)
    records = [
        {
            "_id": f"old-{i}",
            "account_id": user["account_id"],
            "key_id": a["key_id"],
            "endpoint": "/social/user/info",
            "ts": old + timedelta(seconds=i),
            "credits": 18 if i else 0,
            "status": 200 if i else 502,
            "lease": "gone",
            "request_id": f"r-old-{i}",
        }
        for i in range(3)
    ]
    # As a process from before the day rollups wrote them: buckets only, two batches.
    for seq, batch in ((1, records[:1]), (2, records[1:])):
        await ctx.usage.buckets.insert_many(buckets_of(f"gone-{seq}", batch))
    rows = (await api.call("GET", "/usage/summary?days=30&group_by=day", token=user["token"]))[1]
    assert [r["day"] for r in rows] == [datetime.now(UTC).date().isoformat()]
    assert await ctx.usage.backfill() == 2
    assert await ctx.usage.backfill() == 0  # once
    rows = (await api.call("GET", "/usage/summary?days=30&group_by=day", token=user["token"]))[1]
    assert rows[-1] == {
        "day": old.date().isoformat(),
        "calls": 3,
        "credits": 36,
        "errors": 1,
        "from_cache": 0,
        "credits_saved": 0,
    }
    assert rows[0]["day"] > rows[-1]["day"]  # newest first
    assert len((await api.call("GET", "/usage/summary?days=10", token=user["token"]))[1]) == 1  # outside the window


@pytest.mark.settings(plan_rules=FAST, flush_interval=3600)
async def test_a_retried_flush_is_counted_once(api, ctx, catalog):
    user, a, b, charges = await known_calls(api, ctx, catalog)
    real_insert = ctx.meter.usage.insert_batch

    async def written_but_unacknowledged(batch_id, records):
        await real_insert(batch_id, records)
        raise ConnectionError("acknowledgement lost")

    ctx.meter.usage.insert_batch = written_but_unacknowledged
    with pytest.raises(ConnectionError):
        await ctx.meter.flush()
    # Written and folded, still buffered: counted once, not from both.
    rows = (await api.call("GET", "/usage/summary?group_by=key", token=user["token"]))[1]
    assert sum(r["calls"] for r in rows) == 7
    ctx.meter.usage.insert_batch = real_insert
    await ctx.meter.flush()  # the retry folds nothing twice
    rows = (await api.call("GET", "/usage/summary?group_by=key", token=user["token"]))[1]
    assert sum(r["calls"] for r in rows) == 7 and len(ctx.meter.buffer) == 0


@pytest.mark.parametrize(
    "query, loc",
    [
        ("days=0", ["query", "days"]),
        ("days=366", ["query", "days"]),
        ("days=x", ["query", "days"]),
        ("group_by=month", ["query", "group_by"]),
    ],
)
async def test_summary_rejects_bad_queries(api, query, loc):
    user = await api.register()
    status, body, _ = await api.call("GET", "/usage/summary?" + query, token=user["token"])
    assert status == 422 and body["detail"][0]["loc"] == loc
    assert (await api.call("GET", "/usage/summary"))[0] == 401


async def export(http_client, base_url: str, user: dict, fmt: str):
    """GET /usage/export for a year, read as it streams: the response and the whole body."""
    chunks: list[bytes] = []
    response = await http_client.fetch(
        HTTPRequest(
            f"{base_url}/usage/export?days=365&format={fmt}",
            headers={"Authorization": f"Bearer {user['token']}"},
            streaming_callback=chunks.append,
            request_timeout=60,
        )
    )
    return response, b"".join(chunks)


@pytest.mark.settings(plan_rules=FAST, flush_interval=3600)
@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
async def test_export_streams_every_record_once(api, ctx, catalog, http_client, base_url, fmt):
    user, a, b, charges = await known_calls(api, ctx, catalog)
    response, body = await export(http_client, base_url, user, fmt)
    assert response.code == 200
    assert response.headers["Content-Type"].startswith("text/csv" if fmt == "csv" else "application/x-ndjson")
    assert response.headers["Content-Disposition"].startswith('attachment; filename="usage-')
    assert response.headers["Content-Disposition"].endswith(f'.{fmt}"')
    text = body.decode()
    if fmt == "csv":
        rows = list(csv.DictReader(io.StringIO(text)))
        assert list(rows[0]) == ["timestamp", "key_id", "endpoint", "status", "credits", "request_id", "replay_of"]
        rows = [
            {**r, "key_id": int(r["key_id"]), "status": int(r["status"]), "credits": int(r["credits"])} for r in rows
        ]
    else:
        rows = [orjson.loads(line) for line in text.splitlines()]
    assert len(rows) == sum(len(calls) for calls in charges.values()) == 7
    got: dict = {}
    for r in rows:
        got.setdefault((r["key_id"], r["endpoint"]), []).append((r["status"], r["credits"]))
        assert datetime.fromisoformat(r["timestamp"]) <= datetime.now(UTC)
    assert {k: sorted(v) for k, v in got.items()} == {k: sorted(v) for k, v in charges.items()}
    usage = (await api.call("GET", "/usage", token=user["token"]))[1]
    assert len({r["request_id"] for r in rows}) == 7  # one row per call
    # The same calls as /usage, in the service's one time format.
    assert {(r["request_id"], r["timestamp"], r["credits"]) for r in rows} == {
        (u["request_id"], u["timestamp"], u["credits"]) for u in usage
    }


@pytest.mark.settings(plan_rules=FAST)
async def test_export_rejects_bad_queries_as_json(api):
    user = await api.register()
    for query, loc in (("format=xml", ["query", "format"]), ("days=366", ["query", "days"])):
        status, body, headers = await api.call("GET", "/usage/export?" + query, token=user["token"])
        assert status == 422 and body["detail"][0]["loc"] == loc
        assert headers["Content-Type"] == "application/json" and "Content-Disposition" not in headers
    status, body, _ = await api.call("GET", "/usage/export")
    assert status == 401 and body == {"detail": "Not authenticated"}
    status, body, headers = await api.call("GET", "/usage/export?format=csv", token=user["token"])
    assert status == 200 and body.decode() == "timestamp,key_id,endpoint,status,credits,request_id,replay_of\n"


@pytest.mark.settings(plan_rules=FAST, flush_interval=3600)
async def test_new_answers_match_the_document(api, ctx, catalog):
    """Key rows with properties, PATCH, roll and the summary, checked against /openapi.json."""
    _, doc, _ = await api.call("GET", "/openapi.json")
    user, a, b, charges = await known_calls(api, ctx, catalog)
    token = user["token"]
    body = {
        "allowed_ips": ["10.0.0.0/8"],
        "allowed_endpoints": ["users"],
        "credit_limit": 9,
        "credit_limit_period": "day",
    }
    checks = [
        ("get", "/keys", "/keys", None),
        ("post", "/keys", "/keys", {"name": "x", "expires_at": "2999-01-01T00:00:00Z", **body}),
        ("patch", "/keys/{key_id}", f"/keys/{a['key_id']}", body),
        ("post", "/keys/{key_id}/roll", f"/keys/{b['key_id']}/roll", {"grace_seconds": 60}),
        ("get", "/usage/summary", "/usage/summary?group_by=day,endpoint,key", None),
    ]
    for method, template, path, payload in checks:
        status, answer, _ = await api.call(method.upper(), path, payload, token=token)
        assert status == 200, (path, answer)
        schema = doc["paths"][template][method]["responses"]["200"]["content"]["application/json"]["schema"]
        openapi_schema_validator.validate(
            answer, {**schema, "components": doc["components"]}, cls=openapi_schema_validator.OAS31Validator
        )
    export = doc["paths"]["/usage/export"]["get"]
    assert set(export["responses"]["200"]["content"]) == {"text/csv", "application/x-ndjson"}
    assert "Content-Disposition" in export["responses"]["200"]["headers"]
    data = doc["paths"]["/social/user/info"]["get"]["responses"]
    assert "403" in data and "expired" in data["401"]["description"]


@pytest.mark.settings(plan_rules=FAST)
async def test_a_year_of_stored_calls_exports_whole_and_sums_right(api, ctx, http_client, base_url):
    """2,500 stored calls over 300 days, more than two export chunks: every one exported, summed once."""
    user = await api.register()
    now = datetime.now(UTC)
    for batch in range(5):
        records = [
            {
                "_id": f"y-{batch}-{i}",
                "account_id": user["account_id"],
                "key_id": 1 + i % 2,
                "endpoint": "/social/user/info",
                "ts": now - timedelta(days=60 * batch, seconds=i),
                "credits": 18,
                "status": 200 if i % 10 else 502,
                "lease": "year",
                "request_id": f"y{batch}x{i}",
            }
            for i in range(500)
        ]
        await ctx.usage.insert_batch(f"year-{batch + 1}", records)
    response, body = await export(http_client, base_url, user, "jsonl")
    rows = [orjson.loads(line) for line in body.splitlines()]
    assert response.code == 200 and len(rows) == 2500 and len({r["request_id"] for r in rows}) == 2500
    days = [r["timestamp"][:10] for r in rows]
    assert days == sorted(days)  # day by day, oldest first
    summary = (await api.call("GET", "/usage/summary?days=365&group_by=key", token=user["token"]))[1]
    assert {r["key_id"]: (r["calls"], r["errors"]) for r in summary} == {
        1: (1250, 250),
        2: (1250, 0),
    }  # errors on even i: key 1
    recent = (await api.call("GET", "/usage/summary?days=100", token=user["token"]))[1]
    assert sum(r["calls"] for r in recent) == 1000  # the batches of today and 60 days ago


@pytest.mark.settings(plan_rules=FAST)
async def test_export_covers_the_same_utc_days_as_the_summary(api, ctx, http_client, base_url):
    # Found from outside: days=1 exported the last 24 hours, yesterday evening included, while the summary
    # (and the documented parameter: "UTC days, today included") covers today only, so they disagreed.
    user = await api.register()
    midnight = datetime.combine(datetime.now(UTC).date(), datetime.min.time(), UTC)
    records = [
        {
            "_id": f"edge-{i}",
            "account_id": user["account_id"],
            "key_id": 1,
            "endpoint": "/social/user/info",
            "ts": ts,
            "credits": 18,
            "status": 200,
            "lease": "edge",
            "request_id": f"edge{i}",
        }
        for i, ts in enumerate([midnight - timedelta(seconds=1), midnight, midnight - timedelta(days=1)])
    ]
    await ctx.usage.insert_batch("edge-1", records)
    for days, expected in ((1, {"edge1"}), (2, {"edge0", "edge1", "edge2"})):
        response = await http_client.fetch(
            f"{base_url}/usage/export?days={days}&format=jsonl", headers={"Authorization": f"Bearer {user['token']}"}
        )
        exported = {orjson.loads(line)["request_id"] for line in response.body.splitlines()}
        summary = (await api.call("GET", f"/usage/summary?days={days}", token=user["token"]))[1]
        assert exported == expected and sum(r["calls"] for r in summary) == len(expected), days
        start = (midnight - timedelta(days=days - 1)).strftime("%Y%m%d")
        assert f'filename="usage-{start}-{midnight:%Y%m%d}.jsonl"' in response.headers["Content-Disposition"]


@pytest.mark.settings(plan_rules=FAST)
async def test_a_request_id_cannot_become_a_spreadsheet_formula(api, catalog):
    user, key = await api.funded_key(1000)
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    assert (await api.call("GET", path, key=key["key"], headers={"X-Request-ID": "-A1"}))[0] == 200
    csv_body = (await api.call("GET", "/usage/export?format=csv", token=user["token"]))[1].decode()
    assert csv_body.splitlines()[1].endswith(",'-A1,")  # replay_of: empty
    status, line, _ = await api.call("GET", "/usage/export?format=jsonl", token=user["token"])
    assert status == 200 and line["request_id"] == "-A1"  # one line, which the test client reads as JSON: as sent
