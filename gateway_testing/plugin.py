"""The tests' fixtures as a pytest plugin (jupyter_server's pytest_plugin style), registered by tests/conftest.py
(`pytest_plugins = ["gateway_testing.plugin"]`; elsewhere `pytest -p gateway_testing.plugin`): a real SecantusDB
server over TCP and the sandbox upstream as its own process, both started as `serve` starts them; the application
built by app.context.build_context and gateway.make_app as in production; a JSON client for it; a second gateway
context on the same database; an SMTP inbox. pytest-tornado provides io_loop, http_client and base_url."""

import asyncio
import dataclasses
import sys
import urllib.request

import orjson
import pytest

import gateway
from app.context import build_context
from app.embedded import EmbeddedMongo, start_helpers
from app.server import make_server
from app.tasks import start_background
from gateway_testing.helpers import Api, Gateway, Inbox, make_settings


def pytest_configure(config):
    config.addinivalue_line("markers", "settings(**overrides): settings for the app under test")


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


@pytest.fixture
def http_server(request, io_loop, _unused_port, app, ctx):
    """The server `serve` runs (app/server.py make_server: its limits, and the front serving data calls), in
    place of pytest-tornado's plain HTTPServer, on pytest-tornado's port."""
    server = make_server(app, ctx.settings)
    server.add_socket(_unused_port[0])
    yield server
    server.stop()
    io_loop.run_sync(server.close_all_connections, timeout=60)


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
