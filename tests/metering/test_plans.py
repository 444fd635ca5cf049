"""Plans (metering/plans.py): tier boundaries and custom rules."""

import pytest

from metering.plans import Plan, plan_for

DEFAULT_PLANS = (
    {"name": "free", "min_paid_usd": 0, "qps": 0.2},
    {"name": "paid", "min_paid_usd": 0.01, "qps": 20},
    {"name": "pro", "min_paid_usd": 500, "qps": 50},
    {"name": "scale", "min_paid_usd": 5000, "qps": 500},
)


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
