"""The MCP area's part of the OpenAPI document: the one endpoint, whose messages are JSON-RPC (docs/mcp.md). Its
errors are JSON-RPC errors too (an HTTP status with a JSON-RPC body), never the data plane's shape."""

from handlers.openapi_operations import Operation
from handlers.openapi_schema import ref

_ANSWER = {"description": "A JSON-RPC error", "content": {"application/json": {"schema": ref("JsonRpcResponse")}}}

OPERATIONS: list[Operation] = [
    Operation(
        "post",
        "/mcp",
        "The MCP server for AI agents (Streamable HTTP, JSON-RPC 2.0; revisions 2026-07-28, 2025-11-25, 2025-06-18): "
        "tools/list, tools/call, server/discover, initialize. Authenticated with the API key (X-API-Key or "
        "Authorization: Bearer); each data tool call is charged as its REST call (docs/mcp.md)",
        "mcp",
        ref("JsonRpcResponse"),
        security="apikey",
        body="JsonRpcRequest",
        errors=(),
        extra={
            "202": {"description": "A notification or response, accepted"},
            **{str(status): _ANSWER for status in (400, 401, 403, 404, 413)},
        },
    ),
]
SCHEMAS: dict = {
    "JsonRpcRequest": {
        "type": "object",
        "required": ["jsonrpc", "method"],
        "properties": {
            "jsonrpc": {"const": "2.0"},
            "id": {
                "oneOf": [
                    {"type": "string", "maxLength": 256},
                    {"type": "integer", "minimum": -(2**53), "maximum": 2**53},
                ]
            },
            "method": {"type": "string", "minLength": 1, "examples": ["tools/list"]},
            "params": {"type": "object"},
        },
    },
    "JsonRpcResponse": {
        "type": "object",
        "required": ["jsonrpc"],
        "properties": {
            "jsonrpc": {"const": "2.0"},
            "id": {"type": ["string", "integer", "null"]},
            "result": {"type": "object"},
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {"code": {"type": "integer"}, "message": {"type": "string"}, "data": {}},
            },
        },
    },
}
