"""The pooled upstream client: keep-alive connections (libcurl via Tornado), timeouts,
no redirects, a response size cap and a circuit breaker."""

import time
from dataclasses import dataclass

import pycurl
from tornado.curl_httpclient import CurlAsyncHTTPClient
from tornado.httpclient import HTTPClientError, HTTPRequest

CURLE_OPERATION_TIMEDOUT = 28


def _quiet(curl) -> None:
    """Tornado turns on libcurl's verbose trace when its logger is at DEBUG; the trace prints every
    request header, the upstream credential (X-API-Key) included, into the logs. Never for this client."""
    curl.setopt(pycurl.VERBOSE, 0)


class UpstreamError(Exception):
    """The upstream gave no usable answer. `kind`: timeout, unavailable (breaker open), failed."""

    def __init__(self, kind: str, detail: str = ""):
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


@dataclass(frozen=True)
class UpstreamResponse:
    status: int
    body: bytes
    seconds: float


class Breaker:
    """Opens after `threshold` consecutive failures; after `reset_seconds` lets one trial call through."""

    def __init__(self, threshold: int, reset_seconds: float, clock=time.monotonic):
        self.threshold, self.reset_seconds, self.clock = threshold, reset_seconds, clock
        self.failures = 0
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

    def failure(self) -> None:
        self.failures += 1
        self.trial_running = False
        if self.failures >= self.threshold or self.opened_at is not None:
            self.opened_at = self.clock()


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

    async def get(self, path: str, query: str) -> UpstreamResponse:
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
            self.breaker.failure()
            timed_out = getattr(exc, "errno", None) == CURLE_OPERATION_TIMEDOUT
            raise UpstreamError("timeout" if timed_out else "failed", type(exc).__name__) from None
        finally:
            self._observe(time.perf_counter() - started)
        seconds = time.perf_counter() - started
        if size[0] > self.max_body_bytes:
            self.breaker.failure()
            raise UpstreamError("failed", "response too large")
        if response.code >= 500:
            self.breaker.failure()
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
