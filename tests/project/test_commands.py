"""Every command and option the READMEs, docs/ and `--help` name is run as a user runs it (the installed console
script), so a documented command that does not parse, or does not do what it says, is a failing test. The list
comes from the documents and the parser: a newly documented command is tested, or this test fails saying it is
not. (Apart from tests/project/test_readme.py so that the two run at once.)"""

import json
import os
import re
import shutil
import signal
import subprocess
import uuid

from console import DOCUMENTS, ROOT, SCRIPT, Served, environment, http

import gateway
from app.embedded import EmbeddedMongo, free_port


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
