"""In-process credit ledger over leases.

An account's balance lives in MongoDB. A process never spends it directly: it
takes a *lease* (credits moved atomically out of the balance into a lease held
by this process), then reserves from the lease before each upstream call and
settles the real charge afterwards. The sum of leases never exceeds the
balance, so no number of processes can overspend an account, and no await
sits between the check and the reservation.

Charges are persisted as usage records tagged with the lease (the process id); closing a
lease gives back `leased - spent`. A lease whose process died is reclaimed by
summing that lease's persisted usage records (storage/leases.py).
"""

from dataclasses import dataclass, field
from datetime import datetime, timedelta

RATE_WINDOW = 2.0  # seconds over which the spend rate is smoothed


@dataclass
class Purse:
    """What this process holds for one account; `leased` mirrors the lease amount in the database."""

    leased: int = 0  # credits moved from the account balance into this process's lease
    spent: int = 0  # settled charges against the lease (flushed or still buffered)
    reserved: int = 0  # held by calls in flight
    rate: float = 0.0  # smoothed spend, credits per second, to size the next lease
    last_used: float = 0.0
    last_settled: float | None = None  # when `rate` was last updated (reserve moves last_used, not this)
    empty_until: float = 0.0  # the database had nothing more to lease; do not ask again before this
    balance_seen: int = 0  # the unleased balance the last take left in the database
    others: int = 0  # other processes holding leases on the account at the last take

    @property
    def available(self) -> int:
        return self.leased - self.spent - self.reserved


@dataclass(eq=False)
class Budget:
    """A per-key budget's slice held by this process for one period (storage/budgets.py): calls of the
    budget's keys reserve from it like from the account's lease, with no await between check and hold."""

    budget_id: int
    period: str
    limit: int
    epoch: int = 0  # the key's budget_epoch: which run of the budget (storage/budgets.py)
    granted: int = 0  # credits of the budget's slices this process took for the period
    spent: int = 0
    reserved: int = 0
    empty_until: float = 0.0  # the budget had nothing more to give: refuse without asking for a moment
    last_used: float = 0.0

    @property
    def available(self) -> int:
        return self.granted - self.spent - self.reserved

    def reserve(self, most: int, least: int, now: float) -> int:
        """Holds up to `most` (at least `least`) credits; 0 if less is left in this process's slices."""
        available = self.granted - self.spent - self.reserved
        if available < least:
            return 0
        amount = min(most, available)
        self.reserved += amount
        self.last_used = now
        return amount

    def slice_request(self, most: int) -> int:
        # Large and growing slices: every take is two database round trips, so a busy key should need a
        # handful per period, not one every 20 calls. storage/budgets.py grants at most half of what the
        # limit leaves, so other processes spending from the budget still find some.
        return max(most * 200, 2 * self.reserved, self.granted)


def budget_period(kind: str, now: datetime) -> tuple[str, str]:
    """(period id, first day of the period as an ISO date, "" for `total`) of a budget at `now` (UTC)."""
    if kind == "day":
        day = now.date().isoformat()
        return day, day
    if kind == "month":
        first = now.date().replace(day=1).isoformat()
        return first[:7], first
    return "total", ""


def period_end(kind: str, now: datetime) -> datetime | None:
    """When the current period ends (UTC midnight), None for `total`."""
    midnight = datetime(now.year, now.month, now.day, tzinfo=now.tzinfo)
    if kind == "day":
        return midnight + timedelta(days=1)
    if kind == "month":
        return datetime(now.year + now.month // 12, now.month % 12 + 1, 1, tzinfo=now.tzinfo)
    return None


@dataclass(frozen=True)
class Reservation:
    account_id: str
    amount: int
    budget: Budget | None = None  # the key's budget, holding the same amount
    # The purse it was reserved from: released there even if the process has since dropped it (declared
    # dead: accounting/meter.py), never against a purse of a later lease of the account.
    purse: Purse | None = field(default=None, repr=False, compare=False)


class Ledger:
    def __init__(self, lease_seconds: float):
        self.lease_seconds = lease_seconds
        self.purses: dict[str, Purse] = {}
        # Leases may be used until then: a process that cannot prove it is alive (heartbeat)
        # stops spending before others may reclaim its leases.
        self.valid_until = float("inf")

    def usable(self, now: float) -> bool:
        return now < self.valid_until

    def reserve(self, account_id: str, most: int, least: int, now: float) -> Reservation | None:
        """Holds `most` credits, or everything left if that is at least `least`; None if less is left."""
        purse = self.purses.get(account_id)
        if purse is None or purse.available < least or not self.usable(now):
            return None
        amount = min(most, purse.available)
        purse.reserved += amount
        purse.last_used = now
        return Reservation(account_id, amount, purse=purse)

    def settle(self, reservation: Reservation, cost: int, now: float) -> int:
        """Charges min(cost, reserved) and releases the rest; returns the charge."""
        purse = reservation.purse
        if purse is not self.purses.get(reservation.account_id):
            # Its lease was reclaimed meanwhile (this process was declared dead) with this call counted as
            # unspent: the credits are back in the balance, so the call is not charged.
            self.release(reservation)
            return 0
        charged = min(cost, reservation.amount)
        purse.reserved -= reservation.amount
        purse.spent += charged
        if reservation.budget is not None:
            reservation.budget.reserved -= reservation.amount
            reservation.budget.spent += charged
        # Time since the previous charge, not since this call's reservation: else idle gaps never decay the rate.
        since = purse.last_used if purse.last_settled is None else purse.last_settled
        elapsed = max(now - since, 0.001)
        # Exponential smoothing over a couple of seconds: a lease sized from a rate that lags a rising
        # spend would send every account back to the database several times a second.
        weight = min(1.0, elapsed / RATE_WINDOW)
        purse.rate = purse.rate * (1 - weight) + (charged / elapsed) * weight
        purse.last_used = purse.last_settled = now
        return charged

    def release(self, reservation: Reservation) -> None:
        reservation.purse.reserved -= reservation.amount
        if reservation.budget is not None:
            reservation.budget.reserved -= reservation.amount

    def lease_request(self, account_id: str, most: int) -> int:
        """How many credits to ask the database for so that calls can go on for a lease window."""
        purse = self.purses.get(account_id)
        if purse is None:
            return most * 20
        # Enough for a lease window at the current spend, and for every call now in flight twice over.
        want = max(most * 20, int(purse.rate * self.lease_seconds), 2 * purse.reserved)
        if purse.others:
            # Other processes spend from this account too: take at most a 1/(2h) share of what the
            # balance held (h holders), so that they still find credits there, but always one full call.
            want = min(want, max(most, purse.balance_seen // (2 * (purse.others + 1))))
        return want

    def needs_topup(self, account_id: str, most: int, now: float) -> bool:
        """Refill in the background before the lease runs dry: under a quarter of the next lease is left."""
        purse = self.purses.get(account_id)
        return (
            purse is not None
            and self.usable(now)
            and purse.empty_until <= now
            and purse.available < self.lease_request(account_id, most) // 4
        )

    def is_known_empty(self, account_id: str, now: float) -> bool:
        purse = self.purses.get(account_id)
        return purse is not None and purse.empty_until > now

    def lease_is(self, account_id: str, leased: int, now: float, balance: int = 0, others: int = 0) -> None:
        """Records the lease amount the database now holds for this process, and what else the take saw."""
        purse = self.purses.setdefault(account_id, Purse(last_used=now))
        purse.leased = leased
        purse.empty_until = 0.0
        purse.balance_seen, purse.others = balance, others

    def mark_empty(self, account_id: str, now: float, empty_for: float = 1.0) -> None:
        """The balance had nothing more to lease: answer 402 without asking again for a moment."""
        purse = self.purses.setdefault(account_id, Purse(last_used=now))
        purse.empty_until = now + empty_for

    def forget_empty(self, account_id: str) -> None:
        """The balance grew (a top-up): the next shortfall asks the database again."""
        purse = self.purses.get(account_id)
        if purse is not None:
            purse.empty_until = 0.0

    def held(self, account_id: str, leased: int) -> int:
        """Credits this process still holds of a lease of `leased` credits, counting in-flight calls as
        unspent. `leased` comes from the same account document as the balance it is added to, not from
        `Purse.leased`: a take or give-back may have moved credits between that read and now."""
        purse = self.purses.get(account_id)
        return leased - purse.spent if purse else leased

    def surplus(self, now: float, idle_seconds: float) -> dict[str, int]:
        """Unreserved credits of accounts idle for a while, to give back to their balance."""
        return {a: p.available for a, p in self.purses.items() if p.available > 0 and now - p.last_used > idle_seconds}

    def wanted_share(self, account_id: str, now: float, hold_off: float = 1.0) -> int:
        """Another process found the balance empty: half of what this one holds unreserved goes back
        (half, so that a busy process can go on meanwhile), and this one does not lease it back for
        `hold_off` seconds, so that the other finds it."""
        purse = self.purses.get(account_id)
        if purse is None or purse.available <= 0:
            return 0
        purse.empty_until = max(purse.empty_until, now + hold_off)
        return purse.available - purse.available // 2

    def in_flight(self) -> int:
        return sum(p.reserved for p in self.purses.values())
