"""The application with the data plane in front: a GET of a data endpoint's exact path is served by
handlers/data_call.py straight on its connection, every other request by web.Application's routes as before.

Tornado's own path for a request builds an HTTPServerRequest, matches the routes' patterns one by one and builds
a RequestHandler with its header objects: about a third of a data call's CPU (docs/benchmarks.md, "Where a
call's CPU goes"). Here the choice is one dict lookup once the head is read (tornado.routing._RoutingDelegate
makes its own at the same point). The one listening port, Tornado's HTTP/1 connection (keep-alive, pipelining,
the 413/431 limits of app/server.py) and every other route stay as they are.
"""

import asyncio
import functools

import tornado.web
from tornado import httputil

from handlers.context import HandlerContext
from handlers.data_call import DataCall
from social.endpoints import Endpoint


class DataPlane(tornado.web.Application):
    """web.Application, whose data GETs are DataCalls (`data_paths`: exact path -> endpoint)."""

    def __init__(self, ctx: HandlerContext, data_paths: dict[str, Endpoint], *args, **settings):
        super().__init__(*args, **settings)
        self.ctx, self.data_paths = ctx, data_paths

    def start_request(self, server_conn, request_conn) -> httputil.HTTPMessageDelegate:
        return _Pick(self, server_conn, request_conn)


class _Pick(httputil.HTTPMessageDelegate):
    """One request: a data call, or whatever web.Application makes of it."""

    __slots__ = ("app", "server_conn", "request_conn", "call", "inner")

    def __init__(self, app: DataPlane, server_conn, request_conn):
        self.app, self.server_conn, self.request_conn = app, server_conn, request_conn
        self.call: DataCall | None = None
        self.inner: httputil.HTTPMessageDelegate | None = None

    def headers_received(self, start_line, headers):
        if start_line.method == "GET":
            path, _, query = start_line.path.partition("?")
            endpoint = self.app.data_paths.get(path)
            # A head Tornado's HTTPServerRequest refuses (no Host on HTTP/1.1, a bad or doubled one) goes its way:
            # a 400 and the connection closed.
            if endpoint is not None and host_ok(headers.get("Host"), start_line.version):
                self.call = DataCall(self.app.ctx, self.request_conn, endpoint, headers, path, query)
                return None
        self.inner = tornado.web.Application.start_request(self.app, self.server_conn, self.request_conn)
        return self.inner.headers_received(start_line, headers)

    def data_received(self, chunk):
        if self.inner is not None:
            return self.inner.data_received(chunk)
        return None  # a body on a data GET is read and dropped, as its RequestHandler ignored it

    def finish(self) -> None:
        if self.inner is not None:
            self.inner.finish()
        else:  # the whole request is read: the call runs (the connection reads the next once it has answered)
            call = self.call
            call.task = asyncio.ensure_future(call.run())

    def on_connection_close(self) -> None:
        if self.inner is not None:
            self.inner.on_connection_close()
        # A data call runs on when its client goes (as its RequestHandler did): it is settled and recorded.


@functools.lru_cache(maxsize=256)
def host_ok(host: str | None, version: str) -> bool:
    """Whether HTTPServerRequest takes this Host header (cached: clients send the same few)."""
    try:
        httputil.HTTPServerRequest(
            start_line=httputil.RequestStartLine("GET", "/", version),
            headers=httputil.HTTPHeaders() if host is None else httputil.HTTPHeaders({"Host": host}),
        )
    except httputil.HTTPInputError:
        return False
    return True
