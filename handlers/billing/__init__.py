"""Billing: crypto top-ups (handlers.py), billing details, receipts and credit notes (documents.py), and their part
of the OpenAPI document (openapi.py)."""

from handlers.billing import documents, handlers

routes = handlers.routes + documents.routes

__all__ = ["routes"]
