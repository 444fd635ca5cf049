"""The admin console's billing documents: every account's receipts of a period with their totals (JSON or CSV for the
accountant), one receipt or credit note, and voiding a receipt with a reason, which issues a credit note numbered in
its own series (docs/billing.md). Admins only; a void writes the audit log."""

from datetime import UTC, date, datetime, time, timedelta

from billing.numbering import NUMBER
from billing.receipts import AlreadyVoid, view
from handlers.admin.accounts import REASON
from handlers.base import BaseHandler, admin_only
from handlers.billing.documents import line_text, send_document
from handlers.errors import ApiError, ValidationError, error
from handlers.validation import Field, validate_body


def _date(value: str, loc: list) -> None:
    try:
        date.fromisoformat(value)
    except ValueError:
        raise ValidationError(
            [error(loc, "Input should be a valid date (YYYY-MM-DD)", "date_from_datetime_parsing")]
        ) from None


FROM = Field(
    "from", str, required=False, format="date", check=_date, description="First day (UTC); default: this month's"
)
TO = Field(
    "to", str, required=False, format="date", check=_date, description="Day after the last; default: next month's first"
)
FORMAT = Field("format", str, required=False, default="JSON", enum=("JSON", "CSV"), description="csv: a spreadsheet")


def _reason(value: str, loc: list) -> None:
    # Printed on the credit note and the receipt, and a cell of the accountant's CSV: one line, no controls.
    REASON.check(value, loc)
    line_text(value, loc)


_reason.pattern = line_text.pattern
VOID = [Field("reason", str, min_length=3, max_length=500, check=_reason, description=REASON.description)]


def _day(value: str) -> datetime:
    return datetime.combine(date.fromisoformat(value), time.min, UTC)


class ReceiptsHandler(BaseHandler):
    """Every account's receipts issued in [from, to), with totals (USD received, credits issued)."""

    @admin_only
    async def get(self) -> None:
        now = datetime.now(UTC)
        month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        start = _day(self.query_arg(FROM)) if self.query_arg(FROM) else month
        end = _day(self.query_arg(TO)) if self.query_arg(TO) else (month + timedelta(days=32)).replace(day=1)
        listing = await self.services.billing.period(start, end)
        if self.query_arg(FORMAT).lower() == "csv":
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            name = f"receipts-{start.date().isoformat()}-{end.date().isoformat()}.csv"
            self.set_header("Content-Disposition", f'attachment; filename="{name}"')
            self.finish(self.services.billing.csv(listing).encode())
            return
        self.send_json(listing)


class DocumentHandler(BaseHandler):
    """Any account's receipt or credit note: JSON, or PDF with Accept: application/pdf."""

    @admin_only
    async def get(self, number: str) -> None:
        doc = await self.services.billing.document(number) if NUMBER.fullmatch(number) else None
        if doc is None:
            raise ApiError(404, "Document not found")
        await send_document(self, doc)


class VoidHandler(BaseHandler):
    """Voids a receipt with a reason: a credit note with its own number; the receipt stays and shows it."""

    @admin_only
    async def post(self, number: str) -> None:
        body = validate_body(self.json_body(), VOID)
        if not NUMBER.fullmatch(number) or not number.startswith("R-"):
            raise ApiError(404, "Receipt not found")
        try:
            receipt, note = await self.services.billing.void(number, body["reason"].strip())
        except LookupError:
            raise ApiError(404, "Receipt not found") from None
        except AlreadyVoid as exc:
            raise ApiError(409, f"Receipt {number} was voided before, by credit note {exc.args[0]['_id']}") from None
        details = {"receipt": number, "credit_note": note["_id"], "reason": note["reason"]}
        await self.audit("receipt.voided", account_id=receipt["account_id"], details=details, admin=True)
        self.send_json({"receipt": view(receipt), "credit_note": view(note)})


routes = [
    (r"/admin/billing/receipts", ReceiptsHandler),
    (r"/admin/billing/documents/([^/]+)", DocumentHandler),
    (r"/admin/billing/receipts/([^/]+)/void", VoidHandler),
]
