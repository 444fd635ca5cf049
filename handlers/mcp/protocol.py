"""The Model Context Protocol's JSON-RPC layer over Streamable HTTP, as three revisions define it: 2026-07-28 (no
handshake: each request carries its revision and the client's capabilities in `params._meta`, and the
`MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` headers repeat the body, checked against it; `server/discover`)
and the handshake revisions 2025-11-25 and 2025-06-18 (`initialize`, then `MCP-Protocol-Version` on every request).
Pure: a decoded body and the request's headers in, a `Reply` (status and JSON-RPC message) or a `Dispatch` out.

Why not the official SDK's server: its HTTP layer is ASGI (Starlette) and the gateway is one Tornado loop; a tool
call is a data call of this process (handlers/mcp/handlers.py), and the protocol around it is a few checks. The SDK's
own types validate what this module answers, in the tests (tests/mcp/).
"""

from dataclasses import dataclass

MODERN = "2026-07-28"
HANDSHAKE = ("2025-11-25", "2025-06-18")
SUPPORTED = (MODERN, *HANDSHAKE)
VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
CLIENT_INFO_KEY = "io.modelcontextprotocol/clientInfo"

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602
HEADER_MISMATCH, UNSUPPORTED_VERSION = -32020, -32022
_STATUS = {PARSE_ERROR: 400, INVALID_REQUEST: 400, INVALID_PARAMS: 400, HEADER_MISMATCH: 400, UNSUPPORTED_VERSION: 400}
_ID_MAX = 2**53  # JSON numbers beyond this are not exact in every client
_NAMED = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}


@dataclass(frozen=True)
class Reply:
    status: int
    message: dict | None  # None: 202, no body


@dataclass(frozen=True)
class Dispatch:
    """A request to answer: its id, method, params and the revision it speaks."""

    id: object
    method: str
    params: dict
    version: str

    @property
    def modern(self) -> bool:
        return self.version == MODERN


def error(request_id, code: int, message: str, data=None, status: int | None = None) -> Reply:
    body = {"code": code, "message": message}
    if data is not None:
        body["data"] = data
    return Reply(status or _STATUS.get(code, 200), {"jsonrpc": "2.0", "id": request_id, "error": body})


def result(call: Dispatch, value: dict) -> Reply:
    if call.modern:
        value = {"resultType": "complete", **value}
    return Reply(200, {"jsonrpc": "2.0", "id": call.id, "result": value})


def _valid_id(value) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return -_ID_MAX <= value <= _ID_MAX
    return isinstance(value, str) and len(value) <= 256


def classify(body, headers) -> Reply | Dispatch:
    """What a POSTed body is: a protocol fault answered at once (Reply), or a request to dispatch.
    `headers`: the request's, case-insensitive (Tornado's HTTPHeaders)."""
    if isinstance(body, list):
        return error(None, INVALID_REQUEST, "Batches are not supported: send one JSON-RPC message per request")
    if not isinstance(body, dict) or body.get("jsonrpc") != "2.0":
        return error(None, INVALID_REQUEST, "Body must be one JSON-RPC 2.0 request or notification object")
    method = body.get("method")
    if "id" not in body:  # a notification (acknowledged, nothing to act on), or a response to a request this server
        # never sends (refused, as the transport allows)
        header = headers.get("MCP-Protocol-Version")
        if header is not None and header not in SUPPORTED:  # told so, as a request is (no id to answer to)
            return _unsupported(None, header)
        if isinstance(method, str) and method and isinstance(body.get("params", {}), dict):
            return Reply(202, None)
        return error(None, INVALID_REQUEST, "A message without an id must be a notification with a method")
    request_id = body["id"]
    if not _valid_id(request_id):
        return error(None, INVALID_REQUEST, "id must be a string (at most 256 characters) or an integer")
    if not isinstance(method, str) or not method:
        return error(request_id, INVALID_REQUEST, "method must be a non-empty string")
    params = body.get("params", {})
    if not isinstance(params, dict):
        return error(request_id, INVALID_PARAMS, "params must be an object")
    meta = params.get("_meta")
    if isinstance(meta, dict) and VERSION_KEY in meta:
        return _modern(request_id, method, params, meta, headers)
    header = headers.get("MCP-Protocol-Version")
    if header == MODERN:
        return error(request_id, INVALID_PARAMS, f"params._meta must carry {VERSION_KEY} and {CAPABILITIES_KEY}")
    if method == "initialize":
        asked = params.get("protocolVersion")
        version = asked if asked in HANDSHAKE else HANDSHAKE[0]
        return Dispatch(request_id, method, params, version)
    if header is not None and header not in HANDSHAKE:
        return _unsupported(request_id, header)
    return Dispatch(request_id, method, params, header or HANDSHAKE[-1])


def _modern(request_id, method: str, params: dict, meta: dict, headers) -> Reply | Dispatch:
    if CAPABILITIES_KEY not in meta:
        return error(request_id, INVALID_PARAMS, f"params._meta is missing {CAPABILITIES_KEY}")
    version = meta[VERSION_KEY]
    if headers.get("MCP-Protocol-Version") != version:
        return error(request_id, HEADER_MISMATCH, "MCP-Protocol-Version header does not match params._meta")
    if headers.get("Mcp-Method") != method:
        return error(request_id, HEADER_MISMATCH, "Mcp-Method header does not match the body's method")
    named = _NAMED.get(method)
    if named is not None and params.get(named) is not None and headers.get("Mcp-Name") != params.get(named):
        return error(request_id, HEADER_MISMATCH, f"Mcp-Name header does not match the body's {named}")
    if version != MODERN:
        return _unsupported(request_id, version if isinstance(version, str) else str(version))
    return Dispatch(request_id, method, params, MODERN)


def _unsupported(request_id, requested: str) -> Reply:
    return error(
        request_id,
        UNSUPPORTED_VERSION,
        "Unsupported protocol version",
        {"supported": list(SUPPORTED), "requested": requested},
    )
