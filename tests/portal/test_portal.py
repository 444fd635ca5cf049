"""Accounts, sessions, API keys, balance and usage: the portal contract, success and error paths."""

import time

import jwt
import pytest
from support import PASSWORD

pytestmark = pytest.mark.gen_test(timeout=30)


async def test_register_login_me(api):
    user = await api.register("Alice@Example.com")
    assert user["token_type"] == "bearer" and user["account_id"]
    status, body, _ = await api.call("POST", "/auth/login", {"email": "alice@example.com", "password": PASSWORD})
    assert status == 200 and body["account_id"] == user["account_id"]
    status, me, _ = await api.call("GET", "/auth/me", token=body["token"])
    assert status == 200
    assert me["account_id"] == user["account_id"] and me["email"] == "alice@example.com" and me["is_admin"] is False
    assert me["created_at"].endswith("Z")  # UTC, one format everywhere (tests/data/test_contract.py)


async def test_duplicate_email_is_409(api):
    await api.register("dup@example.com")
    status, body, _ = await api.call("POST", "/auth/register", {"email": "DUP@example.com", "password": PASSWORD})
    assert status == 409 and "already exists" in body["detail"]


@pytest.mark.parametrize(
    "payload,loc,type_",
    [
        ({"email": "not-an-email", "password": PASSWORD}, ["body", "email"], "value_error"),
        ({"email": "a@example.com", "password": "short"}, ["body", "password"], "string_too_short"),
        ({"email": "a@example.com", "password": "aaaaaaaaaaaa"}, ["body", "password"], "value_error"),
        ({"email": "a@example.com"}, ["body", "password"], "missing"),
        ({"email": 5, "password": PASSWORD}, ["body", "email"], "string_type"),
        ({"email": {"$gt": ""}, "password": PASSWORD}, ["body", "email"], "string_type"),
        ({"email": "a@example.com", "password": PASSWORD, "admin": True}, ["body", "admin"], "extra_forbidden"),
        ([1, 2], ["body"], "dict_type"),
    ],
)
async def test_register_validation(api, payload, loc, type_):
    status, body, _ = await api.call("POST", "/auth/register", payload)
    assert status == 422
    assert {"loc": loc, "type": type_} in [{"loc": e["loc"], "type": e["type"]} for e in body["detail"]]
    assert all(set(e) == {"loc", "msg", "type"} for e in body["detail"])


async def test_body_not_json_is_422(api):
    status, body, _ = await api.call("POST", "/auth/register", raw=b"email=a&password=b")
    assert status == 422 and body["detail"][0]["type"] == "json_invalid"
    status, body, _ = await api.call("POST", "/auth/login", raw=b"")
    assert status == 422 and body["detail"][0]["type"] == "missing"


async def test_oversize_body_is_413(api):
    status, body, _ = await api.call("POST", "/auth/register", raw=b"{" + b" " * 70_000 + b"}")
    assert status == 413


async def test_wrong_credentials_same_answer(api):
    await api.register("bob@example.com")
    wrong = await api.call("POST", "/auth/login", {"email": "bob@example.com", "password": "wrong password!"})
    unknown = await api.call("POST", "/auth/login", {"email": "nobody@example.com", "password": PASSWORD})
    assert wrong[0] == unknown[0] == 401
    assert wrong[1] == unknown[1] == {"detail": "Incorrect email or password"}


@pytest.mark.parametrize(
    "make_token",
    [
        lambda s, a: jwt.encode(
            {"sub": a, "iat": int(time.time()) - 100, "exp": int(time.time()) - 10, "typ": "session"}, s, "HS256"
        ),
        lambda s, a: jwt.encode(
            {"sub": a, "iat": int(time.time()), "exp": int(time.time()) + 99, "typ": "session"},
            "another-secret" * 3,
            "HS256",
        ),
        lambda s, a: jwt.encode(
            {"sub": a, "iat": int(time.time()), "exp": int(time.time()) + 99, "typ": "session"}, None, "none"
        ),
        lambda s, a: jwt.encode(
            {"sub": a, "iat": int(time.time()), "exp": int(time.time()) + 99, "typ": "session"}, s, "HS512"
        ),
        lambda s, a: jwt.encode(
            {"sub": a, "iat": int(time.time()) + 3600, "exp": int(time.time()) + 7200, "typ": "session"}, s, "HS256"
        ),
        lambda s, a: jwt.encode({"sub": a, "iat": int(time.time())}, s, "HS256"),
        lambda s, a: "not.a.token",
    ],
    ids=["expired", "wrong-key", "alg-none", "wrong-alg", "future-iat", "no-exp", "garbage"],
)
async def test_bad_tokens_are_401(api, ctx, make_token):
    user = await api.register()
    token = make_token(ctx.settings.jwt_secret, user["account_id"])
    status, body, headers = await api.call("GET", "/auth/me", token=token)
    assert status == 401 and body == {"detail": "Invalid or expired token"}
    assert headers["WWW-Authenticate"] == "Bearer"


async def test_tampered_token_is_401(api):
    user = await api.register()
    head, payload, sig = user["token"].split(".")
    tampered = f"{head}.{payload[:-2]}{'A' if payload[-2] != 'A' else 'B'}{payload[-1]}.{sig}"
    assert (await api.call("GET", "/auth/me", token=tampered))[0] == 401


async def test_missing_token_is_401_on_every_portal_endpoint(api):
    for method, path in [
        ("GET", "/auth/me"),
        ("GET", "/keys"),
        ("POST", "/keys"),
        ("GET", "/keys/1/reveal"),
        ("POST", "/keys/1/revoke"),
        ("POST", "/keys/1/topup"),
        ("GET", "/account"),
        ("GET", "/usage"),
        ("POST", "/auth/attribution"),
    ]:
        status, body, _ = await api.call(method, path, body={})
        assert status == 401, (method, path)
        assert body == {"detail": "Not authenticated"}


async def test_api_key_is_not_a_session_token(api):
    user = await api.register()
    key = await api.new_key(user["token"])
    assert (await api.call("GET", "/account", token=key["key"]))[0] == 401


async def test_key_lifecycle(api):
    user = await api.register()
    token = user["token"]
    created = await api.new_key(token, "crawler")
    assert created["key"].startswith("sgw_") and len(created["key"]) >= 4 + 32
    assert created["name"] == "crawler" and created["revoked"] is False and created["qps_limit"] == 0.2
    assert created["key"].startswith(created["prefix"])
    status, listed, _ = await api.call("GET", "/keys", token=token)
    assert status == 200 and len(listed) == 1
    assert set(listed[0]) == {"key_id", "name", "prefix", "qps_limit", "revoked", "created_at", "last_used_at"} | {
        "rolled_to",
        "expires_at",
        "allowed_endpoints",
        "allowed_ips",
        "credit_limit",
        "credit_limit_period",
        "credits_used",
        "created_by",  # the member who made it (issue 37); the key is the account's
    }
    assert created["key"] not in str(listed)
    status, revealed, _ = await api.call("GET", f"/keys/{created['key_id']}/reveal", token=token)
    assert status == 200 and revealed == {"key_id": created["key_id"], "key": created["key"]}
    status, revoked, _ = await api.call("POST", f"/keys/{created['key_id']}/revoke", token=token)
    assert status == 200 and revoked["revoked"] is True
    assert (await api.call("POST", f"/keys/{created['key_id']}/revoke", token=token))[0] == 200  # idempotent
    status, listed, _ = await api.call("GET", "/keys", token=token)
    assert listed[0]["revoked"] is True


async def test_key_create_defaults_and_validation(api):
    user = await api.register()
    status, body, _ = await api.call("POST", "/keys", token=user["token"])
    assert status == 200 and body["name"] == "default"
    status, body, _ = await api.call("POST", "/keys", {"name": 12}, token=user["token"])
    assert status == 422 and body["detail"][0]["loc"] == ["body", "name"]


async def test_other_accounts_keys_are_404(api):
    owner, other = await api.register(), await api.register()
    key = await api.new_key(owner["token"])
    for method, path, body in [
        ("GET", f"/keys/{key['key_id']}/reveal", None),
        ("POST", f"/keys/{key['key_id']}/revoke", None),
        ("POST", f"/keys/{key['key_id']}/topup", {"credits": 100}),
    ]:
        status, answer, _ = await api.call(method, path, body, token=other["token"])
        assert status == 404 and answer == {"detail": "Key not found"}, path
    assert (await api.call("GET", "/keys/999999/reveal", token=owner["token"]))[0] == 404
    # The owner's key is untouched by the other account's attempts.
    status, listed, _ = await api.call("GET", "/keys", token=owner["token"])
    assert listed[0]["revoked"] is False


async def test_key_id_must_be_an_integer(api):
    user = await api.register()
    status, body, _ = await api.call("GET", "/keys/abc/reveal", token=user["token"])
    assert status == 422 and body["detail"][0]["loc"] == ["path", "key_id"]


async def test_topup_balance_and_plan(api):
    user = await api.register()
    key = await api.new_key(user["token"])
    status, account, _ = await api.call("GET", "/account", token=user["token"])
    assert status == 200 and account["credits"] == 0 and account["plan"] == "free" and account["qps_limit"] == 0.2
    status, body, _ = await api.call("POST", f"/keys/{key['key_id']}/topup", {"credits": 5000}, token=user["token"])
    assert status == 200 and body["credits"] == 5000
    status, account, _ = await api.call("GET", "/account", token=user["token"])
    assert account["credits"] == 5000 and account["plan"] == "paid" and account["qps_limit"] == 20
    assert account["total_paid_usd"] == 0  # a development top-up is not a payment
    status, listed, _ = await api.call("GET", "/keys", token=user["token"])
    assert listed[0]["qps_limit"] == 20


@pytest.mark.parametrize(
    "payload", [{"credits": 0}, {"credits": -5}, {"credits": "100"}, {"credits": 1.5}, {}, {"credits": True}]
)
async def test_topup_validation(api, payload):
    user = await api.register()
    key = await api.new_key(user["token"])
    status, body, _ = await api.call("POST", f"/keys/{key['key_id']}/topup", payload, token=user["token"])
    assert status == 422 and body["detail"][0]["loc"] == ["body", "credits"]
    assert (await api.call("GET", "/account", token=user["token"]))[1]["credits"] == 0


@pytest.mark.settings(signup_credits=250)
async def test_signup_credits(api):
    user = await api.register()
    assert (await api.call("GET", "/account", token=user["token"]))[1]["credits"] == 250


async def test_usage_params(api):
    user = await api.register()
    status, body, _ = await api.call("GET", "/usage", token=user["token"])
    assert status == 200 and body == []
    for query, loc in [
        ("days=0", "days"),
        ("days=366", "days"),
        ("days=x", "days"),
        ("limit=0", "limit"),
        ("limit=10001", "limit"),
    ]:
        status, body, _ = await api.call("GET", f"/usage?{query}", token=user["token"])
        assert status == 422 and body["detail"][0]["loc"] == ["query", loc], query


async def test_attribution_set_once(api, ctx):
    user = await api.register()
    await ctx.accounts.events.insert_one({"anonymous_id": "anon-1", "account_id": None, "event": "page_view"})
    status, body, _ = await api.call(
        "POST",
        "/auth/attribution",
        {"first_touch": {"utm_source": "hn"}, "anonymous_id": "anon-1"},
        token=user["token"],
    )
    assert status == 200 and body["stored"] is True
    status, body, _ = await api.call(
        "POST", "/auth/attribution", {"first_touch": {"utm_source": "later"}}, token=user["token"]
    )
    assert status == 200 and body == {"ok": True, "stored": False}  # set-once kept the earlier value
    status, body, _ = await api.call("POST", "/auth/attribution", {"anonymous_id": "anon-2"}, token=user["token"])
    assert body == {"ok": True, "stored": False}
    doc = await ctx.accounts.accounts.find_one({"_id": user["account_id"]})
    assert doc["first_touch"] == {"utm_source": "hn"}
    assert (await ctx.accounts.events.find_one({"anonymous_id": "anon-1"}))["account_id"] == user["account_id"]


async def test_attribution_best_effort_and_not_json(api):
    user = await api.register()
    status, body, _ = await api.call("POST", "/auth/attribution", {"first_touch": {"$where": "1"}}, token=user["token"])
    assert status == 200 and body["stored"] is False
    status, body, _ = await api.call("POST", "/auth/attribution", raw=b"not json", token=user["token"])
    assert status == 422


async def test_unknown_path_is_json_404(api):
    status, body, headers = await api.call("GET", "/nope")
    assert status == 404 and body == {"detail": "Not found"} and headers["X-Request-ID"]


async def test_an_interval_too_short_is_refused_in_a_customers_words(api):
    """A real-time rule polled every 5 s on a server whose shortest interval is 10 s: the 422 says what to choose,
    not which setting of the server's refuses it."""
    user = await api.register()
    rule = {"kind": "rule", "tag": "btc", "value": "bitcoin", "interval_seconds": 5}
    status, body, _ = await api.call("POST", "/streams", rule, token=user["token"])
    assert status == 422 and body["detail"][0]["loc"] == ["body", "interval_seconds"], body
    msg = body["detail"][0]["msg"]
    assert msg == "Choose from 10 seconds to a day (86400): a rule is polled at most every 10 seconds", msg
