"""Alert rules, webhook endpoints and their deliveries: the routes (`handlers.py`) and their part of the OpenAPI
document (`openapi.py`); what they do is services/alerts.py's."""

from handlers.alerts.handlers import routes

__all__ = ["routes"]
