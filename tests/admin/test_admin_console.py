"""The admin console's account actions (handlers/admin/accounts.py): search, one account's detail, credit and
debit with a reason (ledger, audit log, Idempotency-Key, never below zero, exact with data calls in flight),
suspend and resume (403 on data calls here at once, in another process through coherence)."""

import asyncio
import time

import pytest
from support import FAST, balance

pytestmark = [pytest.mark.gen_test(timeout=90), pytest.mark.settings(admin_emails="boss@example.com")]
ADMIN = "boss@example.com"


async def admin_token(api, ctx) -> str:
    token = (await api.register(ADMIN))["token"]
    assert await ctx.accounts.set_admin(ADMIN, True)
    return token


def info(catalog) -> str:
    return f"/social/user/info?userName={catalog['users'][0]['userName']}"


async def test_only_admins_act_on_accounts(api, ctx):
    user = await api.register()
    account_id = (await api.call("GET", "/account", token=user["token"]))[1]["account_id"]
    for method, path, body in (
        ("GET", f"/admin/accounts/{account_id}", None),
        ("POST", f"/admin/accounts/{account_id}/credit", {"credits": 5, "reason": "goodwill"}),
        ("POST", f"/admin/accounts/{account_id}/debit", {"credits": 5, "reason": "refund"}),
        ("POST", f"/admin/accounts/{account_id}/suspend", {"reason": "abuse"}),
        ("POST", f"/admin/accounts/{account_id}/resume", {}),
    ):
        assert (await api.call(method, path, body))[0] == 401
        status, answer, _ = await api.call(method, path, body, token=user["token"])
        assert status == 403 and answer == {"detail": "Admins only"}, path
    assert await balance(api, user) == ctx.settings.signup_credits  # nothing happened


async def test_search_detail_and_the_empty_state_count(api, ctx):
    token = await admin_token(api, ctx)
    user = await api.register("Carla.Search@Example.com")
    account_id = (await api.call("GET", "/account", token=user["token"]))[1]["account_id"]
    key = await api.new_key(user["token"], "carla's key")
    for q in ("carla.search", "CARLA", account_id):
        status, page, _ = await api.call("GET", f"/admin/users?q={q}", token=token)
        assert status == 200 and [u["account_id"] for u in page["users"]] == [account_id], q
    status, page, _ = await api.call("GET", "/admin/users?q=boss", token=token)
    # The admin's own account matches but is hidden by default: the answer says how many accounts are hidden.
    assert status == 200 and page["users"] == [] and page["internal_hidden"] == 1
    page = (await api.call("GET", "/admin/users?q=boss&include_internal=true", token=token))[1]
    assert [u["email"] for u in page["users"]] == [ADMIN] and page["internal_hidden"] == 0
    status, body, _ = await api.call("GET", "/admin/users?q=" + "x" * 321, token=token)
    assert status == 422 and body["detail"][0]["loc"] == ["query", "q"]

    status, detail, _ = await api.call("GET", f"/admin/accounts/{account_id}", token=token)
    assert status == 200
    assert detail["email"] == "carla.search@example.com" and detail["credits"] == ctx.settings.signup_credits
    assert [k["name"] for k in detail["keys"]] == ["carla's key"] and "key" not in detail["keys"][0]
    assert detail["orders"] == [] and detail["suspended"] is False
    assert "key.created" in [e["action"] for e in detail["audit"]]
    assert key["key"] not in str(detail)  # no secret in an admin's view
    status, body, _ = await api.call("GET", "/admin/accounts/nope", token=token)
    assert status == 404 and body == {"detail": "Account not found"}


async def test_search_finds_an_account_by_a_members_email(api, ctx):
    """An invited person has no account of their own: the admin searching their email finds the accounts they
    are a member of (and only once an invitation is accepted)."""
    token = await admin_token(api, ctx)
    owner = await api.register("team.owner@example.com")
    account_id = (await api.call("GET", "/account", token=owner["token"]))[1]["account_id"]
    status, invitation, _ = await api.call(
        "POST", "/members/invitations", {"email": "Dev.Person@Example.com", "role": "developer"}, token=owner["token"]
    )
    assert status == 200, invitation
    assert (await api.call("GET", "/admin/users?q=dev.person", token=token))[1]["users"] == []  # not yet a member
    accept = {"token": invitation["token"], "password": "a long new password"}
    assert (await api.call("POST", "/auth/invitations/accept", accept))[0] == 200
    for q in ("dev.person", "DEV.PERSON@example"):
        status, page, _ = await api.call("GET", f"/admin/users?q={q}", token=token)
        assert status == 200 and [u["account_id"] for u in page["users"]] == [account_id], q
        assert page["users"][0]["email"] == "team.owner@example.com"  # the account, named by its own email


async def test_credit_and_debit_need_a_reason_are_idempotent_audited_and_never_go_below_zero(api, ctx):
    token = await admin_token(api, ctx)
    user = await api.register()
    account_id = (await api.call("GET", "/account", token=user["token"]))[1]["account_id"]
    start = await balance(api, user)
    url = f"/admin/accounts/{account_id}"
    for body, loc in (
        ({"credits": 10}, ["body", "reason"]),
        ({"credits": 10, "reason": "   "}, ["body", "reason"]),
        ({"credits": 0, "reason": "goodwill"}, ["body", "credits"]),
        ({"credits": "10", "reason": "goodwill"}, ["body", "credits"]),
    ):
        status, answer, _ = await api.call("POST", url + "/credit", body, token=token)
        assert status == 422 and answer["detail"][0]["loc"] == loc, body
    once = {"Idempotency-Key": "credit-1"}
    first = await api.call("POST", url + "/credit", {"credits": 700, "reason": "goodwill"}, token=token, headers=once)
    again = await api.call("POST", url + "/credit", {"credits": 700, "reason": "goodwill"}, token=token, headers=once)
    assert first[0] == again[0] == 200 and first[1] == again[1] and first[1]["credits"] == start + 700
    assert again[2].get("Idempotent-Replayed") == "true"
    assert await balance(api, user) == start + 700  # credited once
    # More than the balance: refused, nothing taken.
    status, answer, _ = await api.call("POST", url + "/debit", {"credits": start + 701, "reason": "x" * 3}, token=token)
    assert status == 409 and "Only" in answer["detail"]
    assert await balance(api, user) == start + 700
    status, answer, _ = await api.call("POST", url + "/debit", {"credits": 200, "reason": "refund #12"}, token=token)
    assert status == 200 and answer["credits"] == start + 500 and answer["debited"] == 200
    status, answer, _ = await api.call("POST", url + "/debit", {"credits": start + 500, "reason": "close"}, token=token)
    assert status == 200 and answer["credits"] == 0
    assert await balance(api, user) == 0
    entries = (await api.call("GET", url, token=token))[1]["audit"]
    adjustments = [(e["action"], e["details"]) for e in entries if e["action"].startswith("admin.")]
    assert adjustments == [
        ("admin.debit", {"credits": start + 500, "reason": "close"}),
        ("admin.debit", {"credits": 200, "reason": "refund #12"}),
        ("admin.credit", {"credits": 700, "reason": "goodwill"}),
    ]
    assert all(
        e["actor"]["kind"] == "admin" and e["actor"]["email"] == ADMIN for e in entries if e["action"][:5] == "admin"
    )


@pytest.mark.settings(plan_rules=FAST)
async def test_credits_and_debits_with_data_calls_in_flight_stay_exact(api, ctx, catalog):
    """Real concurrency: 120 data calls, 15 credits and 15 debits at once; afterwards the balance is the start
    plus the credits, minus the debits that succeeded, minus what the usage records charged."""
    token = await admin_token(api, ctx)
    user, key = await api.funded_key(1_000_000)
    account_id = (await api.call("GET", "/account", token=user["token"]))[1]["account_id"]
    start = await balance(api, user)
    url = f"/admin/accounts/{account_id}"
    calls = [api.call("GET", info(catalog), key=key["key"]) for _ in range(120)]
    credits = [
        api.call("POST", url + "/credit", {"credits": 1000 + i, "reason": "load"}, token=token) for i in range(15)
    ]
    debits = [api.call("POST", url + "/debit", {"credits": 2000 + i, "reason": "load"}, token=token) for i in range(15)]
    answers = await asyncio.gather(*calls, *credits, *debits)
    data, credited, debited = answers[:120], answers[120:135], answers[135:]
    assert {a[0] for a in data} == {200} and {a[0] for a in credited} == {200}
    assert {a[0] for a in debited} <= {200, 409}
    charged = sum(int(a[2]["X-Credits-Charged"]) for a in data)
    added = sum(1000 + i for i in range(15))
    taken = sum(2000 + i for i, a in enumerate(debited) if a[0] == 200)
    assert taken > 0
    await ctx.meter.flush()
    records = await ctx.usage.records({"account_id": account_id})
    assert sum(r["credits"] for r in records) == charged
    assert await balance(api, user) == start + added - taken - charged


async def test_suspend_refuses_data_calls_here_at_once_and_in_another_process_within_a_second(
    api, ctx, second, catalog
):
    token = await admin_token(api, ctx)
    user, key = await api.funded_key(100_000)
    account_id = (await api.call("GET", "/account", token=user["token"]))[1]["account_id"]
    assert (await api.call("GET", info(catalog), key=key["key"]))[0] == 200
    assert (await second.meter.account_view(account_id)).suspended is False  # cached in the other process
    status, body, _ = await api.call("POST", f"/admin/accounts/{account_id}/suspend", {}, token=token)
    assert status == 422 and body["detail"][0]["loc"] == ["body", "reason"]  # a suspension says why
    status, body, _ = await api.call("POST", f"/admin/accounts/{account_id}/suspend", {"reason": "abuse"}, token=token)
    suspended_at = time.monotonic()
    assert status == 200 and body["suspended"] is True and body["suspended_reason"] == "abuse"
    status, body, _ = await api.call("GET", info(catalog), key=key["key"])
    assert status == 403 and "suspended" in body["msg"]
    while not (await second.meter.account_view(account_id)).suspended:
        assert time.monotonic() - suspended_at < 1.0, "the other process still serves the account after a second"
        await asyncio.sleep(0.05)
    before = await balance(api, user)
    assert (await api.call("GET", info(catalog), key=key["key"]))[0] == 403
    assert await balance(api, user) == before  # a refused call costs nothing
    status, body, _ = await api.call("POST", f"/admin/accounts/{account_id}/resume", {}, token=token)
    assert status == 200 and body["suspended"] is False
    assert (await api.call("GET", info(catalog), key=key["key"]))[0] == 200
    actions = [e["action"] for e in (await api.call("GET", f"/admin/accounts/{account_id}", token=token))[1]["audit"]]
    assert actions[:2] == ["admin.resume", "admin.suspend"]
