"""What lies behind a process's own memory in the answer cache (accounting/charged.py decides when):

- **The key's owner worker** (`serve --workers N`). Each cache key has one owner among the workers of a machine
  (a hash of the key mod N). A worker missing a key in its memory asks the owner over loopback (the parent binds
  one port per worker: app/workers.py, also used by /metrics); the owner answers from its memory or joins or
  starts the one provider call for the key (`Calls.answer_peer`). So identical calls through any worker make one
  provider call, and a hit of one worker is a hit of all, without a database round trip. The answer only comes
  from the owner: the caller's worker still admits, reserves, settles and records the call. A fresh answer the
  owner fetched is kept there at once (a call arriving meanwhile is a hit, not a second provider call); the
  caller tells the owner to drop it in the rare case it did not charge it (`drop`). A sibling that closes or
  breaks its connections (it died) is left alone for DOWN_SECONDS: the caller fetches itself (past that, one still
  restarting holds a new call until it is up: the parent keeps its port bound). A slow one is waited for (its
  time-out is its own provider call's, plus OWNER_MARGIN).
- **The MongoDB tier** (storage/answers.py), shared by machines: the owner's (or a lone process's) miss claims the
  key there and keeps the answer there once charged. Its operations are bounded (TIER_CONCURRENCY, TIER_BACKLOG)
  and its first round trip waited for CLAIM_WAIT at most, so a slow database never holds the calls back.
"""

import asyncio
import functools
import logging
import time
import urllib.parse
import zlib
from dataclasses import dataclass

import httptools
import orjson

from runtime.metrics import Metrics
from social.http1 import Http1Pool, TooLarge
from social.upstream import UpstreamError, UpstreamResponse
from storage.answers import AnswerStore, Cached

log = logging.getLogger("gateway.cache")
CLAIM_WAIT = 1.0  # seconds a miss waits for the shared tier's first answer before it asks the provider anyway
# The shared tier's database operations under way at once, and its writes waiting: bounded so that a burst of
# misses never queues ahead of the heartbeat and the usage flushes for the driver's connections (unbounded, a
# bench --cache run went without a heartbeat for 15 s and stopped spending: 503). Past the backlog a
# write is dropped: a cache entry the other processes will not share.
TIER_CONCURRENCY = 16
TIER_BACKLOG = 512
ANSWER_PATH = "/worker-answer"  # on the loopback application of each worker (handlers/ops/handlers.py peer_app)
DROP_PATH = "/worker-drop"
SECRET_HEADER = "X-Scrape-Secret"  # the run's secret, as for /metrics (runtime/scrape.py)
# Seconds to take a loopback connection. The parent keeps every worker's port bound, so the kernel takes it even
# while the worker restarts: a connection that takes long is a starved machine, not a dead sibling (at 0.25 s, loop
# stalls of a loaded machine passed owners over, and their keys were fetched twice: 1.09 x the least calls).
PEER_CONNECT = 5.0
DOWN_SECONDS = 2.0  # how long a sibling that failed a call is not asked (its restart takes about that)
MAX_ANSWER = 64 * 1024 * 1024
OWNER_MARGIN = 2.0  # seconds past its own patience the owner gets: its own time-out (an error it sends) comes first


class PeerDown(Exception):
    """The owner worker did not answer (down, restarting, or its link broke): the caller fetches itself."""


@dataclass(frozen=True)
class Provided:
    """One provider answer as every waiter of the call shares it: the response and what it is worth."""

    response: UpstreamResponse
    status: int  # the provider's, or 502 for a 2xx that is not a JSON object
    items: int | None  # the item count it is charged for; None: not chargeable (an error body, a 4xx, a 5xx)
    page: object = None  # the parsed page, when the caller asked for it (the poller reads its tweets)
    following: str = ""  # the page's next cursor, read with the count (the crawl guard needs nothing more of it)
    owner: int | None = None  # the owner worker it came from (None: this process asked the provider)
    joined: bool = False  # the owner joined a provider call already under way for the key
    kept_at: float | None = None  # the owner kept it at once: the entry's fetched_at (to drop it by)


@dataclass(frozen=True)
class Reply:
    """The owner's answer: a kept answer (`cached`, fresh), a provider answer (`provided`), or a failure
    (`error`: its kind, with a kept answer that may stand in while the provider fails, `cached`)."""

    cached: Cached | None = None
    provided: Provided | None = None
    error: str = ""
    retry_after: int = 1
    joined: bool = False


class Tiers:
    def __init__(self, metrics: Metrics, store: AnswerStore | None):
        self.metrics, self.store = metrics, store
        self.index, self.count, self.secret = 0, 1, b""
        self._peers: dict[int, Http1Pool] = {}
        self._down: dict[int, float] = {}  # sibling -> monotonic time until which it is not asked
        self._background: set[asyncio.Task] = set()
        self._tier = asyncio.Semaphore(TIER_CONCURRENCY)

    # --- the owner worker ----------------------------------------------------------------------------
    def link(self, index: int, ports: dict[int, int], secret: str) -> None:
        """This worker's index, its siblings' loopback ports and the run's secret (a worker of --workers N)."""
        self.index, self.count, self.secret = index, len(ports) + 1, secret.encode()
        self._peers = {i: Http1Pool(f"http://127.0.0.1:{port}", PEER_CONNECT, MAX_ANSWER) for i, port in ports.items()}
        for i, pool in self._peers.items():
            # A sibling that dies closes its connections at once, an idle one too. Its port stays bound by the
            # parent, so a new connection would wait for its restart: it is left alone meanwhile.
            pool.lost = functools.partial(self._lost, i)

    def _lost(self, owner: int) -> None:
        self._down[owner] = time.monotonic() + DOWN_SECONDS

    def owner(self, key: str) -> int | None:
        """The sibling owning `key`; None: this process (a lone process, or the owner itself)."""
        if self.count == 1:
            return None
        owner = zlib.crc32(key.encode()) % self.count
        return None if owner == self.index else owner

    def up(self, owner: int) -> bool:
        return self._down.get(owner, 0.0) <= time.monotonic()

    async def ask(self, owner: int, path: str, query: str, args: dict, patience: float) -> Reply:
        """The owner's answer for the call to `path` with `query` (args: size, account, rate, fresh, cursor)."""
        target = urllib.parse.urlencode({"path": path, "q": query, **args})
        try:
            answer = await self._peers[owner].get(
                f"http://127.0.0.1:{self._peers[owner].port}{ANSWER_PATH}?{target}",
                SECRET_HEADER.encode() + b": " + self.secret + b"\r\n",
                patience + OWNER_MARGIN,
            )
        except TimeoutError:  # a slow owner (or machine) is no dead one: a second provider call would not help
            raise UpstreamError("timeout", "the owner worker did not answer in time") from None
        except (OSError, httptools.HttpParserError, TooLarge) as exc:
            self._down[owner] = time.monotonic() + DOWN_SECONDS
            raise PeerDown(type(exc).__name__) from None
        if answer.status != 200:  # a sibling draining (503) or not yet linked: as if down
            self._down[owner] = time.monotonic() + DOWN_SECONDS
            raise PeerDown(str(answer.status))
        head, _, body = answer.body.partition(b"\n")
        return decode(orjson.loads(head), body, owner)

    def drop(self, owner: int, key: str, kept_at: float) -> None:
        """Tells the owner not to serve an answer it kept for a call that was not charged after all."""
        target = urllib.parse.urlencode({"key": key, "at": repr(kept_at)})
        pool = self._peers[owner]
        self.spawn(
            pool.get(
                f"http://127.0.0.1:{pool.port}{DROP_PATH}?{target}",
                SECRET_HEADER.encode() + b": " + self.secret + b"\r\n",
                5.0,
            )
        )

    # --- the MongoDB tier ----------------------------------------------------------------------------
    async def claim(self, key: str, fresh: float, patience: float) -> Cached | str | None:
        """The shared tier's answer or fill claim. Its first round trip is waited for CLAIM_WAIT at most: a
        database slower than that (overloaded) must not hold every miss back; the call then goes to the
        provider without the claim (the write goes on, and the answer kept later ends it)."""
        first = asyncio.ensure_future(self.limited(self.store.claim(key, patience)))
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

    async def limited(self, work):
        async with self._tier:
            return await work

    def spawn(self, work) -> None:
        """A write to the shared tier (or a drop to an owner), off the request path (dropped past TIER_BACKLOG)."""
        if len(self._background) >= TIER_BACKLOG:
            work.close()
            self.metrics.cache_writes_dropped += 1
            return
        task = asyncio.create_task(self._quietly(work))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _quietly(self, work) -> None:
        try:
            await self.limited(work)
        except Exception as exc:  # the tiers are an optimisation: a failed write only costs later hits
            log.debug("the shared answer cache could not be written: %s", type(exc).__name__)

    async def close(self) -> None:
        await asyncio.gather(*self._background, return_exceptions=True)
        for pool in self._peers.values():
            pool.close()


def encode(reply: Reply) -> bytes:
    """The owner's side of the link: one line of JSON, then the answer's body."""
    head: dict = {"error": reply.error, "retry_after": reply.retry_after, "joined": reply.joined}
    body = b""
    if reply.cached is not None:
        c = reply.cached
        head["cached"] = [c.status, c.worth, c.fetched_at, c.provider]
        body = c.body
    if reply.provided is not None:
        p = reply.provided
        head["provided"] = [
            p.status,
            p.items,
            p.response.status,
            p.response.seconds,
            p.kept_at,
            p.following,
            p.response.provider,
        ]
        body = p.response.body
    return orjson.dumps(head) + b"\n" + body


def decode(head: dict, body: bytes, owner: int) -> Reply:
    cached = provided = None
    if "cached" in head:
        status, worth, fetched_at, provider = head["cached"]
        cached = Cached(status, body, worth, fetched_at, provider)
    if "provided" in head:
        status, items, raw, seconds, kept_at, following, provider = head["provided"]
        response = UpstreamResponse(raw, body, seconds, provider)
        provided = Provided(
            response, status, items, following=following, owner=owner, joined=head["joined"], kept_at=kept_at
        )
    return Reply(cached, provided, head["error"], head["retry_after"], head["joined"])


def failure(reply: Reply) -> UpstreamError:
    return UpstreamError(reply.error, "the owner worker's provider call failed", reply.retry_after)


def _seen(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()  # a late claim's failure: nobody waits for it any more
