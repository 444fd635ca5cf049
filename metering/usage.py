"""The usage buffer: records of calls waiting to be persisted in batches.

Each record carries a unique id (its `_id`), so a batch that is retried after a
failed or uncertain flush is idempotent in the database. A record is the charge
itself (its `credits`), so a charge can never be persisted without its record.
"""
from collections import deque


class UsageBuffer:
    def __init__(self, max_records: int):
        self.max_records = max_records
        self._pending: deque[dict] = deque()
        self._in_flight: list[dict] = []

    def __len__(self) -> int:
        return len(self._pending) + len(self._in_flight)

    @property
    def full(self) -> bool:
        return len(self) >= self.max_records

    def add(self, record: dict) -> None:
        self._pending.append(record)

    def take(self, limit: int) -> list[dict]:
        """Moves up to `limit` records in flight; one batch at a time."""
        assert not self._in_flight, "a flush is already in flight"
        count = min(limit, len(self._pending))
        self._in_flight = [self._pending.popleft() for _ in range(count)]
        return self._in_flight

    def done(self) -> None:
        self._in_flight = []

    def failed(self) -> None:
        """Puts the batch back in front, in order, to be retried as is."""
        self._pending.extendleft(reversed(self._in_flight))
        self._in_flight = []

    def for_account(self, account_id: str) -> list[dict]:
        return [r for r in (*self._in_flight, *self._pending) if r["account_id"] == account_id]

    def for_lease(self, lease_id: str) -> int:
        return sum(1 for r in (*self._in_flight, *self._pending) if r.get("lease") == lease_id)
