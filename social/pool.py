"""Who may have how many calls at the provider: each account within what its plan needs, and all of them
within the connection pool, shared fairly when it is full.

What an account needs follows from Little's law: calls in flight = rate x time each takes. An account
calling at its plan's rate R against a provider whose calls take up to T seconds keeps at most R x T
calls under way, so that is its limit (InFlight), with T = twice the provider's recent p99 latency,
between 1 s and UPSTREAM_TIMEOUT (no call outlasts the timeout): a customer within its plan never meets
it, however slow the provider's tail. One account never holds more than half the pool, whatever its
plan, so that others always find connections.

When the pool itself is full (FairSlots), calls wait for a connection, and each one freed goes to the
waiting account with the fewest connections per unit of plan weight: the heaviest user waits longest.
"""

import asyncio
import math
from collections import deque

MIN_IN_FLIGHT = 4  # even the smallest plan may have a few calls under way (a retry, a page turn)
MIN_HORIZON = 1.0  # seconds: the shortest time a call is assumed to take when sizing an account's limit
LATENCY_SAMPLES = 2048


class Latency:
    """The provider's recent latencies and the horizon derived from them (recomputed every 256 calls)."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.samples: list[float] = []
        self.horizon = timeout  # nothing observed yet: assume the longest a call may take
        self._since = 0

    def observe(self, seconds: float) -> None:
        self.samples.append(seconds)
        if len(self.samples) > 2 * LATENCY_SAMPLES:
            del self.samples[:LATENCY_SAMPLES]
        self._since += 1
        if self._since >= 256:
            self._since = 0
            recent = sorted(self.samples[-LATENCY_SAMPLES:])
            p99 = recent[min(len(recent) - 1, int(len(recent) * 0.99))]
            self.horizon = min(self.timeout, max(MIN_HORIZON, 2 * p99))


class InFlight:
    """Per account: upstream calls under way, at most what its plan's rate needs over the horizon."""

    def __init__(self, fixed: int, ceiling: int):
        self.fixed = fixed  # ACCOUNT_MAX_IN_FLIGHT: 0 follows the plan
        self.ceiling = max(1, ceiling)  # half the connection pool
        self.calls: dict[str, int] = {}

    def limit(self, rate: float, horizon: float) -> int:
        if self.fixed:
            return min(self.fixed, self.ceiling)
        return min(self.ceiling, max(MIN_IN_FLIGHT, math.ceil(rate * horizon)))

    def enter(self, account: str, limit: int) -> bool:
        """Takes a slot for one call of `account`; False (nothing taken) when it has `limit` under way."""
        under_way = self.calls.get(account, 0)
        if under_way >= limit:
            return False
        self.calls[account] = under_way + 1
        return True

    def leave(self, account: str) -> None:
        left = self.calls[account] - 1
        if left:
            self.calls[account] = left
        else:
            del self.calls[account]  # bounded by the accounts with calls under way


class PoolFull(Exception):
    """No connection to the provider came free within the wait."""


class FairSlots:
    """The connection pool's slots: free ones are taken at once; when none is free, calls wait per account
    and each freed slot goes to the account with the fewest slots held per unit of weight."""

    def __init__(self, size: int):
        self.size, self.busy = size, 0
        self.held: dict[str, int] = {}  # account -> slots held (accounts with calls under way)
        self.weights: dict[str, float] = {}  # of the accounts waiting
        self.waiting: dict[str, deque[asyncio.Future]] = {}

    async def acquire(self, account: str, weight: float, wait: float) -> None:
        if self.busy < self.size and not self.waiting:
            self.busy += 1
            self.held[account] = self.held.get(account, 0) + 1
            return
        queue = self.waiting.setdefault(account, deque())
        self.weights[account] = weight
        waiter = asyncio.get_running_loop().create_future()
        queue.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), wait)
        except TimeoutError:
            if not (waiter.done() and not waiter.cancelled()):
                waiter.cancel()
                self._forget(account, waiter)
                raise PoolFull() from None

    def release(self, account: str) -> None:
        held = self.held.get(account, 1) - 1
        if held > 0:
            self.held[account] = held
        else:
            self.held.pop(account, None)
        while self.waiting:
            lightest = min(self.waiting, key=lambda a: self.held.get(a, 0) / self.weights[a])
            waiter = self.waiting[lightest].popleft()
            if not self.waiting[lightest]:
                del self.waiting[lightest], self.weights[lightest]
            if not waiter.done():
                self.held[lightest] = self.held.get(lightest, 0) + 1
                waiter.set_result(None)  # the slot passes on: busy stays as it is
                return
        self.busy -= 1

    def _forget(self, account: str, waiter: asyncio.Future) -> None:
        queue = self.waiting.get(account)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            if not queue:
                del self.waiting[account], self.weights[account]
