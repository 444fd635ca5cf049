"""The port's connections on a protocol of our own, as long as they carry data calls; Tornado for the rest.

Every connection the server accepts (app/server.py `LimitedServer`) starts here, on an asyncio protocol
(uvloop's transports, in C). A request whose head is a plain data GET (HTTP/1.1, a data endpoint's exact path,
no body, a Host Tornado accepts) is served on it by `DataCall`, the one data call the Tornado path serves too
(handlers/data_call.py); so is an MCP message (POST /mcp, HTTP/1.1, a Content-Length within the MCP limit), by the
`Exchange` Tornado's route serves too (handlers/mcp/handlers.py). At the first request that is anything else (the portal, a WebSocket, another method,
HTTP/1.0, a body, a head too large or not in the common form), the connection is handed to Tornado's
HTTP/1 connection with the bytes read so far, and stays there: Tornado answers it, its limits (413/431, slow
bodies) and errors included, exactly as if it had accepted it.

Why: with the lean data path (handlers/data_plane.py), Tornado's HTTP/1 connection was the largest part of a
data call's CPU left in Python (an `HTTP1Connection` and a `with_timeout` per request, epoll re-registrations
on every read and write, two `setsockopt` per answer: docs/benchmarks.md, "Where a call's CPU goes"). Here a
request is one `find` for the head's end and Tornado's own head parsers; an answer is one `transport.write`.

What Tornado's connection gave a data call is kept: requests on one connection are answered in order, the
next one read only once the answer is handed to the kernel (a client that does not read holds one answer, not
many); a client still sending its head after HTTP_IDLE_TIMEOUT seconds is disconnected, as is one silent that
long between requests; `Connection: close` (the client's, or the server's own once it drains) closes the
connection after the answer; a client gone mid-call does not stop the call (it is settled and recorded).
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import time
from typing import TYPE_CHECKING

from tornado import httputil
from tornado.iostream import IOStream

from handlers.data_call import DataCall
from handlers.data_plane import DataPlane, host_ok
from handlers.mcp.handlers import MAX_REQUEST_BYTES, OnConnection

if TYPE_CHECKING:
    from app.server import LimitedServer

BUSY_BUFFER = 256 * 1024  # bytes of pipelined requests read ahead while a call runs; past that, reading pauses
SWEEP_SECONDS = 1.0  # how often connections waiting too long for a head are looked for


class Front:
    """The protocol's side of the server: its connections and the idle sweep."""

    def __init__(self, server: LimitedServer, app: DataPlane, max_head: int, idle_timeout: float | None):
        self.server, self.app = server, app
        self.max_head, self.idle_timeout = max_head, idle_timeout
        self.connections: set[Connection] = set()
        self._sweeper: asyncio.TimerHandle | None = None

    def accept(self, sock: socket.socket, address, counted_ip: str) -> None:
        """A connection the server accepted (and counted against its address, `counted_ip`, "" if not)."""
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        task = loop.create_task(loop.connect_accepted_socket(lambda: Connection(self, address, counted_ip), sock))
        task.add_done_callback(functools.partial(self._connected, sock, counted_ip))
        if self._sweeper is None and self.idle_timeout:
            self._sweeper = loop.call_later(SWEEP_SECONDS, self._sweep)

    def _connected(self, sock: socket.socket, counted_ip: str, task: asyncio.Task) -> None:
        if task.cancelled() or task.exception() is not None:  # no transport (reset before it was set up): the
            sock.close()  # connection never opened here, and its address's count goes back
            self.server.release(counted_ip)

    def _sweep(self) -> None:
        deadline = time.monotonic() - self.idle_timeout
        for conn in [c for c in self.connections if c.call is None and c.waiting_since < deadline]:
            conn.close()
        self._sweeper = asyncio.get_running_loop().call_later(SWEEP_SECONDS, self._sweep)

    def close_all(self) -> None:
        """On shutdown: every connection still here is closed (an answer being written is cut, as Tornado's)."""
        for conn in list(self.connections):
            conn.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None


class _RequestContext:
    """What a DataCall reads of its connection's context (Tornado's `_HTTPRequestContext`): the peer's address."""

    __slots__ = ("remote_ip",)

    def __init__(self, remote_ip: str):
        self.remote_ip = remote_ip


class Connection(asyncio.Protocol):
    """One client connection while it carries data calls: reads heads, runs one DataCall at a time, writes."""

    def __init__(self, front: Front, address, counted_ip: str):
        self.front, self.address, self.counted_ip = front, address, counted_ip
        ip = address[0] if isinstance(address, tuple) else "0.0.0.0"  # as Tornado's context: a unix socket has none
        self.context = _RequestContext(ip)
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.call: DataCall | OnConnection | None = None  # the request being answered
        self.close_after = False  # the answer under way ends the connection
        self.writing = False  # the kernel has not taken all of the last answer yet
        self.reading = True
        self.closed = False
        self.handed_over = False
        self.waiting_since = time.monotonic()  # when the connection began to wait for a request's head

    # --- asyncio.Protocol --------------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        # Told at once when an answer is not all sent (pause_writing) and when it is (resume_writing): the
        # next request is read only then, as Tornado's connection waits for its write.
        transport.set_write_buffer_limits(high=0)
        self.front.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self.handed_over:  # (the transport reads nothing after the hand-over: it is closed then)
            raise RuntimeError("data after the connection went to Tornado")
        self.buffer += data
        if self.call is None and not self.writing:
            self.next_request()
        elif len(self.buffer) > BUSY_BUFFER and self.reading:
            self.reading = False
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        return False  # the client is done sending: the transport closes (a call under way still runs on)

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.front.connections.discard(self)
        if not self.handed_over:
            self.front.server.release(self.counted_ip)

    def pause_writing(self) -> None:
        self.writing = True

    def resume_writing(self) -> None:
        self.writing = False
        if self.call is None and not self.closed and not self.handed_over:  # (closing empties the buffer too)
            self.next_request()

    # --- requests ----------------------------------------------------------------------------------------
    def next_request(self) -> None:
        """Serves the next request in the buffer if its head is all here; hands the connection over if that
        request is not a data GET in the common form."""
        buffer = self.buffer
        if not self.reading and len(buffer) <= BUSY_BUFFER:
            self.reading = True
            self.transport.resume_reading()
        if not buffer:
            return
        end = buffer.find(b"\r\n\r\n")
        if end < 0 or end > self.front.max_head:
            # Too large (Tornado answers its 431), or lines ended by bare LFs (Tornado reads those): Tornado's.
            if end >= 0 or len(buffer) > self.front.max_head or b"\n\n" in buffer or b"\n\r\n" in buffer:
                self.hand_over()
            return
        head = bytes(buffer[:end])
        if head.startswith(b"POST /mcp "):
            call = self.mcp_call(head, end + 4)
            if call is False:
                return  # its body is not all here yet
        else:
            call = self.data_call(head)
        if call is None:
            self.hand_over()
            return
        del buffer[: end + 4 + (len(call.exchange.body) if isinstance(call, OnConnection) else 0)]
        self.call = call
        call.task = asyncio.ensure_future(call.run())

    def mcp_call(self, head: bytes, body_at: int) -> OnConnection | None | bool:
        """An MCP message (POST /mcp with a Content-Length within the MCP limit, HTTP/1.1), served here as a data
        GET is (its answer's CPU was mostly Tornado's connection and routing: docs/benchmarks.md, MCP tool calls);
        None: Tornado's (a chunked or too large body, Expect, HTTP/1.0); False: its body is still coming."""
        parsed = self.parsed(head)
        if parsed is None:
            return None
        start_line, headers = parsed
        if start_line.path != "/mcp" or "Transfer-Encoding" in headers or "Expect" in headers:
            return None
        try:
            length = int(headers.get("Content-Length", ""))
        except ValueError:
            return None
        if not 0 <= length <= MAX_REQUEST_BYTES or "," in headers.get("Content-Length", ""):
            return None
        if len(self.buffer) < body_at + length:
            return False
        self.keep_alive(headers)
        return OnConnection(self.front.app.ctx, self, headers, bytes(self.buffer[body_at : body_at + length]))

    def parsed(self, head: bytes) -> tuple[httputil.RequestStartLine, httputil.HTTPHeaders] | None:
        """The head's start line and headers as Tornado parses them, or None: not in the common form (HTTP/1.1,
        no bare CR or LF, a Host Tornado accepts)."""
        if head.count(b"\r") != head.count(b"\n"):  # a bare CR or LF somewhere
            return None
        first, _, rest = head.decode("latin-1").partition("\r\n")
        try:
            start_line = httputil.parse_request_start_line(first)
            headers = httputil.HTTPHeaders.parse(rest)
        except httputil.HTTPInputError:
            return None
        if start_line.version != "HTTP/1.1" or not host_ok(headers.get("Host"), "HTTP/1.1"):
            return None
        return start_line, headers

    def keep_alive(self, headers: httputil.HTTPHeaders) -> None:
        connection = headers.get("Connection")
        self.close_after = (
            connection is not None and connection.lower() == "close"
        ) or self.front.server.conn_params.no_keep_alive
        self.waiting_since = 0.0  # not waiting: answering

    def data_call(self, head: bytes) -> DataCall | None:
        """The DataCall for a head, or None: a request for Tornado."""
        if not head.startswith(b"GET "):
            return None
        parsed = self.parsed(head)
        if parsed is None:
            return None
        start_line, headers = parsed
        path, _, query = start_line.path.partition("?")
        endpoint = self.front.app.data_paths.get(path)
        if endpoint is None or "Content-Length" in headers or "Transfer-Encoding" in headers or "Expect" in headers:
            return None
        self.keep_alive(headers)
        return DataCall(self.front.app.ctx, self, endpoint, headers, path, query)

    # --- what DataCall calls (Tornado's HTTP1Connection's names) -----------------------------------------
    def write_headers(self, start_line: httputil.ResponseStartLine, headers: httputil.HTTPHeaders, body: bytes):
        if self.close_after:
            headers["Connection"] = "close"  # as Tornado tells an HTTP/1.1 client whose connection will close
        elif headers.get("Connection", "").lower() == "close":  # the answer itself ends the connection (a drain)
            self.close_after = True
        lines = [f"HTTP/1.1 {start_line.code} {start_line.reason}"]
        lines.extend(f"{name}: {value}" for name, value in headers.get_all())
        head = "\r\n".join(lines)
        if head.count("\n") != len(lines) - 1 or head.count("\r") != len(lines) - 1:
            raise ValueError("a CR or LF in a header")  # as Tornado refuses one: never a split answer
        if not self.closed:
            self.transport.write(head.encode("latin-1") + b"\r\n\r\n" + body)

    def finish(self) -> None:
        """The answer is written: the connection ends, or reads the next request once the kernel has it all."""
        self.call = None
        self.waiting_since = time.monotonic()
        if self.closed:
            return
        if self.close_after:
            self.transport.close()  # after what is buffered is sent
            return
        if not self.writing:
            asyncio.get_running_loop().call_soon(self._after_answer)

    def _after_answer(self) -> None:
        if self.call is None and not self.writing and not self.closed and not self.handed_over:
            self.next_request()

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.transport.close()

    # --- to Tornado --------------------------------------------------------------------------------------
    def hand_over(self) -> None:
        """The connection goes to Tornado's HTTP/1 connection, with what was read of it and not yet answered
        (only once the kernel took the last answer: `next_request` runs only then)."""
        transport = self.transport
        self.handed_over = True  # before abort(): closing the transport calls resume_writing, which must not
        # hand the connection over a second time (two streams on one socket answered a request twice)
        transport.pause_reading()
        fd = transport.get_extra_info("socket").fileno()
        sock = socket.socket(fileno=os.dup(fd))  # the transport closes its own descriptor; this one stays
        transport.abort()
        read, self.buffer = bytes(self.buffer), bytearray()
        self.front.server.adopt(sock, self.address, self.counted_ip, read)


def prefilled(sock: socket.socket, data: bytes, **options) -> IOStream:
    """An IOStream on `sock` that reads `data` first (the bytes read from it before the hand-over)."""
    stream = IOStream(sock, **options)
    if data:
        stream._read_buffer += data  # Tornado reads its buffer before the socket (IOStream._find_read_pos)
        stream._read_buffer_size += len(data)
    return stream
