"""Connection-level limits: request header size (431), and the HTTPServer every entry point uses.

Tornado reads at most `max_header_size` bytes of request head and simply closes the
connection past that. To give ordinary clients a readable answer, the server reads up to
four times MAX_HEADER_BYTES and answers a JSON 431 (closing the connection) to any request
whose head is larger than MAX_HEADER_BYTES; only heads larger than the hard cap are cut off
without an answer. Slow clients: a client still sending its request head after
HTTP_IDLE_TIMEOUT seconds, or its body after HTTP_BODY_TIMEOUT seconds, is disconnected.
Connections per client address: at most MAX_CONNECTIONS_PER_ADDRESS open at once (peers in
TRUSTED_PROXIES excepted: a proxy carries many clients); a further one is closed on accept, so one
address cannot hold thousands of idle connections.
"""

from __future__ import annotations

import ipaddress
from collections import Counter

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


class LimitedServer(tornado.httpserver.HTTPServer):
    """An HTTPServer that counts open connections per client address and closes those past the cap."""

    def limit_connections(self, per_address: int, exempt: tuple) -> None:
        self.per_address, self.exempt = per_address, tuple(ipaddress.ip_network(n) for n in exempt)
        self.open_by_address: Counter[str] = Counter()
        self.address_of: dict[object, str] = {}  # stream -> its counted client address
        self.refused_connections = 0

    def _counted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False  # a unix socket
        return not any(ip in network for network in self.exempt)

    def handle_stream(self, stream, address) -> None:
        ip = address[0] if isinstance(address, tuple) else ""
        if getattr(self, "per_address", 0) and self._counted(ip):
            if self.open_by_address[ip] >= self.per_address:
                self.refused_connections += 1
                stream.close()
                return
            self.open_by_address[ip] += 1
            self.address_of[stream] = ip
        super().handle_stream(stream, address)

    def on_close(self, server_conn) -> None:
        ip = self.address_of.pop(getattr(server_conn, "stream", None), None)
        if ip is not None:
            self.open_by_address[ip] -= 1
            if self.open_by_address[ip] <= 0:
                del self.open_by_address[ip]
        super().on_close(server_conn)


def make_server(app: tornado.web.Application, settings) -> tornado.httpserver.HTTPServer:
    """The HTTP server with the service's limits; `gateway.serve` and the tests use this one."""
    server = LimitedServer(
        HeaderLimited(app, settings.max_header_bytes),
        # Bodies up to 16x the limit are read and answered with a JSON 413; larger ones close the connection.
        max_body_size=max(settings.max_body_bytes * 16, 1 << 20),
        max_header_size=settings.max_header_bytes * HARD_CAP_FACTOR,
        idle_connection_timeout=settings.http_idle_timeout,
        body_timeout=settings.http_body_timeout,
    )
    server.limit_connections(settings.max_connections_per_address, settings.trusted_proxies)
    return server
