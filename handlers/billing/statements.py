"""Monthly statements (billing/statements.py): the account's months, and one month as JSON, CSV or PDF by the
request's Accept header."""

import asyncio

from billing.statement_documents import as_csv, as_json, as_pdf
from billing.statements import BadMonth
from handlers.base import BaseHandler, authenticated
from handlers.billing.documents import PAPER
from handlers.errors import ValidationError, error

PDF, CSV, JSON = "application/pdf", "text/csv", "application/json"


def weight(params: list[str]) -> float:
    """A media range's `q` (RFC 9110 12.4.2): 1 when absent; one that is not a number counts as absent."""
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            try:
                return min(max(float(value), 0.0), 1.0)
            except ValueError:
                return 1.0
    return 1.0


def wanted(accept: str) -> str:
    """The media type a request's Accept header asks for: of PDF, CSV and JSON named in it, the one with the highest
    weight (the first named on a tie); a type weighted 0 is refused, never chosen. JSON otherwise (`*/*`, an
    unknown type, no header)."""
    best, best_q = JSON, 0.0
    for part in accept.split(","):
        media, *params = part.split(";")
        media, q = media.strip().lower(), weight(params)
        if media in (PDF, CSV, JSON) and q > best_q:
            best, best_q = media, q
    return best


class StatementsHandler(BaseHandler):
    """The account's months with a statement, newest first; the current one is the statement so far."""

    @authenticated
    async def get(self) -> None:
        months = await self.services.statements.available(self.current_user)
        self.send_json(
            {"months": [{"month": m, "status": "so_far" if i == 0 else "final"} for i, m in enumerate(months)]}
        )


class StatementHandler(BaseHandler):
    """One month's statement; `Accept: application/pdf` or `text/csv` for the documents."""

    @authenticated
    async def get(self, month: str) -> None:
        paper = {"A4": "A4", "LETTER": "Letter"}.get((self.query_arg(PAPER) or "").upper(), self.config.billing_paper)
        try:
            statement = await self.services.statements.statement(self.current_user, month)
        except BadMonth as exc:
            raise ValidationError([error(["path", "month"], str(exc), "value_error")]) from None
        media = wanted(self.request.headers.get("Accept", ""))
        if media == JSON:
            self.send_json(as_json(statement))
            return
        name = f"statement-{statement.month}"
        if media == CSV:
            body, name = as_csv(statement), name + ".csv"
        else:
            billing = self.services.billing
            details, issuer = await billing.details(self.current_user), billing.issuer()
            # fpdf2 is pure Python: rendered on the event loop, it would hold every other request meanwhile.
            body = await asyncio.get_running_loop().run_in_executor(
                self.ctx.runtime.executor, as_pdf, statement, issuer, details, paper
            )
            name += ".pdf"
        self.set_header("Content-Type", CSV + "; charset=utf-8" if media == CSV else PDF)
        self.set_header("Content-Disposition", f'attachment; filename="{name}"')
        self.finish(body)


routes = [
    (r"/billing/statements", StatementsHandler),
    (r"/billing/statements/([^/]+)", StatementHandler),
]
