"""The account and its usage: the routes (handlers.py) and their part of the OpenAPI document (openapi.py)."""

from handlers.account.handlers import routes

__all__ = ["routes"]
