"""The audit log, read and exported: the routes (handlers.py) and their part of the OpenAPI document (openapi.py)."""

from handlers.audit.handlers import routes

__all__ = ["routes"]
