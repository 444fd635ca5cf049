"""The embedded default database: SecantusDB (MongoDB wire protocol on WiredTiger) as a child process.

SecantusDB is GPL-2.0, so it runs as a separate process and is never imported here.
"""
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time

log = logging.getLogger("gateway.db")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    # PR_SET_PDEATHSIG: the database stops even if the gateway is SIGKILLed.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


class EmbeddedMongo:
    """Starts `python -m secantus` on a free loopback port; `uri` is ready once start() returns."""

    def __init__(self, storage_path: str, port: int | None = None):
        self.storage_path = storage_path
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        return f"mongodb://127.0.0.1:{self.port}/?directConnection=true"

    def start(self, timeout: float = 30.0) -> "EmbeddedMongo":
        if self.storage_path != ":memory:":
            os.makedirs(self.storage_path, exist_ok=True)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "secantus", "--host", "127.0.0.1", "--port", str(self.port),
             "--storage-path", self.storage_path, "--log-level", "WARNING"],
            # Its own session: a terminal's Ctrl-C (sent to the whole process group) must not stop the
            # database while the gateway still flushes usage and returns leases; stop() does that after.
            stdout=subprocess.DEVNULL, preexec_fn=_die_with_parent, start_new_session=True,
        )
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

    def stop(self, timeout: float = 10.0) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
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
