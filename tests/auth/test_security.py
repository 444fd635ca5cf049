"""Attack tests (OWASP API Security Top 10, 2023): brute force and enumeration, credential
confusion, broken object-level authorisation, admin routes, resource consumption, injection and
SSRF, secrets at rest and in logs. JWT forgery cases and BOLA on keys live in test_portal.py;
upstream faults in test_social.py."""

import asyncio
import logging
import re
import secrets
import statistics
import time
import uuid

import orjson
import pytest
import tornado.web
from cryptography.exceptions import InvalidTag
from support import FAST, PASSWORD, count_key_lookups, qs, recorder, use_upstream, valid_query
from tornado.testing import bind_unused_port

import config
from app.server import make_server
from handlers.auth import handlers as auth
from handlers.auth import reset, twofactor
from handlers.billing import handlers as billing
from handlers.keys import handlers as keys
from security.apikeys import KeyVault
from security.throttle import LoginThrottle
from social.endpoints import CURSOR_MAX, ENDPOINTS, STRING_MAX

pytestmark = pytest.mark.gen_test(timeout=60)

LOGIN = "/auth/login"
WRONG = "wrong password 123"
# Background tasks that touch the database on their own schedule, pushed out of a short test.
QUIET = dict(
    lease_timeout=3600,
    reconcile_interval=3600,
    **({"coherence": "off"} if "coherence" in config.Settings.__dataclass_fields__ else {}),
)


def login(api, email, password=PASSWORD, headers=None):
    return api.call("POST", LOGIN, {"email": email, "password": password}, headers=headers)


def app_routes(app: tornado.web.Application) -> list[tuple[str, type]]:
    return [(rule.matcher.regex.pattern, rule.target) for rule in app.wildcard_router.rules]


def methods_of(handler: type) -> list[str]:
    return [
        m.upper()
        for m in ("get", "post", "put", "patch", "delete")
        if getattr(handler, m) is not getattr(tornado.web.RequestHandler, m)
    ]


async def raw_exchange(port: int, data: bytes, timeout: float = 5.0) -> tuple[bytes, float]:
    """Sends raw bytes, reads until the server closes the connection; (everything read, seconds taken)."""
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout)
    except (ConnectionResetError, BrokenPipeError):  # cut off while we were still sending
        answer = b""
    finally:
        writer.close()
    return answer, time.monotonic() - started


async def serve_with_limits(app, settings) -> tuple[object, int]:
    """The app behind the same HTTPServer (and limits) as `gateway.serve`."""
    sock, port = bind_unused_port()
    server = make_server(app, settings)
    server.add_sockets([sock])
    return server, port


# --- login throttling: the pure counter --------------------------------------------------------
def test_throttle_locks_an_email_for_one_network_after_its_failures_for_the_rest_of_the_window():
    throttle = LoginThrottle(max_failures=3, window=900, max_attempts=1000)
    for i in range(3):
        assert throttle.check("10.0.0.1", "a@x.io", 100.0 + i) == 0
    assert throttle.check("10.0.0.1", "a@x.io", 110.0) == 890  # first failure at 100 + 900 - 110
    assert throttle.check("10.0.0.2", "a@x.io", 110.0) == 890  # from anywhere in the same /24
    assert throttle.check("10.0.1.2", "a@x.io", 110.0) == 0  # another network (the owner's) is not locked out
    assert throttle.check("10.0.0.1", "b@x.io", 110.0) == 0  # other emails are not affected
    assert throttle.check("10.0.0.1", "a@x.io", 1000.5) == 0  # the oldest failure left the window


def test_throttle_refused_attempts_do_not_extend_the_lockout():
    throttle = LoginThrottle(max_failures=2, window=60, max_attempts=1000)
    throttle.check("ip", "a@x.io", 0.0)
    throttle.check("ip", "a@x.io", 1.0)
    for t in range(2, 60):
        assert throttle.check("ip", "a@x.io", float(t)) > 0
    assert throttle.check("ip", "a@x.io", 60.0) == 0


def test_throttle_success_forgets_the_failures():
    throttle = LoginThrottle(max_failures=3, window=900, max_attempts=1000)
    for i in range(2):
        throttle.check("ip", "a@x.io", float(i))
    throttle.succeeded("a@x.io", "ip")
    for i in range(3):
        assert throttle.check("ip", "a@x.io", 10.0 + i) == 0
    assert throttle.check("ip", "a@x.io", 20.0) > 0


def test_throttle_limits_attempts_per_address_whatever_the_email():
    throttle = LoginThrottle(max_failures=5, window=900, max_attempts=20)
    for i in range(20):
        assert throttle.check("10.0.0.9", f"user{i}@x.io", 0.5) == 0
    assert throttle.check("10.0.0.9", "fresh@x.io", 1.0) == 60
    assert throttle.check("10.0.0.9", None, 1.0) == 60  # registration counts too
    assert throttle.check("10.0.0.8", "fresh@x.io", 1.0) == 0  # other addresses are not affected
    assert throttle.check("10.0.0.9", "fresh@x.io", 60.5) == 0


def test_throttle_memory_is_bounded_under_a_flood_of_names():
    throttle = LoginThrottle(max_failures=5, window=900, max_attempts=3, max_entries=100)
    for i in range(10_000):
        throttle.check(f"10.{i // 256 % 256}.{i % 256}.{i // 65536}", f"u{i}@x.io", 1.0)
    assert len(throttle.failures) == 100 and len(throttle.attempts) == 100
    # Hot entries survive: the most recent ones are kept.
    for _ in range(3):
        throttle.check("ip-hot", None, 2.0)
    for i in range(50):
        throttle.check(f"cold-{i}", None, 2.0)
    assert throttle.check("ip-hot", None, 2.0) > 0


def test_login_limits_are_stricter_than_the_data_plane_by_default():
    defaults = config.Settings()
    assert (
        defaults.login_max_failures_per_email,
        defaults.login_window_seconds,
        defaults.login_max_attempts_per_address,
    ) == (5, 900.0, 20)
    with pytest.raises(config.SettingsError):
        config.load(environ={"LOGIN_MAX_FAILURES_PER_EMAIL": "0"})


# --- login throttling over HTTP --------------------------------------------------------------------
@pytest.mark.settings(login_max_failures_per_email=3, login_max_attempts_per_address=1000)
async def test_login_locks_an_email_after_failures_known_or_unknown_alike(api):
    known = await api.register()
    unknown = f"nobody-{uuid.uuid4().hex[:8]}@example.com"
    answers = {}
    for email in (known["email"], unknown):
        for _ in range(3):
            status, body, _ = await login(api, email, WRONG)
            assert status == 401 and body == {"detail": "Incorrect email or password"}
        answers[email] = await login(api, email, WRONG)
    (s1, b1, h1), (s2, b2, h2) = answers.values()
    assert s1 == s2 == 429 and b1 == b2 == {"detail": "Too many attempts; retry later"}
    assert 890 <= int(h1["Retry-After"]) <= 900 and 890 <= int(h2["Retry-After"]) <= 900
    # Locked means locked: the right password does not get through either, and nothing is issued.
    status, body, _ = await login(api, known["email"])
    assert status == 429 and "token" not in body
    # Other accounts from the same address are unaffected.
    other = await api.register()
    assert (await login(api, other["email"]))[0] == 200


@pytest.mark.settings(login_max_failures_per_email=3, login_max_attempts_per_address=1000)
async def test_successful_login_resets_the_failure_count(api):
    user = await api.register()
    for _ in range(2):
        assert (await login(api, user["email"], WRONG))[0] == 401
    assert (await login(api, user["email"]))[0] == 200
    for _ in range(3):
        assert (await login(api, user["email"], WRONG))[0] == 401
    assert (await login(api, user["email"], WRONG))[0] == 429


@pytest.mark.settings(login_max_failures_per_email=3, login_max_attempts_per_address=1000)
async def test_concurrent_guesses_cannot_outrun_the_lockout(api):
    user = await api.register()
    results = await asyncio.gather(*[login(api, user["email"], f"guess number {i}") for i in range(12)])
    statuses = sorted(r[0] for r in results)
    assert statuses == [401] * 3 + [429] * 9


@pytest.mark.settings(login_max_attempts_per_address=6)
async def test_one_address_cannot_spray_logins_or_registrations(api):
    user = await api.register()  # attempt 1
    for i in range(4):  # attempts 2-5
        assert (await login(api, f"spray{i}@example.com", WRONG))[0] == 401
    assert (await login(api, user["email"]))[0] == 200  # attempt 6
    status, body, headers = await login(api, user["email"])
    assert status == 429 and body == {"detail": "Too many attempts; retry later"}
    assert 1 <= int(headers["Retry-After"]) <= 60
    status, _, _ = await api.call("POST", "/auth/register", {"email": "new@example.com", "password": PASSWORD})
    assert status == 429
    # X-Forwarded-For from an untrusted peer does not make a new address.
    forged = await login(api, user["email"], headers={"X-Forwarded-For": "203.0.113.7", "X-Real-IP": "203.0.113.8"})
    assert forged[0] == 429
    # Sessions already issued keep working: only new logins are refused.
    assert (await api.call("GET", "/auth/me", token=user["token"]))[0] == 200


@pytest.mark.settings(password_scrypt_n=2**14, login_max_failures_per_email=1000, login_max_attempts_per_address=1000)
async def test_unknown_email_and_wrong_password_take_the_same_time(api):
    user = await api.register()
    unknown = f"ghost-{uuid.uuid4().hex[:8]}@example.com"
    times = {"known": [], "unknown": []}
    answers = set()
    for i in range(9):
        for label, email in (("known", user["email"]), ("unknown", unknown))[:: 1 if i % 2 else -1]:
            started = time.perf_counter()
            status, body, _ = await login(api, email, WRONG)
            times[label].append(time.perf_counter() - started)
            answers.add((status, orjson.dumps(body)))
    assert answers == {(401, b'{"detail":"Incorrect email or password"}')}
    known, unknown_ = statistics.median(times["known"]), statistics.median(times["unknown"])
    # Both run scrypt at the same cost (the decoy hash); without it the unknown email would be ~100x faster.
    assert known / 3 < unknown_ < known * 3, times
    assert unknown_ > 0.005  # scrypt N=2^14 really ran


# --- credential confusion --------------------------------------------------------------------------
async def test_api_keys_and_session_tokens_are_never_interchangeable(api, catalog):
    user, key = await api.funded_key(10_000)
    for path in ("/auth/me", "/keys", "/account", "/usage", f"/keys/{key['key_id']}/reveal", "/billing/crypto/orders"):
        assert (await api.call("GET", path, token=key["key"]))[0] == 401, path  # key as bearer
        assert (await api.call("GET", path, key=key["key"]))[0] == 401, path  # key header on the portal
    data = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    assert (await api.call("GET", data, key=user["token"]))[0] == 401  # token as key
    assert (await api.call("GET", data, token=user["token"]))[0] == 401  # bearer on the data plane
    assert (await api.call("GET", data, token=key["key"]))[0] == 401  # key, but as a bearer
    assert (await api.call("GET", data, key=key["key"]))[0] == 200  # the one right way
    assert (await api.call("GET", "/account", token=user["token"]))[1]["credits"] == 10_000 - 18


# --- broken object-level authorisation ------------------------------------------------------------
HOOK_404 = "Webhook endpoint not found"


async def test_every_object_route_answers_404_to_another_account(api, app, catalog):
    owner, other = await api.register(), await api.register()
    key = await api.new_key(owner["token"])
    await api.call("POST", f"/keys/{key['key_id']}/topup", {"credits": 1000}, token=owner["token"])
    status, order, _ = await api.call(
        "POST", "/billing/crypto/checkout", {"currency": "USDTTRC20", "amount_usd": 10}, token=owner["token"]
    )
    assert status == 200, order
    rule = (await api.call("POST", "/alerts", {"kind": "balance_below", "credits": 5}, token=owner["token"]))[1]
    hook = (await api.call("POST", "/webhooks", {"url": "http://127.0.0.1:9/h"}, token=owner["token"]))[1][
        "endpoint_id"
    ]
    stream = (await api.call("POST", "/streams", {"kind": "rule", "tag": "t", "value": "x"}, token=owner["token"]))[1][
        "rule_id"
    ]
    member = (await api.call("GET", "/auth/me", token=owner["token"]))[1]["member_id"]
    invitation = (
        await api.call(
            "POST", "/members/invitations", {"email": "x@example.com", "role": "viewer"}, token=owner["token"]
        )
    )[1]["invitation_id"]
    # A receipt of a third account's paid order (the owner's order stays unpaid for the checks below).
    payer = await api.register()
    paid = (
        await api.call(
            "POST", "/billing/crypto/checkout", {"currency": "USDTTRC20", "amount_usd": 10}, token=payer["token"]
        )
    )[1]
    body = {"order_id": paid["order_id"], "amount_usd": 10, "confirmed": True}
    assert (await api.call("POST", "/billing/crypto/sandbox/pay", body, token=payer["token"]))[0] == 200
    (receipt,) = (await api.call("GET", "/billing/receipts", token=payer["token"]))[1]
    by_id = {
        r"/billing/receipts/([^/]+)$": ("GET", f"/billing/receipts/{receipt['number']}", None, "Receipt not found"),
        r"/billing/credit-notes/([^/]+)$": (
            "GET",
            "/billing/credit-notes/C-2026-000001",
            None,
            "Credit note not found",
        ),
        r"/streams/([A-Za-z0-9_]{1,64})$": ("PATCH", f"/streams/{stream}", {"active": False}, "Rule not found"),
        r"/streams/([A-Za-z0-9_]{1,64})/events$": ("GET", f"/streams/{stream}/events", None, "Rule not found"),
        r"/keys/([^/]+)/reveal$": ("GET", f"/keys/{key['key_id']}/reveal", None, "Key not found"),
        r"/keys/([^/]+)/revoke$": ("POST", f"/keys/{key['key_id']}/revoke", None, "Key not found"),
        r"/keys/([^/]+)/topup$": ("POST", f"/keys/{key['key_id']}/topup", {"credits": 5}, "Key not found"),
        r"/keys/([^/]+)$": ("PATCH", f"/keys/{key['key_id']}", {"allowed_ips": ["10.0.0.1"]}, "Key not found"),
        r"/keys/([^/]+)/roll$": ("POST", f"/keys/{key['key_id']}/roll", {"grace_seconds": 0}, "Key not found"),
        r"/alerts/([A-Za-z0-9_]{1,64})$": ("DELETE", f"/alerts/{rule['rule_id']}", None, "Alert rule not found"),
        r"/webhooks/([A-Za-z0-9_]{1,64})$": ("PATCH", f"/webhooks/{hook}", {"enabled": False}, HOOK_404),
        r"/webhooks/([A-Za-z0-9_]{1,64})/roll$": ("POST", f"/webhooks/{hook}/roll", None, HOOK_404),
        r"/webhooks/([A-Za-z0-9_]{1,64})/test$": ("POST", f"/webhooks/{hook}/test", None, HOOK_404),
        r"/webhooks/([A-Za-z0-9_]{1,64})/deliveries$": ("GET", f"/webhooks/{hook}/deliveries", None, HOOK_404),
        r"/webhooks/([A-Za-z0-9_]{1,64})/deliveries/([A-Za-z0-9_.]{1,200})/redeliver$": (
            "POST",
            f"/webhooks/{hook}/deliveries/{hook}.x/redeliver",
            None,
            HOOK_404,
        ),
        r"/billing/crypto/orders/([^/]+)$": (
            "GET",
            f"/billing/crypto/orders/{order['order_id']}",
            None,
            "Order not found",
        ),
        r"/billing/crypto/orders/([^/]+)/qr$": (
            "GET",
            f"/billing/crypto/orders/{order['order_id']}/qr",
            None,
            "Order not found",
        ),
        r"/members/([0-9a-f]{24})$": ("PATCH", f"/members/{member}", {"role": "owner"}, "Not found"),
        r"/members/invitations/(inv_[0-9a-f]{16})$": (
            "DELETE",
            f"/members/invitations/{invitation}",
            None,
            "Not found",
        ),
    }
    by_body = [
        ("POST", "/billing/crypto/sandbox/pay", {"order_id": order["order_id"], "amount_usd": 10}),
        ("POST", "/billing/crypto/sandbox/confirm", {"order_id": order["order_id"]}),
    ]
    # Every route addressed by an id is in the table above (a new one must be added, not forgotten).
    with_ids = {
        p
        for p, target in app_routes(app)
        if "(" in p
        and not p.startswith(("/admin", "/social", "/twitter"))
        and not issubclass(target, tornado.web.StaticFileHandler)  # the portal's files: no account's objects
        and not p.startswith("/billing/statements/")  # a month, always of the caller's own account
    }
    assert with_ids == set(by_id), with_ids
    for method, path, body, message in by_id.values():
        status, answer, _ = await api.call(method, path, body, token=other["token"])
        assert status == 404 and answer == {"detail": message}, path
    for method, path, body in by_body:
        status, answer, _ = await api.call(method, path, body, token=other["token"])
        assert status == 404 and answer == {"detail": "Order not found"}, path
    # Nothing changed for the owner: key live and unrestricted, not rolled, credits and order untouched.
    (row,) = (await api.call("GET", "/keys", token=owner["token"]))[1]
    assert row["revoked"] is False and row["allowed_ips"] is None and row["expires_at"] is None
    assert (await api.call("GET", "/account", token=owner["token"]))[1]["credits"] == 1000
    status, mine, _ = await api.call("GET", f"/billing/crypto/orders/{order['order_id']}", token=owner["token"])
    assert status == 200 and mine["amount_received"]["amount"] == 0
    assert (await api.call("GET", "/billing/crypto/orders", token=other["token"]))[1] == []
    assert [r["rule_id"] for r in (await api.call("GET", "/alerts", token=owner["token"]))[1]] == [rule["rule_id"]]
    assert [e["enabled"] for e in (await api.call("GET", "/webhooks", token=owner["token"]))[1]] == [True]
    assert [i["invitation_id"] for i in (await api.call("GET", "/members/invitations", token=owner["token"]))[1]] == [
        invitation
    ]


@pytest.mark.settings(plan_rules=FAST)
async def test_usage_and_balance_are_visible_to_their_account_only(api, ctx, catalog):
    owner, key = await api.funded_key(10_000)
    other = await api.register()
    data = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    assert (await api.call("GET", data, key=key["key"]))[0] == 200
    for _flushed in (False, True):  # from the buffer, then from the database
        status, usage, _ = await api.call("GET", "/usage", token=owner["token"])
        assert status == 200 and len(usage) == 1
        for query in ("", f"?account_id={owner['account_id']}", f"?key_id={key['key_id']}"):
            status, theirs, _ = await api.call("GET", "/usage" + query, token=other["token"])
            assert status == 200 and theirs == [], query
        status, account, _ = await api.call("GET", "/account", token=other["token"])
        assert account["account_id"] == other["account_id"] and account["credits"] == 0
        await ctx.meter.flush()


# --- admin routes ----------------------------------------------------------------------------------
def concrete(pattern: str) -> str:
    """A request path for a route pattern: every capture group filled with a plausible id."""
    import re

    path = re.sub(r"\([^)]*\)", "1", pattern.rstrip("$"))
    return path.replace("\\", "")


async def test_every_admin_route_refuses_anonymous_and_non_admin_callers(api, app):
    admin_routes = [(p, h) for p, h in app_routes(app) if p.startswith("/admin")]
    if not admin_routes:
        pytest.skip("no /admin routes in this build")
    user = await api.register()
    checked = 0
    for pattern, handler in admin_routes:
        for method in methods_of(handler):
            path = concrete(pattern)
            status, body, _ = await api.call(method, path, body={})
            assert status == 401, (method, path, body)
            status, body, _ = await api.call(method, path, body={}, token=user["token"])
            assert status == 403, (method, path, body)
            checked += 1
    assert checked >= len(admin_routes)


# --- resource consumption ---------------------------------------------------------------------------
async def test_oversize_headers_get_431_and_the_connection_is_closed(app, settings):
    server, port = await serve_with_limits(app, settings)
    try:
        big = b"X-Filler: " + b"a" * (settings.max_header_bytes + 100) + b"\r\n"
        answer, _ = await raw_exchange(
            port, b"GET /auth/me HTTP/1.1\r\nHost: x\r\n" + big + b"\r\n" + b"GET /auth/me HTTP/1.1\r\nHost: x\r\n\r\n"
        )  # a pipelined second request
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 431 ")
        assert b"Connection: close" in head and orjson.loads(body)["detail"].startswith("Request headers are larger")
        assert re.search(rb"\r\nX-Request-Id: [0-9a-f]{20}\r\n", head + b"\r\n")  # an id, like every other answer
        assert answer.count(b"HTTP/1.1") == 1  # the connection was not kept for the next request
        # Past the hard cap the head is not even read: the connection is cut without an answer.
        huge = b"X-Filler: " + b"a" * (settings.max_header_bytes * 5) + b"\r\n"
        answer, _ = await raw_exchange(port, b"GET /auth/me HTTP/1.1\r\nHost: x\r\n" + huge + b"\r\n")
        assert answer == b""
        # The server is fine afterwards, and a normal head is served.
        answer, _ = await raw_exchange(port, b"GET /auth/me HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 401 ")
    finally:
        server.stop()


async def test_oversize_bodies_are_refused_before_any_work(app, settings):
    server, port = await serve_with_limits(app, settings)
    try:
        over = b"{" + b" " * settings.max_body_bytes + b"}"
        answer, _ = await raw_exchange(
            port,
            b"POST /auth/register HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            + f"Content-Length: {len(over)}\r\n\r\n".encode()
            + over,
        )
        assert answer.startswith(b"HTTP/1.1 413 ")
        # A declared length past the hard cap is refused from the head alone, before the body is read.
        answer, seconds = await raw_exchange(
            port, b"POST /auth/register HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n{"
        )
        assert not answer.startswith(b"HTTP/1.1 2") and seconds < 2
    finally:
        server.stop()


@pytest.mark.settings(http_idle_timeout=0.5, http_body_timeout=0.5)
async def test_slow_clients_are_disconnected(app, settings):
    server, port = await serve_with_limits(app, settings)
    try:
        # Slowloris: the head trickles in one byte every 0.1 s and never ends.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        started = time.monotonic()
        writer.write(b"GET /auth/me HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        answer = asyncio.ensure_future(reader.read())
        while not answer.done() and time.monotonic() - started < 4:
            await asyncio.sleep(0.1)
            try:
                writer.write(b"X")
                await writer.drain()
            except ConnectionError:
                break
        closed_after = time.monotonic() - started
        writer.close()
        try:
            assert (await asyncio.wait_for(answer, 1)) == b""
        except ConnectionResetError:  # closed with our unread bytes in its buffer: the kernel resets, as cut off
            pass
        assert 0.4 < closed_after < 2.0, closed_after
        # A body that never arrives in full.
        answer, seconds = await raw_exchange(
            port, b"POST /auth/login HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{", timeout=5
        )
        assert answer == b"" and 0.4 < seconds < 2.0
        # An idle keep-alive connection is closed too.
        answer, seconds = await raw_exchange(port, b"", timeout=5)
        assert answer == b"" and 0.4 < seconds < 2.0
    finally:
        server.stop()


def _caps():
    """Every list and page cap of the data plane, one past its maximum."""
    for e in ENDPOINTS:
        for p in e.params:
            if p.kind == "ids":
                yield e, p.name, ",".join(str(10**6 + i) for i in range(p.maximum + 1)), "too_long"
            elif p.kind == "int" and p.maximum is not None:
                yield e, p.name, str(p.maximum + 1), "less_than_equal"
            elif p.kind in ("str", "cursor") and not p.choices:  # enumerations: tests/data/test_contract.py
                yield e, p.name, "x" * ((CURSOR_MAX if p.kind == "cursor" else STRING_MAX) + 1), "string_too_long"


CAPS = list(_caps())


@pytest.mark.settings(plan_rules=FAST)
async def test_every_list_page_and_string_cap_is_422_free_and_never_forwarded(api, ctx, catalog):
    user, key = await api.funded_key(10_000)
    forwarded = []
    real_get = ctx.upstream.get

    async def counting(endpoint, query, *args):
        forwarded.append(endpoint.path)
        return await real_get(endpoint, query, *args)

    ctx.upstream.get = counting
    for endpoint, name, value, type_ in CAPS:
        query = {**valid_query(endpoint, catalog), name: value}
        status, body, _ = await api.call("GET", f"/social{endpoint.path}?{qs(query)}", key=key["key"])
        assert status == 422, (endpoint.path, name, body)
        assert {"loc": ["query", name], "type": type_} in [{"loc": d["loc"], "type": d["type"]} for d in body["detail"]]
    assert forwarded == [] and len(CAPS) > 30
    for path, loc in [
        ("/usage?limit=10001", "limit"),
        ("/usage?days=366", "days"),
        ("/billing/crypto/orders?limit=1001", "limit"),
    ]:
        status, body, _ = await api.call("GET", path, token=user["token"])
        assert status == 422 and body["detail"][0]["loc"] == ["query", loc], path
    assert (await api.call("GET", "/account", token=user["token"]))[1]["credits"] == 10_000


@pytest.mark.settings(**QUIET)
async def test_a_flood_of_made_up_keys_never_reaches_the_database(api, ctx, catalog, monkeypatch):
    data = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    vault = KeyVault(ctx.settings.secrets_key)
    real = vault.generate()
    forged = [real[:-8] + secrets.token_urlsafe(6) for _ in range(100)]  # right shape, wrong tag
    forged += [KeyVault("another secrets key, 32 chars or more").generate() for _ in range(100)]
    forged += ["sgw_" + "A" * 1000, "not-a-key", "sgw_" + "é" * 32, "sgw_" + "a" * 39]
    lookups = count_key_lookups(ctx, monkeypatch)  # counted at the store, whatever else the process is doing
    results = await asyncio.gather(*[api.call("GET", data, key=k) for k in forged])
    assert all(r[0] == 401 and r[1] == {"status": "error", "msg": "Invalid API key"} for r in results)
    assert lookups == []
    assert len(ctx.key_cache._unknown) == 0  # nor does it fill the negative cache
    # A well-formed key that is not in the database costs one lookup, then is remembered as unknown.
    for _ in range(30):
        assert (await api.call("GET", data, key=real))[0] == 401
    assert len(lookups) == 1


# --- injection ----------------------------------------------------------------------------------------
OPERATOR = {"$gt": ""}
BODIES = {  # every JSON body the portal takes, with a valid value for each field
    "/auth/register": (auth.CREDENTIALS, {"email": "x@example.com", "password": PASSWORD}),
    "/auth/login": (
        auth.LOGIN,
        {"email": "x@example.com", "password": PASSWORD, "code": "123456", "own_account": False},
    ),
    "/auth/login/2fa": (twofactor.SECOND_STEP, {"challenge": "c", "code": "123456"}),
    "/auth/2fa/setup": (twofactor.SETUP, {"password": PASSWORD}),
    "/auth/2fa/enable": (twofactor.ENABLE, {"code": "123456"}),
    "/auth/2fa/disable": (twofactor.DISABLE, {"code": "123456", "password": PASSWORD}),
    "/auth/2fa/recovery-codes": (twofactor.RECOVERY, {"code": "123456"}),
    "/auth/password/forgot": (reset.FORGOT, {"email": "x@example.com"}),
    "/auth/password/reset": (reset.RESET, {"token": "t", "password": PASSWORD}),
    "/keys": (
        keys.KEY_CREATE,
        {
            "name": "n",
            "expires_at": "2999-01-01T00:00:00Z",
            "allowed_endpoints": ["users"],
            "allowed_ips": ["10.0.0.0/8"],
            "credit_limit": 100,
            "credit_limit_period": "day",
        },
    ),
    "/keys/1/topup": (keys.TOP_UP, {"credits": 5}),
    "/billing/crypto/checkout": (billing.CHECKOUT, {"currency": "USDTTRC20", "amount_usd": 10}),
    "/billing/crypto/sandbox/pay": (
        billing.SANDBOX_PAY,
        {"order_id": "ord_" + "0" * 20, "amount_usd": 1, "confirmed": True},
    ),
    "/billing/crypto/sandbox/confirm": (billing.SANDBOX_CONFIRM, {"order_id": "ord_" + "0" * 20}),
}


@pytest.mark.settings(login_max_attempts_per_address=1000)
async def test_operator_objects_and_dollar_keys_are_rejected_in_every_body_field(api, ctx):
    user = await api.register()
    await api.new_key(user["token"])
    for path, (fields, valid) in BODIES.items():
        assert {f.name for f in fields} == set(valid), path
        for field in fields:
            status, body, _ = await api.call("POST", path, {**valid, field.name: OPERATOR}, token=user["token"])
            assert status == 422, (path, field.name, body)
            assert body["detail"][0]["loc"] == ["body", field.name]
        status, body, _ = await api.call("POST", path, {**valid, "$where": "sleep(1000)"}, token=user["token"])
        assert (
            status == 422
            and {"loc": ["body", "$where"], "msg": "Extra inputs are not permitted", "type": "extra_forbidden"}
            in body["detail"]
        ), path
    # The one free-form object: stored only without $ or dotted keys at any depth.
    for first_touch in ({"$set": {"is_admin": True}}, {"a": {"b": {"$ne": 1}}}, {"a.b": 1}):
        status, body, _ = await api.call("POST", "/auth/attribution", {"first_touch": first_touch}, token=user["token"])
        assert status == 200 and body["stored"] is False
    account = await ctx.accounts.accounts.find_one({"_id": user["account_id"]})
    assert "first_touch" not in account and not account.get("is_admin")
    # The login email is compared as a string, never as a query.
    assert (await login(api, {"$ne": "x"}))[0] == 422


@pytest.mark.settings(plan_rules=FAST)
async def test_data_paths_and_parameters_never_change_the_upstream_host_or_path(api, ctx, http_port):
    server, url, seen = await recorder()
    use_upstream(ctx, url)
    urls = []
    client = ctx.upstream.first.client
    real_fetch = client._fetch

    async def watching(url, *args):
        urls.append(url)
        return await real_fetch(url, *args)

    client._fetch = watching
    _, key = await api.funded_key(10_000)
    prefix = url + ctx.settings.upstream_path_prefix
    through_client = [
        "/social/..%2F..%2Fadmin",
        "/social/%2e%2e/%2e%2e/admin",
        "/social//evil.com/x",
        "/social/http://evil.com/user/info",
        "/social/user/info/..%2F..%2Fsandbox%2Fcatalog",
        "/social/user/info/../../admin",
        "/social/user%2Finfo?userName=a",
        "/social/user/info%00?userName=a",
        "/social/user/info?userName=http://evil.com/",
        "/social/user/info?userName=@evil.com",
        "/social/user/info?userName=a%23@evil.com/x",
        "/social/user/info?userName=a&url=//evil.com",
        "/social/user/info?userName=a%0d%0aHost:%20evil.com",
        "/social/user/info?userName=../../admin",
        "/twitter/user/info?userName=file:///etc/passwd",
    ]
    statuses = []
    for path in through_client:
        status, _, _ = await api.call("GET", path, key=key["key"])
        statuses.append(status)
    # Absolute-form request targets and odd request lines, straight over a socket.
    raw_targets = [
        b"http://evil.com/social/user/info?userName=a",
        b"//evil.com/social/user/info?userName=a",
        b"/social/user/info@evil.com?userName=a",
    ]
    for target in raw_targets:
        answer, _ = await raw_exchange(
            http_port,
            b"GET "
            + target
            + b" HTTP/1.1\r\nHost: evil.com\r\n"
            + f"X-API-Key: {key['key']}\r\nConnection: close\r\n\r\n".encode(),
        )
        statuses.append(int(answer.split(b" ", 2)[1]))
    assert set(statuses) <= {200, 404}, statuses
    assert statuses.count(200) == len(urls) == len(seen) > 0
    for sent, received in zip(urls, seen):
        assert sent.startswith(prefix + "/user/info?") or sent.startswith(prefix + "/user/info"), sent
        assert received["path"] == "/twitter/user/info"
        assert received["headers"]["Host"] == url.removeprefix("http://")
    server.stop()


# --- secrets -----------------------------------------------------------------------------------------
@pytest.mark.settings(
    plan_rules=FAST,
    jwt_secret="jwt-" + secrets.token_hex(20),
    secrets_key="sk-" + secrets.token_hex(20),
    upstream_api_key="upstream-" + secrets.token_hex(12),
)
async def test_no_secret_ever_reaches_the_logs(api, ctx, catalog, caplog):
    import sandbox

    caplog.set_level(logging.DEBUG)  # everything, libraries included (before the upstream client exists)
    sim = sandbox.start("127.0.0.1", 0, ctx.settings.upstream_api_key)
    use_upstream(ctx, sim.url)
    password = "very secret passphrase " + secrets.token_hex(4)
    email = f"logs-{uuid.uuid4().hex[:8]}@example.com"
    status, registered, _ = await api.call("POST", "/auth/register", {"email": email, "password": password})
    assert status == 200
    status, session, _ = await login(api, email, password)
    token = session["token"]
    key = await api.new_key(token)
    await api.call("POST", f"/keys/{key['key_id']}/topup", {"credits": 10_000}, token=token)
    assert (await api.call("GET", f"/keys/{key['key_id']}/reveal", token=token))[1]["key"] == key["key"]
    data = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    assert (await api.call("GET", data, key=key["key"]))[0] == 200
    await ctx.meter.flush(final=True)
    assert (await api.call("POST", f"/keys/{key['key_id']}/revoke", token=token))[0] == 200
    assert (await api.call("GET", data, key=key["key"]))[0] == 401
    assert (await login(api, email, password + "x"))[0] == 401
    assert (await api.call("GET", "/auth/me", token=token + "x"))[0] == 401
    assert (await api.call("GET", "/account", headers={"Authorization": f"Bearer {key['key']}"}))[0] == 401
    sim.stop()
    s = ctx.settings
    text = "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
    assert "gateway.access" in text  # the logs were captured
    for label, secret in [
        ("password", password),
        ("session token", token),
        ("API key", key["key"]),
        ("API key body", key["key"][4:]),
        ("upstream key", s.upstream_api_key),
        ("JWT secret", s.jwt_secret),
        ("SECRETS_KEY", s.secrets_key),
    ]:
        assert secret not in text, f"the {label} appears in the logs"


async def test_api_key_secrets_are_stored_only_as_digest_and_sealed_text(api, ctx):
    user = await api.register()
    created = [await api.new_key(user["token"], f"k{i}") for i in range(3)]
    docs = await ctx.keys.keys.find({"account_id": user["account_id"]}).to_list(None)
    assert len(docs) == 3
    for doc in docs:
        secret = next(k["key"] for k in created if k["key_id"] == doc["key_id"])
        stored = orjson.dumps(doc, default=str).decode()
        assert secret not in stored and secret[4:] not in stored and secret[10:30] not in stored
        assert doc["digest"] == ctx.vault.digest(secret) and doc["prefix"] == secret[:10]
        assert ctx.vault.decrypt(doc["sealed"], doc["key_id"]) == secret
        with pytest.raises(InvalidTag):  # sealed text is bound to its key id: it cannot be moved to another row
            ctx.vault.decrypt(doc["sealed"], doc["key_id"] + 1)
        with pytest.raises(InvalidTag):  # and useless without SECRETS_KEY
            KeyVault("some other secrets key of 32+ characters").decrypt(doc["sealed"], doc["key_id"])
    status, listed, _ = await api.call("GET", "/keys", token=user["token"])
    assert status == 200 and not any(k["key"] in orjson.dumps(listed).decode() for k in created)


@pytest.mark.settings(password_scrypt_n=config.Settings().password_scrypt_n)
async def test_passwords_are_hashed_with_scrypt_at_owasp_cost_by_default(api, ctx):
    assert config.Settings().password_scrypt_n == 2**17
    user = await api.register(password=PASSWORD)
    account = await ctx.accounts.accounts.find_one({"_id": user["account_id"]})
    scheme, n, r, p, salt, digest = account["password_hash"].split("$")
    assert (scheme, n, r, p) == ("scrypt", "131072", "8", "1")
    import base64

    assert len(base64.b64decode(salt)) == 16 and len(base64.b64decode(digest)) == 32
    assert PASSWORD not in orjson.dumps(account, default=str).decode()
    assert ctx.view.runtime.decoy_hash.startswith("scrypt$131072$8$1$")  # unknown emails pay the same cost


async def test_key_ids_no_key_can_have_are_unknown_not_errors(api):
    user = await api.register()
    for key_id in ["0", "-5", "+0", "99999999999999999999", "9" * 5000]:
        for method, suffix in (("GET", "reveal"), ("POST", "revoke")):
            status, body, _ = await api.call(method, f"/keys/{key_id}/{suffix}", token=user["token"])
            assert status == 404 and body == {"detail": "Key not found"}, (key_id[:30], suffix, status)
    status, body, _ = await api.call("GET", "/keys/1e3/reveal", token=user["token"])
    assert status == 422 and body["detail"][0]["loc"] == ["path", "key_id"]
    # Anonymous callers learn nothing either: 401 comes first.
    assert (await api.call("GET", "/keys/0/reveal"))[0] == 401


@pytest.mark.settings(trusted_proxies=("127.0.0.1",), login_max_attempts_per_address=2)
async def test_behind_a_trusted_proxy_each_client_address_is_throttled_on_its_own(api):
    a, b = {"X-Forwarded-For": "198.51.100.1"}, {"X-Forwarded-For": "198.51.100.2"}
    for _ in range(2):
        assert (await login(api, "someone@example.com", WRONG, headers=a))[0] == 401
    assert (await login(api, "someone@example.com", WRONG, headers=a))[0] == 429
    assert (await login(api, "other@example.com", WRONG, headers=b))[0] == 401  # another client behind the proxy
    assert (await login(api, "other@example.com", WRONG, headers={"X-Forwarded-For": "198.51.100.1, 198.51.100.2"}))[
        0
    ] == 401
