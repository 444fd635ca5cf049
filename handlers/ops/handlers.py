"""Operations: liveness, readiness, Prometheus metrics and the OpenAPI document (its interactive page: portal/pages.py);
what readiness checks and /metrics reports is read in services/ops.py."""

import hmac

import orjson
import tornado.web

from handlers import openapi, owner
from handlers.base import BaseHandler, NotFoundHandler
from handlers.context import HandlerContext
from handlers.errors import ApiError
from handlers.ops.openapi import ALIASES
from runtime import scrape
from social import prices


class HealthHandler(BaseHandler):
    """The process is alive; touches nothing else."""

    def get(self) -> None:
        self.send_json({"status": "ok"})

    head = get  # load balancers probe with HEAD too; Tornado sends the headers only


class ReadyHandler(BaseHandler):
    """Ready for traffic: database answers, upstream breaker closed, usage buffer under its bound, not draining."""

    async def get(self) -> None:
        ready, checks = await self.services.ops.readiness()
        if not ready:
            self.set_header("Retry-After", "1")  # every 503 says when to look again
        self.send_json(
            {
                "status": "ready" if ready else "not ready",
                "checks": checks,
            },
            200 if ready else 503,
        )

    head = get


class MetricsHandler(BaseHandler):
    """Prometheus text format; needs `Authorization: Bearer METRICS_TOKEN` when that is set."""

    async def get(self) -> None:
        settings = self.config
        token = settings.metrics_token
        if not token and settings.production and not settings.metrics_port:
            # In production the figures (routes, volumes, cache ratios) are not for the public internet.
            raise ApiError(401, "Set METRICS_TOKEN, or serve /metrics on METRICS_PORT", {"WWW-Authenticate": "Bearer"})
        if token:
            scheme, _, given = self.request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
                raise ApiError(401, "Not authenticated", {"WWW-Authenticate": "Bearer"})
        content_type, body = scrape.render(
            await self.ctx.runtime.scrape.gather(self.services.ops.registry()), self.request.headers.get("Accept", "")
        )
        self.set_header("Content-Type", content_type)
        self.finish(body)


class WorkerMetricsHandler(BaseHandler):
    """One worker's own series, for the sibling answering a scrape (runtime/scrape.py); loopback only."""

    def get(self) -> None:
        given = self.request.headers.get(scrape.SECRET_HEADER, "")
        if not self.ctx.runtime.scrape.secret or not hmac.compare_digest(
            given.encode(), self.ctx.runtime.scrape.secret.encode()
        ):
            raise ApiError(401, "Not authenticated")
        self.set_header("Content-Type", "application/json")
        self.finish(orjson.dumps(self.ctx.runtime.scrape.own(self.services.ops.registry())))

    def on_finish(self) -> None:
        """A hand-over between workers, not a request to the service: neither counted nor logged."""


class OpenAPIHandler(BaseHandler):
    """The OpenAPI 3.1.0 document of this application: each data endpoint once (/social), unless ?aliases=true."""

    def get(self) -> None:
        settings = self.config
        aliases = settings.twitter_alias and self.query_arg(ALIASES)
        # The running settings' prices and cache freshness in each data operation (a reload shows at once).
        self.finish(openapi.serialized(aliases, not settings.metrics_port, prices.Terms.of(settings)))


routes = [
    (r"/healthz", HealthHandler),
    (r"/readyz", ReadyHandler),
    (r"/openapi\.json", OpenAPIHandler),
]
# On the main application only when METRICS_PORT is unset; otherwise on metrics_app's own port.
metrics_routes = [(r"/metrics", MetricsHandler)]


def metrics_app(ctx: HandlerContext) -> tornado.web.Application:
    """The separate application serving /metrics alone on METRICS_PORT."""
    return tornado.web.Application(
        [(r"/metrics", MetricsHandler, {"ctx": ctx})],
        default_handler_class=NotFoundHandler,
        default_handler_args={"ctx": ctx},
    )


def peer_app(ctx: HandlerContext) -> tornado.web.Application:
    """The loopback application through which a worker hands its series to the sibling answering a scrape, and
    answers its siblings' calls for the cache keys it owns (handlers/owner.py)."""
    return tornado.web.Application(
        [(scrape.PEER_PATH, WorkerMetricsHandler, {"ctx": ctx})]
        + [(path, handler, {"ctx": ctx}) for path, handler in owner.routes],  # the answer cache's owner link
        default_handler_class=NotFoundHandler,
        default_handler_args={"ctx": ctx},
        log_function=lambda handler: None,
    )
