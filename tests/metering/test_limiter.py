"""The token-bucket rate limiter (metering/limiter.py): bursts, refill, headers, idle buckets."""

from metering.limiter import RateLimiter


def test_limiter_burst_is_rate_but_at_least_one():
    limiter = RateLimiter()
    assert limiter.take(1, 0.2, 0.0).limit == 1
    assert limiter.take(2, 1.0, 0.0).limit == 1
    assert limiter.take(3, 20, 0.0).limit == 20
    assert limiter.take(4, 500, 0.0).limit == 500


def test_limiter_free_plan_one_call_then_429_for_five_seconds():
    limiter = RateLimiter()
    first = limiter.take(7, 0.2, 100.0)
    assert first.allowed and first.limit == 1 and first.remaining == 0 and first.retry_after == 0
    assert first.reset == 5
    denied = limiter.take(7, 0.2, 100.0)
    assert not denied.allowed and denied.retry_after == 5 and denied.remaining == 0
    # Still empty a bit later; the wait shrinks with the time already waited.
    later = limiter.take(7, 0.2, 102.0)
    assert not later.allowed and later.retry_after == 3
    # Denied calls take nothing: 5 s after the allowed one the next passes.
    assert limiter.take(7, 0.2, 105.0).allowed
    assert not limiter.take(7, 0.2, 105.0).allowed


def test_limiter_paid_plan_burst_of_twenty_then_refill_rate():
    limiter = RateLimiter()
    results = [limiter.take(1, 20, 0.0) for _ in range(20)]
    assert all(d.allowed for d in results)
    assert [d.remaining for d in results] == list(range(19, -1, -1))
    denied = limiter.take(1, 20, 0.0)
    assert not denied.allowed and denied.retry_after == 1 and denied.remaining == 0
    # 0.25 s refills 5 calls at 20/s, not more.
    allowed = sum(limiter.take(1, 20, 0.25).allowed for _ in range(10))
    assert allowed == 5
    # A full second refills the whole burst (capped at capacity, not 20 + leftovers).
    allowed = sum(limiter.take(1, 20, 10.0).allowed for _ in range(30))
    assert allowed == 20


def test_limiter_header_values():
    limiter = RateLimiter()
    d = limiter.take(1, 20, 0.0)
    assert (d.allowed, d.limit, d.remaining, d.reset, d.retry_after) == (True, 20, 19, 1, 0)
    for _ in range(9):
        d = limiter.take(1, 20, 0.0)
    # 10 tokens used: refilling them at 20/s takes 0.5 s, reported as a whole second.
    assert (d.remaining, d.reset) == (10, 1)
    limiter = RateLimiter()
    d = limiter.take(2, 2, 0.0)
    d = limiter.take(2, 2, 0.0)
    assert (d.allowed, d.limit, d.remaining, d.reset) == (True, 2, 0, 1)
    d = limiter.take(2, 2, 0.0)
    assert (d.allowed, d.remaining, d.retry_after) == (False, 0, 1)
    # Fractional rate: 0.5/s, one token empties in 2 s.
    limiter = RateLimiter()
    d = limiter.take(3, 0.5, 0.0)
    assert (d.limit, d.remaining, d.reset) == (1, 0, 2)
    assert limiter.take(3, 0.5, 0.5).retry_after == 2  # 0.25 token left to wait for: 1.5 s -> 2


def test_limiter_keys_are_independent():
    limiter = RateLimiter()
    assert limiter.take(1, 0.2, 0.0).allowed
    assert not limiter.take(1, 0.2, 0.0).allowed
    assert limiter.take(2, 0.2, 0.0).allowed
    assert not limiter.take(2, 0.2, 0.1).allowed
    assert not limiter.take(1, 0.2, 0.1).allowed


def test_limiter_forget_idle_drops_only_idle_buckets():
    limiter = RateLimiter()
    limiter.take(1, 0.2, 0.0)
    limiter.take(2, 0.2, 250.0)
    limiter.forget_idle(301.0, idle_seconds=300.0)
    assert set(limiter._buckets) == {2}
    # A forgotten bucket starts full again: same as a bucket that had refilled.
    assert limiter.take(1, 0.2, 301.0).allowed
    # A bucket touched within the idle window keeps its state.
    assert not limiter.take(2, 0.2, 251.0).allowed
