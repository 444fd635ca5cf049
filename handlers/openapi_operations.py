"""Every path but the data plane's: one `Operation` each, its parameters the handlers' `Field` declarations.

A new route needs its Operation here, or in its area's part (handlers/<area>/openapi.py, assembled by
handlers/openapi.py): tests/test_ops.py compares the document with the application's route table in both
directions.
"""

from dataclasses import dataclass, field

from handlers import account, admin, billing, keys
from handlers.openapi_schema import B, I, S, array, obj, path_param, query, query_param, ref
from handlers.validation import Field
from security import roles


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
    idempotent: bool = (
        False  # takes an Idempotency-Key (the handler's method is @idempotent: tests/test_idempotency.py)
    )
    # The least role of a member that may call it (security/roles.py): every bearer operation names one. The
    # server enforces it for the route (BaseHandler.prepare), the document shows it, and tests/test_members.py
    # walks every operation against every role from here.
    role: str | None = None
    or_self: str | None = None  # a path parameter: any member may call it on their own member id (leaving)

    def __post_init__(self) -> None:
        if (self.security == "bearer") != (self.role is not None):
            raise ValueError(f"{self.method} {self.path}: a bearer operation, and only one, names its least role")


ALIASES = Field(
    "aliases",
    bool,
    required=False,
    default=False,
    description="Also list the /twitter alias of every data path (served when TWITTER_ALIAS is on)",
)
ACCOUNT_ID = path_param("account_id", S, "The account's id")
BILLING, KEY_ID = "/billing/crypto", path_param("key_id", I, "The key's integer id")

OPERATIONS: list[Operation] = [
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
        role=roles.VIEWER,
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
        idempotent=True,
        role=roles.DEVELOPER,
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
        role=roles.DEVELOPER,
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
        idempotent=True,
        role=roles.DEVELOPER,
    ),
    Operation(
        "get",
        "/keys/{key_id}/reveal",
        "The full key string, to its owner; 410 once the key is revoked (its secret is never shown again)",
        "keys",
        ref("RevealedKey"),
        params=(KEY_ID,),
        errors=(401, 404, 410, 422),
        role=roles.DEVELOPER,
    ),
    Operation(
        "post",
        "/keys/{key_id}/revoke",
        "Revoke the key permanently",
        "keys",
        ref("Key"),
        params=(KEY_ID,),
        errors=(401, 404, 422),
        role=roles.DEVELOPER,
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
        idempotent=True,
        role=roles.BILLING,
    ),
    # account
    Operation("get", "/account", "Credit balance and plan", "account", ref("Account"), role=roles.VIEWER),
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
        role=roles.VIEWER,
    ),
    Operation(
        "get",
        "/usage/log",
        "The request log: calls filtered by key, endpoint, status, time or request id, newest first, paged",
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
        idempotent=True,
        role=roles.BILLING,
    ),
    Operation(
        "get",
        f"{BILLING}/orders",
        "The account's orders, newest first",
        "billing",
        array(ref("Order")),
        params=(query_param(billing.ORDERS_LIMIT),),
        errors=(401, 422),
        role=roles.VIEWER,
    ),
    Operation(
        "get",
        f"{BILLING}/orders/{{order_id}}",
        "One order with amounts received and credits applied",
        "billing",
        ref("Order"),
        params=(path_param("order_id", S),),
        errors=(401, 404),
        role=roles.VIEWER,
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
        role=roles.VIEWER,
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
        role=roles.BILLING,
    ),
    Operation(
        "post",
        f"{BILLING}/sandbox/confirm",
        "Confirm an order's pending simulated payments (development only)",
        "billing",
        obj(("confirmed_payments", "order"), confirmed_payments=I, order=ref("Order")),
        body="SandboxConfirm",
        errors=(401, 404, 409, 413, 422),
        role=roles.BILLING,
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
        role=roles.VIEWER,
    ),
    Operation(
        "get",
        "/admin/users",
        "One row per account, newest signup first (admins only)",
        "admin",
        ref("AdminUsersPage"),
        params=tuple(query_param(f) for f in (admin.INCLUDE_INTERNAL, admin.SEARCH, admin.USERS_LIMIT, admin.CURSOR)),
        errors=(401, 403, 422),
        role=roles.VIEWER,
    ),
    Operation(
        "get",
        "/admin/accounts/{account_id}",
        "One account: balance, plan, keys, orders, recent calls and audit entries (admins only)",
        "admin",
        ref("AdminAccountDetail"),
        params=(ACCOUNT_ID,),
        errors=(401, 403, 404),
        role=roles.VIEWER,
    ),
    Operation(
        "post",
        "/admin/accounts/{account_id}/credit",
        "Add credits, with a reason (ledger and audit log; the plan does not change)",
        "admin",
        ref("AdminAccount"),
        params=(ACCOUNT_ID,),
        body="AdminAdjust",
        errors=(401, 403, 404, 413, 422),
        idempotent=True,
        role=roles.VIEWER,
    ),
    Operation(
        "post",
        "/admin/accounts/{account_id}/debit",
        "Take credits, with a reason; 409 past the unleased balance (never below zero)",
        "admin",
        ref("AdminAccount"),
        params=(ACCOUNT_ID,),
        body="AdminAdjust",
        errors=(401, 403, 404, 409, 413, 422),
        idempotent=True,
        role=roles.VIEWER,
    ),
    Operation(
        "post",
        "/admin/accounts/{account_id}/suspend",
        "Suspend the account: its keys answer 403 on every process (within a second)",
        "admin",
        ref("AdminAccount"),
        params=(ACCOUNT_ID,),
        body="AdminSuspend",
        errors=(401, 403, 404, 413, 422),
        role=roles.VIEWER,
    ),
    Operation(
        "post",
        "/admin/accounts/{account_id}/resume",
        "Resume a suspended account",
        "admin",
        ref("AdminAccount"),
        params=(ACCOUNT_ID,),
        body="AdminResume",
        body_required=False,
        errors=(401, 403, 404, 413, 422),
        role=roles.VIEWER,
    ),
    # operations
    Operation("get", "/healthz", "The process is alive", "operations", ref("Health"), security=None, errors=()),
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
    Operation(
        "get",
        "/openapi.json",
        "This document: each data endpoint once, under /social",
        "operations",
        {"type": "object"},
        security=None,
        params=(query_param(ALIASES),),
        errors=(422,),
    ),
    # the web portal (cookie sessions; portal/pages.py)
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
        "Log in; the session goes to an HttpOnly cookie (needs the page's XSRF token), or a 2FA challenge",
        "portal",
        {"oneOf": [ref("CookieSession"), ref("TwoFactorChallenge")]},
        security=None,
        body="Login",
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
