"""Example-based tests of the metering core (no I/O): limiter, prices, plans, ledger,
usage buffer, the endpoint table, and the LoadingCache (with fake async loaders)."""

import asyncio

import pytest

from accounting.cache import LoadingCache
from metering.ledger import Ledger, Reservation
from metering.limiter import RateLimiter
from metering.plans import Plan, plan_for
from metering.pricing import DEFAULT_RULES, PriceError, Prices
from metering.usage import UsageBuffer
from social.endpoints import BY_PATH, ENDPOINTS, count_items, page_size

DEFAULT_PLANS = (
    {"name": "free", "min_paid_usd": 0, "qps": 0.2},
    {"name": "paid", "min_paid_usd": 0.01, "qps": 20},
    {"name": "pro", "min_paid_usd": 500, "qps": 50},
    {"name": "scale", "min_paid_usd": 5000, "qps": 500},
)


# --- limiter -------------------------------------------------------------------------------------


def test_limiter_burst_is_rate_but_at_least_one():
    limiter = RateLimiter()
    assert limiter.take(1, 0.2, 0.0).limit == 1
    assert limiter.take(2, 1.0, 0.0).limit == 1
    assert limiter.take(3, 20, 0.0).limit == 20
    assert limiter.take(4, 500, 0.0).limit == 500


def test_limiter_free_plan_one_call_then_429_for_five_seconds():
    limiter = RateLimiter()
    first = limiter.take(7, 0.2, 100.0)
    assert first.allowed and first.limit == 1 and first.remaining == 0 and first.retry_after == 0
    assert first.reset == 5
    denied = limiter.take(7, 0.2, 100.0)
    assert not denied.allowed and denied.retry_after == 5 and denied.remaining == 0
    # Still empty a bit later; the wait shrinks with the time already waited.
    later = limiter.take(7, 0.2, 102.0)
    assert not later.allowed and later.retry_after == 3
    # Denied calls take nothing: 5 s after the allowed one the next passes.
    assert limiter.take(7, 0.2, 105.0).allowed
    assert not limiter.take(7, 0.2, 105.0).allowed


def test_limiter_paid_plan_burst_of_twenty_then_refill_rate():
    limiter = RateLimiter()
    results = [limiter.take(1, 20, 0.0) for _ in range(20)]
    assert all(d.allowed for d in results)
    assert [d.remaining for d in results] == list(range(19, -1, -1))
    denied = limiter.take(1, 20, 0.0)
    assert not denied.allowed and denied.retry_after == 1 and denied.remaining == 0
    # 0.25 s refills 5 calls at 20/s, not more.
    allowed = sum(limiter.take(1, 20, 0.25).allowed for _ in range(10))
    assert allowed == 5
    # A full second refills the whole burst (capped at capacity, not 20 + leftovers).
    allowed = sum(limiter.take(1, 20, 10.0).allowed for _ in range(30))
    assert allowed == 20


def test_limiter_header_values():
    limiter = RateLimiter()
    d = limiter.take(1, 20, 0.0)
    assert (d.allowed, d.limit, d.remaining, d.reset, d.retry_after) == (True, 20, 19, 1, 0)
    for _ in range(9):
        d = limiter.take(1, 20, 0.0)
    # 10 tokens used: refilling them at 20/s takes 0.5 s, reported as a whole second.
    assert (d.remaining, d.reset) == (10, 1)
    limiter = RateLimiter()
    d = limiter.take(2, 2, 0.0)
    d = limiter.take(2, 2, 0.0)
    assert (d.allowed, d.limit, d.remaining, d.reset) == (True, 2, 0, 1)
    d = limiter.take(2, 2, 0.0)
    assert (d.allowed, d.remaining, d.retry_after) == (False, 0, 1)
    # Fractional rate: 0.5/s, one token empties in 2 s.
    limiter = RateLimiter()
    d = limiter.take(3, 0.5, 0.0)
    assert (d.limit, d.remaining, d.reset) == (1, 0, 2)
    assert limiter.take(3, 0.5, 0.5).retry_after == 2  # 0.25 token left to wait for: 1.5 s -> 2


def test_limiter_keys_are_independent():
    limiter = RateLimiter()
    assert limiter.take(1, 0.2, 0.0).allowed
    assert not limiter.take(1, 0.2, 0.0).allowed
    assert limiter.take(2, 0.2, 0.0).allowed
    assert not limiter.take(2, 0.2, 0.1).allowed
    assert not limiter.take(1, 0.2, 0.1).allowed


def test_limiter_forget_idle_drops_only_idle_buckets():
    limiter = RateLimiter()
    limiter.take(1, 0.2, 0.0)
    limiter.take(2, 0.2, 250.0)
    limiter.forget_idle(301.0, idle_seconds=300.0)
    assert set(limiter._buckets) == {2}
    # A forgotten bucket starts full again: same as a bucket that had refilled.
    assert limiter.take(1, 0.2, 301.0).allowed
    # A bucket touched within the idle window keeps its state.
    assert not limiter.take(2, 0.2, 251.0).allowed


# --- pricing -------------------------------------------------------------------------------------

P = Prices()


def test_default_rules_match_reference_prices():
    assert P.minimum == 15
    assert P.cost("tweets", 20, 20) == 300
    assert P.cost("tweets", 1, 20) == 15
    assert P.cost("tweets", 2, 20) == 30
    assert P.cost("profiles", 1, 1) == 18
    assert P.cost("profiles", 20, 20) == 360
    assert P.cost("verified_followers", 20, 20) == 60
    assert P.cost("verified_followers", 5, 20) == 15
    assert P.cost("verified_followers", 6, 20) == 18
    assert P.cost("call", 30, 30) == 15


def test_minimum_charge_on_empty_results():
    for rule in ("tweets", "profiles", "batch_profiles", "follows", "verified_followers", "call"):
        assert P.cost(rule, 0, 20) == 15, rule
    assert P.cost("follower_ids", 0, 5000) == 100
    assert P.cost("panel", 0, 1) == 30


def test_panel_is_flat_per_call():
    assert P.cost("panel", 1, 1) == 30
    assert P.cost("panel", 0, 1) == 30
    assert P.cost("panel", 1000, 1000) == 30


@pytest.mark.parametrize("size,each", [(200, 1), (199, 2), (100, 2), (99, 3), (1, 3)])
def test_follows_tiers_by_page_size(size, each):
    assert P.cost("follows", size, size) == max(15, size * each)
    # The tier comes from the page size asked for, not from the items returned.
    assert P.cost("follows", 50, size) == max(15, 50 * each)


def test_follows_exact_boundary_amounts():
    assert P.cost("follows", 200, 200) == 200
    assert P.cost("follows", 199, 199) == 398
    assert P.cost("follows", 100, 100) == 200
    assert P.cost("follows", 99, 99) == 297
    assert P.cost("follows", 5, 99) == 15


def test_follower_ids_tiers_and_minimum():
    assert P.cost("follower_ids", 4000, 4000) == 1800  # 0.45 * 4000, exactly
    assert P.cost("follower_ids", 5000, 5000) == 2250
    assert P.cost("follower_ids", 3999, 4000) == 1800  # 1799.55 rounds up
    assert P.cost("follower_ids", 3999, 3999) == 3999
    assert P.cost("follower_ids", 200, 200) == 200
    assert P.cost("follower_ids", 199, 199) == 398
    # Minimum 100 per call.
    assert P.cost("follower_ids", 199, 4000) == 100  # 89.55 -> 100
    assert P.cost("follower_ids", 99, 200) == 100
    assert P.cost("follower_ids", 100, 200) == 100
    assert P.cost("follower_ids", 101, 200) == 101
    assert P.cost("follower_ids", 50, 199) == 100
    assert P.cost("follower_ids", 51, 199) == 102
    assert P.cost("follower_ids", 1, 50) == 100


def test_batch_profiles_cheaper_from_100_ids():
    assert P.cost("batch_profiles", 99, 99) == 990
    assert P.cost("batch_profiles", 100, 100) == 100
    assert P.cost("batch_profiles", 99, 100) == 99  # tier by ids sent
    assert P.cost("batch_profiles", 10, 100) == 15  # minimum
    assert P.cost("batch_profiles", 2, 99) == 20
    assert P.cost("batch_profiles", 1, 1) == 15


def test_price_overrides_replace_rules_and_minimum():
    prices = Prices({"tweets": {"each": 10}, "minimum": 5, "panel": {"call": 40}})
    assert prices.cost("tweets", 20, 20) == 200
    assert prices.cost("tweets", 0, 20) == 5
    assert prices.cost("panel", 0, 1) == 40
    assert prices.cost("profiles", 1, 1) == 18  # untouched rules keep their defaults
    # A rule's own minimum can be raised above the global one, fractional prices round up.
    prices = Prices({"tweets": {"each": 0.5, "minimum": 50}, "follows": {"tiers": [[10, 0.1], [0, 0.7]]}})
    assert prices.cost("tweets", 10, 20) == 50
    assert prices.cost("tweets", 200, 200) == 100
    assert prices.cost("follows", 15, 15) == 15
    assert prices.cost("follows", 300, 300) == 30
    assert prices.cost("follows", 31, 9) == 22  # 21.7 -> 22
    # Overrides never leak into the defaults.
    assert Prices().cost("tweets", 20, 20) == 300
    assert DEFAULT_RULES["tweets"] == {"each": 15}


@pytest.mark.parametrize(
    "rule",
    [
        15,
        "each",
        None,
        [15],
        {},
        {"minimum": 3},
        {"each": 1, "call": 2},
        {"each": 1, "tiers": [[0, 1]]},
        {"call": 1, "tiers": [[0, 1]]},
        {"per": 1},
    ],
)
def test_malformed_rules_are_rejected(rule):
    with pytest.raises(PriceError):
        Prices({"tweets": rule})
    with pytest.raises(PriceError):
        Prices({"brand_new_rule": rule})


@pytest.mark.parametrize(
    "rule",
    [
        {"tiers": []},  # no price at all
        {"tiers": [[100, 1]]},  # no price for pages under 100
        {"tiers": "cheap"},
        {"tiers": [[0]]},
        {"each": "15"},
        {"call": None},
        {"each": -1},
        {"each": 1, "minimum": "lots"},
        {"tiers": [[100, 1], [0, "2"]]},
    ],
)
def test_rules_that_cannot_price_every_call_are_rejected_up_front(rule):
    """Config validation runs Prices(): a rule that would crash at request time (StopIteration for a
    size no tier covers, str * int, ceil(None)) must be refused at start, not fail every call."""
    with pytest.raises(PriceError):
        Prices({"follows": rule})


# --- plans ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "paid,name,qps",
    [
        (0, "free", 0.2),
        (0.009, "free", 0.2),
        (0.01, "paid", 20.0),
        (499.99, "paid", 20.0),
        (500, "pro", 50.0),
        (4999.99, "pro", 50.0),
        (5000, "scale", 500.0),
        (10**6, "scale", 500.0),
    ],
)
def test_plan_tier_boundaries(paid, name, qps):
    assert plan_for(paid, DEFAULT_PLANS) == Plan(name, qps)


def test_plan_custom_rules_unordered_and_below_lowest():
    rules = [{"name": "gold", "min_paid_usd": 100, "qps": "9"}, {"name": "basic", "min_paid_usd": 10, "qps": 3}]
    assert plan_for(100, rules) == Plan("gold", 9.0)
    assert plan_for(99, rules) == Plan("basic", 3.0)
    # Below every tier (and negative, defensively): the lowest tier, never an error.
    assert plan_for(0, rules) == Plan("basic", 3.0)
    assert plan_for(-5, rules) == Plan("basic", 3.0)
    assert isinstance(plan_for(100, rules).qps, float)


# --- ledger --------------------------------------------------------------------------------------


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
    assert ledger.held("nobody") == 0
    r1 = ledger.reserve("a", 300, 15, 0.0)
    assert ledger.held("a") == 1000
    ledger.settle(r1, 200, 0.1)
    assert ledger.held("a") == 800
    ledger.reserve("a", 300, 15, 0.2)
    assert ledger.held("a") == 800


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


# --- usage buffer ------------------------------------------------------------------------------------


def rec(i, account="a"):
    return {"_id": f"r{i}", "account_id": account, "credits": i, "lease": "p1"}


def test_usage_take_done_in_order():
    buffer = UsageBuffer(max_records=100)
    for i in range(5):
        buffer.add(rec(i))
    seq, batch = buffer.take(3)
    assert [r["_id"] for r in batch] == ["r0", "r1", "r2"]
    assert len(buffer) == 5
    buffer.done()
    assert len(buffer) == 2
    next_seq, batch = buffer.take(10)
    assert next_seq == seq + 1 and [r["_id"] for r in batch] == ["r3", "r4"]
    buffer.done()
    assert len(buffer) == 0
    assert buffer.take(10)[1] == []


def test_usage_unconfirmed_batch_is_retried_identically():
    """A retry must write the very same documents (same batch number, same records), or it could double-write."""
    buffer = UsageBuffer(max_records=100)
    for i in range(3):
        buffer.add(rec(i))
    first = buffer.take(10)
    buffer.add(rec(3))  # arrives while the batch is unconfirmed
    again = buffer.take(10)
    assert again[0] == first[0] and [r["_id"] for r in again[1]] == ["r0", "r1", "r2"]
    buffer.done()
    later = buffer.take(10)
    assert later[0] == first[0] + 1 and [r["_id"] for r in later[1]] == ["r3"]


def test_usage_for_account_includes_in_flight():
    buffer = UsageBuffer(max_records=100)
    buffer.add(rec(1, "a"))
    buffer.add(rec(2, "b"))
    buffer.add(rec(3, "a"))
    buffer.take(2)
    assert [r["_id"] for r in buffer.for_account("a")] == ["r1", "r3"]
    assert [r["_id"] for r in buffer.for_account("b")] == ["r2"]
    assert buffer.for_account("c") == []
    buffer.done()
    assert [r["_id"] for r in buffer.for_account("a")] == ["r3"]


def test_usage_full_at_max_records_counting_in_flight():
    buffer = UsageBuffer(max_records=3)
    buffer.add(rec(1))
    buffer.add(rec(2))
    assert not buffer.full
    buffer.take(2)
    buffer.add(rec(3))
    assert buffer.full
    buffer.done()
    assert not buffer.full


# --- endpoint table ------------------------------------------------------------------------------

# Transcribed from the spec's data-endpoint table (seeds/000_*.txt): path -> (query parameters with
# "req" for required, top-level response keys). The two unavailable endpoints show no response keys.
SPEC_TABLE = {
    "/tweet/advanced_search": (
        {"query": "req", "queryType": "", "cursor": ""},
        {"tweets", "status", "message", "has_next_page", "next_cursor"},
    ),
    "/user/tweet_timeline": (
        {"userId": "req", "cursor": "", "includeReplies": "", "includeParentTweet": ""},
        {"tweets", "status", "message", "has_next_page", "next_cursor"},
    ),
    "/tweet/thread_context": (
        {"tweetId": "req", "cursor": ""},
        {"replies", "has_next_page", "next_cursor", "status", "message"},
    ),
    "/user/verifiedFollowers": (
        {"user_id": "req", "cursor": ""},
        {"followers", "status", "message", "has_next_page", "next_cursor"},
    ),
    "/community/tweets": (
        {"community_id": "req", "cursor": ""},
        {"tweets", "status", "msg", "has_next_page", "next_cursor"},
    ),
    "/user/followers": (
        {"userName": "req", "cursor": "", "pageSize": ""},
        {"followers", "status", "message", "has_next_page", "next_cursor"},
    ),
    "/user/followings": (
        {"userName": "req", "cursor": "", "pageSize": ""},
        {"followings", "status", "message", "has_next_page", "next_cursor"},
    ),
    "/spaces/detail": ({"space_id": "req"}, {"status", "msg", "data"}),
    "/user_about": ({"userName": "req"}, {"status", "msg", "data"}),
    "/user/batch_info_by_ids": ({"userIds": "req"}, {"status", "msg", "users"}),
    "/user/info": ({"userName": "req"}, {"status", "msg", "data"}),
    "/trends": ({"woeid": "", "count": ""}, {"trends", "status", "msg"}),
    "/list/tweets_timeline": (
        {"listId": "req", "cursor": ""},
        {"tweets", "status", "message", "has_next_page", "next_cursor"},
    ),
    "/user/followers_ids": (
        {"userName": "", "userId": "", "count": "", "cursor": ""},
        {"ids", "has_next_page", "next_cursor", "status", "msg"},
    ),
    "/tweet/quotes": (
        {"tweetId": "req", "cursor": ""},
        {"tweets", "status", "message", "has_next_page", "next_cursor"},
    ),
    "/user/last_tweets": (
        {"userName": "", "userId": "", "cursor": "", "includeReplies": ""},
        {"tweets", "status", "message", "has_next_page", "next_cursor"},
    ),
    "/tweet/replies/v2": (
        {"tweetId": "req", "cursor": "", "queryType": ""},
        {"tweets", "status", "message", "has_next_page", "next_cursor"},
    ),
    "/tweet/replies": (
        {"tweetId": "req", "cursor": ""},
        {"replies", "status", "message", "has_next_page", "next_cursor"},
    ),
    "/user/mentions": (
        {"userName": "req", "cursor": ""},
        {"tweets", "status", "message", "has_next_page", "next_cursor"},
    ),
    "/user/search": ({"query": "req", "cursor": ""}, {"users", "status", "msg", "has_next_page", "next_cursor"}),
    "/tweets": ({"tweet_ids": "req"}, {"status", "message", "tweets"}),
    "/community/info": ({"community_id": "req"}, {"status", "msg", "data"}),
    "/community/get_tweets_from_all_community": ({"query": "req", "queryType": "", "cursor": ""}, None),
    "/community/moderators": ({"community_id": "req", "cursor": ""}, None),
}
# Typed parameters the spec names (boolean, integer, comma-separated ids); all others are strings.
SPEC_TYPES = {
    ("/user/tweet_timeline", "includeReplies"): "bool",
    ("/user/tweet_timeline", "includeParentTweet"): "bool",
    ("/user/followers", "pageSize"): "int",
    ("/user/followings", "pageSize"): "int",
    ("/user/batch_info_by_ids", "userIds"): "ids",
    ("/trends", "woeid"): "int",
    ("/trends", "count"): "int",
    ("/user/followers_ids", "count"): "int",
    ("/user/followers_ids", "cursor"): "int",
    ("/user/last_tweets", "includeReplies"): "bool",
    ("/tweets", "tweet_ids"): "ids",
}
RESULT_KEYS = {"tweets", "replies", "followers", "followings", "users", "ids", "trends", "data"}


def test_endpoint_table_has_the_24_spec_endpoints():
    assert len(ENDPOINTS) == 24
    assert len(BY_PATH) == 24
    assert set(BY_PATH) == set(SPEC_TABLE)


def test_exactly_the_two_community_endpoints_are_unavailable():
    unavailable = {e.path for e in ENDPOINTS if not e.available}
    assert unavailable == {"/community/get_tweets_from_all_community", "/community/moderators"}


def test_every_price_names_an_existing_rule():
    prices = Prices()
    for endpoint in ENDPOINTS:
        assert endpoint.price in prices.rules, endpoint.path
        # Every available endpoint can price an empty and a full page.
        size = page_size(endpoint, {})
        if endpoint.available and size:
            assert prices.cost(endpoint.price, size, size) >= prices.cost(endpoint.price, 0, size) >= 15


@pytest.mark.parametrize("path", [p for p, (_, keys) in SPEC_TABLE.items() if keys is not None])
def test_msg_key_and_results_key_match_the_spec(path):
    endpoint = BY_PATH[path]
    keys = SPEC_TABLE[path][1]
    expected_msg = "msg" if "msg" in keys else "message"
    assert ("msg" in keys) != ("message" in keys)
    assert endpoint.msg_key == expected_msg
    (results,) = keys & RESULT_KEYS
    assert endpoint.results == results
    assert endpoint.paged == ("has_next_page" in keys)


@pytest.mark.parametrize("path", list(SPEC_TABLE))
def test_params_and_required_params_match_the_spec(path):
    endpoint = BY_PATH[path]
    spec_params = SPEC_TABLE[path][0]
    assert {p.name for p in endpoint.params} == set(spec_params)
    assert {p.name for p in endpoint.params if p.required} == {n for n, r in spec_params.items() if r == "req"}
    for param in endpoint.params:
        kind = "str" if param.kind == "cursor" else param.kind  # a cursor is a string with its own checks
        assert kind == SPEC_TYPES.get((path, param.name), "str"), param.name


def test_page_sizes_follow_reference_defaults():
    assert page_size(BY_PATH["/tweet/advanced_search"], {}) == 20
    assert page_size(BY_PATH["/user/followers"], {}) == 200
    assert page_size(BY_PATH["/user/followers"], {"pageSize": 99}) == 99
    assert page_size(BY_PATH["/user/followers_ids"], {}) == 5000
    assert page_size(BY_PATH["/user/followers_ids"], {"count": 200}) == 200
    assert page_size(BY_PATH["/user/batch_info_by_ids"], {"userIds": ["1", "2", "3"]}) == 3
    assert page_size(BY_PATH["/tweets"], {"tweet_ids": [str(i) for i in range(100)]}) == 100
    assert page_size(BY_PATH["/trends"], {}) == 30
    assert page_size(BY_PATH["/user/info"], {}) == 1
    followers = BY_PATH["/user/followers"].param("pageSize")
    assert (followers.minimum, followers.maximum) == (1, 200)
    count = BY_PATH["/user/followers_ids"].param("count")
    assert (count.minimum, count.maximum) == (50, 5000)
    assert BY_PATH["/tweets"].param("tweet_ids").maximum == 100
    assert BY_PATH["/user/batch_info_by_ids"].param("userIds").maximum == 100


def test_count_items():
    followers = BY_PATH["/user/followers"]
    assert count_items(followers, {"followers": [{}, {}, {}], "tweets": [{}]}) == 3
    assert count_items(followers, {"followers": []}) == 0
    assert count_items(followers, {}) == 0
    info = BY_PATH["/user/info"]
    assert count_items(info, {"data": {"id": "1"}}) == 1
    assert count_items(info, {"data": None}) == 0
    assert count_items(info, {"data": {}}) == 0


# --- LoadingCache ----------------------------------------------------------------------------------


class Clock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


def test_cache_concurrent_misses_load_once():
    async def main():
        release = asyncio.Event()
        calls = []

        async def load(key):
            calls.append(key)
            await release.wait()
            return f"value-{key}"

        cache = LoadingCache(load, size=10, ttl=60, negative_ttl=5)
        tasks = [asyncio.ensure_future(cache.get("k")) for _ in range(10)]
        other = asyncio.ensure_future(cache.get("other"))
        await asyncio.sleep(0.01)
        assert calls == ["k", "other"]
        release.set()
        results = await asyncio.gather(*tasks, other)
        assert results == ["value-k"] * 10 + ["value-other"]
        assert calls == ["k", "other"]
        assert cache.stats.loads == 2
        assert await cache.get("k") == "value-k"
        assert calls == ["k", "other"]  # a hit
        assert cache.stats.hits == 1

    asyncio.run(main())


def test_cache_concurrent_misses_share_a_failure():
    async def main():
        release = asyncio.Event()
        calls = []

        async def load(key):
            calls.append(key)
            await release.wait()
            raise ConnectionError("db down")

        cache = LoadingCache(load, size=10, ttl=60, negative_ttl=5)
        tasks = [asyncio.ensure_future(cache.get("k")) for _ in range(5)]
        await asyncio.sleep(0.01)
        release.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, ConnectionError) for r in results)
        assert calls == ["k"]

    asyncio.run(main())


def test_cache_ttl_and_negative_ttl_with_injected_clock():
    async def main():
        clock = Clock()
        calls = []
        known = {"a": 1}

        async def load(key):
            calls.append(key)
            return known.get(key)

        cache = LoadingCache(load, size=10, ttl=60, negative_ttl=5, clock=clock)
        assert await cache.get("missing") is None
        assert await cache.get("missing") is None
        assert calls == ["missing"]  # negative entry served
        clock.now += 4.9
        assert await cache.get("missing") is None
        assert calls == ["missing"]
        clock.now += 0.2  # past negative_ttl: asks again, and now it exists
        known["missing"] = 2
        assert await cache.get("missing") == 2
        assert calls == ["missing", "missing"]
        assert len(cache) == 1
        # Positive entries live for ttl.
        assert await cache.get("a") == 1
        clock.now += 59
        assert await cache.get("a") == 1
        assert calls.count("a") == 1
        clock.now += 2
        known["a"] = 11
        assert await cache.get("a") == 11
        assert calls.count("a") == 2

    asyncio.run(main())


def test_cache_serves_stale_value_when_loader_fails():
    async def main():
        clock = Clock()
        state = {"fail": False}

        async def load(key):
            if state["fail"]:
                raise ConnectionError("db down")
            return {"key": key}

        cache = LoadingCache(load, size=10, ttl=60, negative_ttl=5, clock=clock)
        assert await cache.get("k") == {"key": "k"}
        clock.now += 120
        state["fail"] = True
        assert await cache.get("k") == {"key": "k"}
        assert cache.stats.stale_served == 1
        with pytest.raises(ConnectionError):  # nothing stale to serve
            await cache.get("never-seen")
        state["fail"] = False
        assert await cache.get("never-seen") == {"key": "never-seen"}

    asyncio.run(main())


def test_cache_put_invalidate_peek():
    async def main():
        calls = []

        async def load(key):
            calls.append(key)
            return "loaded"

        cache = LoadingCache(load, size=10, ttl=60, negative_ttl=5)
        assert cache.peek("k") is None
        cache.put("k", "put")
        assert cache.peek("k") == "put"
        assert await cache.get("k") == "put"
        cache.invalidate("k")
        assert await cache.get("k") == "loaded"
        cache.put("gone", None)  # put None: a negative entry
        assert await cache.get("gone") is None
        assert calls == ["k"]

    asyncio.run(main())


def test_cache_flood_of_unknown_keys_does_not_evict_known_ones():
    async def main():
        calls = []

        async def load(key):
            calls.append(key)
            return f"v{key}" if isinstance(key, str) else None

        cache = LoadingCache(load, size=8, ttl=600, negative_ttl=5)
        for key in "abcdefgh":
            assert await cache.get(key) == f"v{key}"
        for i in range(5000):
            assert await cache.get(i) is None
        calls.clear()
        for key in "abcdefgh":
            assert await cache.get(key) == f"v{key}"
        assert calls == []
        assert len(cache) == 8

    asyncio.run(main())


def test_cache_change_during_a_load_is_not_overwritten_by_it():
    """A key revoked while its load is in flight must stay revoked: the load read the database before."""

    async def main():
        release = asyncio.Event()
        database = {"k": "active"}

        async def load(key):
            seen = database[key]
            await release.wait()
            return seen

        cache = LoadingCache(load, size=10, ttl=60, negative_ttl=5)
        early = asyncio.ensure_future(cache.get("k"))
        await asyncio.sleep(0.01)
        database["k"] = "revoked"
        cache.put("k", "revoked")  # what the revoke handler does
        late = asyncio.ensure_future(cache.get("k"))  # a hit on the new value, not the old load
        release.set()
        assert await early == "active"  # it started before the revocation
        assert await late == "revoked"
        assert await cache.get("k") == "revoked"  # the stale load was not stored

        cache.invalidate("k")
        release.clear()
        first = asyncio.ensure_future(cache.get("k"))
        await asyncio.sleep(0.01)
        cache.invalidate("k")  # invalidated while loading: a newcomer loads afresh
        database["k"] = "changed"
        second = asyncio.ensure_future(cache.get("k"))
        release.set()
        assert await first == "revoked" and await second == "changed"
        assert await cache.get("k") == "changed"

    asyncio.run(main())
