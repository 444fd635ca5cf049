"""Billing details and receipts (docs/billing.md): the account's details that documents are issued to, its receipts
and credit notes as JSON or, with `Accept: application/pdf`, as PDF."""

import asyncio
import unicodedata

from billing.numbering import NUMBER
from billing.receipts import view
from handlers.base import BaseHandler, authenticated
from handlers.billing.accept import PDF, negotiate
from handlers.errors import ApiError, ValidationError, error
from handlers.validation import Field, validate_body

# Bidi embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069): one reverses the rest of a line as shown,
# so "Acme\u202egnp.exe" reads "Acmeexe.png" in the admin CSV or a PDF reader. Letters carry their own direction;
# the marks LRM and RLM stay allowed.
BIDI_CONTROLS = frozenset(map(chr, (*range(0x202A, 0x202F), *range(0x2066, 0x206A))))


def _refuse(value: str, loc: list, newlines: bool) -> None:
    if any(c in BIDI_CONTROLS or (unicodedata.category(c) == "Cc" and not (newlines and c == "\n")) for c in value):
        raise ValidationError([error(loc, "Input should not contain control characters", "string_pattern_mismatch")])


def line_text(value: str, loc: list) -> None:
    # Printed on PDFs and in CSV: no control characters.
    _refuse(value, loc, newlines=False)


def multiline_text(value: str, loc: list) -> None:
    # The same, but for the newlines between an address's lines.
    _refuse(value, loc, newlines=True)


line_text.pattern = r"^[^\u0000-\u001F\u007F-\u009F\u202A-\u202E\u2066-\u2069]*$"  # the same rules, for OpenAPI
multiline_text.pattern = r"^[^\u0000-\u0009\u000B-\u001F\u007F-\u009F\u202A-\u202E\u2066-\u2069]*$"


DETAILS = [
    Field("legal_name", str, min_length=1, max_length=200, check=line_text, description="The company or person"),
    Field("address", str, required=False, max_length=1000, check=multiline_text, description="Lines separated by \\n"),
    Field("country", str, required=False, max_length=60, check=line_text),
    Field("tax_id", str, required=False, max_length=64, check=line_text, description="VAT/GST number, free text"),
    Field(
        "email",
        str,
        required=False,
        max_length=254,
        format="email",
        check=line_text,
        description="Where billing documents go",
    ),
]
RECEIPTS_LIMIT = Field("limit", int, required=False, default=100, minimum=1, maximum=1000)
PAPER = Field("paper", str, required=False, enum=("A4", "LETTER"), description="PDF only; default BILLING_PAPER")


def paper(handler: BaseHandler) -> str:
    """The paper a PDF is asked for (`?paper=A4|LETTER`, 422 otherwise), else BILLING_PAPER: as billing/pdf.py names it."""
    return {"A4": "A4", "LETTER": "Letter"}.get((handler.query_arg(PAPER) or "").upper(), handler.config.billing_paper)


async def send_document(handler: BaseHandler, doc: dict) -> None:
    """The document as JSON, or as a PDF download when the request accepts application/pdf."""
    if negotiate(handler.request.headers.get("Accept", ""), (PDF,)) != PDF:
        handler.send_json(view(doc))
        return
    billing = handler.services.billing
    data = await asyncio.get_running_loop().run_in_executor(
        handler.ctx.runtime.executor, billing.pdf, doc, paper(handler)
    )
    handler.set_header("Content-Type", PDF)
    handler.set_header("Content-Disposition", f'attachment; filename="{doc["_id"]}.pdf"')
    handler.finish(data)


class DetailsHandler(BaseHandler):
    """The account's billing details: who receipts are issued to, and where they are emailed."""

    @authenticated
    async def get(self) -> None:
        self.send_json(await self.services.billing.details(self.current_user))

    @authenticated
    async def put(self) -> None:
        body = validate_body(self.json_body(), DETAILS)
        details = await self.services.billing.put_details(self.current_user, body)
        await self.audit("billing.details_changed", details={"fields": sorted(body)})
        self.send_json(details)


class ReceiptsHandler(BaseHandler):
    """The account's receipts, newest first."""

    @authenticated
    async def get(self) -> None:
        receipts = await self.services.billing.receipts_of(self.current_user, self.query_arg(RECEIPTS_LIMIT))
        self.send_json([view(r) for r in receipts])


class DocumentHandler(BaseHandler):
    """One receipt (R-...) or credit note (C-...) of the account: JSON, or PDF with Accept: application/pdf."""

    kind = "receipt"

    @authenticated
    async def get(self, number: str) -> None:
        doc = await self.services.billing.document(number, self.current_user) if NUMBER.fullmatch(number) else None
        if doc is None or doc["kind"] != self.kind:
            raise ApiError(404, f"{self.kind.replace('_', ' ').capitalize()} not found")
        await send_document(self, doc)


class CreditNoteHandler(DocumentHandler):
    kind = "credit_note"


routes = [
    (r"/billing/details", DetailsHandler),
    (r"/billing/receipts", ReceiptsHandler),
    (r"/billing/receipts/([^/]+)", DocumentHandler),
    (r"/billing/credit-notes/([^/]+)", CreditNoteHandler),
]
