"""social-gateway: a metered gateway for social-platform data.

Reads top to bottom: load settings -> start what the settings leave embedded
(database, sandbox upstream) -> build one context -> make the app -> serve ->
drain on shutdown. Tests build the app with the same functions.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import logging
import os
import secrets
import signal
import sys

import tornado.httpserver
import tornado.web

import config
from app import commands, workers
from app.context import Context, build_context
from app.embedded import DataDirBusy, Helpers, start_helpers
from app.preflight import SECRETS_FILE, database_problem, start_problem, stored_secrets
from app.server import LISTEN_BACKLOG, LimitedServer, make_server, port_problem, raise_open_file_limit
from app.tasks import start_background
from config import logs
from handlers import (
    account,
    admin,
    alerts,
    audit,
    auth,
    billing,
    keys,
    mcp,
    members,
    openapi,
    ops,
    sandbox,
    social,
    streams,
)
from handlers.base import NotFoundHandler
from handlers.data_plane import DataPlane
from portal import pages
from services.ops import registry

log = logging.getLogger("gateway")
GC_GEN0 = 20_000
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)  # drain and exit
FINAL_WRITES_SECONDS = 2.0  # the final flush's time when calls in flight took all of DRAIN_SECONDS
CLOSE_GRACE = 1.0  # seconds a drain still answers on open connections after its last call in flight
RECONNECT_CODE = 1012  # WebSocket close code "Service Restart": the client reconnects and resumes


# --- 1. settings ---------------------------------------------------------------------------------
def with_dev_secrets(settings: config.Settings) -> config.Settings:
    """Development only: generate JWT_SECRET and SECRETS_KEY once and keep them under DATA_DIR."""
    if settings.jwt_secret and settings.secrets_key:
        return settings
    path = os.path.join(settings.data_dir, SECRETS_FILE)
    os.makedirs(settings.data_dir, exist_ok=True)
    stored = stored_secrets(settings.data_dir)
    if not stored:
        stored = {"jwt_secret": secrets.token_urlsafe(48), "secrets_key": secrets.token_urlsafe(48)}
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(stored, fh)
    return dataclasses.replace(
        settings,
        jwt_secret=settings.jwt_secret or stored["jwt_secret"],
        secrets_key=settings.secrets_key or stored["secrets_key"],
    )


# --- 2. the application (the context is built by app/context.py) --------------------------------------------------------------------------
def make_app(ctx: Context) -> tornado.web.Application:
    # Tornado tries the rules in order: the data plane's first, so a data call does not test every portal
    # pattern before its own (no pattern overlaps another).
    # The WebSockets first: under the data prefixes, whose catch-all answers 404.
    routes = streams.socket_routes if ctx.settings.twitter_alias else streams.socket_routes[:1]
    routes = routes + social.routes + (social.alias_routes if ctx.settings.twitter_alias else [])
    routes += auth.routes + keys.routes + account.routes + billing.routes + admin.routes + ops.routes + sandbox.routes
    routes += alerts.routes + streams.routes
    routes += audit.routes  # the audit log
    routes += pages.routes  # the web portal at /, its files, and the interactive docs at /docs
    if not ctx.settings.metrics_port:
        routes += ops.metrics_routes
    routes += members.routes  # members, roles and invitations (issue 37)
    routes += mcp.routes  # the MCP server for AI agents (docs/mcp.md)
    view = ctx.view  # what the handlers see of the process (handlers/context.py)
    bound = [(route[0], route[1], {"ctx": view, **(route[2] if len(route) > 2 else {})}) for route in routes]
    # A data GET is served before routing, straight on its connection (handlers/data_plane.py).
    app = DataPlane(
        view,
        social.data_paths(ctx.settings.twitter_alias),
        bound,
        default_handler_class=NotFoundHandler,
        default_handler_args={"ctx": view},
        compress_response=False,
        xheaders=False,
        log_function=lambda handler: None,  # BaseHandler.on_finish writes the access log
        **pages.app_settings(view),  # templates, versioned static URLs, XSRF cookies
    )
    # Each route's least role, from the OpenAPI operations: the one declaration the check and the document read.
    app.settings["operations"] = openapi.route_operations(app.wildcard_router.rules)
    return app


def reload(ctx: Context, environ=None) -> bool:
    """SIGHUP: re-read price rules and plan tiers (CONFIG_FILE, environment) while connections stay open.

    Only these two change; every other setting needs a restart."""
    try:
        fresh = config.load(environ)
    except (config.SettingsError, OSError) as exc:
        log.error("reload refused, the current price rules and plan tiers stay: %s", exc)
        return False
    # One shared state (runtime/state.py): the next call and poll of every part read the new rules from it.
    ctx.settings = dataclasses.replace(ctx.settings, price_rules=fresh.price_rules, plan_rules=fresh.plan_rules)
    ctx.account_cache.clear()  # cached views carry a plan computed with the old tiers
    log.info("reloaded price rules and plan tiers")
    return True


async def shutdown(ctx: Context, tasks: list[asyncio.Task], server: LimitedServer | None = None) -> None:
    """Waits for calls in flight, then persists every usage record and returns every lease; all of it within
    DRAIN_SECONDS whatever the database does (or FINAL_WRITES_SECONDS after the calls in flight, when they took
    all of it). Records the database has not taken by then are kept on local disk for the next start. Then the
    WebSocket clients are told to reconnect (`goodbye`).

    With `server` (it stopped accepting, and each of its answers now closes its connection): first the calls
    that come on connections already open are answered too, until none is in flight and the clients have
    closed those connections (or CLOSE_GRACE after the last call); a client is never refused on a connection it
    had, which would fail its call while another process serves the port (a replacement, a hand-over)."""
    ctx.stopping = True  # readiness says draining
    ctx.poller.stopped = True  # no new polls; those under way finish with the calls
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ctx.settings.drain_seconds
    if server is not None:
        await answer_open_connections(ctx, server, deadline)
    ctx.draining = True  # data calls from here on get 503
    await asyncio.sleep(0.05)  # calls between authentication and reservation reach the ledger
    while ctx.meter.ledger.in_flight() and loop.time() < deadline:
        await asyncio.sleep(0.05)
    for task in tasks:
        task.cancel()
    try:
        async with asyncio.timeout_at(max(deadline, loop.time() + FINAL_WRITES_SECONDS)):
            await ctx.poller.stop()  # before the final flush: a poll cut short releases its reservations
            await ctx.calls.close()  # answers on their way to the shared cache
            await final_flush(ctx)
            await last_look(ctx)
            await let_go(ctx)
    except TimeoutError:
        log.error("the database did not take the final writes by the drain deadline (DRAIN_SECONDS)")
    await keep_unwritten(ctx)
    await goodbye(ctx)
    await ctx.outbox.close()
    ctx.upstream.close()
    ctx.executor.shutdown(wait=False)
    try:
        async with asyncio.timeout(FINAL_WRITES_SECONDS):  # a client's close says goodbye to the server
            await ctx.client.close()
    except TimeoutError:
        pass


async def answer_open_connections(ctx: Context, server: LimitedServer, deadline: float) -> None:
    """Until no call is in flight and no connection is open (each answer closes its own), or CLOSE_GRACE after
    the last call, or the deadline. Connections still open then are idle ones: closed."""
    loop = asyncio.get_running_loop()
    quiet_since = loop.time()
    while loop.time() < deadline:
        await asyncio.sleep(0.05)
        if ctx.meter.ledger.in_flight():
            quiet_since = loop.time()
        elif not server.open_connections() or loop.time() - quiet_since >= CLOSE_GRACE:
            break
    await server.close_all_connections()


async def goodbye(ctx: Context) -> None:
    """The WebSocket clients told to reconnect (1012, Service Restart, docs/streams.md) once they have had every
    event written until now (one last look at what other processes wrote), and what each had is kept on its
    key's hold (Hub.goodbye): resuming elsewhere from its last event, a client misses none and gets none twice.
    This process let go of those holds before (let_go): the reconnection is not refused as a second socket."""
    if not ctx.hub.count():
        return
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(FINAL_WRITES_SECONDS):
            await ctx.hub.tail()
    except Exception as exc:
        log.warning("the last look at other processes' stream events failed (%s)", type(exc).__name__)
    await ctx.hub.goodbye(RECONNECT_CODE, "Service restart: reconnect with since_event_id")
    until = loop.time() + FINAL_WRITES_SECONDS
    while ctx.hub.count() and loop.time() < until:  # the close frames on their way
        await asyncio.sleep(0.05)


async def final_flush(ctx: Context) -> None:
    """Every usage record written and every lease returned, and every provider request in the cost ledger, tried
    again until it works (or the deadline)."""
    for close, buffer, what in (
        (ctx.meter.close, ctx.meter.buffer, "usage records"),
        (ctx.costs.close, ctx.costs.buffer, "cost-ledger entries"),
    ):
        while True:
            try:
                await close()
                break
            except Exception as exc:
                log.error("final flush failed (%s), %d %s pending; retrying", type(exc).__name__, len(buffer), what)
                await asyncio.sleep(0.2)


async def keep_unwritten(ctx: Context) -> None:
    """What the final flush could not write goes to DATA_DIR, for the next start (accounting/unwritten.py). Cost-ledger
    entries are the operator's figures, not a charge: those the database did not take are counted in the log."""
    if len(ctx.costs.buffer):
        log.error("%d cost-ledger entries not written by the drain deadline: lost", len(ctx.costs.buffer))
    pending = len(ctx.meter.buffer)
    if not pending:
        return
    try:
        kept = await ctx.meter.keep_unwritten()
    except OSError as exc:
        log.error("could not keep %d unwritten usage records on disk (%s): they are lost", pending, exc)
        return
    log.error("kept %d unwritten usage records under DATA_DIR; the next start writes them", kept)


async def last_look(ctx: Context) -> None:
    """The alert check once more after the final flush: when this process's flush is the last to store the
    spend behind a crossing, it is the one that sees the crossing (Meter._stored), and it is about to exit."""
    try:
        await ctx.alerts.check_once()
    except Exception as exc:
        log.warning(
            "the last alert check failed (%s); a crossing is seen by the next check anywhere", type(exc).__name__
        )


async def let_go(ctx: Context) -> None:
    """After the final flush (a failure here must not cost a usage record): the rules this process polled and
    its sockets' holds on their keys are free at once, not when their leases run out."""
    for step, what in ((ctx.poller.close, "stream rules"), (ctx.hub.close, "socket holds")):
        try:
            await step()
        except Exception as exc:
            log.warning(
                "could not let go of this process's %s (%s); they free when they expire", what, type(exc).__name__
            )


# --- 3. serve --------------------------------------------------------------------------------------
async def serve(
    settings: config.Settings,
    helpers: Helpers | None = None,
    seat: workers.Seat | None = None,
) -> None:
    """One gateway process; with `seat`, a worker of `serve --workers N` (app/workers.py): the sockets it
    inherited, which worker it is and where its siblings are. `settings` name the database and upstream;
    `helpers` are what was started for them here (this process supervises them)."""
    worker = seat.index if seat else None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def stop_during_start() -> None:
        # A second signal before start-up is done (a database that does not answer) ends the process.
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
        stop.set()

    # Before build_context registers this process: a SIGTERM during start-up (a worker restarted just
    # as the parent is stopped) must end in the clean shutdown below, not in the default action, which
    # left the process's registration behind (and, were it holding any, its leases until LEASE_TIMEOUT).
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop_during_start)
    ctx = await build_context(settings, worker, seat.generation if seat else 1)
    if seat:
        ctx.scrape = seat.scrape
        ctx.calls.tiers.link(seat.scrape.index, seat.scrape.peer_ports, seat.scrape.secret)  # each key's owner
        ctx.embedded_db_restarts = seat.db_restarts
    elif helpers is not None and helpers.embedded is not None:
        ctx.embedded_db_restarts = lambda: helpers.embedded.restarts
    # main() sent logging to stderr in LOG_FORMAT: access lines go there in batches, in the same format.
    ctx.access_log.stream = sys.stderr
    ctx.access_log.as_json = logs.json_wanted(settings.log_format, settings.env)
    server = make_server(make_app(ctx), settings)  # body, header and slow-client limits (app/server.py)
    tune_gc()
    if not seat:  # a worker accepts on its parent's socket once admitted (below)
        server.listen(settings.port, settings.host, reuse_port=True, backlog=LISTEN_BACKLOG)
    metrics_server = None
    peer_server = None
    if seat:
        peer_server = tornado.httpserver.HTTPServer(ops.peer_app(ctx.view))
        peer_server.add_sockets(seat.peer_sockets)
    if settings.metrics_port:  # each worker of --workers N on its own port (the parent's): METRICS_PORT + index
        metrics_server = tornado.httpserver.HTTPServer(ops.metrics_app(ctx.view))
        if seat:
            metrics_server.add_sockets(seat.metrics_sockets)
        else:
            metrics_server.listen(settings.metrics_port, settings.host)
    tasks = start_background(ctx)
    supervisor = None
    if helpers is not None:
        if helpers.embedded is not None:  # until the final writes are done: they need the database too
            supervisor = asyncio.create_task(helpers.embedded.supervise(), name="embedded-database")
        announce(settings, helpers)
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)  # a stop asked for during start-up is still set
    loop.add_signal_handler(signal.SIGHUP, reload, ctx)
    if seat:  # ready; it accepts once its parent admits its generation (the old one then stops)
        seat.ready()
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait([asyncio.create_task(seat.admitted()), stopped], return_when=asyncio.FIRST_COMPLETED)
        if not stopped.done():
            server.add_sockets(seat.sockets)
    await stop.wait()
    log.info("shutting down: no new connections, draining calls in flight")
    server.stop()
    server.close_after_each_answer()
    for side_server in (metrics_server, peer_server):
        if side_server:
            side_server.stop()
    await shutdown(ctx, tasks, server)
    if supervisor is not None:
        supervisor.cancel()
    await server.close_all_connections()
    ctx.access_log.flush()  # the lines of the last calls
    ctx.scrape.final(registry(ctx))  # the counters of the drain, for the worker that replaces this one
    log.info("stopped cleanly")


def tune_gc() -> None:
    """Garbage collection off the per-call budget: what start-up built lives as long as the process, so it
    leaves the collector's view (gc.freeze), and young collections run every GC_GEN0 allocations instead
    of every 700. Measured under load: collections cost ~35 us per call, mostly full passes over start-up
    objects; with this, a few."""
    gc.freeze()
    gc.set_threshold(GC_GEN0, 20, 50)


def announce(settings: config.Settings, helpers: Helpers, workers_line: str = "") -> None:
    """The start-up message: where it listens, what it uses, then the user's next steps."""
    shown = "127.0.0.1" if settings.host in ("", "0.0.0.0", "::") else settings.host
    base = f"http://{shown}:{settings.port}"
    steps = [f"  web portal:      {base}/   (sign up, API keys, usage, buy credits)", f"  API docs:        {base}/docs"]
    if not settings.production:
        steps.append(f"  sandbox catalog: {base}/sandbox/catalog   (valid userNames and ids)")
    steps.append(
        f"  register:        curl -s {base}/auth/register "
        """-d '{"email":"me@example.com","password":"a long passphrase"}'"""
    )
    message = (
        f"social-gateway listening on http://{settings.host}:{settings.port}\n{workers_line}"
        f"  environment: {settings.env}\n  database:    {helpers.database}\n  upstream:    {helpers.upstream}\n"
        "next steps (README, A first session):\n" + "\n".join(steps)
    )
    if logs.json_wanted(settings.log_format, settings.env):  # a log pipeline reads stdout too: one object
        log.info("%s", message)
    else:
        print(message, flush=True)


def run_service(settings: config.Settings, count: int | None) -> int:
    """Starts what the settings leave embedded, then one gateway here, or `count` workers under this process
    (`--workers`, one included: the supervisor that replaces them on SIGUSR2)."""
    files = raise_open_file_limit()
    log.debug("event loop %s, open-file limit %d", settings.event_loop, files)
    if files < 2 * settings.upstream_max_connections + 256:
        log.warning(
            "open-file limit %d carries about %d calls in flight (UPSTREAM_MAX_CONNECTIONS %d): raise it (ulimit -n)",
            files,
            (files - 256) // 2,
            settings.upstream_max_connections,
        )
    if settings.event_loop == "uvloop":  # the asyncio.run below runs on uvloop (a worker installs its own)
        import uvloop

        uvloop.install()
    try:
        helpers = start_helpers(settings)
    except DataDirBusy as exc:
        print(f"social-gateway: {exc}: stop it first, or set DATA_DIR to another folder", file=sys.stderr)
        return 1
    except RuntimeError as exc:  # the embedded database or the sandbox did not start
        print(f"social-gateway: {exc}", file=sys.stderr)
        return 1
    try:
        # Before any process uses the database: a database migrated away, or one written with another SECRETS_KEY,
        # is refused; a newer schema too, an older one brought forward (app/preflight.py).
        problem = start_problem(helpers.settings, helpers.database)
        if problem:
            print(f"social-gateway: {problem}", file=sys.stderr)
            return 1
        if count is None:
            asyncio.run(serve(helpers.settings, helpers=helpers))
            return 0
        # What the workers do not read themselves (app/workers.py): where the parent listens, and the helpers
        # it runs. Every other setting each worker reads at its start: a replacement (SIGUSR2) reads them anew.
        fixed = {"host": helpers.settings.host}
        if helpers.embedded is not None:
            fixed["mongodb_uri"] = helpers.settings.mongodb_uri
        if helpers.sandbox:
            fixed["upstream_url"] = helpers.settings.upstream_url
        return workers.run(
            helpers.settings,
            count,
            [sys.executable, os.path.abspath(__file__), workers.WORKER_COMMAND],
            fixed,
            lambda s: announce(s, helpers, f"  workers:     {count} processes\n"),
            helpers.revive,
            helpers.embedded,
        )
    finally:
        helpers.stop()


# --- command line ------------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="social-gateway",
        description=__doc__.splitlines()[0],
        epilog=config.describe(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument("--version", action="version", version=f"social-gateway {config.VERSION}")
    subcommands = top.add_subparsers(dest="command", required=True)
    run = subcommands.add_parser(
        "serve", help="run the gateway", epilog=config.describe(), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    run.add_argument("--host", help="address to listen on (GATEWAY_HOST; default 127.0.0.1 in development)")
    run.add_argument("--port", type=int, help="port to listen on (GATEWAY_PORT, default 8000)")
    run.add_argument(
        "--workers",
        type=int,
        help="gateway processes sharing the port under a supervising one, which replaces them on SIGUSR2 "
        "(default: one process, no supervisor; see docs/scale-out.md for QPS_DIVISOR, docs/operations.md "
        "for reloading)",
    )
    commands.add_commands(subcommands)
    return top


def worker_main() -> int:
    """A worker of `serve --workers N`, started by its parent as a fresh interpreter (app/workers.py): the code
    on disk now, and the settings read now (CONFIG_FILE and the environment) over what the parent fixed."""
    seat = workers.seat()
    logs.configure_from(os.environ)
    settings = config.load_for_command(serving=True, **seat.fixed)
    if settings is None:
        return 2
    logs.configure(settings.log_level, logs.json_wanted(settings.log_format, settings.env))
    if not settings.production:
        settings = with_dev_secrets(settings)
    if settings.event_loop == "uvloop":
        import uvloop

        uvloop.install()
    try:
        asyncio.run(serve(settings, seat=seat))
    except BaseException:
        log.exception("worker %d failed", seat.index)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    if (sys.argv[1:] if argv is None else argv) == [workers.WORKER_COMMAND]:
        return worker_main()
    args = parser().parse_args(argv)
    logs.configure_from(os.environ)
    if args.command != "serve":
        return commands.run(args)
    settings = config.load_for_command(serving=True, host=args.host, port=args.port)
    if settings is None:
        return 2
    logs.configure(settings.log_level, logs.json_wanted(settings.log_format, settings.env))
    if not settings.production:
        settings = with_dev_secrets(settings)
    if args.workers is not None and args.workers < 1:
        print("social-gateway: --workers must be at least 1", file=sys.stderr)
        return 2
    # Before anything starts: a busy port or an unreachable database is one clear line, not a traceback
    # after the helpers are up.
    problem = port_problem(settings.host, settings.port) or (
        settings.mongodb_uri and database_problem(settings.mongodb_uri)
    )
    if problem:
        print(f"social-gateway: {problem}", file=sys.stderr)
        return 1
    return run_service(settings, args.workers)


if __name__ == "__main__":
    sys.exit(main())
