"""The connections to the provider: HTTP/1.1 keep-alive, GET only, one call per connection at a time,
answers read by httptools (llhttp, Node.js's parser, in C).

Why not a general client: against a provider answering in 0.7 s, this pool spent 0.23-0.30 ms of CPU per
call where aiohttp's client spent 0.38-0.45 and libcurl through Tornado 0.44-0.53, and it alone kept up
with nginx at 2,000 calls in flight (bench/clients.py; docs/benchmarks.md, Choosing the upstream client). The gateway
needs little of what those clients offer: no redirects, no cookies, no proxies, no compression (it asks for
none), one origin. What it needs is here: a connect timeout and a whole-call timeout, a body cap checked as
the answer arrives, HTTPS when the provider's URL says so, and no logging at all (query text and the
provider key never reach a log).

Idle connections wait newest first, so that after a burst the least used ones age out (the provider closes
them at its keep-alive timeout and they leave the pool). A reused connection that fails before any byte of
its answer is retried once on a new one: the provider may have closed it just then, and a GET that got no
answer is neither served nor charged.
"""

import asyncio
import ssl
import urllib.parse
from dataclasses import dataclass

import httptools


class TooLarge(Exception):
    """The answer is larger than the body cap (read no further)."""


class ConnectTimeout(TimeoutError):
    """No connection to the provider within the connect timeout: the provider, not the call."""


@dataclass(frozen=True)
class Received:
    status: int
    body: bytes
    retry_after: str | None


class _Connection(asyncio.Protocol):
    def __init__(self, pool: "Http1Pool") -> None:
        self.pool = pool
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future | None = None
        self.chunks: list[bytes] = []
        self.size = 0
        self.retry_after: str | None = None
        self.answered = False  # a byte of the current answer arrived
        self.keep_alive = False  # read at the answer's end: the parser forgets it for the next one
        self.closed = False
        self.ended = False  # the other side closed the connection

    # asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport

    def eof_received(self) -> None:
        self.ended = True  # and the transport closes

    def data_received(self, data: bytes) -> None:
        self.answered = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(exc)
            self.transport.close()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.pool.idle.pop(self, None)
        if self.pool.lost is not None and (exc is not None or self.ended):  # the other side ended it, not us
            self.pool.lost()
        self._fail(exc or ConnectionResetError("the provider closed the connection"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"retry-after":
            self.retry_after = value.decode("latin-1")
        elif name == b"content-length" and value.strip().isdigit() and int(value) > self.pool.max_body:
            self._fail(TooLarge())  # announced too large: not a byte of it is read
            self.transport.close()

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > self.pool.max_body:
            self._fail(TooLarge())
            self.transport.close()
        else:
            self.chunks.append(body)

    def on_message_complete(self) -> None:
        waiter, self.waiter = self.waiter, None
        self.keep_alive = self.parser.should_keep_alive()
        # The chunks go with the answer: an idle connection holding its last answer's body kept 38 KB per
        # connection alive (the pool keeps a connection per call that was ever in flight at once).
        chunks, self.chunks = self.chunks, []
        if waiter is not None and not waiter.done():
            body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            waiter.set_result(Received(self.parser.get_status_code(), body, self.retry_after))

    def call(self, request: bytes) -> asyncio.Future:
        self.chunks, self.size, self.retry_after, self.answered = [], 0, None, False
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.waiter

    def _fail(self, exc: BaseException) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)


class Http1Pool:
    def __init__(self, base_url: str, connect_timeout: float, max_body: int) -> None:
        url = urllib.parse.urlsplit(base_url)
        self.host, self.max_body, self.connect_timeout = url.hostname, max_body, connect_timeout
        self.tls = ssl.create_default_context() if url.scheme == "https" else None
        self.port = url.port or (443 if self.tls else 80)
        self.origin = f"{url.scheme}://{url.netloc}"
        self.host_line = f"Host: {url.netloc}\r\n".encode("latin-1")
        self.idle: dict[_Connection, None] = {}  # insertion ordered: popitem() takes the newest
        self.lost = None  # called when the other side closes a connection (accounting/tiers.py: a sibling that died)

    async def get(self, url: str, headers: bytes, timeout: float) -> Received:
        """GET `url` (of this pool's origin, already percent-encoded) with `headers` (complete header lines).
        Raises ConnectTimeout, TimeoutError (no whole answer within `timeout`), TooLarge, or
        OSError/httptools.HttpParserError (connection failed, answer malformed or cut short)."""
        target = url[len(self.origin) :].encode("latin-1")
        request = b"GET " + target + b" HTTP/1.1\r\n" + self.host_line + headers + b"\r\n"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        for attempt in (0, 1):
            # The retry on a new connection, as said: another idle one may have been closed at the same moment
            # (a gateway draining closes its idle connections all at once).
            connection = self.idle.popitem()[0] if self.idle and attempt == 0 else None
            reused = connection is not None
            if connection is None:
                connection = await self._connect()
            timer = loop.call_at(deadline, connection._fail, TimeoutError("no answer in time"))
            try:
                answer = await connection.call(request)
            except (ConnectionError, OSError) as exc:
                connection.transport.close()
                if reused and attempt == 0 and not connection.answered and not isinstance(exc, TimeoutError):
                    continue  # closed by the provider while idle: once more, on a new connection
                raise
            except BaseException:
                connection.transport.close()
                raise
            finally:
                timer.cancel()
            if connection.closed or not connection.keep_alive:
                connection.transport.close()
            else:
                self.idle[connection] = None
            return answer
        raise AssertionError("unreachable")

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, connection = await loop.create_connection(
                    lambda: _Connection(self),
                    self.host,
                    self.port,
                    ssl=self.tls,
                    server_hostname=self.host if self.tls else None,
                )
        except TimeoutError:
            raise ConnectTimeout("no connection within the connect timeout") from None
        return connection

    def close(self) -> None:
        while self.idle:
            self.idle.popitem()[0].transport.close()
