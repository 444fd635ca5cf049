"""Teams on one balance (issue 37): members with their own sign-in and a role, invitations, removal that takes
effect at once, and the role of every portal operation enforced by the server from its one declaration.

The role matrix is built from the operations the OpenAPI document is built from (handlers/openapi.py
PORTAL_OPERATIONS, each with its least role): every operation x every role."""

import asyncio
import re
import uuid
from datetime import UTC, datetime, timedelta
from unittest.mock import ANY

import pytest
from support import PASSWORD
from test_signin import code, enrolled

from handlers.openapi import PORTAL_OPERATIONS
from security import roles

pytestmark = pytest.mark.gen_test(timeout=120)

OTHERS = (roles.ADMIN, roles.DEVELOPER, roles.BILLING, roles.VIEWER)
# A value for each path parameter that the route accepts and no object has: an allowed role gets past the role
# check to a 404 (or a 422), never to a change.
PLACEHOLDERS = {
    "key_id": "999999",
    "rule_id": "nothing_here",
    "endpoint_id": "nothing_here",
    "delivery_id": "nothing.here",
    "order_id": "nothing_here",
    "account_id": "5f0000000000000000000000",
    "member_id": "0" * 24,
    "invitation_id": "inv_" + "0" * 16,
    "number": "R-2026-000001",
    "month": "2026-01",
}


def email() -> str:
    return f"m-{uuid.uuid4().hex[:10]}@example.com"


async def invite(api, token: str, role: str, address: str | None = None) -> dict:
    status, body, _ = await api.call(
        "POST", "/members/invitations", {"email": address or email(), "role": role}, token=token
    )
    assert status == 200, body
    return body


async def join(api, token: str, role: str, password: str = PASSWORD) -> dict:
    """A new person invited with `role` who accepts with a password of their own: their session and email."""
    invitation = await invite(api, token, role)
    status, body, _ = await api.call(
        "POST", "/auth/invitations/accept", {"token": invitation["token"], "password": password}
    )
    assert status == 200, body
    return {**body, "email": invitation["email"], "invitation": invitation}


async def team(api) -> dict:
    """One account, five people, five roles: role -> {token, email, account_id, ...}."""
    owner = await api.register()
    people = {roles.OWNER: owner}
    for role in OTHERS:
        people[role] = await join(api, owner["token"], role)
    return people


async def me(api, token: str) -> dict:
    status, body, _ = await api.call("GET", "/auth/me", token=token)
    assert status == 200, body
    return body


async def test_a_registered_account_is_its_sign_ins_and_lists_its_one_account(api):
    user = await api.register()
    mine = await me(api, user["token"])
    assert mine["account_id"] == user["account_id"] == mine["person_id"] and mine["role"] == "owner"
    assert mine["accounts"] == [
        {"account_id": user["account_id"], "role": "owner", "name": None, "email": user["email"]}
    ]
    status, members, _ = await api.call("GET", "/members", token=user["token"])
    assert status == 200 and [(m["email"], m["role"], m["two_factor"]) for m in members] == [
        (user["email"], "owner", False)
    ]


async def walk_the_matrix(api, mint, people: dict) -> int:
    """Every portal operation x every role of `people` (one account): allowed, or 403 with the spec's error body,
    from the declaration the check and the document read. `mint(person_id)`: a fresh session token for the
    account (a fresh one per call: /auth/logout ends the one it is called with). How many calls were refused."""
    account_id = people[roles.OWNER]["account_id"]
    signed = {role: await me(api, p["token"]) for role, p in people.items()}
    assert {role: m["account_id"] for role, m in signed.items()} == dict.fromkeys(people, account_id)
    _, doc, _ = await api.call("GET", "/openapi.json")
    operations = [op for op in PORTAL_OPERATIONS if op.role is not None]
    assert len(operations) > 50  # every bearer operation of the portal
    refused = 0
    for op in operations:
        spec = doc["paths"][op.path][op.method]
        assert spec["x-least-role"] == op.role, op.path
        if op.role != roles.VIEWER:
            error = spec["responses"]["403"]["content"]["application/json"]["schema"]
            assert error == {"$ref": "#/components/schemas/PortalError"}, op.path
        path = re.sub(r"\{(\w+)\}", lambda m: PLACEHOLDERS[m.group(1)], op.path)
        body = {} if op.method in ("post", "patch") else None
        for role in roles.ROLES:
            status, answer, _ = await api.call(op.method.upper(), path, body, token=mint(signed[role]["person_id"]))
            if roles.allows(role, op.role):
                assert not (status == 403 and answer == {"detail": roles.refusal(op.role)}), (op.path, role)
            else:
                assert (status, answer) == (403, {"detail": roles.refusal(op.role)}), (op.method, op.path, role)
                refused += 1
    # Refused calls changed nothing: the account still has its five members.
    status, members, _ = await api.call("GET", "/members", token=people[roles.OWNER]["token"])
    assert sorted(m["role"] for m in members) == sorted(roles.ROLES)
    return refused


async def test_every_portal_operation_against_every_role(api, ctx):
    people = await team(api)
    account_id = people[roles.OWNER]["account_id"]
    assert await walk_the_matrix(api, lambda person: ctx.sessions.issue(person, 0, account_id), people) > 50


async def test_only_an_owner_makes_an_owner_and_the_last_owner_stays(api):
    people = await team(api)
    owner, admin = people[roles.OWNER], people[roles.ADMIN]
    listed = {m["role"]: m for m in (await api.call("GET", "/members", token=owner["token"]))[1]}
    own, their = listed["owner"]["member_id"], listed["admin"]["member_id"]
    dev = listed["developer"]["member_id"]
    # The admin cannot make an owner, nor touch one (Unkey #549: a member promoting others to admin).
    for call in (
        ("PATCH", f"/members/{their}", {"role": "owner"}),
        ("PATCH", f"/members/{dev}", {"role": "owner"}),
        ("PATCH", f"/members/{own}", {"role": "viewer"}),
        ("DELETE", f"/members/{own}", None),
        ("POST", "/members/invitations", {"email": email(), "role": "owner"}),
    ):
        status, body, _ = await api.call(*call, token=admin["token"])
        assert status == 403 and body == {"detail": "Only an owner can make an owner, or change or remove one"}, call
    # An admin does manage everyone else.
    status, body, _ = await api.call("PATCH", f"/members/{dev}", {"role": "viewer"}, token=admin["token"])
    assert status == 200 and body["role"] == "viewer"
    # The last owner can neither leave nor step down.
    for call in (("PATCH", f"/members/{own}", {"role": "admin"}), ("DELETE", f"/members/{own}", None)):
        status, body, _ = await api.call(*call, token=owner["token"])
        assert status == 409 and "last owner" in body["detail"], call
    # Once there is a second owner, the first may leave; their session for the account stops at once.
    status, body, _ = await api.call("PATCH", f"/members/{their}", {"role": "owner"}, token=owner["token"])
    assert status == 200 and body["role"] == "owner"
    assert (await api.call("DELETE", f"/members/{own}", token=owner["token"]))[0] == 200
    assert (await api.call("GET", "/account", token=owner["token"]))[0] == 401
    status, body, _ = await api.call("PATCH", f"/members/{their}", {"role": "admin"}, token=admin["token"])
    assert status == 409  # now the last owner
    status, body, _ = await api.call(
        "POST", "/auth/login", {"email": owner["email"], "password": PASSWORD}
    )  # no account left: told why
    assert status == 403 and "not a member of any account" in body["detail"]


async def test_a_demoted_member_loses_the_rights_at_once(api):
    people = await team(api)
    owner, dev = people[roles.OWNER], people[roles.DEVELOPER]
    key = await api.new_key(dev["token"])
    assert (await api.call("GET", f"/keys/{key['key_id']}/reveal", token=dev["token"]))[0] == 200
    member = (await me(api, dev["token"]))["member_id"]
    assert (await api.call("PATCH", f"/members/{member}", {"role": "viewer"}, token=owner["token"]))[0] == 200
    status, body, _ = await api.call("GET", f"/keys/{key['key_id']}/reveal", token=dev["token"])
    assert status == 403 and body == {"detail": roles.refusal(roles.DEVELOPER)}
    assert (await api.call("GET", "/keys", token=dev["token"]))[0] == 200  # still a viewer


async def test_an_invitation_works_once_expires_and_can_be_revoked(api, ctx):
    owner = await api.register()
    invitation = await invite(api, owner["token"], roles.DEVELOPER)
    assert set(invitation) == {"invitation_id", "email", "role", "expires_at", "token"}
    expires = datetime.fromisoformat(invitation["expires_at"].replace("Z", "+00:00"))
    assert timedelta(days=6, hours=23) < expires - datetime.now(UTC) <= timedelta(days=7)
    status, pending, _ = await api.call("GET", "/members/invitations", token=owner["token"])
    assert [i["invitation_id"] for i in pending] == [invitation["invitation_id"]]
    accept = {"token": invitation["token"], "password": "a long new password"}
    status, joined, _ = await api.call("POST", "/auth/invitations/accept", accept)
    assert status == 200 and joined["account_id"] == owner["account_id"]
    status, body, _ = await api.call("POST", "/auth/invitations/accept", accept)
    assert status == 404 and "already used" in body["detail"]
    assert (await api.call("GET", "/members/invitations", token=owner["token"]))[1] == []
    # Expired: its stored expiry set in the past.
    late = await invite(api, owner["token"], roles.VIEWER)
    await ctx.members.invitations.update_one(
        {"_id": late["invitation_id"]}, {"$set": {"expires_at": datetime.now(UTC) - timedelta(seconds=1)}}
    )
    status, body, _ = await api.call("POST", "/auth/invitations/accept", {"token": late["token"], "password": PASSWORD})
    assert status == 404 and "expired" in body["detail"]
    # Revoked.
    revoked = await invite(api, owner["token"], roles.VIEWER)
    path = f"/members/invitations/{revoked['invitation_id']}"
    assert (await api.call("DELETE", path, token=owner["token"]))[0] == 200
    assert (await api.call("DELETE", path, token=owner["token"]))[0] == 404
    status, _, _ = await api.call("POST", "/auth/invitations/accept", {"token": revoked["token"], "password": PASSWORD})
    assert status == 404
    # The new person signs in with their own password, to the account they joined.
    status, body, _ = await api.call(
        "POST", "/auth/login", {"email": invitation["email"], "password": "a long new password"}
    )
    assert status == 200 and body["account_id"] == owner["account_id"]


async def test_a_person_with_two_accounts_switches_between_them(api):
    owner, other = await api.register(), await api.register()
    invitation = await invite(api, owner["token"], roles.BILLING, other["email"])
    # An existing person accepts with their session: the account is added to theirs.
    status, joined, _ = await api.call(
        "POST", "/auth/invitations/accept", {"token": invitation["token"]}, token=other["token"]
    )
    assert status == 200 and joined["account_id"] == owner["account_id"]
    mine = await me(api, joined["token"])
    assert mine["account_id"] == owner["account_id"] and mine["role"] == "billing"
    assert mine["email"] == other["email"] and mine["person_id"] == other["account_id"]
    assert mine["accounts"] == [
        {"account_id": other["account_id"], "role": "owner", "name": None, "email": other["email"]},
        {"account_id": owner["account_id"], "role": "billing", "name": None, "email": owner["email"]},
    ]
    # Their own account's session is still theirs; switch answers a token for the other account.
    status, switched, _ = await api.call(
        "POST", "/auth/switch", {"account_id": owner["account_id"]}, token=other["token"]
    )
    assert status == 200 and switched["account_id"] == owner["account_id"]
    assert (await me(api, switched["token"]))["role"] == "billing"
    assert (await api.call("POST", "/keys", {"name": "x"}, token=switched["token"]))[0] == 403
    status, body, _ = await api.call(
        "POST", "/auth/switch", {"account_id": "5f0000000000000000000000"}, token=other["token"]
    )
    assert status == 404
    # A login goes to the person's own account first.
    status, body, _ = await api.call("POST", "/auth/login", {"email": other["email"], "password": PASSWORD})
    assert status == 200 and body["account_id"] == other["account_id"]


async def test_an_owner_names_the_account_and_every_member_sees_the_name(api):
    people = await team(api)
    owner, admin = people[roles.OWNER], people[roles.ADMIN]
    status, account, _ = await api.call("PATCH", "/account", {"name": "  Acme research  "}, token=owner["token"])
    assert status == 200 and account["name"] == "Acme research" and account["email"] == owner["email"]
    assert (await api.call("GET", "/account", token=people[roles.VIEWER]["token"]))[1]["name"] == "Acme research"
    # A person in two accounts tells them apart by name (or, unnamed, by the email each was registered with).
    other = await api.register()
    invitation = await invite(api, owner["token"], roles.VIEWER, other["email"])
    status, _, _ = await api.call(
        "POST", "/auth/invitations/accept", {"token": invitation["token"]}, token=other["token"]
    )
    assert status == 200
    assert [(a["name"], a["email"], a["role"]) for a in (await me(api, other["token"]))["accounts"]] == [
        (None, other["email"], "owner"),
        ("Acme research", owner["email"], "viewer"),
    ]
    # Only an owner names it (an admin: 403); a name is a line of text of at most 80 characters, read as written.
    status, body, _ = await api.call("PATCH", "/account", {"name": "Mine now"}, token=admin["token"])
    assert (status, body) == (403, {"detail": roles.refusal(roles.OWNER)})
    for wrong, kind in (
        ({"name": "x" * 81}, "string_too_long"),
        ({"name": "two\nlines"}, "string_pattern_mismatch"),
        ({"name": "\u202etnuocca ruoY"}, "string_pattern_mismatch"),  # a direction override: no look-alike
        ({"name": 7}, "string_type"),
        ({"name": None}, "missing"),
        ({}, "missing"),
        ({"name": "ok", "owner": "me"}, "extra_forbidden"),
    ):
        status, body, _ = await api.call("PATCH", "/account", wrong, token=owner["token"])
        assert status == 422 and body["detail"][0]["type"] == kind, (wrong, body)
    assert (await api.call("GET", "/account", token=owner["token"]))[1]["name"] == "Acme research"  # unchanged
    # The change is in the audit log, by whom; blanks remove the name.
    status, entries, _ = await api.call("GET", "/audit?action=account.renamed", token=admin["token"])
    assert [(e["details"], e["actor"]["email"]) for e in entries["entries"]] == [
        ({"name": "Acme research"}, owner["email"])
    ]
    status, account, _ = await api.call("PATCH", "/account", {"name": "   "}, token=owner["token"])
    assert status == 200 and account["name"] is None
    assert (await me(api, other["token"]))["accounts"][1]["name"] is None


async def test_the_audit_log_names_the_person_and_keys_outlive_their_maker(api, catalog):
    people = await team(api)
    owner, dev = people[roles.OWNER], people[roles.DEVELOPER]
    key = await api.new_key(dev["token"], "made by dev")
    dev_member = (await me(api, dev["token"]))["member_id"]
    (row,) = (await api.call("GET", "/keys", token=owner["token"]))[1]
    assert row["created_by"] == {"member_id": dev_member, "email": dev["email"]}
    status, body, _ = await api.call("GET", f"/audit?member={dev_member}", token=owner["token"])
    assert status == 200
    assert [(e["action"], e["actor"]) for e in body["entries"]][:1] == [
        ("key.created", {"kind": "account", "id": owner["account_id"], "member_id": dev_member, "email": dev["email"]})
    ]
    assert all(e["actor"]["member_id"] == dev_member for e in body["entries"])
    status, body, _ = await api.call("GET", "/audit?action=member.joined", token=owner["token"])
    assert sorted(e["actor"]["email"] for e in body["entries"]) == sorted(people[r]["email"] for r in OTHERS)
    # The key belongs to the account: removing its maker leaves it working.
    await api.call("POST", f"/keys/{key['key_id']}/topup", {"credits": 1000}, token=owner["token"])
    assert (await api.call("DELETE", f"/members/{dev_member}", token=owner["token"]))[0] == 200
    data = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    assert (await api.call("GET", data, key=key["key"]))[0] == 200
    (row,) = (await api.call("GET", "/keys", token=owner["token"]))[1]
    assert row["revoked"] is False and row["created_by"]["email"] == dev["email"]
    status, body, _ = await api.call("GET", "/audit?action=member.removed", token=owner["token"])
    (removed,) = body["entries"]
    assert removed["actor"]["email"] == owner["email"] and removed["details"]["email"] == dev["email"]


async def test_accounts_from_before_members_get_their_owner_at_start(api, ctx):
    user = await api.register()
    # As an account stored before members existed: no member, no owners list.
    await ctx.members.members.delete_many({"account_id": user["account_id"]})
    await ctx.accounts.accounts.update_one({"_id": user["account_id"]}, {"$unset": {"owners": ""}})
    assert (await api.call("GET", "/account", token=user["token"]))[0] == 401
    assert await ctx.members.migrate() >= 1
    assert await ctx.members.migrate() == 0  # idempotent
    mine = await me(api, user["token"])  # the token issued before works again: same person, same account
    assert mine["role"] == "owner" and [(a["account_id"], a["role"]) for a in mine["accounts"]] == [
        (user["account_id"], "owner")
    ]


async def test_an_owners_list_from_before_issue_46_loses_the_names_of_members_gone(api, ctx):
    """The race of issue 46 item 5 left, in databases it ran on, an owners list naming a member who had left: a
    starting gateway takes such names off (never the last), so the last real owner stays one."""
    owner = await api.register()
    account_id, own = owner["account_id"], (await me(api, owner["token"]))["member_id"]
    ghost = "6b0000000000000000000001"
    await ctx.accounts.accounts.update_one(
        {"_id": account_id}, {"$push": {"owners": ghost}, "$unset": {"roster_v": ""}}
    )
    assert (await api.call("PATCH", f"/members/{own}", {"role": "admin"}, token=owner["token"]))[0] == 200
    await ctx.members.members.update_one({"_id": own}, {"$set": {"role": "owner"}})
    await ctx.accounts.accounts.update_one(
        {"_id": account_id}, {"$set": {"owners": [account_id, ghost]}, "$unset": {"roster_v": ""}}
    )
    assert await ctx.members.repair_owners() == 1
    assert await ctx.members.repair_owners() == 0  # once
    assert (await ctx.accounts.accounts.find_one({"_id": account_id}))["owners"] == [account_id]
    status, body, _ = await api.call("PATCH", f"/members/{own}", {"role": "admin"}, token=owner["token"])
    assert status == 409 and "last owner" in body["detail"]


@pytest.mark.settings(admin_require_2fa=True)
async def test_admin_rights_and_their_second_factor_are_the_persons_and_the_console_lists_members(api, ctx):
    owner = await api.register()
    staff = await join(api, owner["token"], roles.VIEWER)
    assert await ctx.accounts.set_admin(staff["email"], True)  # `admin grant EMAIL`: the person, not the account
    path = f"/admin/accounts/{owner['account_id']}"
    assert await api.call("GET", path, token=owner["token"]) == (403, {"detail": "Admins only"}, ANY)
    secret, _ = await enrolled(api, owner)  # the owner's second factor is not the admin's
    status, body, _ = await api.call("GET", path, token=staff["token"])
    assert status == 403 and "ADMIN_REQUIRE_2FA" in body["detail"]
    status, setup, _ = await api.call("POST", "/auth/2fa/setup", {"password": PASSWORD}, token=staff["token"])
    assert status == 200
    status, _, _ = await api.call("POST", "/auth/2fa/enable", {"code": code(setup["secret"])}, token=staff["token"])
    assert status == 200
    status, body, _ = await api.call("GET", path, token=staff["token"])
    assert status == 200, body
    assert [(m["email"], m["role"], m["two_factor"]) for m in body["members"]] == [
        (owner["email"], "owner", True),
        (staff["email"], "viewer", True),
    ]
    # Their sign-ins ask for their own codes.
    status, body, _ = await api.call("POST", "/auth/login", {"email": staff["email"], "password": PASSWORD})
    assert status == 200 and body["two_factor_required"] is True
    status, body, _ = await api.call(
        "POST", "/auth/login", {"email": owner["email"], "password": PASSWORD, "code": code(secret, 1)}
    )
    assert status == 200 and body["account_id"] == owner["account_id"]


async def test_billing_members_write_the_alert_rules_about_money_only(api):
    people = await team(api)
    billing, dev = people[roles.BILLING]["token"], people[roles.DEVELOPER]["token"]
    status, rule = (await api.call("POST", "/alerts", {"kind": "balance_below", "credits": 5}, token=billing))[:2]
    assert status == 200, rule
    key = await api.new_key(dev)
    budget = {"kind": "key_budget", "key_id": key["key_id"], "levels": [80]}
    status, body, _ = await api.call("POST", "/alerts", budget, token=billing)
    assert status == 403 and body["detail"].startswith(roles.refusal(roles.DEVELOPER))
    status, theirs, _ = await api.call("POST", "/alerts", budget, token=dev)
    assert status == 200, theirs
    status, _, _ = await api.call("DELETE", f"/alerts/{theirs['rule_id']}", token=billing)
    assert status == 403
    assert (await api.call("DELETE", f"/alerts/{rule['rule_id']}", token=billing))[0] == 200
    status, body, _ = await api.call(
        "POST", "/alerts", {"kind": "balance_below", "credits": 5}, token=people["viewer"]["token"]
    )
    assert status == 403 and body == {"detail": roles.refusal(roles.DEVELOPER_OR_BILLING)}


async def pending_ids(api, token: str) -> set[str]:
    status, pending, _ = await api.call("GET", "/members/invitations", token=token)
    assert status == 200, pending
    return {i["invitation_id"] for i in pending}


async def test_an_admin_revokes_only_the_invitations_it_could_make(api):
    """Issue 46 item 6: an invitation to become an owner is an owner's to revoke."""
    people = await team(api)
    owner, admin = people[roles.OWNER]["token"], people[roles.ADMIN]["token"]
    to_owner, to_dev = await invite(api, owner, roles.OWNER), await invite(api, owner, roles.DEVELOPER)
    status, body, _ = await api.call("DELETE", f"/members/invitations/{to_owner['invitation_id']}", token=admin)
    assert status == 403 and body == {"detail": "Only an owner can make an owner, or change or remove one"}
    assert to_owner["invitation_id"] in await pending_ids(api, owner)
    assert (await api.call("DELETE", f"/members/invitations/{to_dev['invitation_id']}", token=admin))[0] == 200
    assert (await api.call("DELETE", f"/members/invitations/{to_owner['invitation_id']}", token=owner))[0] == 200
    assert await pending_ids(api, owner) == set()


async def test_an_invitation_is_accepted_only_by_the_address_it_was_sent_to(api):
    """Issue 46 item 7: the link alone does not make its holder the invited person."""
    owner, stranger = await api.register(), await api.register()
    invitation = await invite(api, owner["token"], roles.ADMIN)
    accept = {"token": invitation["token"]}
    status, body, _ = await api.call("POST", "/auth/invitations/accept", accept, token=stranger["token"])
    assert status == 403 and "sent to another email address" in body["detail"]
    members = (await api.call("GET", "/members", token=owner["token"]))[1]
    assert [m["email"] for m in members] == [owner["email"]]
    # Still pending: the invited person accepts it (their password makes the invited address's sign-in).
    status, joined, _ = await api.call("POST", "/auth/invitations/accept", {**accept, "password": PASSWORD})
    assert status == 200 and (await me(api, joined["token"]))["email"] == invitation["email"]


async def test_an_invitation_grants_only_what_its_inviter_still_may(api, ctx):
    """Issue 46 item 7: an inviter removed or demoted takes back the pending invitations it could no longer make
    (and acceptance checks the inviter's role again, for a demotion racing it)."""
    people = await team(api)
    owner = people[roles.OWNER]["token"]
    ids = {m["role"]: m["member_id"] for m in (await api.call("GET", "/members", token=owner))[1]}

    async def accepted(invitation: dict) -> int:
        body = {"token": invitation["token"], "password": PASSWORD}
        return (await api.call("POST", "/auth/invitations/accept", body))[0]

    # An admin demoted to viewer: their invitation goes.
    by_admin = await invite(api, people[roles.ADMIN]["token"], roles.DEVELOPER)
    assert (await api.call("PATCH", f"/members/{ids['admin']}", {"role": "viewer"}, token=owner))[0] == 200
    assert by_admin["invitation_id"] not in await pending_ids(api, owner)
    assert await accepted(by_admin) == 404
    # An owner demoted to admin: their invitation to become an owner goes, the one an admin may make stays.
    dev = people[roles.DEVELOPER]["token"]
    assert (await api.call("PATCH", f"/members/{ids['developer']}", {"role": "owner"}, token=owner))[0] == 200
    to_owner, to_billing = await invite(api, dev, roles.OWNER), await invite(api, dev, roles.BILLING)
    assert (await api.call("PATCH", f"/members/{ids['developer']}", {"role": "admin"}, token=owner))[0] == 200
    assert await pending_ids(api, owner) == {to_billing["invitation_id"]}
    assert await accepted(to_owner) == 404
    assert await accepted(to_billing) == 200
    # A removed inviter: theirs go.
    by_removed = await invite(api, dev, roles.VIEWER)
    assert (await api.call("DELETE", f"/members/{ids['developer']}", token=owner))[0] == 200
    assert await accepted(by_removed) == 404
    # A demotion racing the acceptance (its inviter's role changed after the invitation was read as pending).
    raced = await invite(api, owner, roles.DEVELOPER)
    await ctx.members.members.update_one({"_id": ids["owner"]}, {"$set": {"role": roles.VIEWER}})
    assert await accepted(raced) == 404
    await ctx.members.members.update_one({"_id": ids["owner"]}, {"$set": {"role": roles.OWNER}})
    roster = sorted((m["email"], m["role"]) for m in (await api.call("GET", "/members", token=owner))[1])
    assert roster == sorted(
        [(people[r]["email"], r) for r in (roles.OWNER, roles.BILLING)]
        + [(people[roles.ADMIN]["email"], "viewer"), (people[roles.VIEWER]["email"], "viewer")]
        + [(to_billing["email"], "billing")]
    )


async def test_invitations_are_capped_per_address_and_per_account(api):
    """Issue 46 item 7: one pending invitation per address and account, at most INVITATIONS_PER_EMAIL to one
    address in an hour (an email each: the inbox is someone else's), INVITATIONS_PER_ACCOUNT by one account in
    the days an invitation lives; all held when asked at once."""
    owner = (await api.register())["token"]
    address = email()
    answers = await asyncio.gather(
        *[
            api.call("POST", "/members/invitations", {"email": address, "role": "viewer"}, token=owner)
            for _ in range(12)
        ]
    )
    assert sorted(a[0] for a in answers).count(200) <= 1 and {a[0] for a in answers} <= {200, 409, 429}
    assert len(await pending_ids(api, owner)) <= 1
    # Revoked and invited again, the address gets three in the hour, those made at once counted.
    made = [a[1]["invitation_id"] for a in answers if a[0] == 200]
    while True:
        for invitation_id in await pending_ids(api, owner):
            assert (await api.call("DELETE", f"/members/invitations/{invitation_id}", token=owner))[0] == 200
        status, body, headers = await api.call(
            "POST", "/members/invitations", {"email": address, "role": "viewer"}, token=owner
        )
        if status != 200:
            break
        made.append(body["invitation_id"])
    assert status == 429 and "invited 3 times in the last hour" in body["detail"], body
    assert 0 < int(headers["Retry-After"]) <= 3600 and len(made) <= 3
    # The account: 100 in the days an invitation lives, however many asked at once (3 of them made above).
    answers = await asyncio.gather(
        *[
            api.call("POST", "/members/invitations", {"email": email(), "role": "viewer"}, token=owner)
            for _ in range(100)
        ]
    )
    assert sorted(a[0] for a in answers) == [200] * 97 + [429] * 3, [a[:2] for a in answers if a[0] != 200]
    assert "100 invitations in the last 7 days" in next(a[1]["detail"] for a in answers if a[0] == 429)


async def test_the_accounts_attribution_is_an_owners_to_write(api):
    """Issue 46 item 7: the set-once first touch says how the account came; a viewer cannot set it."""
    people = await team(api)
    first_touch = {"first_touch": {"utm_source": "viewer"}}
    status, body, _ = await api.call("POST", "/auth/attribution", first_touch, token=people[roles.VIEWER]["token"])
    assert (status, body) == (403, {"detail": roles.refusal(roles.OWNER)})
    owners = {"first_touch": {"utm_source": "owner"}}
    status, body, _ = await api.call("POST", "/auth/attribution", owners, token=people[roles.OWNER]["token"])
    assert (status, body) == (200, {"ok": True, "stored": True})


async def test_an_invitation_link_shows_who_invites_whom_to_which_account_with_which_role(api):
    """Issue 47 (4): the link's holder reads the invitation before joining (public), and nothing else."""
    owner = await api.register()
    address = email()
    invitation = await invite(api, owner["token"], roles.BILLING, address)
    status, preview, _ = await api.call("POST", "/auth/invitations/preview", {"token": invitation["token"]})
    assert status == 200 and preview == {
        "email": address,
        "role": "billing",
        "account_name": None,  # no name given: the account's email says whose it is
        "account_email": owner["email"],
        "invited_by": owner["email"],
        "expires_at": invitation["expires_at"],
    }
    status, body, _ = await api.call("POST", "/auth/invitations/preview", {"token": "not-a-token"})
    assert status == 404 and "unknown, already used" in body["detail"]
    accept = {"token": invitation["token"], "password": "a long new password"}
    assert (await api.call("POST", "/auth/invitations/accept", accept))[0] == 200
    assert (await api.call("POST", "/auth/invitations/preview", {"token": invitation["token"]}))[0] == 404  # used


async def test_a_member_removed_from_every_account_starts_an_account_of_their_own(api, ctx):
    """Issue 47 (5): login tells them they may, and with own_account they own a new account; their sign-in is
    the same (the password, later invitations)."""
    owner = await api.register()
    newcomer = await join(api, owner["token"], roles.DEVELOPER, "a long new password")
    member = (await me(api, newcomer["token"]))["member_id"]
    assert (await api.call("DELETE", f"/members/{member}", token=owner["token"]))[0] == 200
    credentials = {"email": newcomer["email"], "password": "a long new password"}
    status, body, _ = await api.call("POST", "/auth/login", credentials)
    assert status == 403 and "start an account of your own" in body["detail"]
    status, body, _ = await api.call("POST", "/auth/register", credentials)
    assert status == 409  # registering still says the email has a sign-in
    wrong = {**credentials, "password": "not the password at all", "own_account": True}
    assert (await api.call("POST", "/auth/login", wrong))[0] == 401
    # Two starts at once (a double click, two tabs): one account, its signup credits added once.
    both = await asyncio.gather(*(api.call("POST", "/auth/login", {**credentials, "own_account": True}) for _ in "ab"))
    assert [status for status, _, _ in both] == [200, 200], both
    session = both[0][1]
    assert both[1][1]["account_id"] == session["account_id"]
    mine = await me(api, session["token"])
    assert mine["role"] == "owner" and mine["account_id"] == mine["person_id"] == session["account_id"]
    assert [(a["account_id"], a["role"]) for a in mine["accounts"]] == [(session["account_id"], "owner")]
    status, account, _ = await api.call("GET", "/account", token=session["token"])
    assert status == 200 and account["credits"] in (0, ctx.settings.signup_credits)  # as at registration
    stored = await ctx.accounts.accounts.find_one({"_id": session["account_id"]})
    assert stored["credits_added"] == stored["credits"] == account["credits"]  # the books: signup credits added
    key = await api.new_key(session["token"])  # an owner's account: keys, members, billing
    assert key["key_id"]
    status, listed, _ = await api.call("GET", "/members", token=session["token"])
    assert [(m["email"], m["role"]) for m in listed] == [(newcomer["email"], "owner")]
    # Asked again later: a login into the same account, no second one, no second signup credit.
    status, again, _ = await api.call("POST", "/auth/login", {**credentials, "own_account": True})
    assert status == 200 and again["account_id"] == session["account_id"]
    assert (await api.call("GET", "/account", token=again["token"]))[1]["credits"] == account["credits"]


async def test_a_registrant_whose_account_others_own_now_cannot_take_it_back(api):
    people = await team(api)
    owner, admin = people[roles.OWNER], people[roles.ADMIN]
    listed = {m["role"]: m for m in (await api.call("GET", "/members", token=owner["token"]))[1]}
    await api.call("PATCH", f"/members/{listed['admin']['member_id']}", {"role": "owner"}, token=owner["token"])
    assert (await api.call("DELETE", f"/members/{listed['owner']['member_id']}", token=admin["token"]))[0] == 200
    credentials = {"email": owner["email"], "password": PASSWORD}
    status, body, _ = await api.call("POST", "/auth/login", credentials)
    assert status == 403 and "start an account of your own" not in body["detail"]  # not offered what cannot be
    status, body, _ = await api.call("POST", "/auth/login", {**credentials, "own_account": True})
    assert status == 403 and "cannot start an account of its own" in body["detail"]
    status, listed, _ = await api.call("GET", "/members", token=admin["token"])
    assert owner["email"] not in [m["email"] for m in listed]  # not brought back into the account it left
