"""The account's balance, plan and name, the price sheet, and its usage history (buffered calls included): per call, summed
by day / endpoint / key, and exported as CSV or JSON lines."""

import base64
import binascii
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta

import orjson

from handlers.base import BaseHandler, authenticated, timestamp
from handlers.errors import ApiError, ValidationError, error
from handlers.validation import Field, no_controls, validate_body
from services.account import log_order
from social import prices

GROUPS = {"day": "day", "endpoint": "endpoint", "key": "key_id"}  # group_by value -> row field
EXPORT_COLUMNS = ("timestamp", "key_id", "endpoint", "status", "credits", "request_id", "replay_of")
EXPORT_CHUNK = 1000  # rows per write + flush: the period is never held in memory
FORMATS = {"csv": "text/csv; charset=utf-8", "jsonl": "application/x-ndjson"}

DAYS = Field("days", int, required=False, default=14, minimum=1, maximum=365, description="Window in days, ending now")
LIMIT = Field(
    "limit", int, required=False, default=1000, minimum=1, maximum=10_000, description="At most this many records"
)

PERIOD_DAYS = Field(
    "days", int, required=False, default=30, minimum=1, maximum=365, description="UTC days, today included"
)


def _format(value: str, loc: list) -> None:
    if value not in FORMATS:
        raise ValidationError([error(loc, "Input should be 'csv' or 'jsonl'", "enum")])


FORMAT = Field("format", str, required=False, default="csv", check=_format, description="csv or jsonl")


NAME_MAX = 80  # characters of an account's name: a header, a picker's option
# Direction overrides and marks (Trojan Source): an owner's name must not make another member's picker read as
# something it is not ("Your account" spelled backwards around other text).
BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


def _shown_name(value: str, loc: list) -> None:
    no_controls(value, loc)
    if any(c in BIDI for c in value):
        raise ValidationError([error(loc, "Input should not contain text direction marks", "string_pattern_mismatch")])


_shown_name.pattern = r"^[^\u0000-\u001F\u007F-\u009F\u061C\u200E\u200F\u202A-\u202E\u2066-\u2069]*$"  # for OpenAPI

RENAME = [
    Field(
        "name",
        str,
        max_length=NAME_MAX,
        check=_shown_name,
        description="What the account's members see it as (the portal's account picker); empty removes the name",
    )
]


class AccountHandler(BaseHandler):
    """Credit balance and plan state; an owner names the account (PATCH)."""

    @authenticated
    async def get(self) -> None:
        await self.send_account(await self.current_account())

    @authenticated
    async def patch(self) -> None:
        name = validate_body(self.json_body(), RENAME)["name"].strip() or None  # only blanks: no name
        account = await self.services.account.rename(self.current_user, name)
        if account is None:
            raise ApiError(401, "Invalid or expired token", {"WWW-Authenticate": "Bearer"})  # the account is gone
        await self.audit("account.renamed", details={"name": name})
        await self.send_account(account)

    async def send_account(self, account: dict) -> None:
        service = self.services.account
        view = await service.view(account["_id"])
        self.send_json(
            {
                "account_id": account["_id"],
                "name": account.get("name"),
                "email": account["email"],
                "credits": await service.balance(account["_id"], account),
                "plan": view.plan.name,
                "qps_limit": view.plan.qps,  # per key
                "account_qps_limit": view.plan.account_qps,  # all the account's keys together
                "max_keys": self.config.max_keys_per_account,
                "total_paid_usd": round(account.get("paid_usd", 0.0), 2),
                "credits_per_usd": self.config.credits_per_usd,
                "created_at": account["created_at"],
            }
        )


class PricesHandler(BaseHandler):
    """The price sheet of the running settings (social/prices.py): public, for reading before spending; a reload
    of the price rules shows at the next request."""

    def get(self) -> None:
        self.send_json(prices.sheet(prices.Terms.of(self.config)))


class UsageHandler(BaseHandler):
    """Per-call history, newest first."""

    @authenticated
    async def get(self) -> None:
        since = datetime.now(UTC) - timedelta(days=self.query_arg(DAYS))
        records = await self.services.account.recent(self.current_user, since, self.query_arg(LIMIT))
        self.send_json(
            [
                {
                    "endpoint": r["endpoint"],
                    "timestamp": r["ts"],
                    "credits": r["credits"],
                    "status": r["status"],
                    "key_id": r["key_id"],
                    "request_id": r["request_id"],  # the X-Request-ID of the call's answer
                    # A repeat answered with a kept answer (Idempotency-Key): the first call's request id.
                    "replay_of": r.get("replay_of"),
                    # How the answer cache answered a data call, and the credits a cached answer saved.
                    "cache": r.get("cache"),
                    "credits_saved": r.get("saved", 0),
                    "via": r.get("via", "rest"),  # rest, or mcp: a tool call of an AI agent (handlers/mcp/)
                    "tool": r.get("tool"),
                    "provider": r.get("provider"),  # the provider that produced the answer (X-Provider)
                }
                for r in records
            ]
        )


class UsageSummaryHandler(BaseHandler):
    """Calls, credits, errors and what the answer cache saved per day, endpoint and/or key over the last `days` UTC
    days, newest first."""

    @authenticated
    async def get(self) -> None:
        account_id = self.current_user
        days = self.query_arg(PERIOD_DAYS)
        names = [n.strip() for raw in self.get_query_arguments("group_by") for n in raw.split(",") if n.strip()]
        wrong = [n for n in names if n not in GROUPS]
        if wrong:
            raise ValidationError([error(["query", "group_by"], "Input should be 'day', 'endpoint' or 'key'", "enum")])
        fields = tuple(dict.fromkeys(GROUPS[n] for n in names or ["day"]))
        since_day = (datetime.now(UTC).date() - timedelta(days=days - 1)).isoformat()
        sums = await self.services.account.summary(account_id, since_day, fields)
        rows = [
            {
                **dict(zip(fields, group, strict=True)),
                "calls": n,
                "credits": c,
                "errors": x,
                "from_cache": h,  # answered from the answer cache (a hit, or stale while the provider failed)
                "credits_saved": v,  # what those calls were not charged
            }
            for group, (n, c, x, h, v) in sums.items()
        ]
        if fields == ("endpoint",):
            # Per endpoint alone: the provider's answer times too (forwarded calls; null where there were none).
            since = datetime.combine(date.fromisoformat(since_day), time.min, UTC)
            latency = await self.services.account.latency(account_id, since)
            none = {"p50_ms": None, "p95_ms": None, "samples": 0}
            rows = [{**r, **latency.get(r["endpoint"], none)} for r in rows]
        # Newest day first; within a day (or without days) the biggest spend first.
        rows.sort(key=lambda r: (r.get("day", ""), r["credits"], r["calls"]), reverse=True)
        self.send_json(rows)


def _moment(value: str, loc: list) -> None:
    try:
        if not (value.isascii() and value.isprintable()):
            raise ValueError
        datetime.fromisoformat(value)
    except ValueError:
        raise ValidationError([error(loc, "Input should be a valid ISO 8601 datetime", "datetime_parsing")]) from None


def _utc(value: str) -> datetime:
    moment = datetime.fromisoformat(value)
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


LOG_DAYS = 90  # the request log's default window, as far back as the usage view looks
LOG_SINCE = Field(
    "since", str, required=False, format="date-time", check=_moment, description=f"Default: {LOG_DAYS} days ago"
)
LOG_UNTIL = Field("until", str, required=False, format="date-time", check=_moment, description="Default: now")
LOG_KEY = Field("key_id", int, required=False, minimum=1, maximum=10**15, description="Only this key's calls")
LOG_ENDPOINT = Field("endpoint", str, required=False, max_length=200, description="Only this endpoint (/user/info)")
# The statuses a usage record can hold: the provider's answer (200, its 4xx passed through), 429 (its rate
# limit), 501 (announced, not available) and 502/503/504 (its failures); refusals before forwarding are no usage.
LOG_STATUS = Field(
    "status",
    str,
    required=False,
    enum=("2XX", "4XX", "5XX", "200", "400", "404", "429", "501", "502", "503", "504"),
    description="A status class (4xx) or one of the statuses calls are recorded with",
)
LOG_VIA = Field(
    "via", str, required=False, enum=("REST", "MCP"), description="Only REST calls, or only MCP tool calls (/mcp)"
)
LOG_REQUEST = Field("request_id", str, required=False, max_length=200, description="The call's X-Request-ID")
LOG_LIMIT = Field("limit", int, required=False, default=50, minimum=1, maximum=500, description="Records per page")
LOG_CURSOR = Field(
    "cursor", str, required=False, default="", max_length=400, description="next_cursor of the last page"
)
LOG_FIELDS = (LOG_KEY, LOG_ENDPOINT, LOG_STATUS, LOG_VIA, LOG_REQUEST, LOG_SINCE, LOG_UNTIL, LOG_LIMIT, LOG_CURSOR)


def _log_cursor(record: dict) -> str:
    moment, record_id = log_order(record)
    return base64.urlsafe_b64encode(orjson.dumps([moment.isoformat(), record_id])).decode().rstrip("=")


def _after(cursor: str) -> tuple[datetime, str] | None:
    """(ts, id) of the last record of the previous page; the next page holds what sorts after it."""
    if not cursor:
        return None
    try:
        moment, record_id = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        return _utc(moment), str(record_id)
    except (binascii.Error, ValueError, TypeError):
        raise ValidationError(
            [error(["query", "cursor"], "Invalid cursor: pass next_cursor back unchanged", "value_error")]
        ) from None


def _matcher(key_id, endpoint, status, via, request_id, after) -> Callable[[dict], bool]:
    def match(r: dict) -> bool:
        if key_id is not None and r["key_id"] != key_id:
            return False
        if endpoint and r["endpoint"] != endpoint:
            return False
        code = str(r["status"])
        if status and not (code == status or (status[1:].lower() == "xx" and code[0] == status[0])):
            return False
        if via and r.get("via", "rest") != via.lower():
            return False
        if request_id and r["request_id"] != request_id and r.get("replay_of") != request_id:
            return False
        return after is None or log_order(r) < after

    return match


def _record(r: dict) -> dict:
    return {
        "endpoint": r["endpoint"],
        "timestamp": r["ts"],
        "credits": r["credits"],
        "status": r["status"],
        "key_id": r["key_id"],
        "request_id": r["request_id"],
        "replay_of": r.get("replay_of"),
        "upstream_ms": r.get("ms"),
        # How the answer cache answered a data call (hit, miss, coalesced, stale) and what a cached answer saved.
        "cache": r.get("cache"),
        "credits_saved": r.get("saved", 0),
        "via": r.get("via", "rest"),  # rest, or mcp: a tool call of an AI agent (handlers/mcp/)
        "tool": r.get("tool"),
        "provider": r.get("provider"),  # the provider that produced the answer (X-Provider); null: none did
    }


class UsageLogHandler(BaseHandler):
    """The request log: stored and buffered calls, newest first, filtered and paged (`next_cursor`)."""

    @authenticated
    async def get(self) -> None:
        key_id, endpoint, status, via, request_id, since, until, limit, cursor = map(self.query_arg, LOG_FIELDS)
        now = datetime.now(UTC)
        since = _utc(since) if since else now - timedelta(days=LOG_DAYS)
        until = _utc(until) if until else now
        after = _after(cursor)
        match = _matcher(key_id, endpoint, status, via, request_id, after)
        if after is not None:
            until = min(until, after[0] + timedelta(milliseconds=1))  # the match does the exact cut
        # One more than asked: whether a next page exists, without a count of the whole period.
        page = await self.services.account.log(self.current_user, since, until, match, limit + 1)
        more = len(page) > limit
        page = page[:limit]
        self.send_json(
            {
                "records": [_record(r) for r in page],
                "has_next_page": more,
                "next_cursor": _log_cursor(page[-1]) if more else "",
            }
        )


def _line(fmt: str, ts: datetime, record: dict) -> bytes:
    values = (
        timestamp(ts),
        record["key_id"],
        record["endpoint"],
        record["status"],
        record["credits"],
        record["request_id"],
        record.get("replay_of"),
    )
    if fmt == "csv":  # no value can hold a comma or a quote: ids, routes and numbers
        # A request id may be a caller's X-Request-ID: never a formula in a spreadsheet (OWASP).
        ids = tuple("" if v is None else "'" + v if v.startswith("-") else v for v in values[-2:])
        return (",".join(str(v) for v in (*values[:-2], *ids)) + "\n").encode()
    return orjson.dumps(dict(zip(EXPORT_COLUMNS, values, strict=True))) + b"\n"


class UsageExportHandler(BaseHandler):
    """Every call of the last `days` days, one row each, streamed in chunks (CSV or JSON lines)."""

    @authenticated
    async def get(self) -> None:
        account_id = self.current_user
        days = self.query_arg(PERIOD_DAYS)
        fmt = self.query_arg(FORMAT)
        until = datetime.now(UTC)
        # The same UTC days as /usage/summary (today included), so an export adds up to the summary.
        since = datetime.combine(until.date() - timedelta(days=days - 1), time.min, UTC)
        self.set_header("Content-Type", FORMATS[fmt])
        name = f"usage-{since:%Y%m%d}-{until:%Y%m%d}.{fmt}"
        self.set_header("Content-Disposition", f'attachment; filename="{name}"')
        chunk = [(",".join(EXPORT_COLUMNS) + "\n").encode()] if fmt == "csv" else []
        # Stored records, then what this process has not written yet (each record exactly once).
        async for record in self.services.account.export(account_id, since, until):
            chunk.append(_line(fmt, record["ts"], record))
            if len(chunk) >= EXPORT_CHUNK:
                self.write(b"".join(chunk))
                chunk = []
                await self.flush()  # waits for the client: a slow reader slows the read, not memory
        self.finish(b"".join(chunk))


routes = [
    (r"/account", AccountHandler),
    (r"/prices", PricesHandler),
    (r"/usage", UsageHandler),
    (r"/usage/summary", UsageSummaryHandler),
    (r"/usage/export", UsageExportHandler),
    (r"/usage/log", UsageLogHandler),
]
