"""A data GET is served before web.Application's routing (handlers/data_plane.py), on the gateway's own
connection protocol (app/front.py) or Tornado's (DATA_CONNECTIONS=tornado): on one connection it mixes with
portal calls, other methods, unknown data paths and pipelined requests as any request does, each answered in
order and in its part's shape; a connection that carries anything else is handed to Tornado mid-stream."""

import asyncio
import uuid

import orjson
import pytest
from support import FAST, Gateway, account_with_keys, qs, valid_query

from gateway_testing.helpers import make_settings
from social.endpoints import BY_PATH

pytestmark = pytest.mark.gen_test(timeout=60)


@pytest.fixture(params=["own", "tornado"])
def settings(request):
    """Every test here on both connection servers; @pytest.mark.settings adds to these."""
    marker = request.node.get_closest_marker("settings")
    return make_settings(plan_rules=FAST, data_connections=request.param, **(marker.kwargs if marker else {}))


async def read_answer(reader: asyncio.StreamReader, head: bool = False) -> tuple[int, dict, bytes]:
    """One HTTP/1.1 answer off a connection: status, headers (lower-case names), body (by Content-Length)."""
    status_line = await reader.readline()
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = b"" if head else await reader.readexactly(int(headers.get("content-length", 0)))
    return int(status_line.split()[1]), headers, body


def get(path: str, key: str = "", extra: str = "", method: str = "GET") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: gw\r\nX-API-Key: {key}\r\n{extra}\r\n".encode()


async def data_path(api, catalog) -> tuple[str, str]:
    _, key = await api.funded_key(100_000)
    return f"/social/user/info?{qs(valid_query(BY_PATH['/user/info'], catalog))}", key["key"]


async def test_one_connection_mixes_data_calls_portal_calls_other_methods_and_unknown_paths(api, catalog, http_port):
    path, key = await data_path(api, catalog)
    reader, writer = await asyncio.open_connection("127.0.0.1", http_port)
    try:
        writer.write(get(path, key, "X-Request-ID: first\r\n"))
        status, headers, body = await read_answer(reader)
        assert status == 200 and orjson.loads(body)["status"] == "success"
        assert headers["x-request-id"] == "first" and int(headers["x-credits-charged"]) > 0
        assert headers["content-type"] == "application/json" and headers["cache-control"] == "no-store"
        assert headers["x-content-type-options"] == "nosniff" and "date" in headers and "server" not in headers
        assert "connection" not in headers  # kept alive

        writer.write(get("/account"))  # the portal, in its own error shape
        status, _, body = await read_answer(reader)
        assert status == 401 and "detail" in orjson.loads(body)

        writer.write(get("/social/no/such/endpoint", key))
        status, _, body = await read_answer(reader)
        assert status == 404 and orjson.loads(body) == {
            "status": "error",
            "msg": "Unknown data endpoint; GET /openapi.json lists them",
        }

        writer.write(get(path, key, method="HEAD"))  # only GET is a data call
        status, headers, _ = await read_answer(reader, head=True)
        assert status == 405 and headers["allow"] == "GET"

        writer.write(get(path, key, "Content-Length: 5\r\n") + b"hello")  # a body on a GET: read and ignored
        status, _, body = await read_answer(reader)
        assert status == 200 and orjson.loads(body)["status"] == "success"

        writer.write(get(path, "sgw_unknown"))
        status, headers, body = await read_answer(reader)
        assert status == 401 and orjson.loads(body) == {"status": "error", "msg": "Invalid API key"}
        assert "x-request-id" in headers
    finally:
        writer.close()


async def test_pipelined_requests_are_answered_in_order(api, catalog, http_port):
    """Two data calls, a portal call (the hand-over, on the own protocol) and two more data calls, in one write."""
    path, key = await data_path(api, catalog)
    reader, writer = await asyncio.open_connection("127.0.0.1", http_port)
    try:
        writer.write(
            get(path, key, "X-Request-ID: one\r\n")
            + get(path, key, "X-Request-ID: two\r\n")
            + get("/account", extra="X-Request-ID: three\r\n")
            + get(path, key, "X-Request-ID: four\r\n")
            + get(path, key, "X-Request-ID: five\r\n")
        )
        answers = [await read_answer(reader) for _ in range(5)]
        assert [(status, headers["x-request-id"]) for status, headers, _ in answers] == [
            (200, "one"),
            (200, "two"),
            (401, "three"),
            (200, "four"),
            (200, "five"),
        ]
        assert len({body for status, _, body in answers if status == 200}) == 1
    finally:
        writer.close()


async def test_connection_close_ends_the_connection_after_the_answer(api, catalog, http_port):
    path, key = await data_path(api, catalog)
    reader, writer = await asyncio.open_connection("127.0.0.1", http_port)
    writer.write(get(path, key, "Connection: close\r\n") + get(path, key))
    status, headers, _ = await read_answer(reader)
    assert status == 200 and headers["connection"] == "close"
    assert await reader.read() == b""  # the second request is not answered: the connection closed
    writer.close()


async def test_heads_in_other_forms_are_read_as_tornado_reads_them(api, catalog, http_port, ctx):
    """Lines ended by a bare LF are a request too; a head over MAX_HEADER_BYTES gets its 431 in the data
    plane's shape; neither is lost between the two protocols."""
    path, key = await data_path(api, catalog)
    padding = f"X-Padding: {'p' * ctx.settings.max_header_bytes}\r\n"
    for head in (f"GET {path} HTTP/1.1\nHost: gw\nX-API-Key: {key}\n\n".encode(), get(path, key, padding)):
        reader, writer = await asyncio.open_connection("127.0.0.1", http_port)
        try:
            writer.write(get(path, key))  # a data call first: the connection is the own protocol's, if any
            assert (await read_answer(reader))[0] == 200
            writer.write(head)
            status, _, body = await read_answer(reader)
            if b"X-Padding" in head:
                assert status == 431 and orjson.loads(body)["status"] == "error"
            else:
                assert status == 200 and orjson.loads(body)["status"] == "success"
        finally:
            writer.close()


@pytest.mark.settings(http_idle_timeout=1.0)
async def test_a_client_sending_its_head_slowly_is_disconnected(api, catalog, http_port):
    path, key = await data_path(api, catalog)
    reader, writer = await asyncio.open_connection("127.0.0.1", http_port)
    writer.write(get(path, key))  # one answered call: the connection is the own protocol's, if any
    assert (await read_answer(reader))[0] == 200
    writer.write(f"GET {path} HTTP/1.1\r\nHost: gw\r\n".encode())  # and never the rest of the head
    assert await asyncio.wait_for(reader.read(), 30) == b""
    writer.close()


async def test_a_data_call_over_http_1_0_without_host_and_http_1_1_without_host_refused(api, catalog, http_port):
    path, key = await data_path(api, catalog)
    reader, writer = await asyncio.open_connection("127.0.0.1", http_port)
    writer.write(f"GET {path} HTTP/1.0\r\nX-API-Key: {key}\r\n\r\n".encode())  # HTTP/1.0 needs no Host
    status, _, body = await read_answer(reader)
    assert status == 200 and orjson.loads(body)["status"] == "success"
    assert await reader.read() == b""  # closed after the answer: no keep-alive asked
    writer.close()

    reader, writer = await asyncio.open_connection("127.0.0.1", http_port)
    writer.write(f"GET {path} HTTP/1.1\r\nX-API-Key: {key}\r\n\r\n".encode())  # HTTP/1.1 without Host
    assert (await reader.read()).startswith(b"HTTP/1.1 400 ")
    writer.close()


async def test_a_connection_stays_on_the_own_protocol_until_its_first_other_request(
    api, catalog, http_port, http_server, settings
):
    if settings.data_connections == "tornado":
        assert http_server.front is None
        return
    path, key = await data_path(api, catalog)
    reader, writer = await asyncio.open_connection("127.0.0.1", http_port)
    try:
        for _ in range(3):
            writer.write(get(path, key))
            assert (await read_answer(reader))[0] == 200
        assert len(http_server.front.connections) == 1 and not http_server._connections
        writer.write(get("/account"))
        assert (await read_answer(reader))[0] == 401
        assert not http_server.front.connections and len(http_server._connections) == 1  # Tornado's from here
        writer.write(get(path, key))
        assert (await read_answer(reader))[0] == 200
    finally:
        writer.close()


@pytest.mark.parametrize("workers", [1, 2])
async def test_the_served_gateway_hands_connections_over_on_its_own_event_loop(mongo, upstream_url, catalog, workers):
    """`serve` as users run it (uvloop, its default DATA_CONNECTIONS, --workers 2 too): data calls, then the
    portal, then data calls again on each of several keep-alive connections, in separate writes and pipelined,
    every answer in order."""
    gw = await Gateway(mongo.uri, upstream_url, f"d_{uuid.uuid4().hex[:10]}", workers=workers).launch()
    _, (key,), _ = await account_with_keys(gw, 1_000_000, 1)
    path = f"/social/user/info?{qs(valid_query(BY_PATH['/user/info'], catalog))}"

    async def one_client(n: int) -> list[tuple[int, str]]:
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        try:
            seen = []
            for step, target in enumerate((path, path, "/account", path)):
                writer.write(get(target, key if target == path else "", f"X-Request-ID: c{n}-{step}\r\n"))
                status, headers, _ = await read_answer(reader)
                seen.append((status, headers["x-request-id"]))
            writer.write(b"".join(get(path, key, f"X-Request-ID: c{n}-p{i}\r\n") for i in range(3)))
            seen += [(s, h["x-request-id"]) for s, h, _ in [await read_answer(reader) for _ in range(3)]]
            return seen
        finally:
            writer.close()

    for n, seen in enumerate(await asyncio.gather(*[one_client(n) for n in range(8)])):
        assert seen == [(200, f"c{n}-0"), (200, f"c{n}-1"), (401, f"c{n}-2"), (200, f"c{n}-3")] + [
            (200, f"c{n}-p{i}") for i in range(3)
        ], seen
