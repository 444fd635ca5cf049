"""The OpenAPI 3.1.0 document, built from tables.

Data paths come from social.endpoints.ENDPOINTS, the table the data plane runs on
(handlers/openapi_paths.py renders them); every other path is one `Operation` in
handlers/openapi_operations.py, whose request bodies (handlers/openapi_components.py) and
query parameters are the very `Field` declarations its handler validates with.
"""

import functools

import orjson

from handlers.openapi_alerts import ALERT_OPERATIONS, ALERT_SCHEMAS
from handlers.openapi_components import SCHEMAS
from handlers.openapi_operations import OPERATIONS
from handlers.openapi_paths import data_operation, portal_operation
from handlers.openapi_security import SECURITY_OPERATIONS, SECURITY_SCHEMAS
from handlers.openapi_streams import STREAM_OPERATIONS, STREAM_SCHEMAS, socket_operations
from social.endpoints import ENDPOINTS

VERSION = "0.1.0"


def build(twitter_alias: bool, metrics_here: bool) -> dict:
    """The document for an application: aliases and /metrics appear only where the application serves them."""
    paths: dict = {}
    for op in OPERATIONS + ALERT_OPERATIONS + SECURITY_OPERATIONS + STREAM_OPERATIONS:
        if op.path != "/metrics" or metrics_here:
            paths.setdefault(op.path, {})[op.method] = portal_operation(op)
    prefixes = [("/social", "data")] + ([("/twitter", "data (provider-compatible paths)")] if twitter_alias else [])
    for prefix, tag in prefixes:
        for endpoint in ENDPOINTS:
            paths[prefix + endpoint.path] = {"get": data_operation(endpoint, prefix, tag)}
        paths[prefix + "/tweet/websocket"] = {"get": socket_operations(prefix)}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Social Data Gateway API",
            "version": VERSION,
            "description": "Portal endpoints use a bearer session token (the web portal at / keeps it in an "
            "HttpOnly cookie instead, and its writes carry an X-XSRFToken header); data endpoints use X-API-Key "
            "and are charged in credits (100,000 credits = 1 USD). Every data path is also served under /twitter "
            "(the provider's own paths) where TWITTER_ALIAS is on; /openapi.json?aliases=true lists those too.",
        },
        "tags": [
            {"name": t}
            for t in (
                "auth",
                "keys",
                "account",
                "billing",
                "alerts",
                "streams",
                "audit",
                "admin",
                "operations",
                "portal",
                "data",
            )
        ]
        + ([{"name": prefixes[1][1]}] if twitter_alias else []),
        "paths": paths,
        "components": {
            "schemas": {**SCHEMAS, **ALERT_SCHEMAS, **SECURITY_SCHEMAS, **STREAM_SCHEMAS},
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "bearerFormat": "JWT",
                    "description": "Session token from /auth/register or /auth/login",
                },
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
                "metricsToken": {"type": "http", "scheme": "bearer", "description": "METRICS_TOKEN, when it is set"},
            },
        },
    }


@functools.lru_cache(maxsize=4)
def serialized(twitter_alias: bool, metrics_here: bool) -> bytes:
    """The document as JSON, built once per application shape."""
    return orjson.dumps(build(twitter_alias, metrics_here))
