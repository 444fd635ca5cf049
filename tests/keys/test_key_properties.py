"""Key properties (README, "Key properties"): expiry, endpoint scopes, address allowlists and credit
budgets set through POST/PATCH /keys and enforced by the data plane in the documented order, with
the documented messages and nothing charged; changes made through another gateway context reach
this one within a second; rolling a key with a grace period; budgets under 400 concurrent calls."""

import asyncio
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import orjson
import pytest
import tornado.httpserver
import tornado.testing
from pymongo import monitoring
from support import FAST, Gateway, account_with_keys, balance, ledger_of
from tornado.httpclient import AsyncHTTPClient, HTTPRequest

import gateway
from accounting.budgets import BudgetExhausted
from accounting.keys import KeyEntry
from metering.ledger import budget_period, period_end
from storage import db as database
from storage.budgets import BudgetStore

pytestmark = pytest.mark.gen_test(timeout=60)

PRICE = 18  # user/info: one profile


def info(catalog) -> str:
    return f"/social/user/info?userName={catalog['users'][0]['userName']}"


def future(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).isoformat()


async def keyed(api, credits: int = 1_000_000, **properties) -> tuple[dict, dict]:
    """A funded account and a key created with `properties`."""
    user, _ = await api.funded_key(credits)
    status, key, _ = await api.call("POST", "/keys", {"name": "restricted", **properties}, token=user["token"])
    assert status == 200, key
    return user, key


async def patch(api, user, key, body) -> tuple[int, dict]:
    status, row, _ = await api.call("PATCH", f"/keys/{key['key_id']}", body, token=user["token"])
    return status, row


async def serve(ctx) -> tuple[str, tornado.httpserver.HTTPServer]:
    """Serves another context's application: a second gateway process on the same database."""
    server = tornado.httpserver.HTTPServer(gateway.make_app(ctx))
    sock, port = tornado.testing.bind_unused_port()
    server.add_sockets([sock])
    return f"http://127.0.0.1:{port}", server


async def within_a_second(check) -> float:
    started = time.monotonic()
    while not await check():
        assert time.monotonic() - started < 1.0, "not within a second"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


# --- the portal: create, list, change -------------------------------------------------------------


async def test_properties_are_set_listed_changed_and_removed(api):
    expires = future(3600)
    user, key = await keyed(
        api,
        expires_at=expires,
        allowed_endpoints=["/user/info", "tweets", "/trends", "tweets"],
        allowed_ips=["10.1.2.3", "192.168.0.0/16", "2001:db8::/32"],
        credit_limit=5000,
        credit_limit_period="month",
    )
    assert key["key"].startswith("sgw_") and key["credits_used"] == 0
    assert key["allowed_endpoints"] == ["/user/info", "tweets", "/trends"]
    assert key["allowed_ips"] == ["10.1.2.3/32", "192.168.0.0/16", "2001:db8::/32"]
    assert key["credit_limit"] == 5000 and key["credit_limit_period"] == "month"
    rows = (await api.call("GET", "/keys", token=user["token"]))[1]
    row = next(r for r in rows if r["key_id"] == key["key_id"])
    assert datetime.fromisoformat(row["expires_at"]) == datetime.fromisoformat(expires).replace(microsecond=0) or (
        abs(datetime.fromisoformat(row["expires_at"]) - datetime.fromisoformat(expires)) < timedelta(milliseconds=1)
    )
    assert {"qps_limit", "revoked", "created_at", "last_used_at", "prefix", "credits_used"} <= set(row)
    assert "key" not in row and "digest" not in row and "sealed" not in row

    status, row = await patch(api, user, key, {"name": "renamed", "allowed_ips": None, "credit_limit": None})
    assert status == 200, row
    assert row["name"] == "renamed" and row["allowed_ips"] is None
    assert row["credit_limit"] is None and row["credit_limit_period"] is None  # the period goes with the limit
    assert row["allowed_endpoints"] == ["/user/info", "tweets", "/trends"]  # untouched
    status, row = await patch(api, user, key, {"credit_limit": 10, "credit_limit_period": "day"})
    assert status == 200 and row["credit_limit"] == 10 and row["credit_limit_period"] == "day"
    # The secret never changes through PATCH.
    revealed = (await api.call("GET", f"/keys/{key['key_id']}/reveal", token=user["token"]))[1]
    assert revealed["key"] == key["key"]


@pytest.mark.parametrize(
    "body, loc, type_",
    [
        ({"expires_at": "2001-01-01T00:00:00Z"}, ["body", "expires_at"], "datetime_future"),
        ({"expires_at": "tomorrow"}, ["body", "expires_at"], "datetime_parsing"),
        ({"expires_at": 12}, ["body", "expires_at"], "string_type"),
        # Valid ISO 8601 whose UTC time leaves the years 1..9999: was a 500 (OverflowError).
        ({"expires_at": "9999-12-31T23:59:59-05:00"}, ["body", "expires_at"], "datetime_parsing"),
        ({"expires_at": "0001-01-01T00:00:00+05:00"}, ["body", "expires_at"], "datetime_parsing"),
        ({"allowed_endpoints": ["/user/nope"]}, ["body", "allowed_endpoints", 0], "value_error"),
        ({"allowed_endpoints": ["/social/user/info"]}, ["body", "allowed_endpoints", 0], "value_error"),
        ({"allowed_endpoints": []}, ["body", "allowed_endpoints"], "too_short"),
        ({"allowed_endpoints": "/user/info"}, ["body", "allowed_endpoints"], "list_type"),
        ({"allowed_ips": ["10.0.0.0/33"]}, ["body", "allowed_ips", 0], "ip_any_network"),
        ({"allowed_ips": ["localhost"]}, ["body", "allowed_ips", 0], "ip_any_network"),
        ({"allowed_ips": [7]}, ["body", "allowed_ips", 0], "ip_any_network"),
        ({"credit_limit": 0, "credit_limit_period": "day"}, ["body", "credit_limit"], "greater_than_equal"),
        ({"credit_limit": 10, "credit_limit_period": "week"}, ["body", "credit_limit_period"], "enum"),
        ({"credit_limit": 10}, ["body", "credit_limit_period"], "missing"),
        ({"credit_limit_period": "day"}, ["body", "credit_limit"], "missing"),
        ({"credit_limit": True, "credit_limit_period": "day"}, ["body", "credit_limit"], "int_type"),
        ({"scopes": ["x"]}, ["body", "scopes"], "extra_forbidden"),
    ],
)
async def test_invalid_properties_are_422_at_creation_and_change(api, body, loc, type_):
    user = await api.register()
    status, answer, _ = await api.call("POST", "/keys", body, token=user["token"])
    assert status == 422 and {"loc": loc, "type": type_} in [
        {"loc": e["loc"], "type": e["type"]} for e in answer["detail"]
    ]
    key = await api.new_key(user["token"])
    status, answer = await patch(api, user, key, body)
    assert status == 422, answer
    assert (await api.call("GET", "/keys", token=user["token"]))[1][0]["credit_limit"] is None  # nothing written


async def test_patch_and_roll_of_another_accounts_key_are_404(api):
    owner, key = await keyed(api)
    other = await api.register()
    for method, path, body in (
        ("PATCH", f"/keys/{key['key_id']}", {"name": "mine"}),
        ("POST", f"/keys/{key['key_id']}/roll", {"grace_seconds": 0}),
        ("PATCH", "/keys/999999999", {"name": "x"}),
    ):
        status, answer, _ = await api.call(method, path, body, token=other["token"])
        assert status == 404 and answer == {"detail": "Key not found"}
    assert (await api.call("PATCH", f"/keys/{key['key_id']}", {"name": "x"}))[0] == 401
    assert (await api.call("GET", "/keys", token=owner["token"]))[1][0]["name"] == "restricted"
    status, answer = await patch(api, owner, key, {"name": None})
    assert status == 422 and answer["detail"][0]["loc"] == ["body", "name"]


# --- the data plane: each restriction, its message, and nothing charged -----------------------------


@pytest.mark.settings(plan_rules=FAST)
async def test_endpoint_scope_by_path_and_group(api, ctx, catalog):
    user, key = await keyed(api, allowed_endpoints=["/user/info", "lists"])
    assert (await api.call("GET", info(catalog), key=key["key"]))[0] == 200
    assert (await api.call("GET", f"/twitter/list/tweets_timeline?listId={catalog['lists'][0]}", key=key["key"]))[
        0
    ] == 200
    before = await balance(api, user)
    status, body, headers = await api.call("GET", f"/social/tweets?tweet_ids={catalog['tweets'][0]}", key=key["key"])
    assert status == 403 and body == {"status": "error", "msg": "This API key may not call this endpoint"}
    # The scope is checked before the parameters: a call outside it is 403 even when malformed.
    assert (await api.call("GET", "/social/user/followers", key=key["key"]))[0] == 403
    assert "X-Credits-Charged" not in headers and await balance(api, user) == before
    await patch(api, user, key, {"allowed_endpoints": ["users"]})
    assert (
        await api.call("GET", f"/social/user/followers?userName={catalog['users'][0]['userName']}", key=key["key"])
    )[0] == 200
    assert (await api.call("GET", f"/social/list/tweets_timeline?listId={catalog['lists'][0]}", key=key["key"]))[
        0
    ] == 403
    await patch(api, user, key, {"allowed_endpoints": None})
    assert (await api.call("GET", f"/social/tweets?tweet_ids={catalog['tweets'][0]}", key=key["key"]))[0] == 200


@pytest.mark.settings(plan_rules=FAST)
async def test_address_allowlist_v4_and_v6(api, catalog):
    user, key = await keyed(api, allowed_ips=["10.0.0.0/8", "2001:db8::/32"])
    before = await balance(api, user)
    status, body, _ = await api.call("GET", info(catalog), key=key["key"])
    assert status == 403 and body == {"status": "error", "msg": "This API key is not allowed from this address"}
    # Without TRUSTED_PROXIES a forwarded address proves nothing.
    assert (await api.call("GET", info(catalog), key=key["key"], headers={"X-Forwarded-For": "10.0.0.1"}))[0] == 403
    assert await balance(api, user) == before
    await patch(api, user, key, {"allowed_ips": ["127.0.0.0/8", "::1"]})
    assert (await api.call("GET", info(catalog), key=key["key"]))[0] == 200


@pytest.mark.settings(plan_rules=FAST, trusted_proxies=("127.0.0.1",))
async def test_address_allowlist_honours_trusted_proxies(api, catalog):
    user, key = await keyed(api, allowed_ips=["203.0.113.0/24", "2001:db8::/32"])
    for client, expected in (
        ("203.0.113.9", 200),
        ("2001:db8::7", 200),
        ("::ffff:203.0.113.5", 200),  # IPv4-mapped IPv6 is the IPv4 address
        ("198.51.100.1", 403),
        ("2001:db9::1", 403),
        ("203.0.113.9, 198.51.100.1", 403),  # the nearest untrusted hop is the client, not what it wrote
    ):
        status, body, _ = await api.call("GET", info(catalog), key=key["key"], headers={"X-Forwarded-For": client})
        assert status == expected, (client, body)


@pytest.mark.settings(plan_rules=FAST, trusted_proxies=("127.0.0.1",))
async def test_an_ipv4_mapped_allowlist_entry_means_the_ipv4_address(api, catalog):
    # Written the IPv6 way, the entry used to be stored as ::ffff:cb00:7105/128 and never matched: clients
    # are compared as IPv4 (README: IPv4-mapped IPv6 counts as IPv4).
    user, key = await keyed(api, allowed_ips=["::ffff:203.0.113.5", "::ffff:198.51.100.0/120"])
    rows = (await api.call("GET", "/keys", token=user["token"]))[1]
    assert rows[0]["allowed_ips"] == ["203.0.113.5/32", "198.51.100.0/24"]
    for client, expected in (
        ("203.0.113.5", 200),
        ("::ffff:203.0.113.5", 200),
        ("198.51.100.77", 200),
        ("203.0.113.6", 403),
    ):
        status, body, _ = await api.call("GET", info(catalog), key=key["key"], headers={"X-Forwarded-For": client})
        assert status == expected, (client, body)


@pytest.mark.settings(plan_rules=FAST)
async def test_expiry_and_the_order_of_checks(api, ctx, catalog):
    user, key = await keyed(api, expires_at=future(1.5), allowed_ips=["10.0.0.0/8"], allowed_endpoints=["/trends"])
    # Not yet expired: the address comes before the scope, the scope before parameters and rate limit.
    status, body, _ = await api.call("GET", "/social/user/info", key=key["key"])
    assert (status, body["msg"]) == (403, "This API key is not allowed from this address")
    await patch(api, user, key, {"allowed_ips": None})
    status, body, _ = await api.call("GET", "/social/user/info", key=key["key"])
    assert (status, body["msg"]) == (403, "This API key may not call this endpoint")
    await asyncio.sleep(1.6)
    status, body, _ = await api.call("GET", "/social/trends", key=key["key"])
    assert status == 401 and body == {"status": "error", "msg": "This API key has expired"}
    # Expiry comes before the address check; a revoked key says so before it says expired.
    await patch(api, user, key, {"allowed_ips": ["10.0.0.0/8"]})
    assert (await api.call("GET", "/social/trends", key=key["key"]))[1]["msg"] == "This API key has expired"
    await api.call("POST", f"/keys/{key['key_id']}/revoke", token=user["token"])
    assert (await api.call("GET", "/social/trends", key=key["key"]))[1]["msg"] == "This API key has been revoked"
    await ctx.meter.flush()
    assert await ctx.usage.records({"account_id": user["account_id"]}) == []  # nothing recorded, nothing charged


@pytest.mark.settings(plan_rules=({"name": "slow", "min_paid_usd": 0, "qps": 1},))
async def test_scope_is_checked_before_the_rate_limit(api, catalog):
    user, key = await keyed(api, allowed_endpoints=["/user/info"])
    statuses = [(await api.call("GET", "/social/trends", key=key["key"]))[0] for _ in range(5)]
    assert statuses == [403] * 5  # refused calls do not use up the key's rate
    assert (await api.call("GET", info(catalog), key=key["key"]))[0] == 200
    assert (await api.call("GET", info(catalog), key=key["key"]))[0] == 429


# --- budgets --------------------------------------------------------------------------------------


@pytest.mark.settings(plan_rules=FAST)
async def test_budget_holds_under_400_concurrent_calls(api, ctx, catalog):
    limit = 10 * PRICE + 5  # room for 10 calls, not 11
    user, key = await keyed(api, 1_000_000, credit_limit=limit, credit_limit_period="total")
    results = await asyncio.gather(*[api.call("GET", info(catalog), key=key["key"]) for _ in range(400)])
    statuses = [r[0] for r in results]
    assert statuses.count(200) == 10 and statuses.count(402) == 390
    refused = next(r[1] for r in results if r[0] == 402)
    assert refused["status"] == "error" and "credit budget is exhausted" in refused["msg"]
    assert "balance is not the limit" in refused["msg"] and f"{limit} credits in total" in refused["msg"]
    assert await balance(api, user) == 1_000_000 - 10 * PRICE  # the account paid for the 10 calls only
    row = next(r for r in (await api.call("GET", "/keys", token=user["token"]))[1] if r["key_id"] == key["key_id"])
    assert row["credits_used"] == 10 * PRICE
    # Raising the limit applies at once.
    await patch(api, user, key, {"credit_limit": limit + PRICE})
    assert (await api.call("GET", info(catalog), key=key["key"]))[0] == 200
    assert (await api.call("GET", info(catalog), key=key["key"]))[0] == 402


@pytest.mark.settings(plan_rules=FAST)
async def test_daily_budget_counts_what_was_spent_before_it_was_set(api, ctx, catalog):
    user, key = await keyed(api)
    for _ in range(3):
        assert (await api.call("GET", info(catalog), key=key["key"]))[0] == 200
    await ctx.meter.flush()
    status, row = await patch(api, user, key, {"credit_limit": 4 * PRICE, "credit_limit_period": "day"})
    assert row["credits_used"] == 3 * PRICE
    assert (await api.call("GET", info(catalog), key=key["key"]))[0] == 200
    status, body, _ = await api.call("GET", info(catalog), key=key["key"])
    tomorrow = (datetime.now(UTC).date() + timedelta(days=1)).isoformat()
    assert status == 402 and f"renews at {tomorrow}T00:00:00Z" in body["msg"] and "per day" in body["msg"]
    # Another key of the account is not limited by this key's budget.
    other = await api.new_key(user["token"])
    assert (await api.call("GET", info(catalog), key=other["key"]))[0] == 200


@pytest.mark.settings(plan_rules=FAST)
async def test_a_budget_set_again_or_moved_to_another_period_counts_what_was_spent_meanwhile(api, ctx, catalog):
    # Found from outside: removing a daily budget, spending, and setting it again the same day let the key
    # spend the new limit minus only what it spent under the first run (the first run's document was kept).
    user, key = await keyed(api, credit_limit=2 * PRICE, credit_limit_period="day")

    async def calls_until_402() -> int:
        for n in range(10):
            status, body, _ = await api.call("GET", info(catalog), key=key["key"])
            if status == 402:
                assert "budget" in body["msg"]
                return n
            assert status == 200, body
        raise AssertionError("the budget never stopped the key")

    assert await calls_until_402() == 2
    await patch(api, user, key, {"credit_limit": None})
    for _ in range(3):
        assert (await api.call("GET", info(catalog), key=key["key"]))[0] == 200
    await ctx.meter.flush()
    status, row = await patch(api, user, key, {"credit_limit": 6 * PRICE, "credit_limit_period": "day"})
    assert status == 200 and row["credits_used"] == 5 * PRICE
    assert await calls_until_402() == 1  # 6 - 5 spent today; was 4
    await ctx.meter.flush()
    # Another period, then back: each run counts the period's whole spend.
    await patch(api, user, key, {"credit_limit": 7 * PRICE, "credit_limit_period": "month"})
    assert await calls_until_402() == 1
    await ctx.meter.flush()
    await patch(api, user, key, {"credit_limit": 8 * PRICE, "credit_limit_period": "day"})
    assert await calls_until_402() == 1
    # A key rolled from it spends from the same run of the budget.
    status, rolled, _ = await api.call(
        "POST", f"/keys/{key['key_id']}/roll", {"grace_seconds": 60}, token=user["token"]
    )
    assert (await api.call("GET", info(catalog), key=rolled["key"]))[0] == 402
    used = {r["key_id"]: r["credits_used"] for r in (await api.call("GET", "/keys", token=user["token"]))[1]}
    assert used[key["key_id"]] == used[rolled["key_id"]] == 8 * PRICE


@pytest.mark.settings(plan_rules=FAST)
async def test_an_empty_balance_is_still_the_balances_402(api, catalog):
    user, key = await keyed(api, 20, credit_limit=1000, credit_limit_period="month")
    assert (await api.call("GET", info(catalog), key=key["key"]))[0] == 200
    status, body, _ = await api.call("GET", info(catalog), key=key["key"])
    assert status == 402 and body["msg"].startswith("Insufficient credits")


async def test_an_idle_process_gives_its_budget_slice_back_for_another(ctx, second):
    """The bound across processes: one may answer 402 while another holds an unspent slice, until the
    holder is idle for 3 x LEASE_SECONDS (or shuts down, or the limit changes) and gives it back."""
    account = await ctx.accounts.create(f"b{uuid.uuid4().hex[:8]}@example.com", "unused", 10_000)
    aid = account["_id"]
    entry = KeyEntry(777, aid, False, credit_limit=2 * PRICE + 5, period="total", budget_id=777)
    held = await ctx.meter.reserve(aid, PRICE, 15, entry)  # this process takes a slice of one call...
    ctx.meter.release(held)  # ...and the call is not charged: the slice stays here, unspent
    spent = await second.meter.reserve(aid, PRICE, 15, entry)
    second.meter.settle(spent, PRICE)
    with pytest.raises(BudgetExhausted):  # 5 credits left in the budget, one call unspent elsewhere
        await second.meter.reserve(aid, PRICE, 15, entry)
    (slot,) = ctx.meter.key_budgets.budgets
    ctx.meter.key_budgets.budgets[slot].last_used -= 3 * ctx.settings.lease_seconds + 1  # idle
    await ctx.meter.upkeep()
    await asyncio.gather(*ctx.meter._background)
    assert ctx.meter.key_budgets.budgets == {}
    second.meter.key_budgets.budgets[slot].empty_until = 0.0  # the remembered 402 lasts a second
    again = await second.meter.reserve(aid, PRICE, 15, entry)
    assert again is not None and again.amount == PRICE
    second.meter.settle(again, PRICE)
    with pytest.raises(BudgetExhausted):
        second.meter.key_budgets.budgets[slot].empty_until = 0.0
        await second.meter.reserve(aid, PRICE, 15, entry)


class Commands(monitoring.CommandListener):
    def __init__(self):
        self.names = []

    def started(self, event):
        self.names.append(event.command_name)

    def succeeded(self, event):
        pass

    def failed(self, event):
        pass


async def test_a_budget_slice_is_one_round_trip_and_slices_never_pass_the_limit(ctx):
    commands = Commands()
    client = database.connect(ctx.settings.mongodb_uri, event_listeners=[commands])
    store = BudgetStore(client[ctx.settings.mongodb_db])
    budget_id = int(uuid.uuid4().int % 10**9)
    assert await store.take(budget_id, "2026-11", 1000, 100, PRICE, None) == 100  # creates the document
    assert await store.take(budget_id, "2026-11", 1000, 100, PRICE, None) == 100
    assert commands.names == ["update", "update"]
    # Near the end: at most half of what is left, at least one call, never past the limit.
    grants = []
    while grant := await store.take(budget_id, "2026-11", 1000, 300, PRICE, None):
        grants.append(grant)
    assert grants == [300, 250, 125, 62, 31, PRICE, 14] and sum(grants) == 800
    # A slice wanted larger than half a fresh budget is never created at that size.
    small = budget_id + 1
    assert [await store.take(small, "2026-11", 30, 200, PRICE, None) for _ in range(3)] == [PRICE, 12, 0]
    await client.close()


async def test_a_budget_reads_the_usage_only_when_it_was_set_within_the_period(ctx, monkeypatch):
    account = await ctx.accounts.create(f"r{uuid.uuid4().hex[:8]}@example.com", "unused", 10_000)
    aid = account["_id"]
    counted = []
    count = ctx.meter.key_budgets._spent_by_budget

    async def counting(*args):
        counted.append(args)
        return await count(*args)

    monkeypatch.setattr(ctx.meter.key_budgets, "_spent_by_budget", counting)

    async def first_call_counts(budget_id: int, epoch: int) -> bool:
        entry = KeyEntry(budget_id, aid, False, credit_limit=10 * PRICE, period="month", budget_id=budget_id)
        counted.clear()
        ctx.meter.settle(await ctx.meter.reserve(aid, PRICE, PRICE, replace(entry, budget_epoch=epoch)), PRICE)
        return bool(counted)

    base = int(uuid.uuid4().int % 10**9)
    assert not await first_call_counts(base, 0)  # set with the key: nothing was spent outside the budget
    last_month = int((datetime.now(UTC).replace(day=1) - timedelta(days=1)).timestamp() * 1000)
    assert not await first_call_counts(base + 1, last_month)  # running since before this month
    assert await first_call_counts(base + 2, int(time.time() * 1000))  # set this month: what was spent counts


def test_budget_periods_are_utc_days_months_or_ever():
    now = datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC)
    assert budget_period("day", now) == ("2026-12-31", "2026-12-31")
    assert budget_period("month", now) == ("2026-12", "2026-12-01")
    assert budget_period("total", now) == ("total", "")
    assert period_end("day", now) == datetime(2027, 1, 1, tzinfo=UTC)
    assert period_end("month", now) == datetime(2027, 1, 1, tzinfo=UTC)
    assert period_end("month", datetime(2026, 2, 10, tzinfo=UTC)) == datetime(2026, 3, 1, tzinfo=UTC)
    assert period_end("total", now) is None


# --- roll -----------------------------------------------------------------------------------------


@pytest.mark.settings(plan_rules=FAST)
async def test_roll_keeps_the_old_key_for_the_grace_then_401(api, ctx, catalog):
    user, old = await keyed(api, allowed_endpoints=["users"], credit_limit=100 * PRICE, credit_limit_period="day")
    assert (await api.call("GET", info(catalog), key=old["key"]))[0] == 200
    status, new, _ = await api.call("POST", f"/keys/{old['key_id']}/roll", {"grace_seconds": 2}, token=user["token"])
    assert status == 200, new
    assert new["key"] != old["key"] and new["key_id"] != old["key_id"] and new["rolled_from"] == old["key_id"]
    assert new["allowed_endpoints"] == ["users"] and new["credit_limit"] == 100 * PRICE
    assert new["credits_used"] == PRICE  # the budget carries over: rolling does not grant a fresh one
    rows = {r["key_id"]: r for r in (await api.call("GET", "/keys", token=user["token"]))[1]}
    ends = datetime.fromisoformat(rows[old["key_id"]]["expires_at"])
    assert timedelta(seconds=1) < ends - datetime.now(UTC) <= timedelta(seconds=2)
    assert rows[new["key_id"]]["expires_at"] is None
    assert (await api.call("GET", info(catalog), key=old["key"]))[0] == 200  # within the grace
    assert (await api.call("GET", info(catalog), key=new["key"]))[0] == 200
    await asyncio.sleep((ends - datetime.now(UTC)).total_seconds() + 0.05)
    status, body, _ = await api.call("GET", info(catalog), key=old["key"])
    assert status == 401 and body["msg"] == "This API key has expired"
    assert (await api.call("GET", info(catalog), key=new["key"]))[0] == 200
    # An expired key cannot be rolled again nor revived; grace is bounded.
    assert (await api.call("POST", f"/keys/{old['key_id']}/roll", {"grace_seconds": 0}, token=user["token"]))[0] == 409
    for revive in ({"expires_at": None}, {"expires_at": future(3600)}):
        status, body = await patch(api, user, old, revive)
        assert status == 409 and body == {"detail": "This API key has expired; its expiry cannot be changed"}
    assert (await api.call("GET", info(catalog), key=old["key"]))[1]["msg"] == "This API key has expired"
    assert (await patch(api, user, old, {"name": "old one"}))[0] == 200  # the name still can
    for bad in ({"grace_seconds": -1}, {"grace_seconds": 604_801}, {}):
        assert (await api.call("POST", f"/keys/{new['key_id']}/roll", bad, token=user["token"]))[0] == 422


@pytest.mark.settings(plan_rules=FAST)
async def test_roll_without_grace_stops_the_old_key_at_once(api, catalog):
    user, old = await keyed(api)
    assert (await api.call("GET", info(catalog), key=old["key"]))[0] == 200  # cached in the data plane
    status, new, _ = await api.call("POST", f"/keys/{old['key_id']}/roll", {"grace_seconds": 0}, token=user["token"])
    assert status == 200
    assert (await api.call("GET", info(catalog), key=old["key"]))[1]["msg"] == "This API key has expired"
    assert (await api.call("GET", info(catalog), key=new["key"]))[0] == 200


# --- changes made through another gateway context -----------------------------------------------------


@pytest.mark.settings(plan_rules=FAST)
async def test_changes_through_another_context_apply_here_within_a_second(api, ctx, second, http_client, catalog):
    await changes_elsewhere_apply_here(api, ctx, second, http_client, catalog)


@pytest.mark.settings(plan_rules=FAST, coherence="poll", coherence_poll_seconds=0.2)
async def test_changes_elsewhere_apply_within_a_second_by_polling_too(api, ctx, second, http_client, catalog):
    """Where change streams are unavailable, the poll reads keys stamped props_changed_at."""
    await changes_elsewhere_apply_here(api, ctx, second, http_client, catalog)


async def changes_elsewhere_apply_here(api, ctx, second, http_client, catalog) -> None:
    url, server = await serve(second)
    elsewhere = type(api)(http_client, url)  # the same client, for the other context
    try:
        user, key = await keyed(api)
        assert (await api.call("GET", info(catalog), key=key["key"]))[0] == 200  # cached here, unrestricted

        async def now(expected):
            """Here, a call answers `expected`: a status, or the end of the error message."""

            async def check():
                status, body, _ = await api.call("GET", info(catalog), key=key["key"])
                return status == expected if isinstance(expected, int) else body["msg"].endswith(expected)

            return check

        await patch(elsewhere, user, key, {"allowed_endpoints": ["/trends"]})
        await within_a_second(await now("may not call this endpoint"))
        await patch(elsewhere, user, key, {"allowed_endpoints": None, "allowed_ips": ["10.0.0.0/8"]})
        await within_a_second(await now("not allowed from this address"))
        # Every call so far counts (waiting above made some): one more call fits, then the budget's 402.
        await ctx.meter.flush()
        used = (await elsewhere.call("GET", "/keys", token=user["token"]))[1][0]["credits_used"]
        assert used >= PRICE
        changes = {"allowed_ips": None, "credit_limit": used + PRICE + 5, "credit_limit_period": "day"}
        await patch(elsewhere, user, key, changes)
        await within_a_second(await now(200))
        await within_a_second(await now("raise or remove the key's credit_limit"))
        status, new, _ = await elsewhere.call(
            "POST", f"/keys/{key['key_id']}/roll", {"grace_seconds": 0}, token=user["token"]
        )
        assert status == 200
        await within_a_second(await now("This API key has expired"))
    finally:
        server.stop()


@pytest.mark.gen_test(timeout=120)
async def test_budget_over_two_processes_never_overspends(mongo, upstream_url, catalog):
    """Two gateway processes, one key with a budget of about 50 calls, 400 concurrent calls spread
    over both: never over the budget, and short of it by less than one call per process (README)."""
    db_name = f"b_{uuid.uuid4().hex[:10]}"
    a, b = Gateway(mongo.uri, upstream_url, db_name), Gateway(mongo.uri, upstream_url, db_name)
    await asyncio.gather(a.launch(), b.launch())
    user, (key,), auth = await account_with_keys(a, 1_000_000, 1)
    key_id = orjson.loads((await a.call("GET", "/keys", **auth)).body)[0]["key_id"]
    limit = 50 * PRICE + 7
    changed = await b.call("PATCH", f"/keys/{key_id}", {"credit_limit": limit, "credit_limit_period": "total"}, **auth)
    assert changed.code == 200
    path = info(catalog)
    client = AsyncHTTPClient(force_instance=True, max_clients=400)
    responses = await asyncio.gather(
        *[
            client.fetch(HTTPRequest(gw.url + path, headers={"X-API-Key": key}, request_timeout=30), raise_error=False)
            for gw in (a, b) * 200
        ]
    )
    assert {r.code for r in responses} == {200, 402}
    refused = orjson.loads(next(r for r in responses if r.code == 402).body)
    assert "credit budget is exhausted" in refused["msg"]
    spent = sum(int(r.headers["X-Credits-Charged"]) for r in responses if r.code == 200)
    assert limit - 2 * PRICE < spent <= limit
    assert a.stop() == 0 and b.stop() == 0
    account, records = await ledger_of(mongo.uri, db_name, user["account_id"])
    assert sum(r["credits"] for r in records) == spent and account["credits"] == 1_000_000 - spent
    # Both processes gave back what they held unspent on shutdown: the budget's books match the spend.
    client = database.connect(mongo.uri)
    # One run of the budget (the PATCH started it: its id carries the epoch, storage/budgets.py).
    budgets = await client[db_name].key_budgets.find({"_id": {"$regex": f"^{key_id}:total"}}).to_list(None)
    await client.close()
    assert [b["taken"] for b in budgets] == [spent]
