"""Billing: crypto top-ups (handlers.py), billing details, receipts and credit notes (documents.py), monthly
statements (statements.py), and their part of the OpenAPI document (openapi.py)."""

from handlers.billing import documents, handlers, statements

routes = handlers.routes + documents.routes + statements.routes

__all__ = ["routes"]
