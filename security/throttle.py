"""Login throttling: sliding-window counters per account email and per client address, no I/O.

Two limits, both much stricter than the data plane's:

- per email: at most `max_failures` failed logins in `window` seconds (default 5 in 15 minutes).
  Failures are counted for every email asked about, existing or not, so the lockout itself
  reveals nothing about which accounts exist. A successful login clears the email's failures.
- per client address: at most `max_attempts` attempts (login or registration, successful or not)
  in `address_window` seconds (default 20 a minute): one address cannot spray many emails.

Each counter keeps only its last `limit` timestamps, and each table is an LRU of bounded size,
so a flood of distinct emails or addresses costs bounded memory (the oldest, coldest entries go
first). Refused attempts are not counted: `retry_after` is exactly when the next one is allowed.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque

ADDRESS_WINDOW_SECONDS = 60.0
MAX_ENTRIES = 50_000


class SlidingWindows:
    """key -> the timestamps of the last `limit` events, in an LRU of at most `max_entries` keys."""

    def __init__(self, limit: int, window: float, max_entries: int):
        self.limit, self.window, self.max_entries = limit, window, max_entries
        self._events: OrderedDict[str, deque[float]] = OrderedDict()

    def retry_after(self, key: str, now: float) -> float:
        """Seconds until one more event is allowed for `key`; 0 when it is allowed now."""
        events = self._events.get(key)
        if events is None or len(events) < self.limit:
            return 0.0
        return max(0.0, events[0] + self.window - now)

    def add(self, key: str, now: float) -> None:
        events = self._events.get(key)
        if events is None:
            events = self._events[key] = deque(maxlen=self.limit)
            while len(self._events) > self.max_entries:
                self._events.popitem(last=False)
        else:
            self._events.move_to_end(key)
        events.append(now)

    def clear(self, key: str) -> None:
        self._events.pop(key, None)

    def __len__(self) -> int:
        return len(self._events)


class LoginThrottle:
    def __init__(
        self,
        max_failures: int,
        window: float,
        max_attempts: int,
        address_window: float = ADDRESS_WINDOW_SECONDS,
        max_entries: int = MAX_ENTRIES,
    ):
        if max_failures < 1 or max_attempts < 1 or window <= 0 or address_window <= 0:
            raise ValueError("login throttle limits and windows must be positive")
        self.failures = SlidingWindows(max_failures, window, max_entries)
        self.attempts = SlidingWindows(max_attempts, address_window, max_entries)

    def check(self, address: str, email: str | None, now: float) -> int:
        """Whole seconds the caller must wait (the Retry-After value); 0 when the attempt may go ahead.

        An allowed attempt is counted against the address and, when `email` is given, as a failure
        of that email until `succeeded(email)` says otherwise: concurrent guesses cannot all slip in
        before the first of them is known to have failed."""
        wait = self.attempts.retry_after(address, now)
        if email is not None:
            wait = max(wait, self.failures.retry_after(email, now))
        if wait > 0:
            return max(1, math.ceil(wait))
        self.attempts.add(address, now)
        if email is not None:
            self.failures.add(email, now)
        return 0

    def succeeded(self, email: str) -> None:
        """The password was right: the email's failures are forgotten."""
        self.failures.clear(email)
