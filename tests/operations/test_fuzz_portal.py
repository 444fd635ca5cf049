"""Property-based API fuzzing of every operation that is not a data endpoint (accounts, sessions, keys, billing,
admin, operations), with the stateful phase through the document's links; the data operations are fuzzed by
tests/data/test_fuzz.py."""

import re

import pytest

from bench import fuzz

pytestmark = pytest.mark.gen_test(timeout=60)


def test_schemathesis_finds_no_failure_on_any_other_operation():
    # one worker: CPython 3.11 is not reliable compiling in threads
    figures = fuzz.run(max_examples=3, seed=20261121, workers=1, extra=["--exclude-tag-regex", "^data"])
    report = figures["output"][-4000:]
    assert figures["gateway_alive_after"], report
    assert figures["operations"] >= 80, report  # accounts, keys, billing, admin, operations, MCP, ...
    assert figures["test_cases"] >= 1000, report
    assert figures["failures"] == [] and figures["errors"] == [], report
    assert figures["exit_code"] == 0, report
    assert re.search(r"Stateful \(in [0-9.]+s\)", figures["output"]), report  # the stateful phase ran
