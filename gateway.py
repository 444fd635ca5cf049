"""social-gateway: a metered gateway for social-platform data.

Reads top to bottom: load settings -> start what the settings leave embedded
(database, sandbox upstream) -> build one context -> make the app -> serve ->
drain on shutdown. Tests build the app with the same functions.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import secrets
import signal
import socket
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor

import tornado.httpserver
import tornado.web
from pymongo import monitoring

import config
from config import workers
from config.context import Context
from config.metrics import Metrics
from handlers import account, admin, auth, billing, keys, ops, social
from handlers.base import NotFoundHandler
from handlers.limits import make_server
from metering.limiter import RateLimiter
from metering.pricing import Prices
from metering.throttle import LoginThrottle
from payments import cli as payments_cli
from payments.service import build_payments
from security import passwords
from security.apikeys import KeyVault
from social.coherence import Coherence
from social.meter import Meter
from social.upstream import Breaker, UpstreamClient
from storage import db as database
from storage import admin_cli
from storage.accounts import AccountStore
from storage.admin import AdminStore
from storage.changes import ChangeFeed
from storage.embedded import EmbeddedMongo
from storage.keys import KeyStore
from storage.leases import LeaseStore
from storage.usage import UsageStore

log = logging.getLogger("gateway")


# --- 1. settings ---------------------------------------------------------------------------------
def with_dev_secrets(settings: config.Settings) -> config.Settings:
    """Development only: generate JWT_SECRET and SECRETS_KEY once and keep them under DATA_DIR."""
    if settings.jwt_secret and settings.secrets_key:
        return settings
    path = os.path.join(settings.data_dir, "secrets.json")
    os.makedirs(settings.data_dir, exist_ok=True)
    if os.path.exists(path):
        with open(path) as fh:
            stored = json.load(fh)
    else:
        stored = {"jwt_secret": secrets.token_urlsafe(48), "secrets_key": secrets.token_urlsafe(48)}
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(stored, fh)
    return dataclasses.replace(settings, jwt_secret=settings.jwt_secret or stored["jwt_secret"],
                               secrets_key=settings.secrets_key or stored["secrets_key"])


# --- 2. the context ------------------------------------------------------------------------------
class RoundTrips(monitoring.CommandListener):
    """Counts database round trips, for /metrics and the benchmark's round-trips-per-call figure."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def started(self, event) -> None:
        self.metrics.db_round_trips += 1
        self.metrics.db_commands[event.command_name] += 1

    def succeeded(self, event) -> None:
        pass

    def failed(self, event) -> None:
        pass


async def build_context(settings: config.Settings, mongodb_uri: str, upstream_url: str,
                        worker: int | None = None) -> Context:
    metrics = Metrics()
    client = database.connect(mongodb_uri, event_listeners=[RoundTrips(metrics)])
    db = client[settings.mongodb_db]
    await database.ensure_indexes(db)
    accounts, keys_, usage = AccountStore(db), KeyStore(db), UsageStore(db)
    # A process restarted on the same node reclaims its predecessor's leases at once (Meter.start).
    node = f"{socket.gethostname()}:{settings.port}" + (f":{worker}" if worker is not None else "")
    leases = LeaseStore(db, usage, process_id=uuid.uuid4().hex, node=node)
    vault = KeyVault(settings.secrets_key)
    meter = Meter(settings, accounts, keys_, usage, leases, vault, metrics)
    await meter.start()
    upstream = UpstreamClient(
        upstream_url, settings.upstream_api_key, settings.upstream_path_prefix, settings.upstream_connect_timeout,
        settings.upstream_timeout, settings.upstream_max_connections, settings.upstream_max_body_bytes,
        Breaker(settings.breaker_failures, settings.breaker_reset_seconds))
    executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="hash")
    decoy = await asyncio.get_running_loop().run_in_executor(executor, passwords.decoy_hash, settings.password_scrypt_n)
    payments = await build_payments(settings, db, meter.apply_credit)
    admin_store = AdminStore(db)
    await admin_store.ensure_indexes()
    return Context(settings=settings, client=client, accounts=accounts, keys=keys_, usage=usage, vault=vault,
                   key_cache=meter.key_cache, account_cache=meter.account_cache, limiter=RateLimiter(),
                   prices=Prices(settings.price_rules), meter=meter, upstream=upstream, metrics=metrics,
                   executor=executor, decoy_hash=decoy, payments=payments,
                   login_throttle=LoginThrottle(settings.login_max_failures_per_email, settings.login_window_seconds,
                                                settings.login_max_attempts_per_address),
                   admin=admin_store)


# --- 3. the application --------------------------------------------------------------------------
def make_app(ctx: Context) -> tornado.web.Application:
    routes = auth.routes + keys.routes + account.routes + social.routes + billing.routes + admin.routes + ops.routes
    if ctx.settings.twitter_alias:
        routes += social.alias_routes
    if not ctx.settings.metrics_port:
        routes += ops.metrics_routes
    bound = [(route[0], route[1], {"ctx": ctx, **(route[2] if len(route) > 2 else {})}) for route in routes]
    return tornado.web.Application(
        bound,
        default_handler_class=NotFoundHandler, default_handler_args={"ctx": ctx},
        compress_response=False, xheaders=False,
        log_function=lambda handler: None,  # BaseHandler.on_finish writes the access log
    )


def start_background(ctx: Context) -> list[asyncio.Task]:
    return [asyncio.create_task(ctx.meter.run_flusher(), name="flusher"),
            asyncio.create_task(ctx.meter.run_maintenance(), name="leases"),
            asyncio.create_task(ctx.payments.run_reconciler(), name="reconcile"),
            asyncio.create_task(ctx.admin.run_refresher(), name="admin-rollups"),
            asyncio.create_task(Coherence(ctx.settings, ChangeFeed(ctx.client[ctx.settings.mongodb_db]), ctx.meter).run(),
                                name="coherence")]


def reload(ctx: Context, environ=None) -> bool:
    """SIGHUP: re-read price rules and plan tiers (CONFIG_FILE, environment) while connections stay open.

    Only these two change; every other setting needs a restart."""
    try:
        fresh = config.load(environ)
    except (config.SettingsError, OSError) as exc:
        log.error("reload refused, the current price rules and plan tiers stay: %s", exc)
        return False
    settings = dataclasses.replace(ctx.settings, price_rules=fresh.price_rules, plan_rules=fresh.plan_rules)
    ctx.settings = ctx.meter.settings = settings
    ctx.prices = Prices(settings.price_rules)
    ctx.account_cache.clear()  # cached views carry a plan computed with the old tiers
    log.info("reloaded price rules and plan tiers")
    return True


async def shutdown(ctx: Context, tasks: list[asyncio.Task]) -> None:
    """Waits for calls in flight, then persists every usage record and returns every lease."""
    ctx.draining = True
    deadline = asyncio.get_running_loop().time() + ctx.settings.drain_seconds
    await asyncio.sleep(0.05)  # calls between authentication and reservation reach the ledger
    while ctx.meter.ledger.in_flight() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    for task in tasks:
        task.cancel()
    for attempt in range(50):
        try:
            await ctx.meter.close()
            break
        except Exception as exc:
            log.error("final flush failed (%s), %d usage records pending; retrying", type(exc).__name__,
                      len(ctx.meter.buffer))
            await asyncio.sleep(0.2)
    ctx.upstream.close()
    ctx.executor.shutdown(wait=False)
    await ctx.client.close()


# --- 4. serve --------------------------------------------------------------------------------------
async def serve(settings: config.Settings, sockets: list | None = None, worker: int | None = None) -> None:
    """One gateway process; with `sockets`, worker `worker` of `serve --workers N` (config/workers.py)."""
    embedded = sandbox_server = None
    mongodb_uri, upstream_url = settings.mongodb_uri, settings.upstream_url
    if not mongodb_uri:
        embedded = EmbeddedMongo(os.path.join(settings.data_dir, "db")).start()
        mongodb_uri = embedded.uri
    if not upstream_url:
        import sandbox
        sandbox_server = sandbox.start("127.0.0.1", 0, settings.upstream_api_key, settings.upstream_path_prefix)
        upstream_url = sandbox_server.url
        log.info("UPSTREAM_URL is unset: serving the sandbox upstream in process at %s", upstream_url)
    ctx = await build_context(settings, mongodb_uri, upstream_url, worker)
    server = make_server(make_app(ctx), settings)  # body, header and slow-client limits (handlers/limits.py)
    if sockets:
        server.add_sockets(sockets)
    else:
        server.listen(settings.port, settings.host, reuse_port=True)
    metrics_server = None
    if settings.metrics_port:  # each worker of --workers N on its own port: METRICS_PORT + index
        metrics_server = tornado.httpserver.HTTPServer(ops.metrics_app(ctx))
        metrics_server.listen(settings.metrics_port + (worker or 0), settings.host)
    tasks = start_background(ctx)
    database_label = f"embedded SecantusDB at {mongodb_uri} (data in {os.path.join(settings.data_dir, 'db')})" \
        if embedded else "MongoDB from MONGODB_URI"
    if worker is None:
        announce(settings, database_label,
                 f"sandbox (in process) at {upstream_url} (valid ids: {upstream_url}/sandbox/catalog)"
                 if sandbox_server else settings.upstream_url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reload, ctx)
    await stop.wait()
    log.info("shutting down: no new connections, draining calls in flight")
    server.stop()
    if metrics_server:
        metrics_server.stop()
    await shutdown(ctx, tasks)
    await server.close_all_connections()
    if sandbox_server:
        sandbox_server.stop()
    if embedded:
        embedded.stop()
    log.info("stopped cleanly")


def announce(settings: config.Settings, database_label: str, upstream_label: str, workers_line: str = "") -> None:
    print(f"social-gateway listening on http://{settings.host}:{settings.port}\n{workers_line}"
          f"  environment: {settings.env}\n  database:    {database_label}\n  upstream:    {upstream_label}", flush=True)


def serve_workers(settings: config.Settings, count: int) -> int:
    """`serve --workers N` (config/workers.py): helpers and the socket in this process, N gateways forked."""
    embedded, sandboxed = not settings.mongodb_uri, not settings.upstream_url
    settings, helpers = workers.start_helpers(settings)
    database_label = f"embedded SecantusDB at {settings.mongodb_uri} (data in {os.path.join(settings.data_dir, 'db')})" \
        if embedded else "MongoDB from MONGODB_URI"
    upstream_label = f"sandbox (own process) at {settings.upstream_url}" if sandboxed else settings.upstream_url
    try:
        return workers.run(settings, count, lambda s, sockets, index: asyncio.run(serve(s, sockets, index)),
                           lambda s: announce(s, database_label, upstream_label, f"  workers:     {count} processes\n"))
    finally:
        workers.stop_helpers(helpers)


# --- command line ------------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="social-gateway", description=__doc__.splitlines()[0],
                                  epilog=config.describe(), formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = top.add_subparsers(dest="command", required=True)
    run = commands.add_parser("serve", help="run the gateway", epilog=config.describe(),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--host", help="address to listen on (GATEWAY_HOST)")
    run.add_argument("--port", type=int, help="port to listen on (GATEWAY_PORT, default 8000)")
    run.add_argument("--workers", type=int, default=1,
                     help="gateway processes sharing the port (default 1; see README, Scale-out, for QPS_DIVISOR)")
    sim = commands.add_parser("simulate-upstream", help="run the sandbox upstream provider", add_help=False)
    sim.add_argument("args", nargs=argparse.REMAINDER)
    payments_cli.add_commands(commands)
    admin_cli.add_commands(commands)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "INFO"), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "simulate-upstream":
        import sandbox
        return sandbox.main(args.args) or 0
    if args.command in ("sandbox-pay", "sandbox-confirm"):
        return payments_cli.run(args)
    if args.command == "admin":
        return admin_cli.run(args)
    settings = config.load_for_command(host=args.host, port=args.port)
    if settings is None:
        return 2
    if not settings.production:
        settings = with_dev_secrets(settings)
    if args.workers < 1:
        print("social-gateway: --workers must be at least 1", file=sys.stderr)
        return 2
    if args.workers > 1:
        return serve_workers(settings, args.workers)
    asyncio.run(serve(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
