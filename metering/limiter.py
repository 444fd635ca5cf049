"""Token buckets per key and per account: O(1) per call, one second of burst (at least one call)."""

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
        self._buckets: dict[object, list[float]] = {}  # key_id or ("account", id) -> [tokens, last_refill]

    def _tokens(self, name: object, capacity: float, rate: float, now: float) -> tuple[list[float], float]:
        bucket = self._buckets.get(name)
        if bucket is None:
            bucket = self._buckets[name] = [capacity, now]
        return bucket, min(capacity, bucket[0] + (now - bucket[1]) * rate)

    def take(self, key_id: int, rate: float, now: float) -> Decision:
        return self.take_all([(key_id, rate)], now)[0]

    def take_both(
        self, key_id: int, key_rate: float, account_id: str, account_rate: float, now: float
    ) -> tuple[Decision, Decision]:
        """The key's bucket and its account's (shared by all the account's keys)."""
        key, account = self.take_all([(key_id, key_rate), (("account", account_id), account_rate)], now)
        return key, account

    def take_all(self, limits: list[tuple[object, float]], now: float, take: bool = True) -> list[Decision]:
        """A call passes only when every bucket has a token, and only then takes one from each: a call
        refused by one limit costs nothing against the others. Each decision's `allowed` says whether
        its own bucket had a token, so the caller can tell which limit refused. `take=False` only reads."""
        state = []
        for name, rate in limits:
            capacity = max(1.0, rate)
            bucket, tokens = self._tokens(name, capacity, rate, now)
            # Waiting exactly Retry-After must be enough despite float rounding.
            state.append((bucket, capacity, rate, tokens, tokens >= 1.0 - 1e-9))
        passes = take and all(has for *_, has in state)
        decisions = []
        for bucket, capacity, rate, tokens, has in state:
            if passes:
                tokens -= 1.0
            bucket[0], bucket[1] = tokens, now
            decisions.append(
                Decision(
                    allowed=has,
                    limit=int(capacity),
                    remaining=max(0, int(tokens)),
                    reset=math.ceil((capacity - tokens) / rate),
                    retry_after=0 if passes or has else max(1, math.ceil((1.0 - tokens) / rate)),
                )
            )
        return decisions

    def give_back_both(
        self, key_id: int, key_rate: float, account_id: str, account_rate: float, now: float
    ) -> tuple[Decision, Decision]:
        """Returns the tokens a call took (take_both) when it is refused after all (its input, its credits,
        its calls under way): a refused call never costs a client part of its rate. The buckets as they are
        now, for the answer's headers."""
        limits = [(key_id, key_rate), (("account", account_id), account_rate)]
        for name, _ in limits:
            bucket = self._buckets.get(name)
            if bucket is not None:  # a bucket forgotten meanwhile reads as full anyway
                bucket[0] += 1.0  # past the capacity it reads as full (_tokens)
        key, account = self.take_all(limits, now, take=False)
        return key, account

    def forget_idle(self, now: float, idle_seconds: float = 300.0) -> None:
        """Drops buckets untouched for a while; a full bucket and a missing one behave the same."""
        stale = [k for k, (_, last) in self._buckets.items() if now - last > idle_seconds]
        for key_id in stale:
            del self._buckets[key_id]
