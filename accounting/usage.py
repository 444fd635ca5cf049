"""An account's usage as the portal reads it: the stored usage (storage/usage.py) merged with the
records this process still buffers (metering/usage.py), each call counted once."""

import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

from config.settings import Settings
from metering.ledger import budget_period
from metering.usage import UsageBuffer
from storage.usage import UsageStore, bucket_id, from_cache, is_error, log_order

WRITTEN_MEMORY = 10.0  # seconds the charges of written batches are remembered (spent_unknown_since)


def percentiles(values: list[float]) -> dict:
    """Nearest-rank p50 and p95 of `values` (ms), and how many there are."""
    ordered = sorted(values)

    def rank(percent: int) -> float:
        return ordered[max(0, -(-percent * len(ordered) // 100) - 1)]

    return {"p50_ms": rank(50), "p95_ms": rank(95), "samples": len(ordered)}


class UsageReads:
    def __init__(self, settings: Settings, usage: UsageStore, buffer: UsageBuffer, batch_prefix: str):
        # Buffered batches are written as "<batch_prefix>-<seq>" (accounting/meter.py flush).
        self.settings, self.usage, self.buffer, self.batch_prefix = settings, usage, buffer, batch_prefix
        # (when written, {(account, key id, day): credits}) of the batches written lately, oldest first.
        self._written: deque[tuple[float, dict]] = deque()

    def written(self, batch: list[dict]) -> None:
        """A batch is stored (its totals too): remembered for a while (spent_unknown_since)."""
        now = time.time()
        charges: dict[tuple, int] = {}
        for r in batch:
            if r["credits"]:
                at = (r["account_id"], r["key_id"], r["ts"].date().isoformat())
                charges[at] = charges.get(at, 0) + r["credits"]
        self._written.append((now, charges))
        while self._written and self._written[0][0] < now - WRITTEN_MEMORY:
            self._written.popleft()

    def spent_unknown_since(self, account_id: str, keys: set[int], since_day: str, moment: float) -> int:
        """What this process charged `keys` from `since_day` that a read of the stored usage at `moment`
        (epoch seconds) may not have seen: still buffered, or written after it."""
        spent = sum(
            r["credits"]
            for r in self.buffer.for_account(account_id)
            if r["key_id"] in keys and r["ts"].date().isoformat() >= since_day
        )
        for when, charges in self._written:
            if when >= moment:
                spent += sum(
                    c for (a, k, day), c in charges.items() if a == account_id and k in keys and day >= since_day
                )
        return spent

    def buffered(self, account_id: str) -> tuple[str, list[tuple[int, dict]]]:
        """This process's batch prefix and the account's records it still holds, each with the sequence number of
        the batch that writes or will write it (monthly statements: storage/usage_months.py `through`)."""
        return self.batch_prefix, self.buffer.with_batches(account_id, self.settings.flush_batch)

    async def summary(self, account_id: str, since_day: str, group_by: tuple[str, ...]) -> dict[tuple, list]:
        """(group values) -> [calls, credits, errors, calls from the cache, credits saved] from `since_day` (an ISO
        date, "" for all): stored totals plus this process's buffered calls, each call counted once."""
        buffered = self.buffer.with_batches(account_id, self.settings.flush_batch)
        # The buckets the buffered records are (or will be) written to: their stored totals are skipped,
        # the records counted instead, whether or not a flush writes them meanwhile.
        prefix = self.batch_prefix
        skip = {bucket_id(f"{prefix}-{seq}", account_id, r["ts"].date().isoformat(), r["lease"]) for seq, r in buffered}
        out = await self.usage.summary(account_id, since_day, group_by, skip)
        for _, r in buffered:
            day = r["ts"].date().isoformat()
            if day >= since_day:
                values = {"day": day, "endpoint": r["endpoint"], "key_id": r["key_id"]}
                row = out.setdefault(tuple(values[name] for name in group_by), [0, 0, 0, 0, 0])
                row[0] += 1
                row[1] += r["credits"]
                row[2] += is_error(r["status"])
                if from_cache(r):
                    row[3] += 1
                    row[4] += r.get("saved", 0)
        return out

    async def credits_used(self, account_id: str, keys: list[dict]) -> dict[int, int]:
        """Per key: what its budget (the key and keys rolled from it) spent in the key's credit_limit_period,
        the current UTC month for keys without a budget."""
        if not keys:
            return {}
        now = datetime.now(UTC)
        since = {k["key_id"]: budget_period(k.get("credit_limit_period") or "month", now)[1] for k in keys}
        by_key: dict[int, list[tuple[str, int]]] = {}
        for (day, key_id), row in (await self.summary(account_id, min(since.values()), ("day", "key_id"))).items():
            by_key.setdefault(key_id, []).append((day, row[1]))
        members: dict[int, list[int]] = {}
        for k in keys:
            members.setdefault(k.get("budget_id", k["key_id"]), []).append(k["key_id"])
        return {
            k["key_id"]: sum(
                credits
                for member in members[k.get("budget_id", k["key_id"])]
                for day, credits in by_key.get(member, ())
                if day >= since[k["key_id"]]
            )
            for k in keys
        }

    async def log(
        self, account_id: str, since: datetime, until: datetime, match: Callable[[dict], bool], limit: int
    ) -> list[dict]:
        """The request log's page: stored and buffered records in [since, until] that `match` accepts, newest
        first (ties by id), each record once even if a flush writes it meanwhile."""
        buffered = [r for r in self.buffer.for_account(account_id) if since <= r["ts"] <= until and match(r)]
        stored = await self.usage.log(account_id, since, until, match, limit)
        seen = {r["_id"] for r in buffered}
        merged = buffered + [r for r in stored if r["_id"] not in seen]
        merged.sort(key=log_order, reverse=True)
        return merged[:limit]

    async def latency(self, account_id: str, since: datetime) -> dict[str, dict]:
        """Per endpoint: p50 and p95 (nearest rank) of the provider's answer time in ms over the forwarded
        calls since `since`, with the number of samples. Reads every record of the period: the summary
        totals hold no times (a quantile does not add up across buckets)."""
        samples: dict[str, list[float]] = {}
        buffered = [r for r in self.buffer.for_account(account_id) if r["ts"] >= since]
        skip = {r["_id"] for r in buffered}
        async for r in self.usage.stream(account_id, since, datetime.now(UTC)):
            if "ms" in r and r["id"] not in skip:
                samples.setdefault(r["endpoint"], []).append(r["ms"])
        for r in buffered:
            if "ms" in r:
                samples.setdefault(r["endpoint"], []).append(r["ms"])
        return {endpoint: percentiles(values) for endpoint, values in samples.items()}

    async def export(self, account_id: str, since: datetime, until: datetime) -> AsyncIterator[dict]:
        """Every record of the account in [since, until]: the stored ones as the store streams them, then what this
        process has not written yet, from memory; each record once, even if a flush writes some of them while the
        stored records stream (they are skipped there). Never the whole period in memory."""
        buffered = self.buffer.for_account(account_id)
        skip = {r["_id"] for r in buffered}
        async for record in self.usage.stream(account_id, since, until):
            if record["id"] not in skip:
                yield record
        for record in buffered:
            if since <= record["ts"] <= until:
                yield record

    async def recent(self, account_id: str, since: datetime, limit: int) -> list[dict]:
        """The account's newest `limit` records since `since`, buffered or stored, newest first."""
        buffered = [r for r in self.buffer.for_account(account_id) if r["ts"] >= since]
        stored = await self.usage.recent(account_id, since, limit)
        seen = {r["_id"] for r in buffered}
        merged = buffered + [r for r in stored if r["_id"] not in seen]
        merged.sort(key=lambda r: r["ts"], reverse=True)
        return merged[:limit]
