"""Operations: the OpenAPI round trip, /docs, health and readiness transitions, Prometheus metrics,
access logs without secrets, trusted proxies, and the SIGHUP reload."""

import dataclasses
import io
import logging
import os
import re
import time

import openapi_schema_validator
import orjson
import pytest
import tornado.httpserver
import tornado.testing
import tornado.web
from openapi_spec_validator import validate
from prometheus_client.parser import text_string_to_metric_families
from support import PASSWORD, UPSTREAM_KEY
from tornado.httpclient import AsyncHTTPClient, HTTPRequest

import config
import gateway
from app.context import build_context
from app.embedded import EmbeddedMongo, free_port
from config import logs
from handlers import ops
from runtime import accesslog
from runtime.accesslog import AccessLog
from social.endpoints import ENDPOINTS

pytestmark = [pytest.mark.gen_test(timeout=60), pytest.mark.settings(admin_emails="ops-admin@example.com")]


def app_operations(app: tornado.web.Application) -> set:
    """(method, path) for every route of the application, path parameters written as {}."""
    found = set()
    for rule in app.wildcard_router.rules:
        if issubclass(rule.target, tornado.web.StaticFileHandler):
            continue  # files (portal assets), not API operations
        path = re.sub(r"\\(.)", r"\1", re.sub(r"\([^)]*\)", "{}", rule.matcher.regex.pattern.rstrip("$")))
        for method in ("get", "post", "put", "patch", "delete"):
            if getattr(rule.target, method) is not getattr(tornado.web.RequestHandler, method):
                found.add((method, path))
    return found


def document_operations(doc: dict) -> set:
    return {(method, re.sub(r"\{[^}]*\}", "{}", path)) for path, item in doc["paths"].items() for method in item}


async def test_openapi_document_is_valid_and_matches_the_routes(api, app):
    status, doc, headers = await api.call("GET", "/openapi.json?aliases=true")
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    validate(doc)  # raises on any violation of the OpenAPI 3.1 schema
    assert doc["openapi"] == "3.1.0" and doc["info"]["version"] == "0.1.0"
    in_app, in_doc = app_operations(app), document_operations(doc)
    assert in_app - in_doc == set(), "routes missing from the document"
    assert in_doc - in_app == set(), "documented operations the application does not serve"


async def test_docs_list_each_data_endpoint_once_with_described_parameters_and_sandbox_examples(api, catalog):
    """/docs reads the default document: /social only (the /twitter alias behind ?aliases=true), and every data
    parameter says what it is and carries an example the sandbox answers."""
    _, doc, _ = await api.call("GET", "/openapi.json")
    data = [p for p in doc["paths"] if p.startswith(("/social/", "/twitter/")) and not p.endswith("/websocket")]
    assert sorted(data) == sorted("/social" + e.path for e in ENDPOINTS)  # each once
    assert [p for p in doc["paths"] if p.endswith("/websocket")] == ["/social/tweet/websocket"]  # the socket too
    assert "/twitter" in doc["info"]["description"]  # where the alias went is said
    examples = {}
    for path in data:
        for param in doc["paths"][path]["get"]["parameters"]:
            if param["in"] == "query":
                assert param.get("description"), (path, param["name"])
                assert "example" in param, (path, param["name"])
                examples[param["name"]] = param["example"]
    assert examples["userName"] in [u["userName"] for u in catalog["users"]]
    assert examples["userId"] in [u["id"] for u in catalog["users"]]
    assert examples["tweetId"] in catalog["tweets"] and examples["listId"] in catalog["lists"]
    assert examples["community_id"] in catalog["communities"] and examples["space_id"] in catalog["spaces"]
    status, body, _ = await api.call("GET", "/openapi.json?aliases=maybe")
    assert status == 422 and body["detail"][0]["loc"] == ["query", "aliases"]


@pytest.mark.settings(twitter_alias=False, metrics_port=free_port())
async def test_openapi_follows_the_application_shape(api, app):
    status, doc, _ = await api.call("GET", "/openapi.json")
    validate(doc)
    assert not any(p.startswith("/twitter/") for p in doc["paths"]) and "/metrics" not in doc["paths"]
    assert app_operations(app) == document_operations(doc)


async def test_data_paths_come_from_the_endpoint_table(api):
    _, doc, _ = await api.call("GET", "/openapi.json")
    schemes = doc["components"]["securitySchemes"]
    assert schemes["apiKey"] == {"type": "apiKey", "in": "header", "name": "X-API-Key"}
    assert schemes["bearerAuth"]["scheme"] == "bearer"
    for endpoint in ENDPOINTS:
        op = doc["paths"]["/social" + endpoint.path]["get"]
        assert op["security"] == [{"apiKey": []}]
        queried = [p for p in op["parameters"] if p["in"] == "query"]
        assert [(p["name"], p["required"]) for p in queried] == [(p.name, p.required) for p in endpoint.params]
        assert [(p["in"], p["name"]) for p in op["parameters"] if p not in queried] == [
            ("header", "Idempotency-Key"),
            ("header", "Cache-Control"),  # the answer cache: no-cache, max-age=N (issue 36)
        ]
        if endpoint.available:
            assert {"X-Cache", "Age", "X-Crawl-Guard"} <= set(op["responses"]["200"]["headers"])
        kinds = {p.name: p.kind for p in endpoint.params}
        for param in queried:
            expected = {"int": "integer", "bool": "boolean"}.get(kinds[param["name"]], "string")
            assert param["schema"]["type"] == expected, (endpoint.path, param["name"])
        responses = op["responses"]
        assert responses["422"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/ValidationError"
        }
        assert responses["401"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/DataError"}
        if endpoint.available:
            assert {"200", "401", "402", "422", "429"} <= set(responses)
            body = responses["200"]["content"]["application/json"]["schema"]
            assert {"status", endpoint.msg_key, endpoint.results} <= set(body["properties"])
            assert ("has_next_page" in body["properties"]) == endpoint.paged
        else:
            assert "501" in responses and "200" not in responses and "402" not in responses
    validation = doc["components"]["schemas"]["ValidationError"]["properties"]["detail"]["items"]
    assert set(validation["required"]) == {"loc", "msg", "type"}
    assert doc["paths"]["/auth/me"]["get"]["security"] == [{"bearerAuth": []}]
    assert doc["paths"]["/keys/{key_id}/reveal"]["get"]["parameters"][0]["schema"] == {"type": "integer"}
    assert "404" in doc["paths"]["/keys/{key_id}/reveal"]["get"]["responses"]


async def test_answers_match_their_documented_schemas(api, ctx):
    """Real answers of the operations this module owns, checked against the document they are described in."""
    _, doc, _ = await api.call("GET", "/openapi.json")
    admin = (await api.call("POST", "/auth/register", {"email": ctx.settings.admin_emails[0], "password": PASSWORD}))[1]
    assert await ctx.accounts.set_admin(ctx.settings.admin_emails[0], True)  # the operator's `admin grant`
    user, key = await api.funded_key(100_000)
    for method, path, query, token, status in [
        ("get", "/healthz", "", None, 200),
        ("get", "/readyz", "", None, 200),
        ("get", "/admin/metrics", "?days=3", admin["token"], 200),
        ("get", "/admin/users", "?limit=1", admin["token"], 200),
        ("get", "/admin/users", "", user["token"], 403),
        ("get", "/admin/metrics", "?days=0", admin["token"], 422),
        ("get", "/account", "", user["token"], 200),
        ("get", "/keys", "", user["token"], 200),
        ("get", "/audit", "", user["token"], 200),
        ("get", "/admin/audit", "?limit=1", admin["token"], 200),
        ("get", "/auth/2fa", "", user["token"], 200),
        ("get", "/auth/me", "", user["token"], 200),
    ]:
        code, body, _ = await api.call(method.upper(), path + query, token=token)
        assert code == status, (path, body)
        schema = doc["paths"][path][method]["responses"][str(status)]["content"]["application/json"]["schema"]
        openapi_schema_validator.validate(
            body, {**schema, "components": doc["components"]}, cls=openapi_schema_validator.OAS31Validator
        )


async def test_documented_limits_are_the_enforced_limits(api, ctx):
    """Every portal limit the document states is the one the handler applies, on both sides of the bound."""
    _, doc, _ = await api.call("GET", "/openapi.json")
    admin = (await api.call("POST", "/auth/register", {"email": ctx.settings.admin_emails[0], "password": PASSWORD}))[1]
    assert await ctx.accounts.set_admin(ctx.settings.admin_emails[0], True)  # the operator's `admin grant`
    user, key = await api.funded_key(100_000)
    checked = 0
    for path, item in doc["paths"].items():
        if path.startswith(("/social/", "/twitter/")):
            continue  # the data plane's table has its own tests (test_social.py, test_security.py)
        if "{" in path:
            continue  # an object's page (a webhook's deliveries): the same Field, tested with the object (test_webhooks.py)
        for param in item.get("get", {}).get("parameters", []):
            schema, name = param["schema"], param["name"]
            if schema.get("type") != "integer" or param["in"] != "query":
                continue
            token = admin["token"] if path.startswith("/admin") else user["token"]
            for value, expected in (
                (schema["minimum"], None),
                (schema["maximum"], None),
                (schema["minimum"] - 1, "greater_than_equal"),
                (schema["maximum"] + 1, "less_than_equal"),
            ):
                status, body, _ = await api.call("GET", f"{path}?{name}={value}", token=token)
                if expected is None:
                    assert status == 200, (path, name, value, body)
                else:
                    assert status == 422 and body["detail"][0]["loc"] == ["query", name], (path, name, value, body)
                    assert body["detail"][0]["type"] == expected
            checked += 1
    assert checked >= 5  # /usage days and limit, orders limit, admin days and limit
    schemas = doc["components"]["schemas"]
    most = schemas["TopUp"]["properties"]["credits"]["maximum"]
    topup = f"/keys/{key['key_id']}/topup"
    status, body, _ = await api.call("POST", topup, {"credits": most + 1}, token=user["token"])
    assert status == 422 and body["detail"][0]["type"] == "less_than_equal"
    assert (await api.call("POST", topup, {"credits": most}, token=user["token"]))[0] == 200
    longest = schemas["KeyCreate"]["properties"]["name"]["anyOf"][0]["maxLength"]
    status, body, _ = await api.call("POST", "/keys", {"name": "k" * (longest + 1)}, token=user["token"])
    assert status == 422 and body["detail"][0]["type"] == "string_too_long"
    assert (await api.call("POST", "/keys", {"name": "k" * longest}, token=user["token"]))[0] == 200
    shortest = schemas["Credentials"]["properties"]["password"]["minLength"]
    status, body, _ = await api.call(
        "POST", "/auth/register", {"email": "p@example.com", "password": "abcdefghij"[: shortest - 1]}
    )
    assert status == 422 and body["detail"][0]["type"] == "string_too_short"
    amount = schemas["Checkout"]["properties"]["amount_usd"]
    for value, expected in (
        (amount["maximum"] * 1.01, "less_than_equal"),
        (amount["exclusiveMinimum"], "greater_than"),
    ):
        status, body, _ = await api.call(
            "POST", "/billing/crypto/checkout", {"currency": "BTC", "amount_usd": value}, token=user["token"]
        )
        assert status == 422 and body["detail"][0]["loc"] == ["body", "amount_usd"], body
        assert body["detail"][0]["type"] == expected


async def test_docs_page_is_swagger_ui_served_offline(api, http_client, base_url):
    response = await http_client.fetch(base_url + "/docs")
    assert response.code == 200 and response.headers["Content-Type"].startswith("text/html")
    page = response.body.decode()
    policy = response.headers["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "script-src 'self';" in policy and "connect-src 'self'" in policy
    assert "unsafe" not in policy
    assert "<script>" not in page and "http" not in page  # no inline script, nothing from another origin
    scripts = re.findall(r'<script src="([^"]+)"', page)
    assert any("/docs/assets/swagger-ui-bundle.js?v=" in s for s in scripts), scripts
    for src in scripts + re.findall(r'<link rel="stylesheet" href="([^"]+)"', page):
        asset = await http_client.fetch(base_url + src)
        assert asset.code == 200 and asset.body, src
    missing = await http_client.fetch(base_url + "/docs/assets/swagger-editor.js", raise_error=False)
    assert missing.code == 404  # only the files the page needs are served from the package


# --- health and readiness ------------------------------------------------------------------------------
async def test_healthz(api):
    status, body, headers = await api.call("GET", "/healthz")
    assert status == 200 and body == {"status": "ok"} and headers["X-Request-ID"]


async def test_readiness_follows_breaker_buffer_and_draining(api, ctx):
    status, body, _ = await api.call("GET", "/readyz")
    assert status == 200 and body["status"] == "ready"
    assert body["checks"] == {
        "database": "ok",
        "upstream_breaker": "closed",
        "draining": False,
        "usage_buffer": {"depth": 0, "max": ctx.settings.buffer_max},
        "outbound": "open",  # held only on a restored database (tests/operations/test_backup.py)
    }
    breaker = ctx.upstream.breaker
    for _ in range(breaker.threshold):
        breaker.failure()
    status, body, _ = await api.call("GET", "/readyz")
    assert status == 503 and body["checks"]["upstream_breaker"] == "open"
    breaker.success()
    ctx.meter.buffer.max_records = 0  # the bound the data plane fails closed at
    status, body, _ = await api.call("GET", "/readyz")
    assert status == 503 and body["status"] == "not ready"
    ctx.meter.buffer.max_records = ctx.settings.buffer_max
    ctx.draining = True
    assert (await api.call("GET", "/readyz"))[0] == 503
    ctx.draining = False
    assert (await api.call("GET", "/readyz"))[0] == 200


def test_the_embedded_database_yields_the_cores_and_the_sandbox_does_not(helpers):
    """start_helpers runs the database at EMBEDDED_DB_NICE (10 by default); the sandbox answers calls in
    flight, so it keeps the gateway's priority."""
    mongo = next(p for p in helpers.processes if isinstance(p, EmbeddedMongo))
    sandbox = next(p for p in helpers.processes if not isinstance(p, EmbeddedMongo))
    own = os.getpriority(os.PRIO_PROCESS, 0)
    assert helpers.settings.embedded_db_nice == 10
    assert os.getpriority(os.PRIO_PROCESS, mongo.process.pid) == min(own + 10, 19)
    assert os.getpriority(os.PRIO_PROCESS, sandbox.pid) == own


async def test_database_stopped_means_not_ready(settings, upstream_url):
    server = EmbeddedMongo(":memory:").start()
    ctx = await build_context(dataclasses.replace(settings, mongodb_uri=server.uri, upstream_url=upstream_url))
    http = tornado.httpserver.HTTPServer(gateway.make_app(ctx))
    sock, port = tornado.testing.bind_unused_port()
    http.add_sockets([sock])
    client = AsyncHTTPClient()
    url = f"http://127.0.0.1:{port}"
    try:
        response = await client.fetch(url + "/readyz", raise_error=False)
        assert response.code == 200
        server.kill()
        started = time.monotonic()
        response = await client.fetch(url + "/readyz", raise_error=False)
        assert response.code == 503 and time.monotonic() - started < 3
        assert orjson.loads(response.body)["checks"]["database"] == "unreachable"
        assert (await client.fetch(url + "/healthz", raise_error=False)).code == 200  # alive all the same
    finally:
        http.stop()
        server.stop()
        ctx.upstream.close()
        ctx.executor.shutdown(wait=False)
        await ctx.client.close()


# --- Prometheus -------------------------------------------------------------------------------------------
def samples(text: str) -> dict:
    """{(name, frozenset(labels)): value} of a text exposition."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_metrics_exposition(api, ctx, catalog, http_client, base_url):
    user, key = await api.funded_key(100_000)
    name = catalog["big_accounts"][0]
    assert (await api.call("GET", f"/social/user/info?userName={name}", key=key["key"]))[0] == 200
    assert (await api.call("GET", "/social/user/info", key=key["key"]))[0] == 422
    await api.call("GET", f"/keys/{key['key_id']}/reveal", token=user["token"])
    await api.call("GET", "/keys/999999/reveal", token=user["token"])
    await api.call("GET", "/no/such/path/12345")
    for path in ("/keys/777/reveal", "/nope/888"):  # methods Tornado does not support: 405 before routing args
        await http_client.fetch(
            HTTPRequest(base_url + path, method="PROPFIND", allow_nonstandard_methods=True), raise_error=False
        )
    poor, poor_key = await api.funded_key(1)
    assert (await api.call("GET", f"/social/user/info?userName={name}", key=poor_key["key"]))[0] == 402
    await ctx.meter.flush()
    response = await http_client.fetch(base_url + "/metrics")
    assert response.headers["Content-Type"].startswith("text/plain")
    values = samples(response.body.decode())
    # A single process is worker 0 (serve --workers N: tests/operations/test_scrape.py).
    get = lambda name, **labels: values.get((name, frozenset({**labels, "worker": "0"}.items())))
    assert get("gateway_build_info", version=config.VERSION) == 1
    assert get("gateway_requests_total", route="/social/user/info", status="200") == 1
    assert get("gateway_requests_total", route="/keys/{}/reveal", status="200") == 1
    assert get("gateway_requests_total", route="/keys/{}/reveal", status="404") == 1
    assert get("gateway_requests_total", route="(unmatched)", status="404") == 1
    assert not any(n in str(labels) for n in ("12345", "999999", "777", "888") for _, labels in values)  # bounded
    assert get("gateway_request_duration_seconds_count", route="/social/user/info") == 3
    assert get("gateway_request_duration_seconds_bucket", route="/social/user/info", le="+Inf") == 3
    assert get("gateway_payment_required_total") == 1
    assert get("gateway_rate_limited_total") == 0
    assert get("gateway_credits_charged_total") == ctx.metrics.credits_charged > 0
    assert get("gateway_upstream_latency_seconds_count", route="/social/user/info") == 1  # the one call sent
    assert get("gateway_upstream_latency_seconds_bucket", route="/social/user/info", le="+Inf") == 1
    assert get("gateway_upstream_breaker_state") == 0
    assert get("gateway_cache_hits_total", cache="key") >= 1 and get("gateway_cache_hit_ratio", cache="key") > 0
    assert get("gateway_usage_flushes_total") >= 1 and get("gateway_usage_flushed_records_total") >= 1
    assert get("gateway_usage_buffer_records") == 0 and get("gateway_usage_flush_lag_seconds") == 0
    assert get("gateway_usage_buffer_capacity") == ctx.settings.buffer_max
    assert get("process_resident_memory_bytes") > 0
    # The same figures in OpenMetrics for a scraper that asks for it (Prometheus does).
    negotiated = await http_client.fetch(base_url + "/metrics", headers={"Accept": "application/openmetrics-text"})
    assert negotiated.headers["Content-Type"].startswith("application/openmetrics-text")
    assert negotiated.body.decode().endswith("# EOF\n")


@pytest.mark.settings(metrics_token="scrape-token-0123456789")
async def test_metrics_token(http_client, base_url):
    response = await http_client.fetch(base_url + "/metrics", raise_error=False)
    assert response.code == 401 and orjson.loads(response.body) == {"detail": "Not authenticated"}
    bad = await http_client.fetch(base_url + "/metrics", headers={"Authorization": "Bearer nope"}, raise_error=False)
    assert bad.code == 401
    good = await http_client.fetch(base_url + "/metrics", headers={"Authorization": "Bearer scrape-token-0123456789"})
    assert good.code == 200 and b"gateway_requests_total" in good.body


@pytest.mark.settings(metrics_port=free_port())
async def test_metrics_on_their_own_port(ctx, http_client, base_url):
    assert (await http_client.fetch(base_url + "/metrics", raise_error=False)).code == 404
    server = tornado.httpserver.HTTPServer(ops.metrics_app(ctx.view))
    sock, port = tornado.testing.bind_unused_port()
    server.add_sockets([sock])
    try:
        response = await http_client.fetch(f"http://127.0.0.1:{port}/metrics")
        assert response.code == 200 and b"gateway_usage_buffer_records" in response.body
        assert (await http_client.fetch(f"http://127.0.0.1:{port}/healthz", raise_error=False)).code == 404
    finally:
        server.stop()


# --- access logs -----------------------------------------------------------------------------------------
def access_lines(caplog) -> list[dict]:
    return [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "gateway.access"]


async def test_access_log_lines_carry_no_secrets(api, ctx, catalog, caplog):
    caplog.set_level(logging.DEBUG)  # everything any logger writes, not only the access log
    user, key = await api.funded_key(100_000)
    await api.call("POST", "/auth/login", {"email": user["email"], "password": PASSWORD})
    await api.call("GET", f"/keys/{key['key_id']}/reveal", token=user["token"])
    status, _, headers = await api.call(
        "GET",
        f"/social/user/info?userName={catalog['big_accounts'][0]}",
        key=key["key"],
        headers={"X-Request-ID": "trace-42_a"},
    )
    assert status == 200 and headers["X-Request-ID"] == "trace-42_a"
    await api.call("GET", "/account", token=user["token"] + "x")
    await api.call("GET", "/social/user/info?userName=x", key=key["key"][:-3] + "abc")
    lines = access_lines(caplog)
    data = next(line for line in lines if line["request_id"] == "trace-42_a")
    assert data["route"] == "/social/user/info" and data["status"] == 200 and data["key_id"] == key["key_id"]
    assert (
        data["account"] == user["account_id"] and data["credits"] > 0 and data["ms"] >= 0 and data["ip"] == "127.0.0.1"
    )
    assert all({"request_id", "method", "route", "status", "ms", "account"} <= set(line) for line in lines)
    text = caplog.text
    for secret in (
        PASSWORD,
        user["token"],
        key["key"],
        key["key"][4:],
        UPSTREAM_KEY,
        ctx.settings.jwt_secret,
        ctx.settings.secrets_key,
    ):
        assert secret not in text


def test_batched_access_lines_are_the_lines_logging_would_write():
    """runtime/accesslog.py formats its lines itself (off the request path): byte for byte what the
    `logging` setup of gateway.main would have written for the same record."""
    stream, expected = io.StringIO(), io.StringIO()
    access = AccessLog(stream)
    handler = logging.StreamHandler(expected)
    handler.setFormatter(logging.Formatter(logs.TEXT_FORMAT))
    for created in (1_700_000_000.0, 1_700_000_000.999_9, 1_700_000_059.5, 1_700_003_600.001):
        fields = {"request_id": "r1", "method": "GET", "route": "/social/user/info", "status": 200, "ms": 1.5}
        access.waiting.append((created, orjson.dumps(fields)))
        record = logging.LogRecord(
            accesslog.LOGGER, logging.INFO, __file__, 1, "%s", (orjson.dumps(fields).decode(),), None
        )
        record.created, record.msecs = created, (created - int(created)) * 1000
        handler.emit(record)
    access.flush()
    assert stream.getvalue() == expected.getvalue() and access.waiting == []


def test_json_access_lines_are_one_object_each_in_the_shape_of_every_log_line():
    """LOG_FORMAT=json: a batched access line is the object config/logs.py's formatter writes (time in ISO
    8601 UTC, level, logger, message), with the request's fields after it."""
    stream, expected = io.StringIO(), io.StringIO()
    access = AccessLog(stream, as_json=True)
    handler = logging.StreamHandler(expected)
    handler.setFormatter(logs.JsonFormatter())
    for created in (1_700_000_000.0, 1_700_000_000.999_9, 1_700_003_600.001):
        access.write({"request_id": "r1", "method": "GET", "route": "/social/user/info", "status": 200, "ms": 1.5})
        access.waiting[-1] = (created, access.waiting[-1][1])
        record = logging.LogRecord(accesslog.LOGGER, logging.INFO, __file__, 1, "GET /social/user/info 200", (), None)
        record.created, record.request_id = created, "r1"
        handler.emit(record)
    access.flush()
    for line, logged in zip(stream.getvalue().splitlines(), expected.getvalue().splitlines(), strict=True):
        data, shape = orjson.loads(line), orjson.loads(logged)
        assert list(data)[:5] == ["time", "level", "logger", "message", "request_id"]
        assert {k: data[k] for k in shape} == shape and data["route"] == "/social/user/info"
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", data["time"])


async def test_request_id_is_generated_when_unusable(api, caplog):
    caplog.set_level(logging.INFO, logger="gateway.access")
    _, _, headers = await api.call("GET", "/healthz", headers={"X-Request-ID": 'bad id", "forged": "1'})
    generated = headers["X-Request-ID"]
    assert re.fullmatch(r"[0-9a-f]{12,64}", generated)
    assert access_lines(caplog)[-1]["request_id"] == generated


@pytest.mark.settings(access_log=False)
async def test_access_log_can_be_turned_off(api, caplog):
    caplog.set_level(logging.INFO, logger="gateway.access")
    await api.call("GET", "/healthz")
    assert access_lines(caplog) == []


@pytest.mark.settings(trusted_proxies="127.0.0.0/8, 10.0.0.0/8")
async def test_forwarded_address_from_a_trusted_proxy(api, caplog):
    caplog.set_level(logging.INFO, logger="gateway.access")
    await api.call("GET", "/healthz", headers={"X-Forwarded-For": "6.6.6.6, 203.0.113.9, 10.1.2.3"})
    await api.call("GET", "/healthz", headers={"X-Real-IP": "198.51.100.4"})
    await api.call("GET", "/healthz", headers={"X-Forwarded-For": "10.0.0.5"})
    await api.call("GET", "/healthz", headers={"X-Forwarded-For": "not-an-ip"})
    # The client is the nearest address that is not one of our proxies; what it wrote before that is ignored.
    assert [line["ip"] for line in access_lines(caplog)] == ["203.0.113.9", "198.51.100.4", "10.0.0.5", "127.0.0.1"]


async def test_forwarded_address_ignored_from_anyone_else(api, caplog):
    caplog.set_level(logging.INFO, logger="gateway.access")
    await api.call("GET", "/healthz", headers={"X-Forwarded-For": "203.0.113.9", "X-Real-IP": "198.51.100.4"})
    assert access_lines(caplog)[-1]["ip"] == "127.0.0.1"


# --- SIGHUP -----------------------------------------------------------------------------------------------
async def test_reload_swaps_prices_and_plans(api, ctx, tmp_path):
    user, key = await api.funded_key(100_000)
    assert (await api.call("GET", "/account", token=user["token"]))[1]["qps_limit"] == 20
    config_file = tmp_path / "gateway.toml"
    config_file.write_text(
        "price_rules = { minimum = 40 }\n"
        'plan_rules = [{ name = "free", min_paid_usd = 0, qps = 0.5 }, '
        '{ name = "paid", min_paid_usd = 0.01, qps = 7 }]\n'
    )
    assert gateway.reload(ctx, {"CONFIG_FILE": str(config_file)})
    assert ctx.prices.minimum == 40 and ctx.meter.settings is ctx.settings
    status, account, _ = await api.call("GET", "/account", token=user["token"])
    assert account["qps_limit"] == 7 and account["plan"] == "paid"
    status, listed, _ = await api.call("GET", "/keys", token=user["token"])
    assert listed[0]["qps_limit"] == 7
    config_file.write_text('plan_rules = "not a list"\n')
    assert not gateway.reload(ctx, {"CONFIG_FILE": str(config_file)})
    assert ctx.prices.minimum == 40 and (await api.call("GET", "/account", token=user["token"]))[1]["qps_limit"] == 7


@pytest.mark.settings(cache_max_bytes=1 << 20, cache_ttl={"user/info": 1800})
async def test_the_price_sheet_the_documents_prices_and_the_charges_follow_a_reload(api, ctx, tmp_path, catalog):
    """Issue 47 (7): GET /prices (public) and each data operation of /openapi.json say what the running price rules
    charge and how long an answer stays fresh; after a SIGHUP reload all three, charges included, say the new."""

    def info_row(sheet: dict) -> dict:
        return next(row for row in sheet["endpoints"] if row["endpoint"] == "/user/info")

    def described(doc: dict) -> str:
        return doc["paths"]["/social/user/info"]["get"]["description"]

    status, sheet, _ = await api.call("GET", "/prices")
    assert status == 200 and info_row(sheet) == {
        "endpoint": "/user/info",
        "available": True,
        "price": "18 per profile",
        "minimum": 15,
        "page_size": 1,
        "full_page": 18,
        "fresh_seconds": 1800,  # CACHE_TTL's, over the default 900
    }
    trends = next(row for row in sheet["endpoints"] if row["endpoint"] == "/trends")
    assert trends["price"] == "15 per call" and trends["fresh_seconds"] == 300
    doc = (await api.call("GET", "/openapi.json"))[1]
    assert "18 per profile" in described(doc) and "fresh 1,800 s" in described(doc)

    config_file = tmp_path / "gateway.toml"
    config_file.write_text("price_rules = { profiles = { each = 25 } }\n")
    assert gateway.reload(ctx, {"CONFIG_FILE": str(config_file)})
    assert info_row((await api.call("GET", "/prices"))[1])["price"] == "25 per profile"
    assert "25 per profile" in described((await api.call("GET", "/openapi.json"))[1])
    _, key = await api.funded_key(100_000)
    status, _, headers = await api.call(
        "GET", f"/social/user/info?userName={catalog['users'][0]['userName']}", key=key["key"]
    )
    assert status == 200 and headers["X-Credits-Charged"] == "25"  # charged as the sheet says
