"""`serve --workers N`: one parent, N gateway processes on one port.

The parent binds the port once, starts what the settings leave embedded (database, sandbox
upstream) as child processes of its own, then forks the workers before any event loop or database
client exists: each worker builds its own loop, context and background tasks. The parent only
supervises: SIGTERM/SIGINT are passed on to every worker (each drains and returns its leases), a
worker that dies abnormally is started again under the same index (so it reclaims its
predecessor's leases at once, see build_context), so is an embedded database that exits
(app/embedded.py), and the parent exits when all workers have.

For /metrics, the parent also binds one loopback port per worker and makes a state folder for the run
(removed on exit): the worker answering a scrape gathers its siblings' series through those ports, and
a restarted worker counts on from what its predecessor last reported (runtime/scrape.py).

Not tornado.process.fork_processes: it keeps the children's ids to itself, so a SIGTERM to the
parent could not drain them, and it restarts workers after a shutdown too.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable

from tornado.netutil import bind_sockets

from app.embedded import die_with_parent
from app.server import LISTEN_BACKLOG
from config.settings import Settings
from runtime.scrape import Scrape

log = logging.getLogger("gateway.workers")

MAX_RESTARTS = 100
QUICK_DEATH = 2.0  # seconds: a worker dying sooner than this after its start is restarted after a pause


def run(
    settings: Settings,
    count: int,
    serve_one: Callable[[Settings, list, Scrape, list], None],
    announce: Callable[[Settings], None],
    helper_exited: Callable[[int, int], None],
) -> int:
    """Runs `count` workers, each `serve_one(settings, sockets, scrape, peer_sockets)`, until SIGTERM/SIGINT;
    `helper_exited(pid, code)` when a helper process (database, sandbox) was reaped instead."""
    sockets = bind_sockets(settings.port, settings.host, backlog=LISTEN_BACKLOG)
    peers = {index: bind_sockets(0, "127.0.0.1") for index in range(count)}
    ports = {index: bound[0].getsockname()[1] for index, bound in peers.items()}
    secret, state_dir = secrets.token_urlsafe(24), tempfile.mkdtemp(prefix="social-gateway-metrics-")
    settings = dataclasses.replace(settings, port=sockets[0].getsockname()[1])  # port 0: the one picked
    parent = os.getpid()
    children: dict[int, tuple[int, float]] = {}  # pid -> (worker index, started at)
    stopping = False

    def stop(signum, frame) -> None:
        nonlocal stopping
        if os.getpid() != parent:  # a worker between fork and its own handlers
            return
        stopping = True
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def reload(signum, frame) -> None:
        """SIGHUP: every worker reloads its price rules and plan tiers (gateway.reload)."""
        if os.getpid() != parent:
            return
        for pid in children:
            try:
                os.kill(pid, signal.SIGHUP)
            except ProcessLookupError:
                pass

    def start(index: int) -> None:
        pid = os.fork()
        if pid == 0:
            siblings = {i: port for i, port in ports.items() if i != index}
            _worker(
                settings,
                sockets,
                index,
                lambda: serve_one(settings, sockets, Scrape(index, siblings, secret, state_dir), peers[index]),
            )
        children[pid] = (index, time.monotonic())
        if stopping:  # the signal came between the fork and the line above
            os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, reload)
    for index in range(count):
        start(index)
    announce(settings)
    restarts = 0
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        if pid not in children:  # a helper (database, sandbox): the database is started again
            helper_exited(pid, os.waitstatus_to_exitcode(status))
            continue
        index, started = children.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        if stopping or code == 0:
            continue
        if restarts >= MAX_RESTARTS:
            log.error("worker %d exited with %d; too many restarts, not restarting", index, code)
            continue
        log.error("worker %d exited with %d; restarting it", index, code)
        restarts += 1
        if time.monotonic() - started < QUICK_DEATH:
            time.sleep(QUICK_DEATH)
        if not stopping:
            start(index)
    for sock in [*sockets, *(sock for bound in peers.values() for sock in bound)]:
        sock.close()
    shutil.rmtree(state_dir, ignore_errors=True)
    return 0 if stopping else 1


def _worker(settings: Settings, sockets: list, index: int, serve_one: Callable[[], None]) -> None:
    """The child side of fork: never returns into the parent's code (whose cleanup is not ours)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the worker's loop installs its own
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until the loop installs the reload handler
    code = 0
    try:
        die_with_parent()
        serve_one()
    except BaseException:
        log.exception("worker %d failed", index)
        code = 1
    finally:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
