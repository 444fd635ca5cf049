"""Monthly statements (billing/statements.py, docs/billing.md): the books of an account across a month's end, read
back as JSON, CSV and PDF; the months refused; the monthly figures exact however often a batch is written."""

import asyncio
import csv
import io
import shutil
import subprocess
import uuid
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import orjson
import pymongo
import pytest
from support import FAST, Gateway, account_with_keys, charged, storm

from accounting.reconcile import check
from storage import clock
from storage.ledger import read_books
from storage.usage_months import UsageMonths, deltas, merged

pytestmark = pytest.mark.gen_test(timeout=60)

CALENDAR = dict(
    cache_max_bytes=8_000_000,  # cache hits: what the answer cache saved
    stream_min_interval=0.3,
    stream_tick_seconds=0.05,
    plan_rules=FAST,
)


def month_after(moment: datetime) -> datetime:
    """The start of the month after `moment`'s."""
    return (moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0) + timedelta(days=32)).replace(day=1)


@pytest.fixture
def calendar(ctx):
    """The stores' clock, moved by the test (forward only), put back after it."""
    yield clock
    clock.travel(None)


async def settle(ctx, account_id: str) -> None:
    """Every charge of the account stored (the flush runs in the background too)."""
    await ctx.meter.flush(final=True)


async def poll_charges(ctx, account_id: str, since: datetime, at_least: int = 1) -> None:
    """Waits until the rule's polls have charged `at_least` records dated from `since`."""
    for _ in range(200):
        await ctx.meter.flush()
        records = await ctx.usage.records({"account_id": account_id})
        if sum(1 for r in records if r.get("stream_id") and r["ts"] >= since) >= at_least:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("no poll was charged")


async def rule(api, key: str, on: bool, rule_id: str | None = None) -> str:
    if rule_id is None:
        status, body, _ = await api.call(
            "POST", "/oapi/tweet_filter/add_rule", {"tag": "s", "value": "hello", "interval_seconds": 0.3}, key=key
        )
        assert status == 200, body
        rule_id = body["rule_id"]
    change = {"rule_id": rule_id, "tag": "s", "value": "hello", "interval_seconds": 0.3, "is_effect": int(on)}
    status, body, _ = await api.call("POST", "/oapi/tweet_filter/update_rule", change, key=key)
    assert status == 200, body
    return rule_id


async def pay(api, token: str, usd: int) -> str:
    status, order, _ = await api.call(
        "POST", "/billing/crypto/checkout", {"currency": "USDTTRC20", "amount_usd": usd}, token=token
    )
    assert status == 200, order
    paid = {"order_id": order["order_id"], "amount_usd": usd, "confirmed": True}
    assert (await api.call("POST", "/billing/crypto/sandbox/pay", paid, token=token))[0] == 200
    for _ in range(100):  # crediting follows the payment's notification
        status, shown, _ = await api.call("GET", f"/billing/crypto/orders/{order['order_id']}", token=token)
        if shown["credits_applied"]:
            return order["order_id"]
        await asyncio.sleep(0.05)
    raise AssertionError("the payment was not credited")


async def statement(api, token: str, month: str, accept: str = "application/json"):
    status, body, headers = await api.call(
        "GET", f"/billing/statements/{month}", token=token, headers={"Accept": accept}
    )
    assert status == 200, body
    return body, headers


async def data_calls(api, key: str, count: int, query: str = "rust") -> None:
    for _ in range(count):
        status, body, _ = await api.call("GET", f"/social/tweet/advanced_search?query={query}", key=key)
        assert status == 200, body


@pytest.mark.settings(**CALENDAR, billing_issuer_name="Acme Data Ltd")
async def test_statements_add_up_across_a_month_end_and_match_the_ledger_and_usage(
    api, ctx, mongo, calendar, tmp_path, catalog
):
    """Top-ups, admin credits and debits, cache hits, real-time polls and MCP calls on both sides of a month's end:
    each month's opening + added - charged = closing, the closing is the next month's opening, the last closing is
    the balance the reconcile command finds, and each month's charges are what /usage shows for its days."""
    boundary = month_after(datetime.now(UTC))
    before, after = (boundary - timedelta(days=1)).strftime("%Y-%m"), boundary.strftime("%Y-%m")
    calendar.travel(boundary - timedelta(hours=1))
    user, key = await api.funded_key(200_000)  # a development top-up
    admin = await api.register()
    assert await ctx.accounts.set_admin(admin["email"], True)
    adjust = f"/admin/accounts/{user['account_id']}"
    for action, credits in (("credit", 5_000), ("debit", 1_234)):
        status, body, _ = await api.call(
            "POST", f"{adjust}/{action}", {"credits": credits, "reason": "goodwill"}, token=admin["token"]
        )
        assert status == 200, body
    order = await pay(api, user["token"], 1)
    await data_calls(api, key["key"], 3)  # one call to the provider, two answered from the cache
    rule_id = await rule(api, key["key"], on=True)
    await poll_charges(ctx, user["account_id"], boundary - timedelta(hours=1))
    await rule(api, key["key"], on=False, rule_id=rule_id)
    await settle(ctx, user["account_id"])

    calendar.travel(boundary + timedelta(minutes=1))
    await rule(api, key["key"], on=True, rule_id=rule_id)
    await poll_charges(ctx, user["account_id"], boundary)
    await rule(api, key["key"], on=False, rule_id=rule_id)
    await data_calls(api, key["key"], 2, query="go")
    call = {"name": "get_user", "arguments": {"user_name": catalog["users"][0]["userName"]}}
    mcp = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call}  # a call over MCP is usage too
    status, body, _ = await api.call("POST", "/mcp", mcp, headers={"Authorization": f"Bearer {key['key']}"})
    assert status == 200 and not body["result"].get("isError"), body
    await pay(api, user["token"], 2)
    # The last calls stay in this process's buffer: the statement so far counts them (read-your-writes).

    status, listed, _ = await api.call("GET", "/billing/statements", token=user["token"])
    assert status == 200 and listed["months"] == [
        {"month": after, "status": "so_far"},
        {"month": before, "status": "final"},
    ]
    first, _ = await statement(api, user["token"], before)
    second, _ = await statement(api, user["token"], after)
    assert first["status"] == "final" and second["status"] == "so_far"
    for s in (first, second):
        assert s["opening_balance"] + s["credits_added"] - s["credits_charged"] == s["closing_balance"]
        assert s["credits_added"] == sum(a["credits"] for a in s["additions"])
        assert s["credits_charged"] == sum(u["credits"] for u in s["usage"])
        assert s["credits_saved"] == sum(u["credits_saved"] for u in s["usage"])
        assert s["reconciled"] is True
    assert first["opening_balance"] == 0
    assert second["opening_balance"] == first["closing_balance"]
    kinds = [(a["kind"], a["credits"]) for a in first["additions"]]
    assert kinds[:3] == [("credit", 200_000), ("admin_credit", 5_000), ("admin_debit", -1_234)]
    assert kinds[3][0] == "payment" and first["additions"][3]["order_id"] == order
    assert first["additions"][3]["receipt"].startswith("R-")  # the top-up's receipt (billing/receipts.py)
    assert [a["kind"] for a in second["additions"]] == ["payment"]
    search = {u["endpoint"]: u for u in first["usage"]}["/social/tweet/advanced_search"]
    assert search["cached_calls"] == 2 and search["credits_saved"] > 0 and first["credits_saved"] > 0
    assert second["calls"] >= 4  # the polls of the new month, its two calls and one over MCP
    assert {u["endpoint"]: u["calls"] for u in second["usage"]}["/social/user/info"] == 1

    # The ledger the reconcile command reads agrees with the last closing balance, and so do the monthly figures.
    await settle(ctx, user["account_id"])
    second_settled, _ = await statement(api, user["token"], after)
    assert second_settled == second
    client = pymongo.MongoClient(mongo.uri)
    try:
        books = await asyncio.to_thread(read_books, client[ctx.settings.mongodb_db], None)
    finally:
        client.close()
    report = check(books, datetime.now(UTC))
    assert report.differences == []
    mine = next(doc for doc in books.accounts if doc["_id"] == user["account_id"])
    usage = books.usage[user["account_id"]]
    assert (
        mine["credits"] + sum(lease["amount"] - usage.get(p, 0) for p, lease in mine["leases"].items())
        == (second["closing_balance"])
    )
    assert sum(usage.values()) == first["credits_charged"] + second["credits_charged"]

    # /usage shows the same charges, day by day.
    status, rows, _ = await api.call("GET", "/usage/summary?days=365&group_by=day", token=user["token"])
    assert status == 200
    for s in (first, second):
        days = [r for r in rows if r["day"].startswith(s["month"])]
        assert sum(r["credits"] for r in days) == s["credits_charged"]
        assert sum(r["calls"] for r in days) == s["calls"]
        assert sum(r["credits_saved"] for r in days) == s["credits_saved"]

    # CSV: one row per entry, numbers a spreadsheet adds up.
    text, headers = await statement(api, user["token"], before, "text/csv")
    assert headers["Content-Type"].startswith("text/csv")
    assert f'filename="statement-{before}.csv"' in headers["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(text.decode())))
    entries = [r for r in rows if r["section"] in ("opening_balance", "credit", "usage")]
    assert sum(int(r["credits"]) for r in entries) == first["closing_balance"]
    closing = next(r for r in rows if r["section"] == "closing_balance")
    assert int(closing["credits"]) == first["closing_balance"]
    assert sum(int(r["calls"]) for r in rows if r["section"] == "usage") == first["calls"]

    # PDF: the operator at the top, the figures with thousands separators, on A4 and on Letter.
    for paper in ("A4", "LETTER"):
        data, headers = await statement(api, user["token"], f"{before}?paper={paper}", "application/pdf")
        assert headers["Content-Type"] == "application/pdf" and data.startswith(b"%PDF")
        if shutil.which("pdftotext") is None:
            pytest.skip("pdftotext missing: apt-get install -y poppler-utils")
        path = tmp_path / f"statement-{paper}.pdf"
        path.write_bytes(data)
        text = subprocess.run(["pdftotext", str(path), "-"], check=True, capture_output=True, text=True).stdout
        assert text.lstrip().startswith("Acme Data Ltd")
        for shown in (f"Statement {before}", "200,000", "-1,234", f"{first['closing_balance']:,}", "R-"):
            assert shown in text, shown


@pytest.mark.settings(plan_rules=FAST)
async def test_months_outside_the_account_are_422(api, ctx):
    user = await api.register()
    now = datetime.now(UTC)
    created = now.strftime("%Y-%m")
    later, arabic = month_after(now).strftime("%Y-%m"), "\u0662\u0660\u0662\u0666-\u0660\u0661"  # ٢٠٢٦-٠١
    for month in ("2026-13", "2026-00", "0000-01", "26-01", "2026-1", "abcd-ef", arabic, later, "2000-01"):
        status, body, _ = await api.call("GET", f"/billing/statements/{quote(month)}", token=user["token"])
        assert status == 422, (month, body)
        assert body["detail"][0]["loc"] == ["path", "month"] and body["detail"][0]["msg"]
    status, body, _ = await api.call("GET", f"/billing/statements/{created}", token=user["token"])
    assert status == 200 and body["opening_balance"] == 0 and body["closing_balance"] == 0
    status, body, _ = await api.call("GET", "/billing/statements")
    assert status == 401


@pytest.mark.settings(plan_rules=FAST, flush_interval=0.01, flush_batch=2)
async def test_the_statement_so_far_counts_each_call_once_while_batches_are_written(api, ctx):
    """Calls charged while their batches are written and the statement is read over and over: every read counts
    each call once, buffered or written (never both, never neither), and the books agree at every read."""
    user, key = await api.funded_key(100_000)
    month = datetime.now(UTC).strftime("%Y-%m")
    calls = 24
    made = asyncio.gather(*(data_calls(api, key["key"], 1, query=f"q{i}") for i in range(calls)))
    seen = []
    while not made.done() or len(seen) < 3:
        s, _ = await statement(api, user["token"], month)
        assert s["reconciled"] is True and s["credits_charged"] == sum(u["credits"] for u in s["usage"])
        seen.append(s["calls"])
        await asyncio.sleep(0)
    await made
    await settle(ctx, user["account_id"])
    final, _ = await statement(api, user["token"], month)
    assert seen == sorted(seen) and seen[-1] <= calls and final["calls"] == calls
    assert final["closing_balance"] == 100_000 - final["credits_charged"]


async def test_two_workers_each_answer_a_statement_that_agrees_with_the_ledger(mongo, upstream_url, catalog):
    """serve --workers 2: calls charged by both workers while each answers the statement so far; every answer
    agrees with the books, and once every batch is written both answer the same figures, every call counted."""
    gw = await Gateway(mongo.uri, upstream_url, f"t_{uuid.uuid4().hex[:10]}", workers=2, FLUSH_INTERVAL="0.05").launch()
    user, (secret,), auth = await account_with_keys(gw, 200_000, 1)
    month = datetime.now(UTC).strftime("%Y-%m")
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"

    async def read() -> dict:
        answer = await gw.call("GET", f"/billing/statements/{month}", **auth)
        s = orjson.loads(answer.body)
        assert answer.code == 200 and s["reconciled"] is True, s
        assert s["opening_balance"] + s["credits_added"] - s["credits_charged"] == s["closing_balance"]
        return s

    calls = await storm([(gw, secret)], path, 30)
    while not all(c.done() for c in calls):
        assert (await read())["calls"] <= 30
    spent = charged(await asyncio.gather(*calls))
    for _ in range(100):  # both workers' last batches written
        seen = [await read() for _ in range(4)]
        if all(s["calls"] == 30 for s in seen):
            break
        await asyncio.sleep(0.05)
    assert all(s == seen[0] for s in seen) and seen[0]["credits_charged"] == spent
    assert seen[0]["closing_balance"] == 200_000 - spent


async def test_a_batch_counts_once_in_the_monthly_figures_however_often_it_is_written_or_folded(ctx):
    """A flush retried after an uncertain write, and the records kept on disk written at the next start, write
    the same batch again; folds run twice at once, and one dies between moving its summary and deleting what it
    covered: the usage by month counts every batch once, and batches written later still count."""
    months = UsageMonths(ctx.usage.months.months.database)
    ts = datetime(2026, 3, 31, 23, 59, 59, tzinfo=UTC)
    record = {"account_id": "a1", "lease": "p", "endpoint": "/x.y", "credits": 7, "ts": ts, "cache": "hit", "saved": 3}
    batch = [record, {**record, "ts": ts + timedelta(seconds=2), "credits": 5}]  # across the month's end

    async def figures() -> dict:
        return {m: f for (_, m, _, _), f in merged(await months.of_account("a1")).items()}

    for _ in range(3):
        await months.add_batch("p-1", batch)
    await months.add_batch("p-2", [record])
    await months.add_batch("p-1", batch)  # an old batch once more, after a newer one
    before = await figures()
    assert before["2026-03"]["credits"] == 14 and before["2026-03"]["calls"] == 2
    assert before["2026-03"]["e"]["/x%2Ey"] == {"n": 2, "c": 14, "h": 2, "s": 6}
    assert before["2026-04"]["credits"] == 5 and before["2026-04"]["calls"] == 1
    folded = await asyncio.gather(months.fold("a1"), months.fold("a1"))  # two folds at once
    assert sum(folded) >= 3 and await figures() == before
    await months.add_batch("p-3", [record])
    await months.add_batch("p-2", [record])  # written again after its fold: its delta is covered
    # A fold that died after moving its summary: its deltas are still there, covered, and skipped.
    summary = await months.months.find_one({"_id": "a1:2026-03:p:p"})
    delta = next(d for d in deltas("p-3", [record]))
    await months.months.update_one(
        {"_id": summary["_id"]},
        {
            "$inc": {"calls": 1, "credits": 7, "e./x%2Ey.n": 1, "e./x%2Ey.c": 7, "e./x%2Ey.h": 1, "e./x%2Ey.s": 3},
            "$set": {"through": 3},
        },
    )
    after = await figures()
    assert after["2026-03"]["calls"] == 3 and after["2026-03"]["credits"] == 21
    assert await months.months.count_documents({"_id": delta["_id"]}) == 1  # left behind, not counted twice
    await months.fold("a1")
    assert await figures() == after and await months.months.count_documents({"kind": "d", "account_id": "a1"}) == 0
