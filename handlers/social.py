"""The 30 data endpoints (the spec's 24, six from the provider's documentation): one handler driven by the endpoint table.

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

from accounting.budgets import BudgetExhausted
from accounting.charged import MISS, Joined, wanted
from accounting.idempotency import Answer, Claim
from accounting.keys import KeyEntry
from accounting.meter import LeasesExpired
from handlers.base import ApiError, BaseHandler, NotFoundHandler
from handlers.idempotent import idempotency_key, kept_body, send_replay, start
from handlers.validation import ValidationError, check_length, error, missing, parse_bool, parse_int
from metering.ledger import Reservation, period_end
from metering.limiter import Decision
from metering.plans import Plan
from social.endpoints import (
    CURSOR_MAX,
    CURSOR_PATTERN,
    ENDPOINTS,
    ID_PART,
    STRING_MAX,
    Endpoint,
    page_size,
)
from social.query import normalized_query
from social.upstream import UpstreamError


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
    """The X-API-Key of a request, checked as for a data call to `path` (the endpoint its scope must allow):
    401 missing, unknown, revoked or expired; 403 from an address or for an endpoint the key does not allow.
    Also used by the real-time API (handlers/streams.py), whose polls call `path` (None: no endpoint, as the
    provider's balance call)."""
    secret = handler.request.headers.get("X-API-Key", "").strip()
    if not secret:
        raise ApiError(401, "Missing API key: send it in the X-API-Key header")
    key = await handler.ctx.meter.authenticate(secret)
    if key is None:
        raise ApiError(401, "Invalid API key")
    if key.revoked:
        raise ApiError(401, "This API key has been revoked")
    handler.account_id = key.account_id
    handler.log_fields["key_id"] = key.key_id
    if key.expires_at is not None and time.time() >= key.expires_at:
        raise ApiError(401, "This API key has expired")
    if key.networks is not None and not key.allows(handler.client_ip()):
        raise ApiError(403, "This API key is not allowed from this address")
    if key.scope is not None and path is not None and path not in key.scope:
        raise ApiError(403, "This API key may not call this endpoint")
    return key


class DataHandler(BaseHandler):
    """A data endpoint: authenticate, limit, validate, reserve, forward, settle, record."""

    def initialize(self, ctx, endpoint: Endpoint) -> None:
        super().initialize(ctx)
        self.endpoint = endpoint
        self.log_fields["route"] = "/social" + endpoint.path

    def error_body(self, status: int, message: str) -> dict:
        return {"status": "error", "msg": message}

    def prepare(self) -> None:
        """No session: a data call is authenticated by its API key alone (BaseHandler.prepare reads the bearer
        token and the cookies for the portal)."""

    async def get(self) -> None:
        ctx = self.ctx
        if ctx.draining:
            self.keep_header("Connection", "close")
            raise ApiError(503, "The gateway is restarting; retry shortly", {"Retry-After": "1"})
        key = await self.authenticate()
        view = await ctx.meter.account_view(key.account_id)
        if view.suspended:  # by an admin (handlers/admin_accounts.py); reaches every process (coherence)
            raise ApiError(403, "This account is suspended; its keys are refused until an admin resumes it")
        self.rate_limit(key, view.plan)
        try:
            await self.serve(key, view.plan)
        except Exception as exc:
            # Only a call the provider answered (its data, its 4xx, the 502/504 of its failures) or a replay
            # keeps the tokens it took: a refused call gives them back, so refusals never cost a client its rate.
            if not (isinstance(exc, ApiError) and exc.status_code in (502, 504)):
                key_rate, account_rate = _rates(view.plan, ctx.settings.qps_divisor)
                self.rate_headers(
                    *ctx.limiter.give_back_both(key.key_id, key_rate, key.account_id, account_rate, time.monotonic()),
                    key_rate,
                    account_rate,
                )
            raise

    async def serve(self, key: KeyEntry, plan: Plan) -> None:
        ctx, endpoint = self.ctx, self.endpoint
        self.failure_budget(key.account_id)
        args = parse_args(endpoint, self.request.query_arguments)
        idempotency = idempotency_key(self)
        if not endpoint.available:
            ctx.meter.record(key, self.log_fields["route"], 501, 0, self.request_id)
            raise ApiError(501, "This endpoint is announced but not available yet; it is never charged")
        if ctx.meter.buffer.full:
            raise ApiError(503, "Usage cannot be recorded right now; retry shortly", {"Retry-After": "1"})
        query = upstream_query(endpoint, self.request.query_arguments, args)
        if idempotency is None:
            return await self.call(key, plan, args, query, None)
        # The endpoint and the query as forwarded, in its normal form: a repeat spelling them differently (another
        # order, encoding or prefix) is the same request.
        found = await start(self, key.account_id, idempotency, f"GET {endpoint.path}?{normalized_query(query)}")
        if isinstance(found, Answer):
            return self.replay(key, found)
        try:
            await self.call(key, plan, args, query, found)
        finally:
            if not found.ended:
                await ctx.idempotency.end(found, None)  # nothing kept: a retry with the key runs again

    def replay(self, key: KeyEntry, answer: Answer) -> None:
        """A repeat of a kept answer: charged 0, recorded as a call of its own that points at the first."""
        body = kept_body(answer)
        self.ctx.meter.record(key, self.log_fields["route"], answer.status, 0, self.request_id, answer.request_id)
        self.log_fields["credits"] = 0
        self.set_header("X-Credits-Charged", "0")
        send_replay(self, answer, body)

    async def call(self, key: KeyEntry, plan: Plan, args: dict, query: str, claim: Claim | None) -> None:
        ctx, endpoint = self.ctx, self.endpoint
        size = page_size(endpoint, args)
        _, least = ctx.calls.bounds(endpoint, size)
        rate = plan.account_qps / ctx.settings.qps_divisor
        limit = ctx.in_flight.limit(rate, ctx.upstream.latency.horizon)
        if not ctx.in_flight.enter(key.account_id, limit):
            raise ApiError(
                429,
                f"Too many calls of this account under way at once (at most {limit}); retry shortly",
                {"Retry-After": "1"},
            )
        try:
            try:
                reservation = await ctx.calls.reserve(key.account_id, endpoint, size, key)
            except LeasesExpired:
                raise ApiError(
                    503, "Credits cannot be checked right now; retry shortly", {"Retry-After": "1"}
                ) from None
            except BudgetExhausted:
                raise ApiError(402, _budget_message(key, least)) from None
            if reservation is None:
                raise ApiError(
                    402, f"Insufficient credits: this call needs at least {least} credits; top up your account"
                )
            await self.forward(key, reservation, size, query, rate, claim, args.get("cursor"))
        finally:
            ctx.in_flight.leave(key.account_id)

    async def authenticate(self) -> KeyEntry:
        return await api_key(self, self.endpoint.path)

    def rate_limit(self, key: KeyEntry, plan: Plan) -> None:
        key_rate, account_rate = _rates(plan, self.ctx.settings.qps_divisor)
        per_key, per_account = self.ctx.limiter.take_both(
            key.key_id, key_rate, key.account_id, account_rate, time.monotonic()
        )
        self.rate_headers(per_key, per_account, key_rate, account_rate)
        if not per_key.allowed:
            raise ApiError(
                429,
                f"Rate limit exceeded: {plan.qps:g} requests per second for this key",
                {"Retry-After": str(per_key.retry_after)},
            )
        if not per_account.allowed:
            raise ApiError(
                429,
                f"Rate limit exceeded: {plan.account_qps:g} requests per second for this account (all its keys)",
                {"Retry-After": str(per_account.retry_after)},
            )

    def rate_headers(self, per_key: Decision, per_account: Decision, key_rate: float, account_rate: float) -> None:
        # The IETF httpapi draft's fields (structured fields), and the X-RateLimit-* that clients know.
        self.keep_header("RateLimit-Policy", _policy(per_key.limit, key_rate, per_account.limit, account_rate))
        self.keep_header(
            "RateLimit",
            f'"key";r={per_key.remaining};t={per_key.reset}, "account";r={per_account.remaining};t={per_account.reset}',
        )
        # Strings, not ints: Tornado checks a non-str value against numbers.Integral (an ABC check) per header.
        self.keep_header("X-RateLimit-Limit", str(per_key.limit))
        self.keep_header("X-RateLimit-Remaining", str(per_key.remaining))
        self.keep_header("X-RateLimit-Reset", str(per_key.reset))
        self.keep_header("X-RateLimit-Account-Limit", str(per_account.limit))
        self.keep_header("X-RateLimit-Account-Remaining", str(per_account.remaining))
        self.keep_header("X-RateLimit-Account-Reset", str(per_account.reset))

    def failure_budget(self, account_id: str) -> None:
        # Failed calls are free: an account whose calls keep failing upstream is slowed down on its own.
        wait = self.ctx.failure_budget.retry_after(account_id, time.monotonic())
        if wait:
            raise ApiError(
                429,
                "Too many of this account's calls failed at the data provider; retry later",
                {"Retry-After": str(wait)},
            )

    async def forward(
        self,
        key: KeyEntry,
        reservation: Reservation,
        size: int,
        query: str,
        rate: float,
        claim: Claim | None,
        cursor: str | None,
    ) -> None:
        ctx, endpoint, route = self.ctx, self.endpoint, self.log_fields["route"]
        calls = ctx.calls
        want = wanted(self.request.headers.get("Cache-Control", ""))
        try:
            fetched = await calls.fetch(
                ctx.upstream, reservation, endpoint, query, size, rate, want=want, cursor=cursor
            )
        except UpstreamError as exc:  # the reservation is released
            self.keep_header("X-Cache", "MISS")
            if exc.kind in ("timeout", "failed") and not isinstance(exc, Joined):
                ctx.failure_budget.failed(key.account_id, time.monotonic())
            status, message = _UPSTREAM_ERRORS.get(exc.kind, _UPSTREAM_FAILED)
            calls.record(key, route, None, status, 0, self.request_id)
            if status != 429:
                ctx.metrics.upstream_errors += 1
            retry = {"Retry-After": str(exc.retry_after)} if status in (429, 503) else None
            raise ApiError(status, message, retry) from None
        self.keep_header("X-Cache", fetched.cache.upper())
        if fetched.age is not None:
            self.set_header("Age", str(fetched.age))
        status = fetched.status
        if status in (401, 402, 403) or status >= 500:
            # The provider refusing our key (credentials, credit) is ours, not the client's: never pass it
            # off as a bad client key or an empty balance.
            calls.release(fetched)
            if status >= 500 and fetched.cache == MISS:  # the call that reached the provider, not its joiners
                ctx.failure_budget.failed(key.account_id, time.monotonic())
            calls.record(key, route, fetched, 502, 0, self.request_id)
            ctx.metrics.upstream_errors += 1
            raise ApiError(502, "The data provider failed; you were not charged")
        # A keyed answer is kept before it is charged and recorded: a repeat can then only find it kept.
        # One that cannot be kept (its claim taken over) is not charged: a repeat may run and be charged.
        if fetched.cost and claim is not None:
            if not await ctx.idempotency.end(claim, Answer(status, fetched.body, fetched.cost, self.request_id)):
                fetched.cost = 0
        charged = calls.settle(fetched)  # 0 for an upstream 4xx or an error body: passed through, not charged
        calls.record(key, route, fetched, status, charged, self.request_id)
        if fetched.guarded:
            self.set_header("X-Crawl-Guard", "repeated-cursor")
        self.log_fields["credits"] = charged
        self.set_header("X-Credits-Charged", str(charged))
        self.set_status(status)
        self.finish(fetched.body)


def _rates(plan: Plan, divisor: float) -> tuple[float, float]:
    """The key's and the account's rates in this process: without nginx routing each key to one process,
    every process gets its share of the limits (QPS_DIVISOR)."""
    return plan.qps / divisor, plan.account_qps / divisor


@functools.lru_cache(maxsize=64)
def _policy(key_limit: int, key_rate: float, account_limit: int, account_rate: float) -> str:
    """RateLimit-Policy: each bucket holds `q` calls and fills again in `w` seconds (1 call / 5 s: q=1;w=5)."""
    return (
        f'"key";q={key_limit};w={max(1, round(key_limit / key_rate))}, '
        f'"account";q={account_limit};w={max(1, round(account_limit / account_rate))}'
    )


_UPSTREAM_FAILED = (502, "The data provider failed; you were not charged")
_UPSTREAM_ERRORS = {
    "timeout": (504, "The data provider did not answer in time; you were not charged"),
    "unavailable": (503, "The data provider is failing; retry shortly; you were not charged"),
    "busy": (503, "Every connection to the data provider is busy; retry shortly; you were not charged"),
    # The provider's rate (every provider key at its rate, or one answering 429) reached: the
    # gateway's own 429, so clients back off as from any rate limit; never the provider's answer.
    "saturated": (429, "The data provider's rate is reached; retry after Retry-After; you were not charged"),
}
_PER = {"day": "per day (UTC)", "month": "per month (UTC)", "total": "in total"}


def _budget_message(key: KeyEntry, least: int) -> str:
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
        return {
            "status": "error",
            "msg": "Unknown data endpoint; GET /openapi.json lists them" if status == 404 else message,
        }


# After the table's exact paths: every other path under the prefix, and the bare prefix.
routes = [("/social" + e.path, DataHandler, {"endpoint": e}) for e in ENDPOINTS] + [
    (r"/social(?:/.*)?", UnknownDataHandler)
]
# The provider's own paths, so existing clients only change their base URL.
alias_routes = [("/twitter" + e.path, DataHandler, {"endpoint": e}) for e in ENDPOINTS] + [
    (r"/twitter(?:/.*)?", UnknownDataHandler)
]
