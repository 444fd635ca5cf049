"""The admin console: metrics and the accounts list (metrics.py), one account's detail and actions (accounts.py),
every account's receipts and their voiding (billing.py), and their part of the OpenAPI document (openapi.py)."""

from handlers.admin import accounts, billing, metrics

routes = metrics.routes + accounts.routes + billing.routes
