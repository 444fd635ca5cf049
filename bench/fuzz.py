"""Property-based API fuzzing: schemathesis against the live gateway's own /openapi.json.

Starts SecantusDB, the sandbox upstream and the gateway as loopback processes, registers an
account (an admin, so the admin operations are exercised too) with a funded API key, and runs
`schemathesis run` on every operation the document describes: its default checks (no 5xx,
status codes, content types, headers and bodies conform to the document, invalid input
rejected, valid input accepted, auth not ignored) and, through the document's OpenAPI links,
stateful sequences (create key -> reveal -> revoke -> reveal; checkout -> order). Prints and
saves the figures: operations, test cases, failures by check.

    .venv/bin/python bench/fuzz.py [--max-examples 100] [--max-time 600] [--seed 3] [--workers 1]

tests/data/test_fuzz.py and tests/operations/test_fuzz_portal.py run the same with a CI-sized budget, in two halves.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from gateway_testing.stack import Stack

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EMAIL = "fuzz-admin@example.com"

# Credentials per security scheme (so the ignored_auth check can drop them), and the few places where
# the document cannot say everything the service checks. Each exception is stated with its reason.
CONFIG = """
[auth.openapi.bearerAuth]
bearer = "${FUZZ_TOKEN}"

[auth.openapi.apiKey]
api_key = "${FUZZ_API_KEY}"

# A request refused for its size (413 body, 414/431 request line and headers) is rejected input too.
[checks.negative_data_rejection]
expected-statuses = [400, 401, 403, 404, 405, 406, 409, 413, 414, 415, 422, 428, 429, 431, "5xx"]

# By the spec, the two announced-but-unavailable endpoints answer 501 (never charged).
[[operations]]
include-path-regex = "/community/(get_tweets_from_all_community|moderators)$"
checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", 501]

# The provider's own 400 (an opaque cursor it does not know) is passed through uncharged: schema-valid
# input the gateway cannot judge.
[[operations]]
include-tag-regex = "^data"
exclude-path-regex = "/user/(followers_ids|last_tweets)$"
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", 400, 401, 402, 403, 404, 409, 429, "5xx"]

# followers_ids and last_tweets need userName or userId (422 otherwise): OpenAPI cannot require one of
# two query parameters, the operation's description says it.
[[operations]]
include-path-regex = "/user/(followers_ids|last_tweets)$"
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", 400, 401, 402, 403, 404, 409, 422, 429, "5xx"]

# Rules JSON Schema cannot state: a password needs 4 different characters and must not be a common one;
# the current password must be the right one; an order's minimum depends on the currency (GET
# /billing/crypto/config); admin, audit and request-log cursors are opaque; a key's expires_at must be in the
# future, its allowed_ips must parse as addresses, a credit_limit needs its period (and the reverse); an audit
# filter's time must be a real date and its actions known ones; a reset token must be one the gateway emailed, and
# an invitation's one it made (a new person's password follows the registration's rules); a statement's month must
# be one of the account's, from the month it was created to the current one; a margin period's `from` must not be
# after its `to`.
[[operations]]
include-operation-id = [
    "post_auth_register",
    "post_auth_password",
    "post_billing_crypto_checkout",
    "get_admin_users",
    "get_usage_log",
    "post_keys",
    "patch_keys_key_id",
    "post_auth_password_reset",
    "post_auth_invitations_accept",
    "get_audit",
    "get_audit_export",
    "get_admin_audit",
    "get_admin_audit_export",
    "get_billing_statements_month",
    "get_admin_margin",
]
checks.positive_data_acceptance.enabled = false

# Revealing a revoked key is 410 (it exists, its secret is gone for good): a state, not an input.
[[operations]]
include-operation-id = "get_keys_key_id_reveal"
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", 401, 403, 404, 409, 410, 429, "5xx"]

# The portal's cookie-session endpoints need the page's XSRF token (a cookie plus a header the document
# cannot describe): every other caller gets 403, whatever the body.
[[operations]]
include-operation-id = [
    "post_portal_register",
    "post_portal_login",
    "post_portal_login_2fa",
    "post_portal_logout",
    "post_portal_password",
    "post_portal_invitations_accept",
    "post_portal_switch",
]
checks.positive_data_acceptance.enabled = false

# A WebSocket opens only with the handshake's headers (Upgrade, Sec-WebSocket-Key, -Version), which the
# fuzzer does not send: without them the answer is 400, whatever the parameters (tests/streams/test_streams.py opens it).
[[operations]]
include-operation-id = ["social_tweet_websocket", "twitter_tweet_websocket"]
checks.positive_data_acceptance.enabled = false

# Logging out would end the one session token the whole run uses: walked by hand in tests/data/test_isolation.py.
[[operations]]
include-operation-id = "post_auth_logout"
enabled = false

# Attribution is best effort by contract: an invalid value of a known property gets 200 {"ok": true,
# "stored": false} (unknown properties are refused, 422), which negative data counts as a failure.
[[operations]]
include-operation-id = "post_auth_attribution"
checks.negative_data_rejection.enabled = false
"""


def prepare(stack: Stack) -> tuple[str, str]:
    """A session token (of an admin, who is fuzzed) and a funded API key of another account, so that
    revocations and top-ups generated by the fuzzer cannot touch the key the data endpoints use."""
    user = stack.account(EMAIL)
    stack.grant_admin(EMAIL)
    owner = stack.account("fuzz-key-owner@example.com")
    key = stack.new_key(owner["token"], "fuzz")
    stack.top_up(owner["token"], key["key_id"], 10**12)
    return user["token"], key["key"]


def schemathesis_command() -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "schemathesis")
    return [exe] if os.path.exists(exe) else [sys.executable, "-m", "schemathesis.cli"]


def run(
    max_examples: int,
    max_time: float | None = None,
    seed: int | None = None,
    phases: str | None = None,
    workers: int = 1,
    report_dir: str | None = None,
    extra: list[str] | None = None,
) -> dict:
    """One fuzzing run against a fresh stack; returns the figures (and the raw CLI output)."""
    stack = Stack(in_memory=True).start()
    try:
        token, key = prepare(stack)
        report_dir = report_dir or os.path.join(stack.work, "schemathesis")
        config = os.path.join(stack.work, "schemathesis.toml")
        with open(config, "w") as fh:
            fh.write(CONFIG)
        args = (
            schemathesis_command()
            + ["--config-file", config, "--no-color"]
            + [
                "run",
                stack.url + "/openapi.json",
                "--url",
                stack.url,
                "--max-examples",
                str(max_examples),
                "--workers",
                str(workers),
                "--request-timeout",
                "20",
                "--suppress-health-check",
                "all",
                "--report",
                "junit,ndjson",
                "--report-dir",
                report_dir,
            ]
        )
        if max_time:
            args += ["--max-time", str(int(max_time))]
        if seed is not None:
            args += ["--seed", str(seed)]
        if phases:
            args += ["--phases", phases]
        args += extra or []
        started = time.monotonic()
        done = subprocess.run(
            args,
            capture_output=True,
            text=True,
            cwd=stack.work,
            env={
                **os.environ,
                "SCHEMATHESIS_TELEMETRY": "false",
                "NO_COLOR": "1",
                "FUZZ_TOKEN": token,
                "FUZZ_API_KEY": key,
                "SCHEMATHESIS_HOOKS": "bench.fuzz_hooks",  # one request per Idempotency-Key (its docstring)
                "PYTHONPATH": ROOT,
            },
        )
        seconds = time.monotonic() - started
        os.makedirs(report_dir, exist_ok=True)
        with open(os.path.join(report_dir, "output.txt"), "w") as fh:
            fh.write(done.stdout + done.stderr)
        figures = summarize(report_dir)
        figures["report_dir"] = report_dir
        figures.update(
            exit_code=done.returncode,
            seconds=round(seconds, 1),
            max_examples=max_examples,
            output=done.stdout[-20000:] + done.stderr[-5000:],
        )
        status, _, _ = stack.call("GET", "/healthz")
        figures["gateway_alive_after"] = status == 200
        return figures
    finally:
        stack.stop()


def summarize(report_dir: str) -> dict:
    """Operations, test cases and failures from the ndjson event stream (falls back to junit)."""
    figures = {"operations": 0, "test_cases": 0, "failures": [], "errors": []}
    ndjson = (
        next((os.path.join(report_dir, f) for f in os.listdir(report_dir) if f.endswith(".ndjson")), None)
        if os.path.isdir(report_dir)
        else None
    )
    if ndjson:
        operations, cases = set(), 0
        with open(ndjson) as fh:
            for line in fh:
                event = json.loads(line)
                for kind, data in event.items():
                    if kind == "ScenarioFinished":
                        recorder = data.get("recorder") or {}
                        cases += len(recorder.get("cases") or {})
                        label = recorder.get("label") or data.get("label")
                        if label:
                            operations.add(label)
                        for check_list in (recorder.get("checks") or {}).values():
                            for check in check_list:
                                if check.get("status") == "failure":
                                    figures["failures"].append(
                                        {
                                            "operation": label,
                                            "check": check.get("name"),
                                            "message": (check.get("failure_info") or {}).get("failure", {}).get("title")
                                            or str(check.get("failure_info"))[:300],
                                        }
                                    )
                    elif kind == "NonFatalError":
                        figures["errors"].append(str(data.get("info") or data)[:300])
        figures["operations"], figures["test_cases"] = len(operations), cases
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-examples", type=int, default=100)
    parser.add_argument("--max-time", type=float, default=None, help="time budget in seconds for the whole run")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--phases", default=None, help="examples,coverage,fuzzing,stateful (default: all)")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "fuzz.json"))
    args = parser.parse_args()
    figures = run(args.max_examples, args.max_time, args.seed, args.phases, args.workers)
    output = figures.pop("output")
    print(output[-6000:])
    by_check: dict[str, int] = {}
    for failure in figures["failures"]:
        by_check[failure["check"]] = by_check.get(failure["check"], 0) + 1
    figures["failures_by_check"] = by_check
    print(json.dumps({k: v for k, v in figures.items() if k != "failures"}, indent=2))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(figures, fh, indent=2, default=str)
    sys.exit(0 if figures["exit_code"] == 0 else 1)


if __name__ == "__main__":
    main()
