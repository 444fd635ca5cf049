"""Real time attacked the way a customer or an admin can (issue 39): a suspended account's rules and sockets,
a key's budget and its revocation binding its rules, the socket's headers, and a client cut for not reading."""

import pytest
import tornado.httpclient
from support import use_upstream
from test_streams import QUICK, Provider, socket

pytestmark = pytest.mark.gen_test(timeout=90)


@pytest.fixture
def scripted(ctx):
    provider = Provider()
    use_upstream(ctx, provider.url)
    ctx.poller.upstream = ctx.upstream
    yield provider
    provider.stop()


@pytest.mark.settings(**QUICK)
async def test_the_socket_answers_carry_no_server_header(api, scripted, base_url):
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
