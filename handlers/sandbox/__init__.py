"""The development catalog: GET /sandbox/catalog, the sandbox provider's valid ids through the gateway (`handlers.py`),
and its part of the OpenAPI document (`openapi.py`)."""

from handlers.sandbox.handlers import routes

__all__ = ["routes"]
