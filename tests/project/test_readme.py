"""The newcomer's path, as a user takes it: the installed `social-gateway` console script as a subprocess.

- The README's first-session block, extracted from README.md and run with bash, twice, against a
  served gateway (a fresh DATA_DIR, then the same one with the account already there).
- Every command and option the READMEs and `--help` name is run, so a documented command that does not
  parse, or does not do what it says, is a failing test. The list comes from the READMEs and the
  parser: a newly documented command is tested, or this test fails saying it is not.
- A second `serve` on the same data directory or on a busy port: one line, non-zero exit, no traceback.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

import pytest

import gateway
from app.embedded import EmbeddedMongo, free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/<area>/ -> the project
SCRIPT = os.path.join(os.path.dirname(sys.executable), "social-gateway")  # the installed console script
DOCUMENTS = (
    "README.md",
    "sandbox/README.md",
    *(f"docs/{name}" for name in sorted(os.listdir(os.path.join(ROOT, "docs")))),
)
EMAIL = "me@example.com"  # the README block's account


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


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    gw = Served(str(tmp_path_factory.mktemp("var")))
    yield gw
    if gw.proc.poll() is None:
        gw.stop()


def test_a_newcomer_finds_the_two_commands_on_the_first_screen_and_every_document_linked():
    lines = open(os.path.join(ROOT, "README.md")).read().splitlines()
    first_screen = "\n".join(lines[:40])
    assert "./dev serve" in first_screen and "./dev test" in first_screen
    for name in os.listdir(os.path.join(ROOT, "docs")):
        assert f"](docs/{name})" in "\n".join(lines), f"docs/{name} is not linked from the README"


def test_the_readme_says_a_secret_can_be_revealed_again_and_how_to_roll_a_key():
    """The portal offers Reveal, so the README does not say a key's secret is shown once; rolling a key (a new
    secret, the old one working for a grace period) is found in the README, with the calls that do it."""
    from handlers import openapi

    text = open(os.path.join(ROOT, "README.md")).read()
    assert "shown once" not in text
    paths = openapi.build(twitter_alias=False, metrics_here=False)["paths"]
    for method, path in (("get", "/keys/{key_id}/reveal"), ("post", "/keys/{key_id}/roll")):
        assert f"`{method.upper()} {path}`" in text and method in paths[path], path
    assert "**roll**" in text and "grace_seconds" in text and "grace period" in text
    assert "](docs/api.md#key-properties)" in text
    assert "\n### Key properties\n" in open(os.path.join(ROOT, "docs", "api.md")).read()


def readme_block(heading: str = "### A first session") -> str:
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text[text.index(heading) :]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)


# --- the first session ---------------------------------------------------------------------------------------
def run_first_session(gw: Served) -> list:
    result = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", readme_block()],
        env=environment(GW=gw.url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and result.stderr == "", result
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def test_the_readme_first_session_runs_as_written_twice(served):
    # The start-up message ends with the next steps, with URLs that work.
    steps = served.output[served.output.index("next steps") :]
    assert f"{served.url}/docs" in steps and f"{served.url}/sandbox/catalog" in steps
    assert f"curl -s {served.url}/auth/register -d" in steps
    register_line = next(line for line in steps.splitlines() if "register:" in line)
    status, _, _ = http("GET", f"{served.url}/docs")
    assert status == 200
    catalog = http("GET", f"{served.url}/sandbox/catalog")[1]
    name = catalog["users"][0]["userName"]

    for run in (1, 2):  # a fresh var/, then one where the account exists (register answers 409)
        topup, info, usage = run_first_session(served)
        assert topup["credits_added"] == 100_000 and topup["credits"] == run * 100_000 - (run - 1) * 18
        assert info["status"] == "success" and info["data"]["userName"] == name
        # The second run's profile is the first's, served by the answer cache for nothing (CACHE_HIT_PRICE 0).
        charged, how = (18, "miss") if run == 1 else (0, "hit")
        assert [(u["endpoint"], u["status"], u["credits"], u.get("cache")) for u in usage] == [
            ("/social/user/info", 200, charged, how)
        ]
        token = http("POST", served.url + "/auth/login", {"email": EMAIL, "password": "a long passphrase"})[1]
        keys = http("GET", served.url + "/keys", headers={"Authorization": f"Bearer {token['token']}"})[1]
        assert len(keys) == run and usage[0]["key_id"] == max(k["key_id"] for k in keys)  # this run's key
    assert http("POST", served.url + "/auth/register", {"email": EMAIL, "password": "a long passphrase"})[0] == 409
    # The printed register line works as printed, for a new email.
    command = register_line.split("register:", 1)[1].strip().replace(EMAIL, f"new-{uuid.uuid4().hex[:6]}@example.com")
    answer = json.loads(subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30).stdout)
    assert answer["token_type"] == "bearer"


def test_a_second_serve_on_the_same_data_or_port_says_why_in_one_line(served, tmp_path):
    started = time.monotonic()
    same_dir = subprocess.run(
        [SCRIPT, "serve", "--port", str(free_port())],
        env=environment(DATA_DIR=served.data_dir),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert same_dir.returncode == 1 and same_dir.stdout == ""
    assert same_dir.stderr == (
        f"social-gateway: another gateway already uses {served.data_dir} (DATA_DIR): "
        "stop it first, or set DATA_DIR to another folder\n"
    )
    busy = subprocess.run(
        [SCRIPT, "serve", "--port", str(served.port)],
        env=environment(DATA_DIR=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert busy.returncode == 1 and len(busy.stderr.splitlines()) == 1, busy.stderr
    assert f"port {served.port} is busy" in busy.stderr and "try --port" in busy.stderr
    assert not os.path.exists(tmp_path / "db")  # refused before anything was started
    # Production names its address explicitly.
    production = subprocess.run(
        [SCRIPT, "serve"],
        env=environment(GATEWAY_ENV="production", JWT_SECRET="j" * 40, SECRETS_KEY="s" * 40),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert production.returncode == 2 and "GATEWAY_HOST" in production.stderr
    assert "Traceback" not in same_dir.stderr + busy.stderr + production.stderr
    assert time.monotonic() - started < 30
    # The first gateway is unharmed.
    assert http("GET", served.url + "/readyz")[0] == 200


def test_development_listens_on_loopback_only(served):
    assert f"listening on http://127.0.0.1:{served.port}" in served.output
    addresses = {line.split()[1] for line in open("/proc/net/tcp").read().splitlines()[1:]}
    assert f"0100007F:{served.port:04X}" in addresses and f"00000000:{served.port:04X}" not in addresses


# --- every documented command --------------------------------------------------------------------------------
def subcommands() -> dict[tuple, set]:
    """Every command path of the parser (("serve",), ("admin", "grant"), ...) with its options."""
    found: dict[tuple, set] = {}

    def walk(parser, path):
        found[path] = {o for a in parser._actions for o in a.option_strings if o.startswith("--")}
        for action in parser._actions:
            if getattr(action, "choices", None) and isinstance(action.choices, dict):
                for name, sub in action.choices.items():
                    walk(sub, (*path, name))

    walk(gateway.parser(), ())
    return found


def documented() -> set[tuple]:
    """(command path, option or None) for every `social-gateway ...` and `./dev <command>` the READMEs show."""
    commands = subcommands()
    pairs = set()
    for document in DOCUMENTS:
        lines = open(os.path.join(ROOT, document)).read().splitlines()
        for number, line in enumerate(lines):
            for match in re.finditer(r"(?:social-gateway|\./dev) +([a-z][a-z-]*)(?: +([a-z]+))?", line):
                first, second = match.groups()
                if match.group(0).startswith("./dev") and first in ("test", "bench", "format", "settings-doc"):
                    continue  # ./dev's own commands, not social-gateway's
                assert (first,) in commands, f"{document}:{number + 1} documents an unknown command: {line}"
                path = (first, second) if (first, second) in commands else (first,)
                text = line[match.end() :].split("`")[0]
                follow = number + 1
                while follow < len(lines) and re.match(r"\s+\[--", lines[follow]):  # a usage line continued
                    text += lines[follow]
                    follow += 1
                pairs.add((path, None))
                pairs |= {(path, option) for option in re.findall(r"--[a-z][a-z-]*", text)}
    return pairs


class Runner:
    """Runs the console script and remembers which (command path, option) pairs were exercised."""

    def __init__(self):
        self.exercised: set[tuple] = set()
        self.commands = subcommands()

    def note(self, argv: list[str]) -> None:
        path = ()
        for word in argv:
            if (*path, word) in self.commands:
                path = (*path, word)
        self.exercised.add((path, None))
        self.exercised |= {(path, word.split("=")[0]) for word in argv if word.startswith("--")}

    def run(self, *argv: str, code: int = 0, **env) -> subprocess.CompletedProcess:
        self.note(list(argv))
        result = subprocess.run(
            [SCRIPT, *argv], env=environment(**env), capture_output=True, text=True, timeout=90, cwd=ROOT
        )
        assert result.returncode == code, (argv, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr, result.stderr
        return result


def test_every_documented_command_and_option_works(served, tmp_path):
    runner = Runner()
    runner.note(served.argv)  # serve --port: the module's gateway
    # --help, for the program and for every command.
    for path in runner.commands:
        shown = runner.run(*path, "--help")
        assert shown.stdout.startswith("usage: social-gateway"), path
        if path == ("admin",):  # about admin, not a developer's note on the module that holds it
            assert "MONGODB_URI" in shown.stdout and "sandbox-pay" not in shown.stdout, shown.stdout
    assert runner.run("--version").stdout.startswith("social-gateway ")

    # simulate-upstream with every option, answering where it was told to.
    port = free_port()
    argv = ["simulate-upstream", "--host", "127.0.0.1", "--port", str(port), "--api-key", "k1"]
    argv += ["--prefix", "/p", "--seed", "3", "--faults", "latency=1"]
    runner.note(argv)
    sandbox = subprocess.Popen([SCRIPT, *argv], env=environment(), stdout=subprocess.PIPE, text=True)
    try:
        assert f"listening on http://127.0.0.1:{port}" in sandbox.stdout.readline()
        assert http("GET", f"http://127.0.0.1:{port}/healthz")[0] == 200
        names = http("GET", f"http://127.0.0.1:{port}/sandbox/catalog")[1]["users"]
        status, body, _ = http(
            "GET", f"http://127.0.0.1:{port}/p/user/info?userName={names[0]['userName']}", headers={"X-API-Key": "k1"}
        )
        assert status == 200 and body["status"] == "success"
    finally:
        sandbox.send_signal(signal.SIGTERM)
        assert sandbox.wait(30) == 0
    # ... and speaking SocialData's dialect: its paths, its Bearer key, its objects.
    argv = ["simulate-upstream", "--port", str(port), "--api-key", "k2", "--dialect", "socialdata"]
    runner.note(argv)
    sandbox = subprocess.Popen([SCRIPT, *argv], env=environment(), stdout=subprocess.PIPE, text=True)
    try:
        assert "(socialdata," in sandbox.stdout.readline()
        handle = http("GET", f"http://127.0.0.1:{port}/sandbox/catalog")[1]["users"][0]["userName"]
        status, body, _ = http(
            "GET", f"http://127.0.0.1:{port}/twitter/user/{handle}", headers={"Authorization": "Bearer k2"}
        )
        assert status == 200 and body["screen_name"] == handle and isinstance(body["id_str"], str)
    finally:
        sandbox.send_signal(signal.SIGTERM)
        assert sandbox.wait(30) == 0

    # An account on the served gateway, for admin and the sandbox chain, reached through the URI serve printed.
    email = f"cli-{uuid.uuid4().hex[:8]}@example.com"
    token = http("POST", served.url + "/auth/register", {"email": email, "password": "a long passphrase"})[1]["token"]
    auth = {"Authorization": f"Bearer {token}"}
    db = {"MONGODB_URI": served.database_uri, "DATA_DIR": served.data_dir}
    assert "is now an admin" in runner.run("admin", "grant", email, **db).stdout
    assert http("GET", served.url + "/auth/me", headers=auth)[1]["is_admin"] is True
    assert "no longer an admin" in runner.run("admin", "revoke", email, **db).stdout
    assert http("GET", served.url + "/auth/me", headers=auth)[1]["is_admin"] is False
    assert "500000 credits added" in runner.run("admin", "credit", email, "500000", **db).stdout
    assert "no account" in runner.run("admin", "grant", "nobody@example.com", code=1, **db).stderr
    busy = runner.run("admin", "grant", email, code=2, DATA_DIR=served.data_dir)  # no MONGODB_URI: the embedded one
    assert "another gateway already uses" in busy.stderr and len(busy.stderr.splitlines()) == 1

    order = http("POST", served.url + "/billing/crypto/checkout", {"currency": "USDTTRC20", "amount_usd": 25}, auth)[1]
    paid = json.loads(runner.run("sandbox-pay", order["order_id"], "25", "--unconfirmed", **db).stdout)
    assert paid["order"]["credits_applied"] == 0
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", paid["order"]["created_at"])  # as over HTTP
    confirmed = json.loads(runner.run("sandbox-confirm", order["order_id"], **db).stdout)
    assert confirmed["order"]["credits_applied"] == 2_500_000
    assert (
        http("GET", f"{served.url}/billing/crypto/orders/{order['order_id']}", headers=auth)[1]["status"] == "finished"
    )

    # The operations commands (docs/operations.md): backup and reconcile reach the embedded database the served
    # gateway runs (DATA_DIR only); restore into a stopped one; migrate to a second server.
    archive, restored = str(tmp_path / "backup.tar.gz"), {"DATA_DIR": str(tmp_path / "restored")}
    assert runner.run("reconcile", DATA_DIR=served.data_dir).stdout.startswith("reconcile OK")
    assert "read at one moment" in runner.run("backup", "--out", archive, DATA_DIR=served.data_dir).stdout
    # The runbook: the secrets go with the archive (here development's DATA_DIR/secrets.json).
    assert "secrets.json" in runner.run("restore", archive, code=1, **restored).stderr
    os.makedirs(restored["DATA_DIR"])
    shutil.copy(os.path.join(served.data_dir, "secrets.json"), restored["DATA_DIR"])
    assert "checksums matched" in runner.run("restore", archive, **restored).stdout
    assert "--force" in runner.run("restore", archive, code=1, **restored).stderr
    assert "checksums matched" in runner.run("restore", archive, "--force", **restored).stdout
    assert "released" in runner.run("release-outbound", **restored).stdout
    target = EmbeddedMongo(":memory:").start()
    try:
        for _ in range(2):  # the second time over what the first wrote
            assert "verified" in runner.run("migrate", "--to", target.uri, "--force", **restored).stdout
    finally:
        target.stop()

    # serve --workers 2 --host: a second service on its own data directory.
    workers = Served(str(tmp_path / "workers"), "--host", "127.0.0.1", "--workers", "2")
    runner.note(workers.argv)
    try:
        assert "workers:     2 processes" in workers.output
        assert http("GET", workers.url + "/sandbox/catalog")[0] == 200
    finally:
        assert workers.stop() == 0

    missing = (documented() | {(p, o) for p, options in runner.commands.items() for o in options | {None}}) - {
        (p, o) for p, o in runner.exercised
    }
    assert missing == set(), f"documented or parsed but never run: {sorted(missing, key=str)}"
    assert len(documented()) > 10


def test_a_customer_s_query_never_reaches_serve_s_output_not_even_from_its_sandbox(served):
    """serve's own sandbox wrote its access lines (a 4xx one: the whole query) to serve's output."""
    creds = {"email": f"q-{uuid.uuid4().hex[:6]}@example.com", "password": "a long passphrase"}
    auth = {"Authorization": f"Bearer {http('POST', served.url + '/auth/register', creds)[1]['token']}"}
    key = http("POST", served.url + "/keys", {"name": "q"}, auth)[1]
    assert http("POST", f"{served.url}/keys/{key['key_id']}/topup", {"credits": 100_000}, auth)[0] == 200
    secret = uuid.uuid4().hex  # the customer's text: an invalid date, which the provider answers with 400
    status, _, _ = http(
        "GET",
        f"{served.url}/social/tweet/advanced_search?query=since:{secret}",
        headers={"X-API-Key": key["key"]},
    )
    assert status == 400
    deadline = time.monotonic() + 30  # the sandbox logs a call after answering it
    while "/twitter/tweet/advanced_search" not in served.output:
        assert time.monotonic() < deadline, served.output
        time.sleep(0.1)
    assert secret not in served.output
