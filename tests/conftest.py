"""Shared fixtures: a real SecantusDB server over TCP, the sandbox upstream as its own
process, and the application built by app.context.build_context and gateway.make_app like in production.
What the tests share besides fixtures is in tests/support.py."""

import asyncio
import dataclasses
import sys
import urllib.request
import uuid

import orjson
import pytest
from support import PASSWORD, Gateway, Inbox, SearchProvider, make_settings, use_upstream
from tornado.httpclient import HTTPRequest

import gateway
from app.context import build_context
from app.embedded import EmbeddedMongo, start_helpers
from app.tasks import start_background


@pytest.fixture(scope="session")
def helpers():
    """The in-memory database and the sandbox upstream, started by the same function as `serve` uses."""
    started = start_helpers(make_settings(mongodb_uri="", upstream_url=""), storage_path=":memory:")
    yield started
    started.stop()


@pytest.fixture(scope="session")
def mongo(helpers):
    return next(p for p in helpers.processes if isinstance(p, EmbeddedMongo))


@pytest.fixture(scope="session")
def upstream_url(helpers):
    return helpers.settings.upstream_url


@pytest.fixture(scope="session")
def catalog(upstream_url):
    with urllib.request.urlopen(upstream_url + "/sandbox/catalog") as response:
        return orjson.loads(response.read())


@pytest.fixture(autouse=True)
def reap_gateways():
    """A failed assertion must not leave gateway processes running (their workers die with them)."""
    yield
    while Gateway.started:
        Gateway.started.pop().kill()


@pytest.fixture
def inbox():
    """An SMTP server in this process that keeps what it receives (tests/support.py)."""
    started = Inbox()
    yield started
    started.stop()


@pytest.fixture
def settings(request):
    """Per-test settings: @pytest.mark.settings(name=value, ...) overrides."""
    marker = request.node.get_closest_marker("settings")
    return make_settings(**(marker.kwargs if marker else {}))


@pytest.fixture
def ctx(io_loop, settings, mongo, upstream_url):
    ctx = io_loop.run_sync(
        lambda: build_context(dataclasses.replace(settings, mongodb_uri=mongo.uri, upstream_url=upstream_url))
    )
    tasks = io_loop.run_sync(_start_tasks(ctx))
    yield ctx

    async def teardown():
        for task in tasks:
            task.cancel()
        # A change-stream read in flight must end before the loop does. A task that outlives its cancellation
        # is a bug: name it and show where it waits, rather than hang the run.
        _, stuck = await asyncio.wait(tasks, timeout=20)
        for task in stuck:
            task.print_stack(file=sys.stderr)
        assert not stuck, f"background tasks ignored their cancellation: {[t.get_name() for t in stuck]}"
        await ctx.client.drop_database(settings.mongodb_db)
        await ctx.client.close()
        ctx.upstream.close()  # idempotent, also after gateway.shutdown
        ctx.executor.shutdown(wait=False)

    io_loop.run_sync(teardown, timeout=60)


def _start_tasks(ctx):
    async def start():
        return start_background(ctx)

    return start


@pytest.fixture
def app(ctx):
    return gateway.make_app(ctx)


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


@pytest.fixture
def api(http_client, base_url):
    return Api(http_client, base_url)


@pytest.fixture
def second(io_loop, ctx):
    """A second gateway context on the same database, in this process: another process as far as the
    database can tell (its own process id and node name, caches and coherence task)."""

    async def start():
        other = await build_context(ctx.settings, worker=1)
        return other, start_background(other)

    other, tasks = io_loop.run_sync(start)
    yield other

    async def stop():
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)
        await other.client.close()
        other.upstream.close()
        other.executor.shutdown(wait=False)

    io_loop.run_sync(stop)


@pytest.fixture
def provider(ctx):
    """The stream tests' scripted search provider, in place of the sandbox for the context and its poller."""
    scripted = SearchProvider()
    use_upstream(ctx, scripted.url)
    ctx.poller.upstream = ctx.upstream
    yield scripted
    scripted.stop()
