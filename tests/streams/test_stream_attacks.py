"""Real time attacked the way a customer or an admin can (issue 39): a suspended account's rules and sockets,
a key's budget and its revocation binding its rules, the socket's headers, and a client cut for not reading."""

import asyncio
import contextlib
import time
import uuid

import orjson
import pytest
import tornado.httpclient
from support import Gateway, Receiver, SearchProvider, account_with_keys, ledger_of
from test_streams import LEAST, QUICK, next_tweet_event, rule_on, socket, stalled_socket

from storage import db as database
from storage.accounts import AccountStore
from streams.keys import another_budget

pytestmark = pytest.mark.gen_test(timeout=90)


@pytest.mark.settings(**QUICK)
async def test_the_socket_answers_carry_no_server_header(api, provider, base_url):
    """The 101, the 401 without a key and the refusal of a POST: none names Tornado and its version."""
    _, key = await api.funded_key(1000)
    ws = await socket(base_url, key["key"])
    assert "Server" not in ws.headers, ws.headers.get("Server")
    ws.close()
    with pytest.raises(tornado.httpclient.HTTPClientError) as refused:
        await socket(base_url, "")
    assert refused.value.code == 401 and "Server" not in refused.value.response.headers
    status, body, headers = await api.call("POST", "/twitter/tweet/websocket", {})
    assert status >= 400 and "Server" not in headers, headers.get("Server")
    assert body["status"] == "error"


# --- suspension ---------------------------------------------------------------------------------------------
async def _admin(gw: Gateway, mongo_uri: str, db_name: str) -> dict:
    """An admin's auth headers on `gw` (granted as the operator's `admin grant` does)."""
    email = f"admin-{uuid.uuid4().hex[:8]}@example.com"
    body = {"email": email, "password": "process test pass"}
    token = orjson.loads((await gw.call("POST", "/auth/register", body)).body)["token"]
    client = database.connect(mongo_uri)
    assert await AccountStore(client[db_name]).set_admin(email, True)
    await client.close()
    return {"Authorization": f"Bearer {token}"}


async def _holders(db, key_ids: list[int]) -> dict[int, str]:
    """Which process holds each key's socket (storage/streams.py take_socket)."""
    return {d["_id"]: d["holder"] async for d in db.stream_sockets.find({"_id": {"$in": key_ids}})}


async def _closed(ws, seconds: float = 10.0) -> int | None:
    """Reads until the gateway closes the socket; its close code."""
    deadline = time.monotonic() + seconds
    with contextlib.suppress(TimeoutError):
        while time.monotonic() < deadline:
            if await asyncio.wait_for(ws.read_message(), deadline - time.monotonic()) is None:
                return ws.close_code
    raise AssertionError("the socket stayed open")


async def _charged(mongo_uri: str, db_name: str, account_id: str) -> int:
    return sum(r["credits"] for r in (await ledger_of(mongo_uri, db_name, account_id))[1])


@pytest.mark.parametrize("workers", [1, 2])
async def test_a_suspended_account_polls_nothing_is_charged_nothing_and_keeps_no_socket(mongo, workers):
    """The attack (issue 39, 2): an admin suspends an account with a rule polling every 0.3 s and sockets open
    (with two workers, on both: the suspension is answered by one). Its data calls answered 403, but add_rule
    answered 200, a new socket opened and got tweets, the old ones stayed open and the rules went on polling:
    885 credits charged after the suspension. Now: no poll, no charge, every socket closed, `/oapi/` and a new
    socket 403; the resume restores the rule, which delivers again."""
    provider = SearchProvider()
    db_name = f"t_streams_{time.time_ns()}"
    env = dict(STREAM_MIN_INTERVAL="0.3", STREAM_TICK_SECONDS="0.05")
    gw = await Gateway(mongo.uri, provider.url, db_name, workers=workers, **env).launch()
    client = database.connect(mongo.uri)
    db = client[db_name]
    try:
        user, secrets, auth = await account_with_keys(gw, 10_000_000, 4)
        account_id = user["account_id"]
        keys = orjson.loads((await gw.call("GET", "/keys", **auth)).body)
        key_ids = {s: r["key_id"] for s, r in zip(secrets, sorted(keys, key=lambda r: r["key_id"]), strict=True)}
        sockets = {s: await socket(gw.url, s) for s in secrets[1:]}
        for ws in sockets.values():
            assert orjson.loads(await ws.read_message())["event_type"] == "connected"
        # With two workers: reconnect until the sockets are on both (the kernel hands connections out).
        for _ in range(40):
            holders = await _holders(db, list(key_ids.values()))
            if len(set(holders.values())) == workers:
                break
            moved = secrets[1 + _ % 3]
            sockets[moved].close()
            while key_ids[moved] in await _holders(db, [key_ids[moved]]):
                await asyncio.sleep(0.05)
            sockets[moved] = await socket(gw.url, moved)
            await sockets[moved].read_message()
        assert len(set((await _holders(db, list(key_ids.values()))).values())) == workers
        headers = {"X-API-Key": secrets[0]}
        body = {"tag": "t", "value": "hello", "interval_seconds": 0.3}
        rule_id = orjson.loads((await gw.call("POST", "/oapi/tweet_filter/add_rule", body, **headers)).body)["rule_id"]
        update = {**body, "rule_id": rule_id, "is_effect": 1}
        assert (await gw.call("POST", "/oapi/tweet_filter/update_rule", update, **headers)).code == 200
        provider.post()
        for ws in sockets.values():
            await next_tweet_event(ws)

        admin = await _admin(gw, mongo.uri, db_name)
        answer = await gw.call("POST", f"/admin/accounts/{account_id}/suspend", {"reason": "abuse"}, **admin)
        assert answer.code == 200, answer.body
        for ws in sockets.values():  # on both workers
            assert await _closed(ws) == 1008
        assert (await gw.call("POST", "/oapi/tweet_filter/add_rule", body, **headers)).code == 403
        assert (await gw.call("GET", "/oapi/tweet_filter/get_rules", **headers)).code == 403
        with pytest.raises(tornado.httpclient.HTTPClientError) as refused:
            await socket(gw.url, secrets[1])
        assert refused.value.code == 403
        rule = await db.stream_rules.find_one({"_id": rule_id})
        assert rule["status"] == "suspended"
        # The portal cannot switch a rule on meanwhile (a new one, or the suspended one), and writes nothing.
        portal = {"kind": "rule", "tag": "p", "value": "hello", "interval_seconds": 10}
        refused = await gw.call("POST", "/streams", portal, **auth)
        assert refused.code == 403 and "suspended" in orjson.loads(refused.body)["detail"], refused.body
        refused = await gw.call("PATCH", f"/streams/{rule_id}", {"active": True}, **auth)
        assert refused.code == 403, refused.body
        assert await db.stream_rules.count_documents({"account_id": account_id, "deleted": False}) == 1
        assert (await db.stream_rules.find_one({"_id": rule_id}))["status"] == "suspended"
        await asyncio.sleep(1.0)  # a poll under way when the suspension landed ends, and its record is stored
        charged, asked = await _charged(mongo.uri, db_name, account_id), len(provider.queries)
        provider.post()
        await asyncio.sleep(2.0)  # more than six intervals
        assert len(provider.queries) == asked, "polled while suspended"
        assert await _charged(mongo.uri, db_name, account_id) == charged, "charged while suspended"

        answer = await gw.call("POST", f"/admin/accounts/{account_id}/resume", {}, **admin)
        assert answer.code == 200, answer.body
        deadline = time.monotonic() + 10  # the resume reaches the other worker within a second (coherence)
        while (listed := await gw.call("GET", "/oapi/tweet_filter/get_rules", **headers)).code == 403:
            assert time.monotonic() < deadline, listed.body
            await asyncio.sleep(0.1)
        rules = orjson.loads(listed.body)["rules"]
        assert [(r["rule_id"], r["status"], r["is_effect"]) for r in rules] == [(rule_id, "active", 1)]
        while True:  # on a worker that has heard of the resume
            try:
                again = await socket(gw.url, secrets[0])
                break
            except tornado.httpclient.HTTPClientError as refused:
                assert refused.code == 403 and time.monotonic() < deadline
                await asyncio.sleep(0.1)
        await again.read_message()
        provider.post()
        await next_tweet_event(again)  # the rule delivers again (what came meanwhile, then the new tweet)
        again.close()
    finally:
        gw.stop()
        provider.stop()
        await client.drop_database(db_name)
        await client.close()


# --- a key's budget and its end bind its rules -------------------------------------------------------------
async def _rule_status(api, token: str, rule_id: str) -> str:
    _, rows, _ = await api.call("GET", "/streams", token=token)
    return next(r["status"] for r in rows if r["rule_id"] == rule_id)


async def _until_status(api, token: str, rule_id: str, status: str, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while (now := await _rule_status(api, token, rule_id)) != status:
        assert time.monotonic() < deadline, f"{rule_id} is still {now}, not {status}"
        await asyncio.sleep(0.05)


async def _used(api, token: str, key_id: int) -> int:
    _, rows, _ = await api.call("GET", "/keys", token=token)
    return next(r["credits_used"] for r in rows if r["key_id"] == key_id)


@pytest.mark.settings(**QUICK)
async def test_a_keys_budget_binds_its_rules_polls_which_pause_and_resume_with_an_alert(api, provider):
    """The attack (issue 39, 3): a key with `credit_limit: 100, total` got 402 on data calls once spent, yet its
    rule went on polling: `credits_used` 835 after 35 s. Now each poll spends from the budget; when the budget
    cannot pay, the rule pauses (`paused_budget`, with a `stream.paused` alert naming the key) and nothing more is
    polled or charged; raising the budget resumes it (`stream.resumed`) until the new limit."""
    user, _ = await api.funded_key(1_000_000)
    token = user["token"]
    receiver = Receiver()
    _, endpoint, _ = await api.call("POST", "/webhooks", {"url": receiver.url}, token=token)
    receiver.secret = endpoint["secret"]
    budget = {"name": "ci", "credit_limit": 100, "credit_limit_period": "total"}
    status, key, _ = await api.call("POST", "/keys", budget, token=token)
    assert status == 200, key
    rule_id = await rule_on(api, key["key"], interval=0.3)  # 15 credits a poll: six fit in 100
    await _until_status(api, token, rule_id, "paused_budget")
    _, rows, _ = await api.call("GET", "/streams", token=token)
    assert next(r["is_effect"] for r in rows if r["rule_id"] == rule_id) == 1
    hook = (await receiver.until(1))[0]
    assert hook["type"] == "stream.paused" and hook["data"]["reason"] == "key_budget", hook
    assert hook["data"]["key_id"] == key["key_id"] and "budget" in hook["data"]["summary"]
    used, asked = await _used(api, token, key["key_id"]), len(provider.queries)
    assert 6 * LEAST <= used <= 100
    await asyncio.sleep(1.0)  # three intervals
    assert len(provider.queries) == asked and await _used(api, token, key["key_id"]) == used
    status, _, _ = await api.call("GET", "/social/user/info?userName=x", key=key["key"])
    assert status == 402  # the data calls agree

    status, body, _ = await api.call("PATCH", f"/keys/{key['key_id']}", {"credit_limit": 200}, token=token)
    assert status == 200, body
    hooks = await receiver.until(2)
    assert hooks[1]["type"] == "stream.resumed" and hooks[1]["data"]["key_id"] == key["key_id"], hooks
    await _until_status(api, token, rule_id, "paused_budget")  # polled again, up to the raised limit
    assert 100 < await _used(api, token, key["key_id"]) <= 200
    assert [h["type"] for h in await receiver.until(3)] == ["stream.paused", "stream.resumed", "stream.paused"]
    receiver.stop()


@pytest.mark.settings(**QUICK)
async def test_a_revoked_keys_rules_stop_and_a_rolled_keys_go_on_with_the_new_key(api, provider):
    """The attack (issue 39, 3): after its key was revoked, a rule stayed active and charged 510 more credits in
    25 s. Now a revoked key's rules are switched off and charge nothing; a key rolled (its old secret ended at
    once) does not take its rules down: they go on with the new key."""
    user, key = await api.funded_key(1_000_000)
    token = user["token"]
    rule_id = await rule_on(api, key["key"], interval=0.3)
    while len(provider.queries) < 2:
        await asyncio.sleep(0.05)
    status, rolled, _ = await api.call("POST", f"/keys/{key['key_id']}/roll", {"grace_seconds": 0}, token=token)
    assert status == 200, rolled
    asked = len(provider.queries)
    while len(provider.queries) < asked + 3:  # still polled, now as the new key
        await asyncio.sleep(0.05)
    assert await _rule_status(api, token, rule_id) == "active"
    assert await _used(api, token, rolled["key_id"]) > 0

    status, _, _ = await api.call("POST", f"/keys/{rolled['key_id']}/revoke", token=token)
    assert status == 200
    await _until_status(api, token, rule_id, "inactive")
    _, rows, _ = await api.call("GET", "/streams", token=token)
    assert next(r["is_effect"] for r in rows if r["rule_id"] == rule_id) == 0
    await asyncio.sleep(0.5)  # a poll under way at the revocation ends
    asked, credits = len(provider.queries), (await api.call("GET", "/account", token=token))[1]["credits"]
    await asyncio.sleep(1.0)  # three intervals
    assert len(provider.queries) == asked, "polled with a revoked key"
    assert (await api.call("GET", "/account", token=token))[1]["credits"] == credits, "charged after revocation"


# --- a client cut for not reading ------------------------------------------------------------------------------
def _frames(data: bytes) -> tuple[int, int | None]:
    """Reads a server's bytes after the handshake: (bytes of frames before the close frame, the close code, or
    None when no close frame came)."""
    at = data.index(b"\r\n\r\n") + 4
    start = at
    while at + 2 <= len(data):
        opcode, size, head = data[at] & 0x0F, data[at + 1] & 0x7F, 2
        if size == 126:
            size, head = int.from_bytes(data[at + 2 : at + 4]), 4
        elif size == 127:
            size, head = int.from_bytes(data[at + 2 : at + 10]), 10
        if at + head + size > len(data):
            break
        if opcode == 0x8:
            return at - start, int.from_bytes(data[at + head : at + head + 2])
        at += head + size
    return at - start, None


@pytest.mark.settings(**QUICK)
async def test_a_client_cut_for_not_reading_sees_the_1013_close_after_little_more(api, ctx, provider, base_url):
    """The attack (issue 39, 11): a client that stops reading is cut with 1013, but the close frame was queued
    behind the whole unread backlog (16 MB): reading again, the client got megabytes of old events first, and
    nothing at all once the gateway gave up waiting for its answer. Now the backlog not handed to the connection
    is dropped: the close comes after at most what the connection already held."""
    user, key = await api.funded_key(100_000_000)
    stalled = stalled_socket(base_url, key["key"])
    while ctx.hub.count() < 1:
        await asyncio.sleep(0.05)
    (held,) = ctx.hub.sockets[user["account_id"]]
    await rule_on(api, key["key"])
    deadline = time.monotonic() + 60
    while held.ws_connection is not None and not held.ws_connection.is_closing():  # 1 MB events until cut
        assert time.monotonic() < deadline, "the client that reads nothing was not cut"
        for _ in range(20):
            provider.post(text="x" * 50_000)
        await asyncio.sleep(0.35)
    stalled.setblocking(False)
    received = bytearray()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # the client reads again, as fast as it can, until the close or the end
        try:
            chunk = stalled.recv(1 << 20)
        except BlockingIOError:
            await asyncio.sleep(0.01)
            continue
        if not chunk:
            break
        received += chunk
        if _frames(bytes(received))[1] is not None:
            break
    stalled.close()
    before, code = _frames(bytes(received))
    assert code == 1013, f"no close frame in {len(received):,} bytes"
    # What the kernel's buffers held, WINDOW and a frame: a few MB at most, not the 16 MB backlog.
    assert before < 6_000_000, f"the close came behind {before:,} bytes of the backlog"


async def test_with_two_workers_a_budget_and_a_revocation_stop_whichever_worker_polls(mongo):
    """`--workers 2`: a rule of a key with 100 credits in total pauses for its budget having spent no more
    than it (both workers claim its polls and spend from one budget), and a revoked key's rule stops on both."""
    provider = SearchProvider()
    db_name = f"t_streams_{time.time_ns()}"
    env = dict(STREAM_MIN_INTERVAL="0.3", STREAM_TICK_SECONDS="0.05", STREAM_BALANCE_CHECK_SECONDS="0.2")
    gw = await Gateway(mongo.uri, provider.url, db_name, workers=2, **env).launch()

    async def status_of(rule_id: str) -> str:
        rows = orjson.loads((await gw.call("GET", "/streams", **auth)).body)
        return next(r["status"] for r in rows if r["rule_id"] == rule_id)

    async def until(rule_id: str, status: str) -> None:
        deadline = time.monotonic() + 20
        while (now := await status_of(rule_id)) != status:
            assert time.monotonic() < deadline, f"{rule_id} is still {now}, not {status}"
            await asyncio.sleep(0.05)

    async def rule(secret: str, value: str) -> str:
        body = {"tag": value, "value": value, "interval_seconds": 0.3}
        answer = await gw.call("POST", "/oapi/tweet_filter/add_rule", body, **{"X-API-Key": secret})
        rule_id = orjson.loads(answer.body)["rule_id"]
        update = {**body, "rule_id": rule_id, "is_effect": 1}
        assert (await gw.call("POST", "/oapi/tweet_filter/update_rule", update, **{"X-API-Key": secret})).code == 200
        return rule_id

    try:
        user, (plain,), auth = await account_with_keys(gw, 10_000_000, 1)
        budget = {"name": "ci", "credit_limit": 100, "credit_limit_period": "total"}
        limited = orjson.loads((await gw.call("POST", "/keys", budget, **auth)).body)
        plain_id = next(
            r["key_id"] for r in orjson.loads((await gw.call("GET", "/keys", **auth)).body) if r["name"] == "k0"
        )
        paused, stopped = await rule(limited["key"], "budget"), await rule(plain, "revoked")
        await until(paused, "paused_budget")
        while sum(1 for q in provider.queries if q.startswith("revoked")) < 3:
            await asyncio.sleep(0.05)
        assert (await gw.call("POST", f"/keys/{plain_id}/revoke", {}, **auth)).code == 200
        await until(stopped, "inactive")
        await asyncio.sleep(1.0)  # polls under way end, records are stored
        asked = len(provider.queries)
        charged = await _charged(mongo.uri, db_name, user["account_id"])
        await asyncio.sleep(1.5)  # five intervals
        assert len(provider.queries) == asked, "polled past its budget or with a revoked key"
        assert await _charged(mongo.uri, db_name, user["account_id"]) == charged
        rows = {r["key_id"]: r for r in orjson.loads((await gw.call("GET", "/keys", **auth)).body)}
        assert rows[limited["key_id"]]["credits_used"] <= 100
    finally:
        gw.stop()
        provider.stop()
        client = database.connect(mongo.uri)
        await client.drop_database(db_name)
        await client.close()


@pytest.mark.parametrize(
    ("now", "resumes"),
    [
        ({"limit": 100, "period": "2026-11-27", "epoch": 0}, False),  # the same budget, still spent
        ({"limit": 100, "period": "2026-11-28", "epoch": 0}, True),  # the next day of a daily budget
        ({"limit": 200, "period": "2026-11-27", "epoch": 0}, True),  # raised
        ({"limit": 50, "period": "2026-11-27", "epoch": 0}, False),  # lowered: it would pause again at once
        ({"limit": 100, "period": "2026-11-27", "epoch": 7}, True),  # started again (PATCH)
        (None, True),  # removed: the rules spend from the balance alone
    ],
)
def test_rules_paused_for_a_budget_resume_only_with_another_budget(now, resumes):
    assert another_budget(now, {"limit": 100, "period": "2026-11-27", "epoch": 0}) is resumes
