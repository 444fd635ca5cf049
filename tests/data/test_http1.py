"""The connections to the provider (social/http1.py) against a raw provider that behaves as real servers
may: chunked answers, `Connection: close`, a keep-alive connection closed just as it is reused, a body
past the cap, silence. The data plane's own fault tests (test_upstream_faults.py) cover the rest."""

import asyncio
import gc

import pytest

from social.http1 import ConnectTimeout, Http1Pool, TooLarge

pytestmark = pytest.mark.gen_test(timeout=30)
CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
CLOSING = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
LARGE = b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + b"x" * 5000
LATE = b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nContent-Length: 0\r\n\r\n"


class Provider:
    """A provider on a raw socket: `answer(n)` is what the n-th request of a connection gets (None: the
    connection is closed without an answer, b"": no answer at all)."""

    def __init__(self, answer):
        self.answer, self.connections, self.requests = answer, 0, 0

    async def start(self) -> str:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def serve(self, reader, writer) -> None:
        self.connections += 1
        n = 0
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                n += 1
                self.requests += 1
                reply = self.answer(n)
                if reply is None:
                    break
                writer.write(reply)
                await writer.drain()
                if b"Connection: close" in reply:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    async def stop(self, pool: Http1Pool) -> None:
        """Closes the pool's connections and the server, and lets each connection's task end."""
        pool.close()
        self.server.close()
        await asyncio.sleep(0.05)


async def started(answer) -> tuple[Provider, str, Http1Pool]:
    """A provider answering `answer(n)`, its address, and a pool to it (1 s connect, 1,000-byte cap)."""
    provider = Provider(answer)
    base = await provider.start()
    return provider, base, Http1Pool(base, 1.0, 1000)


async def get(pool: Http1Pool, base: str, timeout: float = 5.0):
    return await pool.get(base + "/x?q=1", b"X-API-Key: k\r\n", timeout)


async def test_chunked_answers_are_read_whole_and_the_connection_is_kept():
    provider, base, pool = await started(lambda n: CHUNKED)
    answers = [await get(pool, base) for _ in range(3)]
    assert [(a.status, a.body) for a in answers] == [(200, b"hello world")] * 3
    assert provider.connections == 1 and provider.requests == 3
    await provider.stop(pool)


async def test_an_idle_connection_keeps_nothing_of_its_last_answer():
    # Every connection ever in flight at once stays in the pool: one that kept its last answer would hold a
    # page per connection (38 KB each, 800 connections at 800 calls in flight), long after the calls ended.
    provider, base, pool = await started(lambda n: b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
    answer = await get(pool, base)
    assert answer.body == b"hello" and len(pool.idle) == 1
    assert [r for r in gc.get_referrers(answer.body) if r is not answer] == []
    await provider.stop(pool)


async def test_connection_close_is_honoured():
    provider, base, pool = await started(lambda n: CLOSING)
    assert [(await get(pool, base)).body for _ in range(3)] == [b"ok"] * 3
    assert provider.connections == 3 and pool.idle == {}
    await provider.stop(pool)


async def test_a_connection_the_provider_dropped_while_idle_is_retried_once_on_a_new_one():
    # Every connection's second request is met by a close: as when the provider's keep-alive timeout ends
    # just as the connection is reused. The call is sent again on a new connection, and answered.
    provider, base, pool = await started(lambda n: CHUNKED if n == 1 else None)
    first, second = await get(pool, base), await get(pool, base)
    assert first.body == second.body == b"hello world"
    assert provider.connections == 2 and provider.requests == 3
    await provider.stop(pool)


async def test_a_new_connection_dropped_without_an_answer_fails_and_is_not_retried():
    provider, base, pool = await started(lambda n: None)
    with pytest.raises(ConnectionError):
        await get(pool, base)
    assert provider.requests == 1  # a new connection that fails is the provider's answer: no second try
    await provider.stop(pool)


async def test_a_body_past_the_cap_is_refused_before_it_is_read_and_the_retry_after_is_kept():
    provider, base, pool = await started(lambda n: LARGE if provider.requests == 1 else LATE)
    with pytest.raises(TooLarge):
        await get(pool, base)
    assert pool.idle == {}  # the connection is dropped, not drained
    answer = await get(pool, base)
    assert (answer.status, answer.retry_after, answer.body) == (429, "7", b"")
    await provider.stop(pool)


async def test_silence_is_a_timeout_and_an_unreachable_provider_a_connection_error():
    provider, base, pool = await started(lambda n: b"")
    with pytest.raises(TimeoutError) as timed_out:
        await get(pool, base, timeout=0.3)
    assert not isinstance(timed_out.value, ConnectTimeout)  # the answer was late, not the connection
    await provider.stop(pool)
    with pytest.raises(OSError):
        await get(Http1Pool(base, 1.0, 1000), base)
