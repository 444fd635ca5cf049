"""ctx.billing: the customer's billing details, a receipt for every settled payment, credit notes that void one, and
the operator's lists and CSV of them (docs/billing.md).

A receipt is issued when a payment's credits reach the account (`payment_credited`, called by the crediting path
for each credit of an order, app/context.py), or for an admin credit marked as paid (`admin_paid`). Its source is
the credit's id: a re-delivered notification, a retry or another process issues nothing new. The order's credit
stays pending until its receipt exists (payments/crediting.py settles it only after `credit` returns), so a crash
between crediting and issuing is finished by the next notification or the reconciler. Everything a receipt shows
is copied into it when issued (the customer's details, the issuer's, the footer): later edits never change it.
"""

import asyncio
import csv
import io
import logging
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal

from billing import documents
from billing.numbering import CREDIT_NOTE, RECEIPT, Numbering
from billing.pdf import render
from payments.service import Payments
from runtime.state import State
from security.spreadsheet import cell
from storage.billing import DETAILS, BillingStore
from storage.clock import now_utc
from webhooks.mail import Mailer

log = logging.getLogger("gateway.billing")
_pending: set[asyncio.Task] = set()  # receipt emails under way (a task nobody holds may be collected mid-way)
CSV_COLUMNS = (
    "number",
    "issued_at",
    "account_id",
    "legal_name",
    "country",
    "tax_id",
    "method",
    "order_id",
    "amount_usd",
    "currency",
    "amount_paid",
    "payment_reference",
    "credits",
    "voided_by",
    "void_reason",
)


class AlreadyVoid(Exception):
    """The receipt was voided before: its credit note is `args[0]`."""


def view(doc: dict) -> dict:
    """A receipt or credit note as its account (and the admin console) reads it."""
    out = {
        "number": doc["_id"],
        "kind": doc["kind"],
        "issued_at": doc["issued_at"],
        "account_id": doc["account_id"],
        "issuer": doc["issuer"],
        "customer": doc["customer"],
        "amount_usd": doc["amount_usd"],
        "credits": doc["credits"],
    }
    if doc["kind"] == "receipt":
        payment = doc["payment"]
        out.update(
            method=payment["method"],
            order_id=payment.get("order_id"),
            currency=payment.get("currency"),
            amount_paid=payment.get("amount_paid"),
            payment_reference=payment.get("reference"),
            void=doc.get("void"),
        )
    else:
        out.update(voids=doc["voids"], reason=doc["reason"])
    return out


class Billing:
    def __init__(self, state: State, store: BillingStore, payments: Payments, mailer: Mailer | None):
        self.state, self.store, self.payments, self.mailer = state, store, payments, mailer
        self.numbering = Numbering(store)

    # --- billing details --------------------------------------------------------------------------------
    async def details(self, account_id: str) -> dict:
        doc = await self.store.details(account_id) or {}
        return {**{name: doc.get(name, "") for name in DETAILS}, "updated_at": doc.get("updated_at")}

    async def put_details(self, account_id: str, fields: dict) -> dict:
        doc = await self.store.put_details(account_id, fields, now_utc())
        return {**{name: doc.get(name, "") for name in DETAILS}, "updated_at": doc["updated_at"]}

    # --- issuing ----------------------------------------------------------------------------------------
    def issuer(self) -> dict:
        settings = self.state.settings
        address = settings.billing_issuer_address.replace("\\n", "\n")
        return {
            "name": settings.billing_issuer_name,
            "address": address,
            "tax_id": settings.billing_issuer_tax_id,
            "footer": settings.billing_footer,
        }

    async def _receipt(self, account_id: str, source: str, credits: int, usd: float | Decimal, payment: dict) -> dict:
        contents = {
            "kind": "receipt",
            "account_id": account_id,
            "issuer": self.issuer(),
            "customer": {name: value for name, value in (await self.details(account_id)).items() if name in DETAILS},
            "payment": payment,
            "amount_usd": float(_cents(Decimal(str(usd)))),
            "credits": credits,
        }
        receipt, new = await self.numbering.issue(RECEIPT, source, contents, now_utc())
        if new:
            log.info("receipt %s issued for %s (account %s)", receipt["_id"], source, account_id)
            self.email(receipt)
        return receipt

    async def payment_credited(self, account_id: str, credit_id: str, credits: int, usd: float) -> dict:
        """The receipt of one credit of a crypto order ("ord_...:<total credits>"): issued once, whoever asks."""
        order_id = credit_id.split(":", 1)[0]
        order = await self.payments.orders.get(order_id) or {}
        step = next((c for c in order.get("pending", []) if c["credit_id"] == credit_id), {})
        payment = {
            "method": "crypto",
            "order_id": order_id,
            "currency": order.get("currency"),
            # Orders from before receipts carry no `paid` per credit: then the whole confirmed amount.
            "amount_paid": step.get("paid", order.get("confirmed_paid")),
            "reference": order.get("payment_id"),
        }
        return await self._receipt(
            account_id, f"credit:{credit_id}", credits, self._part_usd(credit_id, credits, usd), payment
        )

    def _part_usd(self, credit_id: str, credits: int, usd: float) -> Decimal:
        """A part's USD as the order's total in cents after it less that before it: each part rounded alone would
        let the cents pile up (three parts of 48.00 USD said 48.01), this way the parts' receipts add up to what
        was paid in all. The credit id names the order's total credits after the part (payments/crediting.py)."""
        total = credit_id.rsplit(":", 1)[-1]
        if not total.isdigit():
            return usd
        per_usd = Decimal(self.state.settings.credits_per_usd)
        after = int(total)
        return _cents(Decimal(after) / per_usd) - _cents(Decimal(after - credits) / per_usd)

    async def admin_paid(self, account_id: str, credit_id: str, credits: int, usd: float, reference: str) -> dict:
        """The receipt of an admin credit the operator marked as paid (a bank transfer, an invoice paid)."""
        payment = {"method": "admin", "currency": "USD", "amount_paid": usd, "reference": reference or None}
        return await self._receipt(account_id, f"credit:{credit_id}", credits, usd, payment)

    def email(self, doc: dict) -> None:
        """The document to the account's billing email, after the answer; none without SMTP_URL or an email."""
        to = doc["customer"].get("email")
        if self.mailer is None or not to:
            return
        mailer, paper = self.mailer, self.state.settings.billing_paper
        name = "Receipt" if doc["kind"] == "receipt" else "Credit note"

        async def send() -> None:
            try:
                data = await asyncio.to_thread(self.pdf, doc, paper)
                text = documents.email_text(doc)
                subject = f"[{doc['issuer']['name']}] {name} {doc['_id']}"
                await mailer.send(to, subject, text, ((f"{doc['_id']}.pdf", data),))
            except Exception as exc:  # after the document is issued: nobody to tell but the log
                log.warning("%s %s not emailed: %s", name.lower(), doc["_id"], type(exc).__name__)

        task = asyncio.create_task(send())
        _pending.add(task)
        task.add_done_callback(_pending.discard)

    # --- reading ----------------------------------------------------------------------------------------
    async def receipts_of(self, account_id: str, limit: int) -> list[dict]:
        return await self.store.of_account(account_id, RECEIPT, limit)

    async def document(self, number: str, account_id: str | None = None) -> dict | None:
        """A receipt or credit note; with `account_id`, only that account's."""
        return await self.store.get(number, account_id)

    def pdf(self, doc: dict, paper: str) -> bytes:
        """The document as PDF (CPU: call it off the event loop)."""
        return render(documents.document(doc), paper)

    # --- the operator's side ----------------------------------------------------------------------------
    async def void(self, number: str, reason: str) -> tuple[dict, dict]:
        """A credit note for the receipt, numbered in its own series; the receipt stays and shows it. Voiding
        twice gives the first credit note (its source is the receipt); LookupError for no such receipt."""
        receipt = await self.store.get(number)
        if receipt is None or receipt["kind"] != "receipt":
            raise LookupError(number)
        contents = {
            "kind": "credit_note",
            "account_id": receipt["account_id"],
            "issuer": self.issuer(),
            "customer": receipt["customer"],
            "voids": number,
            "reason": reason,
            "amount_usd": receipt["amount_usd"],
            "credits": receipt["credits"],
        }
        note, new = await self.numbering.issue(CREDIT_NOTE, f"void:{number}", contents, now_utc())
        void = {"credit_note": note["_id"], "reason": note["reason"], "voided_at": note["issued_at"]}
        receipt = await self.store.mark_void(number, void)  # also on a retry after a crash between the two
        if not new:
            raise AlreadyVoid(note)
        self.email(note)
        return receipt, note

    async def period(self, start: datetime, end: datetime) -> dict:
        """Every receipt issued in [start, end) with its totals; voided ones listed and counted apart."""
        receipts = await self.store.issued_between(RECEIPT, start, end)
        notes = await self.store.issued_between(CREDIT_NOTE, start, end)
        valid = [r for r in receipts if not r.get("void")]
        return {
            "from": start,
            "to": end,
            "receipts": [view(r) for r in receipts],
            "credit_notes": [view(n) for n in notes],
            "totals": {
                "receipts": len(receipts),
                "usd_received": _usd(r["amount_usd"] for r in valid),
                "credits_issued": sum(r["credits"] for r in valid),
                "voided": len(receipts) - len(valid),
                "usd_voided": _usd(r["amount_usd"] for r in receipts if r.get("void")),
            },
        }

    @staticmethod
    def csv(listing: dict) -> str:
        """The period's receipts, one line each, for an accountant's spreadsheet."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\r\n")
        writer.writerow(CSV_COLUMNS)
        for r in listing["receipts"]:
            customer, void = r["customer"], r.get("void") or {}
            writer.writerow(
                [
                    cell(value)
                    for value in (
                        r["number"],
                        r["issued_at"].isoformat(),
                        r["account_id"],
                        customer.get("legal_name", ""),
                        customer.get("country", ""),
                        customer.get("tax_id", ""),
                        r["method"],
                        r.get("order_id") or "",
                        f"{r['amount_usd']:.2f}",
                        r.get("currency") or "",
                        "" if r.get("amount_paid") is None else f"{r['amount_paid']}",
                        r.get("payment_reference") or "",
                        r["credits"],
                        void.get("credit_note", ""),
                        void.get("reason", ""),
                    )
                ]
            )
        return out.getvalue()


def _cents(value: Decimal) -> Decimal:
    return value.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)


def _usd(values) -> float:
    return float(sum((Decimal(str(v)) for v in values), Decimal(0)))
