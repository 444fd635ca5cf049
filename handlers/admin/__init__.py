"""The admin console: metrics and the accounts list (metrics.py), one account's detail and actions (accounts.py),
the operator's margin per provider (margin.py), and their part of the OpenAPI document (openapi.py)."""

from handlers.admin import accounts, margin, metrics

routes = metrics.routes + accounts.routes + margin.routes
