"""The audit log: who did what, when, from where; the account's own view, the admins' view, exports."""

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
    assert actions == ["login.failed", "key.revoked", "key.revealed", "key.created"]
    created = body["entries"][-1]
    assert created["actor"] == {"kind": "account", "id": user["account_id"]}
    assert created["address"] == "127.0.0.1" and created["details"] == {"key_id": key["key_id"], "name": "reporting"}
    assert created["at"].endswith("Z") and body["next_cursor"] is None
    assert (await entries(api, other["token"]))["entries"] == []  # tenants isolated


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
    assert len((await entries(api, user["token"], "?until=2999-01-01&since=0001-01-01"))["entries"]) == 5
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
    assert [r["action"] for r in rows] == ["key.created"]
    assert orjson.loads(rows[0]["details"])["name"] == "=HYPERLINK(evil)"  # inside JSON: no leading '='
    status, body, headers = await api.call("GET", "/audit/export?format=json", token=user["token"])
    assert status == 200 and [e["action"] for e in body] == ["key.created"]
    assert (await api.call("GET", "/audit/export?format=xml", token=user["token"]))[0] == 422


async def test_admins_see_every_account(api, ctx):
    admin, user = await api.register(), await api.register()
    await api.new_key(user["token"])
    assert (await api.call("GET", "/admin/audit", token=user["token"]))[0] == 403
    assert await ctx.accounts.set_admin(admin["email"], True)
    status, body, _ = await api.call("GET", f"/admin/audit?account_id={user['account_id']}", token=admin["token"])
    assert status == 200 and [e["action"] for e in body["entries"]] == ["key.created"]
    status, body, _ = await api.call("GET", "/admin/audit?actor=system&limit=200", token=admin["token"])
    assert status == 200 and all(e["actor"]["kind"] == "system" for e in body["entries"])


async def test_a_repeated_event_is_written_once(ctx):
    from storage.audit import SYSTEM

    for _ in range(3):
        await ctx.audit.record("credit.applied", "acct-once", SYSTEM, None, {"credits": 5}, once="credit:x:1")
    rows, _ = await ctx.audit.page(ctx.audit.query("acct-once"), None, 10)
    assert len(rows) == 1 and rows[0]["details"] == {"credits": 5}
    with pytest.raises(ValueError):
        await ctx.audit.record("key.stolen", "acct-once", SYSTEM)
