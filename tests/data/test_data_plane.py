"""A data GET is served before web.Application's routing (handlers/data_plane.py): on one connection it mixes
with portal calls, other methods, unknown data paths and pipelined requests as any request does, each answered
in order and in its part's shape."""

import asyncio

import orjson
import pytest
from support import FAST, qs, valid_query

from social.endpoints import BY_PATH

pytestmark = pytest.mark.gen_test(timeout=60)


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


@pytest.mark.settings(plan_rules=FAST)
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


@pytest.mark.settings(plan_rules=FAST)
async def test_pipelined_requests_are_answered_in_order(api, catalog, http_port):
    path, key = await data_path(api, catalog)
    reader, writer = await asyncio.open_connection("127.0.0.1", http_port)
    try:
        writer.write(
            get(path, key, "X-Request-ID: one\r\n")
            + get("/account", extra="X-Request-ID: two\r\n")
            + get(path, key, "X-Request-ID: three\r\n")
        )
        answers = [await read_answer(reader) for _ in range(3)]
        assert [(status, headers["x-request-id"]) for status, headers, _ in answers] == [
            (200, "one"),
            (401, "two"),
            (200, "three"),
        ]
    finally:
        writer.close()


@pytest.mark.settings(plan_rules=FAST)
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
