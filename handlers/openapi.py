"""The OpenAPI 3.1.0 document, built from tables.

Data paths come from social.endpoints.ENDPOINTS, the table the data plane runs on;
every other path is one `Operation` in OPERATIONS below, whose request bodies and
query parameters are the very `Field` declarations its handler validates with. A new
route needs its Operation here: tests/test_ops.py compares the document with the
application's route table in both directions.
"""

import functools
from dataclasses import dataclass, field

import orjson

from handlers import account, admin, auth, billing, keys
from handlers.validation import INT_MAX, Field
from social.endpoints import (
    BY_PATH,
    CURSOR_MAX,
    CURSOR_PATTERN,
    ENDPOINTS,
    GROUPS,
    NOT_BLANK,
    STRING_MAX,
    Endpoint,
    Param,
    ids_pattern,
)

VERSION = "0.1.0"


def ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


def array(items: dict) -> dict:
    return {"type": "array", "items": items}


def obj(required: tuple = (), closed: bool = False, **properties) -> dict:
    schema = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    return schema


S, I, N, B = {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}
TIME = {"type": "string", "format": "date-time"}


def query(name: str, schema: dict, description: str = "", required: bool = False) -> dict:
    return {"name": name, "in": "query", "required": required, "schema": schema, "description": description}


_KINDS = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array"}
_KEYWORDS = (
    ("minimum", "minimum"),
    ("exclusive_minimum", "exclusiveMinimum"),
    ("maximum", "maximum"),
    ("min_length", "minLength"),
    ("max_length", "maxLength"),
    ("format", "format"),
    ("default", "default"),
)


def field_schema(f: Field) -> dict:
    """The JSON Schema of one declared field: its type and every limit the validator applies."""
    schema = {"type": _KINDS[f.kind]}
    if f.enum:
        schema["enum"] = list(f.enum)
    schema.update({keyword: getattr(f, name) for name, keyword in _KEYWORDS if getattr(f, name) is not None})
    return schema


def body_schema(fields: list[Field]) -> dict:
    """A closed object; an optional property may also be null (the validator reads null as absent)."""
    properties = {}
    for f in fields:
        schema = field_schema(f) | ({"description": f.description} if f.description else {})
        properties[f.name] = schema if f.required else nullable(schema)
    return obj(tuple(f.name for f in fields if f.required), True, **properties)


def with_properties(schema: dict, **properties) -> dict:
    schema["properties"].update(properties)
    return schema


def query_param(f: Field) -> dict:
    return query(f.name, field_schema(f), f.description, f.required)


def path_param(name: str, schema: dict, description: str = "") -> dict:
    return {"name": name, "in": "path", "required": True, "schema": schema, "description": description}


@dataclass(frozen=True)
class Operation:
    method: str  # get | post
    path: str  # OpenAPI template: /keys/{key_id}/reveal
    summary: str
    tag: str
    response: dict  # schema of the success body
    status: int = 200
    security: str | None = "bearer"  # bearer | metrics | None (public)
    params: tuple = ()
    body: str | None = None  # a components schema name
    body_required: bool = True
    errors: tuple = (401,)
    media: str = "application/json"
    also: tuple = ()  # further media types of the success body, same schema
    headers: dict = field(default_factory=dict)  # headers of the success answer
    extra: dict = field(default_factory=dict)  # further responses: status -> response object


KEY_PROPERTIES = {
    "expires_at": nullable(
        {
            "type": "string",
            "format": "date-time",
            "description": "ISO 8601, in the future; from then on the key gets 401 'This API key has expired'",
        }
    ),
    "allowed_endpoints": nullable(
        {
            "type": "array",
            "minItems": 1,
            "maxItems": keys.MAX_ENDPOINTS,
            "items": {"enum": sorted(BY_PATH) + list(GROUPS)},
            "description": "Data paths as written after /social (they cover the /twitter aliases too) or groups: "
            + "; ".join(f"{name} = {', '.join(sorted(paths))}" for name, paths in GROUPS.items())
            + ". Other endpoints get 403 'This API key may not call this endpoint'",
        }
    ),
    "allowed_ips": nullable(
        {
            "type": "array",
            "minItems": 1,
            "maxItems": keys.MAX_IPS,
            "items": {"type": "string", "maxLength": keys.MAX_IP_TEXT},
            "description": "IPv4/IPv6 addresses or CIDR networks (stored normalised); calls from elsewhere get "
            "403 'This API key is not allowed from this address'. The address honours TRUSTED_PROXIES",
        }
    ),
    "credit_limit": nullable(
        {
            "type": "integer",
            "minimum": 1,
            "maximum": keys.MAX_CREDIT_LIMIT,
            "description": "Credits the key may spend per credit_limit_period (needs it); then 402",
        }
    ),
    "credit_limit_period": nullable({"enum": list(keys.PERIODS), "description": "UTC day, UTC month, or ever"}),
}

SCHEMAS: dict = {
    # --- errors --------------------------------------------------------------------------------------
    "PortalError": obj(("detail",), detail=S),
    "DataError": obj(("status", "msg"), status={"const": "error"}, msg=S),
    "ValidationError": obj(
        ("detail",),
        detail=array(obj(("loc", "msg", "type"), loc=array({"type": ["string", "integer"]}), msg=S, type=S)),
    ),
    "CookieSession": obj(("account_id", "expires_in"), account_id=S, expires_in=I),
    # --- portal --------------------------------------------------------------------------------------
    "Credentials": body_schema(auth.CREDENTIALS),
    "Login": body_schema(auth.LOGIN),
    "Session": obj(
        ("token", "token_type", "account_id", "expires_in"),
        token=S,
        token_type={"const": "bearer"},
        account_id=S,
        expires_in=I,
    ),
    "LoggedOut": obj(("ok",), ok=B),
    "PasswordChange": body_schema(auth.PASSWORD_CHANGE),
    "Me": obj(("account_id", "email", "is_admin", "created_at"), account_id=S, email=S, is_admin=B, created_at=TIME),
    "Attribution": body_schema(auth.ATTRIBUTION),
    "AttributionResult": obj(("ok", "stored"), ok=B, stored=B),
    # The declared fields, with the properties' richer schemas (lists, groups, formats) and null that
    # removes a restriction; PATCH cannot null the name.
    "KeyCreate": with_properties(body_schema(keys.KEY_CREATE), **KEY_PROPERTIES),
    "KeyPatch": with_properties(body_schema(keys.KEY_PATCH), name=field_schema(keys.NAME), **KEY_PROPERTIES),
    "Key": obj(
        (
            "key_id",
            "name",
            "prefix",
            "qps_limit",
            "revoked",
            "created_at",
            *KEY_PROPERTIES,
            "credits_used",
        ),
        key_id=I,
        name=S,
        prefix=S,
        qps_limit=N,
        revoked=B,
        created_at=TIME,
        last_used_at=nullable(TIME),
        **KEY_PROPERTIES,
        credits_used={
            "type": "integer",
            "description": "Credits the key's budget (the key and keys rolled from it) spent in its "
            "credit_limit_period so far; the current UTC month for a key without a budget",
        },
    ),
    "NewKey": {"allOf": [ref("Key"), obj(("key",), key={"type": "string", "description": "The secret, shown once"})]},
    "Roll": obj(
        ("grace_seconds",),
        True,
        grace_seconds={
            "type": "integer",
            "minimum": 0,
            "maximum": keys.MAX_GRACE,
            "description": "How long the old key keeps working (0: it stops at once; at most 7 days)",
        },
    ),
    "RolledKey": {
        "allOf": [
            ref("NewKey"),
            obj(("rolled_from",), rolled_from={"type": "integer", "description": "The key_id of the old key"}),
        ]
    },
    "RevealedKey": obj(("key_id", "key"), key_id=I, key=S),
    "TopUp": body_schema(keys.TOP_UP),
    "TopUpResult": obj(
        ("account_id", "credits_added", "credits", "plan", "qps_limit"),
        account_id=S,
        credits_added=I,
        credits=I,
        plan=S,
        qps_limit=N,
    ),
    "Account": obj(
        ("account_id", "credits", "plan", "qps_limit", "account_qps_limit", "max_keys"),
        account_id=S,
        email=S,
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
    ),
    "UsageSummaryRow": obj(
        ("calls", "credits", "errors"),
        day={"type": "string", "format": "date", "description": "UTC day (when grouped by day)"},
        endpoint={"type": "string", "description": "Data route, e.g. /social/user/info (when grouped by endpoint)"},
        key_id={"type": "integer", "description": "When grouped by key"},
        calls=I,
        credits=I,
        errors={"type": "integer", "description": "Calls answered with a status other than 2xx"},
    ),
    "UsageExportRow": obj(
        ("timestamp", "key_id", "endpoint", "status", "credits", "request_id"),
        timestamp=TIME,
        key_id=I,
        endpoint=S,
        status=I,
        credits=I,
        request_id=S,
    ),
    # --- billing -------------------------------------------------------------------------------------
    "Currency": obj(("code", "min_usd"), code=S, name=S, network=S, min_usd=N),
    "BillingConfig": obj(("currencies",), currencies=array(ref("Currency")), credits_per_usd=I),
    "Checkout": body_schema(billing.CHECKOUT),
    "Amount": obj(("amount", "usd"), amount=N, usd=N),
    "Order": obj(
        ("order_id", "status", "credits_applied"),
        order_id=S,
        status=S,
        pay_address=S,
        pay_currency=S,
        pay_amount=N,
        payment_uri={"type": "string", "description": "network:address?amount=coins, what a wallet scans"},
        price_usd=N,
        credits_expected=I,
        created_at=TIME,
        expires_at=TIME,
        updated_at=TIME,
        amount_received=ref("Amount"),
        amount_confirmed=ref("Amount"),
        credits_applied=I,
    ),
    "SandboxPay": body_schema(billing.SANDBOX_PAY),
    "SandboxConfirm": body_schema(billing.SANDBOX_CONFIRM),
    # --- admin ---------------------------------------------------------------------------------------
    "StatusClasses": obj((), **{name: I for name in ("2xx", "3xx", "4xx", "5xx")}),
    "EndpointTotal": obj(("endpoint", "calls", "credits"), endpoint=S, calls=I, credits=I),
    "MetricsDay": obj(
        ("date", "calls"),
        date={"type": "string", "format": "date"},
        signups=I,
        active_accounts=I,
        calls=I,
        calls_by_status=ref("StatusClasses"),
        credits_spent=I,
        revenue_usd=N,
    ),
    "AdminMetrics": obj(
        ("window", "totals", "series", "top_endpoints", "upstream"),
        window=obj(
            (),
            days=I,
            include_internal=B,
            **{"from": {"type": "string", "format": "date"}, "to": {"type": "string", "format": "date"}},
        ),
        totals=obj(
            (),
            signups=I,
            active_accounts=I,
            calls=I,
            calls_by_status=ref("StatusClasses"),
            credits_spent=I,
            revenue_usd=N,
        ),
        series=array(ref("MetricsDay")),
        top_endpoints=obj((), by_calls=array(ref("EndpointTotal")), by_credits=array(ref("EndpointTotal"))),
        upstream=obj(
            (),
            calls=I,
            errors=I,
            error_rate=N,
            latency_ms=obj((), p50=nullable(N), p90=nullable(N), p99=nullable(N), samples=I, scope=S),
        ),
        rolled_up_until=nullable(TIME),
        generated_at=TIME,
    ),
    "AdminUser": obj(
        ("account_id", "email", "created_at"),
        account_id=S,
        email=S,
        created_at=TIME,
        keys=obj((), active=I, revoked=I),
        calls=I,
        credits_spent=I,
        total_paid_usd=N,
        balance=I,
        first_touch_source=nullable(S),
        last_activity=nullable(TIME),
        is_admin=B,
        internal=B,
    ),
    "AdminUsersPage": obj(
        ("users", "has_next_page", "next_cursor"), users=array(ref("AdminUser")), has_next_page=B, next_cursor=S
    ),
    # --- operations ----------------------------------------------------------------------------------
    "Health": obj(("status",), status={"const": "ok"}),
    "Ready": obj(
        ("status", "checks"),
        status={"enum": ["ready", "not ready"]},
        checks=obj((), database=S, upstream_breaker=S, draining=B, usage_buffer=obj((), depth=I, max=I)),
    ),
    "Catalog": obj(
        ("users",),
        users=array(obj(("userName", "id"), userName=S, id=S)),
        tweets=array(S),
        lists=array(S),
        empty_lists=array(S),
        communities=array(S),
        spaces=array(S),
        big_accounts=array(S),
    ),
    # --- data ----------------------------------------------------------------------------------------
    "User": obj(
        ("type", "id", "userName"),
        type={"const": "user"},
        userName=S,
        url=S,
        id=S,
        name=S,
        isBlueVerified=B,
        description=S,
        location=nullable(S),
        followers=I,
        following=I,
        statusesCount=nullable(I),
        createdAt=S,
        profilePicture=S,
        coverPicture=nullable(S),
        canDm=B,
        pinnedTweetIds=array(S),
        profile_bio=nullable({"type": "object"}),
    ),
    "Tweet": obj(
        ("type", "id"),
        type={"const": "tweet"},
        id=S,
        url=S,
        text=S,
        retweetCount=I,
        replyCount=I,
        likeCount=I,
        quoteCount=I,
        bookmarkCount=I,
        viewCount=nullable(S),
        createdAt={"type": "string", "description": "Www Mmm dd HH:MM:SS +0000 yyyy"},
        lang=S,
        isReply=B,
        inReplyToId=nullable(S),
        conversationId=nullable(S),
        displayTextRange=nullable({"type": "array", "items": I, "minItems": 2, "maxItems": 2}),
        entities=nullable({"type": "object"}),
        quoted_tweet=nullable(ref("Tweet")),
        author=ref("User"),
    ),
    "Trend": obj(("name",), name=S, url=S, query=S, tweet_volume=nullable(I)),
}

_ERRORS = {
    400: "The data provider refused the parameters (its answer, passed through; not charged)",
    401: "Missing, invalid, revoked or expired credential",
    402: "Not enough credits for this call (the account's balance or the key's credit budget): stop, do not retry",
    403: "Not allowed: for this account, by the key's allowed_ips / allowed_endpoints, or (with the portal's "
    "cookie) a write without its XSRF token",
    409: "Conflict",
    404: "Not found (or not yours)",
    413: "Request body too large",
    422: "Invalid input",
    429: "Too many requests: retry after Retry-After seconds",
    501: "Announced but not available; never charged",
    502: "The data provider failed; not charged",
    503: "Temporarily unavailable: retry after Retry-After seconds",
    504: "The data provider did not answer in time; not charged",
}
_RETRY_AFTER = {"Retry-After": {"schema": I, "description": "Seconds to wait before retrying"}}

BILLING, KEY_ID = "/billing/crypto", path_param("key_id", I, "The key's integer id")

OPERATIONS: list[Operation] = [
    # auth
    Operation(
        "post",
        "/auth/register",
        "Create an account; returns a session token",
        "auth",
        ref("Session"),
        security=None,
        body="Credentials",
        errors=(409, 413, 422, 429),
    ),
    Operation(
        "post",
        "/auth/login",
        "Log in; returns a session token",
        "auth",
        ref("Session"),
        security=None,
        body="Login",
        errors=(401, 413, 422, 429),
    ),
    Operation(
        "post", "/auth/logout", "End this session token (other sessions go on)", "auth", ref("LoggedOut"), body=None
    ),
    Operation(
        "post",
        "/auth/password",
        "Change the password; every earlier session token stops working; returns a new one",
        "auth",
        ref("Session"),
        body="PasswordChange",
        errors=(401, 403, 413, 422, 429),
    ),
    Operation("get", "/auth/me", "The account behind the token", "auth", ref("Me")),
    Operation(
        "post",
        "/auth/attribution",
        "Store first-touch data once and link earlier anonymous events",
        "auth",
        ref("AttributionResult"),
        body="Attribution",
        errors=(401, 413, 422),
    ),
    # keys
    Operation(
        "get",
        "/keys",
        "The account's keys, newest first, with QPS limit, revocation state, properties and credits_used "
        "(no secrets); "
        "a further page is announced in the X-Next-Cursor and Link headers",
        "keys",
        array(ref("Key")),
        params=(
            query_param(keys.PAGE),
            query_param(keys.CURSOR),
        ),
        errors=(401, 422),
        extra={
            "200": {
                "description": "Success: still a plain list; when more keys follow, the next page is announced",
                "headers": {
                    "X-Next-Cursor": {"schema": I, "description": "Pass as `cursor` for the next page"},
                    "Link": {"schema": S, "description": '</keys?limit=N&cursor=C>; rel="next"'},
                },
                "content": {"application/json": {"schema": array(ref("Key"))}},
            }
        },
    ),
    Operation(
        "post",
        "/keys",
        "Issue a key; the secret is returned once (409 past MAX_KEYS_PER_ACCOUNT active keys)",
        "keys",
        ref("NewKey"),
        body="KeyCreate",
        body_required=False,
        errors=(401, 409, 413, 422),
    ),
    Operation(
        "patch",
        "/keys/{key_id}",
        "Change a key's name and properties (never its secret); null removes a restriction",
        "keys",
        ref("Key"),
        params=(KEY_ID,),
        body="KeyPatch",
        errors=(401, 404, 409, 413, 422),
    ),
    Operation(
        "post",
        "/keys/{key_id}/roll",
        "Issue a new secret with the same properties and budget; the old key expires after grace_seconds",
        "keys",
        ref("RolledKey"),
        params=(KEY_ID,),
        body="Roll",
        errors=(401, 404, 409, 413, 422),
    ),
    Operation(
        "get",
        "/keys/{key_id}/reveal",
        "The full key string, to its owner",
        "keys",
        ref("RevealedKey"),
        params=(KEY_ID,),
        errors=(401, 404, 422),
    ),
    Operation(
        "post",
        "/keys/{key_id}/revoke",
        "Revoke the key permanently",
        "keys",
        ref("Key"),
        params=(KEY_ID,),
        errors=(401, 404, 422),
    ),
    Operation(
        "post",
        "/keys/{key_id}/topup",
        "Add credits to the key's account (development only)",
        "keys",
        ref("TopUpResult"),
        params=(KEY_ID,),
        body="TopUp",
        errors=(401, 403, 404, 413, 422),
    ),
    # account
    Operation("get", "/account", "Credit balance and plan", "account", ref("Account")),
    Operation(
        "get",
        "/usage",
        "Per-call history, newest first",
        "account",
        array(ref("UsageRecord")),
        params=(query_param(account.DAYS), query_param(account.LIMIT)),
        errors=(401, 422),
    ),
    Operation(
        "get",
        "/usage/summary",
        "Calls, credits and errors per UTC day, endpoint and/or key (stored and buffered), newest first",
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
    ),
    # billing
    Operation(
        "get",
        f"{BILLING}/config",
        "Accepted currencies with their minimum order (public)",
        "billing",
        ref("BillingConfig"),
        security=None,
        errors=(),
    ),
    Operation(
        "post",
        f"{BILLING}/checkout",
        "Create a top-up order; returns the payment address",
        "billing",
        ref("Order"),
        body="Checkout",
        errors=(401, 413, 422, 429, 502, 503),
    ),
    Operation(
        "get",
        f"{BILLING}/orders",
        "The account's orders, newest first",
        "billing",
        array(ref("Order")),
        params=(query_param(billing.ORDERS_LIMIT),),
        errors=(401, 422),
    ),
    Operation(
        "get",
        f"{BILLING}/orders/{{order_id}}",
        "One order with amounts received and credits applied",
        "billing",
        ref("Order"),
        params=(path_param("order_id", S),),
        errors=(401, 404),
    ),
    Operation(
        "get",
        f"{BILLING}/orders/{{order_id}}/qr",
        "A QR code (SVG) of the order's payment_uri",
        "billing",
        {"type": "string"},
        params=(path_param("order_id", S),),
        errors=(401, 404),
        media="image/svg+xml",
    ),
    Operation(
        "post",
        f"{BILLING}/ipn",
        "The payment processor's signed notification",
        "billing",
        obj(("status",), status={"enum": ["ok", "ignored"]}),
        security=None,
        params=(
            {
                "name": "x-nowpayments-sig",
                "in": "header",
                "required": True,
                "schema": S,
                "description": "Hex HMAC-SHA512 of the sorted JSON body",
            },
        ),
        body=None,
        errors=(401, 503),
    ),
    Operation(
        "post",
        f"{BILLING}/sandbox/pay",
        "Send a simulated payment to an order (development only)",
        "billing",
        obj(("tx", "order"), tx={"type": "object"}, order=ref("Order")),
        body="SandboxPay",
        errors=(401, 404, 409, 413, 422),
    ),
    Operation(
        "post",
        f"{BILLING}/sandbox/confirm",
        "Confirm an order's pending simulated payments (development only)",
        "billing",
        obj(("confirmed_payments", "order"), confirmed_payments=I, order=ref("Order")),
        body="SandboxConfirm",
        errors=(401, 404, 409, 413, 422),
    ),
    # admin
    Operation(
        "get",
        "/admin/metrics",
        "Per-day series and totals for the window (admins only)",
        "admin",
        ref("AdminMetrics"),
        params=(query_param(admin.DAYS), query_param(admin.INCLUDE_INTERNAL)),
        errors=(401, 403, 422),
    ),
    Operation(
        "get",
        "/admin/users",
        "One row per account, newest signup first (admins only)",
        "admin",
        ref("AdminUsersPage"),
        params=tuple(query_param(f) for f in (admin.INCLUDE_INTERNAL, admin.USERS_LIMIT, admin.CURSOR)),
        errors=(401, 403, 422),
    ),
    # operations
    Operation("get", "/healthz", "The process is alive", "operations", ref("Health"), security=None, errors=()),
    Operation(
        "get",
        "/sandbox/catalog",
        "Development only: valid ids of the sandbox upstream's world (404 in production)",
        "operations",
        ref("Catalog"),
        security=None,
        errors=(404, 502),
    ),
    Operation(
        "get",
        "/readyz",
        "Database reachable, upstream breaker closed, usage buffer under its bound",
        "operations",
        ref("Ready"),
        security=None,
        errors=(),
        extra={"503": {"description": "Not ready", "content": {"application/json": {"schema": ref("Ready")}}}},
    ),
    Operation(
        "get",
        "/metrics",
        "Prometheus metrics (bearer METRICS_TOKEN when set)",
        "operations",
        {"type": "string"},
        security="metrics",
        media="text/plain",
    ),
    Operation("get", "/openapi.json", "This document", "operations", {"type": "object"}, security=None, errors=()),
    # the web portal (cookie sessions; handlers/portal.py)
    Operation(
        "get",
        "/",
        "The web portal for account holders",
        "portal",
        {"type": "string"},
        security=None,
        errors=(),
        media="text/html",
    ),
    Operation(
        "post",
        "/portal/register",
        "Create an account; the session goes to an HttpOnly cookie (needs the page's XSRF token)",
        "portal",
        ref("CookieSession"),
        security=None,
        body="Credentials",
        errors=(403, 409, 413, 422, 429),
    ),
    Operation(
        "post",
        "/portal/login",
        "Log in; the session goes to an HttpOnly cookie (needs the page's XSRF token)",
        "portal",
        ref("CookieSession"),
        security=None,
        body="Credentials",
        errors=(401, 403, 413, 422, 429),
    ),
    Operation(
        "post",
        "/portal/password",
        "Change the password; earlier sessions end and the new one goes to the cookie (needs the XSRF token)",
        "portal",
        ref("CookieSession"),
        security=None,  # the portal's cookie, which is no bearer scheme; 401 without it
        body="PasswordChange",
        errors=(401, 403, 413, 422, 429),
    ),
    Operation(
        "post",
        "/portal/logout",
        "Clear the session cookie (needs the page's XSRF token)",
        "portal",
        obj(("ok",), ok=B),
        security=None,
        errors=(403,),
    ),
    Operation(
        "get",
        "/docs",
        "Interactive API docs (Swagger UI, served by this gateway)",
        "operations",
        {"type": "string"},
        security=None,
        errors=(),
        media="text/html",
    ),
]

_SECURITY = {"bearer": [{"bearerAuth": []}], "metrics": [{"metricsToken": []}, {}], None: []}


# Any operation: the server's own limit on the request line and headers (app/server.py).
_HEADERS_TOO_LARGE = {
    "431": {
        "description": "Request line and headers larger than MAX_HEADER_BYTES; the connection is closed",
        "content": {"application/json": {"schema": ref("PortalError")}},
    }
}


def _error(status: int, schema: str) -> dict:
    response = {
        "description": _ERRORS[status],
        "content": {"application/json": {"schema": ref("ValidationError" if status == 422 else schema)}},
    }
    if status in (429, 503):
        response["headers"] = _RETRY_AFTER
    return response


# OpenAPI links: how one answer's ids feed the next call (stateful fuzzing follows them):
# create key -> reveal / revoke / top up; revoke -> reveal; checkout -> the order.
_LINKS = {
    ("post", "/keys"): {
        "RevealKey": ("get_keys_key_id_reveal", "key_id"),
        "RevokeKey": ("post_keys_key_id_revoke", "key_id"),
        "TopUpKey": ("post_keys_key_id_topup", "key_id"),
        "ChangeKey": ("patch_keys_key_id", "key_id"),
        "RollKey": ("post_keys_key_id_roll", "key_id"),
    },
    ("get", "/keys/{key_id}/reveal"): {"RevokeKey": ("post_keys_key_id_revoke", "key_id")},
    ("post", "/keys/{key_id}/revoke"): {"RevealRevokedKey": ("get_keys_key_id_reveal", "key_id")},
    ("post", "/billing/crypto/checkout"): {"GetOrder": ("get_billing_crypto_orders_order_id", "order_id")},
}


def _portal(op: Operation) -> dict:
    content = {media: {"schema": op.response} for media in (op.media, *op.also)}
    responses = {str(op.status): {"description": "Success", "content": content}}
    if op.headers:
        responses[str(op.status)]["headers"] = op.headers
    links = _LINKS.get((op.method, op.path))
    if links:
        responses[str(op.status)]["links"] = {
            name: {"operationId": operation_id, "parameters": {field: f"$response.body#/{field}"}}
            for name, (operation_id, field) in links.items()
        }
    responses.update({str(s): _error(s, "PortalError") for s in op.errors})
    responses.update(op.extra)
    responses.update(_HEADERS_TOO_LARGE)
    spec = {
        "operationId": f"{op.method}_{op.path.strip('/').replace('/', '_').replace('{', '').replace('}', '').replace('.', '_') or 'portal_page'}",
        "summary": op.summary,
        "tags": [op.tag],
        "security": _SECURITY[op.security],
        "parameters": list(op.params),
        "responses": responses,
    }
    if op.body:
        spec["requestBody"] = {"required": op.body_required, "content": {"application/json": {"schema": ref(op.body)}}}
    return spec


def _param_schema(param: Param) -> dict:
    if param.kind == "int":
        # Integers are read with at most INT_DIGITS digits (int64-safe); that is the bound when the table has none.
        return {
            "type": "integer",
            "minimum": -INT_MAX if param.minimum is None else param.minimum,
            "maximum": INT_MAX if param.maximum is None else param.maximum,
        }
    if param.kind == "bool":
        return {"type": "boolean"}
    if param.choices:
        return {"type": "string", "enum": list(param.choices), "default": param.choices[0]}
    if param.kind == "cursor":  # what cannot be a cursor: blank, too long, outside printable ASCII
        return {"type": "string", "minLength": 1, "maxLength": CURSOR_MAX, "pattern": CURSOR_PATTERN}
    if param.kind == "ids":
        return {
            "type": "string",
            "pattern": ids_pattern(param.maximum),
            "description": f"Comma-separated numeric ids, at most {param.maximum}",
        }
    if param.required:  # blank (whitespace only) counts as missing: 422
        return {"type": "string", "minLength": 1, "maxLength": STRING_MAX, "pattern": NOT_BLANK}
    return {"type": "string", "maxLength": STRING_MAX}


_RESULT_ITEMS = {
    "tweets": ref("Tweet"),
    "replies": ref("Tweet"),
    "followers": ref("User"),
    "followings": ref("User"),
    "users": ref("User"),
    "ids": S,
    "trends": ref("Trend"),
}


def _envelope(endpoint: Endpoint) -> dict:
    """The success body: status, message or msg (as the spec's table names it), the results and paging."""
    if endpoint.results == "data":  # null when the provider does not know the id (status "error")
        results = nullable(ref("User") if endpoint.path == "/user/info" else {"type": "object"})
    else:
        results = array(_RESULT_ITEMS[endpoint.results])
    properties = {"status": {"type": "string", "examples": ["success"]}, endpoint.msg_key: S, endpoint.results: results}
    if endpoint.paged:
        properties.update(has_next_page=B, next_cursor={"type": "string", "description": "Empty on the last page"})
    return {"type": "object", "properties": properties, "required": ["status"]}


def _data(endpoint: Endpoint, prefix: str, tag: str) -> dict:
    if endpoint.available:
        ok = {
            "200": {
                "description": "Success; charged per X-Credits-Charged",
                "headers": {
                    "X-Credits-Charged": {"schema": I, "description": "Credits charged for this call"},
                    **{
                        f"X-RateLimit{scope}-{h}": {"schema": I}
                        for scope in ("", "-Account")  # the key's bucket, and the one all its account's keys share
                        for h in ("Limit", "Remaining", "Reset")
                    },
                },
                "content": {"application/json": {"schema": _envelope(endpoint)}},
            }
        }
        errors = (400, 401, 402, 403, 404, 422, 429, 502, 503, 504)  # 400, 404: the provider's, passed through
    else:
        ok, errors = {}, (401, 403, 422, 429, 501)
    return {
        "operationId": (prefix + endpoint.path).strip("/").replace("/", "_"),
        "summary": endpoint.summary,
        **(
            {"description": f"Send at least one of {', '.join(endpoint.one_of)} (422 when none is sent)."}
            if endpoint.one_of
            else {}
        ),
        "tags": [tag],
        "security": [{"apiKey": []}],
        "parameters": [query(p.name, _param_schema(p), p.description, p.required) for p in endpoint.params],
        "responses": {**ok, **{str(s): _error(s, "DataError") for s in errors}, **_HEADERS_TOO_LARGE},
    }


def build(twitter_alias: bool, metrics_here: bool) -> dict:
    """The document for an application: aliases and /metrics appear only where the application serves them."""
    paths: dict = {}
    for op in OPERATIONS:
        if op.path != "/metrics" or metrics_here:
            paths.setdefault(op.path, {})[op.method] = _portal(op)
    prefixes = [("/social", "data")] + ([("/twitter", "data (provider-compatible paths)")] if twitter_alias else [])
    for prefix, tag in prefixes:
        for endpoint in ENDPOINTS:
            paths[prefix + endpoint.path] = {"get": _data(endpoint, prefix, tag)}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Social Data Gateway API",
            "version": VERSION,
            "description": "Portal endpoints use a bearer session token (the web portal at / keeps it in an "
            "HttpOnly cookie instead, and its writes carry an X-XSRFToken header); data endpoints use X-API-Key "
            "and are charged in credits (100,000 credits = 1 USD).",
        },
        "tags": [{"name": t} for t in ("auth", "keys", "account", "billing", "admin", "operations", "portal", "data")]
        + ([{"name": prefixes[1][1]}] if twitter_alias else []),
        "paths": paths,
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "bearerFormat": "JWT",
                    "description": "Session token from /auth/register or /auth/login",
                },
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
                "metricsToken": {"type": "http", "scheme": "bearer", "description": "METRICS_TOKEN, when it is set"},
            },
        },
    }


@functools.lru_cache(maxsize=4)
def serialized(twitter_alias: bool, metrics_here: bool) -> bytes:
    """The document as JSON, built once per application shape."""
    return orjson.dumps(build(twitter_alias, metrics_here))
