"""LoadingCache (runtime/cache.py) with fake async loaders and an injected clock."""

import asyncio

import pytest

from runtime.cache import LoadingCache


class Clock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


def test_cache_concurrent_misses_load_once():
    async def main():
        release = asyncio.Event()
        calls = []

        async def load(key):
            calls.append(key)
            await release.wait()
            return f"value-{key}"

        cache = LoadingCache(load, size=10, ttl=60, negative_ttl=5)
        tasks = [asyncio.ensure_future(cache.get("k")) for _ in range(10)]
        other = asyncio.ensure_future(cache.get("other"))
        await asyncio.sleep(0.01)
        assert calls == ["k", "other"]
        release.set()
        results = await asyncio.gather(*tasks, other)
        assert results == ["value-k"] * 10 + ["value-other"]
        assert calls == ["k", "other"]
        assert cache.stats.loads == 2
        assert await cache.get("k") == "value-k"
        assert calls == ["k", "other"]  # a hit
        assert cache.stats.hits == 1

    asyncio.run(main())


def test_cache_concurrent_misses_share_a_failure():
    async def main():
        release = asyncio.Event()
        calls = []

        async def load(key):
            calls.append(key)
            await release.wait()
            raise ConnectionError("db down")

        cache = LoadingCache(load, size=10, ttl=60, negative_ttl=5)
        tasks = [asyncio.ensure_future(cache.get("k")) for _ in range(5)]
        await asyncio.sleep(0.01)
        release.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, ConnectionError) for r in results)
        assert calls == ["k"]

    asyncio.run(main())


def test_cache_ttl_and_negative_ttl_with_injected_clock():
    async def main():
        clock = Clock()
        calls = []
        known = {"a": 1}

        async def load(key):
            calls.append(key)
            return known.get(key)

        cache = LoadingCache(load, size=10, ttl=60, negative_ttl=5, clock=clock)
        assert await cache.get("missing") is None
        assert await cache.get("missing") is None
        assert calls == ["missing"]  # negative entry served
        clock.now += 4.9
        assert await cache.get("missing") is None
        assert calls == ["missing"]
        clock.now += 0.2  # past negative_ttl: asks again, and now it exists
        known["missing"] = 2
        assert await cache.get("missing") == 2
        assert calls == ["missing", "missing"]
        assert len(cache) == 1
        # Positive entries live for ttl.
        assert await cache.get("a") == 1
        clock.now += 59
        assert await cache.get("a") == 1
        assert calls.count("a") == 1
        clock.now += 2
        known["a"] = 11
        assert await cache.get("a") == 11
        assert calls.count("a") == 2

    asyncio.run(main())


def test_cache_serves_stale_value_when_loader_fails():
    async def main():
        clock = Clock()
        state = {"fail": False}

        async def load(key):
            if state["fail"]:
                raise ConnectionError("db down")
            return {"key": key}

        cache = LoadingCache(load, size=10, ttl=60, negative_ttl=5, clock=clock)
        assert await cache.get("k") == {"key": "k"}
        clock.now += 120
        state["fail"] = True
        assert await cache.get("k") == {"key": "k"}
        assert cache.stats.stale_served == 1
        with pytest.raises(ConnectionError):  # nothing stale to serve
            await cache.get("never-seen")
        state["fail"] = False
        assert await cache.get("never-seen") == {"key": "never-seen"}

    asyncio.run(main())


def test_cache_put_invalidate_peek():
    async def main():
        calls = []

        async def load(key):
            calls.append(key)
            return "loaded"

        cache = LoadingCache(load, size=10, ttl=60, negative_ttl=5)
        assert cache.peek("k") is None
        cache.put("k", "put")
        assert cache.peek("k") == "put"
        assert await cache.get("k") == "put"
        cache.invalidate("k")
        assert await cache.get("k") == "loaded"
        cache.put("gone", None)  # put None: a negative entry
        assert await cache.get("gone") is None
        assert calls == ["k"]

    asyncio.run(main())


def test_cache_flood_of_unknown_keys_does_not_evict_known_ones():
    async def main():
        calls = []

        async def load(key):
            calls.append(key)
            return f"v{key}" if isinstance(key, str) else None

        cache = LoadingCache(load, size=8, ttl=600, negative_ttl=5)
        for key in "abcdefgh":
            assert await cache.get(key) == f"v{key}"
        for i in range(5000):
            assert await cache.get(i) is None
        calls.clear()
        for key in "abcdefgh":
            assert await cache.get(key) == f"v{key}"
        assert calls == []
        assert len(cache) == 8

    asyncio.run(main())


def test_cache_change_during_a_load_is_not_overwritten_by_it():
    """A key revoked while its load is in flight must stay revoked: the load read the database before."""

    async def main():
        release = asyncio.Event()
        database = {"k": "active"}

        async def load(key):
            seen = database[key]
            await release.wait()
            return seen

        cache = LoadingCache(load, size=10, ttl=60, negative_ttl=5)
        early = asyncio.ensure_future(cache.get("k"))
        await asyncio.sleep(0.01)
        database["k"] = "revoked"
        cache.put("k", "revoked")  # what the revoke handler does
        late = asyncio.ensure_future(cache.get("k"))  # a hit on the new value, not the old load
        release.set()
        assert await early == "active"  # it started before the revocation
        assert await late == "revoked"
        assert await cache.get("k") == "revoked"  # the stale load was not stored

        cache.invalidate("k")
        release.clear()
        first = asyncio.ensure_future(cache.get("k"))
        await asyncio.sleep(0.01)
        cache.invalidate("k")  # invalidated while loading: a newcomer loads afresh
        database["k"] = "changed"
        second = asyncio.ensure_future(cache.get("k"))
        release.set()
        assert await first == "revoked" and await second == "changed"
        assert await cache.get("k") == "changed"

    asyncio.run(main())
