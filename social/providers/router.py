"""The router: which provider answers a data call (PROVIDERS, PROVIDER_ROUTING), failover to the next one, the
cursors pinned to the provider that issued them, and every attempt reported to the operator's cost ledger.

One UpstreamClient per provider (its own keys, connection pool and breaker; its adapter's headers). A call goes to
the first candidate: `order` takes the providers that serve the endpoint in PROVIDERS order, `cost` the cheapest
first by their cost tables for a full page of the call (unpriced ones last, ties in order). It fails over to the
next candidate on a connection error, a time-out, a 5xx, a 429 (the keys saturated), the provider refusing our key
(401/402/403: our account there, not the customer's query), an answer that cannot be read (too large; its adapter's
502; a pass-through 2xx that is not a JSON object, read only when another provider could answer) or an open
breaker; never on another 4xx or on any
answer the provider gave with data (an empty page is one), and never two at once (both would bill). The call's
deadline is UPSTREAM_TIMEOUT: a candidate followed by another gets at most half of what is left (its key pool's
retries included), so a time-out leaves time for the next one.

Health comes from live traffic only: each client's breaker, and a cooldown here (a provider that failed
COOL_AFTER calls in a row goes after the others for BREAKER_RESET_SECONDS; the first call after that tries it
first again, so a provider that came back has its traffic back). Nothing is ever sent to a provider to probe it.

A cursor handed out while more than one provider is configured is the provider's name, `~`, and its own cursor
(`pin`); a call with such a cursor goes to that provider only, so a crawl never moves (a cursor without a known
name goes to the first provider). With one provider cursors pass untouched, and a call of the pass-through kind
costs what it did: no query parsed, no body read here.
"""

import asyncio
import contextvars
import functools
import time
import urllib.parse

import orjson

from config.settings import Settings, SettingsError, provider_keys
from social.endpoints import ENDPOINTS, Endpoint, read_answer
from social.pool import Latency
from social.providers import KINDS, Attempt, adapter
from social.providers.ledger import Ledger
from social.upstream import REFUSALS, Breaker, UpstreamClient, UpstreamError, UpstreamResponse

FAILOVER = frozenset(("timeout", "unreachable", "unavailable", "busy", "saturated", "failed"))  # failed: too large
UNSENT = frozenset(("unavailable", "busy"))  # nothing reached the provider: no attempt to record
PASS_THROUGH = frozenset(("twitterapi",))  # kinds whose requests and answers are ours as they are
PIN = "~"
COOL_AFTER = 3  # failures in a row that put a provider after the others for a cooldown
DEFAULT = "twitterapi"  # the provider's name when PROVIDERS is unset
# The key refusals of the provider request under way in this task (its client reports each as it comes), held
# until the router knows whether the next provider is asked after the last of them (the ledger's failover flag).
_REFUSED: contextvars.ContextVar[list[Attempt] | None] = contextvars.ContextVar("refused", default=None)


class Costs:
    """What the operator pays a provider (PROVIDERS' `costs`, USD): `call` per request and `item` per item
    returned, overridden per endpoint path ("user/info") or price rule ("tweets") in `by`; a failed request
    (not 2xx) costs its `call` price only when `failed` is true, else nothing. No table: unpriced (0 paid; last
    under cost routing)."""

    def __init__(self, table: dict | None):
        self.priced = table is not None
        table = table or {}
        self.failed = bool(table.get("failed", False))
        by = table.get("by", {})
        self.rates: dict[str, tuple[float, float]] = {}  # endpoint path -> (per call, per item)
        for endpoint in ENDPOINTS:
            row = by.get(endpoint.path.lstrip("/")) or by.get(endpoint.price) or {}
            self.rates[endpoint.path] = (
                float(row.get("call", table.get("call", 0.0))),
                float(row.get("item", table.get("item", 0.0))),
            )

    def paid(self, path: str, items: int, ok: bool) -> float:
        call, item = self.rates.get(path, (0.0, 0.0))
        if ok:
            return call + item * items
        return call if self.failed else 0.0

    def expected(self, path: str, size: int) -> float:
        """A full page's price here (cost routing); unpriced: after every priced provider."""
        if not self.priced:
            return float("inf")
        return self.paid(path, size, True)


class Provider:
    """One provider of PROVIDERS: its client, adapter, costs and health."""

    def __init__(self, name: str, kind: str, client: UpstreamClient, costs: Costs):
        self.name, self.kind, self.client, self.costs = name, kind, client, costs
        self.adapter = adapter(kind)
        self.passes = kind in PASS_THROUGH
        self.failures = 0  # failures in a row
        self.cool_until = 0.0

    def cooling(self, now: float) -> bool:
        return self.failures >= COOL_AFTER and now < self.cool_until

    def failed(self, now: float, cooldown: float) -> None:
        self.failures += 1
        if self.failures >= COOL_AFTER:
            self.cool_until = now + cooldown

    def answered(self) -> None:
        self.failures = 0


class Router:
    def __init__(
        self, providers: list[Provider], routing: str, ledger: Ledger, deadline: float, cooldown: float
    ) -> None:
        self.providers, self.ledger, self.deadline, self.cooldown = providers, ledger, deadline, cooldown
        self.first = providers[0]
        self.single = len(providers) == 1 and self.first.passes  # the call as it was before providers
        self.pins = len(providers) > 1
        self.by_cost = routing == "cost"
        self.named = {p.name: p for p in providers}
        self.serving = {e.path: tuple(p for p in providers if p.adapter.serves(e)) for e in ENDPOINTS}
        # Endpoints whose cursor is an opaque string (pinned); followers_ids' is an integer and cannot carry a name.
        self.pinned_paths = frozenset(
            e.path for e in ENDPOINTS if (c := e.param("cursor")) is not None and c.kind == "cursor"
        )
        for provider in providers:
            provider.client.refused = functools.partial(self._refused, provider)
        # What readers of the one provider read (/metrics' key pool): the first's. The data call's in-flight horizon
        # is the time of whole calls: with several providers, failovers included (the first's own would be a dead
        # provider's millisecond while every call waits on the next one).
        self.latency = self.first.client.latency if len(providers) == 1 else Latency(deadline)
        self.keys = self.first.client.keys
        self.slots = self.first.client.slots

    @property
    def breaker(self) -> Breaker:
        """The breaker readiness reports: the first closed one's (an instance is ready while any provider is)."""
        if len(self.providers) == 1:
            return self.first.client.breaker
        return next(
            (p.client.breaker for p in self.providers if p.client.breaker.state == "closed"), self.first.client.breaker
        )

    @property
    def latencies(self) -> list[float]:
        return self.latency.samples

    # --- the call -------------------------------------------------------------------------------------------
    async def get(
        self, endpoint: Endpoint, query: str, account: str, weight: float = 1.0, size: int = 0
    ) -> UpstreamResponse:
        """The answer to our endpoint and query in our shape, stamped with the provider that gave it
        (`.provider`). Raises UpstreamError when no provider gave one (the last failure)."""
        if self.single:
            return await self.first.client.get(endpoint.path, query, account, weight, None, endpoint.path)
        began = time.perf_counter()
        try:
            return await self._routed(endpoint, query, account, weight, size)
        finally:
            if len(self.providers) > 1:
                self.latency.observe(time.perf_counter() - began)

    async def _routed(self, endpoint: Endpoint, query: str, account: str, weight: float, size: int) -> UpstreamResponse:
        now = time.monotonic()
        end = now + self.deadline
        pinned = None
        if self.pins and endpoint.path in self.pinned_paths and "cursor=" in query:
            pinned, query = self._unpin(query, self.serving.get(endpoint.path, ()))
        candidates = (pinned,) if pinned is not None else self._candidates(endpoint, size, now)
        # Each candidate's request, mapped before any is sent: one whose adapter cannot map this call's parameters
        # (LookupError) is as one that cannot serve the endpoint, and keeps no share of the deadline.
        plans = []
        for provider in candidates:
            try:
                plans.append(
                    (
                        provider,
                        *((endpoint.path, query) if provider.passes else provider.adapter.request(endpoint, query)),
                    )
                )
            except LookupError:
                continue
        if not plans:
            raise UpstreamError("unavailable", "no provider can serve this call")
        failure = None  # the last provider's, raised when none is left
        for i, (provider, path, sent) in enumerate(plans):
            left = end - time.monotonic()
            if left <= 0:
                break
            more = i + 1 < len(plans)
            timeout = min(provider.client.timeout, left / 2 if more else left)
            started = time.perf_counter()
            refused: list[Attempt] = []
            held = _REFUSED.set(refused)
            try:
                # The client's own time-out is per request: a key pool's refusals, each within it, could take the
                # rest of the call's time, so the provider's share bounds them all.
                try:
                    async with asyncio.timeout(timeout):
                        response = await provider.client.get(path, sent, account, weight, timeout, endpoint.path)
                except TimeoutError:
                    raise UpstreamError("timeout", "the provider's share of the call's time") from None
                finally:
                    _REFUSED.reset(held)
            except UpstreamError as exc:
                failover = exc.kind in FAILOVER and more
                # Every key refused: its refusals are the requests sent, the last one the failover; nothing more.
                self._record(refused, failover and exc.kind == "saturated")
                if exc.kind not in UNSENT:
                    if exc.kind != "saturated":
                        seconds = time.perf_counter() - started
                        self._report(provider, endpoint.path, 0, exc.kind, 0, seconds, account, failover)
                    provider.failed(time.monotonic(), self.cooldown)
                if exc.kind not in FAILOVER or not more:
                    raise
                failure = exc
                continue
            self._record(refused, False)
            if not provider.passes:  # in our shape first: an answer its adapter cannot read is a 502, a failure
                status, body = provider.adapter.answer(endpoint, response.status, response.body)
                response = UpstreamResponse(status, body, response.seconds, provider.name)
            status = response.status
            if provider.passes and more and 200 <= status < 300 and read_answer(endpoint, response.body) is None:
                status = 502  # not a JSON object: a failure (as accounting/charged.py would find), while B can answer
            if status >= 500 or status in REFUSALS:
                provider.failed(time.monotonic(), self.cooldown)
                if more:
                    self._report(provider, endpoint.path, status, "", 0, response.seconds, account, failover=True)
                    continue
            else:
                provider.answered()
            return response
        raise failure or UpstreamError("timeout", "no time left for another provider")

    def _candidates(self, endpoint: Endpoint, size: int, now: float) -> tuple[Provider, ...]:
        serving = self.serving.get(endpoint.path, ())
        if self.by_cost:
            serving = tuple(sorted(serving, key=lambda p: p.costs.expected(endpoint.path, size)))
        if any(p.cooling(now) for p in serving):
            serving = tuple(p for p in serving if not p.cooling(now)) + tuple(p for p in serving if p.cooling(now))
        return serving

    def _unpin(self, query: str, serving: tuple[Provider, ...]) -> tuple[Provider | None, str]:
        """The provider a cursor is pinned to, and the query with the provider's own cursor (None, the query as it
        was: no cursor after all, or no provider serves the endpoint). A cursor naming no provider of PROVIDERS
        serving the endpoint (handed out before PROVIDERS, forged, or its provider's kind changed) goes to the
        first that serves it, as it is: that provider answers it (a 400 when it is not its own), where sending
        it to one that cannot serve the endpoint would be a 503 that no retry ends."""
        provider, pairs = None, []
        for name, value in urllib.parse.parse_qsl(query, keep_blank_values=True, encoding="latin-1"):
            if name == "cursor" and value and serving:
                head, sep, rest = value.partition(PIN)
                named = self.named.get(head) if sep else None
                if named in serving:
                    provider, value = named, rest
                else:
                    provider = serving[0]
            pairs.append((name, value))
        if provider is None:
            return None, query
        return provider, urllib.parse.urlencode(pairs, safe=",", encoding="latin-1")

    def pin(self, endpoint: Endpoint, provider: str, body: bytes, following: str) -> tuple[bytes, str]:
        """The answer with its next cursor pinned to `provider` (several providers; opaque-cursor endpoints), and
        that cursor. The cursor read_answer found is replaced where it stands; only a body that spells it in
        another way (escapes, spacing) is parsed and written again."""
        if not (self.pins and following and endpoint.path in self.pinned_paths):
            return body, following
        pinned = provider + PIN + following
        old, new = orjson.dumps(following), orjson.dumps(pinned)
        for key in (b'"next_cursor":', b'"next_cursor": '):
            if body.count(key + old) == 1:
                return body.replace(key + old, key + new), pinned
        page = orjson.loads(body)
        page["next_cursor"] = pinned
        return orjson.dumps(page), pinned

    # --- the cost ledger ------------------------------------------------------------------------------------
    def settled(self, endpoint: Endpoint, response: UpstreamResponse, items: int, account: str) -> None:
        """The attempt that gave the call its answer, once its items are counted (accounting/charged.py)."""
        provider = self.named.get(response.provider, self.first)
        self._report(provider, endpoint.path, response.status, "", items, response.seconds, account)

    def _refused(self, provider: Provider, status: int, seconds: float, account: str | None, path: str) -> None:
        """A key refused (its client tries the next key): held for the call under way (`get`), else recorded."""
        attempt = self._attempt(provider, path, status, "", 0, seconds, account or "")
        held = _REFUSED.get()
        if held is None:
            self.ledger.record(attempt)
        else:
            held.append(attempt)

    def _record(self, refused: list[Attempt], failover: bool) -> None:
        """A request's key refusals, in order; `failover` flags the last (the next provider was asked after it)."""
        for i, attempt in enumerate(refused):
            self.ledger.record(attempt, failover and i == len(refused) - 1)

    def _report(
        self,
        provider: Provider,
        path: str,
        status: int,
        error: str,
        items: int,
        seconds: float,
        account: str,
        failover: bool = False,
    ) -> None:
        """`failover`: the next provider is asked after this attempt."""
        self.ledger.record(self._attempt(provider, path, status, error, items, seconds, account), failover)

    def _attempt(
        self, provider: Provider, path: str, status: int, error: str, items: int, seconds: float, account: str
    ) -> Attempt:
        paid = provider.costs.paid(path, items, 200 <= status < 300)
        return Attempt(time.time(), provider.name, path, status, error, items, paid, seconds, account)

    def close(self) -> None:
        for provider in self.providers:
            provider.client.close()


def build(settings: Settings, ledger: Ledger) -> Router:
    """The router of PROVIDERS, or of the one provider today's UPSTREAM_* settings name."""
    entries = settings.providers or (
        {
            "name": DEFAULT,
            "kind": "twitterapi",
            "url": settings.upstream_url,
            "keys": list(settings.upstream_api_keys) or settings.upstream_api_key,
            "prefix": settings.upstream_path_prefix,
        },
    )
    providers = []
    for entry in entries:
        if entry["kind"] not in KINDS:
            raise SettingsError(
                f"PROVIDERS: provider {entry['name']}: kind must be one of {', '.join(KINDS)}, not {entry['kind']!r}"
            )
        if settings.providers:
            wrong = _unusable(entry)
            if wrong:
                raise SettingsError(f"PROVIDERS: provider {entry['name']}: {wrong}")
        keys = entry["keys"] if isinstance(entry["keys"], str) else list(provider_keys(entry["keys"]))
        kind = adapter(entry["kind"])
        client = UpstreamClient(
            entry["url"],
            keys,
            entry.get("prefix", settings.upstream_path_prefix),  # both kinds' APIs live under /twitter
            settings.upstream_connect_timeout,
            settings.upstream_timeout,
            settings.upstream_max_connections,
            settings.upstream_max_body_bytes,
            Breaker(
                settings.breaker_failures, settings.breaker_reset_seconds, min_accounts=settings.breaker_min_accounts
            ),
            name=entry["name"],
            headers=kind.headers,
        )
        providers.append(Provider(entry["name"], entry["kind"], client, Costs(entry.get("costs"))))
    return Router(
        providers, settings.provider_routing, ledger, settings.upstream_timeout, settings.breaker_reset_seconds
    )


def _unusable(entry: dict) -> str:
    """Why the gateway cannot send requests to this provider as PROVIDERS lists it ("" when it can). The url is an
    origin and the prefix a path: what they hold goes into every request line, so a space, a control character, a
    query or a fragment would split or bend it; credentials in the url would be dropped silently. The url is never
    echoed (it may hold a secret). A `by` price names an endpoint path or a price rule: a misspelt one would price
    nothing and route by the wrong table."""
    url, prefix = entry["url"], entry.get("prefix", "")
    if not (url + prefix).isprintable() or " " in url + prefix or any(c in url + prefix for c in "?#"):
        return "url and prefix must be printable, without spaces, a query or a fragment"
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (reading it checks it)
    except ValueError:
        return "url must be http(s)://host[:port]"
    if not parts.hostname or parts.username is not None or parts.password is not None:
        return "url must be http(s)://host[:port], without credentials"
    if not all(isinstance(key, str) for key in entry["keys"]):  # a null or a number is no key ("None", "123")
        return "keys must be strings"
    known = {e.path.lstrip("/") for e in ENDPOINTS} | {e.price for e in ENDPOINTS}
    unknown = set((entry.get("costs") or {}).get("by", {})) - known
    if unknown:
        return f"costs by names no endpoint path or price rule: {', '.join(sorted(unknown))}"
    return ""
