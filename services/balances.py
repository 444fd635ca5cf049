"""Recent balances: an account's balance as an MCP tool result reports it (`_meta.balance_after`, handlers/mcp/),
without a database read per call.

Read from MongoDB on every tool call (the account document and other processes' persisted usage: Meter.balance),
it was a round trip per call: a quarter of the gateway's CPU per tool call, and at 200 calls in flight the
database's queue in every call's latency (docs/benchmarks.md, "MCP tool calls"). Here a process reads an account's
balance at most once per FRESH seconds, in the background once it has been read (calls at once share the read in
flight), and moves it by what this process has spent of its lease since: exact for this process's own charges;
other processes' charges and a top-up show within FRESH seconds and a read (other processes' charges only ever show
once their usage is flushed, as in any read).
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from metering.ledger import Ledger, Purse

log = logging.getLogger("gateway.balances")
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
        if known is None or known.purse is not purse:
            known = await asyncio.shield(self._reading(account_id))  # a caller gone leaves the read to the others
            purse = self.ledger.purses.get(account_id)  # charges may have settled while the read ran
        elif time.monotonic() - known.at > FRESH:
            # Read again for the next calls; this one answers from the last read, moved by the spend since, so no
            # call waits for the database once its account has been read (a slow read held every call at once).
            self._reading(account_id)
        return known.balance - (purse.spent - known.spent if purse is not None and purse is known.purse else 0)

    def _reading(self, account_id: str) -> asyncio.Future:
        pending = self.reading.get(account_id)
        if pending is None:
            pending = self.reading[account_id] = asyncio.ensure_future(self._read(account_id))
            pending.add_done_callback(self._done)
        return pending

    def _done(self, read: asyncio.Future) -> None:
        for account_id, pending in list(self.reading.items()):
            if pending is read:
                del self.reading[account_id]
        if not read.cancelled() and read.exception() is not None:
            log.warning("balance read failed: %s", read.exception())  # the next call reads again

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
