"""Key budgets attacked the way a customer can (outside checker's reproductions for issue 14): keys rolled
from one another share one budget whatever is changed on one of them."""

import pytest
from support import FAST

pytestmark = pytest.mark.gen_test(timeout=60)


async def spend(api, key: dict, name: str, calls: int) -> int:
    """Up to `calls` user/info calls; the credits charged (402s charge nothing)."""
    charged = 0
    for _ in range(calls):
        status, body, headers = await api.call("GET", f"/social/user/info?userName={name}", key=key["key"])
        assert status in (200, 402), body
        charged += int(headers.get("X-Credits-Charged", 0))
    return charged


@pytest.mark.settings(plan_rules=FAST)
@pytest.mark.parametrize(
    "restart",
    [
        [{"credit_limit": None}, {"credit_limit": 180, "credit_limit_period": "day"}],  # removed and set again
        [{"credit_limit": 180, "credit_limit_period": "month"}],  # moved to another period
    ],
    ids=["removed-and-set-again", "period-changed"],
)
async def test_a_rolled_pair_never_spends_more_than_one_budget(api, catalog, restart):
    """Roll a key with 180 credits a day (10 profiles), keep the old one for the grace, and restart the
    new key's budget (PATCH). The new key's run counts what the pair spent; the old key's budget document
    does not see the new run's slices (another `budget_epoch`, another document), so the old key spends
    its whole 180 again: 360 credits on one shared budget of 180, credits_used 360 on both rows."""
    user, _ = await api.funded_key(1_000_000)
    token, name = user["token"], catalog["users"][0]["userName"]
    status, old, _ = await api.call(
        "POST", "/keys", {"name": "ci", "credit_limit": 180, "credit_limit_period": "day"}, token=token
    )
    assert status == 200
    status, new, _ = await api.call("POST", f"/keys/{old['key_id']}/roll", {"grace_seconds": 600}, token=token)
    assert status == 200
    for change in restart:
        status, body, _ = await api.call("PATCH", f"/keys/{new['key_id']}", change, token=token)
        assert status == 200, body

    spent = await spend(api, new, name, 15) + await spend(api, old, name, 15)
    assert spent <= 180, f"{spent} credits spent on one budget of 180"
    status, rows, _ = await api.call("GET", "/keys", token=token)
    used = {r["key_id"]: (r["credits_used"], r["credit_limit"]) for r in rows}
    # The old key's row: what the shared budget spent today, never more than the old key's own limit.
    assert used[old["key_id"]][0] <= used[old["key_id"]][1], used
