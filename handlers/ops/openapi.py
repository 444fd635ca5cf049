"""The operations area's part of the OpenAPI document: liveness, readiness, /metrics, this document and its
interactive page (the development catalog's is handlers/sandbox/openapi.py)."""

from handlers.openapi_operations import Operation
from handlers.openapi_schema import B, I, S, obj, query_param, ref
from handlers.validation import Field

ALIASES = Field(
    "aliases",
    bool,
    required=False,
    default=False,
    description="Also list the /twitter alias of every data path (served when TWITTER_ALIAS is on)",
)

OPERATIONS: list[Operation] = [
    Operation("get", "/healthz", "The process is alive", "operations", ref("Health"), security=None, errors=()),
    Operation(
        "get",
        "/readyz",
        "Database reachable, upstream breaker closed, usage buffer under its bound",
        "operations",
        ref("Ready"),
        security=None,
        errors=(),
        extra={"503": {"description": "Not ready", "content": {"application/json": {"schema": ref("Ready")}}}},
    ),
    Operation(
        "get",
        "/metrics",
        "Prometheus metrics (bearer METRICS_TOKEN when set)",
        "operations",
        {"type": "string"},
        security="metrics",
        media="text/plain",
    ),
    Operation(
        "get",
        "/openapi.json",
        "This document: each data endpoint once, under /social",
        "operations",
        {"type": "object"},
        security=None,
        params=(query_param(ALIASES),),
        errors=(422,),
    ),
    Operation(
        "get",
        "/docs",
        "Interactive API docs (Swagger UI, served by this gateway)",
        "operations",
        {"type": "string"},
        security=None,
        errors=(),
        media="text/html",
    ),
]

SCHEMAS: dict = {
    "Health": obj(("status",), status={"const": "ok"}),
    "Ready": obj(
        ("status", "checks"),
        status={"enum": ["ready", "not ready"]},
        checks=obj(
            (),
            database=S,
            upstream_breaker=S,
            draining=B,
            usage_buffer=obj((), depth=I, max=I),
            outbound={"enum": ["open", "held"]},
        ),
    ),
}
