"""Billing details, receipts and credit notes (docs/billing.md): a numbered receipt for every settled top-up with the
customer's details as they were, issued once however often the payment is re-read, as JSON and PDF; admin credits
marked paid; the operator's period list with totals, its CSV, and voiding by a credit note of its own series."""

import csv
import email
import email.policy
import io
import re
import shutil
import subprocess
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from support import PASSWORD, make_settings
from test_billing import checkout, pay

from security import roles

pytestmark = [
    pytest.mark.gen_test(timeout=60),
    pytest.mark.settings(
        admin_emails="boss@example.com",
        billing_issuer_name="Acme Data Ltd",
        billing_issuer_address="1 Long Road\nSometown AB1 2CD",
        billing_issuer_tax_id="GB123456789",
        billing_footer="Acme Data Ltd, registered in England no. 0123456",
    ),
]
DETAILS = {
    "legal_name": "Example GmbH",
    "address": "Hauptstraße 1\n10115 Berlin",
    "country": "DE",
    "tax_id": "DE999999999",
    "email": "accounts@example.com",
}
NUMBER = re.compile(r"R-\d{4}-\d{6}")


@pytest.fixture
def settings(request, inbox):
    """The module's settings, sending email to an SMTP server in this process (`inbox`)."""
    marker = request.node.get_closest_marker("settings")
    return make_settings(smtp_url=f"smtp://127.0.0.1:{inbox.port}", **marker.kwargs)


async def admin_token(api, ctx) -> str:
    token = (await api.register("boss@example.com"))["token"]
    assert await ctx.accounts.set_admin("boss@example.com", True)
    return token


async def join(api, token: str, role: str) -> dict:
    """A person invited into the account with `role`, signed in."""
    invited = {"email": f"m-{uuid.uuid4().hex[:8]}@example.com", "role": role}
    status, invitation, _ = await api.call("POST", "/members/invitations", invited, token=token)
    assert status == 200, invitation
    accept = {"token": invitation["token"], "password": PASSWORD}
    status, body, _ = await api.call("POST", "/auth/invitations/accept", accept)
    assert status == 200, body
    return body


async def receipts(api, token) -> list[dict]:
    status, body, _ = await api.call("GET", "/billing/receipts", token=token)
    assert status == 200, body
    return body


def pdf_text(data: bytes, tmp_path) -> str:
    path = tmp_path / "receipt.pdf"
    path.write_bytes(data)
    return subprocess.run(["pdftotext", str(path), "-"], check=True, capture_output=True, text=True).stdout


async def test_a_settled_top_up_has_one_receipt_with_the_details_of_that_moment(api, ctx, tmp_path):
    user = await api.register()
    token = user["token"]
    assert (await api.call("PUT", "/billing/details", DETAILS, token=token))[0] == 200
    order = await checkout(api, token, "USDTTRC20", 1234.5)
    await pay(api, token, order["order_id"], 1234.5)
    [receipt] = await receipts(api, token)
    assert NUMBER.fullmatch(receipt["number"]) and receipt["kind"] == "receipt"
    assert receipt["customer"] == DETAILS and receipt["issuer"]["name"] == "Acme Data Ltd"
    assert (receipt["order_id"], receipt["currency"], receipt["amount_paid"]) == (
        order["order_id"],
        "USDTTRC20",
        1234.5,
    )
    assert receipt["amount_usd"] == 1234.5 and receipt["credits"] == 123_450_000 and receipt["method"] == "crypto"
    assert receipt["payment_reference"] and receipt["void"] is None
    # Re-reading the payment (a replayed notification, the reconciler) issues nothing new.
    stored = await ctx.payments.orders.get(order["order_id"])
    await ctx.payments.refresh(stored)
    await ctx.payments.crediting.settle(stored)
    assert [r["number"] for r in await receipts(api, token)] == [receipt["number"]]
    # Details changed later: the issued receipt keeps those it was issued to.
    changed = {**DETAILS, "legal_name": "Renamed AG", "email": "new@example.com"}
    assert (await api.call("PUT", "/billing/details", changed, token=token))[1]["legal_name"] == "Renamed AG"
    status, again, _ = await api.call("GET", f"/billing/receipts/{receipt['number']}", token=token)
    assert status == 200 and again == receipt
    # As PDF: what a reader sees.
    status, data, headers = await api.call(
        "GET", f"/billing/receipts/{receipt['number']}", token=token, headers={"Accept": "application/pdf"}
    )
    assert status == 200 and headers["Content-Type"] == "application/pdf" and data.startswith(b"%PDF")
    if shutil.which("pdftotext") is None:
        pytest.skip("pdftotext missing: apt-get install -y poppler-utils")
    text = pdf_text(data, tmp_path)
    for shown in ("Acme Data Ltd", receipt["number"], "Example GmbH", "1,234.50", "123,450,000", "GB123456789"):
        assert shown in text
    assert "Renamed AG" not in text


async def test_a_receipt_is_emailed_to_the_billing_email_with_its_pdf(api, inbox):
    user = await api.register()
    assert (await api.call("PUT", "/billing/details", DETAILS, token=user["token"]))[0] == 200
    order = await checkout(api, user["token"], "USDTTRC20", 15)
    await pay(api, user["token"], order["order_id"], 15)
    [receipt] = await receipts(api, user["token"])
    [message] = await inbox.until(1)
    assert message["to"] == [DETAILS["email"]]
    mail = email.message_from_string(message["data"], policy=email.policy.default)
    assert mail["Subject"] == f"[Acme Data Ltd] Receipt {receipt['number']}"
    [attachment] = list(mail.iter_attachments())
    assert attachment.get_filename() == f"{receipt['number']}.pdf"
    assert attachment.get_content().startswith(b"%PDF")
    # Without a billing email nothing is sent.
    other = await api.register()
    order = await checkout(api, other["token"], "USDTTRC20", 15)
    await pay(api, other["token"], order["order_id"], 15)
    assert len(await receipts(api, other["token"])) == 1 and len(inbox.messages) == 1


async def test_a_crash_before_the_receipt_is_written_is_finished_once_without_a_gap(api, ctx):
    """The number is taken by writing the receipt: a failure there leaves no number used, and the order's credit
    stays pending until its receipt exists, so the reconciler issues it, once, with the next number."""
    user = await api.register()
    first = await checkout(api, user["token"], "USDTTRC20", 10)
    await pay(api, user["token"], first["order_id"], 10)
    store, insert = ctx.billing.store, ctx.billing.store.insert

    async def crash(document):
        raise ConnectionError("database went away")

    store.insert = crash
    second = await checkout(api, user["token"], "USDTTRC20", 20)
    with pytest.raises(ConnectionError):
        await ctx.payments.sandbox_pay(await ctx.payments.orders.get(second["order_id"]), 20, True)
    store.insert = insert
    assert len((await ctx.payments.orders.get(second["order_id"]))["pending"]) == 1
    assert (await api.call("GET", "/account", token=user["token"]))[1]["credits"] == 3_000_000  # credited already
    assert await ctx.payments.reconcile_once() == 1
    assert await ctx.payments.reconcile_once() == 0
    listed = await receipts(api, user["token"])
    assert [r["amount_usd"] for r in listed] == [20, 10]
    assert int(listed[0]["number"][-6:]) == int(listed[1]["number"][-6:]) + 1


async def test_receipts_are_the_accounts_own_newest_first(api):
    user, other = await api.register(), await api.register()
    for amount in (10, 20):
        order = await checkout(api, user["token"], "USDTTRC20", amount)
        await pay(api, user["token"], order["order_id"], amount)
    listed = await receipts(api, user["token"])
    assert [r["amount_usd"] for r in listed] == [20, 10] and listed[0]["number"] > listed[1]["number"]
    assert listed[0]["customer"]["legal_name"] == ""  # no details set: the account id stands in on the page
    assert await receipts(api, other["token"]) == []
    for path in (f"/billing/receipts/{listed[0]['number']}", "/billing/receipts/R-2026-999999", "/billing/receipts/x"):
        status, body, _ = await api.call("GET", path, token=other["token"])
        assert (status, body) == (404, {"detail": "Receipt not found"})


@pytest.mark.parametrize(
    "change, loc, type_",
    [
        ({"email": "not an email"}, "email", "value_error"),
        ({"legal_name": ""}, "legal_name", "string_too_short"),
        ({"legal_name": "A\x00B"}, "legal_name", "string_pattern_mismatch"),
        ({"address": "x" * 1001}, "address", "string_too_long"),
        ({"vat": "x"}, "vat", "extra_forbidden"),
    ],
)
async def test_bad_billing_details_are_422_and_change_nothing(api, change, loc, type_):
    user = await api.register()
    status, body, _ = await api.call("PUT", "/billing/details", {**DETAILS, **change}, token=user["token"])
    assert status == 422 and [(e["loc"], e["type"]) for e in body["detail"]] == [(["body", loc], type_)]
    status, shown, _ = await api.call("GET", "/billing/details", token=user["token"])
    assert status == 200 and shown["legal_name"] == "" and shown["updated_at"] is None


async def test_a_member_without_billing_rights_gets_403(api):
    owner = await api.register()
    developer = await join(api, owner["token"], roles.DEVELOPER)
    billing = await join(api, owner["token"], roles.BILLING)
    refused = {"detail": roles.refusal(roles.BILLING)}
    for method, path, body in (
        ("GET", "/billing/details", None),
        ("PUT", "/billing/details", DETAILS),
        ("GET", "/billing/receipts", None),
    ):
        assert (await api.call(method, path, body, token=developer["token"]))[:2] == (403, refused)
        assert (await api.call(method, path, body, token=billing["token"]))[0] == 200


async def test_the_operator_lists_exports_and_voids_receipts(api, ctx, tmp_path):
    admin = await admin_token(api, ctx)
    user = await api.register()
    await api.call("PUT", "/billing/details", {**DETAILS, "legal_name": "=HYPERLINK(1)"}, token=user["token"])
    order = await checkout(api, user["token"], "USDTTRC20", 50)
    await pay(api, user["token"], order["order_id"], 50)
    # An admin credit marked paid (a bank transfer) gets a receipt of the same series; an unpaid one none.
    account_id = user["account_id"]
    credit = {"credits": 2_000_000, "reason": "bank transfer", "paid_usd": 20, "payment_reference": "TRF-77"}
    status, credited, _ = await api.call("POST", f"/admin/accounts/{account_id}/credit", credit, token=admin)
    assert status == 200 and NUMBER.fullmatch(credited["receipt"])
    gift = {"credits": 5, "reason": "goodwill"}
    assert "receipt" not in (await api.call("POST", f"/admin/accounts/{account_id}/credit", gift, token=admin))[1]
    mine = await receipts(api, user["token"])
    assert [(r["method"], r["amount_usd"], r["payment_reference"]) for r in mine] == [
        ("admin", 20, "TRF-77"),
        ("crypto", 50, mine[1]["payment_reference"]),
    ]
    # The period's list with totals, every account's; a member's token is refused.
    today = datetime.now(UTC).date()
    period = f"?from={today.isoformat()}&to={(today + timedelta(days=1)).isoformat()}"
    assert (await api.call("GET", "/admin/billing/receipts" + period, token=user["token"]))[0] == 403
    status, listing, _ = await api.call("GET", "/admin/billing/receipts" + period, token=admin)
    assert status == 200
    ours = [r for r in listing["receipts"] if r["account_id"] == account_id]
    assert [r["number"] for r in ours] == [mine[1]["number"], mine[0]["number"]]
    assert listing["totals"]["receipts"] == len(listing["receipts"])
    assert listing["totals"]["usd_received"] == pytest.approx(sum(r["amount_usd"] for r in listing["receipts"]))
    status, body, headers = await api.call("GET", "/admin/billing/receipts" + period + "&format=csv", token=admin)
    assert status == 200 and headers["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(body.decode())))
    ours_csv = [row for row in rows if row["account_id"] == account_id]
    assert [row["number"] for row in ours_csv] == [r["number"] for r in ours]
    assert ours_csv[0]["legal_name"] == "'=HYPERLINK(1)" and ours_csv[0]["amount_usd"] == "50.00"
    # Void: a credit note numbered in its own series; the receipt stays, marked; a second void is refused.
    number = mine[1]["number"]
    void = f"/admin/billing/receipts/{number}/void"
    status, voided, _ = await api.call("POST", void, {"reason": "paid twice by mistake"}, token=admin)
    assert status == 200, voided
    note = voided["credit_note"]
    assert re.fullmatch(r"C-\d{4}-\d{6}", note["number"]) and note["voids"] == number
    assert voided["receipt"]["void"]["credit_note"] == note["number"]
    status, again, _ = await api.call("POST", void, {"reason": "again"}, token=admin)
    assert status == 409 and note["number"] in again["detail"]
    status, shown, _ = await api.call("GET", f"/billing/receipts/{number}", token=user["token"])
    assert shown["void"]["reason"] == "paid twice by mistake" and shown["amount_usd"] == 50
    status, shown_note, _ = await api.call("GET", f"/billing/credit-notes/{note['number']}", token=user["token"])
    assert status == 200 and shown_note["customer"] == mine[1]["customer"]
    status, listing, _ = await api.call("GET", "/admin/billing/receipts" + period, token=admin)
    assert listing["totals"]["voided"] >= 1 and note["number"] in [n["number"] for n in listing["credit_notes"]]
    if shutil.which("pdftotext") is None:
        return
    status, data, _ = await api.call(
        "GET", f"/billing/receipts/{number}", token=user["token"], headers={"Accept": "application/pdf"}
    )
    text = pdf_text(data, tmp_path)
    assert "VOID" in text and note["number"] in text
