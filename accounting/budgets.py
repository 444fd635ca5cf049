"""Per-key credit budgets in this process: the slices it holds of each key's budget (storage/budgets.py)
and the calls reserved against them, before the account's lease (Meter.reserve)."""

import asyncio
import functools
import logging
import math
import time
from datetime import UTC, datetime, timedelta

from accounting.keys import KeyEntry
from accounting.usage import UsageReads
from config.settings import Settings
from metering.ledger import Budget, budget_period
from runtime.flight import single_flight
from storage.budgets import BudgetStore, RunOpening
from storage.keys import KeyStore
from storage.leases import LeaseStore

log = logging.getLogger("gateway.meter")

BUDGET_ATTEMPTS = 64  # each attempt either reserves, takes a slice of at least one credit, or finds none left
OPENING_WAIT = 2.0  # seconds a run started by a PATCH waits for the other processes' reports (open_run)
OPENING_POLL = 0.05  # seconds between a call's takes while the run it needs is opening


class BudgetExhausted(Exception):
    """The key's credit budget for the period cannot pay for the call (402, not the balance)."""


def _started_within(epoch: int, since_day: str) -> bool:
    """Whether a budget run that started at `epoch` (ms; 0: with its key) started within the period that
    began on `since_day` ("" for `total`). A run older than the period spent all of it through slices."""
    if not epoch:
        return False
    return not since_day or epoch >= datetime.fromisoformat(since_day).replace(tzinfo=UTC).timestamp() * 1000


class KeyBudgets:
    """The budget slices the Meter reserves from; `spawn` runs work in the background (Meter.spawn)."""

    def __init__(
        self,
        settings: Settings,
        budget_store: BudgetStore,
        keys: KeyStore,
        reads: UsageReads,
        leases: LeaseStore,
        clock,
        spawn,
    ):
        self.settings, self.budget_store, self.keys, self.reads = settings, budget_store, keys, reads
        self.leases, self.clock, self.spawn = leases, clock, spawn
        self._reported: dict[int, int] = {}  # budget id -> the newest run this process opened or reported to
        # (budget id, limit, period, epoch) -> this process's slice. Keys rolled from one another share a
        # budget id and its settings (services/keys.py); while a change reaches a process, a key may still
        # carry the old ones, and is checked with them against the shared spend.
        self.budgets: dict[tuple, Budget] = {}
        # budget id -> the slot of its newest run (highest epoch) this process knows: a call whose key entry
        # still carries an older run (loaded before a change, or waiting for a slice during one) spends from
        # the newest, which counted this process's calls in flight in the older runs when it began (_adopt).
        self._newest: dict[int, tuple] = {}
        # budget id -> the calls in flight of its keys while they have no budget (Meter.reserve): counted when
        # a budget is set (again) like the calls of its other runs.
        self.unbudgeted: dict[int, Budget] = {}
        self._budget_takes: dict[tuple, asyncio.Future] = {}
        self._periods: dict[str, tuple[str, str]] = {}
        self._periods_until = 0.0

    async def reserve(self, key: KeyEntry, most: int, least: int) -> tuple[Budget, int]:
        """Holds up to `most` (at least `least`) credits of the key's budget: (its slice, the amount held);
        BudgetExhausted when the budget cannot pay for the call."""
        for _ in range(BUDGET_ATTEMPTS):
            budget, slot, since_day = self._slot(key)
            now = self.clock()
            empty = budget.empty_until > now
            # Less than a full call is accepted only once the budget has nothing more to give (the account's
            # rule for its last credits): a slice running low is topped up first, not charged short.
            amount = budget.reserve(most, least if empty else most, now)
            if amount:
                return budget, amount
            if empty:
                break
            try:
                await self._take_slice(key, budget, slot, most, since_day)
            except RunOpening:
                await asyncio.sleep(OPENING_POLL)  # other processes are still adding what they know
        raise BudgetExhausted()

    async def open_run(
        self, account_id: str, budget_id: int, limit: int, kind: str, epoch: int, others: list[str]
    ) -> None:
        """A PATCH starts the budget again (`epoch`, ms) for period `kind`: its document for the period is
        opened before any key carries the run, with what its keys spent as far as this process knows (stored
        usage, this process's buffer and its calls in flight); the other live processes add what only they
        know when they hear of the run (heard), and no slice is taken before they have (storage/budgets.py).
        `others`: the live processes (Meter.others)."""
        previous = self._newest.get(budget_id)
        self._reported[budget_id] = epoch
        slot, period, since_day = self._adopt(budget_id, limit, kind, epoch)

        async def open_() -> None:
            taken = await self._spent_by_budget(account_id, slot, since_day)
            opens = datetime.now(UTC) + timedelta(seconds=OPENING_WAIT if others else 0)
            await self.budget_store.open(budget_id, period, epoch, taken, others, opens)

        try:
            # Registered as the slot's take: calls sent to the new run meanwhile (_slot) wait for its document.
            await single_flight(self._budget_takes, slot, open_)
        except BaseException:
            # The PATCH fails and no key carries the run: calls go on from the run before.
            del self.budgets[slot]
            if previous is not None:
                self._newest[budget_id] = previous
            raise

    def heard(self, key: KeyEntry) -> None:
        """A key changed: if its budget started a run this process has not reported to, report (in the
        background; a take of the run reports first too: _take_slice)."""
        if key.credit_limit is not None and key.budget_epoch > self._reported.get(key.budget_id, 0):
            self._reported[key.budget_id] = key.budget_epoch
            _, period, since_day = self._adopt(key.budget_id, key.credit_limit, key.period, key.budget_epoch)
            self.spawn(self._report(key.account_id, key.budget_id, period, since_day, key.budget_epoch))

    def _adopt(self, budget_id: int, limit: int, kind: str, epoch: int) -> tuple[tuple, str, str]:
        """The slot of a run this process learns of (opening it, or hearing of it), as the budget's newest:
        a call whose key entry still carries an older run spends from it (_slot), never from the older run's
        slice after what this process holds for that run was counted."""
        period, since_day = self._period(kind)
        slot = (budget_id, limit, period, epoch)
        if slot not in self.budgets:
            self.budgets[slot] = Budget(budget_id, period, limit, epoch)
        self._newest[budget_id] = slot
        return slot, period, since_day

    async def _report(self, account_id: str, budget_id: int, period: str, since_day: str, epoch: int) -> None:
        """Adds to a run opened elsewhere what this process alone knows its keys spent in the run's period:
        its calls in flight in the budget's other runs, its records not stored (or stored too late for the
        opening read). A no-op where the run does not wait for this process."""
        try:
            members = set(await self.keys.budget_members(budget_id))
            # From here to the report's write, no await: a call is either in flight or recorded, once. The
            # opening read of the stored usage started after the epoch (the run's start on the opener's clock):
            # what this process finished writing before it is in that read, the rest is reported (machines'
            # clocks must agree, as for polling: COHERENCE_POLL_SECONDS).
            spent = self._in_flight(budget_id, epoch) + self.reads.spent_unknown_since(
                account_id, members, since_day, epoch / 1000
            )
            await self.budget_store.report(budget_id, period, epoch, self.leases.process_id, spent)
        except Exception as exc:
            # The run opens at its deadline without this report: what this process knew may be spent again.
            log.warning("could not report to the new run of key budget %s: %s", budget_id, type(exc).__name__)

    def run_of(self, key: KeyEntry) -> dict | None:
        """The budget a key's calls spend from now (its limit, period and run); None without a limit. A rule
        paused for its key's budget remembers it, and resumes once the key has another (streams/poller.py)."""
        if key.credit_limit is None:
            return None
        return {"limit": key.credit_limit, "period": self._period(key.period)[0], "epoch": key.budget_epoch}

    def _in_flight(self, budget_id: int, epoch: int) -> int:
        """Credits this process holds reserved for calls of a budget's keys in its runs other than `epoch`, or
        while they had no budget."""
        without = self.unbudgeted.get(budget_id)
        held = without.reserved if without is not None else 0
        return held + sum(b.reserved for s, b in self.budgets.items() if s[0] == budget_id and s[3] != epoch)

    def tracker(self, budget_id: int) -> Budget:
        """What the calls of a budget's keys hold while the keys have no budget (no slice: only counted)."""
        tracker = self.unbudgeted.get(budget_id)
        if tracker is None:
            tracker = self.unbudgeted[budget_id] = Budget(budget_id, "", 0)
        return tracker

    def _slot(self, key: KeyEntry) -> tuple[Budget, tuple, str]:
        """The slice a call of `key` reserves from: its run's, or a newer run's of the same budget."""
        period, since_day = self._period(key.period)
        # A new period or a changed limit is a new slot; the old one goes back once idle (Meter.upkeep).
        slot = (key.budget_id, key.credit_limit, period, key.budget_epoch)
        newest = self._newest.get(key.budget_id)
        if newest is not None and newest[3] > slot[3] and newest in self.budgets:
            return self.budgets[newest], newest, self._period_start(newest)
        budget = self.budgets.get(slot)
        if budget is None:
            budget = self.budgets[slot] = Budget(key.budget_id, period, key.credit_limit, key.budget_epoch)
        if newest is None or slot[3] >= newest[3]:
            self._newest[key.budget_id] = slot
        return budget, slot, since_day

    def _period_start(self, slot: tuple) -> str:
        """The first day of a slot's period (its id: "2026-01-31", "2026-01" or "total")."""
        period = slot[2]
        return "" if period == "total" else period if len(period) == 10 else period + "-01"

    def _period(self, kind: str) -> tuple[str, str]:
        """budget_period for now, recomputed once a second rather than per call."""
        now = time.time()
        if now >= self._periods_until:
            self._periods = {k: budget_period(k, datetime.fromtimestamp(now, UTC)) for k in ("day", "month", "total")}
            self._periods_until = math.floor(now) + 1.0
        return self._periods[kind]

    async def _take_slice(self, key: KeyEntry, budget: Budget, slot: tuple, most: int, since_day: str) -> None:
        """One take per slot at a time; callers arriving meanwhile wait for it."""

        async def take() -> None:
            spent_so_far = None
            if _started_within(budget.epoch, since_day):
                if budget.epoch > self._reported.get(budget.budget_id, 0):
                    self._reported[budget.budget_id] = budget.epoch
                    # Before taking from the run: what this process knew counts first.
                    await self._report(key.account_id, budget.budget_id, budget.period, since_day, budget.epoch)
                # Set (again) during this period: its keys may have spent before, outside any budget document.
                spent_so_far = functools.partial(self._spent_by_budget, key.account_id, slot, since_day)
            grant = await self.budget_store.take(
                budget.budget_id,
                budget.period,
                budget.limit,
                budget.slice_request(most),
                most,
                spent_so_far,
                budget.epoch,
            )
            if grant:
                budget.granted += grant
            else:
                budget.empty_until = self.clock() + 1.0

        await single_flight(self._budget_takes, slot, take)

    def _retire(self, budget: Budget) -> None:
        """Gives back what this process holds unreserved of a budget it stops spending from."""
        give = budget.available
        if give > 0:
            budget.granted -= give
            self.spawn(self._give_budget_back(budget.budget_id, budget.period, give, budget.epoch))

    async def _give_budget_back(self, budget_id: int, period: str, give: int, epoch: int) -> None:
        try:
            await self.budget_store.give_back(budget_id, period, give, epoch)
        except Exception as exc:
            # The credits stay counted as taken: the budget under-spends, it never overspends.
            log.warning("could not give back %d credits of key budget %s: %s", give, budget_id, type(exc).__name__)

    async def _spent_by_budget(self, account_id: str, slot: tuple, since_day: str) -> int:
        """What the keys of a budget spent since `since_day`, stored and buffered here, plus what this process
        holds reserved for their calls in flight in the budget's other runs: the start of the run's document
        (other processes add what only they know: open_run, _report)."""
        members = set(await self.keys.budget_members(slot[0]))
        # Read with the buffer (summary takes its records before its first await): a call settling meanwhile
        # leaves its reservation for its record, counted twice (a few credits under), never missed.
        in_flight = self._in_flight(slot[0], slot[3])
        rows = await self.reads.summary(account_id, since_day, ("key_id",))
        return in_flight + sum(row[1] for (key_id,), row in rows.items() if key_id in members)

    def retire_idle(self) -> None:
        """Slices of budgets idle for 3 lease windows (or of a past period) go back for other processes."""
        for budget_id, tracker in list(self.unbudgeted.items()):
            if tracker.reserved == 0:
                del self.unbudgeted[budget_id]
        now, today = self.clock(), datetime.now(UTC)
        current = {budget_period(kind, today)[0] for kind in ("day", "month", "total")}
        for slot, budget in list(self.budgets.items()):
            if (
                budget.reserved == 0
                and slot not in self._budget_takes  # a take under way grants to this very slot
                and (now - budget.last_used > self.settings.lease_seconds * 3 or budget.period not in current)
            ):
                del self.budgets[slot]
                if self._newest.get(slot[0]) == slot:
                    del self._newest[slot[0]]
                if budget.period in current:
                    self._retire(budget)

    def retire_all(self) -> None:
        """Shutdown: every slice goes back."""
        for budget in self.budgets.values():
            self._retire(budget)
        self.budgets.clear()
        self._newest.clear()
