"""The OpenAPI operations and schemas of alert rules and webhook endpoints (handlers/alerts/handlers.py)."""

from alerts import rules as kinds
from handlers.alerts import handlers as alerts
from handlers.openapi_operations import Operation
from handlers.openapi_schema import TIME, B, I, N, S, array, field_schema, nullable, obj, path_param, query_param, ref
from security import roles

_FIELDS = {f.name: f for f in alerts.RULE_FIELDS}
_AMOUNTS = {name: field_schema(_FIELDS[name]) for name in ("credits", "usd", "percent")}


def _rule_body(kind: str, **properties) -> dict:
    return obj(("kind", *[n for n in properties if n in _AMOUNTS]), True, kind={"const": kind}, **properties)


_LEVELS = {"type": "array", "items": {"enum": list(kinds.LEVELS)}, "minItems": 1, "uniqueItems": True}
_STATUSES = {"type": "array", "items": {"enum": list(kinds.ORDER_STATUSES)}, "minItems": 1, "uniqueItems": True}
_URL = {
    "type": "string",
    "minLength": 8,
    "maxLength": 2000,
    "pattern": r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?$",
    "description": "https; in development also http and loopback. Production refuses hosts that resolve to "
    "loopback, private, link-local or metadata addresses (422), and checks again at every connection",
}
SCHEMAS = {
    "AlertRuleCreate": {
        "oneOf": [
            *(_rule_body("balance_below", **{name: _AMOUNTS[name]}) for name in ("credits", "usd", "percent")),
            *(_rule_body("daily_spend_above", **{name: _AMOUNTS[name]}) for name in ("credits", "usd")),
            # Optional properties may be null, read as absent (as every portal body: handlers/openapi_schema.py).
            _rule_body("key_budget", levels=nullable(_LEVELS), key_id=nullable(field_schema(_FIELDS["key_id"]))),
            _rule_body("order_status", statuses=nullable(_STATUSES)),
        ],
        "description": "balance_below: one of credits, usd, percent (of the last top-up or payment); "
        "daily_spend_above: credits or usd; key_budget: levels (default 50, 80, 100) and key_id (default every key "
        "with a budget); order_status: statuses (default all)",
    },
    "AlertRule": obj(
        ("rule_id", "kind", "description", "armed", "created_at"),
        rule_id=S,
        kind={"enum": list(kinds.KINDS)},
        credits=nullable(I),
        usd=nullable(N),
        percent=nullable(I),
        levels=nullable(array(I)),
        key_id=nullable(I),
        statuses=nullable(array(S)),
        description=S,
        armed={
            "type": "boolean",
            "description": "false after it fired until it re-arms: balance_below at a top-up, daily_spend_above the "
            "next UTC day; the other kinds are always armed",
        },
        fired_at={**nullable(TIME), "description": "when a balance or daily-spend rule last fired; null: never"},
        created_at=TIME,
    ),
    "AlertEvent": obj(
        ("event_id", "type", "data", "created_at"),
        event_id={"type": "string", "description": "Also the webhook-id header of its deliveries"},
        type={
            "enum": [
                *kinds.EVENT_TYPES.values(),
                "webhook.test",
                "webhook.endpoint_disabled",
                kinds.STREAM_PAUSED,
                kinds.STREAM_RESUMED,
                "tweet",
            ]
        },
        data={"type": "object"},
        created_at=TIME,
    ),
    "WebhookCreate": obj(("url",), True, url=_URL, description=nullable(field_schema(alerts.ENDPOINT_FIELDS[1]))),
    "WebhookPatch": obj(
        (),
        True,
        url=nullable(_URL),
        description=nullable(field_schema(alerts.ENDPOINT_FIELDS[1])),
        enabled=nullable({"type": "boolean", "description": "true re-enables an endpoint disabled for failing"}),
    ),
    "WebhookEndpoint": obj(
        ("endpoint_id", "url", "description", "enabled", "created_at"),
        endpoint_id=S,
        url=S,
        description=S,
        enabled=B,
        disabled_reason=nullable(S),
        failing_since=nullable(TIME),
        created_at=TIME,
        secret_rolled_at=nullable(TIME),
    ),
    "NewWebhookEndpoint": {
        "allOf": [
            ref("WebhookEndpoint"),
            obj(("secret",), secret={"type": "string", "description": "whsec_...: shown once (and at each roll)"}),
        ]
    },
    "WebhookDelivery": obj(
        ("delivery_id", "event_id", "type", "state", "attempts", "created_at", "log"),
        delivery_id=S,
        event_id=S,
        type=S,
        state={"enum": ["pending", "delivered", "failed"]},
        attempts=I,
        next_attempt_at=nullable(TIME),
        last_status=nullable(I),
        last_error=nullable(S),
        last_attempt_at=nullable(TIME),
        created_at=TIME,
        log=array(obj(("at",), at=TIME, status=nullable(I), error=nullable(S), ms=N)),
    ),
    "Done": obj(("ok",), ok=B),
}

_RULE_ID = path_param("rule_id", {"type": "string", "pattern": "^[A-Za-z0-9_]{1,64}$"}, "The rule's id")
_ENDPOINT_ID = path_param("endpoint_id", {"type": "string", "pattern": "^[A-Za-z0-9_]{1,64}$"}, "The endpoint's id")
_DELIVERY_ID = path_param("delivery_id", {"type": "string", "pattern": "^[A-Za-z0-9_.]{1,200}$"}, "The delivery's id")
_LIMIT = query_param(alerts.EVENTS_LIMIT)
_E = "/webhooks/{endpoint_id}"

OPERATIONS = [
    Operation("get", "/alerts", "The account's alert rules", "alerts", array(ref("AlertRule")), role=roles.VIEWER),
    Operation(
        "post",
        "/alerts",
        "Add an alert rule (409 past 50); it fires once per crossing, to every webhook endpoint and email",
        "alerts",
        ref("AlertRule"),
        body="AlertRuleCreate",
        errors=(401, 409, 413, 422),
        role=roles.DEVELOPER_OR_BILLING,
    ),
    Operation(
        "delete",
        "/alerts/{rule_id}",
        "Delete an alert rule",
        "alerts",
        ref("Done"),
        params=(_RULE_ID,),
        errors=(401, 404),
        role=roles.DEVELOPER_OR_BILLING,
    ),
    Operation(
        "get",
        "/alerts/events",
        "What fired (and test events), newest first",
        "alerts",
        array(ref("AlertEvent")),
        params=(_LIMIT,),
        errors=(401, 422),
        role=roles.VIEWER,
    ),
    Operation(
        "get",
        "/webhooks",
        "The account's webhook endpoints (never secrets)",
        "alerts",
        array(ref("WebhookEndpoint")),
        role=roles.VIEWER,
    ),
    Operation(
        "post",
        "/webhooks",
        "Add a webhook endpoint (409 past 10); its signing secret is returned once",
        "alerts",
        ref("NewWebhookEndpoint"),
        body="WebhookCreate",
        errors=(401, 409, 413, 422),
        role=roles.DEVELOPER,
    ),
    Operation(
        "patch",
        _E,
        "Change an endpoint's URL or description, or re-enable it",
        "alerts",
        ref("WebhookEndpoint"),
        params=(_ENDPOINT_ID,),
        body="WebhookPatch",
        errors=(401, 404, 413, 422),
        role=roles.DEVELOPER,
    ),
    Operation(
        "delete",
        _E,
        "Delete an endpoint (its pending deliveries end)",
        "alerts",
        ref("Done"),
        params=(_ENDPOINT_ID,),
        errors=(401, 404),
        role=roles.DEVELOPER,
    ),
    Operation(
        "post",
        _E + "/roll",
        "A new signing secret, returned once; the previous one also signs for a day",
        "alerts",
        ref("NewWebhookEndpoint"),
        params=(_ENDPOINT_ID,),
        body=None,
        errors=(401, 404),
        role=roles.DEVELOPER,
    ),
    Operation(
        "post",
        _E + "/test",
        "Send a test event (type webhook.test) to this endpoint; 10 a minute per account, then 429",
        "alerts",
        ref("Done"),
        params=(_ENDPOINT_ID,),
        body=None,
        errors=(401, 404, 429),
        role=roles.DEVELOPER,
    ),
    Operation(
        "get",
        _E + "/deliveries",
        "The endpoint's delivery log, newest first: state, attempts, next try, last response code",
        "alerts",
        array(ref("WebhookDelivery")),
        params=(_ENDPOINT_ID, _LIMIT),
        errors=(401, 404, 422),
        role=roles.VIEWER,
    ),
    Operation(
        "post",
        _E + "/deliveries/{delivery_id}/redeliver",
        "Send a delivery again now (same webhook-id), with a fresh retry window",
        "alerts",
        ref("WebhookDelivery"),
        params=(_ENDPOINT_ID, _DELIVERY_ID),
        body=None,
        errors=(401, 404),
        role=roles.DEVELOPER,
    ),
]
