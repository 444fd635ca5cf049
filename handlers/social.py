"""The 30 data endpoints (the spec's 24, six from the provider's documentation), driven by the endpoint table:
their parameters, the API key's check, the answers' wording, and their routes. A GET is served by
handlers/data_call.py, which runs the checks in this order:

Order of checks: key (401) -> expired (401) -> client address (403) -> endpoint
scope (403) -> rate limits of the key and its account (429) -> the account's upstream
failure budget (429) -> input and the Idempotency-Key header (422) -> unavailable (501) -> usage buffer
bound (503) -> with an Idempotency-Key: the first answer replayed, or 422 (another request), 409 (the first
still runs) -> the account's calls under way (429; its plan's rate x the provider's latency) -> credits: the
key's budget, then the account (402) -> upstream. The key's restrictions come pre-parsed with its cached
entry: no database round trip, no allocation for an unrestricted key; nor for a call without an
Idempotency-Key (a keyed one costs two: its claim and its answer). Nothing is charged unless the upstream
answered with data, and a call refused after the rate limits gives their tokens back.
"""

import functools
import re
import time
import urllib.parse
from datetime import UTC, datetime

from accounting.keys import KeyEntry
from handlers.base import BaseHandler, NotFoundHandler
from handlers.errors import ApiError
from handlers.validation import ValidationError, check_length, error, missing, parse_bool, parse_int
from metering.ledger import period_end
from metering.plans import Plan
from social.endpoints import (
    CURSOR_MAX,
    CURSOR_PATTERN,
    ENDPOINTS,
    ID_PART,
    STRING_MAX,
    Endpoint,
)


def parse_args(endpoint: Endpoint, arguments: dict[str, list[bytes]]) -> dict:
    """Validates the parameters the table names (every constraint it states); others are passed upstream untouched."""
    args, errors = {}, []
    for param in endpoint.params:
        loc = ["query", param.name]
        raw = arguments.get(param.name)
        try:
            value = raw[-1].decode("utf-8") if raw else ""  # repeated: the last value counts (and is forwarded)
        except UnicodeDecodeError:
            errors.append(error(loc, "Input should be a valid string", "string_unicode"))
            continue
        if not value.strip():  # blank, Unicode whitespace included: as if absent
            if param.required:
                errors.append(missing(loc))
            continue
        try:
            if param.kind == "int":
                args[param.name] = parse_int(value, loc, param.minimum, param.maximum)
            elif param.kind == "bool":
                args[param.name] = parse_bool(value, loc)
            elif param.kind == "ids":
                args[param.name] = _ids(value, loc, param.maximum)
            elif param.kind == "cursor":
                args[param.name] = _cursor(value, loc)
            elif param.choices:
                args[param.name] = _choice(value, loc, param.choices)
            else:
                check_length(value, loc, 1, STRING_MAX)
                args[param.name] = value
        except ValidationError as exc:
            errors.extend(exc.errors)
    if endpoint.one_of and not any(name in args for name in endpoint.one_of):
        errors.append(error(["query"], f"One of {', '.join(endpoint.one_of)} is required", "missing"))
    if errors:
        raise ValidationError(errors)
    return args


def _choice(value: str, loc: list, choices: tuple[str, ...]) -> str:
    if value not in choices:  # worded like a body field's enumeration (handlers/validation.py)
        raise ValidationError([error(loc, f"Input should be one of {', '.join(choices)}", "enum")])
    return value


def _cursor(value: str, loc: list) -> str:
    # Opaque upstream: refuse only what cannot be a cursor (see social/endpoints.py).
    check_length(value, loc, 1, CURSOR_MAX)
    if not _CURSOR.fullmatch(value):
        raise ValidationError(
            [error(loc, "Cursor should be next_cursor of a previous page (printable ASCII, no spaces)", "value_error")]
        )
    return value


_CURSOR = re.compile(CURSOR_PATTERN)
_ID = re.compile(ID_PART)


def _ids(value: str, loc: list, maximum: int) -> list[str]:
    parts = value.split(",")
    if any(not _ID.fullmatch(part) for part in parts):  # ASCII digits only: str.isdigit() also takes "²" and "٣"
        raise ValidationError([error(loc, "Input should be a comma-separated list of numeric ids", "value_error")])
    if len(parts) > maximum:
        raise ValidationError([error(loc, f"List should have at most {maximum} items", "too_long")])
    return [part.strip(" ") for part in parts]


def upstream_query(endpoint: Endpoint, arguments: dict[str, list[bytes]], args: dict) -> str:
    """The query sent upstream: each table parameter once, as validated and priced (a repeated one's last
    value, a blank one left out), so the provider cannot read a call differently from how it was charged;
    parameters the table does not name are passed as sent."""
    pairs: list[tuple[str, bytes]] = []
    for name, values in arguments.items():  # names are Latin-1 text of the raw bytes (Tornado)
        param = endpoint.param(name)
        if param is None:
            pairs += [(name, value) for value in values]
        elif name in args:
            pairs.append((name, _canonical(args[name], values[-1])))
    return urllib.parse.urlencode(pairs, safe=",", encoding="latin-1")


def _canonical(value, raw: bytes) -> bytes:
    if isinstance(value, bool):
        return b"true" if value else b"false"
    if isinstance(value, int):
        return str(value).encode()
    if isinstance(value, list):
        return ",".join(value).encode()
    return raw  # a string: exactly as sent


async def api_key(handler, path: str | None) -> KeyEntry:
    """The X-API-Key of a request to a RequestHandler, checked as for a data call to `path` (`check_key`).
    Used by the real-time API (handlers/streams/handlers.py), whose polls call `path` (None: no endpoint, as the
    provider's balance call)."""
    return await check_key(handler, handler.request.headers, path)


async def check_key(caller, headers, path: str | None) -> KeyEntry:
    """The X-API-Key in `headers`, checked as for a data call to `path` (the endpoint its scope must allow):
    401 missing, unknown, revoked or expired; 403 from an address or for an endpoint the key does not allow.
    `caller` is a handler or a data call (handlers/data_call.py): its ctx, client_ip(), account_id and
    log_fields, which name the key's account and id from the moment the key is known."""
    secret = headers.get("X-API-Key", "").strip()
    if not secret:
        raise ApiError(401, "Missing API key: send it in the X-API-Key header")
    key = await caller.ctx.data.meter.authenticate(secret)
    if key is None:
        raise ApiError(401, "Invalid API key")
    if key.revoked:
        raise ApiError(401, "This API key has been revoked")
    caller.account_id = key.account_id
    caller.log_fields["key_id"] = key.key_id
    if key.expires_at is not None and time.time() >= key.expires_at:
        raise ApiError(401, "This API key has expired")
    if key.networks is not None and not key.allows(caller.client_ip()):
        raise ApiError(403, "This API key is not allowed from this address")
    if key.scope is not None and path is not None and path not in key.scope:
        raise ApiError(403, "This API key may not call this endpoint")
    return key


def data_error(status: int, message: str) -> dict:
    """The data plane's error body (the portal's is {"detail": ...})."""
    return {"status": "error", "msg": message}


class DataHandler(BaseHandler):
    """A data endpoint's path for any method but GET: 405 (Allow: GET). A GET is served without web.Application
    (handlers/data_plane.py hands it to handlers/data_call.py)."""

    def initialize(self, ctx, endpoint: Endpoint) -> None:
        super().initialize(ctx)
        self.log_fields["route"] = "/social" + endpoint.path

    def error_body(self, status: int, message: str) -> dict:
        return data_error(status, message)

    def prepare(self) -> None:
        """No session: nothing here needs one (BaseHandler.prepare reads the bearer token and the cookies)."""

    async def get(self) -> None:
        """Declares the route's GET (Allow: GET on a 405, the OpenAPI document's check of the routes): every GET of
        a data path is picked before routing (DataPlane), so none reaches here."""
        raise NotImplementedError("a data GET is served by handlers/data_call.py")


def rates(plan: Plan, divisor: float) -> tuple[float, float]:
    """The key's and the account's rates in this process: without nginx routing each key to one process,
    every process gets its share of the limits (QPS_DIVISOR)."""
    return plan.qps / divisor, plan.account_qps / divisor


@functools.lru_cache(maxsize=64)
def policy(key_limit: int, key_rate: float, account_limit: int, account_rate: float) -> str:
    """RateLimit-Policy: each bucket holds `q` calls and fills again in `w` seconds (1 call / 5 s: q=1;w=5)."""
    return (
        f'"key";q={key_limit};w={max(1, round(key_limit / key_rate))}, '
        f'"account";q={account_limit};w={max(1, round(account_limit / account_rate))}'
    )


UPSTREAM_FAILED = (502, "The data provider failed; you were not charged")
UPSTREAM_ERRORS = {
    "timeout": (504, "The data provider did not answer in time; you were not charged"),
    "unavailable": (503, "The data provider is failing; retry shortly; you were not charged"),
    "busy": (503, "Every connection to the data provider is busy; retry shortly; you were not charged"),
    # The provider's rate (every provider key at its rate, or one answering 429) reached: the
    # gateway's own 429, so clients back off as from any rate limit; never the provider's answer.
    "saturated": (429, "The data provider's rate is reached; retry after Retry-After; you were not charged"),
}
_PER = {"day": "per day (UTC)", "month": "per month (UTC)", "total": "in total"}


def budget_message(key: KeyEntry, least: int) -> str:
    ends = period_end(key.period, datetime.now(UTC))
    when = f"; it renews at {ends.isoformat().replace('+00:00', 'Z')}" if ends else ""
    return (
        f"This API key's credit budget is exhausted ({key.credit_limit} credits {_PER[key.period]}{when}); "
        f"this call needs at least {least} credits. The account balance is not the limit: raise or remove "
        "the key's credit_limit"
    )


class UnknownDataHandler(NotFoundHandler):
    """An unknown path under a data prefix: 404 in the data plane's error shape."""

    def error_body(self, status: int, message: str) -> dict:
        return data_error(status, "Unknown data endpoint; GET /openapi.json lists them" if status == 404 else message)


# After the table's exact paths: every other path under the prefix, and the bare prefix.
routes = [("/social" + e.path, DataHandler, {"endpoint": e}) for e in ENDPOINTS] + [
    (r"/social(?:/.*)?", UnknownDataHandler)
]
# The provider's own paths, so existing clients only change their base URL.
alias_routes = [("/twitter" + e.path, DataHandler, {"endpoint": e}) for e in ENDPOINTS] + [
    (r"/twitter(?:/.*)?", UnknownDataHandler)
]


def data_paths(twitter_alias: bool) -> dict[str, Endpoint]:
    """Each data endpoint's exact path (and its alias, when served) -> the endpoint: the GETs served by
    handlers/data_call.py, matched as web.Application's routes above would match them."""
    prefixes = ("/social", "/twitter") if twitter_alias else ("/social",)
    return {prefix + e.path: e for prefix in prefixes for e in ENDPOINTS}
