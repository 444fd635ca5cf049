"""Real time: the provider-compatible rule and monitor calls, the tweet WebSocket and the portal's rules
(`handlers.py`), and their part of the OpenAPI document (`openapi.py`); what they do is streams/manage.py's."""

from handlers.streams.handlers import routes, socket_routes

__all__ = ["routes", "socket_routes"]
