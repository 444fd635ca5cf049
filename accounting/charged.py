"""One home for a charged data call: reserve -> the answer (the shared cache, an identical call under way, or
the provider) -> its price -> settle or release -> the usage record. The data handler (handlers/social.py) and
the stream poller (streams/poller.py) both go through it, so a call's money path is written once.

The cache (docs/api.md, *The answer cache*): answers are public data, the same for every customer, so an
answer charged once is served again at CACHE_HIT_PRICE x its price while fresh (social/answer_cache.py keeps
them in memory, storage/answers.py shares them between processes). Identical calls in flight at once make one
provider call (`_flights`): the call runs in a task of its own, so a caller that disconnects cancels nothing
for the others, each waiter keeps its own deadline, and a failure reaches every waiter as the same uncharged
error. Only answers that are charged are kept; while the provider fails, a kept answer no older than
CACHE_STALE_IF_ERROR is served STALE. Stream polls read live (LIVE): never from the cache, never joined.
"""

import asyncio
import logging
import time
from dataclasses import dataclass

import orjson

from accounting.crawls import Crawls
from accounting.meter import Meter
from config.settings import Settings
from metering.ledger import Reservation
from metering.pricing import Prices
from runtime.metrics import Metrics
from social.answer_cache import AnswerCache, answer_key, ttl_of
from social.endpoints import Endpoint, read_answer, read_parsed
from social.upstream import UpstreamClient, UpstreamError, UpstreamResponse
from storage.answers import AnswerStore, Cached

log = logging.getLogger("gateway.cache")
MISS, HIT, COALESCED, STALE = "miss", "hit", "coalesced", "stale"
CLAIM_WAIT = 1.0  # seconds a miss waits for the shared tier's first answer before it asks the provider anyway
# The shared tier's database operations under way at once, and its writes waiting: bounded so that a burst of
# misses never queues ahead of the heartbeat and the usage flushes for the driver's connections (unbounded, a
# bench --cache run went without a heartbeat for 15 s and stopped spending: 503). Past the backlog a
# write is dropped: a cache entry the other processes will not share.
TIER_CONCURRENCY = 16
TIER_BACKLOG = 512


@dataclass(frozen=True)
class Wanted:
    """What a caller accepts from the cache: its request's Cache-Control (`no-cache`: a provider call;
    `max-age=N`: an answer no older than N seconds)."""

    live: bool = False
    max_age: float | None = None


LIVE = Wanted(live=True)
CACHED = Wanted()


def wanted(header: str) -> Wanted:
    live, max_age = False, None
    for part in header.lower().split(","):
        name, _, value = part.strip().partition("=")
        if name in ("no-cache", "no-store"):
            live = True
        elif name == "max-age":
            try:
                max_age = max(0, int(value.strip().strip('"')))
            except ValueError:
                pass  # RFC 9111: an invalid max-age is ignored
    return Wanted(live, max_age)


class Joined(UpstreamError):
    """The failure of an identical call this one waited for: the same error, but this caller made no provider
    call (its account's failure budget does not count it)."""


@dataclass(frozen=True)
class Provided:
    """One provider answer as every waiter of the call shares it: the response and what it is worth."""

    response: UpstreamResponse
    status: int  # the provider's, or 502 for a 2xx that is not a JSON object
    items: int | None  # the item count it is charged for; None: not chargeable (an error body, a 4xx, a 5xx)
    page: object = None  # the parsed page, when the caller asked for it (the poller reads its tweets)
    following: str = ""  # the page's next cursor, read with the count (the crawl guard needs nothing more of it)


@dataclass
class Fetched:
    """A call's answer with its reservation, priced, not yet charged (`Calls.settle` or `Calls.release`)."""

    reservation: Reservation
    status: int
    body: bytes
    cost: int  # what settling charges (0: nothing)
    worth: int  # the answer's full price (0: not chargeable); worth - cost is what the cache saved
    cache: str  # miss | hit | coalesced | stale
    seconds: float | None = None  # the provider's answer time (None: nothing forwarded on this call's behalf)
    age: int | None = None  # seconds since a cached answer was fetched (HIT, STALE)
    page: object = None
    key: str | None = None  # the cache key: kept once charged (None: not cacheable)
    guarded: bool = False  # the crawl guard ended a crawl on this page (X-Crawl-Guard)
    data: bool = True  # the provider answered with data (not an error body, a 4xx or a 5xx)
    claim: str | None = None  # the shared tier's fill claim this call holds until its answer is kept there
    share: bool = False  # kept in the shared tier too once charged (a live read is kept in this process only)


class Calls:
    def __init__(self, settings: Settings, meter: Meter, prices: Prices, metrics: Metrics, store: AnswerStore | None):
        self.settings, self.meter, self.prices, self.metrics, self.store = settings, meter, prices, metrics, store
        ttls = [ttl_of(path, settings.cache_ttl) for path in settings.cache_ttl] + [900]
        self.cache = AnswerCache(settings.cache_max_bytes, max(max(ttls), settings.cache_stale_if_error))
        self.crawls = Crawls()
        self._flights: dict[str, asyncio.Future] = {}
        self._background: set[asyncio.Task] = set()
        self._tier = asyncio.Semaphore(TIER_CONCURRENCY)

    # --- reserve ------------------------------------------------------------------------------------
    def bounds(self, endpoint: Endpoint, size: int) -> tuple[int, int]:
        """(the most, the least) a call can cost: a full page reserved, an empty one's price required."""
        return self.prices.cost(endpoint.price, size, size), self.prices.cost(endpoint.price, 0, size)

    async def reserve(self, account_id: str, endpoint: Endpoint, size: int, key=None) -> Reservation | None:
        """Raises LeasesExpired or BudgetExhausted; None: the account cannot pay the call's minimum."""
        most, least = self.bounds(endpoint, size)
        return await self.meter.reserve(account_id, most, least, key)

    # --- the answer --------------------------------------------------------------------------------
    async def fetch(
        self,
        upstream: UpstreamClient,
        reservation: Reservation,
        endpoint: Endpoint,
        query: str,
        size: int,
        rate: float = 1.0,
        want: Wanted = LIVE,
        parse: bool = False,
        cursor: str | None = None,
    ) -> Fetched:
        """The call's answer, priced for `reservation`. Raises UpstreamError (the reservation released) when
        the provider failed and no stale answer may stand in (none does for a live read: its caller asked for
        the provider's answer, and is told when there is none)."""
        ttl = ttl_of(endpoint.path, self.settings.cache_ttl)
        key = answer_key(endpoint.path, query) if not parse else None
        fresh = ttl if want.max_age is None else min(ttl, want.max_age)
        if key is not None and not want.live and ttl and self.cache.max_bytes:
            found = self.cache.get(key)
            if found is not None and found.age(time.time()) <= fresh:
                return self._served(reservation, found, HIT)
        try:
            if key is None or want.live:
                provided, source = await self._provide(upstream, endpoint, query, reservation.account_id, rate, parse)
            else:
                provided, source = await self._shared(upstream, endpoint, query, key, reservation, rate, fresh)
        except UpstreamError:
            stale = await self._stale(key, endpoint) if not (parse or want.live) else None
            if stale is not None:
                return self._served(reservation, stale, STALE)
            self.meter.release(reservation)
            raise
        except BaseException:
            self.meter.release(reservation)
            raise
        if isinstance(provided, Cached):  # another process's answer, through the second tier
            self.cache.put(key, provided)
            return self._served(reservation, provided, HIT)
        if provided.items is None and provided.status >= 500:
            stale = await self._stale(key, endpoint) if not (parse or want.live) else None
            if stale is not None:
                return self._served(reservation, stale, STALE)
        response = provided.response
        worth = 0 if provided.items is None else self.prices.cost(endpoint.price, provided.items, size)
        fetched = Fetched(
            reservation,
            provided.status,
            response.body,
            min(worth, reservation.amount),
            worth,
            source,
            seconds=response.seconds,
            page=provided.page,
            key=key if ttl and worth else None,
            data=provided.items is not None,
        )
        if key is not None and not want.live and self._tiered(endpoint):
            fetched.share = True
            if source == MISS and fetched.data:
                fetched.claim = key
        if cursor and endpoint.paged and worth and key is not None:  # a crawl's first page cannot loop
            self._guard(fetched, key, cursor, provided.following)
        if source == MISS and key is not None:
            self.metrics.cache_requests[MISS] += 1
        return fetched

    def _tiered(self, endpoint: Endpoint) -> bool:
        """Whether the endpoint's answers go through the shared tier (and its fill claims)."""
        return bool(self.store is not None and self.cache.max_bytes and ttl_of(endpoint.path, self.settings.cache_ttl))

    def _served(self, reservation: Reservation, found: Cached, how: str) -> Fetched:
        """A kept answer: charged CACHE_HIT_PRICE x its price (at most what was reserved)."""
        cost = min(round(found.worth * self.settings.cache_hit_price), reservation.amount)
        self.metrics.cache_requests[how] += 1
        self.metrics.provider_calls_saved += 1
        self.metrics.credits_saved += found.worth - cost
        return Fetched(reservation, found.status, found.body, cost, found.worth, how, age=int(found.age(time.time())))

    async def _stale(self, key: str | None, endpoint: Endpoint) -> Cached | None:
        """A kept answer that may stand in while the provider fails: no older than CACHE_STALE_IF_ERROR."""
        window = self.settings.cache_stale_if_error
        if key is None or not window or not ttl_of(endpoint.path, self.settings.cache_ttl):
            return None
        found = self.cache.get(key)
        if found is None and self.store is not None:
            found = await self._limited(self.store.get(key, window))
        return found if found is not None and found.age(time.time()) <= window else None

    async def _shared(
        self,
        upstream: UpstreamClient,
        endpoint: Endpoint,
        query: str,
        key: str,
        reservation: Reservation,
        rate: float,
        fresh: float,
    ) -> tuple[Provided | Cached, str]:
        """One provider call for identical calls under way at once in this process (and, through the second
        tier's fill claim, across processes). The call runs in a task of its own: the first caller leaving
        cancels nothing; each waiter waits at most the provider's time-out from its own start."""
        flight = self._flights.get(key)
        source = COALESCED
        if flight is None:
            source = MISS
            flight = asyncio.ensure_future(
                self._fill(upstream, endpoint, query, key, reservation.account_id, rate, fresh)
            )
            self._flights[key] = flight
            flight.add_done_callback(lambda done: self._landed(key, done))
        try:
            provided = await asyncio.wait_for(asyncio.shield(flight), self._patience())
        except TimeoutError:
            raise UpstreamError("timeout", "waiting for an identical call") from None
        except UpstreamError as exc:
            if source == COALESCED:  # an exception of its own for each waiter, not one shared by all
                raise Joined(exc.kind, "an identical call failed", exc.retry_after) from None
            raise
        if source == COALESCED and isinstance(provided, Provided):
            self.metrics.cache_requests[COALESCED] += 1
            self.metrics.provider_calls_saved += 1
        return provided, source

    def _patience(self) -> float:
        return self.settings.upstream_timeout + self.settings.upstream_connect_timeout + 1

    def _landed(self, key: str, flight: asyncio.Future) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]
        if not flight.cancelled():
            flight.exception()  # seen: every waiter got it, or none was left

    async def _fill(
        self, upstream: UpstreamClient, endpoint: Endpoint, query: str, key: str, account: str, rate: float, fresh
    ) -> Provided | Cached:
        """The shared call: the second tier first (another process may have it, or be fetching it), then the
        provider."""
        shared = self._tiered(endpoint)
        if shared:
            found = await self._claim(key, fresh)
            if isinstance(found, str):  # the process holding the claim failed: the same uncharged error here
                raise UpstreamError(found, "an identical call in another process failed")
            if found is not None:
                return found
        try:
            provided, _ = await self._provide(upstream, endpoint, query, account, rate, False)
        except UpstreamError as exc:
            if shared:
                self._spawn(self.store.failed(key, exc.kind))
            raise
        if shared and provided.items is None:
            self._spawn(self.store.failed(key, "failed" if provided.status >= 500 else ""))
        return provided

    async def _claim(self, key: str, fresh: float) -> Cached | str | None:
        """The shared tier's answer or fill claim. Its first round trip is waited for CLAIM_WAIT at most: a
        database slower than that (overloaded) must not hold every miss back; the call then goes to the
        provider without the claim (the write goes on, and the answer kept later ends it)."""
        patience = self._patience()
        first = asyncio.ensure_future(self._limited(self.store.claim(key, patience)))
        done, _ = await asyncio.wait({first}, timeout=CLAIM_WAIT)
        if not done:
            first.add_done_callback(_seen)
            self.metrics.cache_claims_skipped += 1
            return None
        try:
            doc = first.result()
            return None if doc is None else await self.store.wait(key, doc, fresh, patience)
        except Exception as exc:  # the shared tier is an optimisation: without it, the provider is asked
            log.debug("the shared answer cache could not be read: %s", type(exc).__name__)
            return None

    async def _provide(
        self, upstream: UpstreamClient, endpoint: Endpoint, query: str, account: str, rate: float, parse: bool
    ) -> tuple[Provided, str]:
        response = await upstream.get(endpoint.path, query, account, rate)
        self.metrics.upstream_latency.observe("/social" + endpoint.path, response.seconds)
        status, items, page, following = response.status, None, None, ""
        if 200 <= status < 300:
            if parse:  # the caller needs the page itself: parsed once, counted from the parsed page
                try:
                    page = orjson.loads(response.body)
                except orjson.JSONDecodeError:
                    page = None
                counted = read_parsed(endpoint, page)
            else:  # only the status and the item count, read without building the page
                counted = read_answer(endpoint, response.body)
            if counted is None:
                status = 502  # untrusted upstream: a 2xx that is not a JSON object is a failure
            elif not counted[0]:
                items, following = counted[1], counted[2]
        return Provided(response, status, items, page, following), MISS

    # --- the crawl guard -----------------------------------------------------------------------------
    def _guard(self, fetched: Fetched, key: str, cursor: str, following: str) -> None:
        """A page whose next cursor (`following`, read with its count) is the one it was asked with, or one its
        crawl already followed to another page, ends the crawl: served with no next page, not charged, not kept.
        Only such a page is parsed (to rewrite it): parsing every paged answer cost a quarter of a call's CPU."""
        crawl = (fetched.reservation.account_id, _without_cursor(key))
        if not self.crawls.repeats(crawl, cursor, following):
            return
        try:
            page = orjson.loads(fetched.body)  # a JSON object when read_answer read it so; parsed to be sure
        except orjson.JSONDecodeError:
            return
        if not isinstance(page, dict):
            return
        page["has_next_page"], page["next_cursor"] = False, ""
        fetched.body = orjson.dumps(page)
        fetched.cost = fetched.worth = 0
        fetched.key = None
        fetched.guarded = True

    # --- settle --------------------------------------------------------------------------------------
    def settle(self, fetched: Fetched) -> int:
        """Charges the call what its answer costs; an answer charged from the provider is kept for others."""
        charged = self.meter.settle(fetched.reservation, fetched.cost) if fetched.cost else 0
        if not fetched.cost:
            self.meter.release(fetched.reservation)
        stored = False
        if charged and fetched.key is not None and fetched.cache in (MISS, COALESCED):
            entry = Cached(fetched.status, fetched.body, fetched.worth, time.time() - (fetched.seconds or 0))
            kept = self.cache.entries.get(fetched.key)
            # The first of a call's waiters to settle keeps it; a newer answer (a live read, a refetch once the
            # kept one went stale) replaces an older one.
            if kept is None or kept.fetched_at < entry.fetched_at - 0.5:
                self.cache.put(fetched.key, entry)
                if fetched.share:  # also ends this process's fill claim
                    self._spawn(self.store.put(fetched.key, entry, self._keep(fetched.key)))
                    stored = True
        if fetched.claim is not None and not stored:
            # Not kept (a guarded page, a charge that did not happen): the other processes waiting for it ask
            # the provider themselves.
            self._spawn(self.store.failed(fetched.claim, ""))
        return charged

    def release(self, fetched: Fetched) -> None:
        self.meter.release(fetched.reservation)
        if fetched.claim is not None:
            self._spawn(self.store.failed(fetched.claim, ""))

    def _keep(self, key: str) -> float:
        path = key.split("?", 1)[0]
        return max(ttl_of(path, self.settings.cache_ttl), self.settings.cache_stale_if_error)

    def record(self, key, route: str, fetched: Fetched | None, status: int, charged: int, request_id: str) -> None:
        """The usage record of a data call: its charge, and how the cache answered it (with what it saved)."""
        if fetched is None:
            self.meter.record(key, route, status, 0, request_id)
            return
        saved = fetched.worth - charged if fetched.cache in (HIT, STALE) else 0
        self.meter.record(
            key, route, status, charged, request_id, upstream_seconds=fetched.seconds, cache=fetched.cache, saved=saved
        )

    async def _limited(self, work):
        async with self._tier:
            return await work

    def _spawn(self, work) -> None:
        """A write to the shared tier, off the request path (dropped past TIER_BACKLOG)."""
        if len(self._background) >= TIER_BACKLOG:
            work.close()
            self.metrics.cache_writes_dropped += 1
            return
        task = asyncio.create_task(self._quietly(work))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _quietly(self, work) -> None:
        try:
            await self._limited(work)
        except Exception as exc:  # the second tier is an optimisation: a failed write only costs later hits
            log.debug("the shared answer cache could not be written: %s", type(exc).__name__)

    async def close(self) -> None:
        await asyncio.gather(*self._background, return_exceptions=True)


def _seen(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()  # a late claim's failure: nobody waits for it any more


def _without_cursor(key: str) -> str:
    """A crawl's key: its answer key (the query in its normal form) without the cursor. The normal form is the
    forwarded query's pairs sorted by name, so leaving out the cursor's pair there gives the normal form of the
    query without it; the query is not parsed and encoded again."""
    path, _, query = key.partition("?")
    return path + "?" + "&".join(part for part in query.split("&") if not part.startswith("cursor="))
