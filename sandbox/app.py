"""The sandbox upstream's Tornado application.

One generic handler serves every provider path through the endpoints.ENDPOINTS table.
Every endpoint is a pure function of (seed, path, query), so rendered bodies are cached
as bytes: a hot page costs a dict lookup and a socket write.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import random
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import orjson
import tornado.web
from tornado.log import access_log

from . import dialects
from . import faults as faultlib
from .basis import N_BIG
from .endpoints import ENDPOINTS, MOVING, Args, BadRequest, respond
from .more_endpoints import article_tweets
from .world import World, get_world

CACHE_BYTES = 128 * 1024 * 1024
UNAUTHORIZED = orjson.dumps({"status": "error", "msg": "invalid upstream api key"})
NOT_FOUND = orjson.dumps({"status": "error", "msg": "not found"})


class BodyCache:
    """LRU of rendered bodies, bounded by their total size."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.size = 0
        self._bodies: OrderedDict[tuple, bytes] = OrderedDict()

    def get(self, key: tuple) -> bytes | None:
        body = self._bodies.get(key)
        if body is not None:
            self._bodies.move_to_end(key)
        return body

    def put(self, key: tuple, body: bytes) -> None:
        self._bodies[key] = body
        self.size += len(body)
        while self.size > self.max_bytes and len(self._bodies) > 1:
            self.size -= len(self._bodies.popitem(last=False)[1])


@functools.lru_cache(maxsize=4)
def catalog_body(w: World) -> bytes:
    return orjson.dumps(catalog(w))


def catalog(w: World) -> dict:
    """Ids a client can start from.  The first users are the most active ordinary
    accounts (big accounts come last: their follower lists are long); the tweets are a
    sample led by the most-replied ones.  deep_replies and quoted_tweets are helpers
    beyond the contract: replies with the longest ancestor chains, most-quoted tweets."""
    ordinary = sorted(range(N_BIG, len(w.by_author)), key=lambda u: (-len(w.by_author[u]), u))
    users = ordinary + list(range(N_BIG))
    replied = sorted(w.replies, key=lambda i: (-len(w.replies[i]), i))[:500]
    sample = replied + [i for i in range(0, len(w.tweets), 60) if i not in w.replies][:500]
    depth = [0] * len(w.tweets)
    for t in w.tweets:  # parents precede their replies
        if t.parent >= 0:
            depth[t.idx] = depth[t.parent] + 1
    deep = sorted(range(len(w.tweets)), key=lambda i: (-depth[i], i))[:20]
    quoted = sorted(w.quotes, key=lambda i: (-len(w.quotes[i]), i))[:20]
    return {
        "users": [{"userName": w.handles[u], "id": w.user_id(u)} for u in users],
        "tweets": [w.tweets[i].id for i in sample],
        "lists": [lst.id for lst in w.lists if lst.members],
        "empty_lists": [lst.id for lst in w.lists if not lst.members],
        "communities": [c.id for c in w.communities],
        "spaces": [s.id for s in w.spaces],
        "big_accounts": [w.handles[u] for u in range(N_BIG)],
        "deep_replies": [w.tweets[i].id for i in deep],
        "quoted_tweets": [w.tweets[i].id for i in quoted],
        "live_users": [w.handles[u] for u in w.live_core],
        "articles": [w.tweets[i].id for i in article_tweets(w)[-20:]],
    }


class Sandbox:
    """State shared by the handlers of one application."""

    def __init__(self, api_key: str, seed: int, faults: str, clock: Callable[[], float]):
        self.faults = faultlib.parse(faults)  # first: a bad spec fails before the world is built
        self.world = get_world(seed)
        self.api_key = api_key.encode()
        self.fault_rng = random.Random(seed)
        self.cache = BodyCache(CACHE_BYTES)
        self.stats = {"connections": 0, "requests": 0}
        self.hangs: set[asyncio.Future] = set()
        self.catalog = catalog_body(self.world)
        self.clock = clock  # wall-clock seconds: live posts derive from it (sandbox.live)


class JsonHandler(tornado.web.RequestHandler):
    def initialize(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json")

    def compute_etag(self) -> None:
        return None  # hashing large cached bodies on every request would cost more than serving them

    def write_error(self, status_code: int, **kwargs) -> None:
        self.finish(orjson.dumps({"status": "error", "msg": self._reason}))

    def send(self, status: int, body: bytes) -> None:
        self.set_status(status)
        self.finish(body)


class HealthHandler(JsonHandler):
    def get(self) -> None:
        self.send(200, b'{"status":"ok"}')


class StatsHandler(JsonHandler):
    def get(self) -> None:
        self.send(200, orjson.dumps(self.sandbox.stats))


class CatalogHandler(JsonHandler):
    def get(self) -> None:
        self.send(200, self.sandbox.catalog)


class NotFoundHandler(JsonHandler):
    def prepare(self) -> None:
        self.send(404, NOT_FOUND)


class ProviderHandler(JsonHandler):
    """The twitterapi dialect: the spec's paths after the prefix, `X-API-Key`, its envelopes and objects."""

    hang: asyncio.Future | None = None

    @staticmethod
    def error_body(message: str) -> bytes:
        """An error's body in this dialect (faults and a bad X-Sim-Fault header answer with it too)."""
        return orjson.dumps({"status": "error", "msg": message})

    def get(self, path: str) -> Awaitable[None] | None:
        # Not a coroutine: without faults a request is answered synchronously; with faults
        # the returned awaitable is awaited by Tornado.
        sb = self.sandbox
        sb.stats["requests"] += 1
        faults = sb.faults
        header = self.request.headers.get(faultlib.HEADER)
        if header is not None:
            try:
                faults = faultlib.parse(header)
            except ValueError as e:
                self.send(400, self.error_body(str(e)))
                return None
        status, body = self._answer(path)
        if faults is None:
            self.send(status, body)
            return None
        return faultlib.deliver(self, faults, sb.fault_rng, sb.hangs, status, body, self.error_body)

    def _answer(self, path: str) -> tuple[int, bytes]:
        sb = self.sandbox
        key = self.request.headers.get("X-API-Key", "").encode()
        if not hmac.compare_digest(key, sb.api_key):
            return 401, UNAUTHORIZED
        if path not in ENDPOINTS:
            return 404, NOT_FOUND
        args = self.request.query_arguments
        now = int(sb.clock())
        cache_key = (path, tuple(sorted((k, tuple(v)) for k, v in args.items())), now if path in MOVING else 0)
        body = sb.cache.get(cache_key)
        if body is None:
            try:
                body = orjson.dumps(respond(sb.world, path, Args(args, now)))
            except BadRequest as e:
                return 400, orjson.dumps({"status": "error", "msg": str(e)})
            sb.cache.put(cache_key, body)
        return 200, body

    def on_connection_close(self) -> None:
        if self.hang is not None and not self.hang.done():
            self.hang.set_result(None)


def log_request(handler: tornado.web.RequestHandler) -> None:
    """Tornado's access line, with the path and never the query: run by `serve`, the sandbox writes to the
    gateway's output, and a query carries the customer's search or ids, which never go to a log."""
    status, request = handler.get_status(), handler.request
    level = logging.INFO if status < 400 else logging.WARNING if status < 500 else logging.ERROR
    access_log.log(level, "%d %s %s %.2fms", status, request.method, request.path, 1000 * request.request_time())


def normalize_prefix(prefix: str) -> str:
    """'/twitter', 'twitter/' and '/twitter/' all mean '/twitter'; '' or '/' mean the root."""
    prefix = prefix.strip("/")
    return f"/{prefix}" if prefix else ""


def make_app(
    api_key: str,
    prefix: str = "/twitter",
    seed: int = 7,
    faults: str = "",
    clock: Callable[[], float] = time.time,
    dialect: str = "twitterapi",
) -> tornado.web.Application:
    """The sandbox upstream.  `faults` is a run-wide fault spec (see sandbox.faults); `clock`
    gives the wall-clock seconds the live posts follow (tests may pass a fixed one); `dialect` the kind of
    provider it speaks as (sandbox.dialects: twitterapi or socialdata)."""
    provider = dialects.handler(dialect)  # first: an unknown dialect fails before the world is built
    sb = Sandbox(api_key, seed, faults, clock)
    args = {"sandbox": sb}
    return tornado.web.Application(
        [
            (r"/healthz", HealthHandler, args),
            (r"/sandbox/stats", StatsHandler, args),
            (r"/sandbox/catalog", CatalogHandler, args),
            (rf"{re.escape(normalize_prefix(prefix))}/(.+)", provider, args),
        ],
        default_handler_class=NotFoundHandler,
        default_handler_args=args,
        log_function=log_request,
        sandbox=sb,
    )
