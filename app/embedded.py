"""What the settings leave embedded, as child processes: the database and the sandbox upstream.

The database is SecantusDB (MongoDB wire protocol on WiredTiger); it is GPL-2.0, so it runs as a
separate process and is never imported here. The sandbox upstream runs in its own process too, so
that its work (a search over the seeded world) never lands on the gateway's event loop.
`start_helpers` is the one entry point: serve, serve --workers, the admin commands and the tests.

The process that started the database supervises it: one that exits is started again on the same port and
data (`EmbeddedMongo.supervise` in `serve`, `Helpers.revive` in the parent of `serve --workers`); the driver
reconnects by itself, and calls meanwhile follow the database-down mode (docs/security.md, Durability).
"""

import asyncio
import ctypes
import dataclasses
import errno
import fcntl
import logging
import mmap
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field

from config.settings import Settings

log = logging.getLogger("gateway.db")
LOCK_FILE = "gateway.lock"
# Where the process that holds the lock tells the operations commands (backup, reconcile: app/operations.py) the
# URI of the embedded database it runs, so that they reach it while it serves. Read only while the lock is held.
URI_FILE = "embedded-db.uri"


class DataDirBusy(RuntimeError):
    """Another process (a running gateway, an admin command) already uses this DATA_DIR's embedded database."""


def lock_data_dir(data_dir: str) -> int:
    """An exclusive lock on DATA_DIR/gateway.lock, held for the life of the process (the kernel drops it
    when the process dies, even on SIGKILL); its file descriptor. DataDirBusy when another process holds it."""
    os.makedirs(data_dir, exist_ok=True)
    fd = os.open(os.path.join(data_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise DataDirBusy(f"another gateway already uses {data_dir} (DATA_DIR)") from None
        raise
    return fd


_RESERVED: list[socket.socket] = []  # held until this process exits: see free_port


def running_uri(data_dir: str) -> str | None:
    """The URI of the embedded database the gateway holding DATA_DIR's lock runs (None: none written)."""
    try:
        with open(os.path.join(data_dir, URI_FILE)) as fh:
            return fh.read().strip() or None
    except FileNotFoundError:
        return None


def free_port(count: int = 1) -> int:
    """A loopback port (the first of `count` consecutive ones: `serve --workers N`'s METRICS_PORT + index) that
    is this process's for as long as it lives, for servers it starts to bind, as often as they restart.

    A port found free and let go could be taken by another process before our server bound it (a test's SMTP
    server took one once, and the harness read its greeting as the gateway's answer). So the socket that
    found it is kept: bound without sharing (which fails on a port anyone holds), then marked SO_REUSEADDR and
    SO_REUSEPORT, never listening. The kernel hands such a port to no other socket binding port 0, in any
    process, nor to an outgoing connection, while our server (Tornado, asyncio, nginx, SecantusDB all bind
    with SO_REUSEADDR) may bind and listen on it. Connections reach only a listening socket."""
    while True:
        held = [_reserve(0)]
        first = held[0].getsockname()[1]
        try:
            held += [_reserve(first + n) for n in range(1, count)]
        except (OSError, OverflowError):  # a neighbour is taken, or past 65535: another first port
            for sock in held:
                sock.close()
            continue
        _RESERVED.extend(held)
        return first


def _reserve(port: int) -> socket.socket:
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        raise
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    return sock


def die_with_parent() -> None:  # pragma: no cover - runs in the child
    # PR_SET_PDEATHSIG: the database stops even if the gateway is SIGKILLed.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


def child_setup(nice: int):
    """The helper child's set-up before exec: die with the parent, then lower its CPU priority by `nice`."""

    def setup() -> None:  # pragma: no cover - runs in the child
        die_with_parent()
        if nice:
            os.nice(nice)

    return setup


RESTART_TRIES = 5
SUPERVISE_SECONDS = 0.5  # how often `serve` looks whether its database still runs


class EmbeddedMongo:
    """Starts `python -m secantus` on a free loopback port; `uri` is ready once start() returns."""

    def __init__(self, storage_path: str, port: int | None = None, nice: int = 0):
        self.storage_path = storage_path
        self.port = port or free_port()
        # start_helpers passes EMBEDDED_DB_NICE: on a shared box the database's journaled write bursts
        # (a usage flush, the minute's last_used_at) then wait for the cores instead of the calls in flight.
        self.nice = nice
        self.process: subprocess.Popen | None = None
        # Restarts so far (serve --workers: the parent restarts, a worker reports
        # gateway_embedded_db_restarts_total, from the file count_restarts_in names).
        self._restarts = mmap.mmap(-1, 8)

    @property
    def restarts(self) -> int:
        return struct.unpack_from("Q", self._restarts)[0]

    def count_restarts_in(self, path: str) -> None:
        """Keeps the restart count in the file `path` (serve --workers: its workers are separate programs,
        which read it there: app/workers.py)."""
        with open(path, "wb+") as fh:
            fh.write(struct.pack("Q", self.restarts))
            fh.flush()
            self._restarts = mmap.mmap(fh.fileno(), 8)

    def _restarted(self) -> None:
        struct.pack_into("Q", self._restarts, 0, self.restarts + 1)
        log.warning("embedded database restarted (pid %d, restart %d)", self.process.pid, self.restarts)

    @property
    def uri(self) -> str:
        # retryWrites=false: the embedded server remembers every retryable write for 30 minutes and walks all
        # of them (up to 10,000) on each write, so after a busy half hour it wrote 9x slower (measured: 145
        # against 1,370 updates/s). On one loopback server there is no failover for a retry to survive, and
        # every write's failure is handled where it is made. A MONGODB_URI of the operator's keeps its choice.
        # maxIdleTimeMS=60000: the server closes a connection idle for 300 s, and the driver, handing out one
        # it closed, failed every operation then under way (measured: 38 of 40 after 310 s idle, 0 with this).
        return f"mongodb://127.0.0.1:{self.port}/?directConnection=true&retryWrites=false&maxIdleTimeMS=60000"

    def start(self, timeout: float = 30.0) -> "EmbeddedMongo":
        self._launch()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"embedded database exited with code {self.process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("embedded database did not answer in time")

    def _launch(self) -> None:
        if self.storage_path != ":memory:":
            os.makedirs(self.storage_path, exist_ok=True)
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "secantus",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--storage-path",
                self.storage_path,
                "--log-level",
                "WARNING",
            ],
            # Its own session: a terminal's Ctrl-C (sent to the whole process group) must not stop the
            # database while the gateway still flushes usage and returns leases; stop() does that after.
            stdout=subprocess.DEVNULL,
            preexec_fn=child_setup(self.nice),
            start_new_session=True,
        )

    def restart(self, code: int) -> bool:
        """The parent of serve --workers reaped the database (exit `code`): started again, blocking; False when
        it would not start RESTART_TRIES times in a row (its workers stay in the database-down mode)."""
        log.error("embedded database exited with code %d; restarting it on port %d", code, self.port)
        for attempt in range(RESTART_TRIES):
            try:
                self.start()
            except RuntimeError as exc:
                log.error("embedded database restart %d of %d failed: %s", attempt + 1, RESTART_TRIES, exc)
                time.sleep(1.0)
                continue
            self._restarted()
            return True
        return False

    async def supervise(self, timeout: float = 30.0) -> None:
        """serve (one process): starts the database again whenever it has exited, until cancelled."""
        while True:
            await asyncio.sleep(SUPERVISE_SECONDS)
            if self.process is None or self.process.poll() is None:  # poll: a waitpid that does not block
                continue
            log.error(
                "embedded database exited with code %d; restarting it on port %d", self.process.returncode, self.port
            )
            # On the event loop's thread, not a worker thread: the child's PR_SET_PDEATHSIG fires when the
            # thread that forked it ends, and a pool thread ends before the gateway does. A fork, once.
            self._launch()
            if await self._answers(timeout):
                self._restarted()
            else:
                log.error("embedded database did not start again; trying again")
                self.process.kill()
                await asyncio.sleep(1.0)

    async def _answers(self, timeout: float) -> bool:
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline and self.process.poll() is None:
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.port), 0.2)
            except (OSError, TimeoutError):
                await asyncio.sleep(0.05)
                continue
            writer.close()
            return True
        return False

    def stop(self, timeout: float = 10.0) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            # A database frozen (SIGSTOP) would keep the SIGTERM pending until the timeout: let it act on it.
            self.process.send_signal(signal.SIGCONT)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        """Hard stop, for crash tests."""
        if self.process:
            self.process.kill()
            self.process.wait()
            self.process = None


@dataclass
class Helpers:
    """What start_helpers started, the settings that point at it, and labels for the start-up message."""

    settings: Settings
    processes: list = field(default_factory=list)
    database: str = "MongoDB from MONGODB_URI"
    upstream: str = ""
    lock: int | None = None  # the DATA_DIR lock while the embedded database on it runs

    @property
    def embedded(self) -> EmbeddedMongo | None:
        """The embedded database, when one was started here."""
        return next((p for p in self.processes if isinstance(p, EmbeddedMongo)), None)

    def revive(self, pid: int, code: int) -> None:
        """serve --workers: the parent reaped helper `pid` (exit `code`); the embedded database is started again."""
        database = self.embedded
        if database is not None and database.process is not None and database.process.pid == pid:
            database.restart(code)
        else:  # the sandbox: only the development upstream, whose calls then fail as the provider's would
            log.error("a helper process (pid %d) exited with code %d", pid, code)

    @property
    def sandbox(self) -> bool:
        """The sandbox upstream was started here."""
        return any(not isinstance(p, EmbeddedMongo) for p in self.processes)

    def stop(self) -> None:
        for helper in reversed(self.processes):
            if isinstance(helper, EmbeddedMongo):
                helper.stop()
            elif helper.poll() is None:
                helper.terminate()
                helper.wait(10)
        self.processes.clear()
        if self.lock is not None:
            os.close(self.lock)
            self.lock = None


def start_helpers(settings: Settings, storage_path: str | None = None, sandbox: bool = True) -> Helpers:
    """The embedded database (on DATA_DIR/db, or `storage_path`, ":memory:" included) and the sandbox
    upstream as processes, for whichever of MONGODB_URI and UPSTREAM_URL is unset (the sandbox only when
    `sandbox`, and not when PROVIDERS lists the providers); returns settings pointing at them. Stop them with Helpers.stop()."""
    named = ", ".join(f"{p['name']} ({p['kind']}) at {p['url']}" for p in settings.providers)
    helpers = Helpers(settings, upstream=named or settings.upstream_url)
    try:
        if not settings.mongodb_uri:
            if storage_path is None:  # one process per data directory: a second one would fail deep inside
                helpers.lock = lock_data_dir(settings.data_dir)
            path = storage_path or os.path.join(settings.data_dir, "db")
            embedded = EmbeddedMongo(path, nice=settings.embedded_db_nice).start()
            helpers.processes.append(embedded)
            helpers.settings = dataclasses.replace(helpers.settings, mongodb_uri=embedded.uri)
            if storage_path is None:
                with open(os.path.join(settings.data_dir, URI_FILE), "w") as fh:
                    fh.write(embedded.uri)
            helpers.database = f"embedded SecantusDB at {embedded.uri} (data in {path})"
        if sandbox and not settings.upstream_url and not settings.providers:  # PROVIDERS name their own URLs
            port = free_port()
            env = {
                **os.environ,
                "UPSTREAM_API_KEY": settings.upstream_api_key,
                "UPSTREAM_PATH_PREFIX": settings.upstream_path_prefix,
            }  # not on the command line: ps shows it
            proc = subprocess.Popen(
                [sys.executable, "-m", "sandbox", "--host", "127.0.0.1", "--port", str(port)],
                env=env,
                stdout=subprocess.DEVNULL,
                preexec_fn=die_with_parent,
                start_new_session=True,
            )  # signals to the group are for the gateway
            helpers.processes.append(proc)
            url = f"http://127.0.0.1:{port}"
            _wait_for(url + "/healthz", proc)
            helpers.settings = dataclasses.replace(helpers.settings, upstream_url=url)
            helpers.upstream = f"sandbox (own process) at {url}"
    except BaseException:
        helpers.stop()
        raise
    return helpers


def _wait_for(url: str, proc: subprocess.Popen, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the sandbox upstream did not start")
