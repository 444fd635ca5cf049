"""In-memory caches backed by MongoDB: one load per key however many callers miss at once,
short negative caching, and stale entries served while the database is unreachable."""

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from cachetools import LRUCache

# A stale entry is refreshed, but a caller waits at most STALE_WAIT seconds for it: past that (a slow or
# unreachable database) the stale value is served, and no new refresh is tried for STALE_RETRY seconds.
# Without this, every call of a key whose entry expired during an outage waited for the driver's
# server selection timeout (5 s) before getting the stale value.
STALE_WAIT = 0.25
STALE_RETRY = 2.0


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    loads: int = 0
    stale_served: int = 0


@dataclass
class _Load:
    future: asyncio.Future
    superseded: bool = False  # the key was put or invalidated while loading: the result is out of date


class LoadingCache:
    def __init__(
        self,
        load: Callable[[Any], Awaitable[Any]],
        size: int,
        ttl: float,
        negative_ttl: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._load = load
        self._ttl, self._negative_ttl, self._clock = ttl, negative_ttl, clock
        self._items = LRUCache(size)  # key -> (value, fresh_until)
        # Unknown keys live apart so that a flood of them cannot evict known ones.
        self._unknown = LRUCache(max(1024, size // 4))
        self._loading: dict[Any, _Load] = {}
        self.stats = CacheStats()

    def peek(self, key: Any) -> Any:
        """The cached value, fresh or not, without loading."""
        item = self._items.get(key)
        return item[0] if item else None

    async def get(self, key: Any) -> Any:
        now = self._clock()
        item = self._items.get(key)
        if item is not None and item[1] > now:
            self.stats.hits += 1
            return item[0]
        until = self._unknown.get(key)
        if until is not None and until > now:
            self.stats.hits += 1
            return None
        self.stats.misses += 1
        try:
            if item is None:
                value, load = await self._load_once(key)
            else:  # the load goes on in the background past the wait (it is shielded)
                value, load = await asyncio.wait_for(self._load_once(key), STALE_WAIT)
        except Exception:  # TimeoutError included
            if item is None:
                raise
            self.stats.stale_served += 1
            self._items[key] = (item[0], self._clock() + min(self._ttl, STALE_RETRY))
            return item[0]
        # A revocation during the load must not be overwritten by what the load read before it.
        if not load.superseded:
            self._store(key, value, self._clock())
        return value

    async def _load_once(self, key: Any) -> tuple[Any, _Load]:
        load = self._loading.get(key)
        if load is None:
            # The load runs as its own task: a caller that is cancelled does not cancel it for the others.
            self.stats.loads += 1
            load = self._loading[key] = _Load(asyncio.ensure_future(self._load(key)))
            load.future.add_done_callback(lambda _: self._loading.get(key) is load and self._loading.pop(key))
        return await asyncio.shield(load.future), load

    def _supersede(self, key: Any) -> None:
        """Callers arriving from now on start a fresh load; the one under way is not stored."""
        load = self._loading.pop(key, None)
        if load is not None:
            load.superseded = True

    def _store(self, key: Any, value: Any, now: float) -> None:
        if value is None:
            self._unknown[key] = now + self._negative_ttl
        else:
            self._unknown.pop(key, None)
            self._items[key] = (value, now + self._ttl)

    def put(self, key: Any, value: Any) -> None:
        self._supersede(key)
        self._store(key, value, self._clock())

    def invalidate(self, key: Any) -> None:
        self._supersede(key)
        self._items.pop(key, None)
        self._unknown.pop(key, None)

    def clear(self) -> None:
        """Forgets every entry: values computed under settings that have just been reloaded (SIGHUP)."""
        for key in list(self._loading):
            self._supersede(key)
        self._items.clear()
        self._unknown.clear()

    def __len__(self) -> int:
        return len(self._items)
