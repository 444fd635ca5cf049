"""Retries (issue 22), in one process: an Idempotency-Key makes a repeated call answer what the first did, charged
once; the same key with another request is 422; answers not charged are not kept; portal creates are not repeated;
refused calls take no rate-limit token; every 429 and 503 says when to retry. The races (client gone, 50 at once,
two processes, restarts, a crash) are attacked on served gateways in tests/data/test_idempotency_races.py."""

import asyncio
import re
from datetime import UTC, datetime

import orjson
import pytest
import tornado.httpserver
import tornado.web
from support import FAST, balance, use_upstream
from tornado.testing import bind_unused_port

from handlers.openapi import PORTAL_OPERATIONS as OPERATIONS

pytestmark = pytest.mark.gen_test(timeout=60)

PROFILE = b'{"status":"success","msg":"","data":{"id":"1","userName":"someone"}}'
PRICE = 18  # one profile


class Provider(tornado.web.RequestHandler):
    """A provider whose answer the test changes as it goes: `state["status"]`, `state["body"]`, `state["delay"]`;
    counts calls."""

    def initialize(self, state: dict) -> None:
        self.state = state

    async def get(self, path):
        self.state["calls"] += 1
        await asyncio.sleep(self.state["delay"])
        self.set_status(self.state["status"])
        self.finish(self.state["body"])


def provider(ctx, status: int = 200, body: bytes = PROFILE, delay: float = 0.0) -> dict:
    state = {"calls": 0, "status": status, "body": body, "delay": delay}
    sock, port = bind_unused_port()
    server = tornado.httpserver.HTTPServer(tornado.web.Application([(r"(.*)", Provider, {"state": state})]))
    server.add_sockets([sock])
    use_upstream(ctx, f"http://127.0.0.1:{port}")
    return state


PATH = "/social/user/info?userName=someone"


async def usage(api, user) -> list[dict]:
    return (await api.call("GET", "/usage", token=user["token"]))[1]


@pytest.mark.settings(plan_rules=FAST)
async def test_a_repeat_gets_the_first_answer_charged_once(api, ctx):
    """Invariant: one charge per key. The repeat gets the same status and body, X-Credits-Charged 0,
    Idempotent-Replayed and the first call's request id; /usage shows it as a 0-credit record pointing at the
    first; the /twitter alias and the draft's quoted key are the same request and key."""
    seen = provider(ctx)
    user, key = await api.funded_key(10_000)
    first = await api.call("GET", PATH, key=key["key"], headers={"Idempotency-Key": "order-42"})
    assert first[0] == 200 and first[2]["X-Credits-Charged"] == str(PRICE) and "Idempotent-Replayed" not in first[2]
    for path, sent in ((PATH, "order-42"), (PATH.replace("/social/", "/twitter/"), '"order-42"')):
        status, body, headers = await api.call("GET", path, key=key["key"], headers={"Idempotency-Key": sent})
        assert (status, body) == (200, orjson.loads(PROFILE))
        assert headers["X-Credits-Charged"] == "0" and headers["Idempotent-Replayed"] == "true"
        assert headers["X-Request-ID"] == first[2]["X-Request-ID"]
    assert seen["calls"] == 1
    assert await balance(api, user) == 10_000 - PRICE
    records = await usage(api, user)
    assert [(r["credits"], r["replay_of"]) for r in records] == [
        (0, first[2]["X-Request-ID"]),
        (0, first[2]["X-Request-ID"]),
        (PRICE, None),
    ]


@pytest.mark.settings(plan_rules=FAST)
async def test_the_same_key_for_another_request_is_422_and_free(api, ctx):
    """Invariant: a key names one request. Another query or endpoint with it: 422 (loc header), no provider call,
    nothing charged or recorded; a new key is a new call."""
    seen = provider(ctx)
    user, key = await api.funded_key(10_000)
    assert (await api.call("GET", PATH, key=key["key"], headers={"Idempotency-Key": "k1"}))[0] == 200
    for other in ("/social/user/info?userName=someone-else", "/social/user_about?userName=someone"):
        status, body, _ = await api.call("GET", other, key=key["key"], headers={"Idempotency-Key": "k1"})
        assert status == 422, body
        assert body["detail"][0]["loc"] == ["header", "Idempotency-Key"]
        assert body["detail"][0]["type"] == "idempotency_key_reused"
    assert seen["calls"] == 1 and len(await usage(api, user)) == 1
    assert (await api.call("GET", PATH, key=key["key"], headers={"Idempotency-Key": "k2"}))[2]["X-Credits-Charged"] == (
        str(PRICE)
    )
    assert await balance(api, user) == 10_000 - 2 * PRICE


@pytest.mark.settings(plan_rules=FAST)
@pytest.mark.parametrize(
    "value, kind",
    [
        ("", "string_too_short"),
        ("k" * 256, "string_too_long"),
        ("caf\u00e9", "string_pattern_mismatch"),
        ('" quoted with spaces "', "string_pattern_mismatch"),
    ],
    ids=["empty", "256-characters", "not-ascii", "edge-spaces"],
)
async def test_a_malformed_key_is_422_and_free(api, ctx, value, kind):
    """A key is 1-255 printable ASCII characters, not starting or ending with a space; anything else is refused
    before anything is forwarded or charged."""
    seen = provider(ctx)
    user, key = await api.funded_key(10_000)
    status, body, _ = await api.call("GET", PATH, key=key["key"], headers={"Idempotency-Key": value})
    assert status == 422 and body["detail"][0]["loc"] == ["header", "Idempotency-Key"], body
    assert body["detail"][0]["type"] == kind
    assert seen["calls"] == 0 and await usage(api, user) == [] and await balance(api, user) == 10_000
    status, _, _ = await api.call("GET", PATH, key=key["key"], headers={"Idempotency-Key": "k" * 255})
    assert status == 200


@pytest.mark.settings(plan_rules=FAST)
async def test_answers_not_charged_are_not_kept(api, ctx):
    """Invariant: a retry of a call that was not charged runs again. The provider fails (502), then answers an
    error body (passed through uncharged), then the account cannot pay (402); each retry with the same key goes
    to the provider again, and once it succeeds it is charged once and kept."""
    seen = provider(ctx, 500)
    user, key = await api.funded_key(PRICE)
    sent = {"Idempotency-Key": "retry-me"}
    assert (await api.call("GET", PATH, key=key["key"], headers=sent))[0] == 502
    seen["status"], seen["body"] = 200, b'{"status":"error","msg":"User not found"}'
    status, _, headers = await api.call("GET", PATH, key=key["key"], headers=sent)
    assert status == 200 and headers["X-Credits-Charged"] == "0" and "Idempotent-Replayed" not in headers
    seen["body"] = PROFILE
    other = await api.call("GET", PATH + "&x=1", key=key["key"])  # spends the balance: the next call cannot pay
    assert other[0] == 200 and await balance(api, user) == 0
    assert (await api.call("GET", PATH, key=key["key"], headers=sent))[0] == 402
    await api.call("POST", f"/keys/{key['key_id']}/topup", {"credits": PRICE}, token=user["token"])
    calls = seen["calls"]
    status, body, headers = await api.call("GET", PATH, key=key["key"], headers=sent)
    assert status == 200 and headers["X-Credits-Charged"] == str(PRICE) and seen["calls"] == calls + 1
    again = await api.call("GET", PATH, key=key["key"], headers=sent)
    assert again[2]["Idempotent-Replayed"] == "true" and seen["calls"] == calls + 1
    assert await balance(api, user) == 0


@pytest.mark.settings(plan_rules=FAST, idempotency_max_body_bytes=len(PROFILE) - 1)
async def test_an_answer_too_large_to_keep_is_charged_once_and_never_again(api, ctx):
    """Past IDEMPOTENCY_MAX_BODY_BYTES the answer is served and charged, and only its charge is kept: a repeat
    gets 409 (no Retry-After: waiting will not help), no provider call, nothing charged or recorded."""
    seen = provider(ctx)
    user, key = await api.funded_key(10_000)
    sent = {"Idempotency-Key": "big"}
    first = await api.call("GET", PATH, key=key["key"], headers=sent)
    assert first[0] == 200 and first[2]["X-Credits-Charged"] == str(PRICE)
    status, body, headers = await api.call("GET", PATH, key=key["key"], headers=sent)
    assert status == 409 and "too large to keep" in body["msg"] and first[2]["X-Request-ID"] in body["msg"]
    assert "Retry-After" not in headers
    assert seen["calls"] == 1 and len(await usage(api, user)) == 1 and await balance(api, user) == 10_000 - PRICE


@pytest.mark.settings(plan_rules=FAST)
async def test_a_call_whose_claim_was_taken_over_is_not_charged(api, ctx, second):
    """Invariant: two runs of one key are never both charged. A process that stalls past its claim's lease loses
    the key to another process (here `second`, taking it over as it would once the lease has passed); when the
    late call's answer comes back it cannot be kept, so it is served but not charged."""
    seen = provider(ctx, delay=0.5)
    user, key = await api.funded_key(10_000)
    late = asyncio.ensure_future(api.call("GET", PATH, key=key["key"], headers={"Idempotency-Key": "stalled"}))
    while not seen["calls"]:
        await asyncio.sleep(0.01)
    (claim,) = [doc async for doc in ctx.client[ctx.settings.mongodb_db].idempotency_keys.find()]
    lease = datetime.now(UTC) + second.idempotency.lease
    assert await second.idempotency.store.take_over(claim["_id"], claim["owner"], claim["request"], "other", lease)
    status, body, headers = await late
    assert (status, body) == (200, orjson.loads(PROFILE)) and headers["X-Credits-Charged"] == "0"
    assert [r["credits"] for r in await usage(api, user)] == [0] and await balance(api, user) == 10_000


# --- portal writes that create things --------------------------------------------------------------------------
async def test_a_retried_create_returns_the_first_result(api, ctx):
    """Invariant: one key, one roll, one order, one top-up per Idempotency-Key, whatever the number of retries:
    each repeat gets the first answer (a new key's secret included) marked as a replay. The kept answers are
    sealed: the secret is nowhere in the database in clear."""
    user, key = await api.funded_key(1_000)
    token = user["token"]

    async def twice(path: str, body: dict, name: str) -> dict:
        sent = {"Idempotency-Key": name}
        s1, first, h1 = await api.call("POST", path, body, token=token, headers=sent)
        s2, second, h2 = await api.call("POST", path, body, token=token, headers=sent)
        assert (s1, s2) == (200, 200) and first == second, (first, second)
        assert h2["Idempotent-Replayed"] == "true" and h2["X-Request-ID"] == h1["X-Request-ID"]
        return first

    created = await twice("/keys", {"name": "ci"}, "create-ci")
    assert len((await api.call("GET", "/keys", token=token))[1]) == 2
    rolled = await twice(f"/keys/{created['key_id']}/roll", {"grace_seconds": 60}, "roll-ci")
    assert rolled["rolled_from"] == created["key_id"] and len((await api.call("GET", "/keys", token=token))[1]) == 3
    topped = await twice(f"/keys/{key['key_id']}/topup", {"credits": 500}, "topup-1")
    assert topped["credits"] == 1_500 and await balance(api, user) == 1_500
    order = await twice("/billing/crypto/checkout", {"currency": "USDTTRC20", "amount_usd": 5}, "order-1")
    assert [o["order_id"] for o in (await api.call("GET", "/billing/crypto/orders", token=token))[1]] == [
        order["order_id"]
    ]
    status, body, _ = await api.call(
        "POST", "/keys", {"name": "other"}, token=token, headers={"Idempotency-Key": "create-ci"}
    )
    assert status == 422 and body["detail"][0]["loc"] == ["header", "Idempotency-Key"]
    stored = [doc async for doc in ctx.client[ctx.settings.mongodb_db].idempotency_keys.find()]
    assert len(stored) == 4 and not any(
        created["key"].encode() in orjson.dumps(doc, default=bytes.hex) for doc in stored
    )
    assert not any(rolled["key"].encode() in doc["answer"]["body"] for doc in stored)


@pytest.mark.settings(max_keys_per_account=1)
async def test_a_refused_create_is_not_kept(api):
    """An error is not the first result: at the key cap POST /keys is 409; once a key is revoked, the same
    retry creates the key."""
    user, key = await api.funded_key(1_000)
    sent = {"Idempotency-Key": "second-key"}
    assert (await api.call("POST", "/keys", {"name": "b"}, token=user["token"], headers=sent))[0] == 409
    await api.call("POST", f"/keys/{key['key_id']}/revoke", token=user["token"])
    status, body, headers = await api.call("POST", "/keys", {"name": "b"}, token=user["token"], headers=sent)
    assert status == 200 and body["key"] and "Idempotent-Replayed" not in headers


async def test_the_document_states_the_header_where_it_is_honoured(api, app):
    """One declaration: the Idempotency-Key header parameter (and the replay header, the 409) are documented on
    exactly the portal writes whose handler is @idempotent, and on every data endpoint; usage records have
    replay_of."""
    doc = (await api.call("GET", "/openapi.json"))[1]
    wrapped = {
        re.sub(r"\([^)]*\)", "{}", rule.matcher.regex.pattern.rstrip("$"))
        for rule in app.wildcard_router.rules
        if getattr(getattr(rule.target, "post", None), "idempotent", False)
    }
    declared = {re.sub(r"\{[^}]*\}", "{}", op.path) for op in OPERATIONS if op.idempotent}
    assert wrapped == declared and len(declared) == 6, (wrapped, declared)  # 4 portal creates, admin credit/debit
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            names = [p["name"] for p in op["parameters"] if p["in"] == "header"]
            marked = next((o.idempotent for o in OPERATIONS if (o.method, o.path) == (method, path)), None)
            # The tweet WebSocket (docs/streams.md) is not a data call: nothing to replay.
            data = path.startswith(("/social/", "/twitter/")) and not path.endswith("/tweet/websocket")
            expected = data or bool(marked)
            assert ("Idempotency-Key" in names) == expected, (method, path, names)
            if expected and "200" in op["responses"]:
                assert "Idempotent-Replayed" in op["responses"]["200"]["headers"]
                assert "409" in op["responses"]
    assert "replay_of" in doc["components"]["schemas"]["UsageRecord"]["properties"]


# --- rejected calls cost nothing; the standard rate-limit fields; Retry-After ------------------------------------
@pytest.mark.settings(plan_rules=({"name": "two", "min_paid_usd": 0, "qps": 2, "account_qps": 2},))
async def test_refused_calls_take_no_token(api, ctx):
    """Invariant: a client gets its rate of successful calls whatever it had refused. Twenty calls refused with
    422 (a bad parameter), 402 (a key whose budget cannot pay) and 422 (a reused key) first: the bucket of 2 is
    still full, the next two calls pass and the third is 429; RateLimit says what is left."""
    provider(ctx)
    user, key = await api.funded_key(10_000)
    broke = (await api.call("POST", "/keys", {"credit_limit": 1, "credit_limit_period": "day"}, token=user["token"]))[1]
    await api.call("GET", PATH, key=key["key"], headers={"Idempotency-Key": "used"})
    await asyncio.sleep(1.0)  # the bucket is full again
    refused = [
        ("/social/user/info", key["key"], {}),
        (PATH, broke["key"], {}),
        (PATH + "&x=1", key["key"], {"Idempotency-Key": "used"}),
    ]
    for path, secret, headers in refused * 7:
        status, _, answer = await api.call("GET", path, key=secret, headers=headers)
        assert status in (402, 422), status
        assert answer["RateLimit"] == '"key";r=2;t=0, "account";r=2;t=0', answer["RateLimit"]
        assert answer["RateLimit-Policy"] == '"key";q=2;w=1, "account";q=2;w=1'

    statuses = [(await api.call("GET", PATH, key=key["key"]))[0] for _ in range(3)]
    assert statuses == [200, 200, 429], statuses


async def test_every_429_and_503_says_when_to_retry(api, ctx):
    """Retry-After on every 429 and 503: a data call while draining, readiness while draining, a portal 503."""
    _, key = await api.funded_key(1_000)
    ctx.draining = True
    try:
        for path in (PATH, "/readyz"):
            status, _, headers = await api.call("GET", path, key=key["key"])
            assert status == 503 and int(headers["Retry-After"]) >= 1, path
    finally:
        ctx.draining = False
