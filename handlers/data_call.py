"""One data call (a GET of a data endpoint), served straight on its HTTP/1 connection: the checks in their order
(handlers/social.py's docstring), the provider call through `Calls`, and the answer written with
`write_headers` once the call's usage record is on disk (its journal group, accounting/journal.py). No RequestHandler, HTTPServerRequest or routing: `handlers/data_plane.py` hands a call here once
its head is read. Every other request, and any other method on these paths, goes to web.Application.

What a client sees is what a RequestHandler of this application answers (handlers/base.py): the same default
and kept headers (request id, rate limits, X-Cache stay on an error), the same error bodies and status phrases
(`error_answer`), the same /metrics counts and access line (`answered`). Only the order of headers differs.
"""

import asyncio
import time

import tornado.web
from tornado import httputil
from tornado.escape import parse_qs_bytes

from accounting.budgets import BudgetExhausted
from accounting.charged import MISS, Joined, wanted
from accounting.idempotency import Answer, Claim
from accounting.keys import KeyEntry
from accounting.meter import LeasesExpired
from handlers.base import answer_headers, answered, client_address, error_answer, log_failure, request_id
from handlers.context import HandlerContext
from handlers.errors import ApiError
from handlers.idempotent import idempotency_key, kept_body, send_replay, start
from handlers.social import (
    UPSTREAM_ERRORS,
    UPSTREAM_FAILED,
    budget_message,
    check_key,
    data_error,
    parse_args,
    policy,
    rates,
    upstream_query,
)
from metering.ledger import Reservation
from metering.limiter import Decision
from metering.plans import Plan
from social.endpoints import Endpoint, page_size
from social.query import normalized_query
from social.upstream import UpstreamError

_NO_BODY = (204, 304)  # and 1xx: Tornado refuses a body with these (RequestHandler.finish), so a call does too


class DataCall:
    """A data endpoint: authenticate, limit, validate, reserve, forward, settle, record; then answer."""

    __slots__ = (
        "ctx",
        "conn",
        "endpoint",
        "headers",
        "path",
        "query",
        "started",
        "request_id",
        "account_id",
        "log_fields",
        "kept",
        "out",
        "status",
        "reason",
        "done",
        "task",
        "via",
        "durable",
        "answer",
    )

    def __init__(
        self, ctx: HandlerContext, conn, endpoint: Endpoint, headers: httputil.HTTPHeaders, path: str, query: str
    ):
        self.ctx, self.conn, self.endpoint, self.headers, self.path, self.query = (
            ctx,
            conn,
            endpoint,
            headers,
            path,
            query,
        )
        self.started = time.perf_counter()
        self.request_id = request_id(headers.get("X-Request-ID", ""))
        self.account_id: str | None = None
        self.log_fields: dict = {"route": "/social" + endpoint.path}  # the alias paths count as their /social one
        self.kept = {"X-Request-ID": self.request_id}  # headers that stay on the answer when an error replaces it
        self.out = dict(self.kept)  # the answer's own headers, in the order set
        self.status, self.reason, self.done = 200, "OK", False
        self.via: tuple[str, str] | None = None  # how the call came, when not over REST: ("mcp", its tool)
        self.durable: asyncio.Future | None = None  # the journal group of the call's usage record (Meter.record)
        self.answer: tuple | None = None  # (status line, headers, body) until the record is on disk

    # --- the exchange: what the checks and the shared helpers (send_replay, check_key) write to --------------
    def set_header(self, name: str, value: str) -> None:
        self.out[name] = value

    def keep_header(self, name: str, value: str) -> None:
        """A header that stays on the answer even when an error replaces it (request id, rate limits)."""
        self.kept[name] = value
        self.out[name] = value

    def set_status(self, status: int, reason: str | None = None) -> None:
        self.status, self.reason = status, reason or httputil.responses.get(status, "Unknown")

    def client_ip(self) -> str:
        return client_address(self.conn.context.remote_ip, self.headers, self.ctx.state.settings.trusted_proxies)

    def finish(self, body: bytes) -> None:
        """Makes the answer (sent by `run`): the defaults every answer carries (handlers/base.py BaseHandler), then
        its own."""
        status = self.status
        if status in _NO_BODY or 100 <= status < 200:
            raise RuntimeError(f"Cannot send body with status code HTTP{status}")
        headers = answer_headers(self.out, body)
        self.done = True
        self.answer = (httputil.ResponseStartLine("", status, self.reason), headers, body)

    def send(self) -> None:
        """Writes the answer on the connection and counts it."""
        start_line, headers, body = self.answer
        self.conn.write_headers(start_line, headers, body)
        self.conn.finish()
        answered(
            self.ctx,
            "GET",
            self.log_fields["route"],
            start_line.code,
            self.started,
            self.request_id,
            self.client_ip,
            self.account_id,
            self.log_fields,
        )

    async def run(self) -> None:
        """The call, then its answer: only once its usage record is on disk, whatever kills the process after."""
        try:
            await self.get()
        except Exception as exc:
            log_failure("GET", self.path, self.request_id, exc)
            if not self.done:
                self.fail(exc)
        if self.durable is not None:
            try:
                await self.durable
            except Exception:  # logged and counted by the journal: the record is still flushed as ever
                pass
        if self.answer is not None:
            try:
                self.send()
            except Exception as exc:  # a CR or LF in a header: never a split answer
                log_failure("GET", self.path, self.request_id, exc)

    def fail(self, exc: Exception) -> None:
        """The error answer: only the kept headers stay (as RequestHandler.send_error clears the rest)."""
        http = isinstance(exc, tornado.web.HTTPError)
        self.set_status(exc.status_code if http else 500, exc.reason if http else None)
        status, headers, body = error_answer(exc, self.status, self.reason, data_error)
        if status != self.status:
            self.set_status(status)
        self.out = {**self.kept, **headers}
        self.finish(body)

    # --- the call ------------------------------------------------------------------------------------------
    async def get(self) -> None:
        ctx = self.ctx
        if ctx.state.draining:
            self.keep_header("Connection", "close")
            raise ApiError(503, "The gateway is restarting; retry shortly", {"Retry-After": "1"})
        key = await check_key(self, self.headers, self.endpoint.path)
        view = await ctx.data.meter.account_view(key.account_id)
        if view.suspended:  # by an admin (handlers/admin/accounts.py); reaches every process (coherence)
            raise ApiError(403, "This account is suspended; its keys are refused until an admin resumes it")
        self.rate_limit(key, view.plan)
        try:
            await self.serve(key, view.plan)
        except Exception as exc:
            # Only a call the provider answered (its data, its 4xx, the 502/504 of its failures) or a replay
            # keeps the tokens it took: a refused call gives them back, so refusals never cost a client its rate.
            if not (isinstance(exc, ApiError) and exc.status_code in (502, 504)):
                key_rate, account_rate = rates(view.plan, ctx.state.settings.qps_divisor)
                self.rate_headers(
                    *ctx.data.limiter.give_back_both(
                        key.key_id, key_rate, key.account_id, account_rate, time.monotonic()
                    ),
                    key_rate,
                    account_rate,
                )
            raise

    async def serve(self, key: KeyEntry, plan: Plan) -> None:
        ctx, endpoint = self.ctx, self.endpoint
        self.failure_budget(key.account_id)
        arguments = parse_qs_bytes(self.query, keep_blank_values=True)  # as Tornado's query_arguments
        args = parse_args(endpoint, arguments)
        idempotency = idempotency_key(self.headers)
        if not endpoint.available:
            self.durable = ctx.data.meter.record(key, self.log_fields["route"], 501, 0, self.request_id, via=self.via)
            raise ApiError(501, "This endpoint is announced but not available yet; it is never charged")
        if ctx.data.meter.buffer.full:
            raise ApiError(503, "Usage cannot be recorded right now; retry shortly", {"Retry-After": "1"})
        query = upstream_query(endpoint, arguments, args)
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
                await ctx.data.idempotency.end(found, None)  # nothing kept: a retry with the key runs again

    def replay(self, key: KeyEntry, answer: Answer) -> None:
        """A repeat of a kept answer: charged 0, recorded as a call of its own that points at the first."""
        body = kept_body(answer)
        self.durable = self.ctx.data.meter.record(
            key,
            self.log_fields["route"],
            answer.status,
            0,
            self.request_id,
            answer.request_id,
            via=self.via,
            provider=answer.provider,
        )
        self.log_fields["credits"] = 0
        self.set_header("X-Credits-Charged", "0")
        if answer.provider:
            self.keep_header("X-Provider", answer.provider)
        send_replay(self, answer, body)

    async def call(self, key: KeyEntry, plan: Plan, args: dict, query: str, claim: Claim | None) -> None:
        ctx, endpoint = self.ctx, self.endpoint
        size = page_size(endpoint, args)
        _, least = ctx.data.calls.bounds(endpoint, size)
        rate = plan.account_qps / ctx.state.settings.qps_divisor
        limit = ctx.data.in_flight.limit(rate, ctx.data.upstream.latency.horizon)
        if not ctx.data.in_flight.enter(key.account_id, limit):
            raise ApiError(
                429,
                f"Too many calls of this account under way at once (at most {limit}); retry shortly",
                {"Retry-After": "1"},
            )
        try:
            try:
                reservation = await ctx.data.calls.reserve(key.account_id, endpoint, size, key)
            except LeasesExpired:
                raise ApiError(
                    503, "Credits cannot be checked right now; retry shortly", {"Retry-After": "1"}
                ) from None
            except BudgetExhausted:
                raise ApiError(402, budget_message(key, least)) from None
            if reservation is None:
                raise ApiError(
                    402, f"Insufficient credits: this call needs at least {least} credits; top up your account"
                )
            cursor = args.get("cursor")  # followers_ids' is an integer: the crawl guard compares it as sent
            await self.forward(key, reservation, size, query, rate, claim, None if cursor is None else str(cursor))
        finally:
            ctx.data.in_flight.leave(key.account_id)

    def rate_limit(self, key: KeyEntry, plan: Plan) -> None:
        key_rate, account_rate = rates(plan, self.ctx.state.settings.qps_divisor)
        per_key, per_account = self.ctx.data.limiter.take_both(
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
        self.keep_header("RateLimit-Policy", policy(per_key.limit, key_rate, per_account.limit, account_rate))
        self.keep_header(
            "RateLimit",
            f'"key";r={per_key.remaining};t={per_key.reset}, "account";r={per_account.remaining};t={per_account.reset}',
        )
        self.keep_header("X-RateLimit-Limit", str(per_key.limit))
        self.keep_header("X-RateLimit-Remaining", str(per_key.remaining))
        self.keep_header("X-RateLimit-Reset", str(per_key.reset))
        self.keep_header("X-RateLimit-Account-Limit", str(per_account.limit))
        self.keep_header("X-RateLimit-Account-Remaining", str(per_account.remaining))
        self.keep_header("X-RateLimit-Account-Reset", str(per_account.reset))

    def failure_budget(self, account_id: str) -> None:
        # Failed calls are free: an account whose calls keep failing upstream is slowed down on its own.
        wait = self.ctx.data.failure_budget.retry_after(account_id, time.monotonic())
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
        calls = ctx.data.calls
        want = wanted(self.headers.get("Cache-Control", ""))
        try:
            fetched = await calls.fetch(
                ctx.data.upstream, reservation, endpoint, query, size, rate, want=want, cursor=cursor
            )
        except UpstreamError as exc:  # the reservation is released
            self.keep_header("X-Cache", "MISS")
            if exc.kind in ("timeout", "failed") and not isinstance(exc, Joined):
                ctx.data.failure_budget.failed(key.account_id, time.monotonic())
            status, message = UPSTREAM_ERRORS.get(exc.kind, UPSTREAM_FAILED)
            self.durable = calls.record(key, route, None, status, 0, self.request_id, self.via)
            if status != 429:
                ctx.runtime.metrics.upstream_errors += 1
            retry = {"Retry-After": str(exc.retry_after)} if status in (429, 503) else None
            raise ApiError(status, message, retry) from None
        self.keep_header("X-Cache", fetched.cache.upper())
        if fetched.provider:  # who produced the answer, a kept one's too (docs/providers.md)
            self.keep_header("X-Provider", fetched.provider)
        if fetched.age is not None:
            self.set_header("Age", str(fetched.age))
        status = fetched.status
        if status in (401, 402, 403) or status >= 500:
            # The provider refusing our key (credentials, credit) is ours, not the client's: never pass it
            # off as a bad client key or an empty balance.
            calls.release(fetched)
            if status >= 500 and fetched.cache == MISS:  # the call that reached the provider, not its joiners
                ctx.data.failure_budget.failed(key.account_id, time.monotonic())
            self.durable = calls.record(key, route, fetched, 502, 0, self.request_id, self.via)
            ctx.runtime.metrics.upstream_errors += 1
            raise ApiError(502, "The data provider failed; you were not charged")
        # A keyed answer is kept before it is charged and recorded: a repeat can then only find it kept.
        # One that cannot be kept (its claim taken over) is not charged: a repeat may run and be charged.
        if fetched.cost and claim is not None:
            if not await ctx.data.idempotency.end(
                claim, Answer(status, fetched.body, fetched.cost, self.request_id, fetched.provider)
            ):
                fetched.cost = 0
        charged = calls.settle(fetched)  # 0 for an upstream 4xx or an error body: passed through, not charged
        self.durable = calls.record(key, route, fetched, status, charged, self.request_id, self.via)
        if fetched.guarded:
            self.set_header("X-Crawl-Guard", "repeated-cursor")
        self.log_fields["credits"] = charged
        self.set_header("X-Credits-Charged", str(charged))
        self.set_status(status)
        self.finish(fetched.body)
