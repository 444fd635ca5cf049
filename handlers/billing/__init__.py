"""Billing: crypto top-ups (handlers.py) and monthly statements (statements.py), their routes and their part of the OpenAPI document (openapi.py)."""

from handlers.billing import handlers, statements

routes = handlers.routes + statements.routes
