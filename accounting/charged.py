"""One home for a charged data call: reserve -> the answer (the shared cache, an identical call under way, or
the provider the router picks, failing over below this call: social/providers/router.py) -> its price -> settle or
release -> the usage record. The data handler (handlers/social.py) and the stream poller (streams/poller.py) both
go through it, so a call's money path is written once.

The cache (docs/api.md, *The answer cache*): answers are public data, the same for every customer, so an
answer charged once is served again at CACHE_HIT_PRICE x its price while fresh (social/answer_cache.py keeps
them in memory; accounting/tiers.py asks the key's owner worker, and the MongoDB tier between machines).
Identical calls in flight at once make one provider call (`_flights`, here and at the key's owner worker, which
answers its siblings through `answer_peer`): the call runs in a task of its own, so a caller that disconnects cancels nothing
for the others, each waiter keeps its own deadline, and a failure reaches every waiter as the same uncharged
error. Only answers that are charged are kept, and pages that ended their crawl (the crawl guard: as served, so
that reading one again is a hit charged as any, never a free provider call); while the provider fails, a kept
answer no older than CACHE_STALE_IF_ERROR is served STALE. Stream polls read live (LIVE): never from the cache,
never joined.
"""

import asyncio
import time
from dataclasses import dataclass, replace

import orjson

from accounting.crawls import Crawls
from accounting.meter import Meter
from accounting.tiers import PeerDown, Provided, Reply, Tiers
from config.settings import Settings
from metering.ledger import Reservation
from metering.pricing import Prices
from runtime.metrics import Metrics
from runtime.state import State
from social.answer_cache import AnswerCache, answer_key, ttl_of
from social.endpoints import Endpoint, read_answer, read_parsed
from social.providers.router import Router
from social.upstream import UpstreamError, UpstreamResponse
from storage.answers import AnswerStore, Cached

MISS, HIT, COALESCED, STALE = "miss", "hit", "coalesced", "stale"


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
    key: str | None = None  # the cache key: kept once charged or guarded (None: not cacheable)
    guarded: bool = False  # the crawl guard ended a crawl on this page, now or when it was kept (X-Crawl-Guard)
    data: bool = True  # the provider answered with data (not an error body, a 4xx or a 5xx)
    claim: str | None = None  # the shared tier's fill claim this call holds until its answer is kept there
    share: bool = False  # kept in the shared tier too once charged (a live read is kept in this process only)
    # The owner worker that kept it as it landed (None: this one), its key and fetched_at: dropped if not charged.
    kept_by: tuple[int | None, str, float] | None = None
    provider: str = ""  # the provider that produced the answer (a kept one's too): X-Provider, the usage record


class Calls:
    def __init__(self, settings: Settings, meter: Meter, state: State, metrics: Metrics, store: AnswerStore | None):
        self.settings, self.meter, self.state, self.metrics, self.store = settings, meter, state, metrics, store
        ttls = [ttl_of(path, settings.cache_ttl) for path in settings.cache_ttl] + [900]
        self.cache = AnswerCache(settings.cache_max_bytes, max(max(ttls), settings.cache_stale_if_error))
        self.crawls = Crawls(settings.crawl_guard_max_bytes)
        self.tiers = Tiers(metrics, store)
        self._flights: dict[str, asyncio.Future] = {}

    @property
    def prices(self) -> Prices:
        """The prices now: a reload (SIGHUP) replaces them on the process's state, not on a copy kept here."""
        return self.state.prices

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
        upstream: Router,
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
                return self._served(reservation, found, HIT, key, cursor)
        try:
            if key is None or want.live:
                provided, source = await self._provide(
                    upstream, endpoint, query, reservation.account_id, rate, parse, size
                )
            else:
                call = Call(endpoint, query, size, reservation.account_id, rate, fresh, cursor)
                provided, source = await self._shared(upstream, call, key)
        except UpstreamError:
            stale = await self._stale(key, endpoint) if not (parse or want.live) else None
            if stale is not None:
                return self._served(reservation, stale, STALE, key, cursor)
            self.meter.release(reservation)
            raise
        except BaseException:
            self.meter.release(reservation)
            raise
        if isinstance(provided, Cached):  # another process's answer: the owner worker's, or the second tier's
            self._keep_newer(key, provided)
            return self._served(reservation, provided, HIT, key, cursor)
        if provided.items is None and provided.status >= 500:
            stale = await self._stale(key, endpoint) if not (parse or want.live) else None
            if stale is not None:
                return self._served(reservation, stale, STALE, key, cursor)
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
            provider=response.provider,
        )
        if provided.kept_at is not None:  # kept by the key's owner worker (and shared through the second tier)
            fetched.kept_by = (provided.owner, key, provided.kept_at)
        elif provided.owner is None and key is not None and not want.live and self._tiered(endpoint):
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

    def _served(
        self, reservation: Reservation, found: Cached, how: str, key: str | None, cursor: str | None
    ) -> Fetched:
        """A kept answer: charged CACHE_HIT_PRICE x its price (at most what was reserved). A page that ended the
        caller's crawl is served so again, whichever answer of it was kept (a coalesced caller's, another crawl's)."""
        cost = min(round(found.worth * self.settings.cache_hit_price), reservation.amount)
        self.metrics.cache_requests[how] += 1
        self.metrics.provider_calls_saved += 1
        self.metrics.credits_saved += found.worth - cost
        fetched = Fetched(
            reservation,
            found.status,
            found.body,
            cost,
            found.worth,
            how,
            age=int(found.age(time.time())),
            provider=found.provider,
        )
        if cursor and key is not None and self.crawls.seen:
            if self.crawls.ended((reservation.account_id, _without_cursor(key)), cursor):
                _end_crawl(fetched)
        return fetched

    async def _stale(self, key: str | None, endpoint: Endpoint) -> Cached | None:
        """A kept answer that may stand in while the provider fails: no older than CACHE_STALE_IF_ERROR."""
        window = self.settings.cache_stale_if_error
        if key is None or not window or not ttl_of(endpoint.path, self.settings.cache_ttl):
            return None
        found = self.cache.get(key)
        if found is None and self.store is not None:
            found = await self.tiers.limited(self.store.get(key, window))
        return found if found is not None and found.age(time.time()) <= window else None

    def _keep_newer(self, key: str, entry: Cached) -> bool:
        """Keeps `entry` in this process unless what is kept is as new (the first of a call's waiters keeps it; a
        newer answer, a live read or a refetch once the kept one went stale, replaces an older one)."""
        kept = self.cache.entries.get(key)
        if kept is not None and kept.fetched_at >= entry.fetched_at - 0.5:
            return False
        self.cache.put(key, entry)
        return True

    async def _shared(self, upstream: Router, call: "Call", key: str) -> tuple[Provided | Cached, str]:
        """One provider call for identical calls under way at once in this process (and, through the key's owner
        worker or the second tier's fill claim, across processes). The call runs in a task of its own: the first
        caller leaving cancels nothing; each waiter waits at most the provider's time-out from its own start."""
        flight = self._flights.get(key)
        source = COALESCED
        if flight is None:
            source = MISS
            flight = self._fly(key, self._fill(upstream, call, key))
        try:
            provided = await asyncio.wait_for(asyncio.shield(flight), self._patience())
        except TimeoutError:
            raise UpstreamError("timeout", "waiting for an identical call") from None
        except UpstreamError as exc:
            if source == COALESCED or isinstance(exc, Joined):  # its own exception for each waiter
                raise Joined(exc.kind, "an identical call failed", exc.retry_after) from None
            raise
        if source == MISS and isinstance(provided, Provided) and provided.joined:
            source = COALESCED  # the owner worker had the provider call under way already
        if source == COALESCED and isinstance(provided, Provided):
            self.metrics.cache_requests[COALESCED] += 1
            self.metrics.provider_calls_saved += 1
        return provided, source

    def _fly(self, key: str, work) -> asyncio.Future:
        flight = asyncio.ensure_future(work)
        self._flights[key] = flight
        flight.add_done_callback(lambda done: self._landed(key, done))
        return flight

    def _patience(self) -> float:
        return self.settings.upstream_timeout + self.settings.upstream_connect_timeout + 1

    def _landed(self, key: str, flight: asyncio.Future) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]
        if not flight.cancelled():
            flight.exception()  # seen: every waiter got it, or none was left

    async def _fill(self, upstream: Router, call: "Call", key: str, route: bool = True) -> Provided | Cached:
        """The shared call: the key's owner worker when it is another (unless down), else the second tier first
        (another machine may have it, or be fetching it), then the provider."""
        owner = self.tiers.owner(key) if route else None
        if owner is not None and self.tiers.up(owner):
            try:
                reply = await self.tiers.ask(owner, call.endpoint.path, call.query, call.args(), self._patience())
            except PeerDown:
                pass  # fetched here: the sibling is down or restarting
            else:
                if reply.error:
                    if reply.cached is not None:  # a kept answer that may stand in (fetch's _stale finds it)
                        self._keep_newer(key, reply.cached)
                    raise (Joined if reply.joined else UpstreamError)(
                        reply.error, "the owner worker's provider call failed", reply.retry_after
                    )
                if reply.cached is not None and reply.provided is not None:  # a 5xx, and what may stand in
                    self._keep_newer(key, reply.cached)
                return reply.provided or reply.cached
        endpoint = call.endpoint
        shared = self._tiered(endpoint)
        if shared:
            found = await self.tiers.claim(key, call.fresh, self._patience())
            if isinstance(found, str):  # the process holding the claim failed: the same uncharged error here
                raise UpstreamError(found, "an identical call in another process failed")
            if found is not None:
                return found
        try:
            provided, _ = await self._provide(upstream, endpoint, call.query, call.account, call.rate, False, call.size)
        except UpstreamError as exc:
            if shared:
                self.tiers.spawn(self.store.failed(key, exc.kind))
            raise
        if shared and provided.items is None:
            self.tiers.spawn(self.store.failed(key, "failed" if provided.status >= 500 else ""))
        if self.tiers.count > 1 and self.tiers.owner(key) is None:  # this worker owns the key
            return self._keep_at_once(call, key, provided)
        return provided

    async def _provide(
        self, upstream: Router, endpoint: Endpoint, query: str, account: str, rate: float, parse: bool, size: int
    ) -> tuple[Provided, str]:
        """The provider's answer (whichever the router asked: failover happens inside, so a call is charged once
        whoever answered), counted, its attempt reported to the cost ledger, its next cursor pinned."""
        response = await upstream.get(endpoint, query, account, rate, size)
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
        upstream.settled(endpoint, response, items or 0, account)
        if following and upstream.pins:  # several providers: the cursor handed out names its provider
            body, following = upstream.pin(endpoint, response.provider, response.body, following)
            response = UpstreamResponse(response.status, body, response.seconds, response.provider)
            if isinstance(page, dict):
                page["next_cursor"] = following
        return Provided(response, status, items, page, following), MISS

    # --- the owner worker's side (accounting/tiers.py) ------------------------------------------------
    async def answer_peer(self, upstream: Router, call: "Call") -> Reply:
        """A sibling's call for a key this worker owns: a fresh kept answer, or the one provider call for the key
        (joined when under way), kept here as it landed (`_keep_at_once`)."""
        key = answer_key(call.endpoint.path, call.query)
        if ttl_of(call.endpoint.path, self.settings.cache_ttl) and self.cache.max_bytes:
            found = self.cache.get(key)
            if found is not None and found.age(time.time()) <= call.fresh:
                return Reply(cached=found)
        flight = self._flights.get(key)
        joined = flight is not None
        if flight is None:
            flight = self._fly(key, self._fill(upstream, call, key, route=False))
        try:
            provided = await asyncio.wait_for(asyncio.shield(flight), self._patience())
        except TimeoutError:
            return Reply(cached=await self._stale(key, call.endpoint), error="timeout", joined=joined)
        except UpstreamError as exc:
            stale = await self._stale(key, call.endpoint)
            return Reply(cached=stale, error=exc.kind, retry_after=exc.retry_after, joined=joined)
        if isinstance(provided, Cached):
            return Reply(cached=provided)
        stale = await self._stale(key, call.endpoint) if provided.items is None and provided.status >= 500 else None
        return Reply(cached=stale, provided=provided, joined=joined)

    def _keep_at_once(self, call: "Call", key: str, provided: Provided) -> Provided:
        """The owner worker keeps a chargeable answer as it lands, before any caller settles: its siblings' calls
        for the key, arriving meanwhile, are then hits, not a second provider call. The caller that does not
        charge it after all (a guarded page, an Idempotency-Key claim lost) has it dropped (`_unkeep`)."""
        worth = 0 if provided.items is None else self.prices.cost(call.endpoint.price, provided.items, call.size)
        if not worth or not ttl_of(call.endpoint.path, self.settings.cache_ttl):
            return provided
        if call.cursor and provided.following == call.cursor:  # a loop whoever crawls: not kept
            return provided
        entry = Cached(
            provided.status,
            provided.response.body,
            worth,
            time.time() - provided.response.seconds,
            provided.response.provider,
        )
        if not self._keep_newer(key, entry):
            return provided
        if self._tiered(call.endpoint):
            self.tiers.spawn(self.store.put(key, entry, self._keep(key)))
        return replace(provided, kept_at=entry.fetched_at)

    def drop_peer(self, key: str, kept_at: float) -> None:
        """A call did not charge the answer this worker kept as it landed: not served to anyone else."""
        kept = self.cache.entries.get(key)
        if kept is not None and kept.fetched_at == kept_at:
            self.cache.drop(key)
            if self.store is not None:
                self.tiers.spawn(self.store.drop(key, kept_at))

    # --- the crawl guard -----------------------------------------------------------------------------
    def _guard(self, fetched: Fetched, key: str, cursor: str, following: str) -> None:
        """A page whose next cursor (`following`, read with its count) closes a cycle of its crawl's cursors
        (accounting/crawls.py) ends the crawl: served with no next page, and not charged the first time this crawl
        is served it. It is kept as served, at its full worth, so reading it again while fresh is a hit charged as
        any. Only such a page is parsed (to rewrite it): parsing every paged answer cost a quarter of a call's CPU."""
        ends, free = self.crawls.step((fetched.reservation.account_id, _without_cursor(key)), cursor, following)
        if ends and _end_crawl(fetched) and free:
            fetched.cost = 0

    # --- settle --------------------------------------------------------------------------------------
    def settle(self, fetched: Fetched) -> int:
        """Charges the call what its answer costs; an answer charged from the provider, or a page that ended its
        crawl (as served: without its next page), is kept for others."""
        charged = self.meter.settle(fetched.reservation, fetched.cost) if fetched.cost else 0
        if not fetched.cost:
            self.meter.release(fetched.reservation)
        stored = False
        keep = fetched.key is not None and fetched.cache in (MISS, COALESCED) and (charged or fetched.guarded)
        if fetched.kept_by is not None and fetched.cache == MISS and (fetched.guarded or not keep):
            # Kept as it landed, but not charged, or kept with the next page this crawl is not served: dropped
            # there (a guarded page is kept in this process only, as served).
            self._unkeep(fetched.kept_by)
        if keep:
            at = fetched.kept_by[2] if fetched.kept_by else time.time() - (fetched.seconds or 0)
            entry = Cached(fetched.status, fetched.body, fetched.worth, at, fetched.provider)
            if self._keep_newer(fetched.key, entry) and fetched.share:  # also ends this process's fill claim
                self.tiers.spawn(self.store.put(fetched.key, entry, self._keep(fetched.key)))
                stored = True
        if fetched.claim is not None and not stored:
            # Not kept there (a charge that did not happen): the other processes waiting for it ask the provider
            # themselves.
            self.tiers.spawn(self.store.failed(fetched.claim, ""))
        return charged

    def release(self, fetched: Fetched) -> None:
        self.meter.release(fetched.reservation)
        if fetched.claim is not None:
            self.tiers.spawn(self.store.failed(fetched.claim, ""))
        if fetched.kept_by is not None and fetched.cache == MISS:
            self._unkeep(fetched.kept_by)

    def _unkeep(self, kept_by: tuple[int | None, str, float]) -> None:
        owner, key, at = kept_by
        if owner is None:
            self.drop_peer(key, at)
        else:
            self.tiers.drop(owner, key, at)

    def _keep(self, key: str) -> float:
        path = key.split("?", 1)[0]
        return max(ttl_of(path, self.settings.cache_ttl), self.settings.cache_stale_if_error)

    def record(
        self, key, route: str, fetched: Fetched | None, status: int, charged: int, request_id: str, via=None
    ) -> asyncio.Future | None:
        """The usage record of a data call: its charge, how the cache answered it (with what it saved), and how the
        call came when not over REST (`via`: ("mcp", tool)). What to await before answering (Meter.record)."""
        if fetched is None:
            return self.meter.record(key, route, status, 0, request_id, via=via)
        saved = fetched.worth - charged if fetched.cache in (HIT, STALE) else 0
        return self.meter.record(
            key,
            route,
            status,
            charged,
            request_id,
            upstream_seconds=fetched.seconds,
            cache=fetched.cache,
            saved=saved,
            via=via,
            provider=fetched.provider,
        )

    async def close(self) -> None:
        await self.tiers.close()


@dataclass(frozen=True)
class Call:
    """What the one provider call for a key needs, here or at the key's owner worker."""

    endpoint: Endpoint
    query: str
    size: int
    account: str
    rate: float
    fresh: float
    cursor: str | None = None

    def args(self) -> dict:
        extra = {"cursor": self.cursor} if self.cursor else {}
        return {"size": self.size, "account": self.account, "rate": self.rate, "fresh": self.fresh, **extra}


def _end_crawl(fetched: Fetched) -> bool:
    """Serves the page without a next page (X-Crawl-Guard); False when it is not a JSON object after all."""
    try:
        page = orjson.loads(fetched.body)  # a JSON object when read_answer read it so; parsed to be sure
    except orjson.JSONDecodeError:
        return False
    if not isinstance(page, dict):
        return False
    page["has_next_page"], page["next_cursor"] = False, ""
    fetched.body = orjson.dumps(page)
    fetched.guarded = True
    return True


def _without_cursor(key: str) -> str:
    """A crawl's key: its answer key (the query in its normal form) without the cursor. The normal form is the
    forwarded query's pairs sorted by name, so leaving out the cursor's pair there gives the normal form of the
    query without it; the query is not parsed and encoded again."""
    path, _, query = key.partition("?")
    return path + "?" + "&".join(part for part in query.split("&") if not part.startswith("cursor="))
