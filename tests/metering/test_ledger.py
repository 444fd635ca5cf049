"""The in-process ledger (metering/ledger.py): leases, reserve, settle, release, surplus, lease sizing."""

from metering.ledger import Ledger, Reservation


def leased_ledger(amount=1000, now=0.0, lease_seconds=60.0):
    ledger = Ledger(lease_seconds)
    ledger.lease_is("a", amount, now)
    return ledger


def test_reserve_unknown_account_is_none():
    assert Ledger(60).reserve("nobody", 10, 1, 0.0) is None


def test_reserve_most_then_everything_left_if_at_least_least():
    ledger = leased_ledger(100)
    first = ledger.reserve("a", 60, 15, 0.0)
    assert first == Reservation("a", 60)
    second = ledger.reserve("a", 60, 15, 0.0)  # 40 left: at least 15, so all 40
    assert second == Reservation("a", 40)
    assert ledger.purses["a"].available == 0
    assert ledger.reserve("a", 60, 15, 0.0) is None
    ledger.release(first)
    ledger.release(second)
    assert ledger.purses["a"].available == 100


def test_reserve_none_below_least_and_exactly_least_passes():
    ledger = leased_ledger(14)
    assert ledger.reserve("a", 300, 15, 0.0) is None
    assert ledger.purses["a"].reserved == 0
    ledger = leased_ledger(15)
    assert ledger.reserve("a", 300, 15, 0.0) == Reservation("a", 15)


def test_settle_caps_at_reservation_and_returns_the_charge():
    ledger = leased_ledger(1000)
    r = ledger.reserve("a", 300, 15, 0.0)
    assert ledger.settle(r, 120, 0.5) == 120
    purse = ledger.purses["a"]
    assert (purse.spent, purse.reserved, purse.available) == (120, 0, 880)
    r = ledger.reserve("a", 300, 15, 1.0)
    assert ledger.settle(r, 5000, 1.5) == 300
    assert (purse.spent, purse.reserved, purse.available) == (420, 0, 580)


def test_release_gives_the_whole_reservation_back():
    ledger = leased_ledger(100)
    r = ledger.reserve("a", 100, 15, 0.0)
    assert ledger.reserve("a", 15, 15, 0.0) is None
    assert ledger.in_flight() == 100
    ledger.release(r)
    assert ledger.in_flight() == 0
    assert ledger.purses["a"].available == 100
    assert ledger.purses["a"].spent == 0


def test_held_counts_in_flight_calls_as_unspent():
    ledger = leased_ledger(1000)
    assert ledger.held("nobody", 0) == 0
    assert ledger.held("nobody", 500) == 500  # a lease whose take has not been answered yet: nothing spent
    r1 = ledger.reserve("a", 300, 15, 0.0)
    assert ledger.held("a", 1000) == 1000
    ledger.settle(r1, 200, 0.1)
    assert ledger.held("a", 1000) == 800
    ledger.reserve("a", 300, 15, 0.2)
    assert ledger.held("a", 1000) == 800
    # The lease amount of the document read, not the purse's: a refill of 500 not yet in that document.
    ledger.lease_is("a", 1500, 0.3)
    assert ledger.held("a", 1000) == 800


def test_mark_empty_forget_empty_and_timing():
    ledger = Ledger(60)
    assert not ledger.is_known_empty("a", 0.0)
    ledger.mark_empty("a", 100.0, empty_for=2.0)
    assert ledger.is_known_empty("a", 100.0)
    assert ledger.is_known_empty("a", 101.99)
    assert not ledger.is_known_empty("a", 102.0)
    # A purse created only by mark_empty holds nothing.
    assert ledger.reserve("a", 15, 15, 100.0) is None
    ledger.mark_empty("a", 200.0)  # default: one second
    assert ledger.is_known_empty("a", 200.5)
    assert not ledger.is_known_empty("a", 201.0)
    ledger.mark_empty("a", 300.0)
    ledger.forget_empty("a")  # a top-up
    assert not ledger.is_known_empty("a", 300.0)
    ledger.mark_empty("a", 400.0)
    ledger.lease_is("a", 50, 400.0)  # a new lease also ends it
    assert not ledger.is_known_empty("a", 400.0)
    ledger.forget_empty("unknown")  # no purse: nothing to do, no error
    assert "unknown" not in ledger.purses


def test_lease_is_keeps_spent_and_reserved():
    ledger = leased_ledger(100)
    r = ledger.reserve("a", 30, 15, 0.0)
    ledger.settle(r, 20, 0.1)
    ledger.reserve("a", 30, 15, 0.2)
    ledger.lease_is("a", 500, 0.3)
    purse = ledger.purses["a"]
    assert (purse.leased, purse.spent, purse.reserved, purse.available) == (500, 20, 30, 450)


def test_usable_valid_until_blocks_reservations():
    ledger = leased_ledger(1000)
    assert ledger.usable(1e12)
    ledger.valid_until = 10.0
    assert ledger.usable(9.99)
    assert ledger.reserve("a", 100, 15, 9.99) is not None
    assert not ledger.usable(10.0)
    assert ledger.reserve("a", 100, 15, 10.0) is None
    assert ledger.reserve("a", 100, 15, 11.0) is None
    assert ledger.purses["a"].reserved == 100  # the refused reservations held nothing
    ledger.valid_until = 20.0  # heartbeat succeeded again
    assert ledger.reserve("a", 100, 15, 11.0) is not None


def test_surplus_only_for_idle_purses_with_available_credits():
    ledger = Ledger(60)
    ledger.lease_is("idle", 500, 0.0)
    ledger.lease_is("busy", 500, 0.0)
    ledger.lease_is("spent", 100, 0.0)
    ledger.lease_is("inflight", 300, 0.0)
    r = ledger.reserve("spent", 100, 15, 0.0)
    ledger.settle(r, 100, 0.0)
    ledger.reserve("inflight", 100, 15, 0.0)
    ledger.reserve("busy", 10, 10, 150.0)
    assert ledger.surplus(100.0, idle_seconds=100.0) == {}  # nobody idle for more than 100 s yet
    surplus = ledger.surplus(200.0, idle_seconds=100.0)
    # Only unreserved credits of idle purses; an emptied purse has nothing to give back.
    assert surplus == {"idle": 500, "inflight": 200}


def test_lease_request_grows_with_spend_rate():
    ledger = Ledger(60.0)
    assert ledger.lease_request("a", 300) == 6000  # unknown account: 20 full calls
    ledger.lease_is("a", 10**9, 0.0)
    assert ledger.lease_request("a", 300) == 6000
    # Spend 5,000 credits per second for three lease windows: toward 300,000 credits per window.
    t, requests = 0.0, []
    for _ in range(1800):
        r = ledger.reserve("a", 500, 15, t)
        ledger.settle(r, 500, t + 0.05)
        t += 0.1
        requests.append(ledger.lease_request("a", 300))
    assert requests == sorted(requests)
    assert 270_000 <= requests[-1] <= 310_000


def test_lease_request_tracks_the_real_spend_rate_between_calls():
    """The smoothed rate must measure credits per second of wall time, not per second of call time:
    one 1,000-credit call every 10 s (200 ms each) is 100 credits/s, 6,000 per 60 s window."""
    ledger = Ledger(60.0)
    ledger.lease_is("a", 10**9, 0.0)
    t = 0.0
    for _ in range(200):
        r = ledger.reserve("a", 1000, 15, t)
        ledger.settle(r, 1000, t + 0.2)
        t += 10.0
    assert 50 <= ledger.purses["a"].rate <= 150
    assert ledger.lease_request("a", 10) <= 9000
    # After a long pause the estimate decays: the next lease is sized by the recent past.
    r = ledger.reserve("a", 15, 15, t + 3600)
    ledger.settle(r, 15, t + 3600.1)
    assert ledger.purses["a"].rate < 1
    assert ledger.lease_request("a", 300) == 6000


def test_a_call_whose_lease_was_dropped_is_not_charged_and_leaves_the_new_lease_alone():
    # Declared dead, the process drops its purses (their leases were reclaimed with these calls counted
    # as unspent) and takes a new lease; calls reserved before finish afterwards.
    ledger = leased_ledger(100)
    charged_late, released_late = ledger.reserve("a", 60, 15, 0.0), ledger.reserve("a", 30, 15, 0.0)
    ledger.purses.clear()
    ledger.lease_is("a", 50, 1.0)
    assert ledger.settle(charged_late, 60, 2.0) == 0
    ledger.release(released_late)
    purse = ledger.purses["a"]
    assert (purse.leased, purse.spent, purse.reserved, purse.available) == (50, 0, 0, 50)
