"""The whole service as separate loopback processes, for the tests and the bench scripts.

GatewayProcess is one `gateway.py serve [--workers N]` with its settings from the environment
(gateway_env); the process tests (gateway_testing/helpers.py Gateway) and Stack both run the gateway through it.
Stack adds SecantusDB (on a real directory, or in memory), the sandbox upstream (optionally
with faults) and a small blocking JSON client. Nothing listens beyond 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from app.embedded import EmbeddedMongo, free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where gateway.py is

UPSTREAM_KEY = "stack-upstream-key"
FAST_PLAN = json.dumps([{"name": "fast", "min_paid_usd": 0, "qps": 100000}])


def request(
    method: str, url: str, body: dict | None = None, headers: dict | None = None, timeout: float = 30
) -> tuple[int, object, dict]:
    """(status, parsed body or raw bytes, headers); never raises for an HTTP status."""
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    req = urllib.request.Request(url, method=method, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            status, raw, hdrs = response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        status, raw, hdrs = exc.code, exc.read(), dict(exc.headers)
    try:
        return status, json.loads(raw) if raw else None, hdrs
    except ValueError:
        return status, raw, hdrs


def wait_for(url: str, proc: subprocess.Popen | None, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:3]} exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer in {seconds} s")


def gateway_env(mongo_uri: str, db_name: str, upstream_url: str, upstream_key: str, **extra: str) -> dict:
    """The settings of a gateway process for tests and benchmarks: cheap hashing, no QPS limit to speak of
    (tests storm one account with hundreds of concurrent calls: the in-flight limit follows that plan)."""
    return {
        **os.environ,
        "MONGODB_URI": mongo_uri,
        "MONGODB_DB": db_name,
        "UPSTREAM_URL": upstream_url,
        "UPSTREAM_API_KEY": upstream_key,
        "JWT_SECRET": "stack-jwt-secret-" + "x" * 32,
        "SECRETS_KEY": "stack-secrets-key-" + "y" * 32,
        "LOG_LEVEL": "WARNING",
        "PASSWORD_SCRYPT_N": "1024",
        "PLAN_RULES": FAST_PLAN,
        **extra,
    }


class GatewayProcess:
    """One `gateway.py serve` process on 127.0.0.1 (`--workers N` when workers > 1, or `supervised`)."""

    def __init__(
        self, env: dict, port: int = 0, workers: int = 1, stdout=subprocess.DEVNULL, stderr=None, supervised=False
    ):
        self.env, self.port, self.workers = env, port or free_port(), workers
        self.supervised = supervised  # `--workers 1`: one worker under the supervisor that replaces it on SIGUSR2
        self.stdout, self.stderr = stdout, stderr
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, seconds: float = 60) -> GatewayProcess:
        """Starts the process and returns once it answers /healthz."""
        args = [
            sys.executable,
            os.path.join(ROOT, "gateway.py"),
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        if self.workers > 1 or self.supervised:
            args += ["--workers", str(self.workers)]
        self.proc = subprocess.Popen(args, cwd=ROOT, env=self.env, stdout=self.stdout, stderr=self.stderr)
        wait_for(self.url + "/healthz", self.proc, seconds)
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Sends `sig` and returns the exit code."""
        self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        """Kills the process if it still runs (its workers die with it)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class Stack:
    """Database + sandbox + one gateway process. `gateway_env` adds or overrides gateway settings."""

    def __init__(
        self,
        work_dir: str | None = None,
        faults: str = "",
        gateway_env: dict | None = None,
        in_memory: bool = False,
        log_path: str | None = None,
    ):
        self.work = work_dir or tempfile.mkdtemp(prefix="gw-stack-")
        self.faults, self.in_memory = faults, in_memory
        self.extra_env = dict(gateway_env or {})
        self.log_path = log_path or os.path.join(self.work, "gateway.log")
        self.mongo: EmbeddedMongo | None = None
        self.sandbox: subprocess.Popen | None = None
        self.gateway: GatewayProcess | None = None
        self.sandbox_port = self.port = 0
        self.db_name = "stack"

    # --- processes ----------------------------------------------------------------------------
    def start(self) -> Stack:
        self.mongo = EmbeddedMongo(":memory:" if self.in_memory else os.path.join(self.work, "db")).start()
        self.sandbox_port = free_port()
        args = [
            sys.executable,
            "-m",
            "sandbox",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.sandbox_port),
            "--api-key",
            UPSTREAM_KEY,
        ]
        if self.faults:
            args += ["--faults", self.faults]
        self.sandbox = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self.upstream + "/healthz", self.sandbox)
        self.port = free_port()
        self.start_gateway()
        return self

    @property
    def upstream(self) -> str:
        return f"http://127.0.0.1:{self.sandbox_port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict:
        return gateway_env(
            self.mongo.uri,
            self.db_name,
            self.upstream,
            UPSTREAM_KEY,
            DATA_DIR=self.work,
            LOGIN_MAX_ATTEMPTS_PER_ADDRESS="1000000",
            LOGIN_MAX_FAILURES_PER_EMAIL="1000000",
            # Load and fuzzing come from one address: the per-network and per-address limits would
            # measure themselves (tests/data/test_isolation.py tests them).
            SIGNUP_MAX_PER_NETWORK="1000000",
            LOGIN_SLOWDOWN_AFTER="1000000",
            MAX_CONNECTIONS_PER_ADDRESS="1000000",
            **self.extra_env,
        )

    def start_gateway(self) -> None:
        with open(self.log_path, "ab") as log:  # the child keeps its own copy of the descriptor
            self.gateway = GatewayProcess(self.env(), self.port, stdout=log, stderr=log).start()

    def stop_gateway(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        code = self.gateway.stop(sig, timeout)
        self.gateway = None
        return code

    def stop(self) -> None:
        if self.gateway is not None and self.gateway.proc.poll() is None:
            self.stop_gateway()
        if self.sandbox is not None:
            self.sandbox.terminate()
            self.sandbox.wait(10)
        if self.mongo is not None:
            self.mongo.stop()

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- the portal -----------------------------------------------------------------------------
    def call(
        self,
        method: str,
        path: str,
        body: dict | None = None,
        token: str | None = None,
        key: str | None = None,
        timeout: float = 30,
    ) -> tuple[int, object, dict]:
        headers = {}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if key:
            headers["X-API-Key"] = key
        return request(method, self.url + path, body, headers, timeout)

    def account(self, email: str, password: str = "stack password 1") -> dict:
        status, body, _ = self.call("POST", "/auth/register", {"email": email, "password": password})
        assert status == 200, (status, body)
        return {**body, "email": email}

    def grant_admin(self, email: str) -> None:
        """The operator's `social-gateway admin grant EMAIL` (registration never grants admin)."""
        done = subprocess.run(
            [sys.executable, os.path.join(ROOT, "gateway.py"), "admin", "grant", email],
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr

    def new_key(self, token: str, name: str = "stack") -> dict:
        status, body, _ = self.call("POST", "/keys", {"name": name}, token=token)
        assert status in (200, 201), (status, body)
        return body

    def top_up(self, token: str, key_id: int, credits: int) -> None:
        status, body, _ = self.call("POST", f"/keys/{key_id}/topup", {"credits": credits}, token=token)
        assert status == 200, (status, body)
