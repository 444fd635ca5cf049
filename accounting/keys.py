"""What the meter keeps per key and per account: the entry the data plane checks a call against, the
account's view (its plan), both cached by the Meter (accounting/meter.py), and each key's newest use."""

import ipaddress
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from metering.plans import Plan
from security.addresses import parse_address, within
from social.endpoints import scope_of
from storage.keys import KeyStore

log = logging.getLogger("gateway.meter")

ADDRESS_MEMO = 1024  # client addresses remembered per key with allowed_ips
TOUCH_INTERVAL = 5.0  # seconds between checks for keys whose last_used_at is due
# The stored last_used_at is the minute of a key's newest use: a busy key costs the database one write a
# minute, not one every TOUCH_INTERVAL (rewriting 300 busy keys every 5 s was ~85 % of the database's CPU
# under load), and the keys of one minute are written by one statement. GET /keys shows the exact newest
# use this process has seen (LastUsed.at), the stored minute otherwise.
LAST_USED_GRANULARITY = 60.0


@dataclass(frozen=True)
class KeyEntry:
    """A key as the data plane checks it; restrictions are pre-parsed once per load (None: unrestricted)."""

    key_id: int
    account_id: str
    revoked: bool
    expires_at: float | None = None  # epoch seconds
    networks: tuple | None = None  # allowed_ips as ip_network objects
    scope: frozenset[str] | None = None  # the data paths allowed_endpoints permits
    credit_limit: int | None = None
    period: str | None = None  # credit_limit_period: day | month | total
    budget_id: int = 0  # shared by a key and the keys rolled from it
    budget_epoch: int = 0  # changes when the budget starts again or changes period (storage/budgets.py)
    # client address -> allowed, for keys with allowed_ips: a dict lookup per call instead of parsing
    # the address and testing each network (bounded; a new entry per key change starts it afresh).
    verdicts: dict = field(default_factory=dict, compare=False, repr=False)

    def allows(self, address: str) -> bool:
        """Whether a call from `address` may use this key."""
        verdict = self.verdicts.get(address)
        if verdict is None:
            verdict = within(parse_address(address), self.networks)
            if len(self.verdicts) >= ADDRESS_MEMO:
                self.verdicts.clear()
            self.verdicts[address] = verdict
        return verdict


def entry_of(doc: dict) -> KeyEntry:
    expires = doc.get("expires_at")
    ips, endpoints = doc.get("allowed_ips"), doc.get("allowed_endpoints")
    return KeyEntry(
        doc["key_id"],
        doc["account_id"],
        doc["revoked"],
        expires.timestamp() if expires is not None else None,
        tuple(ipaddress.ip_network(n) for n in ips) if ips is not None else None,
        scope_of(endpoints) if endpoints is not None else None,
        doc.get("credit_limit"),
        doc.get("credit_limit_period"),
        doc.get("budget_id", doc["key_id"]),
        doc.get("budget_epoch", 0),
    )


@dataclass(frozen=True)
class AccountView:
    account_id: str
    plan: Plan
    session_version: int = 0  # tokens issued under another version are refused (password change)
    suspended: bool = False  # by an admin: the account's keys answer 403 (handlers/social.py)


class LastUsed:
    """The newest use of each key: as this process saw it (Meter.record), stored as its minute (Meter.flush)."""

    def __init__(self, keys: KeyStore):
        self.keys = keys
        self.seen: dict[int, datetime] = {}  # newest use of each key in the last two minutes
        self._written: dict[int, datetime] = {}  # the minute this process last stored, per key
        self._touched_at = 0.0

    def at(self, key_id: int) -> datetime | None:
        """The newest use of a key this process knows of, written or not."""
        return self.seen.get(key_id) or self._written.get(key_id)

    async def store(self, final: bool) -> None:
        """Stores the minute of each key's newest use, for keys whose stored minute is older."""
        # last_used_at is informative: checked every TOUCH_INTERVAL, a key written once a minute at most.
        if not (final or time.monotonic() - self._touched_at >= TOUCH_INTERVAL):
            return
        self._touched_at = time.monotonic()
        # Uses older than two minutes are in the database (or their write failed and is retried below
        # until it works: a failed write leaves `_written` as it was, so the key stays due).
        horizon = datetime.now(UTC) - timedelta(seconds=2 * LAST_USED_GRANULARITY)
        due = {}
        for key_id, ts in self.seen.items():
            minute = ts.replace(second=0, microsecond=0)
            written = self._written.get(key_id)
            if written is None or minute > written:
                due[key_id] = minute
        if due:
            try:
                await self.keys.touch(due)
            except Exception:
                log.warning("could not update last_used_at of %d keys", len(due))
                return
            self._written.update(due)
        self.seen = {k: ts for k, ts in self.seen.items() if ts >= horizon}
        self._written = {k: m for k, m in self._written.items() if m >= horizon}
