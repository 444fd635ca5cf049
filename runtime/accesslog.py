"""The access log: one JSON line per request on the `gateway.access` logger, kept off the request path.

Going through `logging` for every request (a LogRecord, the caller's frame, time formatting, a write and a
flush per line) cost about 0.1 ms of CPU per call. When the gateway owns its log stream (`serve`), a
request only appends its JSON to a list; `flush()` (every FLUSH_SECONDS from app/tasks.py,
and on shutdown) formats the lines exactly as the log format (config/logs.py: text, or one JSON object
per line) would and writes them with one write. Without a stream of its own (tests, embedding), every
line goes through `logging` at once.
"""

import logging
import time
from typing import TextIO

import orjson

from config.logs import ISO_SECONDS

LOGGER = "gateway.access"
FLUSH_SECONDS = 0.5  # at most this old when written; the lines also go out on shutdown
MAX_WAITING = 20_000  # a burst past this many lines is written at once rather than held

log = logging.getLogger(LOGGER)


class AccessLog:
    def __init__(self, stream: TextIO | None = None, as_json: bool = False):
        self.stream, self.as_json = stream, as_json
        self.waiting: list[tuple[float, bytes]] = []
        self._second = -1
        self._stamp = ""

    @property
    def enabled(self) -> bool:
        return log.isEnabledFor(logging.INFO)

    def write(self, fields: dict) -> None:
        if self.as_json:
            fields = {"message": f"{fields['method']} {fields['route']} {fields['status']}", **fields}
        line = orjson.dumps(fields)
        if self.stream is None:
            log.info("%s", line.decode())
            return
        self.waiting.append((time.time(), line))
        if len(self.waiting) >= MAX_WAITING:
            self.flush()

    def flush(self) -> None:
        """Writes the waiting lines in one write, each as `logging` with LOG_FORMAT would have."""
        if not self.waiting:
            return
        waiting, self.waiting = self.waiting, []
        if self.as_json:  # the line's own fields after time, level, logger and message
            text = "".join(
                f'{{"time":"{self._stamped(t)}","level":"INFO","logger":"{LOGGER}",{line[1:].decode()}\n'
                for t, line in waiting
            )
        else:
            text = "".join(f"{self._stamped(t)} INFO {LOGGER}: {line.decode()}\n" for t, line in waiting)
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed or full stream must not take the service down
            pass

    def _stamped(self, t: float) -> str:
        """The time as the log format writes it, the date part formatted once per second."""
        second = int(t)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime(ISO_SECONDS, time.gmtime(second)) if self.as_json else asctime(second)
        return (
            f"{self._stamp}.{int((t - second) * 1000):03d}Z"
            if self.as_json
            else f"{self._stamp},{int((t - second) * 1000):03d}"
        )


def asctime(second: int) -> str:
    """logging.Formatter.formatTime's default shape, to the second."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
