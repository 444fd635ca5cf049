"""The usage buffer: records of calls waiting to be persisted in batches.

A batch keeps its sequence number and its records until the database confirms
it, so a retry after a failed or uncertain flush writes exactly the same
documents (same ids) and is idempotent. A record is the charge itself (its
`credits`), so a charge can never be persisted without its record.
"""

from collections import deque


class UsageBuffer:
    def __init__(self, max_records: int):
        self.max_records = max_records
        self._pending: deque[dict] = deque()
        self._in_flight: list[dict] = []
        self._batch_seq = 0

    def __len__(self) -> int:
        return len(self._pending) + len(self._in_flight)

    @property
    def waiting(self) -> int:
        """Records not yet part of a batch being written."""
        return len(self._pending)

    @property
    def full(self) -> bool:
        return len(self) >= self.max_records

    def add(self, record: dict) -> None:
        self._pending.append(record)

    def take(self, limit: int) -> tuple[int, list[dict]]:
        """The batch to write next: the unconfirmed one again, else up to `limit` new records."""
        if not self._in_flight:
            count = min(limit, len(self._pending))
            self._in_flight = [self._pending.popleft() for _ in range(count)]
            self._batch_seq += 1
        return self._batch_seq, self._in_flight

    def done(self) -> None:
        self._in_flight = []

    def with_batches(self, account_id: str, limit: int) -> list[tuple[int, dict]]:
        """The account's records, each with the sequence number of the batch that writes or will write
        it (batches of `limit` records, taken in order)."""
        found = [(self._batch_seq, r) for r in self._in_flight if r["account_id"] == account_id]
        first = self._batch_seq + 1
        found.extend((first + i // limit, r) for i, r in enumerate(self._pending) if r["account_id"] == account_id)
        return found

    def for_account(self, account_id: str) -> list[dict]:
        return [r for r in (*self._in_flight, *self._pending) if r["account_id"] == account_id]
