"""The pooled upstream client: keep-alive connections (libcurl via Tornado), timeouts,
no redirects, a response size cap and a circuit breaker."""

import math
import time
from dataclasses import dataclass

import pycurl
from tornado.curl_httpclient import CurlAsyncHTTPClient
from tornado.httpclient import HTTPClientError, HTTPRequest

from security.throttle import MAX_ENTRIES, SlidingWindows

CURLE_OPERATION_TIMEDOUT = 28


def _quiet(curl) -> None:
    """Tornado turns on libcurl's verbose trace when its logger is at DEBUG; the trace prints every
    request header, the upstream credential (X-API-Key) included, into the logs. Never for this client."""
    curl.setopt(pycurl.VERBOSE, 0)


class UpstreamError(Exception):
    """The upstream gave no usable answer. `kind`: timeout, unavailable (breaker open), unreachable
    (connection refused or reset), failed."""

    def __init__(self, kind: str, detail: str = ""):
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


@dataclass(frozen=True)
class UpstreamResponse:
    status: int
    body: bytes
    seconds: float


class Breaker:
    """The shared circuit breaker: opens only on evidence that the provider itself is down.

    It opens after `threshold` failures in a run (any success ends the run). A failure with no
    account (transport: connection refused or reset, the provider not there at all) always counts.
    A failure an account's call ran into (a 5xx answer, a timeout, an oversize body) may be caused
    by that account's own queries: each account counts for at most threshold / `min_accounts`
    failures of the run, so it takes failures spread over at least `min_accounts` accounts to open
    it; one tenant's failing calls never open it for everybody (they meet the per-account
    FailureBudget instead). After `reset_seconds` an open breaker lets one trial call through."""

    def __init__(self, threshold: int, reset_seconds: float, clock=time.monotonic, min_accounts: int = 3):
        self.threshold, self.reset_seconds, self.clock = threshold, reset_seconds, clock
        self.share = math.ceil(threshold / max(1, min_accounts))  # most one account counts for
        self.failures = 0  # failures that count, in the current run
        self.by_account: dict[str, int] = {}  # the run's failures per account
        self.opened_at: float | None = None
        self.trial_running = False

    @property
    def state(self) -> str:
        if self.opened_at is None:
            return "closed"
        return "half-open" if self.clock() - self.opened_at >= self.reset_seconds else "open"

    def allow(self) -> bool:
        state = self.state
        if state == "closed":
            return True
        if state == "half-open" and not self.trial_running:
            self.trial_running = True
            return True
        return False

    def success(self) -> None:
        self.failures, self.opened_at, self.trial_running = 0, None, False
        self.by_account.clear()

    def failure(self, account: str | None = None) -> None:
        self.trial_running = False
        if account is None:
            self.failures += 1
        else:
            seen = self.by_account.get(account, 0)
            if seen < self.share:
                self.failures += 1
                if len(self.by_account) < 4 * self.threshold:  # more accounts than this: opening anyway
                    self.by_account[account] = seen + 1
        if self.failures >= self.threshold or self.opened_at is not None:
            self.opened_at = self.clock()


class FailureBudget:
    """Per account: at most `limit` failed upstream calls in `window` seconds, then 429 until the oldest
    one leaves the window. Failed calls are free, so without it one account could keep the provider
    (and the shared connection pool) busy with calls it knows will fail."""

    def __init__(self, limit: int, window: float):
        self.windows = SlidingWindows(limit, window, MAX_ENTRIES)

    def retry_after(self, account: str, now: float) -> int:
        wait = self.windows.retry_after(account, now)
        return max(1, math.ceil(wait)) if wait > 0 else 0

    def failed(self, account: str, now: float) -> None:
        self.windows.add(account, now)


class InFlight:
    """Per account: upstream calls under way. The pool of connections to the provider is shared, so
    one account's slow calls could otherwise hold every connection while everybody else's queue."""

    def __init__(self, limit: int):
        self.limit = limit
        self.calls: dict[str, int] = {}

    def enter(self, account: str) -> bool:
        """Takes a slot for one call of `account`; False (nothing taken) when it has `limit` under way."""
        under_way = self.calls.get(account, 0)
        if under_way >= self.limit:
            return False
        self.calls[account] = under_way + 1
        return True

    def leave(self, account: str) -> None:
        left = self.calls[account] - 1
        if left:
            self.calls[account] = left
        else:
            del self.calls[account]  # bounded by the accounts with calls under way


class UpstreamClient:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        prefix: str,
        connect_timeout: float,
        timeout: float,
        max_connections: int,
        max_body_bytes: int,
        breaker: Breaker,
    ):
        self.base = base_url.rstrip("/") + prefix.rstrip("/")
        self.api_key = api_key
        self.connect_timeout, self.timeout, self.max_body_bytes = connect_timeout, timeout, max_body_bytes
        self.breaker = breaker
        self.http = CurlAsyncHTTPClient(force_instance=True, max_clients=max_connections)
        self.latencies: list[float] = []  # recent upstream latencies, for percentiles

    async def get(self, path: str, query: str, account: str | None = None) -> UpstreamResponse:
        """`account`: whose call this is, so that failures it runs into are attributed to it (Breaker)."""
        if not self.breaker.allow():
            raise UpstreamError("unavailable", "circuit breaker open")
        chunks: list[bytes] = []
        size = [0]

        def collect(chunk: bytes) -> None:
            size[0] += len(chunk)
            if size[0] <= self.max_body_bytes:  # past the cap, keep reading but stop storing
                chunks.append(chunk)

        # `path` comes from the endpoint table and `query` is the client's query string,
        # so the upstream host and path can never be chosen by a client.
        url = self.base + path + ("?" + query if query else "")
        request = HTTPRequest(
            url,
            headers={"X-API-Key": self.api_key, "Accept": "application/json"},
            connect_timeout=self.connect_timeout,
            request_timeout=self.timeout,
            follow_redirects=False,
            streaming_callback=collect,
            decompress_response=True,
            prepare_curl_callback=_quiet,
        )
        started = time.perf_counter()
        try:
            # raise_error=False still raises for transport failures (HTTP 599): connect, reset, timeout.
            response = await self.http.fetch(request, raise_error=False)
        except (HTTPClientError, OSError) as exc:
            timed_out = getattr(exc, "errno", None) == CURLE_OPERATION_TIMEDOUT
            # A timeout may be the account's own expensive query; a refused or reset connection is not.
            self.breaker.failure(account if timed_out else None)
            raise UpstreamError("timeout" if timed_out else "unreachable", type(exc).__name__) from None
        finally:
            self._observe(time.perf_counter() - started)
        seconds = time.perf_counter() - started
        if size[0] > self.max_body_bytes:
            self.breaker.failure(account)
            raise UpstreamError("failed", "response too large")
        if response.code >= 500:
            self.breaker.failure(account)
        else:
            self.breaker.success()
        return UpstreamResponse(response.code, b"".join(chunks), seconds)

    def _observe(self, seconds: float) -> None:
        self.latencies.append(seconds)
        if len(self.latencies) > 4096:
            del self.latencies[:2048]

    def close(self) -> None:
        if self.http is not None:
            self.http.close()
            self.http = None
