"""Webhook attacks against a served gateway (docs/alerts.md, docs/security.md): IPv6 forms of private addresses
are refused as endpoints in production; one account's hanging receivers and test events do not hold back
another account's deliveries, and test events are rate-limited."""

import asyncio
import uuid

import orjson
import pytest
from support import Gateway, Receiver, gathered

pytestmark = pytest.mark.gen_test(timeout=120)


async def registered(gw: Gateway) -> dict:
    email = f"w{uuid.uuid4().hex[:8]}@example.com"
    response = await gw.call("POST", "/auth/register", {"email": email, "password": "webhook attack pass"})
    assert response.code == 200, response.body
    return {"Authorization": f"Bearer {orjson.loads(response.body)['token']}"}


async def test_production_refuses_ipv6_forms_of_private_receivers(mongo, upstream_url):
    gw = await Gateway(mongo.uri, upstream_url, f"w_{uuid.uuid4().hex[:10]}", GATEWAY_ENV="production").launch()
    auth = await registered(gw)
    for host, reason in (
        ("[fec0::1]", "a site-local address"),
        ("[2002:7f00:1::1]", "a loopback address in 6to4 form"),  # 6to4 of 127.0.0.1
        ("[2002:a9fe:a9fe::1]", "a link-local address (cloud metadata included) in 6to4 form"),
        ("[64:ff9b::a00:1]", "a private address in NAT64 form"),
        ("[::ffff:0:7f00:1]", "an IPv4-translated address"),
        ("[2001:0:4136:e378:8000:63bf:3fff:fdd2]", "a Teredo tunnel address"),
    ):
        response = await gw.call("POST", "/webhooks", {"url": f"https://{host}/hook"}, **auth)
        body = orjson.loads(response.body)
        assert response.code == 422 and body["detail"][0]["loc"] == ["body", "url"], (host, body)
        assert body["detail"][0]["msg"] == f"Refused: {host.strip('[]')} resolves to {reason}", body
    listed = await gw.call("GET", "/webhooks", **auth)
    assert orjson.loads(listed.body) == []


class Silent:
    """Receivers that accept the connection, read the request and never answer; how many hang at once."""

    def __init__(self):
        self.open = self.most = 0

    async def start(self) -> "Silent":
        self.server = await asyncio.start_server(self.hang, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def hang(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        self.most = max(self.most, self.open)
        try:
            while await reader.read(65536):  # until the gateway gives up and closes
                pass
        finally:
            self.open -= 1
            writer.close()

    async def stop(self) -> None:
        self.server.close()
        for _ in range(100):
            if not self.open:
                break
            await asyncio.sleep(0.05)


async def test_hanging_receivers_and_test_events_of_one_account_do_not_hold_back_another(mongo, upstream_url):
    """Account A: ten endpoints whose receivers never answer, and sixty test events. Account B's test event still
    arrives at once, not after A's attempts time out: A holds only its share of the attempts under way."""
    silent, receiver = await Silent().start(), Receiver()
    gw = Gateway(
        mongo.uri,
        upstream_url,
        f"w_{uuid.uuid4().hex[:10]}",
        WEBHOOK_TIMEOUT="60",  # A's attempts hang this long
        WEBHOOK_CONCURRENCY="6",  # fewer places than A has deliveries: oldest first alone would give A all of them
        WEBHOOK_ACCOUNT_CONCURRENCY="2",
    )
    await gw.launch()
    a, b = await registered(gw), await registered(gw)
    hanging = []
    for i in range(10):
        made = await gw.call("POST", "/webhooks", {"url": f"http://127.0.0.1:{silent.port}/h{i}"}, **a)
        hanging.append(orjson.loads(made.body)["endpoint_id"])
    tests = [await gw.call("POST", f"/webhooks/{hanging[i % 10]}/test", {}, **a) for i in range(60)]
    for _ in range(200):  # A's attempts are under way before B asks
        if silent.open:
            break
        await asyncio.sleep(0.05)
    made = orjson.loads((await gw.call("POST", "/webhooks", {"url": receiver.url}, **b)).body)
    receiver.secret = made["secret"]
    assert (await gw.call("POST", f"/webhooks/{made['endpoint_id']}/test", {}, **b)).code == 200
    # A bound on a hang (a sixth of A's 60 s), not a timing assertion: B's delivery is not queued behind A's.
    delivered = await gathered(receiver.verified, 1, seconds=10.0)
    assert [d["type"] for d in delivered] == ["webhook.test"], "B's delivery waited behind A's hanging receivers"
    assert silent.most <= 2, f"A held {silent.most} attempts at once, more than its share"
    # Test events are rate-limited per account: 10 a minute, then 429 with a JSON body and Retry-After.
    statuses = [t.code for t in tests]
    assert statuses[:10] == [200] * 10 and set(statuses[10:]) == {429}, statuses
    refused = tests[10]
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert "10 test events a minute" in orjson.loads(refused.body)["detail"]
    assert await asyncio.to_thread(gw.stop) == 0  # its attempts end: the receivers see their connections close
    receiver.stop()
    await silent.stop()
