"""The process harness moved to gateway_testing/stack.py (issue 35). This name stays for one round, for tests and
scripts written against it on other branches meanwhile; new code imports gateway_testing.stack."""

from gateway_testing.stack import (  # noqa: F401
    FAST_PLAN,
    ROOT,
    UPSTREAM_KEY,
    GatewayProcess,
    Stack,
    gateway_env,
    request,
    wait_for,
)
