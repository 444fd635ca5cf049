"""A monthly statement (billing/statements.py) as the API's JSON, as CSV for a spreadsheet, and as PDF
(billing/pdf.py)."""

import csv
import io

from billing.documents import customer_party, issuer_party
from billing.pdf import Column, Document, Table, render
from billing.statements import Statement

STATUS = {True: "final", False: "so far"}
CSV_HEADER = ("section", "date", "description", "endpoint", "calls", "cached_calls", "credits_saved", "credits")


def as_json(s: Statement) -> dict:
    return {
        "month": s.month,
        "status": "final" if s.final else "so_far",
        "period_start": s.start.isoformat(),
        "period_end": s.end.isoformat(),
        "opening_balance": s.opening_balance,
        "credits_added": s.credits_added,
        "credits_charged": s.credits_charged,
        "credits_saved": s.credits_saved,
        "closing_balance": s.closing_balance,
        "calls": s.calls,
        "additions": [
            {
                "at": a.at.isoformat(),
                "kind": a.kind,
                "description": a.description,
                "credits": a.credits,
                **({"order_id": a.order_id} if a.order_id else {}),
                **({"receipt": a.receipt} if a.receipt else {}),
            }
            for a in s.additions
        ],
        "usage": [
            {
                "endpoint": u.endpoint,
                "calls": u.calls,
                "credits": u.credits,
                "cached_calls": u.cached_calls,
                "credits_saved": u.credits_saved,
            }
            for u in s.usage
        ],
        "reconciled": s.reconciled,
    }


def as_csv(s: Statement) -> bytes:
    """One row per entry (the opening balance, each credit added, each endpoint's usage), then the totals: plain
    numbers without separators, credits charged as negative amounts, so that a spreadsheet's SUM of the credits
    column over the entries is the closing balance."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\r\n")
    w.writerow(CSV_HEADER)
    w.writerow(("opening_balance", s.start.date().isoformat(), "Opening balance", "", "", "", "", s.opening_balance))
    for a in s.additions:
        w.writerow(("credit", a.at.isoformat(), a.description, "", "", "", "", a.credits))
    for u in s.usage:
        w.writerow(
            ("usage", "", f"Usage: {u.endpoint}", u.endpoint, u.calls, u.cached_calls, u.credits_saved, -u.credits)
        )
    end = s.end.date().isoformat()
    w.writerow(("total", end, "Credits added", "", "", "", "", s.credits_added))
    w.writerow(("total", end, "Credits charged", "", s.calls, "", s.credits_saved, -s.credits_charged))
    w.writerow(("total", end, "Credits saved by the answer cache", "", "", "", "", s.credits_saved))
    w.writerow(("closing_balance", end, f"Closing balance ({STATUS[s.final]})", "", "", "", "", s.closing_balance))
    return out.getvalue().encode()


def as_pdf(s: Statement, issuer: dict, details: dict, paper: str) -> bytes:
    """The statement on `paper` ("A4" or "Letter") with the issuer's details (billing/receipts.py `issuer`) and the
    account's billing details as they are now (without a legal name: the account's name or email)."""
    customer = {**details, "legal_name": details.get("legal_name") or s.holder}
    rows = [(a.at.date().isoformat(), a.description, "", a.credits) for a in s.additions]
    rows += [("", f"Usage: {u.endpoint}", u.calls, -u.credits) for u in s.usage]
    notes = [
        "Amounts are in credits, the unit calls are charged in; charged usage is shown as negative amounts.",
        f"The answer cache saved {s.credits_saved:,} credits this month: calls it answered were not charged them.",
    ]
    if not s.final:
        notes.append("The current month: the statement so far, final once the month is over.")
    return render(
        Document(
            operator=issuer["name"],
            title=f"Statement {s.month}" + ("" if s.final else " (so far)"),
            parties=(issuer_party(issuer), customer_party(customer, s.account_id)),
            facts=(
                ("Period (UTC)", f"{s.start.date().isoformat()} to {s.end.date().isoformat()} (exclusive)"),
                ("Status", STATUS[s.final]),
                ("Calls", s.calls),
            ),
            table=Table(
                (
                    Column("Date", width=1.1),
                    Column("Description", width=3.4),
                    Column("Calls", amount=True),
                    Column("Credits", amount=True, width=1.3),
                ),
                rows or [("", "No credits added and no usage this month", "", 0)],
            ),
            totals=(
                ("Opening balance", s.opening_balance),
                ("Credits added", s.credits_added),
                ("Credits charged", -s.credits_charged),
                ("Closing balance", s.closing_balance),
            ),
            notes=tuple(notes),
            footer=issuer.get("footer", ""),
        ),
        paper,
    )
