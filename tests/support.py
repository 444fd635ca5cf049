"""What the tests share besides fixtures (those are in conftest.py): test settings, the sandbox
queries, a recording upstream, and the gateway as a real process (the harness bench/ uses too)."""

import asyncio
import uuid
from urllib.parse import urlencode

import orjson
import tornado.httpserver
import tornado.testing
import tornado.web
from tornado.httpclient import AsyncHTTPClient, HTTPRequest

import config
from app.embedded import free_port
from bench.stack import GatewayProcess, gateway_env
from social.upstream import Breaker, UpstreamClient
from storage import db as database
from storage.usage import UsageStore

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
        # turns it on (tests/test_answer_cache.py). Identical calls in flight at once still make one call.
        cache_max_bytes=0,
    )
    return config.load(environ={}, **{**base, **overrides})


# --- the data plane ----------------------------------------------------------------------------------
def valid_query(endpoint, catalog) -> dict:
    """Values from the sandbox catalog for every required parameter (and the usual optional ones)."""
    users, tweets = catalog["users"], catalog["tweets"]
    values = {
        "query": "from:" + users[0]["userName"],
        "userId": users[0]["id"],
        "user_id": users[0]["id"],
        "userName": catalog["big_accounts"][0],
        "tweetId": tweets[0],
        "community_id": catalog["communities"][0],
        "space_id": catalog["spaces"][0],
        "listId": catalog["lists"][0],
        "userIds": ",".join(u["id"] for u in users[:3]),
        "tweet_ids": ",".join(tweets[:2]),
        "list_id": catalog["lists"][0],
        "source_user_name": users[0]["userName"],
        "target_user_name": catalog["big_accounts"][0],
        "tweet_id": catalog["articles"][0],
    }
    # followers_ids and last_tweets take userName or userId, both optional in the spec.
    return {p.name: values[p.name] for p in endpoint.params if p.required or p.name == "userName"}


def qs(params: dict) -> str:
    return urlencode(params)


def use_upstream(ctx, url: str, **kw) -> None:
    """Points the app under test at another upstream (a faulty sandbox, a recorder)."""
    s = ctx.settings
    ctx.upstream.close()
    ctx.upstream = UpstreamClient(
        url,
        kw.get("keys") or s.upstream_api_key,
        s.upstream_path_prefix,
        kw.get("connect_timeout", 1.0),
        kw.get("timeout", s.upstream_timeout),
        kw.get("pool", 8),
        kw.get("max_body", s.upstream_max_body_bytes),
        # One account's failures open it here (the mechanics); test_isolation.py passes the production
        # breaker to test attribution.
        kw.get("breaker") or Breaker(kw.get("breaker_failures", 1000), 0.3, min_accounts=kw.get("min_accounts", 1)),
    )


class Recorder(tornado.web.RequestHandler):
    """An upstream that records what the gateway sends and answers a fixed body."""

    def initialize(self, seen, status, body):
        self.seen, self.status, self.body = seen, status, body

    def get(self, path):
        self.seen.append(
            {"path": self.request.path, "query": self.request.query, "headers": dict(self.request.headers)}
        )
        self.set_status(self.status)
        self.finish(self.body)


async def recorder(status=200, body=b'{"status":"success","msg":"","data":{"id":"1"}}'):
    seen = []
    sock, port = tornado.testing.bind_unused_port()
    server = tornado.httpserver.HTTPServer(
        tornado.web.Application([(r"(.*)", Recorder, dict(seen=seen, status=status, body=body))])
    )
    server.add_sockets([sock])
    return server, f"http://127.0.0.1:{port}", seen


# --- the gateway as a process --------------------------------------------------------------------------
class Gateway(GatewayProcess):
    """bench/stack.py's process harness with an async client, for tests running on the event loop."""

    started: list["Gateway"] = []  # killed after each test, whatever its outcome (conftest.reap_gateways)

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


async def account_with_keys(gw: Gateway, credits: int, keys: int) -> tuple[dict, list[str], dict]:
    """A new account on `gw` with `keys` API keys and `credits` (a development top-up): (user, secrets, auth headers)."""
    user = orjson.loads(
        (
            await gw.call(
                "POST",
                "/auth/register",
                {"email": f"s{uuid.uuid4().hex[:8]}@example.com", "password": "process test pass"},
            )
        ).body
    )
    auth = {"Authorization": f"Bearer {user['token']}"}
    made = [orjson.loads((await gw.call("POST", "/keys", {"name": f"k{i}"}, **auth)).body) for i in range(keys)]
    if credits:
        await gw.call("POST", f"/keys/{made[0]['key_id']}/topup", {"credits": credits}, **auth)
    return user, [k["key"] for k in made], auth


async def ledger_of(mongo_uri: str, db_name: str, account_id: str) -> tuple[dict, list[dict]]:
    """The account document and its usage records, read straight from the database."""
    client = database.connect(mongo_uri)
    db = client[db_name]
    account = await db.accounts.find_one({"_id": account_id})
    records = await UsageStore(db).records({"account_id": account_id})
    await client.close()
    return account, records


# --- a webhook receiver ---------------------------------------------------------------------------------
class _Hook(tornado.web.RequestHandler):
    def initialize(self, receiver):
        self.receiver = receiver

    def post(self):
        self.receiver.take(self.request.body, {k.lower(): v for k, v in self.request.headers.items()})
        self.set_status(self.receiver.status)
        if self.receiver.location:
            self.set_header("Location", self.receiver.location)
        self.finish(b"ok")


async def gathered(items: list, count: int, seconds: float = 20.0) -> list:
    """Waits until `items` (filled by a receiver) holds `count` (not a timing assertion: a bound on a hang)."""
    for _ in range(int(seconds / 0.05)):
        if len(items) >= count:
            break
        await asyncio.sleep(0.05)
    return items


class Receiver:
    """A real webhook receiver on loopback: each delivery is verified with the `standardwebhooks` verifier under
    `secret` (set once the endpoint's secret is known); answers `status` (a test may change it)."""

    def __init__(self):
        self.secret: str | None = None
        self.status = 200
        self.location = ""  # a Location header to answer with (a redirect)
        self.raw: list[tuple[bytes, dict]] = []  # every request, as received
        self.verified: list[dict] = []  # payloads whose signature checked out, answered with a 2xx
        self.rejected = 0
        sock, self.port = tornado.testing.bind_unused_port()
        self.server = tornado.httpserver.HTTPServer(tornado.web.Application([(r"/hook", _Hook, {"receiver": self})]))
        self.server.add_sockets([sock])
        self.url = f"http://127.0.0.1:{self.port}/hook"

    def take(self, body: bytes, headers: dict) -> None:
        from standardwebhooks import Webhook

        self.raw.append((body, headers))
        try:
            payload = Webhook(self.secret).verify(body, headers)
        except Exception:
            self.rejected += 1
            return
        if 200 <= self.status < 300:
            self.verified.append({**payload, "webhook-id": headers["webhook-id"]})

    async def until(self, count: int) -> list[dict]:
        return await gathered(self.verified, count)

    def stop(self) -> None:
        self.server.stop()


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
