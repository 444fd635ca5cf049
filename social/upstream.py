"""The client of one provider: keep-alive connections (social/http1.py), timeouts, no redirects, a response
size cap, the provider keys (social/provider_keys.py), fair connection slots (social/pool.py) and a circuit
breaker. Several providers are one client each, behind the router (social/providers/router.py)."""

import math
import time
from dataclasses import dataclass

import httptools

from security.throttle import MAX_ENTRIES, SlidingWindows
from social.http1 import ConnectTimeout, Http1Pool, TooLarge
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
    provider: str = ""  # the name of the provider that answered (PROVIDERS; X-Provider)


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
        name: str = "twitterapi",
        headers=None,
    ):
        """`api_key`: one provider key, or [(key, qps)] for a pool of them (UPSTREAM_API_KEYS). `name`: the
        provider's (stamped on its answers); `headers`: its adapter's header lines for a key (default: the
        twitterapi kind's X-API-Key)."""
        self.name = name
        self.base = base_url.rstrip("/") + prefix.rstrip("/")
        self.keys = ProviderKeys([(api_key, 0.0)] if isinstance(api_key, str) else api_key)
        # Header lines per provider key, made once (settings refuse a key with a control character in it).
        self.headers = {key.secret: (headers or _api_key_header)(key.secret) for key in self.keys.keys}
        # Called (status, seconds, account, endpoint) for each key refusal: a request on the wire the call retried.
        self.refused = None
        self.timeout = timeout
        self.breaker = breaker
        self.slots = FairSlots(max_connections)
        self.latency = Latency(timeout)
        self.http = Http1Pool(base_url, connect_timeout, max_body_bytes)
        self.connect_timeout = connect_timeout

    @property
    def latencies(self) -> list[float]:
        """Recent upstream latencies, for percentiles."""
        return self.latency.samples

    async def get(
        self,
        path: str,
        query: str,
        account: str | None = None,
        weight: float = 1.0,
        timeout: float | None = None,
        endpoint: str = "",
    ) -> UpstreamResponse:
        """`account`: whose call this is, so that failures it runs into are attributed to it (Breaker), and
        its share of a full pool or of saturated provider keys is weighed (`weight`: its plan's rate).
        `timeout`: less than the provider's own when the router keeps time for another provider; `endpoint`: our
        path of the call, for the cost ledger (`refused`)."""
        if not self.breaker.allow():
            raise UpstreamError("unavailable", "circuit breaker open")
        # `path` comes from the endpoint table and `query` is the client's query string (already
        # percent-encoded by handlers/social.py), so the upstream host and path can never be chosen by a client.
        url = self.base + path + ("?" + query if query else "")
        try:
            await self.slots.acquire(account or "", weight, self.connect_timeout)
        except PoolFull:
            raise UpstreamError("busy", "no connection to the provider came free") from None
        try:
            # Each refused key is rested (or paced again) and the call tries the next one that has a token,
            # waiting for it if its account is within its share: a few more tries than keys, since paced keys
            # meet the provider's own count at its edge.
            for _attempt in range(len(self.keys.keys) + 2):
                try:
                    key = await self.keys.acquire(account)
                except Saturated as exc:
                    raise UpstreamError("saturated", str(exc), exc.retry_after) from None
                response, retry_after = await self._fetch(url, key.secret, account, timeout or self.timeout)
                if response.status not in REFUSALS or not (self.keys.pooled or response.status == 429):
                    return response
                self.keys.rest(key, response.status, retry_after)  # and the call goes to another key
                if self.refused is not None:
                    self.refused(response.status, response.seconds, account, endpoint or path)
            raise UpstreamError("saturated", "the provider refused every key", self.keys.retry_after(time.monotonic()))
        finally:
            self.slots.release(account or "")

    async def _fetch(
        self, url: str, secret: str, account: str | None, timeout: float
    ) -> tuple[UpstreamResponse, str | None]:
        started = time.perf_counter()
        try:
            answer = await self.http.get(url, self.headers[secret], timeout)
        except ConnectTimeout:
            self.breaker.failure(None)  # the provider did not take the connection: not the call's doing
            raise UpstreamError("timeout", "connect") from None
        except TimeoutError:
            self.breaker.failure(account)  # a slow answer may be the account's own expensive query
            raise UpstreamError("timeout", "answer") from None
        except TooLarge:
            self.breaker.failure(account)
            raise UpstreamError("failed", "response too large") from None
        except (OSError, httptools.HttpParserError) as exc:
            self.breaker.failure(None)
            raise UpstreamError("unreachable", type(exc).__name__) from None
        finally:
            self.latency.observe(time.perf_counter() - started)
        if answer.status >= 500:
            self.breaker.failure(account)
        else:
            self.breaker.success()
        seconds = time.perf_counter() - started
        return UpstreamResponse(answer.status, answer.body, seconds, self.name), answer.retry_after

    def close(self) -> None:
        """Closes every idle connection to the provider."""
        self.http.close()


def _api_key_header(secret: str) -> bytes:
    return f"X-API-Key: {secret}\r\nAccept: application/json\r\n".encode("latin-1")
