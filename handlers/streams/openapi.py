"""The OpenAPI operations and schemas of filter rules, monitors and the WebSocket (handlers/streams/handlers.py)."""

from config.settings import fields
from handlers.openapi_operations import Operation
from handlers.openapi_schema import TIME, I, N, S, array, body_schema, nullable, obj, path_param, query_param, ref
from handlers.streams import handlers as streams
from security import roles

_OK = {"status": {"const": "success"}, "msg": S}
_ROW = obj(
    ("rule_id", "kind", "tag", "value", "interval_seconds", "is_effect", "status", "cost_per_day_credits"),
    rule_id=S,
    kind={"enum": ["rule", "monitor"]},
    tag=S,
    value={"type": "string", "description": "rule: its search; monitor: the account's handle"},
    interval_seconds=N,
    is_effect={"enum": [0, 1]},
    status={
        "enum": ["active", "inactive", "paused_balance", "paused_budget", "suspended"],
        "description": "paused_balance: the balance cannot pay for the next hour of polls; resumes after a top-up. "
        "paused_budget: its key's credit budget cannot pay for a poll; resumes in the next period or when the "
        "budget is raised. suspended: the account is suspended; resumes with it. A rule of a revoked or expired "
        "key is switched off (inactive)",
    },
    polls_per_day=I,
    cost_per_day_credits={"type": "integer", "description": "polls a day x the search's per-call minimum"},
    cost_per_day_usd=N,
    cost_note=S,
    polled_at={"anyOf": [TIME, {"type": "null"}]},
    created_at=TIME,
)
# What the validators check beyond the declarations' limits (handlers/streams/handlers.py): an interval between
# STREAM_MIN_INTERVAL (its default here) and a day, an X handle, no control characters in a tag or a search.
_LEAST = next(f.default for f in fields() if f.name == "stream_min_interval")
_INTERVAL = {"type": "number", "minimum": _LEAST, "maximum": 86400, "description": "Seconds; answered as an integer"}
_HANDLE = {"type": "string", "pattern": r"^@?[A-Za-z0-9_]{1,15}$", "description": "An X handle, @ optional"}
_TEXT = r"^[^\u0000-\u001f\u007f-\u009f]*$"


def _schema(declared: list, **kinds) -> dict:
    schema = body_schema(declared)
    for name, prop in schema["properties"].items():
        nullable_ = "anyOf" in prop
        if name == "interval_seconds":
            prop = nullable(_INTERVAL) if nullable_ else _INTERVAL
        elif name == "x_user_name":
            prop = _HANDLE
        elif name in ("tag", "value"):
            inner = prop["anyOf"][0] if nullable_ else prop
            inner["pattern"] = _TEXT
        schema["properties"][name] = prop
    schema["properties"].update(kinds)
    return schema


SCHEMAS = {
    "StreamRule": _ROW,
    "AddRule": _schema(streams.ADD_RULE),
    "UpdateRule": _schema(streams.UPDATE_RULE),
    "DeleteRule": _schema(streams.DELETE_RULE),
    "Monitor": _schema(streams.MONITOR),
    "RemoveMonitor": {
        "oneOf": [_schema([streams.MONITOR_ID]), _schema(streams.MONITOR)],
        "description": "The provider's body: id_for_user, as add_user_to_monitor_tweet answered; or the handle",
    },
    "StreamCreate": {
        "oneOf": [
            _schema(streams.RULE_CREATE, kind={"const": "rule"}),
            _schema(streams.MONITOR_CREATE, kind={"const": "monitor"}),
        ],
        "description": "A rule: tag, value (a search), interval_seconds (default 60); a monitor: x_user_name, "
        "tag (default @handle), interval_seconds (default STREAM_MONITOR_INTERVAL). Active unless active is false",
    },
    "StreamPatch": _schema(streams.PORTAL_PATCH),
    "RuleAdded": obj(("status", "msg", "rule_id"), **_OK, rule_id=S),
    "MonitorAdded": obj(("status", "msg", "id_for_user"), **_OK, id_for_user=S),
    "ProviderOk": obj(("status", "msg"), **_OK),
    "MyInfo": obj(("recharge_credits",), recharge_credits={"type": "integer", "description": "The account's balance"}),
    "Rules": obj(("status", "msg", "rules"), **_OK, rules=array(ref("StreamRule"))),
    "StreamEvent": obj(
        ("event_type", "event_id", "rule_id", "rule_tag", "tweets", "timestamp"),
        event_type={"const": "tweet"},
        event_id=S,
        rule_id=S,
        rule_tag=S,
        tweets=array({"type": "object"}),
        timestamp={"type": "integer", "description": "ms since 1970"},
        created_at=TIME,
    ),
}
_KEYED = (401, 403, 409, 413, 422)
_RULE_ID = path_param("rule_id", {"type": "string", "pattern": "^[A-Za-z0-9_]{1,64}$"}, "The rule's id")


def _provider(method: str, path: str, summary: str, body: str | None, response: str) -> Operation:
    return Operation(
        method, path, summary, "streams", ref(response), security="apikey", body=body, errors=(*_KEYED, 404)
    )


OPERATIONS = [
    _provider(
        "post",
        "/oapi/tweet_filter/add_rule",
        "Add a filter rule (inactive until update_rule sets is_effect 1)",
        "AddRule",
        "RuleAdded",
    ),
    _provider(
        "post",
        "/oapi/tweet_filter/update_rule",
        "Change a rule; is_effect 1 polls it from now, 0 stops it",
        "UpdateRule",
        "ProviderOk",
    ),
    _provider(
        "delete", "/oapi/tweet_filter/delete_rule", "Delete a rule (the provider's method)", "DeleteRule", "ProviderOk"
    ),
    _provider("post", "/oapi/tweet_filter/delete_rule", "Delete a rule (as DELETE)", "DeleteRule", "ProviderOk"),
    _provider("get", "/oapi/tweet_filter/get_rules", "The account's filter rules", None, "Rules"),
    _provider(
        "post",
        "/oapi/x_user_stream/add_user_to_monitor_tweet",
        "Monitor an account's posts (polled every STREAM_MONITOR_INTERVAL)",
        "Monitor",
        "MonitorAdded",
    ),
    _provider(
        "post",
        "/oapi/x_user_stream/remove_user_to_monitor_tweet",
        "Stop monitoring an account",
        "RemoveMonitor",
        "ProviderOk",
    ),
    _provider("get", "/oapi/my/info", "The account's balance, as the provider's clients read it", None, "MyInfo"),
    Operation(
        "get",
        "/streams",
        "The account's filter rules and monitors, with their cost per day",
        "streams",
        array(ref("StreamRule")),
        role=roles.VIEWER,
    ),
    Operation(
        "post",
        "/streams",
        "Add a filter rule or monitor (active unless active is false)",
        "streams",
        ref("StreamRule"),
        body="StreamCreate",
        errors=(401, 403, 409, 413, 422),  # 403: switched on while the account is suspended
        role=roles.DEVELOPER,
    ),
    Operation(
        "patch",
        "/streams/{rule_id}",
        "Change, activate or pause a rule or monitor",
        "streams",
        ref("StreamRule"),
        params=(_RULE_ID,),
        body="StreamPatch",
        errors=(401, 403, 404, 409, 413, 422),
        role=roles.DEVELOPER,
    ),
    Operation(
        "delete",
        "/streams/{rule_id}",
        "Delete a rule or monitor",
        "streams",
        ref("Done"),
        params=(_RULE_ID,),
        errors=(401, 404),
        role=roles.DEVELOPER,
    ),
    Operation(
        "get",
        "/streams/{rule_id}/events",
        "A rule's recent deliveries, newest first",
        "streams",
        array(ref("StreamEvent")),
        params=(_RULE_ID, query_param(streams.EVENTS_LIMIT)),
        errors=(401, 404, 422),
        role=roles.VIEWER,
    ),
]


def socket_operations(prefix: str) -> dict:
    """The WebSocket upgrade (GET with Upgrade: websocket)."""
    return {
        "operationId": prefix.strip("/") + "_tweet_websocket",
        "summary": "WebSocket of the key's tweet events: connected, ping, tweet (docs/streams.md); one per key "
        "(a second is closed with 1008); since_event_id or since_timestamp first sends what was missed",
        "tags": ["streams"],
        "security": [{"apiKey": []}],
        "parameters": [
            {
                "name": "since_event_id",
                "in": "query",
                "required": False,
                "description": "Resume after a reconnect: the event_id of the last tweet event you had. After "
                "`connected` (whose `replay` says how many follow and whether that is all), the account's events "
                "written after it come first, oldest first (at most 5,000), then live ones. An unknown or expired "
                "id replays nothing: resume with since_timestamp.",
                "schema": S,
                "example": "fr_0123456789abcdef:42",
            },
            {
                "name": "since_timestamp",
                "in": "query",
                "required": False,
                "description": "Resume from a point in time, in milliseconds since 1970 (a tweet event's "
                "`timestamp`): the account's events after it first, then live ones. With several workers, resume "
                "from the last event's timestamp minus 2000 and drop the event_ids you already have.",
                "schema": {"type": "integer", "minimum": 0, "maximum": 10**15 - 1},
                "example": 1764100021000,
            },
        ],
        "responses": {
            "101": {"description": "Switching protocols: the socket is open"},
            "400": {"description": "Not a WebSocket upgrade request (Upgrade: websocket is required)"},
            "422": {
                "description": "since_timestamp is not milliseconds",
                "content": {"application/json": {"schema": ref("ValidationError")}},
            },
            "401": {
                "description": "Missing, invalid, revoked or expired key",
                "content": {"application/json": {"schema": ref("DataError")}},
            },
            "403": {
                "description": "Not allowed from this address or for this key's endpoints, or the account is suspended",
                "content": {"application/json": {"schema": ref("DataError")}},
            },
        },
    }
