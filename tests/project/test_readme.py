"""The newcomer's path, as a user takes it: the installed `social-gateway` console script as a subprocess.

- The README's first-session block, extracted from README.md and run with bash, twice, against a
  served gateway (a fresh DATA_DIR, then the same one with the account already there).
- Every command and option the documents name: tests/project/test_commands.py.
- A second `serve` on the same data directory or on a busy port: one line, non-zero exit, no traceback.
"""

import json
import os
import re
import subprocess
import time
import uuid

from console import ROOT, SCRIPT, Served, environment, http

from app.embedded import free_port

EMAIL = "me@example.com"  # the README block's account


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
