"""Login and sign-up throttling: sliding-window counters per client address, client network and
account email, no I/O.

- per (email, client network): at most `max_failures` failed logins in `window` seconds (default 5
  in 15 minutes), then that network gets 429 for that email. A network is the client address's
  IPv4 /24 or IPv6 /64 (configurable): an attacker elsewhere cannot lock the owner out. Failures
  are counted for every email asked about, existing or not, so the limit reveals nothing about which
  accounts exist. A successful login clears the failures of its email and network.
- per email, from everywhere: past `slowdown_after` failures in the window, each further failed
  login is answered only after a delay that doubles with every failure (1 s, 2 s, ... up to
  `max_delay`): a distributed guesser is slowed down, while the owner's right password is answered
  at once. A delay, never a lock.
- per client address: at most `max_attempts` attempts (login or registration, successful or not)
  in `address_window` seconds (default 20 a minute): one address cannot spray many emails.

Each counter keeps only its last `limit` timestamps, and each table is an LRU of bounded size,
so a flood of distinct emails or addresses costs bounded memory (the oldest, coldest entries go
first). Refused attempts are not counted: `retry_after` is exactly when the next one is allowed.
"""

from __future__ import annotations

import ipaddress
import math
from collections import OrderedDict, deque

ADDRESS_WINDOW_SECONDS = 60.0
MAX_ENTRIES = 50_000


def network_of(address: str, v4_prefix: int = 24, v6_prefix: int = 64) -> str:
    """The client network an address belongs to (IPv4 /24, IPv6 /64 by default); a non-address as is."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    prefix = v4_prefix if ip.version == 4 else v6_prefix
    return str(ipaddress.ip_network(f"{ip}/{prefix}", strict=False))


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

    def count(self, key: str, now: float) -> int:
        """Events of `key` within the window (at most `limit`)."""
        events = self._events.get(key)
        return 0 if events is None else sum(1 for t in events if t > now - self.window)

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
        slowdown_after: int = 10,
        max_delay: float = 30.0,
        v4_prefix: int = 24,
        v6_prefix: int = 64,
    ):
        if max_failures < 1 or max_attempts < 1 or window <= 0 or address_window <= 0 or slowdown_after < 1:
            raise ValueError("login throttle limits and windows must be positive")
        self.failures = SlidingWindows(max_failures, window, max_entries)  # per (email, network)
        self.attempts = SlidingWindows(max_attempts, address_window, max_entries)  # per address
        # Enough timestamps to count up to the longest delay.
        self.email_failures = SlidingWindows(slowdown_after + 64, window, max_entries)
        self.slowdown_after, self.max_delay = slowdown_after, max_delay
        self.prefixes = (v4_prefix, v6_prefix)

    def _pair(self, email: str, address: str) -> str:
        return f"{email} {network_of(address, *self.prefixes)}"

    def check(self, address: str, email: str | None, now: float) -> int:
        """Whole seconds the caller must wait (the Retry-After value); 0 when the attempt may go ahead.

        An allowed attempt is counted against the address and, when `email` is given, as a failure
        of that email until `succeeded(email, address)` says otherwise: concurrent guesses cannot all
        slip in before the first of them is known to have failed."""
        wait = self.attempts.retry_after(address, now)
        if email is not None:
            wait = max(wait, self.failures.retry_after(self._pair(email, address), now))
        if wait > 0:
            return max(1, math.ceil(wait))
        self.attempts.add(address, now)
        if email is not None:
            self.failures.add(self._pair(email, address), now)
            self.email_failures.add(email, now)
        return 0

    def delay(self, email: str, now: float) -> float:
        """Seconds to hold back the answer to a failed login of `email` (0 below the slowdown)."""
        excess = self.email_failures.count(email, now) - self.slowdown_after
        return 0.0 if excess <= 0 else min(self.max_delay, 2.0 ** (excess - 1))

    def succeeded(self, email: str, address: str) -> None:
        """The password was right: the failures of this email from this network are forgotten."""
        self.failures.clear(self._pair(email, address))


class SignupThrottle:
    """Per client network: at most `max_per_window` registrations per `window` seconds. (How many of
    them get signup credits is capped in the database: AccountStore.claim_signup_credits.)"""

    def __init__(
        self,
        max_per_window: int,
        window: float,
        v4_prefix: int = 24,
        v6_prefix: int = 64,
        max_entries: int = MAX_ENTRIES,
    ):
        if max_per_window < 1 or window <= 0:
            raise ValueError("signup throttle limit and window must be positive")
        self.registrations = SlidingWindows(max_per_window, window, max_entries)
        self.prefixes = (v4_prefix, v6_prefix)

    def network(self, address: str) -> str:
        return network_of(address, *self.prefixes)

    def check(self, address: str, now: float) -> int:
        """Retry-After seconds for a registration from `address`; 0 (and counted) when allowed."""
        network = self.network(address)
        wait = self.registrations.retry_after(network, now)
        if wait > 0:
            return max(1, math.ceil(wait))
        self.registrations.add(network, now)
        return 0


class CheckoutThrottle:
    """Per account: at most `per_minute` checkouts a minute, and one at a time (a checkout waits on the
    payment processor; concurrent ones could all pass the open-orders count before any is stored)."""

    def __init__(self, per_minute: int, max_entries: int = MAX_ENTRIES):
        self.recent = SlidingWindows(per_minute, 60.0, max_entries)
        self.running: set[str] = set()

    def begin(self, account_id: str, now: float) -> int:
        """Retry-After seconds; 0 when the checkout may go ahead (then `end` must follow)."""
        if account_id in self.running:
            return 1
        wait = self.recent.retry_after(account_id, now)
        if wait > 0:
            return max(1, math.ceil(wait))
        self.recent.add(account_id, now)
        self.running.add(account_id)
        return 0

    def end(self, account_id: str) -> None:
        self.running.discard(account_id)
