"""The pooled upstream client: keep-alive connections (aiohttp's client), timeouts, no redirects, a
response size cap, the provider keys (social/provider_keys.py), fair connection slots (social/pool.py)
and a circuit breaker.

Why aiohttp's client: against a provider answering in 0.7 s its cost per call stays flat with the
calls in flight (measured: +20 ms at 100 in flight, +22 at 400), where libcurl through Tornado's
CurlAsyncHTTPClient added delay in proportion (+70 ms at 100, +155 at 400: its multi handle is driven
through one Tornado callback per socket event and a timer per transfer). It logs no request line,
header or URL at any level: customers' query text and the provider key never reach the logs.
"""

import asyncio
import math
import time
from dataclasses import dataclass

import aiohttp
from yarl import URL

from security.throttle import MAX_ENTRIES, SlidingWindows
from social.pool import FairSlots, Latency, PoolFull
from social.provider_keys import ProviderKeys, Saturated

REFUSALS = frozenset((401, 402, 403, 429))  # the provider refusing our key, not the customer's query


class UpstreamError(Exception):
    """The upstream gave no usable answer. `kind`: timeout, unavailable (breaker open), unreachable
    (connection refused or reset), failed, busy (no pool connection came free), saturated (every
    provider key at its rate or refusing; `retry_after` seconds)."""

    def __init__(self, kind: str, detail: str = "", retry_after: int = 1):
        super().__init__(f"{kind}: {detail}")
        self.kind, self.retry_after = kind, retry_after


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


class UpstreamClient:
    def __init__(
        self,
        base_url: str,
        api_key: str | list[tuple[str, float]],
        prefix: str,
        connect_timeout: float,
        timeout: float,
        max_connections: int,
        max_body_bytes: int,
        breaker: Breaker,
    ):
        """`api_key`: one provider key, or [(key, qps)] for a pool of them (UPSTREAM_API_KEYS)."""
        self.base = base_url.rstrip("/") + prefix.rstrip("/")
        self.keys = ProviderKeys([(api_key, 0.0)] if isinstance(api_key, str) else api_key)
        self.connect_timeout, self.timeout, self.max_body_bytes = connect_timeout, timeout, max_body_bytes
        self.breaker = breaker
        self.slots = FairSlots(max_connections)
        self.latency = Latency(timeout)
        self.session: aiohttp.ClientSession | None = None  # made on first use, inside the running loop
        self.max_connections = max_connections

    @property
    def latencies(self) -> list[float]:
        """Recent upstream latencies, for percentiles."""
        return self.latency.samples

    def _session(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=self.max_connections,  # FairSlots hands out the same number first: aiohttp never queues
            limit_per_host=0,
            keepalive_timeout=60,
            ttl_dns_cache=60,
        )
        return aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=self.timeout, sock_connect=self.connect_timeout),
            cookie_jar=aiohttp.DummyCookieJar(),  # nothing one customer's call sets reaches another's
            auto_decompress=True,
            trust_env=False,
            skip_auto_headers=("User-Agent",),
            headers={"Accept": "application/json"},
        )

    async def get(self, path: str, query: str, account: str | None = None, weight: float = 1.0) -> UpstreamResponse:
        """`account`: whose call this is, so that failures it runs into are attributed to it (Breaker), and
        its share of a full pool or of saturated provider keys is weighed (`weight`: its plan's rate)."""
        if not self.breaker.allow():
            raise UpstreamError("unavailable", "circuit breaker open")
        # `path` comes from the endpoint table and `query` is the client's query string (already
        # percent-encoded by handlers/social.py), so the upstream host and path can never be chosen by a client.
        url = URL(self.base + path + ("?" + query if query else ""), encoded=True)
        if self.session is None:
            self.session = self._session()
        try:
            await self.slots.acquire(account or "", weight, self.connect_timeout)
        except PoolFull:
            raise UpstreamError("busy", "no connection to the provider came free") from None
        try:
            for _attempt in range(len(self.keys.keys)):
                try:
                    key = await self.keys.acquire(account)
                except Saturated as exc:
                    raise UpstreamError("saturated", str(exc), exc.retry_after) from None
                response, retry_after = await self._fetch(url, key.secret, account)
                if response.status not in REFUSALS or not (self.keys.pooled or response.status == 429):
                    return response
                self.keys.rest(key, response.status, retry_after)  # and the call goes to another key
            raise UpstreamError("saturated", "the provider refused every key", self.keys.retry_after(time.monotonic()))
        finally:
            self.slots.release(account or "")

    async def _fetch(self, url: URL, secret: str, account: str | None) -> tuple[UpstreamResponse, str | None]:
        started = time.perf_counter()
        try:
            async with self.session.get(url, headers={"X-API-Key": secret}, allow_redirects=False) as response:
                body = await self._read(response)
                status, retry_after = response.status, response.headers.get("Retry-After")
        except TimeoutError as exc:
            # A slow answer may be the account's own expensive query; a connection that never opened is not.
            self.breaker.failure(None if isinstance(exc, aiohttp.ConnectionTimeoutError) else account)
            raise UpstreamError("timeout", type(exc).__name__) from None
        except (aiohttp.ClientError, OSError) as exc:
            self.breaker.failure(None)
            raise UpstreamError("unreachable", type(exc).__name__) from None
        finally:
            self.latency.observe(time.perf_counter() - started)
        if body is None:
            self.breaker.failure(account)
            raise UpstreamError("failed", "response too large")
        if status >= 500:
            self.breaker.failure(account)
        else:
            self.breaker.success()
        return UpstreamResponse(status, body, time.perf_counter() - started), retry_after

    async def _read(self, response: aiohttp.ClientResponse) -> bytes | None:
        """The body, or None past max_body_bytes (the connection is then dropped, not drained)."""
        declared = response.content_length
        if declared is not None and declared > self.max_body_bytes:
            response.close()
            return None
        if declared is not None and not response.headers.get("Content-Encoding"):
            return await response.read()  # bounded by the declared length, which aiohttp enforces
        chunks, size = [], 0
        async for chunk in response.content.iter_any():
            size += len(chunk)
            if size > self.max_body_bytes:
                response.close()
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    def close(self) -> asyncio.Future | None:
        """Closes every pooled connection; awaiting the answer waits for them to be closed."""
        session, self.session = self.session, None
        if session is None or session.closed:
            return None
        return asyncio.ensure_future(session.close())
