"""Webhook attacks against a served gateway (docs/alerts.md, docs/security.md): IPv6 forms of private addresses
are refused as endpoints in production; one account's hanging receivers and test events do not hold back
another account's deliveries, and test events are rate-limited."""

import uuid

import orjson
import pytest
from support import Gateway

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
