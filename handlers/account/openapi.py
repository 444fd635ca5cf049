"""The account and usage area's part of the OpenAPI document: its operations (each with its least role) and
schemas, the query parameters being the very `Field` declarations handlers/account/handlers.py validates with."""

from handlers.account import handlers as account
from handlers.openapi_operations import Operation
from handlers.openapi_schema import TIME, B, I, N, S, array, body_schema, nullable, obj, query, query_param, ref
from security import roles

# A repeat answered with the first answer to its Idempotency-Key: a record of its own, 0 credits.
REPLAY_OF = nullable({"type": "string", "description": "The first call's request_id, for a replay (Idempotency-Key)"})

OPERATIONS: list[Operation] = [
    Operation("get", "/account", "Credit balance and plan", "account", ref("Account"), role=roles.VIEWER),
    Operation(
        "patch",
        "/account",
        "Name the account (what its members see it as); an empty name removes it",
        "account",
        ref("Account"),
        body="AccountRename",
        errors=(401, 403, 413, 422),
        role=roles.OWNER,
    ),
    Operation(
        "get",
        "/prices",
        "What each data endpoint costs under the running price rules (PRICE_RULES), and how long its answers stay "
        "fresh in the answer cache (CACHE_TTL); public",
        "account",
        ref("PriceSheet"),
        security=None,
        errors=(),
    ),
    Operation(
        "get",
        "/usage",
        "Per-call history, newest first",
        "account",
        array(ref("UsageRecord")),
        params=(query_param(account.DAYS), query_param(account.LIMIT)),
        errors=(401, 422),
        role=roles.VIEWER,
    ),
    Operation(
        "get",
        "/usage/summary",
        "Calls, credits, errors and the cache's savings per UTC day, endpoint and/or key (stored and buffered), "
        "newest first",
        "account",
        array(ref("UsageSummaryRow")),
        params=(
            query_param(account.PERIOD_DAYS),
            {
                "name": "group_by",
                "in": "query",
                "required": False,
                "schema": array({"enum": list(account.GROUPS)}),
                "style": "form",
                "explode": True,
                "description": "Repeat it or separate with commas to group by several; default day",
            },
        ),
        errors=(401, 422),
        role=roles.VIEWER,
    ),
    Operation(
        "get",
        "/usage/log",
        "The request log: calls filtered by key, endpoint, status, REST or MCP, time or request id, newest first, paged",
        "account",
        ref("UsageLogPage"),
        params=tuple(query_param(f) for f in account.LOG_FIELDS),
        errors=(401, 422),
        role=roles.VIEWER,
    ),
    Operation(
        "get",
        "/usage/export",
        "Every call of the period, one row each, streamed as CSV (with a header line) or JSON lines",
        "account",
        ref("UsageExportRow"),
        params=(
            query_param(account.PERIOD_DAYS),
            query("format", {"enum": list(account.FORMATS), "default": "csv"}, account.FORMAT.description),
        ),
        errors=(401, 422),
        media="text/csv",
        also=("application/x-ndjson",),
        headers={
            "Content-Disposition": {
                "schema": S,
                "description": 'attachment; filename="usage-<from>-<to>.<format>"',
            }
        },
        role=roles.VIEWER,
    ),
]

SCHEMAS: dict = {
    "PriceSheet": obj(
        ("credits_per_usd", "minimum", "cache_hit_price", "endpoints"),
        credits_per_usd=I,
        minimum={"type": "integer", "description": "Every successful call costs at least this"},
        cache_hit_price={"type": "number", "description": "Fraction of a call's price an answer from the cache costs"},
        endpoints=array(
            obj(
                ("endpoint", "available", "price", "minimum", "page_size", "full_page", "fresh_seconds"),
                endpoint={"type": "string", "description": "The data path after /social (or /twitter)"},
                available=B,
                price={"type": "string", "description": "The price rule in words: 18 per profile, 30 per call"},
                minimum={"type": "integer", "description": "Credits a successful call costs at least (an empty page)"},
                page_size=nullable({"type": "integer", "description": "A page with the defaults; null: ids sent"}),
                full_page=nullable({"type": "integer", "description": "Credits of a full page: reserved first"}),
                fresh_seconds={"type": "integer", "description": "Seconds an answer is served from the cache; 0: off"},
            )
        ),
    ),
    "AccountRename": body_schema(account.RENAME),
    "Account": obj(
        ("account_id", "credits", "plan", "qps_limit", "account_qps_limit", "max_keys"),
        account_id=S,
        name=nullable(
            {"type": "string", "description": "The name an owner gave the account (PATCH /account); null: none"}
        ),
        email={"type": "string", "description": "The email the account was registered with"},
        credits=I,
        plan=S,
        qps_limit=N,
        account_qps_limit={"type": "number", "description": "Calls per second of all the account's keys together"},
        max_keys={"type": "integer", "description": "Active keys the account may hold"},
        total_paid_usd=N,
        credits_per_usd=I,
        created_at=TIME,
    ),
    "UsageRecord": obj(
        ("endpoint", "timestamp", "credits", "status"),
        endpoint=S,
        timestamp=TIME,
        credits=I,
        status=I,
        key_id=I,
        request_id=S,
        replay_of=REPLAY_OF,
        cache=nullable(
            {
                "type": "string",
                "enum": ["hit", "miss", "coalesced", "stale"],
                "description": "How the answer cache answered the data call (X-Cache); null: not a data call's answer",
            }
        ),
        credits_saved={"type": "integer", "description": "Credits a cached answer (hit, stale) was not charged"},
        via={"type": "string", "enum": ["rest", "mcp"], "description": "How the call came: REST, or an MCP tool call"},
        tool=nullable({"type": "string", "description": "The MCP tool that made the call (via mcp)"}),
        provider=nullable(
            {
                "type": "string",
                "description": "The provider that produced the data call's answer, a cached one's too (X-Provider); "
                "null: none did",
            }
        ),
    ),
    "UsageSummaryRow": obj(
        ("calls", "credits", "errors", "from_cache", "credits_saved"),
        day={"type": "string", "format": "date", "description": "UTC day (when grouped by day)"},
        endpoint={"type": "string", "description": "Data route, e.g. /social/user/info (when grouped by endpoint)"},
        key_id={"type": "integer", "description": "When grouped by key"},
        calls=I,
        credits=I,
        errors={"type": "integer", "description": "Calls answered with a status other than 2xx"},
        from_cache={
            "type": "integer",
            "description": "Calls answered from the answer cache (X-Cache HIT, or STALE while the provider failed)",
        },
        credits_saved={"type": "integer", "description": "Credits those calls were not charged (CACHE_HIT_PRICE)"},
        p50_ms=nullable({"type": "number", "description": "group_by=endpoint alone: median provider answer time"}),
        p95_ms=nullable({"type": "number", "description": "group_by=endpoint alone: 95th percentile, ms"}),
        samples={"type": "integer", "description": "group_by=endpoint alone: forwarded calls timed"},
    ),
    "UsageLogPage": obj(
        ("records", "has_next_page", "next_cursor"),
        records=array(
            {
                "allOf": [
                    ref("UsageRecord"),
                    obj((), upstream_ms=nullable({"type": "number", "description": "Provider answer ms; null: none"})),
                ]
            }
        ),
        has_next_page=B,
        next_cursor={"type": "string", "description": "Pass as cursor for the next page; empty on the last"},
    ),
    "UsageExportRow": obj(
        ("timestamp", "key_id", "endpoint", "status", "credits", "request_id", "replay_of"),
        timestamp=TIME,
        key_id=I,
        endpoint=S,
        status=I,
        credits=I,
        request_id=S,
        replay_of=REPLAY_OF,
    ),
}
