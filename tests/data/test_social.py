"""The data plane: every endpoint, validation, 401/402/429/501/502/503/504, exact charges,
concurrency without overspend, revocation, persistence, the /twitter alias."""

import asyncio
import time
from datetime import UTC, datetime, timedelta

import orjson
import pytest
from support import FAST, balance, count_key_lookups, qs, recorder, use_upstream, valid_query

import gateway
from app import tasks
from handlers.social import parse_args
from security.apikeys import KeyVault
from social.endpoints import ENDPOINTS, page_size
from storage import db as database
from storage.usage import UsageStore

pytestmark = pytest.mark.gen_test(timeout=60)

AVAILABLE = [e for e in ENDPOINTS if e.available]


@pytest.mark.settings(plan_rules=FAST)
@pytest.mark.parametrize("endpoint", AVAILABLE, ids=[e.path for e in AVAILABLE])
async def test_every_endpoint_forwards_and_charges(api, ctx, catalog, endpoint):
    user, key = await api.funded_key(100_000)
    status, body, headers = await api.call(
        "GET", f"/social{endpoint.path}?{qs(valid_query(endpoint, catalog))}", key=key["key"]
    )
    assert status == 200, body
    assert body["status"] == "success" and endpoint.results in body and endpoint.msg_key in body
    charged = int(headers["X-Credits-Charged"])
    results = body[endpoint.results]
    items = len(results) if isinstance(results, list) else 1
    args = parse_args(endpoint, {name: [value.encode()] for name, value in valid_query(endpoint, catalog).items()})
    size = page_size(endpoint, args)
    assert charged == ctx.prices.cost(endpoint.price, items, size)
    assert await balance(api, user) == 100_000 - charged
    status, usage, _ = await api.call("GET", "/usage", token=user["token"])
    assert [(u["endpoint"], u["credits"], u["status"], u["key_id"]) for u in usage] == [
        (f"/social{endpoint.path}", charged, 200, key["key_id"])
    ]


@pytest.mark.settings(plan_rules=FAST)
@pytest.mark.parametrize(
    "endpoint",
    [e for e in ENDPOINTS if any(p.required for p in e.params)],
    ids=[e.path for e in ENDPOINTS if any(p.required for p in e.params)],
)
async def test_missing_required_parameter_is_422_and_free(api, endpoint):
    user, key = await api.funded_key(10_000)
    status, body, _ = await api.call("GET", f"/social{endpoint.path}", key=key["key"])
    assert status == 422
    required = [p.name for p in endpoint.params if p.required]
    assert body == {
        "detail": [{"loc": ["query", name], "msg": "Field required", "type": "missing"} for name in required]
    }
    assert await balance(api, user) == 10_000


@pytest.mark.settings(plan_rules=FAST)
@pytest.mark.parametrize(
    "path,query,loc,type_",
    [
        ("/user/followers", "userName=a&pageSize=ten", "pageSize", "int_parsing"),
        ("/user/followers", "userName=a&pageSize=201", "pageSize", "less_than_equal"),
        ("/user/followers", "userName=a&pageSize=0", "pageSize", "greater_than_equal"),
        ("/user/followers_ids", "userName=a&count=10", "count", "greater_than_equal"),
        ("/user/followers_ids", "userName=a&cursor=abc", "cursor", "int_parsing"),
        # The provider's documented filters (issue 27): Unix seconds, booleans.
        ("/user/mentions", "userName=a&sinceTime=yesterday", "sinceTime", "int_parsing"),
        ("/user/mentions", "userName=a&untilTime=-5", "untilTime", "greater_than_equal"),
        ("/tweet/replies", "tweetId=1&sinceTime=1.5", "sinceTime", "int_parsing"),
        ("/tweet/quotes", "tweetId=1&untilTime=soon", "untilTime", "int_parsing"),
        ("/tweet/quotes", "tweetId=1&includeReplies=maybe", "includeReplies", "bool_parsing"),
        ("/trends", "woeid=x", "woeid", "int_parsing"),
        ("/user/tweet_timeline", "userId=1&includeReplies=maybe", "includeReplies", "bool_parsing"),
        ("/user/batch_info_by_ids", "userIds=1,abc", "userIds", "value_error"),
        ("/user/batch_info_by_ids", "userIds=1,,2", "userIds", "value_error"),
        ("/tweets", "tweet_ids=" + ",".join(str(i) for i in range(101)), "tweet_ids", "too_long"),
    ],
)
async def test_invalid_parameters_are_422(api, path, query, loc, type_):
    user, key = await api.funded_key(10_000)
    status, body, _ = await api.call("GET", f"/social{path}?{query}", key=key["key"])
    assert status == 422, body
    assert body["detail"][0]["loc"] == ["query", loc] and body["detail"][0]["type"] == type_


@pytest.mark.settings(plan_rules=FAST)
@pytest.mark.parametrize("value", ["true", "False", "TRUE", "1", "0"])
async def test_booleans_in_any_case(api, catalog, value):
    _, key = await api.funded_key(10_000)
    status, _, _ = await api.call(
        "GET", f"/social/user/tweet_timeline?userId={catalog['users'][0]['id']}&includeReplies={value}", key=key["key"]
    )
    assert status == 200


async def test_key_errors_are_401(api, catalog):
    user, key = await api.funded_key(10_000)
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    status, body, _ = await api.call("GET", path)
    assert status == 401 and body["status"] == "error" and "X-API-Key" in body["msg"]
    status, body, _ = await api.call("GET", path, key="sgw_not-a-real-key")
    assert status == 401 and body == {"status": "error", "msg": "Invalid API key"}
    status, body, _ = await api.call("GET", path, key=user["token"])  # a session token is not an API key
    assert status == 401
    status, body, _ = await api.call("GET", path, key="sgw_" + "é" * 40)  # not ASCII: refused, not a crash
    assert status == 401 and body["msg"] == "Invalid API key"
    await api.call("POST", f"/keys/{key['key_id']}/revoke", token=user["token"])
    status, body, _ = await api.call("GET", path, key=key["key"])
    assert status == 401 and "revoked" in body["msg"]


async def test_unknown_keys_are_cached_negatively(api, ctx, catalog, monkeypatch):
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    unknown = KeyVault(ctx.settings.secrets_key).generate()  # well formed, so only the database can refuse it
    lookups = count_key_lookups(ctx, monkeypatch)
    for _ in range(50):
        assert (await api.call("GET", path, key=unknown))[0] == 401
    assert len(lookups) == 1


@pytest.mark.settings(signup_credits=1000)
async def test_free_plan_is_rate_limited(api, catalog):
    """The free plan (signup credits are no payment): one call, then 429 for up to five seconds."""
    user = await api.register()
    key = await api.new_key(user["token"])
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    first = await api.call("GET", path, key=key["key"])
    assert first[0] == 200 and first[2]["X-RateLimit-Limit"] == "1" and first[2]["X-RateLimit-Remaining"] == "0"
    assert first[2]["RateLimit-Policy"] == '"key";q=1;w=5, "account";q=1;w=1', first[2]["RateLimit-Policy"]
    status, body, headers = await api.call("GET", path, key=key["key"])
    assert status == 429 and body["status"] == "error"
    assert 1 <= int(headers["Retry-After"]) <= 5


@pytest.mark.settings(signup_credits=1000)
async def test_idle_keys_rate_limit_state_is_dropped_by_the_background_sweep(api, ctx, catalog):
    """Memory holds a bucket per recently active key only; a dropped bucket answers like a full one."""
    assert "idle-buckets" in {t.get_name() for t in asyncio.all_tasks()}  # scheduled by app/tasks.py
    user = await api.register()
    key = await api.new_key(user["token"])
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    assert (await api.call("GET", path, key=key["key"]))[0] == 200  # one call: the free plan's burst
    assert (await api.call("GET", path, key=key["key"]))[0] == 429
    await tasks.forget_idle_buckets(ctx)  # not idle yet: kept, still limited
    assert key["key_id"] in ctx.limiter._buckets
    assert (await api.call("GET", path, key=key["key"]))[0] == 429
    await tasks.forget_idle_buckets(ctx, time.monotonic() + tasks.BUCKET_IDLE_SECONDS + 1)
    assert key["key_id"] not in ctx.limiter._buckets
    status, _, headers = await api.call("GET", path, key=key["key"])
    assert status == 200 and headers["X-RateLimit-Remaining"] == "0" and headers["X-RateLimit-Limit"] == "1"


async def test_paid_plan_burst_then_429(api, catalog):
    _, key = await api.funded_key(1_000_000)
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    started = time.monotonic()
    results = await asyncio.gather(*[api.call("GET", path, key=key["key"]) for _ in range(40)])
    refilled = 20 * (time.monotonic() - started)
    statuses = [r[0] for r in results]
    assert 20 <= statuses.count(200) <= 20 + refilled + 1 and statuses.count(429) == 40 - statuses.count(200)
    limited = next(r for r in results if r[0] == 429)
    assert limited[2]["Retry-After"] == "1" and limited[2]["X-RateLimit-Limit"] == "20"


async def test_insufficient_credits_is_402_without_upstream_call(api, ctx, catalog, upstream_url, http_client):
    user, key = await api.funded_key(10)
    stats = lambda: http_client.fetch(upstream_url + "/sandbox/stats")
    before = orjson.loads((await stats()).body)["requests"]
    status, body, _ = await api.call(
        "GET", f"/social/user/info?userName={catalog['users'][0]['userName']}", key=key["key"]
    )
    assert status == 402 and body["status"] == "error" and "credits" in body["msg"]
    assert orjson.loads((await stats()).body)["requests"] == before
    assert await balance(api, user) == 10


@pytest.mark.settings(plan_rules=FAST)
@pytest.mark.parametrize(
    "path", ["/community/get_tweets_from_all_community?query=x", "/community/moderators?community_id=1"]
)
async def test_unavailable_endpoints_are_501_and_free(api, path):
    user, key = await api.funded_key(1000)
    status, body, _ = await api.call("GET", "/social" + path, key=key["key"])
    assert status == 501 and body["status"] == "error"
    assert await balance(api, user) == 1000
    usage = (await api.call("GET", "/usage", token=user["token"]))[1]
    assert [(u["credits"], u["status"]) for u in usage] == [(0, 501)]


@pytest.mark.settings(plan_rules=FAST)
@pytest.mark.parametrize(
    "path,expected",
    [
        ("/user/followers?pageSize=200", 200 * 1),
        ("/user/followers?pageSize=150", 150 * 2),
        ("/user/followers?pageSize=50", 50 * 3),
        ("/user/followers_ids?count=5000", 2250),
        ("/user/followers_ids?count=1000", 1000),
        ("/user/followers_ids?count=50", 100),
    ],
)
async def test_exact_charges_by_page_size(api, catalog, path, expected):
    user, key = await api.funded_key(100_000)
    sep = "&" if "?" in path else "?"
    status, body, headers = await api.call(
        "GET", f"/social{path}{sep}userName={catalog['big_accounts'][0]}", key=key["key"]
    )
    assert status == 200
    assert int(headers["X-Credits-Charged"]) == expected
    assert await balance(api, user) == 100_000 - expected


@pytest.mark.settings(plan_rules=FAST)
async def test_batch_lookup_is_cheaper_per_item(api, catalog):
    _, key = await api.funded_key(100_000)
    ids = [u["id"] for u in catalog["users"]]
    small = await api.call("GET", "/social/user/batch_info_by_ids?userIds=" + ",".join(ids[:5]), key=key["key"])
    big = await api.call("GET", "/social/user/batch_info_by_ids?userIds=" + ",".join(ids[:100]), key=key["key"])
    assert int(small[2]["X-Credits-Charged"]) == 5 * 10 and len(small[1]["users"]) == 5
    assert int(big[2]["X-Credits-Charged"]) == 100 and len(big[1]["users"]) == 100


@pytest.mark.settings(plan_rules=FAST)
async def test_concurrent_calls_never_overspend(api, ctx, catalog):
    user, key = await api.funded_key(1000)
    key2 = await api.new_key(user["token"])
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    results = await asyncio.gather(*[api.call("GET", path, key=(key, key2)[i % 2]["key"]) for i in range(300)])
    statuses = [r[0] for r in results]
    assert statuses.count(200) == 1000 // 18 and statuses.count(402) == 300 - 1000 // 18
    assert await balance(api, user) == 1000 - 18 * (1000 // 18)
    await ctx.meter.flush()
    records = await ctx.usage.records({"account_id": user["account_id"]})
    assert len(records) == 1000 // 18 and sum(r["credits"] for r in records) == 18 * (1000 // 18)


@pytest.mark.settings(plan_rules=FAST)
async def test_revocation_mid_load(api, catalog):
    user, key = await api.funded_key(1_000_000)
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    first = await asyncio.gather(*[api.call("GET", path, key=key["key"]) for _ in range(20)])
    revoke = asyncio.ensure_future(api.call("POST", f"/keys/{key['key_id']}/revoke", token=user["token"]))
    during = await asyncio.gather(*[api.call("GET", path, key=key["key"]) for _ in range(20)])
    assert (await revoke)[0] == 200
    after = await asyncio.gather(*[api.call("GET", path, key=key["key"]) for _ in range(20)])
    assert all(r[0] == 200 for r in first)
    assert all(r[0] in (200, 401) for r in during)
    assert all(r[0] == 401 for r in after)
    charged = sum(int(r[2]["X-Credits-Charged"]) for r in first + during if r[0] == 200)
    assert await balance(api, user) == 1_000_000 - charged


@pytest.mark.settings(plan_rules=FAST, flush_interval=3600)
async def test_portal_reads_its_writes_before_flush(api, ctx, catalog):
    user, key = await api.funded_key(1000)
    status, _, headers = await api.call(
        "GET", f"/social/user/info?userName={catalog['users'][0]['userName']}", key=key["key"]
    )
    assert status == 200 and len(ctx.meter.buffer) == 1
    assert await balance(api, user) == 1000 - int(headers["X-Credits-Charged"])
    usage = (await api.call("GET", "/usage", token=user["token"]))[1]
    assert len(usage) == 1 and usage[0]["credits"] == int(headers["X-Credits-Charged"])
    assert await ctx.usage.records({}) == []


@pytest.mark.settings(plan_rules=FAST, flush_interval=3600)
async def test_flush_is_idempotent_after_an_uncertain_failure(api, ctx, catalog):
    user, key = await api.funded_key(10_000)
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    for _ in range(5):
        assert (await api.call("GET", path, key=key["key"]))[0] == 200
    real_insert = ctx.meter.usage.insert_batch

    async def written_but_unacknowledged(batch_id, records):
        await real_insert(batch_id, records)  # the batch reached the database...
        raise ConnectionError("...and the acknowledgement was lost")

    ctx.meter.usage.insert_batch = written_but_unacknowledged
    with pytest.raises(ConnectionError):
        await ctx.meter.flush()
    assert len(ctx.meter.buffer) == 5
    ctx.meter.usage.insert_batch = real_insert
    await ctx.meter.flush()
    records = await ctx.usage.records({"account_id": user["account_id"]})
    assert len(records) == 5 and len({r["_id"] for r in records}) == 5
    assert await balance(api, user) == 10_000 - sum(r["credits"] for r in records)


@pytest.mark.settings(plan_rules=FAST, flush_interval=3600)
async def test_shutdown_flushes_and_returns_leases(api, ctx, catalog, mongo):
    user, key = await api.funded_key(10_000)
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    results = await asyncio.gather(*[api.call("GET", path, key=key["key"]) for _ in range(10)])
    charged = sum(int(r[2]["X-Credits-Charged"]) for r in results)
    await gateway.shutdown(ctx, [])
    ctx.client = database.connect(mongo.uri)  # shutdown closed the app's client
    db = ctx.client[ctx.settings.mongodb_db]
    account = await db.accounts.find_one({"_id": user["account_id"]})
    assert account["credits"] == 10_000 - charged and account["leases"] == {}
    assert len(await UsageStore(db).records({"account_id": user["account_id"]})) == 10


@pytest.mark.settings(plan_rules=FAST)
async def test_twitter_alias_is_metered(api, catalog):
    user, key = await api.funded_key(1000)
    status, body, headers = await api.call(
        "GET", f"/twitter/user/info?userName={catalog['users'][0]['userName']}", key=key["key"]
    )
    assert status == 200 and int(headers["X-Credits-Charged"]) == 18
    assert (await api.call("GET", "/usage", token=user["token"]))[1][0]["endpoint"] == "/social/user/info"


@pytest.mark.settings(twitter_alias=False)
async def test_twitter_alias_can_be_turned_off(api):
    assert (await api.call("GET", "/twitter/user/info?userName=x"))[0] == 404


@pytest.mark.settings(plan_rules=FAST)
async def test_forwarding_contract(api, ctx):
    server, url, seen = await recorder()
    use_upstream(ctx, url)
    _, key = await api.funded_key(1000)
    status, body, headers = await api.call(
        "GET",
        "/social/user/info?userName=jack&extra=1&includeReplies=True",
        key=key["key"],
        headers={"Connection": "keep-alive", "Cookie": "a=b"},
    )
    assert status == 200 and body == {"status": "success", "msg": "", "data": {"id": "1"}}
    request = seen[0]
    assert request["path"] == "/twitter/user/info"
    assert request["query"] == "userName=jack&extra=1&includeReplies=True"  # passed through unchanged
    assert request["headers"]["X-Api-Key"] == ctx.settings.upstream_api_key
    assert key["key"] not in str(request["headers"]) and "Cookie" not in request["headers"]
    server.stop()


@pytest.mark.settings(plan_rules=FAST)
@pytest.mark.parametrize(
    "status,body,expected",
    [
        (500, b'{"error":"boom"}', 502),
        (503, b"", 502),
        (200, b"not json", 502),
        (200, b"[1,2]", 502),
        (401, b'{"msg":"bad upstream key"}', 502),
        (404, b'{"status":"error","msg":"not found"}', 404),
        (200, b'{"status":"error","msg":"User not found"}', 200),
    ],
)
async def test_upstream_failures_are_not_charged(api, ctx, status, body, expected):
    server, url, _ = await recorder(status, body)
    use_upstream(ctx, url)
    user, key = await api.funded_key(1000)
    got, answer, headers = await api.call("GET", "/social/user/info?userName=jack", key=key["key"])
    assert got == expected
    if expected == 502:
        assert answer == {"status": "error", "msg": "The data provider failed; you were not charged"}
    assert await balance(api, user) == 1000
    server.stop()


@pytest.mark.settings(plan_rules=FAST)
async def test_oversize_upstream_body_is_502(api, ctx):
    server, url, _ = await recorder(200, b'{"status":"success","data":"' + b"x" * 5000 + b'"}')
    use_upstream(ctx, url, max_body=1000)
    user, key = await api.funded_key(1000)
    assert (await api.call("GET", "/social/user/info?userName=jack", key=key["key"]))[0] == 502
    assert await balance(api, user) == 1000
    server.stop()


@pytest.mark.settings(plan_rules=FAST)
async def test_upstream_timeout_is_504_and_free(api, ctx):
    import sandbox

    sim = sandbox.start("127.0.0.1", 0, ctx.settings.upstream_api_key, faults="hang")
    use_upstream(ctx, sim.url, timeout=0.3)
    user, key = await api.funded_key(1000)
    status, body, _ = await api.call("GET", "/social/user/info?userName=jack", key=key["key"])
    assert status == 504 and body["status"] == "error"
    assert await balance(api, user) == 1000
    usage = (await api.call("GET", "/usage", token=user["token"]))[1]
    assert [(u["credits"], u["status"]) for u in usage] == [(0, 504)]
    sim.stop()


@pytest.mark.settings(plan_rules=FAST)
async def test_connection_refused_is_502(api, ctx):
    from app.embedded import free_port

    use_upstream(ctx, f"http://127.0.0.1:{free_port()}")
    user, key = await api.funded_key(1000)
    assert (await api.call("GET", "/social/user/info?userName=jack", key=key["key"]))[0] == 502
    assert await balance(api, user) == 1000


@pytest.mark.settings(plan_rules=FAST)
async def test_breaker_opens_then_recovers(api, ctx, catalog):
    import sandbox

    sim = sandbox.start("127.0.0.1", 0, ctx.settings.upstream_api_key, faults="error=503:1")
    use_upstream(ctx, sim.url, breaker_failures=3)
    _, key = await api.funded_key(10_000)
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    statuses = [(await api.call("GET", path, key=key["key"]))[0] for _ in range(5)]
    assert statuses == [502, 502, 502, 503, 503]
    requests_seen = sim.stats["requests"]
    sim.stop()
    use_upstream(ctx, (await _healthy(ctx)), breaker_failures=3)
    assert (await api.call("GET", path, key=key["key"]))[0] == 200
    assert requests_seen == 3  # calls refused by the open breaker never reached the upstream


async def _healthy(ctx):
    import sandbox

    return sandbox.start("127.0.0.1", 0, ctx.settings.upstream_api_key).url


@pytest.mark.settings(plan_rules=FAST)
async def test_upstream_connections_are_reused(api, ctx, catalog):
    import sandbox

    sim = sandbox.start("127.0.0.1", 0, ctx.settings.upstream_api_key)
    use_upstream(ctx, sim.url)
    _, key = await api.funded_key(1_000_000)
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    live = {"Cache-Control": "no-cache"}  # five calls at once, each to the provider (not joined into one)
    for _ in range(10):
        await asyncio.gather(*[api.call("GET", path, key=key["key"], headers=live) for _ in range(5)])
    assert sim.stats["requests"] == 50 and sim.stats["connections"] <= 8
    sim.stop()


@pytest.mark.settings(plan_rules=FAST, flush_interval=3600, flush_batch=5)
async def test_a_batch_being_written_does_not_trigger_the_next_flush(api, ctx, catalog):
    user, key = await api.funded_key(100_000)
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    real_insert, writes = ctx.meter.usage.insert_batch, []
    gate = asyncio.Event()

    async def slow_insert(batch_id, records):
        writes.append(len(records))
        await gate.wait()  # the database is slow: calls go on meanwhile
        await real_insert(batch_id, records)

    ctx.meter.usage.insert_batch = slow_insert
    for _ in range(5):  # FLUSH_BATCH records wait: the flusher starts at once
        assert (await api.call("GET", path, key=key["key"]))[0] == 200
    for _ in range(50):
        if writes:
            break
        await asyncio.sleep(0.01)
    assert writes == [5]
    for _ in range(4):  # fewer than FLUSH_BATCH new records, however many are in flight
        assert (await api.call("GET", path, key=key["key"]))[0] == 200
    gate.set()
    await asyncio.sleep(0.2)
    assert writes == [5] and len(ctx.meter.buffer) == 4  # no flush of a partial batch before FLUSH_INTERVAL
    assert (await api.call("GET", path, key=key["key"]))[0] == 200  # the fifth new record: a batch again
    for _ in range(50):
        if len(writes) == 2 and not len(ctx.meter.buffer):
            break
        await asyncio.sleep(0.01)
    assert writes == [5, 5]
    records = await ctx.usage.records({"account_id": user["account_id"]})
    assert len(records) == 10


@pytest.mark.settings(plan_rules=FAST, flush_interval=3600)
async def test_last_used_at_is_stored_by_the_minute_and_listed_at_once(api, ctx, catalog):
    user, key = await api.funded_key(100_000)
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    listed = lambda: api.call("GET", "/keys", token=user["token"])
    stored = lambda: ctx.keys.get(user["account_id"], key["key_id"])
    assert (await listed())[1][0]["last_used_at"] is None
    assert (await api.call("GET", path, key=key["key"]))[0] == 200
    first = (await listed())[1][0]["last_used_at"]
    assert first is not None  # this process's own use, before anything is written
    await ctx.meter.flush(final=True)
    minute = lambda ts: ts.replace(second=0, microsecond=0)
    written = (await stored())["last_used_at"]
    assert written == minute(ctx.meter.last_used.at(key["key_id"]))  # the minute of the use
    await asyncio.sleep(0.01)
    assert (await api.call("GET", path, key=key["key"]))[0] == 200
    newest = (await listed())[1][0]["last_used_at"]
    assert newest > first  # the listing shows the newest use at once
    updates = ctx.metrics.db_commands["update"]
    await ctx.meter.flush(final=True)
    now_used = ctx.meter.last_used.at(key["key_id"])
    if minute(now_used) == written:  # used again within the same minute: nothing to write
        assert ctx.metrics.db_commands["update"] == updates and (await stored())["last_used_at"] == written
    else:  # the minute turned between the two calls: the new minute is stored
        assert (await stored())["last_used_at"] == minute(now_used)


@pytest.mark.settings(plan_rules=FAST, flush_interval=3600, max_keys_per_account=25)
async def test_last_used_at_is_stored_for_every_key_used_in_a_minute(api, ctx, catalog):
    """More keys than one touch statement holds (TOUCH_CHUNK): each used key gets its minute, no other."""
    user, first = await api.funded_key(1_000_000)
    keys = [first] + [await api.new_key(user["token"]) for _ in range(24)]
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    used, idle = keys[:23], keys[23:]
    for key in used:
        assert (await api.call("GET", path, key=key["key"]))[0] == 200
    await ctx.meter.flush(final=True)
    for key in used:
        stored = (await ctx.keys.get(user["account_id"], key["key_id"]))["last_used_at"]
        assert stored == ctx.meter.last_used.at(key["key_id"]).replace(second=0, microsecond=0)
    for key in idle:
        assert (await ctx.keys.get(user["account_id"], key["key_id"]))["last_used_at"] is None


async def test_last_used_at_stored_on_a_key_before_the_move_still_shows_and_a_newer_minute_wins(api, ctx):
    """Keys written when last_used_at lived on the key document keep showing it; a newer touch replaces it."""
    user, key = await api.funded_key(1_000)
    old = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)
    db = ctx.client[ctx.settings.mongodb_db]
    await db.keys.update_one({"_id": key["key_id"]}, {"$set": {"last_used_at": old}})
    await db.key_last_used.delete_one({"_id": key["key_id"]})  # as for a key created before the collection
    listed = lambda: api.call("GET", "/keys", token=user["token"])
    assert (await listed())[1][0]["last_used_at"] == "2026-01-01T10:00:00.000Z"
    await ctx.keys.touch({key["key_id"]: old - timedelta(minutes=5)})  # older: the stored one stays
    assert (await ctx.keys.get(user["account_id"], key["key_id"]))["last_used_at"].replace(tzinfo=UTC) == old
    await ctx.keys.touch({key["key_id"]: old + timedelta(minutes=1)})
    await ctx.keys.touch({key["key_id"]: old})  # a process behind another: $max keeps the newer minute
    assert (await listed())[1][0]["last_used_at"] == "2026-01-01T10:01:00.000Z"
