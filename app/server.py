"""Connection-level limits: request head (431) and body (413) sizes, the HTTPServer every entry point uses, its
listen backlog and the process's open-file limit.

Heads: Tornado reads at most `max_header_size` bytes of request head and simply closes the
connection past that. To give ordinary clients a readable answer, the server reads up to
four times MAX_HEADER_BYTES and answers a JSON 431 (closing the connection) to any request
whose head is larger than MAX_HEADER_BYTES; only heads larger than the hard cap are cut off
without an answer.

Bodies: a declared Content-Length over MAX_BODY_BYTES is answered with a JSON 413 as soon as
the head is read, before any of the body; the application never sees the request. The body is
then read and discarded (up to DRAIN_BYTES, within HTTP_BODY_TIMEOUT), so that the client,
still sending, is not reset before it reads the answer, and the connection stays usable. Past
DRAIN_BYTES the connection is closed right after the 413. A chunked body is counted as it
arrives and cut at the limit: the same 413, then the connection is closed.

Slow clients: a client still sending its request head after HTTP_IDLE_TIMEOUT seconds, or its
body after HTTP_BODY_TIMEOUT seconds, is disconnected.

Connections per client address: at most MAX_CONNECTIONS_PER_ADDRESS open at once (peers in
TRUSTED_PROXIES excepted: a proxy carries many clients); a further one is closed on accept, so one
address cannot hold thousands of idle connections.
"""

from __future__ import annotations

import errno
import ipaddress
import resource
import socket
from collections import Counter

import orjson
import tornado.httpserver
import tornado.web
from tornado import httputil

from app.front import Front, prefilled
from handlers.base import request_id
from handlers.data_plane import DataPlane
from handlers.errors import portal_error

HARD_CAP_FACTOR = 4
DATA_PREFIXES = ("/social/", "/twitter/")  # answered in the data plane's error shape
DRAIN_BYTES = 64 << 20  # the most of an over-limit body read (and dropped) to answer it cleanly
# Connections waiting to be accepted (the kernel caps it at net.core.somaxconn). Tornado's 128 overflowed
# when a customer opened its 400 connections at once: the dropped SYNs were retried a second later.
LISTEN_BACKLOG = 4096


def head_size(start_line: httputil.RequestStartLine, headers: httputil.HTTPHeaders) -> int:
    """Bytes of the request line and headers as sent (give or take whitespace)."""
    size = len(start_line.method) + len(start_line.path) + len(start_line.version) + 4
    for name, value in headers.get_all():
        size += len(name) + len(value) + 4
    return size


def _declared_length(headers: httputil.HTTPHeaders) -> int | None:
    value = headers.get("Content-Length", "").split(",")[0].strip()
    return int(value) if value.isdigit() else None  # Tornado itself refuses anything else


class _Limits(httputil.HTTPMessageDelegate):
    def __init__(self, inner: httputil.HTTPMessageDelegate, connection: httputil.HTTPConnection, server: Limited):
        self.inner, self.connection, self.server = inner, connection, server
        self.refused = False
        self.received = 0
        self.data_plane = False
        self.request_id = ""

    def refuse(self, status: int, reason: str, message: str, close: bool) -> None:
        """Answers at once, in the error shape of the part addressed; the application never sees the request."""
        self.refused = True
        body = orjson.dumps({"status": "error", "msg": message} if self.data_plane else portal_error(message))
        headers = {
            "Content-Type": "application/json",
            "Content-Length": str(len(body)),
            "Cache-Control": "no-store",
            "X-Request-ID": self.request_id,  # like every other answer
        }
        if close:
            headers["Connection"] = "close"
        self.connection.write_headers(
            httputil.ResponseStartLine("HTTP/1.1", status, reason), httputil.HTTPHeaders(headers), body
        )
        if close:
            # Finishing before the request is read makes Tornado close the connection after the answer.
            self.connection.finish()

    def headers_received(self, start_line, headers):
        self.data_plane = start_line.path.startswith(DATA_PREFIXES)
        self.request_id = request_id(headers.get("X-Request-ID", ""))
        limit = self.server.max_header_bytes
        if head_size(start_line, headers) > limit:
            self.refuse(431, "Request Header Fields Too Large", f"Request headers are larger than {limit} bytes", True)
            return None
        declared = _declared_length(headers)
        if declared is not None and declared > self.server.max_body_bytes:
            # Read and drop the body, then finish (self.finish): the client gets the answer, not a reset.
            # Close at once instead when draining would not help or would answer twice: a body past
            # DRAIN_BYTES; a client waiting for "100 Continue" (it has sent nothing; Tornado would send its
            # 100 after our answer); a head Tornado itself refuses next (both lengths, or a list of lengths).
            close = (
                declared > DRAIN_BYTES
                or headers.get("Expect", "").lower() == "100-continue"
                or "Transfer-Encoding" in headers
                or "," in headers["Content-Length"]
            )
            self.refuse(413, "Content Too Large", self.too_large(), close)
            return None
        return self.inner.headers_received(start_line, headers)

    def too_large(self) -> str:
        return f"Request body is larger than {self.server.max_body_bytes} bytes"

    def data_received(self, chunk):
        if self.refused:
            return None
        self.received += len(chunk)
        if self.received > self.server.max_body_bytes:  # a chunked body past the limit: cut here
            self.inner.on_connection_close()
            self.refuse(413, "Content Too Large", self.too_large(), True)
            return None
        return self.inner.data_received(chunk)

    def finish(self) -> None:
        if self.refused:
            self.connection.finish()  # the dropped body is fully read: the connection can serve the next request
        else:
            self.inner.finish()

    def on_connection_close(self) -> None:
        if not self.refused:
            self.inner.on_connection_close()


class Limited(httputil.HTTPServerConnectionDelegate):
    """Wraps an Application: a head over MAX_HEADER_BYTES gets 431, a body over MAX_BODY_BYTES 413;
    neither reaches the application."""

    def __init__(self, app: tornado.web.Application, max_header_bytes: int, max_body_bytes: int):
        self.app, self.max_header_bytes, self.max_body_bytes = app, max_header_bytes, max_body_bytes

    def start_request(self, server_conn, request_conn):
        return _Limits(self.app.start_request(server_conn, request_conn), request_conn, self)

    def on_close(self, server_conn) -> None:
        self.app.on_close(server_conn)


class LimitedServer(tornado.httpserver.HTTPServer):
    """An HTTPServer that counts open connections per client address and closes those past the cap; with a
    front (app/front.py), its connections start on the gateway's own protocol and come here when they carry
    anything but data calls."""

    front: Front | None = None

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

    def admit(self, address) -> str | None:
        """The client address a new connection is counted against ("" when not counted), or None: refused."""
        ip = address[0] if isinstance(address, tuple) else ""
        if not (getattr(self, "per_address", 0) and self._counted(ip)):
            return ""
        if self.open_by_address[ip] >= self.per_address:
            self.refused_connections += 1
            return None
        self.open_by_address[ip] += 1
        return ip

    def release(self, ip: str) -> None:
        if ip:
            self.open_by_address[ip] -= 1
            if self.open_by_address[ip] <= 0:
                del self.open_by_address[ip]

    def _handle_connection(self, connection: socket.socket, address) -> None:
        # Tornado's accept callback (TCPServer.add_sockets): with a front, the connection starts there.
        if self.front is None:
            super()._handle_connection(connection, address)
            return
        ip = self.admit(address)
        if ip is None:
            connection.close()
            return
        self.front.accept(connection, address, ip)

    def handle_stream(self, stream, address) -> None:
        ip = self.admit(address)
        if ip is None:
            stream.close()
            return
        if ip:
            self.address_of[stream] = ip
        super().handle_stream(stream, address)

    def adopt(self, sock: socket.socket, address, ip: str, read: bytes) -> None:
        """A connection the front hands over (already counted against `ip`), with the bytes it read of it."""
        stream = prefilled(sock, read, max_buffer_size=self.max_buffer_size, read_chunk_size=self.read_chunk_size)
        if ip:
            self.address_of[stream] = ip
        super().handle_stream(stream, address)

    def close_after_each_answer(self) -> None:
        """From now on every answer closes its connection (`Connection: close`): on a drain, the clients of a
        connection open here take their next call to another process serving the port. Tornado's connections
        and the front's share these parameters and read them at each request."""
        self.conn_params.no_keep_alive = True

    def open_connections(self) -> int:
        """HTTP connections open here (a WebSocket is not one once upgraded)."""
        return len(self._connections) + (len(self.front.connections) if self.front else 0)

    async def close_all_connections(self) -> None:
        if self.front is not None:
            self.front.close_all()
        await super().close_all_connections()

    def on_close(self, server_conn) -> None:
        self.release(self.address_of.pop(getattr(server_conn, "stream", None), ""))
        super().on_close(server_conn)


def raise_open_file_limit() -> int:
    """Every call in flight holds two sockets (the client's and the provider's): thousands need more than
    the usual soft limit of 1,024 open files. Raised to the hard limit; returns the limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))
        except (ValueError, OSError):
            pass  # keep the soft limit; the caller says what it allows
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def make_server(app: tornado.web.Application, settings) -> tornado.httpserver.HTTPServer:
    """The HTTP server with the service's limits; `gateway.serve` and the tests use this one. An application
    with a data plane has its data calls served on the front's own protocol (DATA_CONNECTIONS)."""
    server = LimitedServer(
        Limited(app, settings.max_header_bytes, settings.max_body_bytes),
        # Tornado's own cap only bounds how much of an already refused body is drained.
        max_body_size=max(DRAIN_BYTES, settings.max_body_bytes),
        max_header_size=settings.max_header_bytes * HARD_CAP_FACTOR,
        idle_connection_timeout=settings.http_idle_timeout,
        body_timeout=settings.http_body_timeout,
    )
    server.limit_connections(settings.max_connections_per_address, settings.trusted_proxies)
    if isinstance(app, DataPlane) and settings.data_connections == "own":
        server.front = Front(server, app, settings.max_header_bytes, settings.http_idle_timeout)
    return server


def port_problem(host: str, port: int) -> str | None:
    """Why the gateway could not listen on host:port (another process has it, no permission), or None.

    Binds without SO_REUSEPORT: the gateway's own sockets use it, and a second gateway must not
    silently share the port with the first."""
    if not port:
        return None
    try:
        addresses = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return f"port {port} is busy (another gateway or program listens on it); try --port"
                if exc.errno == errno.EADDRNOTAVAIL and family == socket.AF_INET6:
                    continue  # no IPv6 on this machine: Tornado skips it too
                return f"cannot listen on {host or '*'}:{port}: {exc.strerror}"
    return None
