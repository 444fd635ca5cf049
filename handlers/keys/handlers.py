"""API keys: list, create (secret shown once), change properties, roll, reveal to the owner, revoke,
development top-up.

Key properties (docs/api.md, "Key properties") restrict what a key may do in the data plane: expires_at,
allowed_endpoints (data paths or group names), allowed_ips (addresses or CIDRs) and a credit budget
(credit_limit per credit_limit_period). Absent or null means unrestricted.
"""

import ipaddress
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime

from handlers.base import BaseHandler, authenticated
from handlers.errors import ApiError, ValidationError, error, missing
from handlers.idempotent import idempotent
from handlers.validation import Field, no_controls, one_of, parse_int, validate_body
from services.keys import BUDGET_FIELDS, PROPERTIES, Refused, row
from social.endpoints import BY_PATH, GROUPS

PERIODS = ("day", "month", "total")
MAX_ENDPOINTS, MAX_IPS, MAX_CREDIT_LIMIT, MAX_GRACE = 100, 100, 10**15, 604_800
MAX_IP_TEXT = 64  # characters of one allowed_ips entry


NAME = Field(
    "name",
    str,
    required=False,
    min_length=1,
    max_length=100,
    check=no_controls,
    description='Absent or null: "default"',
)


def _items(maximum: int) -> Callable:
    def check(value: list, loc: list) -> None:
        if not value:
            raise ValidationError([error(loc, "List should have at least 1 item after validation", "too_short")])
        if len(value) > maximum:
            raise ValidationError([error(loc, f"List should have at most {maximum} items", "too_long")])

    return check


# The list items, the future date and the period are checked by `properties_of` and `check`; the OpenAPI
# document states them (KEY_PROPERTIES in handlers/keys/openapi.py).
PROPERTY_FIELDS = [
    Field("expires_at", str, required=False, min_length=1, max_length=64, description="ISO 8601, in the future"),
    Field("allowed_endpoints", list, required=False, check=_items(MAX_ENDPOINTS)),
    Field("allowed_ips", list, required=False, check=_items(MAX_IPS)),
    Field("credit_limit", int, required=False, minimum=1, maximum=MAX_CREDIT_LIMIT),
    Field("credit_limit_period", str, required=False, check=one_of(PERIODS)),
]
KEY_CREATE = [NAME, *PROPERTY_FIELDS]
KEY_PATCH = KEY_CREATE
ROLL = [Field("grace_seconds", int, minimum=0, maximum=MAX_GRACE, description="Seconds the old key keeps working")]
CREDITS = Field("credits", int, minimum=1, maximum=10**12)  # also the bound of `social-gateway admin credit`
TOP_UP = [CREDITS]
PAGE = Field("limit", int, required=False, default=100, minimum=1, maximum=1000, description="Keys per page")
CURSOR = Field(
    "cursor",
    int,
    required=False,
    minimum=1,
    maximum=10**17,  # far past any key id the counter will reach
    description="X-Next-Cursor of the previous page: the keys after it",
)


def _expiry(value: str, loc: list) -> datetime:
    try:
        if not (value.isascii() and value.isprintable()):
            raise ValueError  # fromisoformat ignores a trailing NUL ("2030-01-01T00:00:00\x00")
        moment = datetime.fromisoformat(value)
        # Converting to UTC can leave the years 1..9999 ("9999-12-31T23:59:59-05:00"): OverflowError.
        moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    except (ValueError, OverflowError):
        raise ValidationError([error(loc, "Input should be a valid ISO 8601 datetime", "datetime_parsing")]) from None
    if moment <= datetime.now(UTC):
        raise ValidationError([error(loc, "Input should be in the future", "datetime_future")])
    return moment


def _endpoints(values: list, loc: list) -> list[str]:
    out, errors = [], []
    for i, value in enumerate(values):
        name = value if isinstance(value, str) else None
        if name in GROUPS or name in BY_PATH:
            if name not in out:
                out.append(name)
        else:
            errors.append(
                error(
                    loc + [i],
                    "Input should be a data path such as '/user/info' or a group: " + ", ".join(GROUPS),
                    "value_error",
                )
            )
    if errors:
        raise ValidationError(errors)
    return out


def _networks(values: list, loc: list) -> list[str]:
    out, errors = [], []
    for i, value in enumerate(values):
        try:
            if not isinstance(value, str) or len(value) > MAX_IP_TEXT:
                raise ValueError
            network = _unmapped(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            errors.append(error(loc + [i], "Input should be an IPv4 or IPv6 address or CIDR network", "ip_any_network"))
            continue
        if network not in out:
            out.append(network)
    if errors:
        raise ValidationError(errors)
    return out


_MAPPED = ipaddress.ip_network("::ffff:0:0/96")


def _unmapped(network) -> str:
    """IPv4-mapped IPv6 (::ffff:10.0.0.0/104) as the IPv4 network it means: the data plane compares a
    mapped client address as IPv4 (security/addresses.py parse_address), which an IPv6 network never holds."""
    if network.version == 6 and network.prefixlen >= 96 and network.subnet_of(_MAPPED):
        return str(ipaddress.ip_network((network.network_address.ipv4_mapped, network.prefixlen - 96)))
    return str(network)


def properties_of(data: dict, fields: list[Field]) -> dict:
    """The body's fields in stored form (validated, normalised); a field sent as null maps to None."""
    if not isinstance(data, dict):
        validate_body(data, fields)  # the 422 for a body that is not an object
    given = validate_body({k: v for k, v in data.items() if v is not None}, fields)
    out: dict = {name: None for name, value in data.items() if value is None}
    errors: list = []
    for name, convert in (("expires_at", _expiry), ("allowed_endpoints", _endpoints), ("allowed_ips", _networks)):
        if name in given:
            try:
                given[name] = convert(given[name], ["body", name])
            except ValidationError as exc:
                errors.extend(exc.errors)
    if errors:
        raise ValidationError(errors)
    return {**out, **given}


def check_budget(final: dict) -> None:
    """A credit limit needs its period and a period needs a limit, in the key's resulting state."""
    limit, period = final.get("credit_limit"), final.get("credit_limit_period")
    if limit is not None and period is None:
        raise ValidationError([missing(["body", "credit_limit_period"])])
    if period is not None and limit is None:
        raise ValidationError([missing(["body", "credit_limit"])])


class KeysBase(BaseHandler):
    async def owned_key(self, key_id: str) -> dict:
        """The caller's key; another account's key or a missing one is 404 (no existence oracle)."""
        account_id = self.current_user
        if re.fullmatch(r"[+-]?\d+", key_id) and not (len(key_id) <= 19 and 0 < int(key_id) < 10**18):
            raise ApiError(404, "Key not found")  # an integer no key can have is unknown, like any other
        key = await self.services.keys.get(account_id, parse_int(key_id, ["path", "key_id"], 1))
        if key is None:
            raise ApiError(404, "Key not found")
        return key

    async def rows(
        self, account_id: str, only: int | None = None, limit: int = 0, before: int | None = None
    ) -> list[dict]:
        """The account's key rows, newest first (or the one key `only`; or `limit` of them with ids below
        `before`) with credits_used in each key's period."""
        return await self.services.keys.rows(account_id, only, limit, before)


class KeysHandler(KeysBase):
    """Lists the account's keys (never secrets) and issues new ones."""

    @authenticated
    async def get(self) -> None:
        """Still a JSON list; a further page is announced in `X-Next-Cursor` and a `Link: rel="next"` header."""
        limit = self.query_arg(PAGE)
        rows = await self.rows(self.current_user, limit=limit + 1, before=self.query_arg(CURSOR))
        if len(rows) > limit:
            rows = rows[:limit]
            after = rows[-1]["key_id"]
            self.set_header("X-Next-Cursor", str(after))
            self.set_header("Link", f'</keys?limit={limit}&cursor={after}>; rel="next"')
        self.send_json(rows)

    @authenticated
    @idempotent
    async def post(self) -> None:
        account_id = self.current_user
        body = properties_of(self.json_body() if self.request.body.strip() else {}, KEY_CREATE)
        check_budget(body)
        try:
            secret, key = await self.services.keys.create(
                account_id, body.pop("name", None) or "default", body, self.member()
            )
        except Refused as exc:
            raise ApiError(409, str(exc)) from None
        self.log_fields["key_id"] = key["key_id"]
        await self.audit("key.created", details={"key_id": key["key_id"], "name": key["name"]})
        # 200, not 201: the spec says every success is HTTP 200.
        self.send_json({**row(key, await self.services.keys.qps(account_id), 0), "key": secret})


class KeyHandler(KeysBase):
    """Changes a key's name and properties (never its secret); null removes a restriction."""

    @authenticated
    async def patch(self, key_id: str) -> None:
        # One PATCH of an account's keys at a time here: keys rolled from one another share one budget,
        # and each change of it must decide from the budget as the one before left it.
        service = self.services.keys
        async with service.one_at_a_time(("key changes", self.current_user)):
            key = await self.owned_key(key_id)
            changes = properties_of(self.json_body(), KEY_PATCH)
            others = await service.others()
            if "name" in changes and changes["name"] is None:
                raise ValidationError([error(["body", "name"], "Input should be a valid string", "string_type")])
            if "credit_limit" in changes and changes["credit_limit"] is None:
                changes["credit_limit_period"] = None  # removing the budget removes its period with it
            if "expires_at" in changes:
                _check_expiry_change(key, changes["expires_at"])
            final = {**{name: key.get(name) for name in PROPERTIES}, **changes}
            check_budget(final)
            if final["credit_limit"] is not None and (
                key.get("credit_limit") is None or final["credit_limit_period"] != key.get("credit_limit_period")
            ):
                # The budget starts again (it was removed) or counts another period: what the key spent meanwhile
                # is in no budget document, so the new run gets its own, counted from the usage (storage/budgets.py).
                changes["budget_epoch"] = time.time_ns() // 1_000_000
            budget = {name: changes.pop(name) for name in BUDGET_FIELDS if name in changes}
            budget_id, changed = key.get("budget_id", key["key_id"]), [key["key_id"]]
            if "budget_epoch" in budget:
                # Its document first, counting what the keys spent (calls in flight included, in every process):
                # no key carries the run before it exists.
                await service.open_budget_run(
                    key["account_id"],
                    budget_id,
                    final["credit_limit"],
                    final["credit_limit_period"],
                    budget["budget_epoch"],
                    others,
                )
            if budget:
                # A change to the budget is a change for all its keys, in one statement.
                changed += await service.change_budget(key["account_id"], budget_id, budget, others)
            doc = await service.update(key["account_id"], key["key_id"], changes, others)  # in force here at once
        if doc is None:
            raise ApiError(404, "Key not found")
        await service.in_force(changed)  # applied by every process before the answer (bounded)
        await self._audit_edit(key, changes, budget)
        self.send_json((await self.rows(key["account_id"], key["key_id"]))[0])

    async def _audit_edit(self, key: dict, changes: dict, budget: dict) -> None:
        """key.edited names the fields changed (their new values, which are no secrets); a budget change
        is its own entry, as it applies to every key of the budget."""
        shown = {n: v.isoformat() if isinstance(v, datetime) else v for n, v in changes.items() if n != "budget_epoch"}
        if shown:
            await self.audit("key.edited", details={"key_id": key["key_id"], "changes": shown})
        if budget:
            limits = {n: v for n, v in budget.items() if n != "budget_epoch"}
            await self.audit("budget.changed", details={"key_id": key["key_id"], **limits})


def _check_expiry_change(key: dict, expires_at: datetime | None) -> None:
    """An expired key stays expired, and a rolled key ends no later than its roll said: revived, a leaked key
    would work again (and a rolled one would be a key past the cap). Ending a grace sooner is allowed."""
    if key.get("expires_at") is not None and key["expires_at"] <= datetime.now(UTC):
        raise ApiError(409, "This API key has expired; its expiry cannot be changed")
    if key.get("rolled_to") is not None and (expires_at is None or expires_at > key["expires_at"]):
        raise ApiError(409, "This API key was rolled; its grace can be shortened, not extended")


class RollHandler(KeysBase):
    """Issues a new secret with the same properties; the old key expires after grace_seconds."""

    @authenticated
    @idempotent
    async def post(self, key_id: str) -> None:
        grace = validate_body(self.json_body(), ROLL)["grace_seconds"]
        account_id = self.current_user
        # Under the lock PATCHes take: the new key copies the budget as the last change left it, and no change
        # decided before the new key exists can miss it.
        service = self.services.keys
        async with service.one_at_a_time(("key changes", account_id)):
            old = await self.owned_key(key_id)
            try:
                secret, new = await service.roll(old, grace, self.member())
            except Refused as exc:
                raise ApiError(409, str(exc)) from None
        await service.in_force([old["key_id"]])  # the old key's end, applied everywhere (bounded)
        self.log_fields["key_id"] = new["key_id"]
        await self.audit(
            "key.rolled", details={"key_id": old["key_id"], "new_key_id": new["key_id"], "grace_seconds": grace}
        )
        rows = {r["key_id"]: r for r in await self.rows(account_id)}
        self.send_json({**rows[new["key_id"]], "key": secret, "rolled_from": old["key_id"]})


class RevealHandler(KeysBase):
    """Returns the full key string to its owner; never a revoked key's (410 Gone: it exists, and stays dead)."""

    @authenticated
    async def get(self, key_id: str) -> None:
        key = await self.owned_key(key_id)
        if key["revoked"]:
            raise ApiError(410, "This key is revoked: its secret is no longer shown")
        await self.audit("key.revealed", details={"key_id": key["key_id"]})  # it hands out the secret
        self.send_json({"key_id": key["key_id"], "key": self.services.keys.secret(key)})


class RevokeHandler(KeysBase):
    """Revokes the key permanently; idempotent; effective before the answer is sent."""

    @authenticated
    async def post(self, key_id: str) -> None:
        key = await self.owned_key(key_id)
        await self.services.keys.revoke(key)  # here, and in every other process (bounded: Meter.in_force)
        if not key["revoked"]:  # revoking again changes nothing: no second entry
            await self.audit("key.revoked", details={"key_id": key["key_id"], "name": key["name"]})
        self.send_json((await self.rows(key["account_id"], key["key_id"]))[0])


class TopUpHandler(KeysBase):
    """Adds credits to the key's account; development only."""

    @authenticated
    @idempotent
    async def post(self, key_id: str) -> None:
        if self.config.production:
            raise ApiError(403, "Direct top-ups are disabled in production; buy credits with a crypto payment")
        key = await self.owned_key(key_id)
        body = validate_body(self.json_body(), TOP_UP)
        view = await self.services.keys.top_up(key["account_id"], body["credits"])
        await self.audit("credit.applied", details={"credits": body["credits"], "via": "development top-up"})
        self.send_json(
            {
                "account_id": key["account_id"],
                "credits_added": body["credits"],
                "credits": await self.services.keys.balance(key["account_id"]),
                "plan": view.plan.name,
                "qps_limit": view.plan.qps,
            }
        )


routes = [
    (r"/keys", KeysHandler),
    (r"/keys/([^/]+)", KeyHandler),
    (r"/keys/([^/]+)/roll", RollHandler),
    (r"/keys/([^/]+)/reveal", RevealHandler),
    (r"/keys/([^/]+)/revoke", RevokeHandler),
    (r"/keys/([^/]+)/topup", TopUpHandler),
]
