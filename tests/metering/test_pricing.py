"""Prices (metering/pricing.py): the reference rules, tiers, minimums, overrides, malformed rules."""

import pytest

from metering.pricing import DEFAULT_RULES, PriceError, Prices

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
