"""What the fixtures and the tests share: test settings, a JSON client for the app under test, a gateway process
driven from the event loop, an SMTP inbox, and small waits on conditions (never on time)."""

import asyncio
import uuid

import orjson
from tornado.httpclient import AsyncHTTPClient, HTTPRequest

import config
from app.embedded import free_port
from gateway_testing.stack import GatewayProcess, gateway_env

UPSTREAM_KEY = "test-upstream-key"
PASSWORD = "correct horse battery"
FAST = ({"name": "fast", "min_paid_usd": 0, "qps": 100000},)  # a plan without a QPS limit to speak of


def make_settings(**overrides) -> config.Settings:
    """Test settings: cheap password hashing, a fresh database per test, no environment."""
    base = dict(
        jwt_secret="j" * 40,
        secrets_key="s" * 40,
        password_scrypt_n=2**10,
        mongodb_db=f"t_{uuid.uuid4().hex[:12]}",
        upstream_api_key=UPSTREAM_KEY,
        data_dir="/nonexistent",
        port=0,
        # Tests that count charges or provider calls mean live reads: the answer cache is off unless a test
        # turns it on (tests/data/test_answer_cache.py). Identical calls in flight at once still make one call.
        cache_max_bytes=0,
        # In-process contexts have no DATA_DIR; a test of the usage journal gives one (tests/metering/test_journal.py).
        journal=False,
    )
    return config.load(environ={}, **{**base, **overrides})


class Api:
    """A small JSON client for the app under test."""

    def __init__(self, http_client, base_url):
        self.http, self.base = http_client, base_url

    async def call(
        self,
        method: str,
        path: str,
        body=None,
        token: str | None = None,
        key: str | None = None,
        headers: dict | None = None,
        raw: bytes | None = None,
        timeout: float = 20,
    ):
        all_headers = dict(headers or {})
        if token:
            all_headers["Authorization"] = f"Bearer {token}"
        if key:
            all_headers["X-API-Key"] = key
        data = raw if raw is not None else (orjson.dumps(body) if body is not None else None)
        if method in ("GET", "DELETE"):
            data = None
        elif data is None:
            data = b""
        response = await self.http.fetch(
            HTTPRequest(self.base + path, method=method, body=data, headers=all_headers, request_timeout=timeout),
            raise_error=False,
        )
        try:
            parsed = orjson.loads(response.body) if response.body else None
        except orjson.JSONDecodeError:
            parsed = response.body
        return response.code, parsed, response.headers

    async def register(self, email: str | None = None, password: str = PASSWORD) -> dict:
        email = email or f"user-{uuid.uuid4().hex[:10]}@example.com"
        status, body, _ = await self.call("POST", "/auth/register", {"email": email, "password": password})
        assert status == 200, body
        return {**body, "email": email}

    async def new_key(self, token: str, name: str = "test") -> dict:
        status, body, _ = await self.call("POST", "/keys", {"name": name}, token=token)
        assert status == 200, body
        return body

    async def funded_key(self, credits: int = 1_000_000) -> tuple[dict, dict]:
        """A registered account with `credits` (a development top-up: paid plan) and one key."""
        user = await self.register()
        key = await self.new_key(user["token"])
        status, body, _ = await self.call(
            "POST", f"/keys/{key['key_id']}/topup", {"credits": credits}, token=user["token"]
        )
        assert status == 200, body
        return user, key


async def balance(api: Api, user: dict) -> int:
    """The account's credits as GET /account shows them to its holder."""
    return (await api.call("GET", "/account", token=user["token"]))[1]["credits"]


# --- the gateway as a process --------------------------------------------------------------------------
class Gateway(GatewayProcess):
    """gateway_testing/stack.py's process harness with an async client, for tests running on the event loop."""

    started: list["Gateway"] = []  # killed after each test, whatever its outcome (plugin.reap_gateways)

    def __init__(
        self, mongo_uri: str, upstream_url: str, db_name: str, port: int = 0, workers: int = 1, supervised=False, **env
    ):
        super().__init__(
            # The answer cache off, as in make_settings, unless the test turns it on.
            gateway_env(
                mongo_uri,
                db_name,
                upstream_url,
                UPSTREAM_KEY,
                **{"FLUSH_INTERVAL": "0.3", "CACHE_MAX_BYTES": "0", **env},
            ),
            port,
            workers,
            supervised=supervised,
        )

    async def launch(self) -> "Gateway":
        """Starts the process without blocking the event loop (in-process gateways keep serving meanwhile)."""
        Gateway.started.append(self)
        await asyncio.to_thread(self.start)
        return self

    async def call(self, method: str, path: str, body=None, **headers):
        response = await AsyncHTTPClient(max_clients=100).fetch(
            HTTPRequest(
                self.url + path,
                method=method,
                body=orjson.dumps(body) if body is not None else None,
                headers=headers,
                request_timeout=30,
            ),
            raise_error=False,
        )
        return response


async def gathered(items: list, count: int, seconds: float = 20.0) -> list:
    """Waits until `items` (filled by a receiver) holds `count` (not a timing assertion: a bound on a hang)."""
    for _ in range(int(seconds / 0.05)):
        if len(items) >= count:
            break
        await asyncio.sleep(0.05)
    return items


class Inbox:
    """A real SMTP server in this process (aiosmtpd, in its own thread): every message it accepts."""

    def __init__(self):
        from aiosmtpd.controller import Controller

        inbox = self
        self.messages: list[dict] = []

        class Handler:
            async def handle_DATA(self, server, session, envelope):
                inbox.messages.append({"to": envelope.rcpt_tos, "data": envelope.content.decode()})
                return "250 OK"

        self.port = free_port()  # held: no other test process can take it before the controller binds it
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)
        self.controller.start()

    async def until(self, count: int) -> list[dict]:
        return await gathered(self.messages, count)

    def stop(self) -> None:
        self.controller.stop()
