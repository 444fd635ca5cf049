"""The audit log, read: an account's own entries (GET /audit), every account's for admins (GET /admin/audit),
filtered by action and time, paged newest first, and exported whole as CSV or JSON (…/export).
Entries are written by the handlers that act, through BaseHandler.audit (storage/audit.py)."""

import csv
import io
from collections.abc import Callable
from datetime import UTC, datetime

import orjson

from handlers.base import BaseHandler, admin_only, authenticated, dumps, timestamp
from handlers.errors import ValidationError, error
from handlers.validation import Field
from security.spreadsheet import cell
from services.audit import ACTIONS, ACTOR_KINDS, cursor_id

EXPORT_CHUNK = 500  # entries per write + flush: an export is never held in memory
CSV_COLUMNS = (
    "at",
    "action",
    "account_id",
    "actor_kind",
    "actor_id",
    "actor_email",
    "address",
    "details",
    "actor_member_id",
)
EXPORT_TYPES = {"csv": "text/csv; charset=utf-8", "json": "application/json"}


def _actions(value: str, loc: list) -> None:
    unknown = [a for a in value.split(",") if a.strip() not in ACTIONS]
    if unknown:
        raise ValidationError([error(loc, f"Unknown action {unknown[0]!r}; one of {', '.join(ACTIONS)}", "enum")])


def _time(value: str, loc: list) -> None:
    try:
        datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValidationError([error(loc, "Input should be an ISO 8601 date or time", "datetime_parsing")]) from None


def _cursor(value: str, loc: list) -> None:
    if cursor_id(value) is None:
        raise ValidationError([error(loc, "Invalid cursor: pass next_cursor back unchanged", "value_error")])


def _one_of(choices: tuple) -> Callable:
    def check(value: str, loc: list) -> None:
        if value not in choices:
            raise ValidationError([error(loc, f"Input should be one of {', '.join(choices)}", "enum")])

    return check


ACTION = Field(
    "action", str, required=False, max_length=400, check=_actions, description="Comma-separated actions to show"
)
SINCE = Field("since", str, required=False, max_length=40, check=_time, description="Entries at or after (ISO 8601)")
UNTIL = Field("until", str, required=False, max_length=40, check=_time, description="Entries at or before (ISO 8601)")
CURSOR = Field("cursor", str, required=False, max_length=40, check=_cursor, description="next_cursor of the last page")
LIMIT = Field("limit", int, required=False, default=50, minimum=1, maximum=200, description="Entries per page")
EXPORT_FORMAT = Field(
    "format", str, required=False, default="csv", check=_one_of(tuple(EXPORT_TYPES)), description="csv or json"
)
ACCOUNT = Field("account_id", str, required=False, min_length=1, max_length=64, description="One account's entries")
ACTOR = Field(
    "actor", str, required=False, check=_one_of(ACTOR_KINDS), description="Entries by account, admin or system"
)
MEMBER = Field(
    "member", str, required=False, min_length=1, max_length=64, description="One member's entries (member_id)"
)
LIST_QUERY = [ACTION, SINCE, UNTIL, MEMBER, CURSOR, LIMIT]
EXPORT_QUERY = [ACTION, SINCE, UNTIL, MEMBER, EXPORT_FORMAT]
ADMIN_QUERY = [ACCOUNT, ACTOR]


def _moment(raw: str | None) -> datetime | None:
    if raw is None:
        return None
    moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def entry(doc: dict) -> dict:
    return {
        "id": str(doc["_id"]),
        "at": doc["at"],
        "action": doc["action"],
        "account_id": doc["account_id"],
        "actor": doc["actor"],
        "address": doc.get("address"),
        "details": doc.get("details") or {},
    }


def _csv_line(doc: dict) -> bytes:
    actor = doc["actor"]
    row = (
        timestamp(doc["at"]),
        doc["action"],
        doc["account_id"],
        actor.get("kind"),
        actor.get("id"),
        actor.get("email"),
        doc.get("address"),
        orjson.dumps(doc.get("details") or {}).decode(),
        actor.get("member_id"),
    )
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerow([cell(v) for v in row])
    return out.getvalue().encode()


class AuditBase(BaseHandler):
    admin_view = False

    def filters(self, account_id: str | None) -> dict:
        raw = self.query_arg(ACTION)
        actions = tuple(a.strip() for a in raw.split(",")) if raw else ()
        actor = None
        if self.admin_view:
            account_id, actor = self.query_arg(ACCOUNT), self.query_arg(ACTOR)
        return self.services.audit.query(
            account_id,
            actions,
            _moment(self.query_arg(SINCE)),
            _moment(self.query_arg(UNTIL)),
            actor,
            self.query_arg(MEMBER),
        )

    async def list(self, account_id: str | None) -> None:
        query = self.filters(account_id)
        rows, more = await self.services.audit.page(query, cursor_id(self.query_arg(CURSOR)), self.query_arg(LIMIT))
        self.send_json(
            {
                "entries": [entry(r) for r in rows],
                "next_cursor": str(more) if more else None,
                "retention_days": self.config.audit_retention_days,
            }
        )

    async def export(self, account_id: str | None) -> None:
        query = self.filters(account_id)
        fmt = self.query_arg(EXPORT_FORMAT)
        self.set_header("Content-Type", EXPORT_TYPES[fmt])
        self.set_header("Content-Disposition", f'attachment; filename="audit-{datetime.now(UTC):%Y%m%d}.{fmt}"')
        chunk = [(",".join(CSV_COLUMNS) + "\n").encode()] if fmt == "csv" else [b"["]
        first = True
        async for doc in self.services.audit.stream(query):
            if fmt == "csv":
                chunk.append(_csv_line(doc))
            else:
                chunk.append((b"" if first else b",") + dumps(entry(doc)))
            first = False
            if len(chunk) >= EXPORT_CHUNK:
                self.write(b"".join(chunk))
                chunk = []
                await self.flush()  # waits for the client: a slow reader slows the read, not memory
        if fmt == "json":
            chunk.append(b"]")
        self.finish(b"".join(chunk))


class AuditHandler(AuditBase):
    """The account's own entries, newest first."""

    @authenticated
    async def get(self) -> None:
        await self.list(self.current_user)


class AuditExportHandler(AuditBase):
    """The account's own entries, every page, as CSV or a JSON array."""

    @authenticated
    async def get(self) -> None:
        await self.export(self.current_user)


class AdminAuditHandler(AuditBase):
    """Every account's entries (admins), with account and actor filters besides."""

    admin_view = True

    @admin_only
    async def get(self) -> None:
        await self.list(None)


class AdminAuditExportHandler(AuditBase):
    admin_view = True

    @admin_only
    async def get(self) -> None:
        await self.export(None)


routes = [
    (r"/audit", AuditHandler),
    (r"/audit/export", AuditExportHandler),
    (r"/admin/audit", AdminAuditHandler),
    (r"/admin/audit/export", AdminAuditExportHandler),
]
