"""Billing, crypto top-ups: the routes (handlers.py) and their part of the OpenAPI document (openapi.py)."""

from handlers.billing.handlers import routes

__all__ = ["routes"]
