"""The OpenAPI 3.1.0 document, built from tables.

Data paths come from social.endpoints.ENDPOINTS, the table the data plane runs on
(handlers/openapi_paths.py renders them); every other path is one `Operation`, declared by its area beside its
handlers (handlers/<area>/openapi.py, with the schemas it names) or, for the portal's own few, in
handlers/openapi_operations.py, whose request bodies and query parameters are the very `Field` declarations its
handler validates with. This module only puts the areas' parts together.
"""

import functools
import re

import orjson

from config.settings import Settings
from handlers.account import openapi as account
from handlers.admin import openapi as admin
from handlers.alerts import openapi as alerts
from handlers.audit import openapi as audit
from handlers.auth import openapi as auth
from handlers.billing import openapi as billing
from handlers.keys import openapi as keys
from handlers.mcp import openapi as mcp
from handlers.members import openapi as members
from handlers.openapi_components import SCHEMAS
from handlers.openapi_operations import OPERATIONS
from handlers.openapi_paths import data_operation, portal_operation
from handlers.ops import openapi as ops
from handlers.sandbox import openapi as sandbox
from handlers.streams import openapi as streams
from security import roles
from social import prices
from social.endpoints import ENDPOINTS

VERSION = "0.1.0"


# Each area's part of the document, beside its handlers (handlers/<area>/openapi.py): its OPERATIONS and the
# SCHEMAS they name.
AREAS = (keys, account, billing, admin, ops, audit, auth, sandbox, alerts, streams, members, mcp)
PORTAL_OPERATIONS = [op for area in AREAS for op in area.OPERATIONS] + OPERATIONS


def route_operations(rules: list) -> dict:
    """(handler class, HTTP method) -> the Operation with a least role that route serves, for BaseHandler.prepare
    to enforce. A class serving two routes must not need two roles for one method (checked here, at start)."""
    declared = {(op.method, re.sub(r"\{[^}]*\}", "{}", op.path)): op for op in PORTAL_OPERATIONS if op.role}
    found: dict = {}
    for rule in rules:
        path = re.sub(r"\\(.)", r"\1", re.sub(r"\([^)]*\)", "{}", rule.matcher.regex.pattern.rstrip("$")))
        for (method, template), op in declared.items():
            if template == path:
                key = (rule.target, method.upper())
                if key in found and found[key].role != op.role:
                    raise ValueError(f"{rule.target.__name__} serves {method} with two least roles")
                found[key] = op
    return found


def build(twitter_alias: bool, metrics_here: bool, terms: prices.Terms | None = None) -> dict:
    """The document for an application: aliases and /metrics appear only where the application serves them; each
    data operation says its price and freshness under `terms` (the running settings'; default: the defaults)."""
    terms = terms or prices.Terms.of(Settings())
    sheet = {row["endpoint"]: row for row in prices.sheet(terms)["endpoints"]}
    paths: dict = {}
    for op in PORTAL_OPERATIONS:
        if op.path != "/metrics" or metrics_here:
            paths.setdefault(op.path, {})[op.method] = portal_operation(op)
    prefixes = [("/social", "data")] + ([("/twitter", "data (provider-compatible paths)")] if twitter_alias else [])
    for prefix, tag in prefixes:
        for endpoint in ENDPOINTS:
            priced = prices.description(sheet[endpoint.path], terms.hit_price)
            paths[prefix + endpoint.path] = {"get": data_operation(endpoint, prefix, tag, priced)}
        paths[prefix + "/tweet/websocket"] = {"get": streams.socket_operations(prefix)}
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
                "members",
                "admin",
                "operations",
                "portal",
                "data",
                "mcp",
            )
        ]
        + ([{"name": prefixes[1][1]}] if twitter_alias else []),
        "paths": paths,
        # Which members each operation's least role (x-least-role) admits: the web portal disables what a role
        # cannot do from this and the operations' declarations, the very ones the server enforces.
        "x-role-grants": {least: [r for r in roles.ROLES if r in members] for least, members in roles.GRANTS.items()},
        "components": {
            "schemas": {**SCHEMAS, **{name: schema for area in AREAS for name, schema in area.SCHEMAS.items()}},
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
def serialized(twitter_alias: bool, metrics_here: bool, terms: prices.Terms) -> bytes:
    """The document as JSON, built once per application shape and price terms (a reload of PRICE_RULES makes new
    terms: the next request gets the document of the new prices)."""
    return orjson.dumps(build(twitter_alias, metrics_here, terms))
