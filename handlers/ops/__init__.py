"""Operations: liveness, readiness, /metrics and the OpenAPI document (handlers.py), and their part of the document
(openapi.py)."""

from handlers.ops.handlers import metrics_app, metrics_routes, peer_app, routes

__all__ = ["metrics_app", "metrics_routes", "peer_app", "routes"]
