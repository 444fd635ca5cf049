"""Property-based API fuzzing against the live service's own /openapi.json: the data operations here, every
other one in tests/operations/test_fuzz_portal.py (two files, so that the suite runs the halves at once).

The CI-sized run: schemathesis (coverage, fuzzing and stateful phases, default checks) on every
operation of a real gateway process, with a session token and a funded API key per security
scheme. `bench/fuzz.py` is the same with a bigger budget. The documented links are also walked
by hand, so the create -> reveal -> revoke -> reveal chain is checked on every run, not by chance.
"""

import pytest
from support import FAST

from bench import fuzz

pytestmark = pytest.mark.gen_test(timeout=60)


def test_schemathesis_finds_no_failure_on_any_data_operation():
    # one worker: CPython 3.11 is not reliable compiling in threads
    figures = fuzz.run(max_examples=3, seed=20261121, workers=1, extra=["--include-tag-regex", "^data"])
    report = figures["output"][-4000:]
    assert figures["gateway_alive_after"], report
    assert figures["operations"] >= 30, report  # the 30 data endpoints (their /twitter aliases are not listed)
    assert figures["test_cases"] >= 2000, report
    assert figures["failures"] == [] and figures["errors"] == [], report
    assert figures["exit_code"] == 0, report


def _operation(doc: dict, operation_id: str) -> tuple[str, str]:
    return next(
        (method.upper(), path)
        for path, item in doc["paths"].items()
        for method, op in item.items()
        if op["operationId"] == operation_id
    )


async def _follow(api, doc, answer: dict, link: dict, token: str):
    """Calls the operation a link names, with parameters resolved from the answer it hangs off."""
    method, path = _operation(doc, link["operationId"])
    for name, expression in link["parameters"].items():
        pointer = expression.removeprefix("$response.body#/")
        path = path.replace("{" + name + "}", str(answer[pointer]))
    return await api.call(method, path, {"credits": 5} if path.endswith("/topup") else None, token=token)


@pytest.mark.settings(plan_rules=FAST)
async def test_documented_links_chain_create_reveal_revoke_reveal(api, catalog):
    status, doc, _ = await api.call("GET", "/openapi.json")
    assert status == 200
    user = await api.register()
    token = user["token"]
    links = doc["paths"]["/keys"]["post"]["responses"]["200"]["links"]
    assert set(links) >= {"RevealKey", "RevokeKey"}
    created = await api.new_key(token)
    status, revealed, _ = await _follow(api, doc, created, links["RevealKey"], token)
    assert status == 200 and revealed == {"key_id": created["key_id"], "key": created["key"]}
    status, topped, _ = await _follow(api, doc, created, links["TopUpKey"], token)
    assert status == 200 and topped["credits"] == 5
    status, revoked, _ = await _follow(
        api,
        doc,
        revealed,
        doc["paths"]["/keys/{key_id}/reveal"]["get"]["responses"]["200"]["links"]["RevokeKey"],
        token,
    )
    assert status == 200 and revoked["key_id"] == created["key_id"] and revoked["revoked"] is True
    after = doc["paths"]["/keys/{key_id}/revoke"]["post"]["responses"]["200"]["links"]["RevealRevokedKey"]
    status, again, _ = await _follow(api, doc, revoked, after, token)
    assert status == 410 and created["key"] not in str(again)  # a revoked key's secret is never shown again...
    data = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    assert (await api.call("GET", data, key=created["key"]))[0] == 401  # ...that no longer works
    # Another account following the same links gets 404, never the key.
    other = await api.register()
    status, body, _ = await _follow(api, doc, created, links["RevealKey"], other["token"])
    assert status == 404 and created["key"] not in str(body)


async def test_documented_link_from_checkout_reaches_the_order(api):
    status, doc, _ = await api.call("GET", "/openapi.json")
    user = await api.register()
    status, order, _ = await api.call(
        "POST", "/billing/crypto/checkout", {"currency": "USDTTRC20", "amount_usd": 10}, token=user["token"]
    )
    assert status == 200
    link = doc["paths"]["/billing/crypto/checkout"]["post"]["responses"]["200"]["links"]["GetOrder"]
    status, fetched, _ = await _follow(api, doc, order, link, user["token"])
    assert status == 200 and fetched["order_id"] == order["order_id"]
