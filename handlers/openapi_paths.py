"""The OpenAPI operation of a portal `Operation` and of a data endpoint, with the error answers they share."""

from handlers.idempotent import KEY, PATTERN
from handlers.openapi_operations import Operation
from handlers.openapi_schema import B, I, S, array, field_schema, nullable, query, ref
from handlers.validation import INT_MAX
from security import roles
from social.endpoints import (
    CURSOR_MAX,
    CURSOR_PATTERN,
    NOT_BLANK,
    STRING_MAX,
    Endpoint,
    Param,
    ids_pattern,
    param_docs,
)

_ERRORS = {
    400: "The data provider refused the parameters (its answer, passed through; not charged)",
    401: "Missing, invalid, revoked or expired credential",
    402: "Not enough credits for this call (the account's balance or the key's credit budget): stop, do not retry",
    403: "Not allowed: for this account, by the key's allowed_ips / allowed_endpoints, or (with the portal's "
    "cookie) a write without its XSRF token",
    409: "Conflict; with an Idempotency-Key: the first request with it is still under way (retry after "
    "Retry-After), or its answer was charged but too large to keep (send a new key)",
    404: "Not found (or not yours)",
    413: "Request body too large",
    410: "Gone: the key is revoked and its secret is never shown again",
    422: "Invalid input (a parameter, or an Idempotency-Key that is malformed or was used for another request)",
    429: "Too many requests: retry after Retry-After seconds",
    501: "Announced but not available; never charged",
    502: "The data provider failed; not charged",
    503: "Temporarily unavailable: retry after Retry-After seconds",
    504: "The data provider did not answer in time; not charged",
}
_RETRY_AFTER = {"Retry-After": {"schema": I, "description": "Seconds to wait before retrying"}}
# Idempotency-Key (handlers/idempotent.py): on the data endpoints and on the portal writes that create something.
_IDEMPOTENCY_KEY = {
    "name": KEY.name,
    "in": "header",
    "required": False,
    "schema": {**field_schema(KEY), "pattern": PATTERN},
    "description": KEY.description,
}
_REPLAYED = {
    "Idempotent-Replayed": {
        "schema": {"type": "string", "enum": ["true"]},
        "description": "The first answer to this Idempotency-Key, sent again (charged 0); X-Request-ID is the first's",
    }
}

# The answer cache (accounting/charged.py, docs/api.md): the request's Cache-Control and what the answer says.
_CACHE_CONTROL = {
    "name": "Cache-Control",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "examples": ["no-cache", "max-age=60"]},
    "description": "no-cache: a provider call, charged in full; max-age=N: a kept answer no older than N seconds",
}
_CACHED = {
    "X-Cache": {
        "schema": {"type": "string", "enum": ["HIT", "MISS", "COALESCED", "STALE"]},
        "description": "How the answer cache answered: a kept answer (HIT, charged CACHE_HIT_PRICE x the price), the "
        "provider (MISS), an identical call under way (COALESCED, charged in full) or, the provider failing, a "
        "recent answer (STALE, charged as a hit)",
    },
    "Age": {"schema": I, "description": "HIT and STALE: seconds since the answer was asked of the provider"},
    "X-Crawl-Guard": {
        "schema": {"type": "string", "enum": ["repeated-cursor"]},
        "description": "The provider's cursors closed a cycle: this page ends the crawl (no next page), not charged "
        "the first time the crawl is served it; read again, it is charged as any page (a hit while fresh)",
    },
}

_SECURITY = {
    "bearer": [{"bearerAuth": []}],
    "apikey": [{"apiKey": []}],
    "metrics": [{"metricsToken": []}, {}],
    None: [],
}


# Any operation: the server's own limit on the request line and headers (app/server.py).
_HEADERS_TOO_LARGE = {
    "431": {
        "description": "Request line and headers larger than MAX_HEADER_BYTES; the connection is closed",
        "content": {"application/json": {"schema": ref("PortalError")}},
    }
}


def _error(status: int, schema: str) -> dict:
    response = {
        "description": _ERRORS[status],
        "content": {"application/json": {"schema": ref("ValidationError" if status == 422 else schema)}},
    }
    if status in (409, 429, 503):  # a 409 says when to retry while a key's first request is under way
        response["headers"] = _RETRY_AFTER
    return response


def portal_operation(op: Operation) -> dict:
    # `also`: further media types, each a name (the same schema) or (name, its own schema): a document as PDF
    content = {
        media: {"schema": schema}
        for media, schema in ((m, op.response) if isinstance(m, str) else m for m in (op.media, *op.also))
    }
    responses = {str(op.status): {"description": "Success", "content": content}}
    headers = {**op.headers, **(_REPLAYED if op.idempotent else {})}
    if headers:
        responses[str(op.status)]["headers"] = headers
    if op.links:
        responses[str(op.status)]["links"] = {
            name: {"operationId": operation_id, "parameters": {field: f"$response.body#/{field}"}}
            for name, (operation_id, field) in op.links.items()
        }
    errors = sorted({*op.errors, 409}) if op.idempotent else op.errors
    if op.role is not None and op.role != roles.VIEWER:  # refused to the roles below it (BaseHandler.prepare)
        errors = sorted({*errors, 403})
    # The provider-compatible calls (X-API-Key) answer errors in the data plane's shape.
    shape = "DataError" if op.security == "apikey" else "PortalError"
    responses.update({str(s): _error(s, shape) for s in errors})
    responses.update(op.extra)
    responses.update(_HEADERS_TOO_LARGE)
    spec = {
        "operationId": f"{op.method}_{op.path.strip('/').replace('/', '_').replace('{', '').replace('}', '').replace('.', '_') or 'portal_page'}",
        "summary": op.summary,
        "tags": [op.tag],
        "security": _SECURITY[op.security],
        "parameters": [*op.params, *([_IDEMPOTENCY_KEY] if op.idempotent else [])],
        "responses": responses,
    }
    if op.role is not None:
        spec["x-least-role"] = op.role
        spec["description"] = _role_text(op)
    if op.body:
        spec["requestBody"] = {"required": op.body_required, "content": {"application/json": {"schema": ref(op.body)}}}
    return spec


def _role_text(op: Operation) -> str:
    allowed = ", ".join(r for r in roles.ROLES if r in roles.GRANTS[op.role])
    text = f"Least role: **{op.role}** (members who are {allowed})."
    if op.or_self:
        text += f" Any member may call it with their own `{op.or_self}`."
    return text


def _param_schema(param: Param) -> dict:
    if param.kind == "int":
        # Integers are read with at most INT_DIGITS digits (int64-safe); that is the bound when the table has none.
        return {
            "type": "integer",
            "minimum": -INT_MAX if param.minimum is None else param.minimum,
            "maximum": INT_MAX if param.maximum is None else param.maximum,
        }
    if param.kind == "bool":
        return {"type": "boolean"}
    if param.choices:
        return {"type": "string", "enum": list(param.choices), "default": param.choices[0]}
    if param.kind == "cursor":  # what cannot be a cursor: too long, outside printable ASCII; empty: the first page
        return {"type": "string", "maxLength": CURSOR_MAX, "pattern": CURSOR_PATTERN}
    if param.kind == "ids":
        return {
            "type": "string",
            "pattern": ids_pattern(param.maximum),
            "description": f"Comma-separated numeric ids, at most {param.maximum}",
        }
    if param.required:  # blank (whitespace only) counts as missing: 422
        return {"type": "string", "minLength": 1, "maxLength": STRING_MAX, "pattern": NOT_BLANK}
    return {"type": "string", "maxLength": STRING_MAX}


_RESULT_ITEMS = {
    "tweets": ref("Tweet"),
    "replies": ref("Tweet"),
    "followers": ref("User"),
    "followings": ref("User"),
    "users": ref("User"),
    "ids": S,
    "trends": ref("Trend"),
    "members": ref("User"),
}
# Single objects (null when the provider does not know the id, status "error"), by path.
_SINGLE = {
    "/user/info": ref("User"),
    "/article": ref("Article"),
    "/user/check_follow_relationship": ref("FollowRelationship"),
}


def _envelope(endpoint: Endpoint) -> dict:
    """The success body: status, message or msg (as the spec's table names it), the results and paging."""
    if endpoint.results in ("data", "article"):
        results = nullable(_SINGLE.get(endpoint.path, {"type": "object"}))
    else:
        results = array(_RESULT_ITEMS[endpoint.results])
    properties = {"status": {"type": "string", "examples": ["success"]}, endpoint.msg_key: S, endpoint.results: results}
    if endpoint.paged:
        properties.update(has_next_page=B, next_cursor={"type": "string", "description": "Empty on the last page"})
    return {"type": "object", "properties": properties, "required": ["status"]}


def _data_param(param: Param) -> dict:
    description, example = param_docs(param)
    out = query(param.name, _param_schema(param), description, param.required)
    # The value "Try it out" starts from: one the sandbox answers ("" for a cursor: the first page).
    out["example"] = int(example) if param.kind == "int" else example == "true" if param.kind == "bool" else example
    return out


def data_operation(endpoint: Endpoint, prefix: str, tag: str, priced: str = "") -> dict:
    """A data endpoint's operation; `priced`: its price and cache freshness in words (social/prices.py)."""
    if endpoint.available:
        ok = {
            "200": {
                "description": "Success; charged per X-Credits-Charged",
                "headers": {
                    "X-Credits-Charged": {"schema": I, "description": "Credits charged for this call"},
                    **_REPLAYED,
                    **_CACHED,
                    **{
                        f"X-RateLimit{scope}-{h}": {"schema": I}
                        for scope in ("", "-Account")  # the key's bucket, and the one all its account's keys share
                        for h in ("Limit", "Remaining", "Reset")
                    },
                    "RateLimit-Policy": {
                        "schema": S,
                        "description": "The key's and the account's limits (IETF structured field): "
                        '"key";q=20;w=1, "account";q=100;w=1 (q calls, refilled in w seconds)',
                    },
                    "RateLimit": {
                        "schema": S,
                        "description": 'What is left of each: "key";r=17;t=1, "account";r=97;t=1 (r calls left, '
                        "full again in t seconds)",
                    },
                },
                "content": {"application/json": {"schema": _envelope(endpoint)}},
            }
        }
        errors = (400, 401, 402, 403, 404, 409, 422, 429, 502, 503, 504)  # 400, 404: the provider's, passed through
    else:
        ok, errors = {}, (401, 403, 422, 429, 501)
    one_of = f"Send at least one of {', '.join(endpoint.one_of)} (422 when none is sent)." if endpoint.one_of else ""
    description = "\n\n".join(text for text in (one_of, priced) if text)
    return {
        "operationId": (prefix + endpoint.path).strip("/").replace("/", "_"),
        "summary": endpoint.summary,
        **({"description": description} if description else {}),
        "tags": [tag],
        "security": [{"apiKey": []}],
        "parameters": [_data_param(p) for p in endpoint.params] + [_IDEMPOTENCY_KEY, _CACHE_CONTROL],
        "responses": {**ok, **{str(s): _error(s, "DataError") for s in errors}, **_HEADERS_TOO_LARGE},
    }
