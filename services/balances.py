"""Recent balances: an account's balance as an MCP tool result reports it (`_meta.balance_after`, handlers/mcp/),
without a database read per call.

Read from MongoDB on every tool call (the account document and other processes' persisted usage: Meter.balance),
it was a round trip per call: a quarter of the gateway's CPU per tool call, and at 200 calls in flight the
database's queue in every call's latency (docs/benchmarks.md, "MCP tool calls"). Here a process reads an account's
balance at most once per FRESH seconds (calls at once share the read in flight) and moves it by what this process
has spent of its lease since: exact for this process's own charges; other processes' charges and a top-up show
within FRESH seconds (other processes' charges only ever show once their usage is flushed, as in any read).
"""

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from metering.ledger import Ledger, Purse

FRESH = 1.0  # seconds an account's balance read serves its calls
_KEPT = 10_000  # accounts remembered past which the stale ones are dropped


@dataclass(slots=True)
class _Read:
    balance: int
    purse: Purse | None  # this process's lease of the account when read (None: none), and what it had spent
    spent: int
    at: float


class RecentBalances:
    """One process's recent balance reads, by account."""

    def __init__(self, ledger: Ledger, read: Callable[[str], Awaitable[int]]):
        self.ledger, self.read = ledger, read
        self.known: dict[str, _Read] = {}
        self.reading: dict[str, asyncio.Future] = {}

    async def after(self, account_id: str) -> int:
        """The account's balance now, this process's settled charges included."""
        known = self.known.get(account_id)
        purse = self.ledger.purses.get(account_id)
        if known is None or known.purse is not purse or time.monotonic() - known.at > FRESH:
            known = await self._fresh(account_id)
            purse = self.ledger.purses.get(account_id)  # charges may have settled while the read ran
        return known.balance - (purse.spent - known.spent if purse is not None and purse is known.purse else 0)

    async def _fresh(self, account_id: str) -> _Read:
        pending = self.reading.get(account_id)
        if pending is None:
            pending = self.reading[account_id] = asyncio.ensure_future(self._read(account_id))
            pending.add_done_callback(lambda _: self.reading.pop(account_id, None))
        return await asyncio.shield(pending)  # a caller cancelled does not cancel the others' read

    async def _read(self, account_id: str) -> _Read:
        balance = await self.read(account_id)
        # The read counted this process's spend as of its end: what is spent later is moved from here.
        purse = self.ledger.purses.get(account_id)
        found = _Read(balance, purse, purse.spent if purse is not None else 0, time.monotonic())
        if len(self.known) >= _KEPT:
            cut = found.at - FRESH
            self.known = {a: r for a, r in self.known.items() if r.at >= cut}
        self.known[account_id] = found
        return found
