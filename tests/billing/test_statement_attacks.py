"""Monthly statements attacked (docs/billing.md, Monthly statements): Accept headers a client may send, hostile
month strings, who may read a statement, replays and cache hits in the figures."""

import asyncio
import csv
import io
import os
import re
import signal
import subprocess
import time
import uuid
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import orjson
import pytest
import tornado.httpserver
import tornado.testing
import tornado.web
from support import FAST, PASSWORD, Gateway, account_with_keys, ledger_of, storm, use_upstream
from test_receipts import join
from test_statements import data_calls, month_after

from security import roles
from storage import clock
from storage.usage import buckets_of, totals_doc

pytestmark = [pytest.mark.gen_test(timeout=60), pytest.mark.settings(plan_rules=FAST, cache_max_bytes=8_000_000)]


@pytest.fixture
def travel(ctx):
    """The stores' clock, moved by the test, put back after it."""
    yield clock
    clock.travel(None)


async def test_the_accept_header_is_honoured_by_its_weights(api):
    """A client that prefers PDF and takes CSV only as a fallback (`q=`) gets the PDF; a type weighted 0 is one the
    client refuses (RFC 9110 12.5.1), never the one it gets."""
    user = await api.register()
    month = datetime.now(UTC).strftime("%Y-%m")
    for accept, media in (
        ("text/csv;q=0.5, application/pdf", "application/pdf"),
        ("application/pdf;q=0, text/csv", "text/csv"),
        ("text/csv;q=0, application/json", "application/json"),
        ("application/pdf; q=0.2, text/csv; q=0.9", "text/csv"),
        ("TEXT/CSV", "text/csv"),
        ("*/*", "application/json"),
        ("application/x-unknown", "application/json"),
        ("", "application/json"),
        ("text/csv;q=bogus, application/pdf", "text/csv"),  # a weight not a number: as absent
    ):
        status, _, headers = await api.call(
            "GET", f"/billing/statements/{month}", token=user["token"], headers={"Accept": accept}
        )
        assert status == 200 and headers["Content-Type"].split(";")[0] == media, (accept, headers["Content-Type"])


async def test_hostile_month_strings_are_refused(api):
    user = await api.register()
    for month in (
        "\uff12\uff10\uff12\uff16-01",  # ２０２６-01, full-width digits
        "2026-1",
        "9999-12",
        "0000-01",
        "2026-01 ",
        "2026-01\x00",
        "+2026-01",
        "2026-01" * 300,
    ):
        status, body, _ = await api.call("GET", f"/billing/statements/{quote(month)}", token=user["token"])
        assert status == 422 and body["detail"][0]["loc"] == ["path", "month"], (month, status, body)
    status, _, _ = await api.call("GET", "/billing/statements/2026-01/../", token=user["token"])
    assert status == 404


async def test_only_billing_roles_read_statements_and_only_their_own_account(api):
    owner, stranger = await api.register(), await api.register()
    developer = await join(api, owner["token"], roles.DEVELOPER)
    viewer = await join(api, owner["token"], roles.VIEWER)
    billing = await join(api, owner["token"], roles.BILLING)
    month = datetime.now(UTC).strftime("%Y-%m")
    for path in ("/billing/statements", f"/billing/statements/{month}"):
        for member in (developer, viewer):
            assert (await api.call("GET", path, token=member["token"]))[0] == 403, path
        assert (await api.call("GET", path, token=billing["token"]))[0] == 200
    _, mine, _ = await api.call("GET", f"/billing/statements/{month}", token=billing["token"])
    _, theirs, _ = await api.call("GET", f"/billing/statements/{month}", token=stranger["token"])
    _, owners, _ = await api.call("GET", f"/billing/statements/{month}", token=owner["token"])
    assert mine == owners and mine["reconciled"] is True


async def test_replays_and_cache_hits_are_counted_as_usage_shows_them(api, ctx):
    """An Idempotency-Key replayed and answers from the answer cache: the statement so far and /usage count the same
    calls, credits and credits saved; the books agree."""
    user, key = await api.funded_key(10_000)
    month = datetime.now(UTC).strftime("%Y-%m")
    path = "/social/tweet/advanced_search?query=replayed"
    for _ in range(3):
        status, _, _ = await api.call("GET", path, key=key["key"], headers={"Idempotency-Key": "same-key-1"})
        assert status == 200
    await data_calls(api, key["key"], 3, query="cached")  # one to the provider, two from the cache
    for _ in range(2):  # before and after every batch is written
        _, s, _ = await api.call("GET", f"/billing/statements/{month}", token=user["token"])
        _, rows, _ = await api.call("GET", "/usage/summary?days=31&group_by=day", token=user["token"])
        days = [r for r in rows if r["day"].startswith(month)]
        assert s["reconciled"] is True and s["closing_balance"] == 10_000 - s["credits_charged"]
        assert (s["calls"], s["credits_charged"], s["credits_saved"]) == (
            sum(r["calls"] for r in days),
            sum(r["credits"] for r in days),
            sum(r["credits_saved"] for r in days),
        )
        assert s["credits_saved"] > 0
        await ctx.meter.flush(final=True)


@pytest.mark.xfail(
    strict=True,
    reason="a month is called final as soon as it is over, but calls of that month another process still holds "
    "(its buffer, FLUSH_INTERVAL; or records kept on disk while the database was away, written at its next start) "
    "land in it later: the final statement's charges and closing balance change after it was called final",
)
async def test_a_final_statement_does_not_change_once_it_is_final(api, ctx, travel):
    """Calls of the last minutes of a month that a process had not written when the month ended (here: kept on disk
    while the database was away, written at the next start) change a statement already shown as final."""
    boundary = month_after(datetime.now(UTC))
    month = (boundary - timedelta(days=1)).strftime("%Y-%m")
    travel.travel(boundary - timedelta(minutes=1))
    user, key = await api.funded_key(10_000)
    await ctx.meter.flush(final=True)
    await data_calls(api, key["key"], 2)
    assert await ctx.meter.keep_unwritten() > 0  # the database away: the calls on local disk, not yet written
    travel.travel(boundary + timedelta(minutes=1))
    _, shown, _ = await api.call("GET", f"/billing/statements/{month}", token=user["token"])
    await ctx.meter.write_unwritten()  # the next start writes them
    _, later, _ = await api.call("GET", f"/billing/statements/{month}", token=user["token"])
    assert shown["reconciled"] is True and later["reconciled"] is True
    assert later["calls"] == shown["calls"] + 2  # what the final statement did not show
    assert shown["status"] != "final" or later == shown


class Held(tornado.web.RequestHandler):
    """An upstream that answers once the test lets it (`release`)."""

    def initialize(self, arrived: asyncio.Event, release: asyncio.Event):
        self.arrived, self.release = arrived, release

    async def get(self, path):
        self.arrived.set()
        await self.release.wait()
        self.finish(b'{"status":"success","msg":"","data":{"id":"1"}}')


async def test_a_call_in_flight_across_the_months_end_is_charged_once_and_both_months_add_up(api, ctx, travel):
    """A call sent a second before a month ends and answered after it: one month charges it, once; each month adds
    up, the closing of the first is the opening of the second, and /usage shows the same charge in the same month."""
    arrived, release = asyncio.Event(), asyncio.Event()
    sock, port = tornado.testing.bind_unused_port()
    server = tornado.httpserver.HTTPServer(
        tornado.web.Application([(r"(.*)", Held, dict(arrived=arrived, release=release))])
    )
    server.add_sockets([sock])
    use_upstream(ctx, f"http://127.0.0.1:{port}")
    boundary = month_after(datetime.now(UTC))
    months = (boundary - timedelta(days=1)).strftime("%Y-%m"), boundary.strftime("%Y-%m")
    travel.travel(boundary - timedelta(seconds=1))
    user, key = await api.funded_key(10_000)
    call = asyncio.ensure_future(api.call("GET", "/social/user/info?userName=midnight", key=key["key"]))
    await asyncio.wait_for(arrived.wait(), 10)
    travel.travel(boundary + timedelta(seconds=1))
    release.set()
    status, _, _ = await call
    assert status == 200
    server.stop()
    for _ in range(2):  # buffered, then written
        shown = [(await api.call("GET", f"/billing/statements/{m}", token=user["token"]))[1] for m in months]
        _, rows, _ = await api.call("GET", "/usage/summary?days=62&group_by=day", token=user["token"])
        for s in shown:
            assert s["reconciled"] is True
            assert s["opening_balance"] + s["credits_added"] - s["credits_charged"] == s["closing_balance"]
            assert s["credits_charged"] == sum(r["credits"] for r in rows if r["day"].startswith(s["month"]))
        assert shown[0]["closing_balance"] == shown[1]["opening_balance"]
        assert (shown[0]["calls"], shown[1]["calls"]) == (0, 1)  # the month it was answered in, as /usage
        assert shown[1]["closing_balance"] == 10_000 - sum(s["credits_charged"] for s in shown)
        await ctx.meter.flush(final=True)


async def test_nothing_a_customer_controls_reaches_the_csv_as_a_formula_or_breaks_the_pdf(api):
    """The account's name, a tool name over MCP and a query are the customer's: none becomes a spreadsheet formula
    in the CSV (every text cell that starts with = + - @ is one)."""
    user, key = await api.funded_key(10_000)
    hostile = '=HYPERLINK("http://evil","x")'
    assert (await api.call("PATCH", "/account", {"name": hostile}, token=user["token"]))[0] == 200
    mcp = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": hostile, "arguments": {}}}
    await api.call("POST", "/mcp", mcp, headers={"Authorization": f"Bearer {key['key']}"})
    await data_calls(api, key["key"], 1, query=quote(hostile))
    month = datetime.now(UTC).strftime("%Y-%m")
    _, text, _ = await api.call(
        "GET", f"/billing/statements/{month}", token=user["token"], headers={"Accept": "text/csv"}
    )
    cells = [cell for row in csv.reader(io.StringIO(text.decode())) for cell in row]
    numbers = re.compile(r"-?[0-9]+")
    assert [c for c in cells if c[:1] in ("=", "+", "-", "@") and not numbers.fullmatch(c)] == []
    # A name no font has every character of, right-to-left script, as long as a name may be: the PDF renders.
    name = "\u540d\u524d \U0001f680 \u05e9\u05dc\u05d5\u05dd " + "W" * 66
    assert (await api.call("PATCH", "/account", {"name": name}, token=user["token"]))[0] == 200
    headers = {"Accept": "application/pdf"}
    status, data, _ = await api.call("GET", f"/billing/statements/{month}", token=user["token"], headers=headers)
    assert status == 200 and data.startswith(b"%PDF")


@pytest.mark.settings(plan_rules=FAST, flush_interval=0.01, flush_batch=1)
async def test_the_same_month_read_at_once_while_reads_fold_counts_each_call_once(api, ctx):
    """One batch per call, enough deltas that every read folds them (FOLD_AT), and the month read by several
    requests at once while calls are charged: each answer adds up and agrees with the books, none counts more
    calls than were made, and once every batch is written they all show every call."""
    user, key = await api.funded_key(100_000)
    month = datetime.now(UTC).strftime("%Y-%m")
    path = f"/billing/statements/{month}"
    calls = 40
    await asyncio.gather(*(data_calls(api, key["key"], 1, query=f"f{i}") for i in range(calls // 2)))
    made = asyncio.gather(*(data_calls(api, key["key"], 1, query=f"g{i}") for i in range(calls // 2)))
    while True:
        answers = await asyncio.gather(*(api.call("GET", path, token=user["token"]) for _ in range(4)))
        for status, s, _ in answers:
            assert status == 200 and s["reconciled"] is True and s["calls"] <= calls
            assert s["opening_balance"] + s["credits_added"] - s["credits_charged"] == s["closing_balance"]
        if made.done():
            break
    await made
    await ctx.meter.flush(final=True)
    answers = await asyncio.gather(*(api.call("GET", path, token=user["token"]) for _ in range(4)))
    assert all(s == answers[0][1] for _, s, _ in answers) and answers[0][1]["calls"] == calls
    assert await ctx.usage.months.months.count_documents({"account_id": user["account_id"], "kind": "d"}) < 32


async def test_a_hostile_paper_is_refused_or_ignored_never_an_error(api):
    user = await api.register()
    month = datetime.now(UTC).strftime("%Y-%m")
    for paper in ("A4", "letter", "", "B5", "A4" * 3000, "A4\x00", "A4&paper=LETTER"):
        status, body, headers = await api.call(
            "GET",
            f"/billing/statements/{month}?paper={quote(paper, safe='&=')}",
            token=user["token"],
            headers={"Accept": "application/pdf"},
        )
        assert (
            status == 200
            and body.startswith(b"%PDF")
            or (status == 422 and body["detail"][0]["loc"] == ["query", "paper"])
        ), (paper, status, body)


async def test_an_account_started_by_an_invited_person_has_no_months_before_it_began(api, travel):
    """An invited person's sign-in, made a month earlier, becomes an account of its own (start_own_account): its
    statements begin in the month the account began, not the month the sign-in was made (those months had no
    account: an empty statement would suggest books that never were)."""
    boundary = month_after(datetime.now(UTC))
    before, began = (boundary - timedelta(days=1)).strftime("%Y-%m"), boundary.strftime("%Y-%m")
    travel.travel(boundary - timedelta(days=1))
    owner = await api.register()
    newcomer = await join(api, owner["token"], roles.DEVELOPER)
    mine = (await api.call("GET", "/auth/me", token=newcomer["token"]))[1]
    member, address = mine["member_id"], mine["email"]
    travel.travel(boundary + timedelta(days=1))
    assert (await api.call("DELETE", f"/members/{member}", token=owner["token"]))[0] == 200
    credentials = {"email": address, "password": PASSWORD, "own_account": True}
    status, session, _ = await api.call("POST", "/auth/login", credentials)
    assert status == 200, session
    status, listed, _ = await api.call("GET", "/billing/statements", token=session["token"])
    assert status == 200 and listed["months"] == [{"month": began, "status": "so_far"}]
    status, body, _ = await api.call("GET", f"/billing/statements/{before}", token=session["token"])
    assert status == 422 and body["detail"][0]["loc"] == ["path", "month"]
    status, body, _ = await api.call("GET", f"/billing/statements/{began}", token=session["token"])
    assert status == 200 and body["opening_balance"] == 0 and body["reconciled"] is True


async def test_workers_killed_holding_unwritten_calls_leave_statements_that_agree_with_usage_and_the_books(
    mongo, upstream_url, catalog
):
    """serve --workers 2, both workers killed (SIGKILL) with their full batches written and charged calls they had
    not written yet (FLUSH_INTERVAL long: only full batches are written, so no write is under way at the kill); once the restarted workers have reclaimed the dead leases, the
    month's statement agrees with the books, with /usage and with the stored usage records. (A kill between a
    batch's buckets and its monthly figures is the gap docs/billing.md names: not tested, it cannot be timed.)"""
    db_name = f"t_{uuid.uuid4().hex[:10]}"
    gw = await Gateway(
        mongo.uri, upstream_url, db_name, workers=2, FLUSH_INTERVAL="60", FLUSH_BATCH="2", LEASE_TIMEOUT="300"
    ).launch()
    user, (secret,), auth = await account_with_keys(gw, 100_000, 1)
    month = datetime.now(UTC).strftime("%Y-%m")
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    await asyncio.gather(*await storm([(gw, secret)], path, 21))
    deadline, written = time.monotonic() + 30, []
    while len(written) < 2 or written[-1] != written[-2] or written[-1] < 20:  # 21 calls: 10 full batches at least
        assert time.monotonic() < deadline, "the full batches were not written"
        await asyncio.sleep(0.2)
        written.append(len((await ledger_of(mongo.uri, db_name, user["account_id"]))[1]))
    before, _ = await ledger_of(mongo.uri, db_name, user["account_id"])
    for pid in subprocess.run(["pgrep", "-P", str(gw.proc.pid)], capture_output=True, text=True).stdout.split():
        os.kill(int(pid), signal.SIGKILL)
    dead = set(before["leases"])
    deadline = time.monotonic() + 60
    while True:  # the restarted workers reclaim their predecessors' leases
        account, records = await ledger_of(mongo.uri, db_name, user["account_id"])
        if not dead & set(account["leases"]):
            answer = await gw.call("GET", f"/billing/statements/{month}", **auth)
            if answer.code == 200:
                break
        assert time.monotonic() < deadline, "the dead leases were not reclaimed"
        await asyncio.sleep(0.2)
    s = orjson.loads(answer.body)
    rows = orjson.loads((await gw.call("GET", "/usage/summary?days=31&group_by=day", **auth)).body)
    assert s["reconciled"] is True
    assert s["credits_charged"] == sum(r["credits"] for r in records) == sum(r["credits"] for r in rows)
    assert s["calls"] == len(records) == sum(r["calls"] for r in rows)
    assert s["closing_balance"] == 100_000 - s["credits_charged"]
    assert gw.stop() == 0


@pytest.mark.xfail(
    strict=True,
    reason="the known gap with JOURNAL=off (docs/billing.md): a process killed between a batch's buckets and its "
    "monthly figures leaves those charges out of the usage by month for good; the reclaim of its lease does not "
    "complete the batch, so the statement stays `reconciled: false` and charges less than /usage (with the journal, "
    "the default, the replay completes it: tests/metering/test_journal.py)",
)
async def test_a_process_killed_between_a_batchs_writes_is_made_whole_when_its_lease_is_reclaimed(api, ctx, second):
    """This process writes a batch's buckets and totals and dies before its monthly figures (as a SIGKILL there
    leaves it); another process reclaims its lease: the statement then agrees with /usage and with the books."""
    user, key = await api.funded_key(10_000)
    await ctx.meter.flush(final=True)
    await data_calls(api, key["key"], 3, query="killed")
    seq, batch = ctx.meter.buffer.take(ctx.settings.flush_batch)
    buckets = buckets_of(f"{ctx.meter.leases.process_id}-{seq}", batch)
    await ctx.usage.buckets.insert_many(buckets)  # the batch's first two writes, then the kill
    await ctx.usage.totals.insert_many([totals_doc(b) for b in buckets])
    ctx.meter.buffer.done()
    dead = ctx.meter.leases.process_id
    for _ in range(5):  # silent since long ago (a heartbeat of its own may land in between: again)
        long_ago = {"$set": {"heartbeat_at": datetime(2000, 1, 1, tzinfo=UTC)}}
        await ctx.meter.leases.processes.update_one({"_id": dead}, long_ago)
        if await second.meter.leases.reclaim_dead(60):
            break
    else:
        raise AssertionError("the lease was not reclaimed")
    month = datetime.now(UTC).strftime("%Y-%m")
    s = await second.view.services.statements.statement(user["account_id"], month)
    rows = await ctx.usage.summary(user["account_id"], month + "-01", ("day",))
    assert s.credits_charged == sum(row[1] for row in rows.values()) and s.calls == sum(row[0] for row in rows.values())
    assert s.reconciled is True
