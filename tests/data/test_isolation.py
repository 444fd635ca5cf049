"""Tenant isolation and account security (issue 13): each test performs one attack found against a
served gateway and asserts what the attacker and everybody else see."""

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from datetime import UTC, datetime

import jwt
import orjson
import pytest
import tornado.httpserver
import tornado.web
from support import FAST, PASSWORD, Gateway, Receiver, account_with_keys, use_upstream
from tornado.httpclient import AsyncHTTPClient
from tornado.testing import bind_unused_port

from app.embedded import free_port
from app.server import make_server
from security import tokens
from social.upstream import Breaker

pytestmark = pytest.mark.gen_test(timeout=120)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/<area>/ -> the project


def wide(api):
    """A client of the app under test that really sends 50 requests at once (the fixture's sends 10)."""
    return type(api)(AsyncHTTPClient(force_instance=True, max_clients=100), api.base)


# --- one request must never stall the event loop -----------------------------------------------------------------
def test_production_refuses_to_start_without_an_upstream(tmp_path):
    env = {
        "PATH": os.environ["PATH"],
        "GATEWAY_ENV": "production",
        "GATEWAY_HOST": "127.0.0.1",
        "JWT_SECRET": "j" * 40,
        "SECRETS_KEY": "s" * 40,
        "MONGODB_URI": "mongodb://127.0.0.1:1",
        "DATA_DIR": str(tmp_path),
    }

    def refusal() -> list[str]:
        """`serve` with `env`: it must exit 2; the lines it printed on stderr."""
        done = subprocess.run(
            [sys.executable, os.path.join(ROOT, "gateway.py"), "serve", "--port", str(free_port())],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2
        return done.stderr.strip().splitlines()

    assert refusal() == [  # every problem in one start
        "social-gateway: 2 problems with the settings:",
        "  - UPSTREAM_URL is required in production (the sandbox upstream is for development only)",
        "  - UPSTREAM_API_KEY is required in production (not the sandbox's key)",
    ]
    env["UPSTREAM_URL"] = "https://provider.example"  # with the sandbox's default credential
    assert refusal() == ["social-gateway: UPSTREAM_API_KEY is required in production (not the sandbox's key)"]


def _probe(port: int, stop: threading.Event, seconds: list[float]) -> None:
    """/healthz from a thread of its own, so the test's own event loop does not add to the figure."""
    while not stop.is_set():
        started = time.perf_counter()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
            assert answer.status == 200
        seconds.append(time.perf_counter() - started)
        time.sleep(0.02)


WORST_QUERIES = {
    "deep nesting": "(" * 300 + "coffee" + ")" * 300,
    "nesting at the bound": "(" * 16 + "coffee" + ")" * 16,
    "negation chain": "-" * 990 + "coffee",
    "negated terms": " ".join(f"-w{i}" for i in range(64)),
    "huge OR list": " OR ".join(f"w{i}" for i in range(120)),
    "OR list at the bound": " OR ".join(f'"w{i} x"' for i in range(64)),
}


async def test_worst_queries_never_hold_the_gateway_loop(mongo, tmp_path):
    """The development set-up as served (the sandbox started by the gateway itself): while the worst
    queries run, the gateway's event loop never stalls (its own lag probe) and /healthz answers every time."""
    gw = await Gateway(mongo.uri, "", f"p_{uuid.uuid4().hex[:10]}", DATA_DIR=str(tmp_path)).launch()
    try:
        _, (key,), _ = await account_with_keys(gw, 1_000_000, 1)
        lag_before = await loop_lag_max(gw)  # start-up on a loaded machine may have had its own
        stop, seconds = threading.Event(), []
        probe = threading.Thread(target=_probe, args=(gw.port, stop, seconds))
        probe.start()
        try:
            await asyncio.sleep(0.2)
            answers = await asyncio.gather(
                *[
                    gw.call(
                        "GET",
                        "/social/tweet/advanced_search?" + urllib.parse.urlencode({"query": q}),
                        **{"X-API-Key": key},
                    )
                    for _ in range(3)
                    for q in WORST_QUERIES.values()
                ]
            )
            await asyncio.sleep(0.2)
        finally:
            stop.set()
            await asyncio.get_running_loop().run_in_executor(None, probe.join)
        statuses = dict(zip(list(WORST_QUERIES) * 3, (a.code for a in answers), strict=True))
        # Beyond the parser's bounds the sandbox refuses the query (400, passed through, never charged).
        assert statuses["deep nesting"] == statuses["huge OR list"] == 400
        assert statuses["nesting at the bound"] == statuses["OR list at the bound"] == statuses["negation chain"] == 200
        assert all(a.headers.get("X-Credits-Charged", "0") == "0" for a in answers if a.code == 400)
        # Both the loop's lag probe and /healthz's wall clock also count the OS handing a busy machine's two cores
        # around (a stall, a wake-up 100 ms late, was counted while a benchmark ran beside): generous bounds, far
        # below what a query held on the loop (a backtracking parse of these takes seconds) would show.
        assert await loop_lag_max(gw) <= max(lag_before, HELD)
        assert len(seconds) >= 10 and max(seconds) < 1.0, sorted(seconds)[-5:]
    finally:
        await asyncio.to_thread(gw.stop)


HELD = 0.5  # seconds of event-loop lag that no busy machine explains


async def loop_lag_max(gw: Gateway) -> float:
    """The served gateway's largest event-loop lag since start (/metrics), checking that its lag gauge is there."""
    metrics = (await gw.call("GET", "/metrics")).body.decode()
    assert 'gateway_event_loop_lag_seconds{worker="0"} ' in metrics
    return float(re.search(r'^gateway_event_loop_lag_max_seconds\{worker="0"\} (\S+)$', metrics, re.M).group(1))


async def test_a_blocked_event_loop_is_measured_and_alarmed(api, ctx, caplog):
    await asyncio.sleep(0.2)  # the probe is running
    time.sleep(0.25)  # what a CPU-bound request would do to every other one
    await asyncio.sleep(0.2)
    assert ctx.metrics.loop_stalls >= 1 and ctx.metrics.loop_lag_max_seconds >= 0.2
    assert any("event loop stalled" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
    metrics = (await api.call("GET", "/metrics"))[1].decode()
    lag_max = next(
        line for line in metrics.splitlines() if line.startswith('gateway_event_loop_lag_max_seconds{worker="0"} ')
    )
    assert float(lag_max.split()[1]) >= 0.2


# --- one customer must not open the breaker for everybody --------------------------------------------------------
class FailingUpstream(tornado.web.RequestHandler):
    """Answers 500 to any query containing `boom` (a query the provider chokes on), data otherwise."""

    def get(self, path):
        if "boom" in self.get_query_argument("query", ""):
            self.set_status(500)
            self.finish(b'{"status":"error","msg":"internal"}')
        else:
            self.finish(b'{"tweets":[],"has_next_page":false,"next_cursor":"","status":"success","msg":""}')


def point_upstream(ctx, url: str, pool: int = 64) -> None:
    """The app under test against another upstream, with the breaker configured as in production."""
    s = ctx.settings
    breaker = Breaker(s.breaker_failures, s.breaker_reset_seconds, min_accounts=s.breaker_min_accounts)
    use_upstream(ctx, url, timeout=5.0, pool=pool, breaker=breaker)


async def search(api, key: dict, query: str):
    return await api.call(
        "GET", "/social/tweet/advanced_search?" + urllib.parse.urlencode({"query": query}), key=key["key"]
    )


@pytest.mark.settings(plan_rules=FAST)
async def test_one_accounts_failing_calls_never_open_the_shared_breaker(api, ctx):
    sock, port = bind_unused_port()
    server = tornado.httpserver.HTTPServer(tornado.web.Application([(r"(.*)", FailingUpstream)]))
    server.add_sockets([sock])
    point_upstream(ctx, f"http://127.0.0.1:{port}")
    try:
        _, attacker = await api.funded_key()
        _, victim = await api.funded_key()
        many = wide(api)
        answers = await asyncio.gather(*[search(many, attacker, f"boom {i}") for i in range(50)])
        many.http.close()
        assert {status for status, _, _ in answers} <= {502, 429}
        assert [status for status, _, _ in answers].count(502) >= ctx.settings.breaker_failures
        assert ctx.upstream.breaker.state == "closed"
        # The attacker is slowed down on its own ...
        status, body, headers = await search(api, attacker, "coffee")
        assert status == 429 and int(headers["Retry-After"]) >= 1 and "failed" in body["msg"]
        # ... everybody else is served, and the instance stays in the load balancer.
        for _ in range(5):
            assert (await search(api, victim, "coffee"))[0] == 200
        assert (await api.call("GET", "/readyz"))[0] == 200
        # Failures spread over several accounts are the provider's: the breaker opens.
        others = [(await api.funded_key())[1] for _ in range(ctx.settings.breaker_min_accounts)]
        for other in others:
            for i in range(ctx.settings.account_failure_budget):
                await search(api, other, f"boom {i}")
        assert ctx.upstream.breaker.state == "open"
        status, _, headers = await search(api, victim, "coffee")
        assert status == 503 and headers["Retry-After"] == "1"
        assert (await api.call("GET", "/readyz"))[0] == 503
    finally:
        server.stop()


@pytest.mark.settings(plan_rules=FAST)
async def test_a_provider_that_is_really_down_still_opens_the_breaker(api, ctx):
    point_upstream(ctx, f"http://127.0.0.1:{free_port()}")  # nothing listens: connection refused
    _, key = await api.funded_key()
    statuses = [(await search(api, key, "coffee"))[0] for _ in range(ctx.settings.breaker_failures + 3)]
    assert statuses[: ctx.settings.breaker_failures] == [502] * ctx.settings.breaker_failures
    assert statuses[-1] == 503  # the breaker is open: nothing is sent any more, one account was enough
    assert (await api.call("GET", "/readyz"))[1]["checks"]["upstream_breaker"] == "open"


class SlowUpstream(tornado.web.RequestHandler):
    """Takes 2 s over a query containing `slow` (one the provider finds expensive), answers at once otherwise."""

    async def get(self, path):
        if "slow" in self.get_query_argument("query", ""):
            await asyncio.sleep(2)
        self.finish(b'{"tweets":[],"has_next_page":false,"next_cursor":"","status":"success","msg":""}')


@pytest.mark.settings(plan_rules=FAST, account_max_in_flight=4)
async def test_one_accounts_slow_calls_never_hold_the_shared_upstream_pool(api, ctx):
    """The attack: 30 slow calls at once from one account held all 8 connections to the provider, and
    another account's call waited behind them (8.5 s on a served gateway with the default pool of 64)."""
    sock, port = bind_unused_port()
    server = tornado.httpserver.HTTPServer(tornado.web.Application([(r"(.*)", SlowUpstream)]))
    server.add_sockets([sock])
    point_upstream(ctx, f"http://127.0.0.1:{port}", pool=8)
    try:
        _, attacker = await api.funded_key()
        _, victim = await api.funded_key()
        many = wide(api)
        attack = asyncio.gather(*[search(many, attacker, f"slow {i}") for i in range(30)])
        await asyncio.sleep(0.5)  # the attacker's calls are under way
        started = time.monotonic()
        status, _, _ = await search(api, victim, "coffee")
        waited = time.monotonic() - started
        answers = await attack
        many.http.close()
        assert status == 200 and waited < 1.0
        statuses = [status for status, _, _ in answers]
        assert statuses.count(200) == 4 and statuses.count(429) == 26
        refused = next(answer for answer in answers if answer[0] == 429)
        assert refused[2]["Retry-After"] == "1" and "under way" in refused[1]["msg"]
        # The slots come back when the calls end.
        assert (await search(api, attacker, "coffee"))[0] == 200
        assert ctx.in_flight.calls == {}
    finally:
        server.stop()


# --- plan limits cannot be multiplied ----------------------------------------------------------------------------
@pytest.mark.settings(max_keys_per_account=5)
async def test_keys_per_account_are_capped_even_when_created_at_once(api, ctx):
    user = await api.register()
    many = wide(api)
    answers = await asyncio.gather(
        *[many.call("POST", "/keys", {"name": f"k{i}"}, token=user["token"]) for i in range(30)]
    )
    many.http.close()
    statuses = [status for status, _, _ in answers]
    assert statuses.count(200) == 5 and statuses.count(409) == 25
    refused = next(body for status, body, _ in answers if status == 409)
    assert "5 active API keys" in refused["detail"]
    keys = (await api.call("GET", "/keys", token=user["token"]))[1]
    assert len(keys) == 5 == await ctx.keys.count_active(user["account_id"])
    # Revoking one makes room for exactly one.
    assert (await api.call("POST", f"/keys/{keys[0]['key_id']}/revoke", token=user["token"]))[0] == 200
    assert (await api.call("POST", "/keys", {"name": "again"}, token=user["token"]))[0] == 200
    assert (await api.call("POST", "/keys", {"name": "one too many"}, token=user["token"]))[0] == 409
    account = (await api.call("GET", "/account", token=user["token"]))[1]
    assert account["max_keys"] == 5 and account["account_qps_limit"] == 5 * account["qps_limit"]


@pytest.mark.settings(max_keys_per_account=2)
async def test_a_rolled_key_past_its_grace_leaves_room_under_the_cap(api, ctx):
    user = await api.register()
    first = await api.new_key(user["token"], "a")
    await api.new_key(user["token"], "b")
    assert (await api.call("POST", "/keys", {"name": "c"}, token=user["token"]))[0] == 409
    status, rolled, _ = await api.call(
        "POST", f"/keys/{first['key_id']}/roll", {"grace_seconds": 0}, token=user["token"]
    )
    assert status == 200  # rolling replaces a key: allowed at the cap
    assert await ctx.keys.count_active(user["account_id"]) == 2  # the old one expired at once
    assert (await api.call("POST", "/keys", {"name": "c"}, token=user["token"]))[0] == 409


@pytest.mark.settings(max_keys_per_account=50)
async def test_keys_list_pages_and_stays_a_list(api):
    user = await api.register()
    made = [(await api.new_key(user["token"], f"k{i}"))["key_id"] for i in range(7)]
    status, everything, headers = await api.call("GET", "/keys", token=user["token"])
    assert status == 200 and [k["key_id"] for k in everything] == made[::-1] and "X-Next-Cursor" not in headers
    seen, path = [], "/keys?limit=3"
    while path:
        status, page, headers = await api.call("GET", path, token=user["token"])
        assert status == 200 and isinstance(page, list) and len(page) <= 3
        seen += [k["key_id"] for k in page]
        cursor = headers.get("X-Next-Cursor")
        path = f"/keys?limit=3&cursor={cursor}" if cursor else ""
        if cursor:
            assert headers["Link"] == f'</keys?limit=3&cursor={cursor}>; rel="next"'
    assert seen == made[::-1]
    for bad in ("limit=0", "limit=1001", "cursor=abc", "cursor=0"):
        status, body, _ = await api.call("GET", f"/keys?{bad}", token=user["token"])
        assert status == 422 and body["detail"][0]["loc"][0] == "query", bad


@pytest.mark.settings(plan_rules=({"name": "small", "min_paid_usd": 0, "qps": 4, "account_qps": 6},))
async def test_many_keys_do_not_multiply_the_account_rate(api, ctx):
    user, first = await api.funded_key()
    keys = [first] + [await api.new_key(user["token"], f"k{i}") for i in range(3)]
    path = "/social/user/info?userName=" + urllib.parse.quote("nobody_here")
    started = time.monotonic()
    answers = [await api.call("GET", path, key=k["key"]) for k in keys for _ in range(3)]
    elapsed = time.monotonic() - started
    passed = [a for a in answers if a[0] != 429]
    # 4 keys x 3 calls, each key within its burst of 4: the account's burst of 6 (plus what 6/s refills
    # while the calls run) binds.
    assert 6 <= len(passed) <= 6 + int(6 * elapsed) and len(passed) < 12, (len(passed), elapsed)
    status, body, headers = next(a for a in answers if a[0] == 429)
    assert "for this account" in body["msg"] and int(headers["Retry-After"]) >= 1
    assert headers["X-RateLimit-Account-Limit"] == "6" and headers["X-RateLimit-Account-Remaining"] == "0"
    assert headers["X-RateLimit-Limit"] == "4"
    other, other_key = await api.funded_key()  # another account is not touched by it
    assert (await api.call("GET", path, key=other_key["key"]))[0] != 429


# --- nobody becomes admin by registering: tests/admin/test_admin.py (the configured address registered by an attacker)


# --- free credits and lockouts cannot be farmed ------------------------------------------------------------------
def from_address(address: str) -> dict:
    return {"X-Forwarded-For": address}


async def register_from(api, address: str, email: str | None = None):
    email = email or f"farm-{uuid.uuid4().hex[:10]}@example.com"
    return await api.call(
        "POST", "/auth/register", {"email": email, "password": PASSWORD}, headers=from_address(address)
    )


@pytest.mark.settings(
    trusted_proxies=("127.0.0.1",), signup_credits=1000, signup_credited_per_network=3, signup_max_per_network=5
)
async def test_signup_credits_cannot_be_farmed_from_one_network(api, ctx):
    credits = []
    for i in range(5):  # five addresses of one /24
        status, body, _ = await register_from(api, f"198.51.100.{i + 1}")
        assert status == 200, body
        credits.append((await api.call("GET", "/account", token=body["token"]))[1]["credits"])
    assert credits == [1000, 1000, 1000, 0, 0]  # only three a day get the signup credits
    status, body, headers = await register_from(api, "198.51.100.77")
    assert status == 429 and "network" in body["detail"] and int(headers["Retry-After"]) > 0
    # Another network is not affected; IPv6 counts by /64.
    status, body, _ = await register_from(api, "203.0.113.9")
    assert status == 200 and (await api.call("GET", "/account", token=body["token"]))[1]["credits"] == 1000
    for i in range(5):
        assert (await register_from(api, f"2001:db8:1:2::{i + 1}"))[0] == 200
    assert (await register_from(api, "2001:db8:1:2:ffff::1"))[0] == 429
    assert (await register_from(api, "2001:db8:1:3::1"))[0] == 200


async def login_from(api, address: str, email: str, password: str):
    return await api.call("POST", "/auth/login", {"email": email, "password": password}, headers=from_address(address))


@pytest.mark.settings(trusted_proxies=("127.0.0.1",), login_slowdown_after=3, login_max_delay_seconds=0.2)
async def test_an_attacker_elsewhere_cannot_lock_the_owner_out(api, ctx):
    owner = await api.register()
    statuses = [(await login_from(api, "192.0.2.10", owner["email"], f"guess {i}"))[0] for i in range(20)]
    assert statuses[:5] == [401] * 5 and set(statuses[5:]) == {429}  # the attacker's network is locked out
    started = time.perf_counter()
    status, body, _ = await login_from(api, "198.51.100.20", owner["email"], PASSWORD)
    assert status == 200 and body["token"]
    assert time.perf_counter() - started < 1.0  # at once: the right password is never delayed
    # Guesses spread over many networks are slowed down (past LOGIN_SLOWDOWN_AFTER, each failure answers late).
    started = time.perf_counter()
    for i in range(3):
        assert (await login_from(api, f"203.0.{i}.1", owner["email"], "another guess"))[0] == 401
    assert time.perf_counter() - started >= 0.4


# --- sessions and passwords -------------------------------------------------------------------------------------
async def test_logout_ends_this_token_only(api):
    user = await api.register()
    status, other, _ = await api.call("POST", "/auth/login", {"email": user["email"], "password": PASSWORD})
    assert status == 200
    assert (await api.call("POST", "/auth/logout", token=user["token"]))[0] == 200
    for method, path in (("GET", "/auth/me"), ("GET", "/keys"), ("POST", "/keys"), ("POST", "/auth/logout")):
        status, body, headers = await api.call(method, path, {} if method == "POST" else None, token=user["token"])
        assert status == 401 and headers["WWW-Authenticate"] == "Bearer", (method, path)
    assert (await api.call("GET", "/auth/me", token=other["token"]))[0] == 200


async def test_logout_of_a_token_without_an_id_ends_every_session(api, ctx):
    """Tokens issued before tokens had ids cannot be ended one by one: logging one out ends them all."""
    user = await api.register()
    now = int(time.time())
    legacy = jwt.encode(
        {"sub": user["account_id"], "iat": now, "exp": now + 600, "typ": "session"},
        ctx.settings.jwt_secret,
        algorithm="HS256",
    )
    assert (await api.call("GET", "/auth/me", token=legacy))[0] == 200
    assert (await api.call("POST", "/auth/logout", token=legacy))[0] == 200
    for token in (legacy, user["token"]):
        assert (await api.call("GET", "/auth/me", token=token))[0] == 401
    assert (await api.call("POST", "/auth/login", {"email": user["email"], "password": PASSWORD}))[0] == 200


async def test_password_change_ends_every_earlier_token(api, ctx):
    user = await api.register()
    second = (await api.call("POST", "/auth/login", {"email": user["email"], "password": PASSWORD}))[1]
    new = "a new and better passphrase"
    change = {"current_password": "not it at all", "new_password": new}
    status, body, _ = await api.call("POST", "/auth/password", change, token=user["token"])
    assert status == 403 and body == {"detail": "The current password is incorrect"}
    status, body, _ = await api.call(
        "POST", "/auth/password", {"current_password": PASSWORD, "new_password": "password"}, token=user["token"]
    )
    assert status == 422 and body["detail"][0]["loc"] == ["body", "new_password"]
    status, body, _ = await api.call(
        "POST", "/auth/password", {"current_password": PASSWORD, "new_password": new}, token=user["token"]
    )
    assert status == 200 and body["token"]
    for token in (user["token"], second["token"]):
        assert (await api.call("GET", "/auth/me", token=token))[0] == 401
    assert (await api.call("GET", "/auth/me", token=body["token"]))[0] == 200
    assert (await api.call("POST", "/auth/login", {"email": user["email"], "password": PASSWORD}))[0] == 401
    status, fresh, _ = await api.call("POST", "/auth/login", {"email": user["email"], "password": new})
    assert status == 200 and (await api.call("GET", "/keys", token=fresh["token"]))[0] == 200


async def test_tokens_of_gone_accounts_or_with_wrong_claim_types_are_401_and_write_nothing(api, ctx):
    secret = ctx.settings.jwt_secret
    now = int(time.time())
    good = {"iat": now, "exp": now + 600, "typ": "session"}
    forged = {
        "gone account": tokens.issue(secret, "5f0000000000000000000000", 600),
        "sub is a number": jwt.encode({**good, "sub": 12345}, secret, algorithm="HS256"),
        "sub is an object": jwt.encode({**good, "sub": {"$ne": None}}, secret, algorithm="HS256"),
        "sv is a string": jwt.encode({**good, "sub": "x", "sv": "0"}, secret, algorithm="HS256"),
        "jti is a number": jwt.encode({**good, "sub": "x", "jti": 7}, secret, algorithm="HS256"),
        "exp is a string": jwt.encode({**good, "sub": "x", "exp": str(now + 600)}, secret, algorithm="HS256"),
    }
    user = await api.register()  # a real account whose id a "deleted" token may name
    await ctx.accounts.accounts.delete_one({"_id": user["account_id"]})
    ctx.account_cache.invalidate(user["account_id"])
    forged["deleted account"] = user["token"]
    db = ctx.client[ctx.settings.mongodb_db]
    before = {name: await db[name].count_documents({}) for name in ("keys", "orders", "accounts", "events")}
    for why, token in forged.items():
        for method, path, body in (
            ("POST", "/keys", {"name": "x"}),
            ("GET", "/keys", None),
            ("GET", "/account", None),
            ("POST", "/auth/attribution", {"first_touch": {"utm_source": "x"}}),
            ("POST", "/billing/crypto/checkout", {"currency": "USDT", "amount_usd": 20}),
            ("POST", "/auth/logout", {}),
            ("POST", "/auth/password", {"current_password": PASSWORD, "new_password": "quite a new one"}),
        ):
            status, _, _ = await api.call(method, path, body, token=token)
            assert status == 401, (why, method, path, status)
    assert before == {name: await db[name].count_documents({}) for name in before}


@pytest.mark.parametrize("password", ["password", "12345678", "Password1", "qwertyuiop", "iloveyou"])
async def test_common_passwords_are_refused(api, password):
    status, body, _ = await api.call(
        "POST", "/auth/register", {"email": f"c{uuid.uuid4().hex[:8]}@example.com", "password": password}
    )
    assert status == 422 and body["detail"][0]["loc"] == ["body", "password"] and "common" in body["detail"][0]["msg"]


async def test_checkouts_cannot_flood_the_payment_processor(api, ctx):
    user = await api.register()
    order = {"currency": "USDTTRC20", "amount_usd": 20}
    many = wide(api)
    answers = await asyncio.gather(
        *[many.call("POST", "/billing/crypto/checkout", order, token=user["token"]) for _ in range(50)]
    )
    many.http.close()
    statuses = [status for status, _, _ in answers]
    assert set(statuses) <= {200, 429} and 1 <= statuses.count(200) <= ctx.settings.max_open_orders
    assert all(int(headers["Retry-After"]) >= 1 for status, _, headers in answers if status == 429)
    while (status := (await api.call("POST", "/billing/crypto/checkout", order, token=user["token"]))[0]) == 200:
        pass
    assert status == 429
    open_orders = await ctx.payments.orders.count_open(user["account_id"], datetime.now(UTC))
    assert open_orders <= ctx.settings.max_open_orders  # what reached the processor
    status, body, _ = await api.call("POST", "/billing/crypto/checkout", order, token=user["token"])
    assert status == 429
    other = await api.register()  # another account is not affected
    assert (await api.call("POST", "/billing/crypto/checkout", order, token=other["token"]))[0] == 200


@pytest.mark.settings(checkouts_per_minute=3, max_open_orders=100)
async def test_checkouts_per_minute_are_limited(api):
    user = await api.register()
    order = {"currency": "USDTTRC20", "amount_usd": 20}
    statuses = [(await api.call("POST", "/billing/crypto/checkout", order, token=user["token"]))[0] for _ in range(5)]
    assert statuses == [200, 200, 200, 429, 429]


# --- smaller leaks -----------------------------------------------------------------------------------------------
async def test_no_secret_reaches_the_log_even_at_debug(mongo, upstream_url, tmp_path):
    gw = Gateway(mongo.uri, upstream_url, f"p_{uuid.uuid4().hex[:10]}", LOG_LEVEL="DEBUG")
    log_path = tmp_path / "gateway.log"
    with open(log_path, "wb") as log_file:
        gw.stderr = log_file  # the child keeps its own copy of the descriptor
        await gw.launch()
        try:
            email, password, marker = f"d{uuid.uuid4().hex[:8]}@example.com", "debug level passphrase", "ft-secret-7731"
            session = orjson.loads(
                (await gw.call("POST", "/auth/register", {"email": email, "password": password})).body
            )
            auth = {"Authorization": f"Bearer {session['token']}"}
            await gw.call("POST", "/auth/attribution", {"first_touch": {"utm_source": marker}}, **auth)
            key = orjson.loads((await gw.call("POST", "/keys", {"name": "k"}, **auth)).body)
            await gw.call("GET", f"/keys/{key['key_id']}/reveal", **auth)
            await gw.call("POST", f"/keys/{key['key_id']}/topup", {"credits": 1000}, **auth)
            # A customer's query text is its own business: no logger prints it (libcurl's trace did, at DEBUG).
            await gw.call("GET", "/social/user/info?userName=query-text-5519", **{"X-API-Key": key["key"]})
            login = orjson.loads((await gw.call("POST", "/auth/login", {"email": email, "password": password})).body)
            change = {"current_password": password, "new_password": "another debug passphrase"}
            changed = await gw.call("POST", "/auth/password", change, **{"Authorization": f"Bearer {login['token']}"})
            # Webhook signing secrets: created, rolled, used to sign a delivery that is logged as failed first.
            receiver = Receiver()
            receiver.status = 500
            auth = {"Authorization": f"Bearer {orjson.loads(changed.body)['token']}"}
            hook = orjson.loads((await gw.call("POST", "/webhooks", {"url": receiver.url}, **auth)).body)
            rolled = orjson.loads((await gw.call("POST", f"/webhooks/{hook['endpoint_id']}/roll", {}, **auth)).body)
            await gw.call("POST", f"/webhooks/{hook['endpoint_id']}/test", {}, **auth)
            for _ in range(100):
                if receiver.raw:
                    break
                await asyncio.sleep(0.05)
            assert receiver.raw, "the test event was never sent"
            await asyncio.sleep(1.0)  # a usage flush
        finally:
            await asyncio.to_thread(gw.stop)
    receiver.stop()
    text = log_path.read_text()
    assert "DEBUG" in text  # the level really was DEBUG
    whsec = (hook["secret"], rolled["secret"], hook["secret"][6:], rolled["secret"][6:])
    for secret in (password, "scrypt$", marker, key["key"], session["token"], login["token"], "digest", "query-text"):
        assert secret not in text, secret
    for secret in (*whsec, receiver.raw[0][1]["webhook-signature"].split()[0][3:]):
        assert secret not in text, "a webhook secret or signature in the log"


async def test_no_server_header_names_the_version(api):
    user = await api.register()
    for method, path, token in (("GET", "/healthz", None), ("GET", "/nope", None), ("GET", "/keys", user["token"])):
        _, _, headers = await api.call(method, path, token=token)
        assert "Server" not in headers, path


@pytest.mark.settings(env="production")
async def test_production_metrics_need_a_token_or_their_own_port(api):
    status, body, headers = await api.call("GET", "/metrics")
    assert status == 401 and "METRICS_TOKEN" in body["detail"] and headers["WWW-Authenticate"] == "Bearer"


@pytest.mark.settings(env="production", metrics_token="m" * 32)
async def test_production_metrics_with_their_token(api):
    assert (await api.call("GET", "/metrics"))[0] == 401
    status, _, _ = await api.call("GET", "/metrics", headers={"Authorization": "Bearer " + "m" * 32})
    assert status == 200


@pytest.mark.settings(payments_ipn_secret="ipn-secret-for-nesting")
async def test_deeply_nested_payment_notifications_are_refused_not_500(api, caplog):
    for depth in (33, 280, 1000):
        payload = b'{"payment_id":' + b"[" * depth + b"]" * depth + b"}"
        status, body, _ = await api.call(
            "POST", "/billing/crypto/ipn", raw=payload, headers={"x-nowpayments-sig": "0" * 128}
        )
        assert status == 401 and body == {"detail": "Invalid notification signature"}, depth
    assert "Traceback" not in caplog.text and "unhandled error" not in caplog.text


@pytest.mark.settings(max_connections_per_address=5)
async def test_one_address_cannot_hold_many_connections(app, settings):
    sock, port = bind_unused_port()
    server = make_server(app, settings)
    server.add_sockets([sock])
    idle = []
    try:
        for _ in range(5):
            idle.append(await asyncio.open_connection("127.0.0.1", port))
        await asyncio.sleep(0.1)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed on accept, never answered
        except ConnectionResetError:
            pass
        writer.close()
        assert server.refused_connections == 1
        for _, w in idle[:1]:
            w.close()
        await asyncio.sleep(0.2)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (await asyncio.wait_for(reader.read(), 5)).startswith(b"HTTP/1.1 200 ")
        writer.close()
    finally:
        for _, w in idle:
            w.close()
        server.stop()
