"""The operator's cost ledger: where every provider attempt (`Attempt`) is reported, one call of `record` each.

The router (social/providers/router.py) reports to whatever `Context.ledger` is. This module holds the interface
and an in-memory one: totals per provider and endpoint, and the most recent attempts, in this process. The gateway
runs the stored one (accounting/costs.py, what the margin view and /metrics read), which implements the same
`record`: it is called on the data call's path, so it must not block or await (buffer, and write in the background)."""

from collections import deque
from typing import Protocol

from social.providers import Attempt

RECENT = 10_000  # attempts the in-memory ledger keeps (the totals count them all)


class Ledger(Protocol):
    def record(self, attempt: Attempt, failover: bool = False) -> None:
        """One attempt, as it ended (`failover`: the router asks the next provider after it). Synchronous and
        cheap: it runs on every provider call."""
        ...


class MemoryLedger:
    """This process's attempts: `totals[(provider, endpoint)]` = [attempts, failed, items, cost_usd, seconds], and
    the last RECENT attempts in `recent`."""

    def __init__(self, keep: int = RECENT):
        self.recent: deque[Attempt] = deque(maxlen=keep)
        self.totals: dict[tuple[str, str], list] = {}

    def record(self, attempt: Attempt, failover: bool = False) -> None:
        self.recent.append(attempt)
        row = self.totals.get((attempt.provider, attempt.endpoint))
        if row is None:
            row = self.totals[(attempt.provider, attempt.endpoint)] = [0, 0, 0, 0.0, 0.0]
        row[0] += 1
        row[1] += not 200 <= attempt.status < 300
        row[2] += attempt.items
        row[3] += attempt.cost_usd
        row[4] += attempt.seconds
