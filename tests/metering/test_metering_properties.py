"""Property tests of the metering core: random interleavings of lease grants, reservations,
settlements, releases, top-ups, give-backs and lease closes against a model of the database,
and the limiter's admission bound."""

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from metering.ledger import Ledger
from metering.limiter import RateLimiter

ACCOUNTS = ("a", "b", "c")
LEASE_SECONDS = 60.0
accounts = st.sampled_from(ACCOUNTS)


class LedgerMachine(RuleBasedStateMachine):
    """One process's Ledger over a model database `{account: credits}` plus this process's lease
    amount per account, moved exactly like storage/leases.py (take, shrink, close) and driven like
    accounting/meter.py (reserve, refill on shortfall unless known empty, settle or release)."""

    @initialize(initial=st.fixed_dictionaries({a: st.integers(0, 5000) for a in ACCOUNTS}))
    def setup(self, initial):
        self.ledger = Ledger(LEASE_SECONDS)
        self.now = 1000.0
        self.db = dict(initial)  # accounts.credits
        self.db_lease = {a: 0 for a in ACCOUNTS}  # accounts.leases.<this process>.amount
        self.initial = dict(initial)
        self.topups = {a: 0 for a in ACCOUNTS}
        self.closed_spent = {a: 0 for a in ACCOUNTS}  # spent by purses already closed
        self.usage = []  # the usage records: (account, credits)
        self.outstanding = []  # reservations of calls in flight

    # --- the database side (storage/leases.py) -------------------------------------------------
    def _take(self, account, want, least):
        """LeaseStore.take: move `want`, or all that is left if at least `least`; the new lease amount."""
        credits = self.db[account]
        if credits >= want:
            moved = want
        elif credits >= least and credits > 0:
            moved = credits
        else:
            return None
        self.db[account] -= moved
        self.db_lease[account] += moved
        return self.db_lease[account]

    # --- rules -------------------------------------------------------------------------------------
    @rule(account=accounts, most=st.integers(1, 600), least=st.integers(1, 300))
    def call(self, account, most, least):
        """Meter.reserve: from the purse, else refill once and try again."""
        least = min(least, most)
        before = self.ledger.purses[account].available if account in self.ledger.purses else 0
        reservation = self.ledger.reserve(account, most, least, self.now)
        refilled = tried = False
        if reservation is None and self.ledger.usable(self.now) and not self.ledger.is_known_empty(account, self.now):
            tried = True
            want = self.ledger.lease_request(account, most)
            assert want >= most * 20
            leased = self._take(account, want, least)
            if leased is None:
                self.ledger.mark_empty(account, self.now)
                assert self.ledger.is_known_empty(account, self.now)
            else:
                self.ledger.lease_is(account, leased, self.now)
                refilled = True
            reservation = self.ledger.reserve(account, most, least, self.now)
        if not self.ledger.usable(self.now):
            assert reservation is None
            return
        if reservation is None:
            # 402 only when neither the purse nor the balance can pay for the cheapest outcome.
            assert not refilled
            assert self.ledger.purses[account].available < least
            if tried:
                assert self.db[account] < least
            return
        assert reservation.account_id == account
        if not refilled:
            assert reservation.amount == min(most, before)
        assert least <= reservation.amount <= most
        self.outstanding.append(reservation)

    @precondition(lambda self: self.outstanding)
    @rule(pick=st.integers(0, 10**6), data=st.data())
    def settle(self, pick, data):
        reservation = self.outstanding.pop(pick % len(self.outstanding))
        cost = data.draw(st.integers(0, 2 * reservation.amount + 50), label="cost")
        self.now += data.draw(st.floats(0, 5), label="latency")
        purse = self.ledger.purses[reservation.account_id]
        spent_before = purse.spent
        charged = self.ledger.settle(reservation, cost, self.now)
        assert charged == min(cost, reservation.amount)
        assert charged <= reservation.amount
        assert purse.spent == spent_before + charged
        self.usage.append((reservation.account_id, charged))

    @precondition(lambda self: self.outstanding)
    @rule(pick=st.integers(0, 10**6))
    def release(self, pick):
        reservation = self.outstanding.pop(pick % len(self.outstanding))
        purse = self.ledger.purses[reservation.account_id]
        spent_before = purse.spent
        self.ledger.release(reservation)
        assert purse.spent == spent_before

    @rule(account=accounts, credits=st.integers(1, 5000))
    def topup(self, account, credits):
        """Meter.add_credits: the balance grows, the next shortfall asks the database again."""
        self.db[account] += credits
        self.topups[account] += credits
        self.ledger.forget_empty(account)
        assert not self.ledger.is_known_empty(account, self.now)

    @rule(idle=st.one_of(st.just(0.0), st.floats(150, 400)))
    def give_back_surplus(self, idle):
        """Meter.upkeep: idle purses give their unreserved credits back (LeaseStore.shrink)."""
        self.now += idle
        for account, give in self.ledger.surplus(self.now, LEASE_SECONDS * 3).items():
            purse = self.ledger.purses[account]
            assert 0 < give == purse.available
            assert purse.leased == self.db_lease[account]  # the compare-and-set guard holds
            keep = purse.leased - give
            self.db[account] += give
            self.db_lease[account] = keep
            purse.leased = keep
            assert purse.available == 0

    @rule(account=accounts)
    def close(self, account):
        """Meter.close / LeaseStore.close: a purse with nothing in flight returns leased - spent."""
        purse = self.ledger.purses.get(account)
        if purse is None or purse.reserved:
            return
        assert purse.leased == self.db_lease[account]
        self.db[account] += purse.leased - purse.spent
        self.db_lease[account] = 0
        self.closed_spent[account] += purse.spent
        del self.ledger.purses[account]

    @rule(seconds=st.one_of(st.floats(0, 2), st.floats(0, 400)))
    def advance(self, seconds):
        self.now += seconds

    @rule(alive=st.booleans(), for_seconds=st.floats(0, 60))
    def heartbeat(self, alive, for_seconds):
        """A heartbeat extends the validity of the leases; a missed one lets it run out."""
        self.ledger.valid_until = self.now + for_seconds if alive else self.now

    # --- invariants after every step -----------------------------------------------------------
    @invariant()
    def purses_never_overdrawn(self):
        if not hasattr(self, "ledger"):
            return
        for account, purse in self.ledger.purses.items():
            assert purse.available >= 0, (account, purse)
            assert 0 <= purse.spent <= purse.leased, (account, purse)
            assert purse.reserved >= 0, (account, purse)
            assert purse.reserved == sum(r.amount for r in self.outstanding if r.account_id == account)
            assert purse.leased == self.db_lease[account]
            assert purse.rate >= 0

    @invariant()
    def money_reconciles(self):
        if not hasattr(self, "ledger"):
            return
        for account in ACCOUNTS:
            assert self.db[account] >= 0
            purse = self.ledger.purses.get(account)
            leased = purse.leased if purse else 0
            spent = purse.spent if purse else 0
            charged = sum(c for a, c in self.usage if a == account)
            # Usage records are the charges: their sum is everything ever spent.
            assert charged == spent + self.closed_spent[account]
            # Credits only move between the balance and the lease; a close takes the spent part out.
            assert (
                self.db[account] + leased == self.initial[account] + self.topups[account] - self.closed_spent[account]
            )
            # The balance (unleased + still held) is the top-ups minus the settled charges.
            assert (
                self.db[account] + self.ledger.held(account, self.db_lease[account])
                == self.initial[account] + self.topups[account] - charged
            )
        assert self.ledger.in_flight() == sum(r.amount for r in self.outstanding)


LedgerMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=50, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
TestLedgerMachine = LedgerMachine.TestCase


# --- limiter -------------------------------------------------------------------------------------

rates = st.one_of(st.sampled_from([0.2, 1.0, 20.0, 50.0, 500.0]), st.floats(0.05, 1000))


@settings(max_examples=300, deadline=None, database=None)
@given(
    rate=rates, gaps=st.lists(st.one_of(st.just(0.0), st.floats(0, 0.5), st.floats(0, 10)), min_size=1, max_size=300)
)
def test_limiter_never_admits_more_than_burst_plus_rate(rate, gaps):
    limiter = RateLimiter()
    start = now = 5000.0
    capacity = max(1.0, rate)
    allowed = 0
    for gap in gaps:
        now += gap
        decision = limiter.take(1, rate, now)
        allowed += decision.allowed
        assert decision.limit == int(capacity)
        assert 0 <= decision.remaining <= decision.limit
        assert decision.allowed == (decision.retry_after == 0)
        # Over every prefix: at most a full bucket plus what refills during the window.
        assert allowed <= capacity + rate * (now - start) + 1e-6
    # A key with a different id is untouched by all of that.
    assert limiter.take(2, rate, now).allowed


@settings(max_examples=300, deadline=None, database=None)
@given(rate=rates, gaps=st.lists(st.floats(0, 3), min_size=1, max_size=60))
def test_limiter_retry_after_is_honoured(rate, gaps):
    """A client that waits the Retry-After it was given gets through."""
    limiter = RateLimiter()
    now = 0.0
    for gap in gaps:
        now += gap
        decision = limiter.take(1, rate, now)
        if not decision.allowed:
            assert decision.retry_after >= 1
            waited = copy.deepcopy(limiter)
            assert waited.take(1, rate, now + decision.retry_after).allowed
        else:
            # The bucket is full again after `reset` seconds.
            full = copy.deepcopy(limiter)
            assert full.take(1, rate, now + decision.reset).remaining == int(max(1.0, rate)) - 1
