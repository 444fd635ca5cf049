"""The MCP server at /mcp (docs/mcp.md): the protocol's revisions (protocol.py), the tools declared once (tools.py),
what a call answers (results.py), the endpoint whose tool calls are data calls (handlers.py), its part of the
OpenAPI document (openapi.py)."""

from handlers.mcp.handlers import routes

__all__ = ["routes"]
