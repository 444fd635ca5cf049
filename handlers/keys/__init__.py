"""API keys: their routes (handlers.py) and their part of the OpenAPI document (openapi.py)."""

from handlers.keys.handlers import routes

__all__ = ["routes"]
