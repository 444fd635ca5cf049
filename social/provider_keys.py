"""The provider keys the gateway calls with (UPSTREAM_API_KEYS): each has its own rate, and calls are
spread over them within those rates.

A key is a token bucket (one second of burst). A call takes a token from the key with the most left, so
the keys wear evenly. A key the provider refuses (429, 402, 401, 403) is rested: a key with a rate that
gets 429 starts its bucket again from empty, one without a rate rests for the provider's Retry-After, a
key refused for credit or credentials for a minute; the call is sent again with another key.

When every key is out of tokens, demand exceeds what the keys allow. Then the accounts asking for more
than their fair share (the keys' rate divided over the accounts calling in the last seconds) get 429 at
once; an account within its share waits, first come first served, for the next token (at most
`max_wait` seconds). Waiting calls are served before any new call takes a token, so the heaviest
accounts are refused first and never an account below its fair share.

A single key without a rate (UPSTREAM_API_KEY, the default) skips all of this: no bookkeeping per call.
"""

import asyncio
import math
import time
from collections import deque

REST_SECONDS = 60.0  # a key refused for credit or credentials: the operator has to act; try it again later
DEMAND_SECONDS = 2.0  # how far back an account's calls count toward its demand


class Saturated(Exception):
    """Every provider key is at its rate (or rested): the call is not sent."""

    def __init__(self, retry_after: int):
        super().__init__(f"provider keys saturated, retry after {retry_after} s")
        self.retry_after = retry_after


class ProviderKey:
    __slots__ = ("secret", "label", "qps", "tokens", "stamp", "rested_until", "calls", "refusals")

    def __init__(self, secret: str, label: str, qps: float, now: float):
        self.secret, self.label, self.qps = secret, label, qps  # qps 0: no rate of its own
        self.tokens, self.stamp = max(1.0, qps), now
        self.rested_until = 0.0
        self.calls = 0
        self.refusals: dict[int, int] = {}  # provider status -> count

    def available(self, now: float) -> float:
        """Tokens this key has now (refilled); infinite for a key without a rate, 0 while rested."""
        if self.rested_until > now:
            return 0.0
        if not self.qps:
            return math.inf
        self.tokens = min(max(1.0, self.qps), self.tokens + (now - self.stamp) * self.qps)
        self.stamp = now
        return self.tokens

    def next_token(self, now: float) -> float:
        """When this key can take a call again."""
        if self.rested_until > now:
            return self.rested_until
        return now if not self.qps else now + max(0.0, 1.0 - self.tokens) / self.qps


class ProviderKeys:
    def __init__(self, keys: list[tuple[str, float]], max_wait: float = 1.0, clock=time.monotonic):
        now = clock()
        self.keys = [ProviderKey(secret, f"key{i + 1}", qps, now) for i, (secret, qps) in enumerate(keys)]
        self.max_wait, self.clock = max_wait, clock
        # The fast path: one key with no rate of its own is always the answer.
        self.only = self.keys[0] if len(self.keys) == 1 and not self.keys[0].qps else None
        self.demand: dict[str, deque[float]] = {}  # account -> times of its recent calls (only when saturated)
        self.waiters: deque[asyncio.Future] = deque()
        self.timer: asyncio.TimerHandle | None = None
        self.saturated = 0  # calls refused with 429 because every key was at its rate

    @property
    def pooled(self) -> bool:
        """Several keys: a refused key is rested and the call sent with another."""
        return len(self.keys) > 1

    async def acquire(self, account: str | None) -> ProviderKey:
        """A key with a token, taken; raises Saturated when `account` is over its share of a busy pool."""
        if self.only is not None and self.only.rested_until == 0.0:
            self.only.calls += 1
            return self.only
        now = self.clock()
        self._note(account, now)
        if not self.waiters:
            key = self._take(now)
            if key is not None:
                return key
        if self._over_share(account, now):
            self.saturated += 1
            raise Saturated(self.retry_after(now))
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        self._schedule(now)
        try:
            return await asyncio.wait_for(asyncio.shield(waiter), self.max_wait)
        except TimeoutError:
            if waiter.done() and not waiter.cancelled():
                return waiter.result()  # the token came with the timeout: use it rather than lose it
            waiter.cancel()
            self.saturated += 1
            raise Saturated(self.retry_after(self.clock())) from None

    def rest(self, key: ProviderKey, status: int, retry_after: str | None) -> None:
        """The provider refused `key` (429, 402, 401, 403): no calls with it for a while."""
        key.refusals[status] = key.refusals.get(status, 0) + 1
        now = self.clock()
        if status == 429 and key.qps:
            # A key paced at its rate meets the provider's limit at the edge (the provider counts arrival
            # times, which network jitter bunches): start its bucket again from empty rather than lose
            # whole seconds of its rate.
            key.available(now)
            key.tokens = 0.0
            return
        seconds = REST_SECONDS
        if status == 429:
            seconds = float(retry_after) if retry_after and retry_after.isdigit() else 1.0
        key.rested_until = now + min(seconds, REST_SECONDS)
        if self.only is not None and key is self.only:
            self.only.rested_until = key.rested_until  # the fast path checks the rest itself

    def _take(self, now: float) -> ProviderKey | None:
        best, most = None, 0.0
        for key in self.keys:
            tokens = key.available(now)
            if tokens >= 1.0 - 1e-9 and tokens > most:
                best, most = key, tokens
        if best is not None:
            if best.qps:
                best.tokens -= 1.0
            if best.rested_until:
                best.rested_until = 0.0
            best.calls += 1
        return best

    def _note(self, account: str | None, now: float) -> None:
        calls = self.demand.get(account or "")
        if calls is None:
            calls = self.demand[account or ""] = deque()
        calls.append(now)
        while calls and calls[0] < now - DEMAND_SECONDS:
            calls.popleft()

    def _over_share(self, account: str | None, now: float) -> bool:
        """Whether `account` asked for more than the keys' rate divided over the accounts calling."""
        horizon = now - DEMAND_SECONDS
        for name in [name for name, calls in self.demand.items() if not calls or calls[-1] < horizon]:
            del self.demand[name]  # only accounts calling lately share the keys
        live = [key for key in self.keys if key.rested_until <= now]
        if not live:
            return True  # every key rested: nobody can be served now
        if not all(key.qps for key in live):
            return False  # a key without a rate of its own takes any call
        share = sum(key.qps for key in live) / max(1, len(self.demand))
        calls = self.demand.get(account or "", ())
        return len(calls) / DEMAND_SECONDS > share

    def retry_after(self, now: float) -> int:
        """Whole seconds until some key can take a call again."""
        return max(1, math.ceil(min(key.next_token(now) for key in self.keys) - now))

    def _schedule(self, now: float) -> None:
        if self.timer is None and self.waiters:
            when = min(key.next_token(now) for key in self.keys)
            self.timer = asyncio.get_running_loop().call_later(max(0.0, when - now), self._wake)

    def _wake(self) -> None:
        self.timer = None
        now = self.clock()
        while self.waiters:
            if self.waiters[0].done():  # gave up waiting
                self.waiters.popleft()
                continue
            key = self._take(now)
            if key is None:
                break
            self.waiters.popleft().set_result(key)
        self._schedule(now)
