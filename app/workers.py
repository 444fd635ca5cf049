"""`serve --workers N`: one supervising parent, N gateway processes on one port, replaced on SIGUSR2.

The parent binds the port once, and per worker index a loopback port for /metrics (and METRICS_PORT + index
when that is set), starts what the settings leave embedded (database, sandbox upstream) as child processes of
its own, then starts each worker as a fresh interpreter that inherits those sockets (`Seat`, from a spec in its
environment): the worker imports the code on disk at its start, reads its settings then (CONFIG_FILE and the
environment, with what the parent fixed: the port it bound, the embedded database and sandbox it runs), and
builds its own loop, context and background tasks.

Signals to the parent:
- SIGTERM/SIGINT are passed on to every worker (each drains and returns its leases); the parent exits when
  all workers have.
- SIGHUP is passed on: each worker re-reads its price and plan rules in place (gateway.reload).
- SIGUSR2 replaces the workers, as gunicorn and nginx reload: a new generation starts, and once every new
  worker says it is ready, they start accepting on the inherited port together and the old ones get SIGTERM: they stop accepting, answer
  what comes on their open connections (each answer closing it), finish their calls in flight, flush usage,
  return their leases, tell their WebSocket clients to reconnect, and exit (gateway.serve). No connection is
  refused meanwhile: the listening socket is the parent's, never closed. A new worker that exits before it is
  ready (a setting that does not validate, code that does not import) or is not ready within READY_SECONDS
  cancels the replacement: the new ones are stopped, the running ones stay.

A worker that dies abnormally is started again under the same index and generation; it registers under its
predecessor's node name, so it reclaims that one's leases at once (build_context). The generations alternate
between two node names, so a new worker never reclaims the leases of the worker it replaces while that one
drains; a second SIGUSR2 is ignored until the old generation has exited.

For /metrics, the workers of one index share its loopback port (whichever runs answers the sibling asking) and
the parent makes a state folder for the run (removed on exit) where each worker's counters are kept for the
one after it (runtime/scrape.py: counters never go backwards, across a crash or a replacement).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import mmap
import os
import secrets
import select
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
from collections.abc import Callable

import orjson
from tornado.netutil import bind_sockets

from app.embedded import EmbeddedMongo, die_with_parent
from app.server import LISTEN_BACKLOG
from config.settings import Settings
from runtime.scrape import Scrape

log = logging.getLogger("gateway.workers")

MAX_RESTARTS = 100
QUICK_DEATH = 2.0  # seconds: a worker dying sooner than this after its start is restarted after a pause
READY_SECONDS = 60.0  # a replacement whose new workers are not all ready by then is given up
# The worker's spec (JSON) is in the environment of the process started: its scrape secret is then readable by
# the same user alone (/proc/<pid>/environ), as the settings' secrets are; never on its command line (ps).
SPEC_ENV = "SOCIAL_GATEWAY_WORKER"
WORKER_COMMAND = "__worker__"  # gateway.py's argument that makes the process a worker


@dataclasses.dataclass
class Seat:
    """What a worker process is given by its parent: its place, the sockets it serves, and how to say it is
    ready. `fixed`: the settings the parent decided at start, over what the worker reads itself."""

    index: int
    generation: int
    sockets: list
    peer_sockets: list
    metrics_sockets: list
    scrape: Scrape
    fixed: dict
    ready_fd: int = -1
    go_fd: int = -1
    db_restarts: Callable[[], int] | None = None  # the embedded database's restarts, reported by worker 0

    def ready(self) -> None:
        """Tells the parent this worker can serve (once)."""
        if self.ready_fd >= 0:
            try:
                os.write(self.ready_fd, b"r")
            finally:
                os.close(self.ready_fd)
                self.ready_fd = -1

    async def admitted(self) -> None:
        """Until the parent says to accept: once every worker of this generation is ready, so that they start
        together (one that was ready seconds before the others would have taken every connection meanwhile)."""
        loop = asyncio.get_running_loop()
        told = loop.create_future()
        loop.add_reader(self.go_fd, lambda: told.done() or told.set_result(None))
        try:
            await told
        finally:
            loop.remove_reader(self.go_fd)
            os.close(self.go_fd)


def seat() -> Seat:
    """In a worker process: its seat, from the spec its parent put in the environment."""
    spec = orjson.loads(os.environ.pop(SPEC_ENV))
    die_with_parent()
    if os.getppid() != spec["parent"]:  # the parent died before prctl took effect
        raise SystemExit(1)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # until the worker's loop installs the reload handler
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # for the parent alone
    scrape = Scrape(
        spec["index"],
        {int(i): port for i, port in spec["peers"].items()},
        spec["secret"],
        spec["state_dir"],
        serial=spec["serial"],
        predecessor=spec["predecessor"],
        predecessor_live=spec["predecessor_live"],
    )
    return Seat(
        index=spec["index"],
        generation=spec["generation"],
        sockets=[_socket(fd) for fd in spec["listen"]],
        peer_sockets=[_socket(fd) for fd in spec["peer"]],
        metrics_sockets=[_socket(fd) for fd in spec["metrics"]],
        scrape=scrape,
        fixed=spec["fixed"],
        ready_fd=spec["ready"],
        go_fd=spec["go"],
        db_restarts=_counter(spec["db_restarts"]) if spec["db_restarts"] else None,
    )


def _socket(fd: int) -> socket.socket:
    return socket.socket(fileno=fd)


def _counter(path: str) -> Callable[[], int]:
    with open(path, "rb") as fh:
        shared = mmap.mmap(fh.fileno(), 8, prot=mmap.PROT_READ)
    return lambda: struct.unpack_from("Q", shared)[0]


@dataclasses.dataclass
class _Worker:
    index: int
    generation: int
    serial: int  # this start among all of the run's (names its metrics state file)
    process: subprocess.Popen
    ready_fd: int  # the read end of its ready pipe, until it said so (or died first): then -1
    go_fd: int  # the write end of its admission pipe, until it was told to accept: then -1
    started: float
    ready: bool = False

    def admit(self) -> None:
        if self.go_fd >= 0:
            try:
                os.write(self.go_fd, b"g")
            except OSError:  # it died meanwhile
                pass
            os.close(self.go_fd)
            self.go_fd = -1


class Supervisor:
    def __init__(
        self,
        settings: Settings,
        count: int,
        command: list[str],
        fixed: dict,
        helper_exited: Callable[[int, int], None],
        database: EmbeddedMongo | None,
    ):
        self.sockets = bind_sockets(settings.port, settings.host, backlog=LISTEN_BACKLOG)
        self.settings = dataclasses.replace(settings, port=self.sockets[0].getsockname()[1])  # port 0: the one picked
        self.peers = {index: bind_sockets(0, "127.0.0.1") for index in range(count)}
        self.metrics = {
            index: bind_sockets(settings.metrics_port + index, settings.host) if settings.metrics_port else []
            for index in range(count)
        }
        self.state_dir = tempfile.mkdtemp(prefix="social-gateway-metrics-")
        self.db_restarts = ""
        if database is not None:  # the restart count, shared with every worker through a file
            self.db_restarts = os.path.join(self.state_dir, "embedded-db-restarts")
            database.count_restarts_in(self.db_restarts)
        self.count, self.command, self.helper_exited = count, command, helper_exited
        self.fixed = {**fixed, "port": self.settings.port}
        self.secret = secrets.token_urlsafe(24)
        self.workers: dict[int, _Worker] = {}  # pid -> worker
        self.generation = 1  # the generation serving
        self.replacing: tuple[int, float] | None = None  # (new generation, ready deadline) while one starts
        self.latest: dict[int, _Worker] = {}  # index -> the latest worker of the serving generation
        self.restarts, self.serial = 0, 0
        self.due: list[tuple[float, int, int]] = []  # (when, index, generation): restarts after a pause
        self.signals: list[int] = []
        self.stopping = False

    # --- starting workers ----------------------------------------------------------------------------------
    def start(self, index: int, generation: int) -> None:
        predecessor = self.latest.get(index)
        read, write = os.pipe()
        go_read, go_write = os.pipe()
        self.serial += 1
        spec = {
            "parent": os.getpid(),
            "index": index,
            "generation": generation,
            "serial": self.serial,
            "predecessor": predecessor.serial if predecessor else None,
            "predecessor_live": bool(predecessor and predecessor.process.returncode is None),
            "listen": [s.fileno() for s in self.sockets],
            "peer": [s.fileno() for s in self.peers[index]],
            "metrics": [s.fileno() for s in self.metrics[index]],
            "peers": {str(i): bound[0].getsockname()[1] for i, bound in self.peers.items() if i != index},
            "secret": self.secret,
            "state_dir": self.state_dir,
            "fixed": self.fixed,
            "ready": write,
            "go": go_read,
            "db_restarts": self.db_restarts if index == 0 else "",  # one series, however many workers
        }
        fds = [write, go_read, *spec["listen"], *spec["peer"], *spec["metrics"]]
        try:
            process = subprocess.Popen(
                self.command, env={**os.environ, SPEC_ENV: orjson.dumps(spec).decode()}, pass_fds=fds
            )
        finally:
            os.close(write)
            os.close(go_read)
        worker = _Worker(index, generation, self.serial, process, read, go_write, time.monotonic())
        self.workers[process.pid] = worker
        if generation == self.generation:
            self.latest[index] = worker

    def replace(self) -> None:
        """SIGUSR2: a new generation of workers, each counting on from the one it replaces."""
        if self.stopping:
            return
        if self.replacing or any(w.generation != self.generation for w in self.workers.values()):
            log.warning("SIGUSR2 ignored: the last replacement of the workers is still under way")
            return
        generation = self.generation + 1
        self.replacing = (generation, time.monotonic() + READY_SECONDS)
        for index in range(self.count):
            self.start(index, generation)  # counting on from `latest`, which it leaves to the serving generation
        new = sorted(w.process.pid for w in self.workers.values() if w.generation == generation)
        log.info("replacing the workers: generation %d starting (pids %s)", generation, new)

    def _replaced(self) -> None:
        """Every new worker ready: the old ones stop (each drains as at SIGTERM)."""
        generation, deadline = self.replacing
        new = [w for w in self.workers.values() if w.generation == generation]
        if len(new) == self.count and all(w.ready for w in new):
            old = [w for w in self.workers.values() if w.generation != generation]
            self.generation, self.replacing = generation, None
            self.latest = {w.index: w for w in new}
            for worker in new:  # they accept, together; the old ones stop accepting
                worker.admit()
            self._signal(old, signal.SIGTERM)
            log.info(
                "workers replaced: generation %d serves (pids %s); the old ones drain (pids %s)",
                generation,
                sorted(w.process.pid for w in new),
                sorted(w.process.pid for w in old),
            )
        elif time.monotonic() > deadline:
            self._give_up(f"its workers were not ready within {READY_SECONDS:.0f} s")

    def _give_up(self, why: str) -> None:
        generation, _ = self.replacing
        self.replacing = None
        self._signal([w for w in self.workers.values() if w.generation == generation], signal.SIGTERM)
        log.error("replacement of the workers given up (%s); the running workers stay", why)

    # --- the loop --------------------------------------------------------------------------------------------
    def run(self, announce: Callable[[Settings], None]) -> int:
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        os.set_blocking(wake_read, False)
        signal.set_wakeup_fd(wake_write)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2, signal.SIGCHLD):
            signal.signal(signum, lambda signum, frame: self.signals.append(signum))
        for index in range(self.count):
            self.start(index, self.generation)
        announce(self.settings)
        try:
            while self.workers or (self.due and not self.stopping):
                self._handle_signals()
                self._reap()
                if self.replacing:
                    self._replaced()
                self._admit()
                self._start_due()
                waiting = {w.ready_fd: w for w in self.workers.values() if w.ready_fd >= 0}
                timeout = min([1.0, *(when - time.monotonic() for when, _, _ in self.due)])
                readable, _, _ = select.select([wake_read, *waiting], [], [], max(timeout, 0))
                for fd in readable:
                    if fd == wake_read:
                        while _read_some(wake_read):
                            pass
                    else:  # "r" when ready; nothing when it died first (reaped at the next turn)
                        waiting[fd].ready = _read_some(fd) == b"r"
                        os.close(fd)
                        waiting[fd].ready_fd = -1
        finally:
            signal.set_wakeup_fd(-1)
            os.close(wake_read)
            os.close(wake_write)
            for bound in [self.sockets, *self.peers.values(), *self.metrics.values()]:
                for sock in bound:
                    sock.close()
            shutil.rmtree(self.state_dir, ignore_errors=True)
        return 0 if self.stopping else 1

    def _admit(self) -> None:
        """The serving generation's workers accept once none of them is still starting (at the start of the run,
        or one started again after a crash)."""
        serving = [w for w in self.workers.values() if w.generation == self.generation]
        if all(w.ready for w in serving):
            for worker in serving:
                worker.admit()

    def _handle_signals(self) -> None:
        pending, self.signals = self.signals, []
        for signum in pending:
            if signum in (signal.SIGTERM, signal.SIGINT):
                self.stopping, self.replacing, self.due = True, None, []
                self._signal(list(self.workers.values()), signal.SIGTERM)
            elif signum == signal.SIGHUP:  # every worker reloads its price rules and plan tiers (gateway.reload)
                self._signal(list(self.workers.values()), signal.SIGHUP)
            elif signum == signal.SIGUSR2:
                self.replace()

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            code = os.waitstatus_to_exitcode(status)
            worker = self.workers.pop(pid, None)
            if worker is None:  # a helper (database, sandbox): the database is started again
                self.helper_exited(pid, code)
                continue
            worker.process.returncode = code  # reaped here: the Popen must not wait for it again
            if worker.go_fd >= 0:
                os.close(worker.go_fd)
                worker.go_fd = -1
            if worker.ready_fd >= 0:
                os.close(worker.ready_fd)
                worker.ready_fd = -1
            if not worker.ready:
                if self.replacing and worker.generation == self.replacing[0]:
                    self._give_up(f"a new worker exited with code {code} before it was ready")
                    continue
            self._exited(worker, code)

    def _exited(self, worker: _Worker, code: int) -> None:
        """A worker of the serving generation that dies abnormally is started again; others are let go."""
        if self.stopping or code == 0 or worker.generation != self.generation:
            return
        if self.restarts >= MAX_RESTARTS:
            log.error("worker %d exited with %d; too many restarts, not restarting", worker.index, code)
            return
        log.error("worker %d exited with %d; restarting it", worker.index, code)
        self.restarts += 1
        pause = QUICK_DEATH if time.monotonic() - worker.started < QUICK_DEATH else 0.0
        self.due.append((time.monotonic() + pause, worker.index, worker.generation))

    def _start_due(self) -> None:
        now = time.monotonic()
        for entry in [d for d in self.due if d[0] <= now]:
            self.due.remove(entry)
            if entry[2] == self.generation and not self.stopping:  # a replacement since: its worker serves
                self.start(entry[1], entry[2])

    @staticmethod
    def _signal(workers: list[_Worker], signum: int) -> None:
        for worker in workers:
            try:
                os.kill(worker.process.pid, signum)
            except ProcessLookupError:
                pass


def _read_some(fd: int) -> bytes:
    try:
        return os.read(fd, 512)
    except BlockingIOError:
        return b""


def run(
    settings: Settings,
    count: int,
    command: list[str],
    fixed: dict,
    announce: Callable[[Settings], None],
    helper_exited: Callable[[int, int], None],
    database: EmbeddedMongo | None = None,
) -> int:
    """Runs `count` workers, each the process `command` (which finds its `seat()`), until SIGTERM/SIGINT;
    `helper_exited(pid, code)` when a helper process (database, sandbox) was reaped instead."""
    return Supervisor(settings, count, command, fixed, helper_exited, database).run(announce)
