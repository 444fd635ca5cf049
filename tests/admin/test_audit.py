"""The audit log: who did what, when, from where; the account's own view, the admins' view, exports."""

import asyncio
import csv
import io

import orjson
import pytest

pytestmark = pytest.mark.gen_test(timeout=30)


async def entries(api, token, query=""):
    status, body, _ = await api.call("GET", "/audit" + query, token=token)
    assert status == 200, body
    return body


async def test_key_actions_and_logins_are_logged_for_their_account_only(api):
    user = await api.register()
    other = await api.register()
    key = await api.new_key(user["token"], "reporting")
    await api.call("GET", f"/keys/{key['key_id']}/reveal", token=user["token"])
    await api.call("POST", f"/keys/{key['key_id']}/revoke", token=user["token"])
    await api.call("POST", f"/keys/{key['key_id']}/revoke", token=user["token"])  # again: nothing changes
    await api.call("POST", "/auth/login", {"email": user["email"], "password": "wrong password!"})
    body = await entries(api, user["token"])
    actions = [e["action"] for e in body["entries"]]
    assert actions == ["login.failed", "key.revoked", "key.revealed", "key.created", "account.created"]
    created = body["entries"][-2]
    member_id = (await api.call("GET", "/auth/me", token=user["token"]))[1]["member_id"]
    # The account acted, and of its members (one here, its owner) this one.
    assert created["actor"] == {
        "kind": "account",
        "id": user["account_id"],
        "member_id": member_id,
        "email": user["email"],
    }
    assert created["address"] == "127.0.0.1" and created["details"] == {"key_id": key["key_id"], "name": "reporting"}
    assert created["at"].endswith("Z") and body["next_cursor"] is None
    theirs = (await entries(api, other["token"]))["entries"]
    assert [e["action"] for e in theirs] == ["account.created"]  # tenants isolated


async def test_registering_and_adding_or_deleting_a_webhook_endpoint_are_in_the_activity(api):
    """What a newcomer does first shows up: the account's creation, then its webhook endpoint, added and deleted
    (by id and host: the receiver's URL may carry its own token, and it is not repeated here)."""
    user = await api.register()
    url = "http://127.0.0.1:9/hook?token=receiver-secret"
    status, endpoint, _ = await api.call("POST", "/webhooks", {"url": url}, token=user["token"])
    assert status == 200, endpoint
    assert (await api.call("DELETE", f"/webhooks/{endpoint['endpoint_id']}", token=user["token"]))[0] == 200
    body = await entries(api, user["token"])
    assert [e["action"] for e in body["entries"]] == ["webhook.deleted", "webhook.created", "account.created"]
    deleted, added, created = body["entries"]
    member_id = (await api.call("GET", "/auth/me", token=user["token"]))[1]["member_id"]
    actor = {"kind": "account", "id": user["account_id"], "member_id": member_id, "email": user["email"]}
    assert created["actor"] == actor and created["address"] == "127.0.0.1"
    assert added["details"] == {"endpoint_id": endpoint["endpoint_id"], "host": "127.0.0.1"}
    assert deleted["details"] == {"endpoint_id": endpoint["endpoint_id"]}
    assert "receiver-secret" not in orjson.dumps(body).decode()
    only = await entries(api, user["token"], "?action=account.created,webhook.created")
    assert [e["action"] for e in only["entries"]] == ["webhook.created", "account.created"]


async def test_filters_paging_and_bad_query(api):
    user = await api.register()
    for n in range(5):
        await api.new_key(user["token"], f"k{n}")
    first = await entries(api, user["token"], "?limit=2&action=key.created")
    assert len(first["entries"]) == 2 and first["next_cursor"]
    rest = await entries(api, user["token"], f"?limit=10&action=key.created&cursor={first['next_cursor']}")
    names = [e["details"]["name"] for e in first["entries"] + rest["entries"]]
    assert names == ["k4", "k3", "k2", "k1", "k0"] and rest["next_cursor"] is None
    assert (await entries(api, user["token"], "?action=login"))["entries"] == []
    assert (await entries(api, user["token"], "?since=2999-01-01T00:00:00Z"))["entries"] == []
    assert len((await entries(api, user["token"], "?until=2999-01-01&since=0001-01-01"))["entries"]) == 6
    for query, loc in (
        ("?action=key.stolen", "action"),
        ("?since=yesterday", "since"),
        ("?cursor=zzz", "cursor"),
        ("?limit=0", "limit"),
    ):
        status, body, _ = await api.call("GET", "/audit" + query, token=user["token"])
        assert status == 422 and body["detail"][0]["loc"] == ["query", loc], (query, body)
    assert (await api.call("GET", "/audit"))[0] == 401


async def test_export_csv_and_json(api):
    user = await api.register()
    await api.new_key(user["token"], "=HYPERLINK(evil)")
    status, body, headers = await api.call("GET", "/audit/export?format=csv", token=user["token"])
    assert status == 200 and headers["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(body.decode())))
    assert [r["action"] for r in rows] == ["key.created", "account.created"]
    assert orjson.loads(rows[0]["details"])["name"] == "=HYPERLINK(evil)"  # inside JSON: no leading '='
    status, body, headers = await api.call("GET", "/audit/export?format=json", token=user["token"])
    assert status == 200 and [e["action"] for e in body] == ["key.created", "account.created"]
    assert (await api.call("GET", "/audit/export?format=xml", token=user["token"]))[0] == 422


async def test_admins_see_every_account(api, ctx):
    admin, user = await api.register(), await api.register()
    await api.new_key(user["token"])
    assert (await api.call("GET", "/admin/audit", token=user["token"]))[0] == 403
    assert await ctx.accounts.set_admin(admin["email"], True)
    status, body, _ = await api.call("GET", f"/admin/audit?account_id={user['account_id']}", token=admin["token"])
    assert status == 200 and [e["action"] for e in body["entries"]] == ["key.created", "account.created"]
    status, body, _ = await api.call("GET", "/admin/audit?actor=system&limit=200", token=admin["token"])
    assert status == 200 and all(e["actor"]["kind"] == "system" for e in body["entries"])


async def test_credits_added_are_logged_once_per_top_up(api):
    user, key = await api.funded_key(5_000)
    headers = {"Idempotency-Key": "topup-once"}
    for _ in range(2):  # a retried top-up adds once, and is logged once
        status, _, _ = await api.call(
            "POST", f"/keys/{key['key_id']}/topup", {"credits": 7}, token=user["token"], headers=headers
        )
        assert status == 200
    body = await entries(api, user["token"], "?action=credit.applied")
    assert [e["details"]["credits"] for e in body["entries"]] == [7, 5_000]


async def test_a_paid_order_is_logged_as_checkout_then_credit_by_the_system(api):
    user = await api.register()
    status, order, _ = await api.call(
        "POST", "/billing/crypto/checkout", {"currency": "USDTTRC20", "amount_usd": 20}, token=user["token"]
    )
    assert status == 200, order
    paid = {"order_id": order["order_id"], "amount_usd": 20, "confirmed": True}
    assert (await api.call("POST", "/billing/crypto/sandbox/pay", paid, token=user["token"]))[0] == 200
    for _ in range(50):  # crediting follows the payment's notification
        body = await entries(api, user["token"], "?action=checkout.created,credit.applied")
        if len(body["entries"]) == 2:
            break
        await asyncio.sleep(0.1)
    credited, created = body["entries"]
    assert created["action"] == "checkout.created" and created["details"]["order_id"] == order["order_id"]
    assert credited["action"] == "credit.applied" and credited["actor"] == {"kind": "system", "id": None}
    assert credited["address"] is None and credited["details"]["credits"] == 20 * 100_000


async def test_a_repeated_event_is_written_once(ctx):
    from storage.audit import SYSTEM

    for _ in range(3):
        await ctx.audit.record("credit.applied", "acct-once", SYSTEM, None, {"credits": 5}, once="credit:x:1")
    rows, _ = await ctx.audit.page(ctx.audit.query("acct-once"), None, 10)
    assert len(rows) == 1 and rows[0]["details"] == {"credits": 5}
    with pytest.raises(ValueError):
        await ctx.audit.record("key.stolen", "acct-once", SYSTEM)
