"""The strict contract: every invalid data call is refused with 422 before anything is forwarded, charged
or recorded (walked from the endpoint table, every endpoint and every constraint); the OpenAPI document
states the same constraints; unknown data paths answer in the data plane's shape; one request id, one
time format; 413 decided from Content-Length; HEAD on health checks; the sandbox catalog through the gateway."""

import asyncio
import re
import urllib.parse
import urllib.request
from datetime import UTC, datetime

import jsonschema
import orjson
import pytest
from support import recorder, use_upstream, valid_query
from tornado.testing import bind_unused_port

from app.server import make_server
from handlers import openapi
from handlers.errors import ValidationError
from handlers.social import parse_args
from social.endpoints import CURSOR_MAX, ENDPOINTS, STRING_MAX

pytestmark = pytest.mark.gen_test(timeout=120)
FAST = ({"name": "fast", "min_paid_usd": 0, "qps": 100000},)
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def invalid_calls():
    """(endpoint, what is wrong, query changes (None: leave the parameter out), loc, type): every constraint."""
    for e in ENDPOINTS:
        for p in e.params:
            loc = ["query", p.name]
            if p.required:
                yield e, f"{p.name} missing", {p.name: None}, loc, "missing"
                yield e, f"{p.name} blank", {p.name: "  "}, loc, "missing"
                yield e, f"{p.name} Unicode blank", {p.name: "\u00a0\u2003"}, loc, "missing"
            if p.kind == "int":
                yield e, f"{p.name} not an integer", {p.name: "ten"}, loc, "int_parsing"
                yield e, f"{p.name} in non-ASCII digits", {p.name: "\u0663"}, loc, "int_parsing"
                if p.minimum is not None:
                    yield e, f"{p.name} below minimum", {p.name: str(p.minimum - 1)}, loc, "greater_than_equal"
                if p.maximum is not None:
                    yield e, f"{p.name} above maximum", {p.name: str(p.maximum + 1)}, loc, "less_than_equal"
            elif p.kind == "bool":
                yield e, f"{p.name} not a boolean", {p.name: "maybe"}, loc, "bool_parsing"
            elif p.kind == "ids":
                yield e, f"{p.name} not numeric", {p.name: "12,abc"}, loc, "value_error"
                yield e, f"{p.name} with non-ASCII digits", {p.name: "12,\u0663"}, loc, "value_error"
                many = ",".join(str(i) for i in range(1, p.maximum + 2))
                yield e, f"{p.name} too many", {p.name: many}, loc, "too_long"
            elif p.kind == "cursor":
                yield e, "cursor with a space", {p.name: "abc def"}, loc, "value_error"
                yield e, "cursor with a control character", {p.name: "abc\x01"}, loc, "value_error"
                yield e, "cursor not ASCII", {p.name: "abcé"}, loc, "value_error"
                yield e, "cursor too long", {p.name: "A" * (CURSOR_MAX + 1)}, loc, "string_too_long"
            elif p.choices:
                yield e, f"{p.name} not one of its values", {p.name: "Bogus"}, loc, "enum"
                yield e, f"{p.name} in the wrong case", {p.name: p.choices[-1].lower()}, loc, "enum"
            else:
                yield e, f"{p.name} too long", {p.name: "a" * (STRING_MAX + 1)}, loc, "string_too_long"
        if e.one_of:
            yield e, "none of " + "/".join(e.one_of), dict.fromkeys(e.one_of), ["query"], "missing"


INVALID = list(invalid_calls())


def upstream_requests(upstream_url: str) -> int:
    with urllib.request.urlopen(upstream_url + "/sandbox/stats") as response:
        return orjson.loads(response.read())["requests"]


def test_every_endpoint_and_parameter_has_invalid_calls():
    for endpoint in ENDPOINTS:
        for param in endpoint.params:
            assert any(e is endpoint and param.name in changes for e, _, changes, _, _ in INVALID), (
                endpoint.path,
                param,
            )
    assert {e.path for e, what, *_ in INVALID if what.startswith("none of")} == {
        "/user/followers_ids",
        "/user/last_tweets",
    }


@pytest.mark.settings(plan_rules=FAST)
async def test_every_invalid_call_is_422_before_anything_is_forwarded_charged_or_recorded(
    api, ctx, catalog, upstream_url
):
    user, key = await api.funded_key(100_000)
    before = upstream_requests(upstream_url)
    for endpoint, what, changes, loc, type_ in INVALID:
        query = {**valid_query(endpoint, catalog), **changes}
        query = {k: v for k, v in query.items() if v is not None}
        for prefix in ("/social", "/twitter"):
            status, body, _ = await api.call(
                "GET", f"{prefix}{endpoint.path}?{urllib.parse.urlencode(query)}", key=key["key"]
            )
            assert status == 422, (endpoint.path, what, body)
            assert set(body) == {"detail"} and all(set(d) == {"loc", "msg", "type"} for d in body["detail"])
            assert {"loc": loc, "type": type_} in [{"loc": d["loc"], "type": d["type"]} for d in body["detail"]], (
                endpoint.path,
                what,
                body,
            )
        assert upstream_requests(upstream_url) == before, (endpoint.path, what)  # nothing was forwarded
    assert len(INVALID) > 80
    assert (await api.call("GET", "/account", token=user["token"]))[1]["credits"] == 100_000  # nothing charged
    assert (await api.call("GET", "/usage", token=user["token"]))[1] == []  # nothing recorded
    assert len(ctx.meter.buffer) == 0


@pytest.mark.settings(plan_rules=FAST)
async def test_valid_values_of_the_new_constraints_are_forwarded(api, catalog):
    _, key = await api.funded_key(1_000_000)
    user = catalog["users"][0]
    ok = [
        f"/social/tweet/advanced_search?query=from:{user['userName']}&queryType=Top",
        f"/social/tweet/replies/v2?tweetId={catalog['tweets'][0]}&queryType=Likes",
        f"/social/user/followers_ids?userId={user['id']}&cursor=-1",
        f"/social/user/last_tweets?userName={user['userName']}",
    ]
    for path in ok:
        status, body, _ = await api.call("GET", path, key=key["key"])
        assert status == 200 and body["status"] == "success", (path, body)
    # A cursor the provider handed out is accepted as it is.
    status, page, _ = await api.call(
        "GET", f"/social/user/followers?userName={catalog['big_accounts'][0]}&pageSize=20", key=key["key"]
    )
    assert status == 200 and page["next_cursor"]
    status, _, _ = await api.call(
        "GET",
        f"/social/user/followers?userName={catalog['big_accounts'][0]}&pageSize=20&cursor={page['next_cursor']}",
        key=key["key"],
    )
    assert status == 200


async def test_the_openapi_document_states_the_same_constraints(api):
    _, doc, _ = await api.call("GET", "/openapi.json")
    for endpoint in ENDPOINTS:
        operation = doc["paths"]["/social" + endpoint.path]["get"]
        schemas = {p["name"]: p["schema"] for p in operation["parameters"]}
        for param in endpoint.params:
            schema = schemas[param.name]
            if param.choices:
                assert schema["enum"] == list(param.choices)
            if param.kind == "cursor":
                assert schema["maxLength"] == CURSOR_MAX
                assert re.search(schema["pattern"], "c2J4MToyMA") and not re.search(schema["pattern"], "a b")
        for name in endpoint.one_of:
            assert name in operation["description"]
    replies = doc["paths"]["/social/tweet/replies/v2"]["get"]["parameters"]
    assert next(p for p in replies if p["name"] == "queryType")["schema"]["enum"] == ["Relevance", "Latest", "Likes"]


async def test_the_websocket_resume_parameters_say_what_they_do_with_an_example(api):
    """since_event_id and since_timestamp on the tweet WebSocket: a reader of /docs learns what to pass."""
    _, doc, _ = await api.call("GET", "/openapi.json")
    params = {p["name"]: p for p in doc["paths"]["/social/tweet/websocket"]["get"]["parameters"]}
    assert set(params) == {"since_event_id", "since_timestamp"}
    for name, param in params.items():
        assert len(param.get("description", "")) > 40, (name, param)
        assert "example" in param, (name, param)
        jsonschema.validate(param["example"], param["schema"])
    assert "event_id" in params["since_event_id"]["description"]
    assert "milliseconds" in params["since_timestamp"]["description"]


# Text values a client may send for a string parameter; each is accepted by both or refused by both.
PROBES = [
    "a",
    "from:jack",
    "abc def",
    " a ",
    "a" * STRING_MAX,
    "a" * (STRING_MAX + 1),
    "é",
    "abc\x01",
    "\u200b",
    "Latest",
    "latest",
    "Top",
    "Relevance",
    "c2J4MToyMA==",
    "1",
    "1,2",
    "1, 2",
    " 1 ,2 ",
    "1,,2",
    "1,abc",
    "\u0663",
    "12,\u0663",
    "1" * 20,
    "1" * 21,
    ",".join(["7"] * 100),
    ",".join(["7"] * 101),
]
BLANKS = ["  ", "\u00a0", "\u2003\t"]  # whitespace only: as if absent (422 when required)


def accepted(endpoint, name: str, value: str) -> bool:
    """Whether the gateway takes this value for this parameter (other parameters' errors aside)."""
    try:
        parse_args(endpoint, {name: [value.encode()]})
        return True
    except ValidationError as exc:
        return not any(d["loc"] == ["query", name] for d in exc.errors)


def test_the_openapi_schema_of_each_parameter_accepts_exactly_what_the_gateway_accepts():
    """The handler and the document read their rules from one table: no value tells them apart."""
    doc = openapi.build(twitter_alias=True, metrics_here=True)
    for endpoint in ENDPOINTS:
        operation = doc["paths"]["/social" + endpoint.path]["get"]
        schemas = {p["name"]: p["schema"] for p in operation["parameters"]}
        for param in endpoint.params:
            if param.kind == "bool":
                continue  # typed in the document; its text forms are covered by the invalid calls above
            if (
                param.kind == "int"
            ):  # the document's bounds are the ones read: just inside is accepted, just outside not
                schema = schemas[param.name]
                for number in (schema["minimum"], schema["maximum"]):
                    assert accepted(endpoint, param.name, str(number)), (endpoint.path, param.name, number)
                for number in (schema["minimum"] - 1, schema["maximum"] + 1):
                    assert not accepted(endpoint, param.name, str(number)), (endpoint.path, param.name, number)
                continue
            for value in PROBES + (BLANKS if param.required else []):
                gateway = accepted(endpoint, param.name, value)
                try:
                    jsonschema.validate(value, schemas[param.name])
                    document = True
                except jsonschema.ValidationError:
                    document = False
                assert gateway == document, (endpoint.path, param.name, value[:40], gateway, document)


@pytest.mark.settings(plan_rules=FAST)
async def test_the_upstream_is_sent_each_table_parameter_once_as_validated_and_priced(api, ctx):
    """A provider reading the first of two values, or a blank one, must not see a bigger page than was priced."""
    server, url, seen = await recorder()
    use_upstream(ctx, url)
    _, key = await api.funded_key(100_000)
    calls = {
        # repeated: the last value counts; 5 users were priced, so 5 are asked for
        "/social/user/followers?userName=jack&pageSize=200&pageSize=5&extra=1&extra=2": (
            "userName=jack&pageSize=5&extra=1&extra=2"
        ),
        # `;` is not a separator here: a provider splitting on it must not find a pageSize the price did not see
        "/social/user/followers?userName=jack;pageSize=5": "userName=jack%3BpageSize%3D5",
        # blank: as if absent, so not sent at all
        "/social/user/followers?userName=jack&pageSize=&cursor=%20": "userName=jack",
        # typed values in one spelling: integers, booleans, id lists
        "/social/user/last_tweets?userId=%2B00042&includeReplies=TRUE&userName=": "userId=%2B00042&includeReplies=true",
        "/social/user/followers_ids?userId=42&count=%2B0100&cursor=-1": "userId=42&count=100&cursor=-1",
        "/social/user/batch_info_by_ids?userIds=1,+2+,3&userIds=4,5": "userIds=4,5",
        "/social/tweets?tweet_ids=+1,%202": "tweet_ids=1,2",
        # strings exactly as sent (the last one), other parameters untouched
        "/social/user/info?userName=a%26b%3Dc%C3%A9&userName=jack%20x&x%C3%A9=%FF": "userName=jack+x&x%C3%A9=%FF",
    }
    for path, expected in calls.items():
        status, body, _ = await api.call("GET", path, key=key["key"])
        assert status == 200, (path, body)
        assert seen[-1]["query"] == expected, path
    server.stop()


async def test_unknown_data_paths_answer_in_the_data_plane_shape(api):
    unknown = [("GET", "/social/nope"), ("GET", "/twitter/user/nope"), ("POST", "/social/user/info/x")]
    for method, path in unknown + [("GET", "/social"), ("GET", "/twitter?userName=a"), ("GET", "/social/")]:
        status, body, headers = await api.call(method, path, body={})
        assert status == 404 and body["status"] == "error" and body["msg"] and set(body) == {"status", "msg"}, path
    status, body, _ = await api.call("GET", "/elsewhere")
    assert status == 404 and body == {"detail": "Not found"}  # the portal's shape outside the data plane


# --- one request id ------------------------------------------------------------------------------------------
@pytest.mark.settings(plan_rules=FAST)
async def test_the_usage_request_id_is_the_x_request_id_of_the_answer(api, catalog):
    user, key = await api.funded_key(100_000)
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    _, _, mine = await api.call("GET", path, key=key["key"], headers={"X-Request-ID": "client-7_a"})
    _, _, generated = await api.call("GET", path, key=key["key"])
    _, _, non_ascii = await api.call("GET", path, key=key["key"], headers={"X-Request-ID": "ñame²"})
    assert mine["X-Request-ID"] == "client-7_a"
    assert non_ascii["X-Request-ID"] != "ñame²" and re.fullmatch(r"[A-Za-z0-9_-]+", non_ascii["X-Request-ID"])
    _, usage, _ = await api.call("GET", "/usage", token=user["token"])
    assert [u["request_id"] for u in usage] == [non_ascii["X-Request-ID"], generated["X-Request-ID"], "client-7_a"]
    await asyncio.sleep(0.5)  # flushed: read back from the database, the same ids
    _, again, _ = await api.call("GET", "/usage", token=user["token"])
    assert again == usage


# --- one time format -----------------------------------------------------------------------------------------
def timestamps(value, key=""):
    """Every (key, value) of a JSON answer that holds a moment."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from timestamps(v, k)
    elif isinstance(value, list):
        for item in value:
            yield from timestamps(item, key)
    elif isinstance(value, str) and (key.endswith("_at") or key in ("timestamp", "last_activity")):
        yield key, value


@pytest.mark.settings(plan_rules=FAST, admin_emails="time-admin@example.com")
async def test_every_timestamp_has_one_format_and_reads_back_equal(api, ctx, catalog):
    user, key = await api.funded_key(100_000)
    auth = user["token"]
    await api.call("GET", f"/social/user/info?userName={catalog['users'][0]['userName']}", key=key["key"])
    _, created, _ = await api.call("POST", "/keys", {"name": "second"}, token=auth)
    _, listed, _ = await api.call("GET", "/keys", token=auth)
    assert next(k for k in listed if k["key_id"] == created["key_id"])["created_at"] == created["created_at"]
    _, order, _ = await api.call(
        "POST", "/billing/crypto/checkout", {"currency": "USDTTRC20", "amount_usd": 25}, token=auth
    )
    _, order_again, _ = await api.call("GET", f"/billing/crypto/orders/{order['order_id']}", token=auth)
    assert order_again["created_at"] == order["created_at"] and order_again["expires_at"] == order["expires_at"]
    admin = await api.register("time-admin@example.com")
    assert await ctx.accounts.set_admin("time-admin@example.com", True)  # the operator's `admin grant`
    answers = [created, listed, order, order_again]
    for path, token in [("/auth/me", auth), ("/account", auth), ("/usage", auth), ("/billing/crypto/orders", auth)]:
        answers.append((await api.call("GET", path, token=token))[1])
    for path in ("/admin/users", "/admin/metrics"):
        answers.append((await api.call("GET", path, token=admin["token"]))[1])
    found = [pair for answer in answers for pair in timestamps(answer)]
    assert {k for k, _ in found} >= {"created_at", "timestamp", "expires_at", "updated_at", "generated_at"}
    for name, value in found:
        assert TIME.match(value), (name, value)
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        assert parsed.tzinfo is not None and abs((datetime.now(UTC) - parsed).days) < 2


# --- bodies over MAX_BODY_BYTES ----------------------------------------------------------------------------
async def exchange(port: int, head: bytes, body_chunks, read_first: bool = False) -> tuple[bytes, object]:
    """Sends a head and body chunks while reading; returns what was read before the server stopped answering."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    answer = bytearray()

    async def read():
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                return
            answer.extend(chunk)
            if b"\r\n\r\n" in answer:
                head_end = answer.index(b"\r\n\r\n") + 4
                length = int(re.search(rb"Content-Length: (\d+)", answer[:head_end]).group(1))
                if len(answer) >= head_end + length:
                    return

    reading = asyncio.ensure_future(read())
    try:
        for chunk in body_chunks:
            writer.write(chunk)
            await writer.drain()
    except ConnectionError:
        pass
    await asyncio.wait_for(reading, 10)
    return bytes(answer), (reader, writer)


def parse(answer: bytes) -> tuple[int, dict, bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), orjson.loads(body), head


async def test_a_3_mb_body_gets_a_json_413_decided_from_its_content_length(app, settings):
    sock, port = bind_unused_port()
    server = make_server(app, settings)
    server.add_sockets([sock])
    try:
        size = 3 * 1024 * 1024
        head = f"POST /auth/register HTTP/1.1\r\nHost: x\r\nX-Request-ID: upload-7\r\nContent-Type: application/json\r\nContent-Length: {size}\r\n\r\n"
        body = [b"x" * 65536] * (size // 65536)
        answer, (reader, writer) = await exchange(port, head.encode(), body)
        status, parsed, raw_head = parse(answer)
        assert status == 413 and parsed == {"detail": f"Request body is larger than {settings.max_body_bytes} bytes"}
        assert b"\r\nX-Request-Id: upload-7\r\n" in raw_head + b"\r\n"  # the caller's id, as on every answer
        # The body was drained: the same connection serves the next request.
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        second = await asyncio.wait_for(reader.readuntil(b'{"status":"ok"}'), 5)
        assert second.startswith(b"HTTP/1.1 200 ")
        writer.close()
        # Answered from the head alone: nothing of the body has to be sent first.
        answer, (_, writer) = await exchange(port, head.encode(), [])
        assert parse(answer)[0] == 413
        writer.close()
        # The data plane answers in its own shape; a client waiting for 100-continue gets the 413 instead.
        data_head = f"GET /social/user/info?userName=a HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: {size}\r\n\r\n"
        answer, (_, writer) = await exchange(port, data_head.encode(), [])
        status, parsed, raw_head = parse(answer)
        assert status == 413 and parsed["status"] == "error" and b"100 Continue" not in answer
        assert re.search(rb"\r\nX-Request-Id: [0-9a-f]{20}\r\n", raw_head + b"\r\n")  # generated when none was sent
        writer.close()
        # A chunked body is cut at the limit with the same 413, and the connection closed.
        chunked = b"POST /keys HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        piece = b"x" * 16384
        chunks = [b"%x\r\n%s\r\n" % (len(piece), piece)] * (settings.max_body_bytes // len(piece) + 4)
        answer, (reader, writer) = await exchange(port, chunked, chunks)
        status, parsed, _ = parse(answer)
        assert status == 413 and parsed["detail"].startswith("Request body is larger")
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
    finally:
        server.stop()


# --- HEAD, the catalog ---------------------------------------------------------------------------------------
async def test_head_works_on_health_checks(http_client, base_url):
    for path in ("/healthz", "/readyz"):
        response = await http_client.fetch(base_url + path, method="HEAD", raise_error=False)
        assert response.code == 200 and response.body == b"" and int(response.headers["Content-Length"]) > 0, path


async def test_the_gateway_serves_the_sandbox_catalog_in_development(api, catalog):
    status, body, _ = await api.call("GET", "/sandbox/catalog")
    assert status == 200 and body == catalog


@pytest.mark.settings(env="production")
async def test_no_sandbox_catalog_in_production(api):
    status, body, _ = await api.call("GET", "/sandbox/catalog")
    assert status == 404 and body == {"detail": "Not found"}


def test_the_spec_page_lists_every_endpoint_and_parameter_of_the_table():
    with open(__file__.replace("tests/data/test_contract.py", "docs/spec.md")) as fh:
        rows = {line.split("|")[1].strip(" `"): line for line in fh if line.startswith("| `/social/")}
    assert set(rows) == {"/social" + e.path for e in ENDPOINTS}
    for endpoint in ENDPOINTS:
        row = rows["/social" + endpoint.path]
        for param in endpoint.params:
            assert f"`{param.name}`" in row, (endpoint.path, param.name)
        for choice in next((p.choices for p in endpoint.params if p.choices), ()):
            assert choice in row
        assert ("one of" in row) == bool(endpoint.one_of) and ("501" in row) == (not endpoint.available)


# --- portal limits: the document's are the ones enforced ---------------------------------------------------
async def test_the_key_property_limits_the_document_states_are_the_ones_enforced(api):
    """Each bound read from the document: a body at it is accepted, one past it gets 422 on that field."""
    schemas = openapi.build(twitter_alias=True, metrics_here=True)["components"]["schemas"]
    props = {
        name: schema["anyOf"][0] for name, schema in schemas["KeyCreate"]["properties"].items() if "anyOf" in schema
    }
    user = await api.register()
    endpoints, ips = props["allowed_endpoints"]["maxItems"], props["allowed_ips"]["maxItems"]
    ip_text, most = props["allowed_ips"]["items"]["maxLength"], props["credit_limit"]["maximum"]
    period = props["credit_limit_period"]["enum"][-1]
    at_limit = {
        "allowed_endpoints": ["/user/info"] * endpoints,
        "allowed_ips": ["10.0.0.1".rjust(ip_text)] + ["10.0.0.2"] * (ips - 1),
        "credit_limit": most,
        "credit_limit_period": period,
    }
    status, body, _ = await api.call("POST", "/keys", at_limit, token=user["token"])
    assert status == 200, body
    past = [
        ({"allowed_endpoints": ["/user/info"] * (endpoints + 1)}, ["body", "allowed_endpoints"]),
        ({"allowed_ips": ["10.0.0.2"] * (ips + 1)}, ["body", "allowed_ips"]),
        ({"allowed_ips": ["10.0.0.1".rjust(ip_text + 1)]}, ["body", "allowed_ips", 0]),
        ({"credit_limit": most + 1, "credit_limit_period": period}, ["body", "credit_limit"]),
    ]
    for change, loc in past:
        status, body, _ = await api.call("POST", "/keys", change, token=user["token"])
        assert status == 422 and loc in [d["loc"] for d in body["detail"]], (change, body)
    grace = schemas["Roll"]["properties"]["grace_seconds"]["maximum"]
    key_id = (await api.call("POST", "/keys", {}, token=user["token"]))[1]["key_id"]
    status, body, _ = await api.call("POST", f"/keys/{key_id}/roll", {"grace_seconds": grace + 1}, token=user["token"])
    assert status == 422 and body["detail"][0]["loc"] == ["body", "grace_seconds"], body
    status, body, _ = await api.call("POST", f"/keys/{key_id}/roll", {"grace_seconds": grace}, token=user["token"])
    assert status == 200, body
