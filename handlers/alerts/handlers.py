"""Alert rules, webhook endpoints and their delivery log (README, "Alerts and webhooks").

Rules: GET/POST /alerts, DELETE /alerts/{rule_id}, GET /alerts/events (what fired). Endpoints: GET/POST
/webhooks (the secret shown once), PATCH /webhooks/{id} (url, description, enabled), DELETE, POST
/webhooks/{id}/roll (a new secret, shown once; the previous one signs too for a day), POST
/webhooks/{id}/test (TESTS_PER_MINUTE per account, then 429), GET /webhooks/{id}/deliveries, POST
/webhooks/{id}/deliveries/{delivery_id}/redeliver.
Another account's rule, endpoint or delivery is 404. What they do: services/alerts.py; their part of the OpenAPI
document: handlers/alerts/openapi.py.
"""

from collections.abc import Callable
from datetime import UTC, datetime
from urllib.parse import urlsplit

from alerts import rules as kinds
from handlers.base import BaseHandler, authenticated
from handlers.errors import ApiError, ValidationError, error, missing
from handlers.validation import Field, no_controls, one_of, validate_body
from security import roles
from services.alerts import MAX_ENDPOINTS, MAX_RULES, TESTS_PER_MINUTE

MAX_CREDITS, MAX_USD = 10**15, 10**9


def _subset(choices: tuple) -> Callable:
    def check(value: list, loc: list) -> None:
        if not value or any(item not in choices for item in value) or len(set(value)) != len(value):
            raise ValidationError(
                [
                    error(
                        loc,
                        "Input should be a non-empty list of distinct values of " + ", ".join(map(str, choices)),
                        "value_error",
                    )
                ]
            )

    return check


RULE_FIELDS = [
    Field("kind", str, check=one_of(kinds.KINDS), description=" | ".join(kinds.KINDS)),
    Field("credits", int, required=False, minimum=1, maximum=MAX_CREDITS, description="Threshold in credits"),
    Field("usd", float, required=False, exclusive_minimum=0, maximum=MAX_USD, description="Threshold in USD"),
    Field("percent", int, required=False, minimum=1, maximum=99, description="balance_below: % of the last top-up"),
    Field("levels", list, required=False, check=_subset(kinds.LEVELS), description="key_budget: 50, 80, 100"),
    Field("key_id", int, required=False, minimum=1, description="key_budget: one key (absent: every key)"),
    Field("statuses", list, required=False, check=_subset(kinds.ORDER_STATUSES), description="order_status"),
]
ENDPOINT_FIELDS = [
    Field("url", str, min_length=8, max_length=2000, description="https (http and loopback in development)"),
    Field("description", str, required=False, max_length=200, check=no_controls),
]
ENDPOINT_PATCH = [
    Field("url", str, required=False, min_length=8, max_length=2000),
    Field("description", str, required=False, max_length=200, check=no_controls),
    Field("enabled", bool, required=False, description="true re-enables a disabled endpoint"),
]
EVENTS_LIMIT = Field("limit", int, required=False, default=50, minimum=1, maximum=500)
_ALLOWED = {
    "balance_below": {"credits", "usd", "percent"},
    "key_budget": {"levels", "key_id"},
    "daily_spend_above": {"credits", "usd"},
    "order_status": {"statuses"},
}


def rule_of(body: dict) -> dict:
    """The rule a validated body describes; 422 for fields of another kind, or not exactly one threshold."""
    kind = body["kind"]
    errors = [
        error(["body", name], f"Not a field of {kind} rules", "extra_forbidden")
        for name in body
        if name != "kind" and name not in _ALLOWED[kind]
    ]
    amounts = [name for name in ("credits", "usd", "percent") if name in body]
    if kind in ("balance_below", "daily_spend_above") and len(amounts) != 1:
        errors.append(
            missing(["body", "credits"]) if not amounts else error(["body"], "One threshold only", "value_error")
        )
    if errors:
        raise ValidationError(errors)
    rule = {"kind": kind, **{name: body[name] for name in _ALLOWED[kind] if name in body}}
    if kind == "key_budget":
        rule["levels"] = sorted(set(rule.get("levels") or kinds.LEVELS))
    if kind == "order_status":
        rule["statuses"] = [s for s in kinds.ORDER_STATUSES if s in (rule.get("statuses") or kinds.ORDER_STATUSES)]
    return rule


def armed(rule: dict) -> bool:
    """False while a fired rule waits to re-arm: a balance rule until a top-up, a daily one until the next UTC day."""
    if rule["kind"] == "balance_below":
        return rule["fired_seq"] < rule["arm_seq"]
    if rule["kind"] == "daily_spend_above":
        return rule.get("fired_day") != datetime.now(UTC).date().isoformat()
    return True


def rule_row(rule: dict) -> dict:
    return {
        "rule_id": rule["_id"],
        **{name: rule.get(name) for name in ("kind", "credits", "usd", "percent", "levels", "key_id", "statuses")},
        "description": kinds.describe(rule),
        "armed": armed(rule),
        "fired_at": rule.get("fired_at"),
        "created_at": rule["created_at"],
    }


def endpoint_row(endpoint: dict) -> dict:
    return {
        "endpoint_id": endpoint["_id"],
        "url": endpoint["url"],
        "description": endpoint.get("description") or "",
        "enabled": endpoint["enabled"],
        "disabled_reason": endpoint.get("disabled_reason"),
        "failing_since": endpoint.get("failing_since"),
        "created_at": endpoint["created_at"],
        "secret_rolled_at": endpoint.get("secret_rolled_at"),
    }


def delivery_row(delivery: dict) -> dict:
    return {
        "delivery_id": delivery["_id"],
        "event_id": delivery["event_id"],
        "type": delivery["type"],
        "state": delivery["state"],
        "attempts": delivery["attempts"],
        "next_attempt_at": delivery["next_attempt_at"] if delivery["state"] == "pending" else None,
        "last_status": delivery.get("last_status"),
        "last_error": delivery.get("last_error"),
        "last_attempt_at": delivery.get("last_attempt_at"),
        "created_at": delivery["created_at"],
        "log": [{"at": a["at"], "status": a["status"], "error": a["error"], "ms": a["ms"]} for a in delivery["log"]],
    }


def event_row(event: dict) -> dict:
    return {"event_id": event["_id"], "type": event["type"], "data": event["data"], "created_at": event["created_at"]}


class AlertsBase(BaseHandler):
    def billing_may(self, kind: str) -> None:
        """A billing member writes the alert rules about money only (security/roles.py BILLING_ALERTS)."""
        if self.session.role == roles.BILLING and kind not in roles.BILLING_ALERTS:
            raise ApiError(
                403, roles.refusal(roles.DEVELOPER) + " (billing members: rules about the balance, spend and orders)"
            )

    async def owned_endpoint(self, endpoint_id: str) -> dict:
        endpoint = await self.services.alerts.endpoint(self.current_user, endpoint_id)
        if endpoint is None:
            raise ApiError(404, "Webhook endpoint not found")
        return endpoint

    async def checked_url(self, url: str) -> str:
        """422 for a URL this service will not call (README, SSRF rules); checked again at every connection."""
        refused = await self.services.alerts.refused(url)
        if refused is not None:
            raise ValidationError([error(["body", "url"], f"Refused: {refused}", "value_error")])
        return url


class AlertRulesHandler(AlertsBase):
    @authenticated
    async def get(self) -> None:
        self.send_json([rule_row(r) for r in await self.services.alerts.account_rules(self.current_user)])

    @authenticated
    async def post(self) -> None:
        rule = rule_of(validate_body(self.json_body(), RULE_FIELDS))
        self.billing_may(rule["kind"])
        doc = await self.services.alerts.add_rule(self.current_user, rule, self.member())
        if doc is None:
            raise ApiError(409, f"An account may have {MAX_RULES} alert rules; delete one first")
        self.send_json(rule_row({**doc, "arm_seq": 0, "fired_seq": -1}))


class AlertRuleHandler(AlertsBase):
    @authenticated
    async def delete(self, rule_id: str) -> None:
        if self.session.role == roles.BILLING:
            rule = await self.services.alerts.rule(self.current_user, rule_id)
            if rule is not None:
                self.billing_may(rule["kind"])
        if not await self.services.alerts.delete_rule(self.current_user, rule_id):
            raise ApiError(404, "Alert rule not found")
        self.send_json({"ok": True})


class AlertEventsHandler(AlertsBase):
    @authenticated
    async def get(self) -> None:
        limit = self.query_arg(EVENTS_LIMIT)
        self.send_json([event_row(e) for e in await self.services.alerts.events(self.current_user, limit)])


class WebhooksHandler(AlertsBase):
    @authenticated
    async def get(self) -> None:
        rows = await self.services.alerts.endpoints(self.current_user)
        self.send_json([endpoint_row(e) for e in rows])

    @authenticated
    async def post(self) -> None:
        body = validate_body(self.json_body(), ENDPOINT_FIELDS)
        url = await self.checked_url(body["url"])
        added = await self.services.alerts.add_endpoint(
            self.current_user, url, body.get("description", ""), self.member()
        )
        if added is None:
            raise ApiError(409, f"An account may have {MAX_ENDPOINTS} webhook endpoints; delete one first")
        doc, secret = added
        endpoint_id = doc["_id"]
        # The host only: a receiver's URL may carry its own token in the path or query.
        await self.audit("webhook.created", details={"endpoint_id": endpoint_id, "host": urlsplit(url).hostname})
        self.send_json({**endpoint_row(doc), "secret": secret})


class WebhookHandler(AlertsBase):
    @authenticated
    async def patch(self, endpoint_id: str) -> None:
        await self.owned_endpoint(endpoint_id)
        body = validate_body(self.json_body(), ENDPOINT_PATCH)
        changes: dict = {}
        if "url" in body:
            changes["url"] = await self.checked_url(body["url"])
        if "description" in body:
            changes["description"] = body["description"]
        if "enabled" in body:
            changes["enabled"] = body["enabled"]
        updated = await self.services.alerts.change_endpoint(self.current_user, endpoint_id, changes)
        if updated is None:
            raise ApiError(404, "Webhook endpoint not found")
        self.send_json(endpoint_row(updated))

    @authenticated
    async def delete(self, endpoint_id: str) -> None:
        if not await self.services.alerts.delete_endpoint(self.current_user, endpoint_id):
            raise ApiError(404, "Webhook endpoint not found")
        await self.audit("webhook.deleted", details={"endpoint_id": endpoint_id})
        self.send_json({"ok": True})


class WebhookRollHandler(AlertsBase):
    @authenticated
    async def post(self, endpoint_id: str) -> None:
        endpoint = await self.owned_endpoint(endpoint_id)
        rolled = await self.services.alerts.roll_secret(self.current_user, endpoint)
        if rolled is None:
            raise ApiError(404, "Webhook endpoint not found")
        updated, secret = rolled
        self.send_json({**endpoint_row(updated), "secret": secret})


class WebhookTestHandler(AlertsBase):
    @authenticated
    async def post(self, endpoint_id: str) -> None:
        endpoint = await self.owned_endpoint(endpoint_id)
        wait = await self.services.alerts.send_test(self.current_user, endpoint)
        if wait:
            raise ApiError(
                429,
                f"At most {TESTS_PER_MINUTE} test events a minute; try again in {wait} s",
                {"Retry-After": str(wait)},
            )
        self.send_json({"ok": True})


class WebhookDeliveriesHandler(AlertsBase):
    @authenticated
    async def get(self, endpoint_id: str) -> None:
        await self.owned_endpoint(endpoint_id)
        limit = self.query_arg(EVENTS_LIMIT)
        rows = await self.services.alerts.deliveries(endpoint_id, limit)
        self.send_json([delivery_row(d) for d in rows])


class WebhookRedeliverHandler(AlertsBase):
    @authenticated
    async def post(self, endpoint_id: str, delivery_id: str) -> None:
        await self.owned_endpoint(endpoint_id)
        delivery = await self.services.alerts.redeliver(endpoint_id, delivery_id)
        if delivery is None:
            raise ApiError(404, "Delivery not found, or an attempt is under way")
        self.send_json(delivery_row(delivery))


_ID = r"([A-Za-z0-9_]{1,64})"
routes = [
    (r"/alerts", AlertRulesHandler),
    (r"/alerts/events", AlertEventsHandler),
    (rf"/alerts/{_ID}", AlertRuleHandler),
    (r"/webhooks", WebhooksHandler),
    (rf"/webhooks/{_ID}", WebhookHandler),
    (rf"/webhooks/{_ID}/roll", WebhookRollHandler),
    (rf"/webhooks/{_ID}/test", WebhookTestHandler),
    (rf"/webhooks/{_ID}/deliveries", WebhookDeliveriesHandler),
    (rf"/webhooks/{_ID}/deliveries/([A-Za-z0-9_.]{{1,200}})/redeliver", WebhookRedeliverHandler),
]
