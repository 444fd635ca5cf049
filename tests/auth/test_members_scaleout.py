"""Teams on one balance against a served gateway with `--workers 2` (issue 37): five people with five roles on one
balance, each signing in with their own password and second factor; the whole role matrix through
both workers; an invitation that works once and expires; a removed member locked out at once in every worker;
the audit log naming the person behind each action; the owners guard under a promotion racing the member's
removal (issue 46)."""

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta

import orjson
import pyotp
import pytest
from support import Gateway
from test_members import OTHERS, invite, me, walk_the_matrix

from security import roles, tokens
from storage import db as database

pytestmark = pytest.mark.gen_test(timeout=240)
PASSWORDS = {role: f"{role} has a password of their own" for role in roles.ROLES}


class Client:
    """The in-process tests' `api` shape over a served gateway: (status, JSON body, headers)."""

    def __init__(self, gw: Gateway):
        self.gw = gw

    async def call(self, method: str, path: str, body=None, token: str | None = None, key: str | None = None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if key:
            headers["X-API-Key"] = key
        if body is None and method in ("POST", "PATCH", "PUT"):
            body = {}
        response = await self.gw.call(method, path, body, **headers)
        json = response.headers.get("Content-Type", "").startswith("application/json") and response.body
        return response.code, orjson.loads(response.body) if json else response.body, response.headers

    async def register(self, password: str) -> dict:
        email = f"owner-{uuid.uuid4().hex[:8]}@example.com"
        status, body, _ = await self.call("POST", "/auth/register", {"email": email, "password": password})
        assert status == 200, body
        return {**body, "email": email}


async def login(api: Client, email: str, password: str, **extra) -> tuple[int, dict]:
    status, body, _ = await api.call("POST", "/auth/login", {"email": email, "password": password, **extra})
    return status, body


@pytest.fixture
def served(io_loop, mongo, upstream_url):
    db_name = f"m_{uuid.uuid4().hex[:10]}"
    # Every person here signs in from 127.0.0.1, and each worker counts that address's attempts on its own: the
    # 25 throttled calls of five_people and its sign-ins, split unevenly between two workers, could pass the
    # default 20 in one of them (a 429 once, 1 run in 20). Likewise the password checks of one email: each counts
    # as a failure until it is known to have passed, so six of eight accepts of one invitation checked at once in
    # one worker passed the default 5 (a 429 once in the last 22 fresh-clone runs). Both limits are
    # test_security's subject.
    limits = {"LOGIN_MAX_ATTEMPTS_PER_ADDRESS": "1000", "LOGIN_MAX_FAILURES_PER_EMAIL": "1000"}
    gw = Gateway(mongo.uri, upstream_url, db_name, workers=2, **limits)
    gw = io_loop.run_sync(gw.launch, timeout=120)
    client = database.connect(mongo.uri)
    yield Client(gw), client[db_name]
    io_loop.run_sync(client.close)


async def five_people(api: Client, second_factor: tuple = (roles.DEVELOPER,)) -> dict:
    """Five people with five roles on one balance, each with their own password; those of `second_factor` with a
    second factor of their own too. role -> {token, email, account_id, ...}."""
    owner = await api.register(PASSWORDS[roles.OWNER])
    people = {roles.OWNER: owner}
    for role in OTHERS:
        invitation = await invite(api, owner["token"], role)
        status, body, _ = await api.call(
            "POST", "/auth/invitations/accept", {"token": invitation["token"], "password": PASSWORDS[role]}
        )
        assert status == 200, body
        people[role] = {**body, "email": invitation["email"]}
    for role, person in people.items():
        if role in second_factor:
            status, setup, _ = await api.call(
                "POST", "/auth/2fa/setup", {"password": PASSWORDS[role]}, token=person["token"]
            )
            assert status == 200, setup
            code = pyotp.TOTP(setup["secret"]).now()
            assert (await api.call("POST", "/auth/2fa/enable", {"code": code}, token=person["token"]))[0] == 200
            person["totp"] = setup["secret"]
    return people


async def test_five_people_one_balance_five_roles_own_sign_ins_and_the_whole_matrix(served):
    api, db = served
    people = await five_people(api, second_factor=roles.ROLES)
    account_id = people[roles.OWNER]["account_id"]
    # Each signs in with their own password to the one account; nobody else's password opens it.
    for role, person in people.items():
        status, body = await login(api, person["email"], PASSWORDS[role])
        # Each person's second factor is their own, not the account's.
        assert status == 200 and body["two_factor_required"] is True, body
        code = pyotp.TOTP(person["totp"]).at(time.time() + 30)  # the next step: never the one enrolment used
        status, body = await login(api, person["email"], PASSWORDS[role], code=code)
        assert status == 200 and body["account_id"] == account_id, (role, body)
        assert (await me(api, body["token"]))["role"] == role
        other = PASSWORDS[roles.VIEWER if role != roles.VIEWER else roles.OWNER]
        assert (await login(api, person["email"], other))[0] == 401
    listed = (await api.call("GET", "/members", token=people[roles.OWNER]["token"]))[1]
    assert {m["email"]: (m["role"], m["two_factor"]) for m in listed} == {
        p["email"]: (role, True) for role, p in people.items()
    }
    # One balance: the billing member's top-up is what everyone sees.
    key = await api.call("POST", "/keys", {"name": "shared"}, token=people[roles.DEVELOPER]["token"])
    status, _, _ = await api.call(
        "POST", f"/keys/{key[1]['key_id']}/topup", {"credits": 5000}, token=people[roles.BILLING]["token"]
    )
    assert status == 200
    for person in people.values():
        assert (await api.call("GET", "/account", token=person["token"]))[1]["credits"] == 5000
    # The whole matrix, through both workers.
    secret = api.gw.env["JWT_SECRET"]
    refused = await walk_the_matrix(
        api, lambda person: tokens.issue(secret, person, 600, account_id=account_id), people
    )
    assert refused > 50


async def test_a_removed_member_is_locked_out_at_once_in_every_worker(served):
    api, db = served
    owner = await api.register(PASSWORDS[roles.OWNER])
    invitation = await invite(api, owner["token"], roles.DEVELOPER)
    status, dev, _ = await api.call(
        "POST", "/auth/invitations/accept", {"token": invitation["token"], "password": PASSWORDS[roles.DEVELOPER]}
    )
    assert status == 200
    # Several sessions of the member, each used through both workers (a new connection per call).
    sessions = [dev["token"]] + [
        (await login(api, invitation["email"], PASSWORDS[roles.DEVELOPER]))[1]["token"] for _ in range(3)
    ]
    for token in sessions:
        assert all(s == 200 for s in await asyncio.gather(*[calls(api, token) for _ in range(4)]))
    member = (await me(api, dev["token"]))["member_id"]
    status, _, _ = await api.call("DELETE", f"/members/{member}", token=owner["token"])
    assert status == 200
    removed_at = time.monotonic()
    # From the answer on, every call of every session is refused, whichever worker takes it; measured until
    # 40 in a row hold (polling, generous deadline; no sleep-and-hope).
    held, first_locked = 0, None
    while held < 40:
        assert time.monotonic() - removed_at < 30, "the removed member still gets in"
        status = await calls(api, sessions[held % len(sessions)])
        if status == 401:
            first_locked = first_locked if first_locked is not None else time.monotonic() - removed_at
            held += 1
        else:
            held = 0
    print(f"removed member locked out {first_locked * 1000:.0f} ms after the removal's answer")
    assert first_locked < 1.0
    # Signing in again opens nothing of that account: they are a member of none now.
    status, body = await login(api, invitation["email"], PASSWORDS[roles.DEVELOPER])
    assert status == 403 and "not a member of any account" in body["detail"]


async def calls(api: Client, token: str) -> int:
    return (await api.call("GET", "/keys", token=token))[0]


async def test_an_invitation_works_once_and_expires_through_both_workers(served):
    api, db = served
    owner = await api.register(PASSWORDS[roles.OWNER])
    invitation = await invite(api, owner["token"], roles.VIEWER)
    accept = {"token": invitation["token"], "password": PASSWORDS[roles.VIEWER]}
    # Eight accepts at once, through both workers: one joins.
    answers = await asyncio.gather(*[api.call("POST", "/auth/invitations/accept", accept) for _ in range(8)])
    assert sorted(a[0] for a in answers).count(200) == 1, [a[:2] for a in answers]
    assert {a[0] for a in answers} <= {200, 404, 409}
    members = (await api.call("GET", "/members", token=owner["token"]))[1]
    assert [m["role"] for m in members] == ["owner", "viewer"]
    late = await invite(api, owner["token"], roles.VIEWER)
    await db.invitations.update_one(
        {"_id": late["invitation_id"]}, {"$set": {"expires_at": datetime.now(UTC) - timedelta(seconds=1)}}
    )
    status, body, _ = await api.call(
        "POST", "/auth/invitations/accept", {"token": late["token"], "password": PASSWORDS[roles.VIEWER]}
    )
    assert status == 404 and "expired" in body["detail"]
    assert (await api.call("GET", "/members/invitations", token=owner["token"]))[1] == []


async def test_the_audit_log_names_each_person(served):
    api, db = served
    people = await five_people(api)
    owner = people[roles.OWNER]
    await api.call("POST", "/keys", {"name": "by dev"}, token=people[roles.DEVELOPER]["token"])
    await api.call("POST", "/webhooks", {"url": "http://127.0.0.1:9/h"}, token=people[roles.ADMIN]["token"])
    await api.call("POST", "/auth/logout", token=people[roles.VIEWER]["token"])
    status, body, _ = await api.call("GET", "/audit?limit=200", token=owner["token"])
    assert status == 200
    by = {e["action"]: e["actor"]["email"] for e in reversed(body["entries"]) if "member_id" in e["actor"]}
    assert by["key.created"] == people[roles.DEVELOPER]["email"]
    assert by["webhook.created"] == people[roles.ADMIN]["email"]
    assert by["logout"] == people[roles.VIEWER]["email"]
    assert by["member.invited"] == owner["email"] and by["2fa.enabled"] == people[roles.DEVELOPER]["email"]
    assert all("member_id" in e["actor"] for e in body["entries"])  # every action in the account was someone's


async def test_a_promotion_racing_a_removal_never_leaves_the_account_without_an_owner(served):
    """Issue 46 item 5: an owner promotes a member while that member leaves, or is removed by the owner or by an
    admin, or is demoted, at the same moment, through both workers. Whatever order they land in, the owners guard
    holds: the account's owners list names exactly its members who are owners, and its last real owner still
    cannot step down (409)."""
    api, db = served
    owner = await api.register(PASSWORDS[roles.OWNER])
    account_id, own = owner["account_id"], (await me(api, owner["token"]))["member_id"]
    admin = await join(api, owner["token"], roles.ADMIN)
    outcomes: dict[str, set] = {}
    for trial in range(16):
        joined = await join(api, owner["token"], roles.ADMIN)
        member = (await me(api, joined["token"]))["member_id"]
        kind, promote = ("leaves", "removed", "removed by an admin", "demoted")[trial % 4], {"role": "owner"}
        other = {
            "leaves": ("DELETE", f"/members/{member}", None, joined["token"]),
            "removed": ("DELETE", f"/members/{member}", None, owner["token"]),
            "removed by an admin": ("DELETE", f"/members/{member}", None, admin["token"]),
            "demoted": ("PATCH", f"/members/{member}", {"role": "viewer"}, owner["token"]),
        }[kind]
        promoted, raced = await asyncio.gather(
            api.call("PATCH", f"/members/{member}", promote, token=owner["token"]),
            api.call(*other[:3], token=other[3]),
        )
        outcomes.setdefault(kind, set()).add((promoted[0], raced[0]))
        # The admin's removal of a member made an owner a moment before is refused, as for one made long ago.
        assert raced[0] in ((200, 403) if kind == "removed by an admin" else (200,)), (kind, raced[:2])
        assert promoted[0] in (200, 404), (kind, promoted[:2])
        members = {m["person_id"]: m["role"] async for m in db.members.find({"account_id": account_id})}
        owners = (await db.accounts.find_one({"_id": account_id}))["owners"]
        assert sorted(owners) == sorted(p for p, role in members.items() if role == roles.OWNER), (kind, members)
        if member in {m["member_id"] for m in (await api.call("GET", "/members", token=owner["token"]))[1]}:
            assert (await api.call("DELETE", f"/members/{member}", token=owner["token"]))[0] == 200
        status, body, _ = await api.call("PATCH", f"/members/{own}", {"role": roles.ADMIN}, token=owner["token"])
        assert status == 409 and "last owner" in body["detail"], (trial, kind, status, body)
    print(f"(promotion, other) answers seen: {outcomes}")


async def join(api: Client, token: str, role: str) -> dict:
    """A new person invited with `role` who accepts with a password of their own: their session."""
    invitation = await invite(api, token, role)
    accept = {"token": invitation["token"], "password": PASSWORDS[role]}
    status, joined, _ = await api.call("POST", "/auth/invitations/accept", accept)
    assert status == 200, joined
    return joined
