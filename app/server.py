"""Connection-level limits: request header size (431), and the HTTPServer every entry point uses.

Tornado reads at most `max_header_size` bytes of request head and simply closes the
connection past that. To give ordinary clients a readable answer, the server reads up to
four times MAX_HEADER_BYTES and answers a JSON 431 (closing the connection) to any request
whose head is larger than MAX_HEADER_BYTES; only heads larger than the hard cap are cut off
without an answer. Slow clients: a client still sending its request head after
HTTP_IDLE_TIMEOUT seconds, or its body after HTTP_BODY_TIMEOUT seconds, is disconnected.
"""

from __future__ import annotations

import orjson
import tornado.httpserver
import tornado.web
from tornado import httputil

from handlers.errors import portal_error

HARD_CAP_FACTOR = 4


def head_size(start_line: httputil.RequestStartLine, headers: httputil.HTTPHeaders) -> int:
    """Bytes of the request line and headers as sent (give or take whitespace)."""
    size = len(start_line.method) + len(start_line.path) + len(start_line.version) + 4
    for name, value in headers.get_all():
        size += len(name) + len(value) + 4
    return size


class _HeaderLimit(httputil.HTTPMessageDelegate):
    def __init__(self, inner: httputil.HTTPMessageDelegate, connection: httputil.HTTPConnection, limit: int):
        self.inner, self.connection, self.limit = inner, connection, limit
        self.refused = False

    def headers_received(self, start_line, headers):
        if head_size(start_line, headers) <= self.limit:
            return self.inner.headers_received(start_line, headers)
        self.refused = True
        body = orjson.dumps(portal_error(f"Request headers are larger than {self.limit} bytes"))
        self.connection.write_headers(
            httputil.ResponseStartLine("HTTP/1.1", 431, "Request Header Fields Too Large"),
            httputil.HTTPHeaders(
                {
                    "Content-Type": "application/json",
                    "Content-Length": str(len(body)),
                    "Connection": "close",
                    "Cache-Control": "no-store",
                }
            ),
            body,
        )
        # Finishing before the request is read makes Tornado close the connection after the answer.
        self.connection.finish()
        return None

    def data_received(self, chunk):
        if not self.refused:
            return self.inner.data_received(chunk)
        return None

    def finish(self) -> None:
        if not self.refused:
            self.inner.finish()

    def on_connection_close(self) -> None:
        if not self.refused:
            self.inner.on_connection_close()


class HeaderLimited(httputil.HTTPServerConnectionDelegate):
    """Wraps an Application: requests with a head over `limit` bytes get 431 and never reach it."""

    def __init__(self, app: tornado.web.Application, limit: int):
        self.app, self.limit = app, limit

    def start_request(self, server_conn, request_conn):
        return _HeaderLimit(self.app.start_request(server_conn, request_conn), request_conn, self.limit)

    def on_close(self, server_conn) -> None:
        self.app.on_close(server_conn)


def make_server(app: tornado.web.Application, settings) -> tornado.httpserver.HTTPServer:
    """The HTTP server with the service's limits; `gateway.serve` and the tests use this one."""
    return tornado.httpserver.HTTPServer(
        HeaderLimited(app, settings.max_header_bytes),
        # Bodies up to 16x the limit are read and answered with a JSON 413; larger ones close the connection.
        max_body_size=max(settings.max_body_bytes * 16, 1 << 20),
        max_header_size=settings.max_header_bytes * HARD_CAP_FACTOR,
        idle_connection_timeout=settings.http_idle_timeout,
        body_timeout=settings.http_body_timeout,
    )
