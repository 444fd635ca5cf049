"""Admin endpoints: authorization (401/403, no self-promotion), metrics and user rows on a known data
set (identical before, during and after rollups), paging, validation, the CLI, and latency at scale."""

import asyncio
import random
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from bson import ObjectId

import gateway
from storage.admin import GRACE
from storage.usage import buckets_of

ADMIN = "boss@example.com"
pytestmark = [pytest.mark.gen_test(timeout=180), pytest.mark.settings(admin_emails=ADMIN)]
ENDPOINTS = ("/admin/metrics", "/admin/users")


def stop_refresher() -> None:
    """The data below is written with past timestamps: the background refresher must not fold before it exists."""
    for task in asyncio.all_tasks():
        if task.get_name() == "admin-rollups":
            task.cancel()


def account(email: str, created_at: datetime, **extra) -> dict:
    return {
        "_id": str(ObjectId()),
        "email": email,
        "password_hash": "-",
        "created_at": created_at,
        "credits": 1000,
        "leases": {},
        "lease_holders": [],
        "paid_usd": 0.0,
        "topup_credits": 0,
        "is_admin": False,
        "internal": False,
        **extra,
    }


def record(owner: dict, ts: datetime, endpoint: str, status: int, credits: int) -> dict:
    return {
        "_id": uuid.uuid4().hex,
        "account_id": owner["_id"],
        "key_id": 1,
        "endpoint": "/social" + endpoint,
        "ts": ts,
        "credits": credits,
        "status": status,
        "lease": "test-process",
        "request_id": uuid.uuid4().hex,
    }


async def insert_usage(ctx, batches: list[list[dict]]) -> None:
    """Each list is one flush batch, stored as the flusher stores it (storage/usage.py buckets)."""
    buckets = [
        b for i, batch in enumerate(batches) for b in buckets_of(f"test-{i}", sorted(batch, key=lambda r: r["ts"]))
    ]
    for i in range(0, len(buckets), 1000):
        await ctx.usage.buckets.insert_many(buckets[i : i + 1000])


async def admin_token(api, ctx) -> str:
    """The configured address registered, then granted by the operator (registration alone grants nothing)."""
    token = (await api.register(ADMIN))["token"]
    assert await ctx.accounts.set_admin(ADMIN, True)
    return token


# --- authorization -----------------------------------------------------------------------------------------
async def test_admin_endpoints_need_a_token(api):
    for path in ENDPOINTS:
        status, body, headers = await api.call("GET", path)
        assert status == 401 and body == {"detail": "Not authenticated"} and headers["WWW-Authenticate"] == "Bearer"


async def test_non_admins_get_403_whatever_they_send(api):
    user = await api.register()
    key = await api.new_key(user["token"])
    # Mass assignment: nothing a user can store makes it an admin.
    await api.call(
        "POST", "/auth/attribution", {"first_touch": {"is_admin": True, "internal": True}}, token=user["token"]
    )
    for path in ENDPOINTS:
        for query in ("", "?include_internal=true", "?days=0", "?limit=999999"):
            status, body, _ = await api.call("GET", path + query, token=user["token"])
            assert status == 403 and body == {"detail": "Admins only"}, (path, query)
        assert (await api.call("GET", path, token=key["key"]))[0] == 401  # an API key is not a session
        assert (await api.call("GET", path, key=key["key"]))[0] == 401  # nor is it accepted as one
    status, me, _ = await api.call("GET", "/auth/me", token=user["token"])
    assert me["is_admin"] is False


async def test_registering_the_configured_admin_address_grants_nothing(api, ctx):
    """The attack: ADMIN_EMAILS names an address nobody registered yet; an attacker registers it (any case)."""
    attacker = await api.register("Boss@Example.COM")
    for path in ENDPOINTS:
        status, body, _ = await api.call("GET", path, token=attacker["token"])
        assert status == 403 and "users" not in body and "series" not in body
    assert (await api.call("GET", "/auth/me", token=attacker["token"]))[1]["is_admin"] is False


async def test_admin_by_operator_grant(api, ctx):
    token = await admin_token(api, ctx)
    assert (await api.call("GET", "/auth/me", token=token))[1]["is_admin"] is True
    for path in ENDPOINTS:
        assert (await api.call("GET", path, token=token))[0] == 200


@pytest.mark.parametrize(
    "query,loc,type_",
    [
        ("/admin/metrics?days=0", ["query", "days"], "greater_than_equal"),
        ("/admin/metrics?days=366", ["query", "days"], "less_than_equal"),
        ("/admin/metrics?days=week", ["query", "days"], "int_parsing"),
        ("/admin/metrics?include_internal=maybe", ["query", "include_internal"], "bool_parsing"),
        ("/admin/users?include_internal=2", ["query", "include_internal"], "bool_parsing"),
        ("/admin/users?limit=0", ["query", "limit"], "greater_than_equal"),
        ("/admin/users?limit=501", ["query", "limit"], "less_than_equal"),
        ("/admin/users?cursor=%21%21%21", ["query", "cursor"], "value_error"),
        ("/admin/users?cursor=WzFd", ["query", "cursor"], "value_error"),  # base64 of [1]
    ],
)
async def test_admin_validation(api, ctx, query, loc, type_):
    status, body, _ = await api.call("GET", query, token=await admin_token(api, ctx))
    assert status == 422 and body["detail"][0]["loc"] == loc and body["detail"][0]["type"] == type_


# --- a known data set ----------------------------------------------------------------------------------------
async def known_data(ctx) -> dict:
    """Five accounts, usage on three days (one of them only live), one account internal and one admin."""
    now = datetime.now(UTC)
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    d1, d2, h = today - timedelta(days=1), today - timedelta(days=2), timedelta(hours=1)
    live = max(now - timedelta(seconds=2), today)  # newer than any watermark: read live, never rolled up
    people = {
        "alice": account("alice@example.com", d2 + 10 * h),
        "bob": account(
            "bob@example.com",
            d1 + 9 * h,
            first_touch={"utm_source": "newsletter", "page": "/"},
            paid_usd=2.5,
            credits=250_000,
        ),
        "carol": account("carol@example.com", d1 + 11 * h, internal=True),
        "old": account("old@example.com", today - timedelta(days=40), is_admin=True),
        "dave": account("dave@example.com", now),
    }
    await ctx.accounts.accounts.insert_many(list(people.values()))
    a, b, c, o = people["alice"], people["bob"], people["carol"], people["old"]
    await insert_usage(
        ctx,
        [
            [record(a, d2 + 12 * h + timedelta(seconds=i), "/user/info", 200, 18) for i in range(3)]
            + [record(a, d2 + 13 * h, "/user/followers", 502, 0)],
            [record(a, d1 + 8 * h, "/tweets", 200, 30), record(b, d1 + 10 * h, "/user/info", 404, 0)],
            [
                record(a, d1 + 8 * h + timedelta(seconds=1), "/tweets", 200, 30),
                record(b, d1 + 10 * h + timedelta(seconds=1), "/community/moderators", 501, 0),
            ],
            [record(c, d1 + 12 * h + timedelta(seconds=i), "/tweets", 200, 15) for i in range(5)],
            [record(o, today - timedelta(days=40) + h, "/trends", 200, 15)],
            [record(a, live, "/trends", 200, 15)],
        ],
    )
    await ctx.admin.orders.insert_many(
        [
            {
                "_id": "ord_b",
                "account_id": b["_id"],
                "status": "finished",
                "credits_applied": 250_000,
                "updated_at": d1 + 11 * h,
            },
            {
                "_id": "ord_c",
                "account_id": c["_id"],
                "status": "finished",
                "credits_applied": 100_000,
                "updated_at": d1 + 13 * h,
            },
            {
                "_id": "ord_a",
                "account_id": a["_id"],
                "status": "expired",
                "credits_applied": 0,
                "updated_at": d2 + 11 * h,
            },
        ]
    )
    await ctx.keys.keys.insert_many(
        [
            {
                "_id": 9001,
                "key_id": 9001,
                "digest": "d9001",
                "account_id": a["_id"],
                "revoked": False,
                "created_at": d2,
            },
            {"_id": 9002, "key_id": 9002, "digest": "d9002", "account_id": a["_id"], "revoked": True, "created_at": d2},
            {
                "_id": 9003,
                "key_id": 9003,
                "digest": "d9003",
                "account_id": b["_id"],
                "revoked": False,
                "created_at": d1,
            },
        ]
    )
    return {
        "now": now,
        "days": {"d2": d2.date().isoformat(), "d1": d1.date().isoformat(), "today": today.date().isoformat()},
        "live": live,
        **people,
    }


def classes(**counts) -> dict:
    return {"2xx": 0, "3xx": 0, "4xx": 0, "5xx": 0, **{k.replace("s", "") + "xx": v for k, v in counts.items()}}


async def check_metrics(api, token: str, data: dict) -> None:
    d = data["days"]
    status, m, _ = await api.call("GET", "/admin/metrics", token=token)
    assert status == 200, m
    assert m["window"]["days"] == 30 and m["window"]["to"] == d["today"] and len(m["series"]) == 30
    by_day = {row["date"]: row for row in m["series"]}
    assert by_day[d["d2"]] == {
        "date": d["d2"],
        "signups": 1,
        "active_accounts": 1,
        "calls": 4,
        "calls_by_status": classes(s2=3, s5=1),
        "credits_spent": 54,
        "revenue_usd": 0.0,
    }
    assert by_day[d["d1"]] == {
        "date": d["d1"],
        "signups": 1,
        "active_accounts": 2,
        "calls": 4,
        "calls_by_status": classes(s2=2, s4=1, s5=1),
        "credits_spent": 60,
        "revenue_usd": 2.5,
    }
    assert by_day[d["today"]] == {
        "date": d["today"],
        "signups": 1,
        "active_accounts": 1,
        "calls": 1,
        "calls_by_status": classes(s2=1),
        "credits_spent": 15,
        "revenue_usd": 0.0,
    }
    assert sum(row["calls"] for row in m["series"]) == 9
    assert m["totals"] == {
        "signups": 3,
        "active_accounts": 2,
        "calls": 9,
        "calls_by_status": classes(s2=6, s4=1, s5=2),
        "credits_spent": 129,
        "revenue_usd": 2.5,
    }
    assert [e["endpoint"] for e in m["top_endpoints"]["by_calls"]] == [
        "/social/user/info",
        "/social/tweets",
        "/social/community/moderators",
        "/social/trends",
        "/social/user/followers",
    ]
    assert m["top_endpoints"]["by_calls"][0] == {"endpoint": "/social/user/info", "calls": 4, "credits": 54}
    assert [(e["endpoint"], e["credits"]) for e in m["top_endpoints"]["by_credits"][:3]] == [
        ("/social/tweets", 60),
        ("/social/user/info", 54),
        ("/social/trends", 15),
    ]
    assert {k: m["upstream"][k] for k in ("calls", "errors", "error_rate")} == {
        "calls": 8,
        "errors": 1,
        "error_rate": 0.125,
    }

    status, m, _ = await api.call("GET", "/admin/metrics?include_internal=true", token=token)
    by_day = {row["date"]: row for row in m["series"]}
    assert (
        by_day[d["d1"]]["signups"],
        by_day[d["d1"]]["active_accounts"],
        by_day[d["d1"]]["calls"],
        by_day[d["d1"]]["credits_spent"],
        by_day[d["d1"]]["revenue_usd"],
    ) == (2, 3, 9, 135, 3.5)
    assert m["totals"] == {
        "signups": 5,
        "active_accounts": 3,
        "calls": 14,
        "calls_by_status": classes(s2=11, s4=1, s5=2),
        "credits_spent": 204,
        "revenue_usd": 3.5,
    }  # signups include the admin who is asking
    status, m, _ = await api.call("GET", "/admin/metrics?days=60&include_internal=true", token=token)
    assert (
        m["totals"]["signups"],
        m["totals"]["active_accounts"],
        m["totals"]["calls"],
        m["totals"]["credits_spent"],
    ) == (6, 4, 15, 219)
    status, m, _ = await api.call("GET", "/admin/metrics?days=1", token=token)
    assert len(m["series"]) == 1 and m["totals"]["calls"] == 1 and m["totals"]["active_accounts"] == 1


async def test_metrics_on_a_known_data_set(api, ctx):
    stop_refresher()
    token = await admin_token(api, ctx)
    data = await known_data(ctx)
    await check_metrics(api, token, data)  # nothing rolled up: all live
    d1 = datetime.fromisoformat(data["days"]["d1"]).replace(tzinfo=UTC)
    assert await ctx.admin.refresh(d1 + timedelta(hours=10, minutes=30) + GRACE)
    assert await ctx.admin.watermark() == d1 + timedelta(hours=10, minutes=30)
    await check_metrics(api, token, data)  # rolled up to the middle of yesterday
    await asyncio.gather(ctx.admin.refresh(), ctx.admin.refresh(), ctx.admin.refresh())  # concurrent steps
    status, m, _ = await api.call("GET", "/admin/metrics", token=token)
    assert m["rolled_up_until"] is not None
    await check_metrics(api, token, data)  # rolled up to a minute ago
    assert not await ctx.admin.refresh(data["now"])  # nothing new to fold


async def test_top_endpoints_leave_out_endpoints_only_internal_accounts_called(api, ctx):
    stop_refresher()
    token = await admin_token(api, ctx)
    now = datetime.now(UTC)
    staff = account("staff@example.com", now - timedelta(days=3), internal=True)
    customer = account("customer@example.com", now - timedelta(days=3))
    await ctx.accounts.accounts.insert_many([staff, customer])
    earlier = now - timedelta(days=1)
    await insert_usage(
        ctx, [[record(staff, earlier, "/user/mentions", 200, 15), record(customer, earlier, "/user/info", 200, 18)]]
    )
    for rolled_up in (False, True):  # read live, then from the rollups less the internal accounts' share
        if rolled_up:
            assert await ctx.admin.refresh(now - timedelta(hours=1) + GRACE)
        _, m, _ = await api.call("GET", "/admin/metrics", token=token)
        for ranking in ("by_calls", "by_credits"):
            assert m["top_endpoints"][ranking] == [{"endpoint": "/social/user/info", "calls": 1, "credits": 18}]
        _, m, _ = await api.call("GET", "/admin/metrics?include_internal=true", token=token)
        assert [e["endpoint"] for e in m["top_endpoints"]["by_calls"]] == ["/social/user/info", "/social/user/mentions"]


async def test_user_rows_and_paging(api, ctx):
    stop_refresher()
    token = await admin_token(api, ctx)
    data = await known_data(ctx)
    await ctx.admin.refresh()
    status, page, _ = await api.call("GET", "/admin/users", token=token)
    assert status == 200 and page["has_next_page"] is False and page["next_cursor"] == ""
    rows = {row["email"].split("@")[0]: row for row in page["users"]}
    assert [row["email"] for row in page["users"]] == ["dave@example.com", "bob@example.com", "alice@example.com"]
    alice, bob, dave = rows["alice"], rows["bob"], rows["dave"]
    assert alice["account_id"] == data["alice"]["_id"] and alice["keys"] == {"active": 1, "revoked": 1}
    assert (alice["calls"], alice["credits_spent"], alice["balance"], alice["first_touch_source"]) == (
        7,
        129,
        1000,
        None,
    )
    assert datetime.fromisoformat(alice["last_activity"]) == data["live"].replace(
        microsecond=data["live"].microsecond // 1000 * 1000
    )  # as stored: milliseconds
    assert (bob["calls"], bob["credits_spent"], bob["total_paid_usd"], bob["balance"]) == (2, 0, 2.5, 250_000)
    assert bob["first_touch_source"] == "newsletter" and bob["keys"] == {"active": 1, "revoked": 0}
    assert (dave["calls"], dave["last_activity"], dave["keys"]) == (0, None, {"active": 0, "revoked": 0})
    assert all(row["is_admin"] is False and row["internal"] is False for row in page["users"])

    emails, cursor = [], ""
    while True:
        status, page, _ = await api.call(
            "GET", f"/admin/users?include_internal=true&limit=2&cursor={cursor}", token=token
        )
        assert status == 200 and len(page["users"]) <= 2
        emails += [row["email"] for row in page["users"]]
        if not page["has_next_page"]:
            break
        cursor = page["next_cursor"]
    assert emails == [
        "dave@example.com",
        ADMIN,
        "carol@example.com",
        "bob@example.com",
        "alice@example.com",
        "old@example.com",
    ]


async def test_paging_through_equal_signup_times(api, ctx):
    token = await admin_token(api, ctx)
    moment = datetime.now(UTC).replace(microsecond=0) - timedelta(days=3)
    twins = [account(f"twin{i}@example.com", moment) for i in range(5)]
    await ctx.accounts.accounts.insert_many(twins)
    seen, cursor = [], ""
    while True:
        _, page, _ = await api.call("GET", f"/admin/users?limit=2&cursor={cursor}", token=token)
        seen += [row["account_id"] for row in page["users"]]
        if not page["has_next_page"]:
            break
        cursor = page["next_cursor"]
    assert seen == sorted((t["_id"] for t in twins), reverse=True)


# --- the command line ---------------------------------------------------------------------------------------------
async def cli(*argv: str) -> int:
    return await asyncio.get_running_loop().run_in_executor(None, gateway.main, list(argv))


async def test_cli_grant_revoke_credit(api, mongo, settings, monkeypatch, capsys, tmp_path):
    for name in ("CONFIG_FILE", "GATEWAY_ENV", "ADMIN_EMAILS", "DATA_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MONGODB_URI", mongo.uri)
    monkeypatch.setenv("MONGODB_DB", settings.mongodb_db)
    user = await api.register("Carla@Example.com")
    assert (await api.call("GET", "/admin/users", token=user["token"]))[0] == 403
    assert await cli("admin", "grant", "carla@example.com") == 0
    assert "carla@example.com is now an admin" in capsys.readouterr().out
    assert (await api.call("GET", "/admin/users", token=user["token"]))[0] == 200
    assert await cli("admin", "revoke", "CARLA@example.com") == 0
    assert (await api.call("GET", "/admin/users", token=user["token"]))[0] == 403
    assert await cli("admin", "grant", "nobody@example.com") == 1
    assert "no account" in capsys.readouterr().err
    before = (await api.call("GET", "/account", token=user["token"]))[1]["credits"]
    assert await cli("admin", "credit", "carla@example.com", "5000") == 0
    assert (await api.call("GET", "/account", token=user["token"]))[1]["credits"] == before + 5000
    assert await cli("admin", "credit", "carla@example.com", "0") == 2
    monkeypatch.setenv("GATEWAY_ENV", "production")
    monkeypatch.setenv("JWT_SECRET", "j" * 40)
    monkeypatch.setenv("SECRETS_KEY", "s" * 40)
    capsys.readouterr()
    assert await cli("admin", "credit", "carla@example.com", "5000") == 2
    assert "refused in production" in capsys.readouterr().err
    assert (await api.call("GET", "/account", token=user["token"]))[1]["credits"] == before + 5000
    # Without MONGODB_URI the command opens the embedded database in DATA_DIR itself.
    monkeypatch.setenv("GATEWAY_ENV", "development")
    monkeypatch.delenv("MONGODB_URI")
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    assert await cli("admin", "grant", "carla@example.com") == 1  # a different (empty) database
    assert (tmp_path / "db").is_dir()


# --- scale ----------------------------------------------------------------------------------------------------------
async def test_admin_queries_stay_fast_at_scale(api, ctx, capsys):
    """3,000 accounts and 100,000 usage records: each admin request answers well under a second."""
    stop_refresher()
    token = await admin_token(api, ctx)
    rnd, now = random.Random(7), datetime.now(UTC)
    people = [account(f"user{i}@scale.example", now - timedelta(days=rnd.uniform(0, 90))) for i in range(3000)]
    people[0]["internal"], people[1]["is_admin"] = True, True
    await ctx.accounts.accounts.insert_many(people)
    endpoints = [("/user/info", 18), ("/tweet/advanced_search", 300), ("/user/followers", 200), ("/tweets", 150)]
    batches = []
    for burst in range(10_000):  # a client paging through results: 10 calls within one flush
        who, (endpoint, price) = rnd.choice(people[:2000]), rnd.choice(endpoints)
        start = now - timedelta(seconds=10) if burst < 10 else now - timedelta(seconds=rnd.uniform(120, 40 * 86400))
        batches.append(
            [
                record(who, start + timedelta(milliseconds=i), endpoint, rnd.choice((200, 200, 200, 404, 502)), price)
                for i in range(10)
            ]
        )
    credits = sum(r["credits"] for batch in batches for r in batch)
    started = time.perf_counter()
    await insert_usage(ctx, batches)
    inserted = time.perf_counter() - started
    started = time.perf_counter()
    assert await ctx.admin.refresh()
    refreshed = time.perf_counter() - started

    timings = {}
    for path in (
        "/admin/metrics?days=30",
        "/admin/metrics?days=365&include_internal=true",
        "/admin/users",
        "/admin/users?include_internal=true&limit=500",
    ):
        started = time.perf_counter()
        status, body, _ = await api.call("GET", path, token=token)
        timings[path] = time.perf_counter() - started
        assert status == 200, body
        if "days=365" in path:
            assert body["totals"]["calls"] == 100_000 and body["totals"]["credits_spent"] == credits
        if path == "/admin/users":
            assert len(body["users"]) == 50 and body["has_next_page"]
            started = time.perf_counter()
            status, deeper, _ = await api.call("GET", f"/admin/users?cursor={body['next_cursor']}", token=token)
            timings["/admin/users (page 2)"] = time.perf_counter() - started
            assert status == 200 and datetime.fromisoformat(deeper["users"][0]["created_at"]) <= datetime.fromisoformat(
                body["users"][-1]["created_at"]
            )
    with capsys.disabled():
        print(
            f"\nadmin at scale: 3000 accounts, 100000 usage records in {len(batches)} buckets; "
            f"insert {inserted:.1f}s, rollup {refreshed:.1f}s; "
            + ", ".join(f"{path} {seconds * 1000:.0f} ms" for path, seconds in timings.items())
        )
    # A guard against a scan of the raw records or a query per account (seconds each at this scale), loose
    # enough for a busy machine: how fast these pages are is the benchmark's business, not a test's.
    assert max(timings.values()) < 5.0, timings
