"""GET /sandbox/catalog: in development, the sandbox upstream's catalog of valid ids, through the gateway.

The sandbox runs in its own process on a port that changes at every start; users should only ever
need the gateway's address. In production the path does not exist (404)."""

from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from handlers.base import BaseHandler
from handlers.errors import ApiError

CATALOG_TIMEOUT = 5.0


class CatalogHandler(BaseHandler):
    """Valid user names, ids, tweets, lists, communities and spaces of the sandbox world (development only)."""

    async def get(self) -> None:
        settings = self.config
        if settings.production:
            raise ApiError(404, "Not found")
        try:
            response = await AsyncHTTPClient().fetch(
                settings.upstream_url.rstrip("/") + "/sandbox/catalog", request_timeout=CATALOG_TIMEOUT
            )
        except HTTPClientError as exc:
            if exc.code == 404:
                raise ApiError(404, "The upstream is not the sandbox: it has no catalog") from None
            raise ApiError(502, "The sandbox upstream did not answer") from None
        except OSError:
            raise ApiError(502, "The sandbox upstream did not answer") from None
        self.finish(response.body)


routes = [(r"/sandbox/catalog", CatalogHandler)]
