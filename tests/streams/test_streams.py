"""Real time (docs/streams.md): the provider's rule and monitor calls, polls against a scripted provider (a real
HTTP server answering what the test decides), each new tweet once to the socket and the webhook, what polls are
charged, the balance pause, one socket per key, revocation, reconnect resume, and exactly once across processes."""

import asyncio
import contextlib
import re
import socket as pysocket
import time
import urllib.parse
from datetime import UTC, datetime, timedelta

import orjson
import pytest
import tornado.httpclient
import tornado.httpserver
import tornado.testing
import tornado.web
import tornado.websocket
from pymongo.errors import AutoReconnect
from support import FAST, Gateway, Receiver, SearchProvider, account_with_keys, ledger_of
from tornado.httpclient import HTTPRequest

from accounting import journal
from accounting.journal import Journal
from storage import db as database
from streams.poller import Poller

pytestmark = pytest.mark.gen_test(timeout=60)
QUICK = dict(
    stream_min_interval=0.3,
    stream_tick_seconds=0.05,
    stream_balance_check_seconds=0.2,
    webhook_poll_seconds=0.2,
    plan_rules=FAST,
)
LEAST = 15  # advanced_search: the per-call minimum (metering/pricing.py)


async def rule_on(api, key: str, value: str = "hello", interval: float = 0.3) -> str:
    status, body, _ = await api.call(
        "POST", "/oapi/tweet_filter/add_rule", {"tag": "t1", "value": value, "interval_seconds": interval}, key=key
    )
    assert status == 200 and body["status"] == "success", body
    rule_id = body["rule_id"]
    update = {"rule_id": rule_id, "tag": "t1", "value": value, "interval_seconds": interval, "is_effect": 1}
    status, body, _ = await api.call("POST", "/oapi/tweet_filter/update_rule", update, key=key)
    assert status == 200, body
    return rule_id


async def socket(base_url: str, key: str, query: str = "", path: str = "/twitter/tweet/websocket"):
    url = base_url.replace("http", "ws", 1) + path + query
    return await tornado.websocket.websocket_connect(HTTPRequest(url, headers={"X-API-Key": key}))


async def quiet_rule_and_socket(api, base_url: str):
    """A funded account's socket (past its `connected`) and a rule at 1 s that has polled once, finding nothing."""
    _, key = await api.funded_key(1_000_000)
    ws = await socket(base_url, key["key"])
    await ws.read_message()
    await rule_on(api, key["key"], interval=1.0)
    await asyncio.sleep(1.5)
    return ws


async def next_tweet_event(ws, seconds: float = 10.0) -> dict:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        text = await asyncio.wait_for(ws.read_message(), deadline - time.monotonic())
        assert text is not None, "the socket closed"
        event = orjson.loads(text)
        if event["event_type"] == "tweet":
            return event
    raise AssertionError("no tweet event")


@pytest.mark.settings(**QUICK)
async def test_the_provider_calls_keep_its_shapes_and_refuse_bad_input(api, provider):
    user, key = await api.funded_key(1_000_000)
    k = key["key"]
    status, body, _ = await api.call(
        "POST", "/oapi/tweet_filter/add_rule", {"tag": "btc", "value": "bitcoin lang:en", "interval_seconds": 60}, key=k
    )
    assert status == 200 and body["status"] == "success" and body["rule_id"].startswith("fr_")
    rule_id = body["rule_id"]
    _, rules, _ = await api.call("GET", "/oapi/tweet_filter/get_rules", key=k)
    row = rules["rules"][0]
    # Inactive until update_rule sets is_effect 1 (the provider's contract); the cost at 60 s: 1,440 polls.
    assert (row["rule_id"], row["is_effect"], row["status"]) == (rule_id, 0, "inactive")
    assert row["polls_per_day"] == 1440 and row["cost_per_day_credits"] == 1440 * LEAST
    # update_rule needs every field; an interval under STREAM_MIN_INTERVAL is refused; both 422 in the usual shape.
    status, body, _ = await api.call("POST", "/oapi/tweet_filter/update_rule", {"rule_id": rule_id}, key=k)
    assert status == 422 and {tuple(e["loc"]) for e in body["detail"]} >= {("body", "is_effect"), ("body", "tag")}
    bad = {"tag": "x", "value": "y", "interval_seconds": 0.1}
    status, body, _ = await api.call("POST", "/oapi/tweet_filter/add_rule", bad, key=k)
    assert status == 422 and body["detail"][0]["loc"] == ["body", "interval_seconds"]
    # No key, a bad key: 401 in the provider's error shape.
    status, body, _ = await api.call("GET", "/oapi/tweet_filter/get_rules")
    assert status == 401 and body["status"] == "error" and "X-API-Key" in body["msg"]
    # Another account cannot see, change or delete the rule.
    _, other = await api.funded_key(1000)
    status, body, _ = await api.call("POST", "/oapi/tweet_filter/delete_rule", {"rule_id": rule_id}, key=other["key"])
    assert status == 404 and body["status"] == "error"
    assert (await api.call("GET", "/oapi/tweet_filter/get_rules", key=other["key"]))[1]["rules"] == []
    # A key scoped to other endpoints may not run rules (their polls call advanced_search).
    status, scoped, _ = await api.call(
        "POST", "/keys", {"name": "scoped", "allowed_endpoints": ["/user/info"]}, token=user["token"]
    )
    status, body, _ = await api.call("GET", "/oapi/tweet_filter/get_rules", key=scoped["key"])
    assert status == 403
    # Monitors: added once (a repeat is the same monitor), removed by handle; an unknown one is 404.
    monitor = {"x_user_name": "@Alice"}
    first = (await api.call("POST", "/oapi/x_user_stream/add_user_to_monitor_tweet", monitor, key=k))[1]
    again = (await api.call("POST", "/oapi/x_user_stream/add_user_to_monitor_tweet", {"x_user_name": "alice"}, key=k))[
        1
    ]
    assert first["status"] == "success" and first["id_for_user"] == again["id_for_user"]
    status, body, _ = await api.call(
        "POST", "/oapi/x_user_stream/add_user_to_monitor_tweet", {"x_user_name": "not a handle!"}, key=k
    )
    assert status == 422
    remove = "/oapi/x_user_stream/remove_user_to_monitor_tweet"
    assert (await api.call("POST", remove, {"x_user_name": "alice"}, key=k))[0] == 200
    assert (await api.call("POST", remove, {"x_user_name": "alice"}, key=k))[0] == 404
    status, body, _ = await api.call("POST", "/oapi/tweet_filter/delete_rule", {"rule_id": rule_id}, key=k)
    assert status == 200 and (await api.call("GET", "/oapi/tweet_filter/get_rules", key=k))[1]["rules"] == []


# The provider's request lines for its /oapi/ calls (its docs: docs/endpoints/*.md of the mirror), verbatim:
# method, path, and the body exactly as its curl examples send it, the placeholders filled in by provider_call.
PROVIDER_CALLS = {
    "add_rule": (
        "POST",
        "/oapi/tweet_filter/add_rule",
        '\n{\n  "tag": "<string>",\n  "value": "<string>",\n  "interval_seconds": 123\n}\n',
    ),
    "update_rule": (
        "POST",
        "/oapi/tweet_filter/update_rule",
        '\n{\n  "rule_id": "<string>",\n  "tag": "<string>",\n  "value": "<string>",\n  "interval_seconds": 123,\n'
        '  "is_effect": 0\n}\n',
    ),
    "get_rules": ("GET", "/oapi/tweet_filter/get_rules", None),
    "my_info": ("GET", "/oapi/my/info", None),
    "delete_rule": ("DELETE", "/oapi/tweet_filter/delete_rule", '\n{\n  "rule_id": "<string>"\n}\n'),
    "add_user": ("POST", "/oapi/x_user_stream/add_user_to_monitor_tweet", '\n{\n  "x_user_name": "<string>"\n}\n'),
    "remove_user": (
        "POST",
        "/oapi/x_user_stream/remove_user_to_monitor_tweet",
        '\n{\n  "id_for_user": "<string>"\n}\n',
    ),
}


def stalled_socket(base_url: str, secret: str) -> pysocket.socket:
    """A WebSocket client that opens the socket and then reads nothing (a small receive buffer, so the
    gateway's writes back up at once)."""
    stalled = pysocket.socket()
    stalled.setsockopt(pysocket.SOL_SOCKET, pysocket.SO_RCVBUF, 4096)
    stalled.connect(("127.0.0.1", int(base_url.rsplit(":", 1)[1])))
    stalled.sendall(
        b"GET /twitter/tweet/websocket HTTP/1.1\r\nHost: gw\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        b"X-API-Key: " + secret.encode() + b"\r\n\r\n"
    )
    return stalled


async def provider_call(base_url: str, key: str, name: str, **values) -> tuple[int, dict]:
    """One of the provider's documented calls as its curl example makes it (a body on DELETE included); `values`
    replace the example's placeholders field by field, the rest stay as documented."""
    method, path, body = PROVIDER_CALLS[name]
    headers = {"X-API-Key": key}
    if body is not None:
        headers["Content-Type"] = "application/json"
        for field, value in values.items():
            body = re.sub(
                rf'("{field}": )("<string>"|\d+)', lambda m, v=value: m.group(1) + orjson.dumps(v).decode(), body
            )
    request = HTTPRequest(base_url + path, method=method, headers=headers, body=body, allow_nonstandard_methods=True)
    response = await tornado.httpclient.AsyncHTTPClient().fetch(request, raise_error=False)
    return response.code, orjson.loads(response.body)


@pytest.mark.settings(**QUICK)
async def test_the_provider_documented_request_lines_work_as_documented(api, provider, base_url):
    """Each /oapi/ call as the provider documents it: DELETE delete_rule removes the rule (it answered 405 and
    the rule kept polling), get_rules shows interval_seconds as the integer it documents, and the monitor is
    removed by the id_for_user its add answered."""
    user, key = await api.funded_key(1_000_000)
    k = key["key"]
    status, added = await provider_call(base_url, k, "add_rule", tag="btc", value="bitcoin")
    assert status == 200 and added["status"] == "success", added
    rule_id = added["rule_id"]
    status, body = await provider_call(
        base_url, k, "update_rule", rule_id=rule_id, tag="btc", value="bitcoin", is_effect=1
    )
    assert status == 200 and body["status"] == "success", body
    status, listed = await provider_call(base_url, k, "get_rules")
    interval = listed["rules"][0]["interval_seconds"]
    assert status == 200 and interval == 123 and type(interval) is int, listed
    assert listed["rules"][0]["is_effect"] == 1
    status, body = await provider_call(base_url, k, "delete_rule", rule_id=rule_id)
    assert (status, body["status"]) == (200, "success"), body
    assert (await provider_call(base_url, k, "get_rules"))[1]["rules"] == []
    status, body = await provider_call(base_url, k, "delete_rule", rule_id=rule_id)
    assert (status, body["status"]) == (404, "error")
    # POST, which these docs offered first, still deletes.
    rule_id = (await provider_call(base_url, k, "add_rule", tag="t", value="v"))[1]["rule_id"]
    status, _, _ = await api.call("POST", "/oapi/tweet_filter/delete_rule", {"rule_id": rule_id}, key=k)
    assert status == 200 and (await provider_call(base_url, k, "get_rules"))[1]["rules"] == []

    status, monitor = await provider_call(base_url, k, "add_user", x_user_name="alice")
    assert status == 200 and monitor["id_for_user"], monitor
    remove = "/oapi/x_user_stream/remove_user_to_monitor_tweet"
    # A rule's id is not a monitor's.
    rule_id = (await provider_call(base_url, k, "add_rule", tag="t", value="v"))[1]["rule_id"]
    assert (await api.call("POST", remove, {"id_for_user": rule_id}, key=k))[0] == 404
    status, body = await provider_call(base_url, k, "remove_user", id_for_user=monitor["id_for_user"])
    assert (status, body["status"]) == (200, "success"), body
    rows = (await api.call("GET", "/streams", token=user["token"]))[1]
    assert [r["kind"] for r in rows] == ["rule"]
    status, body = await provider_call(base_url, k, "remove_user", id_for_user=monitor["id_for_user"])
    assert (status, body["status"]) == (404, "error")


async def test_the_provider_s_balance_call_answers_the_account_s_balance(api, base_url):
    """`GET /oapi/my/info` as the provider documents it (it answered 404): `{"recharge_credits"}`, the account's
    one balance, for any of its keys (one limited to other endpoints too); an unknown key is 401."""
    user, key = await api.funded_key(123_456)
    assert await provider_call(base_url, key["key"], "my_info") == (200, {"recharge_credits": 123_456})
    _, limited, _ = await api.call(
        "POST", "/keys", {"name": "one endpoint", "allowed_endpoints": ["/user/info"]}, token=user["token"]
    )
    assert await provider_call(base_url, limited["key"], "my_info") == (200, {"recharge_credits": 123_456})
    status, body = await provider_call(base_url, "sk_unknown", "my_info")
    assert (status, body["status"]) == (401, "error")


@pytest.mark.settings(**QUICK)
async def test_each_new_tweet_reaches_the_socket_and_the_webhook_once_and_polls_are_charged(
    api, ctx, provider, base_url
):
    user, key = await api.funded_key(1_000_000)
    receiver = Receiver()
    _, endpoint, _ = await api.call("POST", "/webhooks", {"url": receiver.url}, token=user["token"])
    receiver.secret = endpoint["secret"]
    provider.post(text="before the rule")  # older than the rule: never delivered
    await asyncio.sleep(1.1)  # since_time: has second resolution
    ws = await socket(base_url, key["key"])
    connected = orjson.loads(await ws.read_message())
    assert connected["event_type"] == "connected" and isinstance(connected["timestamp"], int)
    rule_id = await rule_on(api, key["key"])
    first = provider.post(text="one")
    event = await next_tweet_event(ws)
    assert event["rule_id"] == rule_id and event["rule_tag"] == "t1" and event["event_id"]
    assert [t["id"] for t in event["tweets"]] == [first]
    second, third = provider.post(text="two"), provider.post(text="three")
    event2 = await next_tweet_event(ws)
    assert sorted(t["id"] for t in event2["tweets"]) == sorted([second, third])
    await asyncio.sleep(1.0)  # quiet polls
    hooks = await receiver.until(2)
    assert [t["id"] for h in hooks for t in h["data"]["tweets"]] == [first, third, second]
    assert all(h["type"] == "tweet" and h["data"]["rule_id"] == rule_id for h in hooks)
    # The customer's API key never travels to the receiver.
    assert not any(key["key"] in str(headers) for _, headers in receiver.raw)
    # After the first delivery every poll asks only for what is new.
    assert any(f"since_id:{third}" in q for q in provider.queries)
    spent = ctx.meter.ledger.purses[user["account_id"]].spent
    records: list = []
    for _ in range(40):  # the usage flush runs in the background
        await ctx.meter.flush()
        records = [r for r in await ctx.usage.records({"account_id": user["account_id"]}) if r.get("stream_id")]
        if sum(r["credits"] for r in records) >= spent:
            break
        await asyncio.sleep(0.05)
    assert records and all(r["stream_id"] == rule_id for r in records)
    assert all(r["endpoint"] == "/social/tweet/advanced_search" for r in records)
    charged = sorted({r["credits"] for r in records})
    assert charged[0] == LEAST  # a quiet poll: the per-call minimum
    assert sum(r["credits"] for r in records) == spent  # every charge has its record
    _, rows, _ = await api.call("GET", f"/streams/{rule_id}/events", token=user["token"])
    assert [r["event_id"] for r in rows] == [event2["event_id"], event["event_id"]]
    # Alerts stay readable: the tweets are listed per rule, not among what fired.
    _, fired, _ = await api.call("GET", "/alerts/events", token=user["token"])
    assert not [e for e in fired if e["type"] == "tweet"]
    # Operators see how late polls start and how long an event takes to reach this process's sockets.
    metrics = (await tornado.httpclient.AsyncHTTPClient().fetch(base_url + "/metrics")).body.decode()
    count = lambda name: float(re.search(name + r'_count\{[^}]*kind="rule"[^}]*\} (\S+)', metrics)[1])
    assert count("gateway_stream_poll_late_seconds") >= len({r["request_id"] for r in records}), metrics
    assert count("gateway_stream_fanout_seconds") == 2, metrics  # two events, each to the one socket
    ws.close()
    receiver.stop()


@pytest.mark.settings(**QUICK)
async def test_one_socket_per_key_revocation_closes_it_and_a_reconnect_resumes(api, ctx, provider, base_url):
    user, key = await api.funded_key(1_000_000)
    k = key["key"]
    for bad, query, status in (("sk_not-a-key", "", 401), (k, "?since_timestamp=yesterday", 422)):
        with pytest.raises(tornado.httpclient.HTTPClientError) as refused:
            await socket(base_url, bad, query)
        assert refused.value.code == status
    ws = await socket(base_url, k)
    await ws.read_message()  # connected
    second = await socket(base_url, k, path="/social/tweet/websocket")
    assert await second.read_message() is None and second.close_code == 1008
    await rule_on(api, k)
    provider.post(text="a")
    seen = await next_tweet_event(ws)
    ws.close()
    await asyncio.sleep(0.3)
    missed = [provider.post(text="b")]
    await asyncio.sleep(1.0)  # polled while nobody listened
    missed.append(provider.post(text="c"))
    again = await socket(base_url, k, "?since_event_id=" + urllib.parse.quote(seen["event_id"]))
    assert orjson.loads(await again.read_message())["event_type"] == "connected"
    got: list[str] = []
    while len(got) < 2:
        got += [t["id"] for t in (await next_tweet_event(again))["tweets"]]
    assert sorted(got) == sorted(missed)  # each missed tweet once, nothing from before the id
    started = time.monotonic()
    assert (await api.call("POST", f"/keys/{key['key_id']}/revoke", token=user["token"]))[0] == 200
    while await again.read_message() is not None:
        pass
    assert again.close_code == 1008 and time.monotonic() - started < 1.5


@pytest.mark.settings(**QUICK)
async def test_a_rule_pauses_when_the_balance_cannot_pay_its_next_hour_and_resumes_after_a_top_up(api, ctx, provider):
    user, key = await api.funded_key(1_000_000)
    receiver = Receiver()
    _, endpoint, _ = await api.call("POST", "/webhooks", {"url": receiver.url}, token=user["token"])
    receiver.secret = endpoint["secret"]
    await rule_on(api, key["key"], interval=1.0)  # 3,600 polls an hour: 54,000 credits at the least
    status, rows, _ = await api.call("GET", "/streams", token=user["token"])
    assert rows[0]["status"] == "active"
    await ctx.meter.add_credits(user["account_id"], -1_000_000 + 50_000)
    ctx.poller.touched.add(user["account_id"])
    await ctx.poller.check_balances()
    _, rows, _ = await api.call("GET", "/streams", token=user["token"])
    assert rows[0]["status"] == "paused_balance" and rows[0]["is_effect"] == 1
    hooks = await receiver.until(1)
    assert hooks[0]["type"] == "stream.paused" and "top-up" in hooks[0]["data"]["summary"]
    polls = len(provider.queries)
    await asyncio.sleep(0.6)
    assert len(provider.queries) == polls  # paused: not polled
    status, body, _ = await api.call("POST", f"/keys/{key['key_id']}/topup", {"credits": 100_000}, token=user["token"])
    assert status == 200, body
    await ctx.poller.check_balances()
    _, rows, _ = await api.call("GET", "/streams", token=user["token"])
    assert rows[0]["status"] == "active"
    assert [h["type"] for h in await receiver.until(2)] == ["stream.paused", "stream.resumed"]
    receiver.stop()


@pytest.mark.settings(**QUICK)
async def test_the_portal_creates_pauses_and_deletes_rules_with_their_cost(api, provider):
    user, _ = await api.funded_key(1_000_000)
    token = user["token"]
    status, row, _ = await api.call(
        "POST", "/streams", {"kind": "rule", "tag": "eth", "value": "ethereum", "interval_seconds": 86.4}, token=token
    )
    assert status == 200 and row["status"] == "active" and row["cost_per_day_credits"] == 1000 * LEAST
    status, body, _ = await api.call("POST", "/streams", {"kind": "monitor"}, token=token)
    assert status == 422 and body["detail"][0]["loc"] == ["body", "x_user_name"]
    status, monitor, _ = await api.call(
        "POST", "/streams", {"kind": "monitor", "x_user_name": "bob", "interval_seconds": 60}, token=token
    )
    assert status == 200 and monitor["tag"] == "@bob"
    status, row, _ = await api.call("PATCH", f"/streams/{row['rule_id']}", {"active": False}, token=token)
    assert status == 200 and row["status"] == "inactive" and row["is_effect"] == 0
    assert (await api.call("DELETE", f"/streams/{row['rule_id']}", token=token))[0] == 200
    assert (await api.call("DELETE", f"/streams/{row['rule_id']}", token=token))[0] == 404
    other = await api.register()
    assert (await api.call("PATCH", f"/streams/{monitor['rule_id']}", {"active": False}, token=other["token"]))[
        0
    ] == 404
    _, rows, _ = await api.call("GET", "/streams", token=token)
    assert [r["rule_id"] for r in rows] == [monitor["rule_id"]]


async def test_two_workers_deliver_every_tweet_exactly_once_and_never_poll_a_rule_twice(mongo):
    """`--workers 2` for a few seconds: several rules polled every 0.3 s by whichever worker claims them,
    tweets arriving all along; every tweet is in exactly one event per rule, and each rule's polls ask for
    strictly newer tweets each time (no poll of a rule repeated)."""
    provider = SearchProvider()
    db_name = f"t_streams_{time.time_ns()}"
    gw = await Gateway(
        mongo.uri,
        provider.url,
        db_name,
        workers=2,
        STREAM_MIN_INTERVAL="0.3",
        STREAM_TICK_SECONDS="0.05",
    ).launch()
    received: list[list[tuple[str, str]]] = [[], [], []]  # per socket: (rule id, tweet id), as they came

    async def listen(ws, into: list) -> None:
        while (text := await ws.read_message()) is not None:
            event = orjson.loads(text)
            if event["event_type"] == "tweet":
                into += [(event["rule_id"], t["id"]) for t in event["tweets"]]

    try:
        _, secrets, _ = await account_with_keys(gw, 10_000_000, 4)
        # Three sockets (one per key): whichever worker each lands on, it gets what both workers poll.
        sockets = [await socket(gw.url, k) for k in secrets[1:]]
        listening = [asyncio.create_task(listen(ws, got)) for ws, got in zip(sockets, received, strict=True)]
        rules = []
        for n in range(4):
            response = await gw.call(
                "POST",
                "/oapi/tweet_filter/add_rule",
                {"tag": f"r{n}", "value": f"x{n}", "interval_seconds": 0.3},
                **{"X-API-Key": secrets[0]},
            )
            rule_id = orjson.loads(response.body)["rule_id"]
            update = {"rule_id": rule_id, "tag": f"r{n}", "value": f"x{n}", "interval_seconds": 0.3, "is_effect": 1}
            await gw.call("POST", "/oapi/tweet_filter/update_rule", update, **{"X-API-Key": secrets[0]})
            rules.append(rule_id)
        await asyncio.sleep(1.2)
        posted = []
        for _ in range(30):  # 3 s of tweets
            posted.append(provider.post())
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.5)  # the last polls
        for ws in sockets:
            ws.close()
        await asyncio.gather(*listening)
    finally:
        gw.stop()
        provider.stop()
    client = database.connect(mongo.uri)
    events = await client[db_name].stream_events.find({}).to_list(None)
    seqs = {r["_id"]: r["poll_seq"] for r in await client[db_name].stream_rules.find({}).to_list(None)}
    await client.drop_database(db_name)
    await client.close()
    for rule_id in rules:
        delivered = [t["id"] for e in events if e["rule_id"] == rule_id for t in e["tweets"]]
        assert sorted(delivered) == sorted(posted), f"{rule_id}: missing or doubled tweets"
    for got in received:  # each socket: every (rule, tweet) once
        assert sorted(got) == sorted((r, t) for r in rules for t in posted)
    for n, rule_id in enumerate(rules):
        # One provider call per poll: a poll done twice (two workers, one interval) would be a call more than
        # the rule's poll count; at most one more may have been under way when the gateway stopped.
        # Switching the rule on started its cursor over, which takes one poll_seq of its own.
        calls, polls = sum(1 for q in provider.queries if q.split()[0] == f"x{n}"), seqs[rule_id] - 1
        assert polls >= 8 and calls - polls in (0, 1), (rule_id, calls, polls)


@pytest.mark.settings(**QUICK)
async def test_on_the_moving_sandbox_a_rule_and_a_monitor_deliver_live_posts(api, catalog, base_url):
    """End to end on the sandbox (no scripted provider): a `lang:en` rule and a monitor of a catalog user who
    posts every few seconds each receive new posts, newer than when they were switched on, none twice."""
    user, key = await api.funded_key(1_000_000)
    k = key["key"]
    ws = await socket(base_url, k)
    await ws.read_message()  # connected
    switched_on = time.time()
    rule_id = await rule_on(api, k, value="lang:en", interval=0.5)
    handle = catalog["users"][0]["userName"]
    status, added, _ = await api.call(
        "POST", "/streams", {"kind": "monitor", "x_user_name": handle, "interval_seconds": 0.5}, token=user["token"]
    )
    assert status == 200, added
    by_rule: dict[str, list[dict]] = {}
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not (by_rule.get(rule_id) and by_rule.get(added["rule_id"])):
        event = await next_tweet_event(ws, deadline - time.monotonic())
        by_rule.setdefault(event["rule_id"], []).extend(event["tweets"])
    ws.close()
    assert by_rule.get(rule_id) and by_rule.get(added["rule_id"]), by_rule.keys()
    for tweets in by_rule.values():
        ids = [t["id"] for t in tweets]
        assert len(ids) == len(set(ids))
    assert all(t["author"]["userName"].lower() == handle.lower() for t in by_rule[added["rule_id"]])
    assert all(t.get("lang") in (None, "en") for t in by_rule[rule_id])
    for tweets in by_rule.values():  # nothing from before the rule was switched on (since_time: has seconds)
        created = [datetime.strptime(t["createdAt"], "%a %b %d %H:%M:%S %z %Y").timestamp() for t in tweets]
        assert min(created) >= int(switched_on) - 1


@pytest.mark.settings(**QUICK)
async def test_a_poll_left_half_done_by_a_dead_process_is_finished_once_by_another(api, ctx, provider, base_url):
    """A process claimed a poll, wrote its event, and died before moving the cursor on: once its lease runs out,
    another process delivers that event (same id) without asking the provider again, and goes on from it."""
    user, key = await api.funded_key(1_000_000)
    ws = await socket(base_url, key["key"])
    await ws.read_message()
    first = provider.post(text="seen by the dead process")
    now = datetime.now(UTC)
    rule_id = "fr_deadbeef00000000"
    await ctx.stream_store.add(
        {
            "_id": rule_id,
            "account_id": user["account_id"],
            "key_id": key["key_id"],
            "kind": "rule",
            "tag": "t",
            "value": "hello",
            "interval_seconds": 0.3,
            "status": "active",
            "created_at": now,
            "due_at": now,
            "since_time": int(time.time()) - 5,
            "lease_owner": "dead",
            "lease_token": "dead-token",
            "lease_until": now + timedelta(seconds=0.5),
            "claims": 1,
        },
        50,
    )
    tweets = provider.answer("hello")["tweets"]
    event = {"_id": f"{rule_id}:0", "account_id": user["account_id"], "rule_id": rule_id, "rule_tag": "t"}
    await ctx.stream_store.write_event({**event, "kind": "rule", "tweets": tweets, "created_at": now})
    got = await next_tweet_event(ws)
    assert got["event_id"] == f"{rule_id}:0" and [t["id"] for t in got["tweets"]] == [first]
    later = provider.post(text="after the takeover")
    got = await next_tweet_event(ws)
    assert [t["id"] for t in got["tweets"]] == [later] and got["event_id"] == f"{rule_id}:1"
    # The dead process's poll was not asked again: every query after the takeover names its cursor.
    assert provider.queries and all(f"since_id:{first}" in q or f"since_id:{later}" in q for q in provider.queries)
    ws.close()


@pytest.mark.settings(**QUICK)
async def test_a_busy_interval_is_read_page_by_page_each_page_charged(api, ctx, provider, base_url):
    """45 new tweets between two polls: the poll reads three pages (20, 20, 5), delivers all 45 in one event,
    and records three charged data calls (per tweet, the last one at least the minimum)."""
    user, key = await api.funded_key(1_000_000)
    ws = await socket(base_url, key["key"])
    await ws.read_message()
    rule_id = await rule_on(api, key["key"], interval=1.0)
    await asyncio.sleep(1.5)  # a first, quiet poll sets nothing but its due time; the next finds all 45
    posted = {provider.post(text=f"n{i}") for i in range(45)}
    event = await next_tweet_event(ws)
    assert {t["id"] for t in event["tweets"]} == posted and len(event["tweets"]) == 45
    records: list = []
    for _ in range(40):  # the usage flush runs in the background
        await ctx.meter.flush()
        found = await ctx.usage.records({"account_id": user["account_id"]})
        records = [r for r in found if r["request_id"] == event["event_id"]]
        if len(records) >= 3:
            break
        await asyncio.sleep(0.05)
    assert len(records) == 3 and all(r["stream_id"] == rule_id and r["credits"] >= LEAST for r in records)
    ws.close()


@pytest.mark.settings(**QUICK)
async def test_a_polls_charges_are_in_the_usage_journal_before_the_poll_ends(api, ctx, provider, base_url, tmp_path):
    """The stream poller's charges go through the same journal as the data calls': a crash after the poll loses
    none of them (accounting/journal.py)."""
    kept = ctx.meter.journal = Journal(str(tmp_path), "t", "p", 1.0, 256)
    kept.open()
    user, key = await api.funded_key(1_000_000)
    ws = await socket(base_url, key["key"])
    await ws.read_message()
    rule_id = await rule_on(api, key["key"], interval=1.0)
    provider.post(text="hello there")
    event = await next_tweet_event(ws)

    def charged() -> list[dict]:
        return [e["r"] for e in journal.read(kept.path) if "r" in e and e["r"]["request_id"] == event["event_id"]]

    for _ in range(200):  # the event is delivered before its poll charges it
        if charged():
            break
        await asyncio.sleep(0.05)
    assert [(r["stream_id"], r["credits"] >= LEAST) for r in charged()] == [(rule_id, True)]
    ctx.meter.journal = None
    await kept.close(remove=True)
    ws.close()


@pytest.mark.settings(**QUICK)
async def test_a_poll_whose_next_page_cannot_be_reserved_lets_its_earlier_pages_go(
    api, ctx, provider, base_url, monkeypatch
):
    """The database fails while a poll reserves its second page (a lease refill): the first page's
    reservation is released, not held for ever (it would keep the process's credit lease from closing),
    and a later poll delivers the tweets."""
    user, key = await api.funded_key(1_000_000)
    ws = await socket(base_url, key["key"])
    await ws.read_message()
    held, calls, reserve = [], [], ctx.meter.reserve

    async def failing_second_page(*args, **kwargs):
        calls.append(args)
        if len(calls) == 2:
            raise AutoReconnect("the database went away")
        reservation = await reserve(*args, **kwargs)
        held.append(reservation)
        return reservation

    await rule_on(api, key["key"], interval=1.0)
    await asyncio.sleep(1.5)  # a first, quiet poll; then 45 tweets: three pages
    monkeypatch.setattr(ctx.meter, "reserve", failing_second_page)
    posted = {provider.post(text=f"r{i}") for i in range(45)}
    event = await next_tweet_event(ws)
    assert {t["id"] for t in event["tweets"]} == posted  # delivered by the poll after the failed one
    purse = held[0].purse
    for _ in range(100):  # the delivering poll settles its pages just after its event; then nothing is held
        if purse.reserved == 0:
            break
        await asyncio.sleep(0.02)
    assert len(calls) > 3 and purse.reserved == 0, (len(calls), purse)  # a leaked page would stay reserved
    ws.close()


@pytest.mark.settings(**QUICK)
async def test_a_burst_larger_than_one_poll_reads_is_delivered_whole_by_the_next_polls(api, ctx, provider, base_url):
    """130 new tweets between two polls, one poll reading 100 at most: the newest 100 come at once, the older
    30 with the next poll (a gap it reads with max_id:), each tweet once."""
    ws = await quiet_rule_and_socket(api, base_url)
    posted = [provider.post(text=f"n{i}") for i in range(130)]
    first = await next_tweet_event(ws)
    assert [t["id"] for t in first["tweets"]] == posted[:-101:-1]  # the newest 100, newest first
    second = await next_tweet_event(ws)
    assert [t["id"] for t in second["tweets"]] == posted[29::-1]
    assert any(f"max_id:{int(posted[30]) - 1}" in q for q in provider.queries)
    later = provider.post(text="after the burst")
    third = await next_tweet_event(ws)
    assert [t["id"] for t in third["tweets"]] == [later]
    ws.close()


@pytest.mark.settings(**QUICK)
async def test_tweets_posted_while_a_poll_reads_its_pages_lose_none_of_the_older_ones(api, ctx, provider, base_url):
    """The provider's page cursor is a position: tweets posted after the first page shift the next pages, which
    then repeat some tweets already read. The poll goes on past them: every tweet is delivered, each once."""
    ws = await quiet_rule_and_socket(api, base_url)
    posted = [provider.post(text=f"n{i}") for i in range(50)]
    posted += [provider.post(text=f"late{i}", later=True) for i in range(10)]
    got: list[str] = []
    while len(set(got)) < len(posted):
        got += [t["id"] for t in (await next_tweet_event(ws, 10))["tweets"]]
    assert sorted(got) == sorted(posted)
    ws.close()


@pytest.mark.settings(**QUICK)
@pytest.mark.gen_test(timeout=180)  # its waits add up past the file's 60 s on a busy machine (one CI-like run)
async def test_a_rule_changed_mid_poll_starts_its_new_search_and_the_poll_in_flight_is_not_charged(
    api, ctx, provider, base_url
):
    """A poll of the old search is slow; the rule's value changes meanwhile. The old poll's tweet is delivered
    once, but its end neither moves the new search's cursor (which starts from the change) nor is charged."""
    user, key = await api.funded_key(1_000_000)
    ws = await socket(base_url, key["key"])
    await ws.read_message()
    rule_id = await rule_on(api, key["key"], value="old")
    first = provider.post(text="one")
    await next_tweet_event(ws)
    provider.gate.clear()  # the next poll of the old search is held at the provider until the change is made
    slow = provider.post(text="two")
    deadline = time.monotonic() + 30
    while not any(q.startswith("old") and f"since_id:{first}" in q for q in provider.queries):
        assert time.monotonic() < deadline, "the old search was not polled again"
        await asyncio.sleep(0.02)
    await asyncio.sleep(1.1)  # since_time: has second resolution
    change = {"rule_id": rule_id, "tag": "t1", "value": "new", "interval_seconds": 0.3, "is_effect": 1}
    assert (await api.call("POST", "/oapi/tweet_filter/update_rule", change, key=key["key"]))[0] == 200
    provider.gate.set()
    old = await next_tweet_event(ws)
    assert [t["id"] for t in old["tweets"]] == [slow]
    deadline = time.monotonic() + 20  # polls of the new search after the old one ended (slower on a busy machine)
    while not (new_queries := [q for q in provider.queries if q.startswith("new")]) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert new_queries and all("since_time:" in q for q in new_queries), new_queries  # not the old cursor
    fresh = provider.post(text="three")
    got = await next_tweet_event(ws)
    assert [t["id"] for t in got["tweets"]] == [fresh]  # "two" is older than the new search: not again
    spent = ctx.meter.ledger.purses[user["account_id"]].spent
    for _ in range(400):  # the usage flush runs in the background
        await ctx.meter.flush()
        records = await ctx.usage.records({"account_id": user["account_id"]})
        # The old poll's record charges nothing: the spend alone does not say it is written yet.
        if sum(r["credits"] for r in records) >= spent and any(r["request_id"] == old["event_id"] for r in records):
            break
        await asyncio.sleep(0.05)
    assert [r["credits"] for r in records if r["request_id"] == old["event_id"]] == [0]
    assert sum(r["credits"] for r in records) == spent
    ws.close()


@pytest.mark.settings(**QUICK, stream_ping_seconds=0.3)
async def test_a_socket_is_pinged_and_keeps_its_key_for_as_long_as_it_lives(api, provider, base_url, monkeypatch):
    """Pings keep coming, and the socket's hold on its key is renewed: long after a hold would have gone stale,
    a second socket of the key is still refused (1008)."""
    monkeypatch.setattr("streams.hub.HOLD_BEAT", 0.2)
    monkeypatch.setattr("streams.hub.HOLD_STALE", 0.8)
    _, key = await api.funded_key(1_000_000)
    ws = await socket(base_url, key["key"])
    kinds: list[str] = []
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        kinds.append(orjson.loads(await asyncio.wait_for(ws.read_message(), 1.0))["event_type"])
    assert kinds[0] == "connected" and kinds.count("ping") >= 4
    second = await socket(base_url, key["key"])
    assert await second.read_message() is None and second.close_code == 1008
    ws.close()


@pytest.mark.settings(**QUICK)
async def test_a_resume_says_whether_it_replays_everything_missed(api, provider, base_url):
    _, key = await api.funded_key(1_000_000)
    k = key["key"]
    ws = await socket(base_url, k)
    assert "replay" not in orjson.loads(await ws.read_message())  # no resume asked
    await rule_on(api, k)
    tweet = provider.post()
    event = await next_tweet_event(ws)
    ws.close()
    await asyncio.sleep(0.3)

    async def connected(query: str) -> tuple[dict, list[str]]:
        again = await socket(base_url, k, query)
        first = orjson.loads(await again.read_message())
        replayed = []
        if first["replay"]["events"]:
            replayed = [t["id"] for t in (await next_tweet_event(again))["tweets"]]
        again.close()
        await asyncio.sleep(0.3)  # the key's socket let go
        return first["replay"], replayed

    assert await connected("?since_event_id=" + urllib.parse.quote(event["event_id"])) == (
        {"events": 0, "complete": True},
        [],
    )
    replay, _ = await connected("?since_event_id=fr_0000000000000000:7")
    assert replay["events"] == 0 and not replay["complete"] and "since_timestamp" in replay["msg"]
    two_days_ago = int((time.time() - 2 * 86400) * 1000)
    replay, replayed = await connected(f"?since_timestamp={two_days_ago}")
    assert replay["events"] == 1 and not replay["complete"] and "no longer kept" in replay["msg"]
    assert replayed == [tweet]


@pytest.mark.settings(**QUICK)
async def test_a_client_that_stops_reading_is_dropped_and_the_others_keep_receiving(
    api, ctx, provider, base_url, monkeypatch
):
    """A socket whose client reads nothing: once more than the limit of events waits for it, the gateway closes
    it (and drops the connection when the close goes unanswered), so its backlog does not grow in memory; the
    account's other socket gets every event meanwhile."""
    monkeypatch.setattr("handlers.streams.handlers.UNSENT_LIMIT", 8 << 20)
    user, key = await api.funded_key(100_000_000)
    reader = await socket(base_url, (await api.new_key(user["token"]))["key"])
    await reader.read_message()
    stalled = stalled_socket(base_url, key["key"])
    while ctx.hub.count() < 2:
        await asyncio.sleep(0.05)
    got: set = set()

    async def read_all() -> None:  # a client that keeps reading (Tornado's client reads only when asked)
        while True:
            got.update(t["id"] for t in (await next_tweet_event(reader, 30))["tweets"])

    reading = asyncio.create_task(read_all())
    await rule_on(api, key["key"])
    posted = set()
    for _ in range(10):  # 20 MB of events: more than the kernel's buffers hold for a client that reads nothing
        posted |= {provider.post(text="x" * 100_000) for _ in range(20)}
        await asyncio.sleep(0.35)
    while got != posted and not reading.done():
        await asyncio.sleep(0.1)
    reading.cancel()
    assert got == posted, reader.close_reason
    deadline = time.monotonic() + 8  # Tornado waits 5 s for the client's answer to the close
    while ctx.hub.count() > 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert ctx.hub.count() == 1  # the stalled socket is gone, the reader's stays
    stalled.setblocking(False)
    received = 0
    with contextlib.suppress(BlockingIOError):
        while chunk := stalled.recv(1 << 20):
            received += len(chunk)
    assert received < 16_000_000  # not everything was queued for it
    stalled.close()
    reader.close()


async def test_a_gateway_stopped_mid_poll_lets_its_rule_go_at_once_and_charges_nothing(mongo):
    """SIGTERM while a poll waits on a slow provider, longer than the drain: the poll is cut short, not charged,
    and its rule is free to claim at once (not after the lease's 27 s), so a restarted gateway polls it on time."""
    provider = SearchProvider()
    provider.delay = 30.0
    db_name = f"t_streams_{time.time_ns()}"
    env = dict(STREAM_MIN_INTERVAL="0.3", STREAM_TICK_SECONDS="0.05", DRAIN_SECONDS="1")
    gw = await Gateway(mongo.uri, provider.url, db_name, **env).launch()
    try:
        user, secrets, _ = await account_with_keys(gw, 10_000_000, 1)
        body = {"tag": "t", "value": "slow", "interval_seconds": 0.3}
        rule_id = orjson.loads(
            (await gw.call("POST", "/oapi/tweet_filter/add_rule", body, **{"X-API-Key": secrets[0]})).body
        )["rule_id"]
        update = {**body, "rule_id": rule_id, "is_effect": 1}
        await gw.call("POST", "/oapi/tweet_filter/update_rule", update, **{"X-API-Key": secrets[0]})
        while not provider.queries:
            await asyncio.sleep(0.05)
        assert await asyncio.to_thread(gw.stop) == 0
    finally:
        gw.stop()
        provider.stop()
    account, records = await ledger_of(mongo.uri, db_name, user["account_id"])
    client = database.connect(mongo.uri)
    rule = await client[db_name].stream_rules.find_one({"_id": rule_id})
    await client.drop_database(db_name)
    await client.close()
    assert rule["lease_owner"] is None and rule["lease_until"].year == 1970
    assert account["credits"] == 10_000_000 and sum(r["credits"] for r in records) == 0


@pytest.mark.parametrize(
    ("late", "next_after_start"),
    [
        (0.2, 9.8),  # on time: one interval after it was due
        (4.0, 6.0),  # late within its slot: still on its cadence
        (9.9, 5.0),  # late nearly a whole interval: its slot's end is 0.1 s away, yet the next waits half an interval
        (23.0, 7.0),  # late past two slots: the missed ones are skipped (one poll per interval window)
    ],
)
def test_a_late_poll_keeps_the_cadence_but_the_next_waits_at_least_half_an_interval(late, next_after_start):
    due = datetime(2026, 11, 26, tzinfo=UTC)
    start = due + timedelta(seconds=late)
    following = Poller._due({"due_at": due, "interval_seconds": 10}, start, 10)
    assert (following - start).total_seconds() == pytest.approx(next_after_start)


@pytest.mark.settings(**QUICK, cache_max_bytes=8 * 1024 * 1024)
async def test_polls_read_live_with_the_answer_cache_on(api, ctx, provider):
    """A quiet rule asks the same search at every poll: each poll still reaches the provider and is charged (the
    answer cache never answers a poll, issue 36)."""
    user, key = await api.funded_key(1_000_000)
    await rule_on(api, key["key"], value="nothing here")
    for _ in range(200):
        if len(provider.queries) >= 4:
            break
        await asyncio.sleep(0.05)
    assert len(provider.queries) >= 4 and len(set(provider.queries)) < len(provider.queries)
    records: list = []
    for _ in range(40):
        await ctx.meter.flush()
        records = [r for r in await ctx.usage.records({"account_id": user["account_id"]}) if r.get("stream_id")]
        if len(records) >= 4:
            break
        await asyncio.sleep(0.05)
    assert len(records) >= 4 and {r["credits"] for r in records} == {LEAST}
    assert not any("cache" in r for r in records)
