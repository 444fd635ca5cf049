"""One webhook attempt: a POST through the SSRF guard, no redirects (a 3xx is a failure), WEBHOOK_TIMEOUT for
the whole attempt, and at most READ_BYTES of the answer kept (past MAX_ANSWER_BYTES the connection is
dropped; the status line already read still counts)."""

from dataclasses import dataclass

from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.simple_httpclient import SimpleAsyncHTTPClient

from webhooks.guard import GuardedResolver, Refused

READ_BYTES = 1024  # of the answer's body, kept in the delivery log
MAX_ANSWER_BYTES = 64 * 1024
USER_AGENT = "social-gateway-webhooks/1"


@dataclass
class Outcome:
    status: int | None  # the HTTP status, None when none came back
    error: str | None  # why it failed, None for a 2xx
    answer: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None


class Sender:
    def __init__(self, timeout: float, guarded: bool, allow_private: bool, concurrency: int):
        self.timeout = timeout
        resolver = GuardedResolver(allow_private=allow_private or not guarded)
        # As many connections as attempts under way: none waits in the client's queue, whose wait would count
        # against its timeout.
        self.client = SimpleAsyncHTTPClient(
            force_instance=True, resolver=resolver, max_clients=concurrency, max_body_size=MAX_ANSWER_BYTES
        )

    async def post(self, url: str, headers: dict[str, str], body: bytes) -> Outcome:
        status: list[int] = []
        kept = bytearray()

        def on_header(line: str) -> None:
            if line.startswith("HTTP/") and not status:
                parts = line.split(" ", 2)
                if len(parts) >= 2 and parts[1].isdigit():
                    status.append(int(parts[1]))

        def on_chunk(chunk: bytes) -> None:
            if len(kept) < READ_BYTES:
                kept.extend(chunk[: READ_BYTES - len(kept)])

        request = HTTPRequest(
            url,
            method="POST",
            body=body,
            headers={**headers, "Content-Type": "application/json", "User-Agent": USER_AGENT},
            follow_redirects=False,
            connect_timeout=self.timeout,
            request_timeout=self.timeout,
            header_callback=on_header,
            streaming_callback=on_chunk,
            decompress_response=False,
        )
        try:
            response = await self.client.fetch(request, raise_error=False)
        except Refused as exc:
            return Outcome(None, f"refused: {exc}")
        except HTTPClientError as exc:
            return self._judge(status, f"{exc.code} {exc.message}", kept)
        except OSError as exc:
            return Outcome(None, f"connection failed: {type(exc).__name__}")
        except Exception as exc:  # a malformed answer, a body past the cap
            return self._judge(status, type(exc).__name__, kept)
        if response.code == 599:
            error = response.error
            if isinstance(error, Refused):
                return Outcome(None, f"refused: {error}")
            return self._judge(status, f"no answer: {type(error).__name__ if error else 'timeout'}", kept)
        return self._judge([response.code], None, kept)

    @staticmethod
    def _judge(status: list[int], error: str | None, kept: bytearray) -> Outcome:
        answer = kept.decode("utf-8", "replace")
        code = status[0] if status else None
        if code is not None and 200 <= code < 300:
            return Outcome(code, None, answer)
        if code is not None:
            return Outcome(code, f"HTTP {code}" if 300 <= code < 400 or error is None else error, answer)
        return Outcome(None, error or "no answer", answer)

    def close(self) -> None:
        self.client.close()
