"""The MCP area's part of the OpenAPI document: the one endpoint, whose messages are JSON-RPC (docs/mcp.md)."""

from handlers.openapi_operations import Operation

OPERATIONS: list[Operation] = [
    Operation(
        "post",
        "/mcp",
        "The MCP server for AI agents (Streamable HTTP, JSON-RPC 2.0; revisions 2026-07-28, 2025-11-25, 2025-06-18): "
        "tools/list, tools/call, server/discover, initialize. Authenticated with the API key (X-API-Key or "
        "Authorization: Bearer); each data tool call is charged as its REST call (docs/mcp.md)",
        "mcp",
        {"type": "object", "description": "A JSON-RPC 2.0 response"},
        security="apikey",
        errors=(400, 401, 403, 404, 413),
        extra={"202": {"description": "A notification or response, accepted"}},
    ),
]
SCHEMAS: dict = {}
