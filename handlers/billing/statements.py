"""Monthly statements (billing/statements.py): the account's months, and one month as JSON, CSV or PDF by the
request's Accept header."""

import asyncio

from billing.statement_documents import as_csv, as_json, as_pdf
from billing.statements import BadMonth
from handlers.base import BaseHandler, authenticated
from handlers.billing.accept import CSV, JSON, PDF, negotiate
from handlers.billing.documents import paper
from handlers.errors import ValidationError, error


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
        size = paper(self)  # checked first: a bad one is 422 whatever the Accept header asks for
        try:
            statement = await self.services.statements.statement(self.current_user, month)
        except BadMonth as exc:
            raise ValidationError([error(["path", "month"], str(exc), "value_error")]) from None
        media = negotiate(self.request.headers.get("Accept", ""), (PDF, CSV))
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
                self.ctx.runtime.executor, as_pdf, statement, issuer, details, size
            )
            name += ".pdf"
        self.set_header("Content-Type", CSV + "; charset=utf-8" if media == CSV else PDF)
        self.set_header("Content-Disposition", f'attachment; filename="{name}"')
        self.finish(body)


routes = [
    (r"/billing/statements", StatementsHandler),
    (r"/billing/statements/([^/]+)", StatementHandler),
]
