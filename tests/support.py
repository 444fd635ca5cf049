"""What the tests share besides fixtures (those are the gateway_testing plugin's): test settings, the sandbox
queries, a recording upstream, accounts on a gateway process, a webhook receiver. The settings, the JSON client,
the gateway process and the SMTP inbox the fixtures use too are gateway_testing/helpers.py's, offered here as well."""

import asyncio
import itertools
import os
import subprocess
import sys
import time
import uuid
from urllib.parse import urlencode

import orjson
import tornado.httpserver
import tornado.testing
import tornado.web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from gateway_testing.helpers import FAST, PASSWORD, UPSTREAM_KEY, Gateway, Inbox, balance, gathered, make_settings
from social.providers.router import DEFAULT, Costs, Provider, Router
from social.upstream import Breaker, UpstreamClient
from storage import db as database
from storage.usage import UsageStore

__all__ = [
    "FAST",
    "PASSWORD",
    "UPSTREAM_KEY",
    "Gateway",
    "Inbox",
    "Receiver",
    "SearchProvider",
    "account_with_keys",
    "charged",
    "balance",
    "count_key_lookups",
    "gathered",
    "ledger_of",
    "make_settings",
    "qs",
    "recorder",
    "storm",
    "use_upstream",
    "valid_query",
]


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
    ledger = ctx.upstream.ledger
    ctx.upstream.close()
    client = UpstreamClient(
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
    # The one provider of an unset PROVIDERS, as app/context.py builds it.
    provider = Provider(DEFAULT, "twitterapi", client, Costs(None))
    ctx.upstream = Router([provider], "order", ledger, s.upstream_timeout, s.breaker_reset_seconds)


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


def count_key_lookups(ctx, monkeypatch) -> list[str]:
    """The digests looked up in the keys collection from now on (the real store still answers)."""
    lookups, store = [], ctx.meter.keys
    by_digest = store.by_digest

    async def counted(digest: str):
        lookups.append(digest)
        return await by_digest(digest)

    monkeypatch.setattr(store, "by_digest", counted)
    return lookups


class SearchProvider:
    """A scripted provider: advanced_search over the tweets the test adds, honouring since_id:, max_id:,
    since_time: and from: as the provider does (newest first, 20 at most), after `delay` seconds; every query
    it was asked is kept."""

    def __init__(self):
        self.tweets: list[dict] = []
        self.queries: list[str] = []
        self.fail = False
        self.delay = 0.0
        self.gate = asyncio.Event()  # cleared: searches wait until it is set again (a poll held mid-flight)
        self.gate.set()
        self.between_pages: list[dict] = []  # posted right after the next first page is answered
        provider = self

        class Search(tornado.web.RequestHandler):
            async def get(self):
                query = self.get_query_argument("query")
                provider.queries.append(query)
                await asyncio.sleep(provider.delay)
                await provider.gate.wait()
                if provider.fail:
                    self.set_status(500)
                    return self.finish(b"{}")
                offset = int(self.get_query_argument("cursor", "0"))
                self.finish(orjson.dumps(provider.answer(query, offset)))
                if offset == 0:  # tweets posted while the poll reads its pages
                    provider.tweets += provider.between_pages
                    provider.between_pages = []

        sock, port = tornado.testing.bind_unused_port()
        self.server = tornado.httpserver.HTTPServer(tornado.web.Application([(r".*/tweet/advanced_search", Search)]))
        self.server.add_sockets([sock])
        self.url = f"http://127.0.0.1:{port}"
        self._next = 1_900_000_000_000_000_000

    def post(self, author: str = "alice", text: str = "hello", later: bool = False) -> str:
        """A new tweet; `later`: posted only once the next first page is answered."""
        self._next += 1
        tweet = {"id": str(self._next), "text": text, "author": {"userName": author}, "t": time.time()}
        (self.between_pages if later else self.tweets).append(tweet)
        return str(self._next)

    def answer(self, query: str, offset: int = 0) -> dict:
        words = dict(w.split(":", 1) for w in query.split() if ":" in w)
        found = [
            t
            for t in self.tweets
            if ("since_id" not in words or int(t["id"]) > int(words["since_id"]))
            and ("max_id" not in words or int(t["id"]) <= int(words["max_id"]))
            and ("since_time" not in words or t["t"] >= int(words["since_time"]))
            and ("from" not in words or t["author"]["userName"].lower() == words["from"].lower())
        ]
        ordered = sorted(found, key=lambda t: int(t["id"]), reverse=True)
        more = len(ordered) > offset + 20
        return {"tweets": ordered[offset : offset + 20], "has_next_page": more, "next_cursor": str(offset + 20)}

    def stop(self):
        self.server.stop()


# --- the operator's commands --------------------------------------------------------------------------------
SCRIPT = os.path.join(os.path.dirname(sys.executable), "social-gateway")  # the installed console script


async def cli(*argv: str, **env: str) -> tuple[int, str, str]:
    """`social-gateway argv...` as an operator runs it, in a shell without the tests' settings:
    (exit code, stdout, stderr)."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    proc = await asyncio.create_subprocess_exec(
        SCRIPT, *argv, env={**keep, "LOG_LEVEL": "WARNING", **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert b"Traceback" not in err, err.decode()
    return proc.returncode, out.decode(), err.decode()


async def storm(targets: list[tuple[Gateway, str]], path: str, count: int) -> list:
    """`count` concurrent calls, round-robin over (gateway, key) pairs; None where the connection died."""
    client = AsyncHTTPClient(force_instance=True, max_clients=count)

    async def one(gw: Gateway, key: str):
        try:
            return await client.fetch(
                HTTPRequest(f"http://127.0.0.1:{gw.port}{path}", headers={"X-API-Key": key}, request_timeout=30),
                raise_error=False,
            )
        except (OSError, HTTPClientError):
            return None

    pairs = itertools.cycle(targets)
    return [asyncio.ensure_future(one(*next(pairs))) for _ in range(count)]


def charged(responses) -> int:
    return sum(int(r.headers["X-Credits-Charged"]) for r in responses if r is not None and r.code == 200)
