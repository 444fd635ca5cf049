"""A user's shell for the tests that run the installed `social-gateway` console script as a subprocess: its
environment, a plain HTTP client, and `serve` as a user starts it."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from app.embedded import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/ -> the project
SCRIPT = os.path.join(os.path.dirname(sys.executable), "social-gateway")  # the installed console script
DOCUMENTS = (
    "README.md",
    "sandbox/README.md",
    *(f"docs/{name}" for name in sorted(os.listdir(os.path.join(ROOT, "docs")))),
)


def environment(**extra) -> dict:
    """A user's shell: no MONGODB_URI/UPSTREAM_URL inherited; scrypt cheaper so registration is quick."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    return {**keep, "PASSWORD_SCRYPT_N": "1024", "LOG_LEVEL": "WARNING", **extra}


def http(method: str, url: str, body=None, headers: dict | None = None, timeout: float = 10):
    """(status, parsed JSON or None, headers) without raising on error statuses."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw, status, got = response.read(), response.status, response.headers
    except urllib.error.HTTPError as exc:
        raw, status, got = exc.read(), exc.code, exc.headers
    is_json = got.get("Content-Type", "").startswith("application/json")
    return status, (json.loads(raw) if raw and is_json else raw), got


class Served:
    """`social-gateway serve` as a user starts it; its start-up message is kept in `output`."""

    def __init__(self, data_dir: str, *args: str, env: dict | None = None):
        self.data_dir, self.port = data_dir, free_port()
        self.argv = ["serve", "--port", str(self.port), *args]
        self.url = f"http://127.0.0.1:{self.port}"
        os.makedirs(data_dir, exist_ok=True)
        self.log = open(os.path.join(data_dir, "serve.out"), "w+")
        self.proc = subprocess.Popen(
            [SCRIPT, *self.argv],
            env=env or environment(DATA_DIR=data_dir),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.output
            try:
                if http("GET", self.url + "/healthz", timeout=1)[0] == 200 and "register:" in self.output:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"serve did not start: {self.output}")

    @property
    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    @property
    def database_uri(self) -> str:
        """The URI serve printed, as the README tells admin and sandbox-pay users to copy it."""
        return re.search(r"mongodb://\S+", self.output).group(0)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(60)
        self.log.close()
        return code
