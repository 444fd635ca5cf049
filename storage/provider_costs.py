"""The operator's cost ledger: every request put to a provider (social/providers Attempt), stored in buckets.

A flush batch is written as one document per (provider, endpoint, hour): the usage records' bucket pattern
(storage/usage.py), one insert and one set of index updates per pair per batch instead of per attempt. A bucket
carries its attempts and their totals:

    {_id: "<process>-<batch>:<provider>:<endpoint>:<hour>", provider, endpoint, ts, ts_max, expires_at,
     n, failures, failovers, cost_usd, seconds,
     rows: [[at, status, error, items, cost_usd, seconds, account, failover], ...]}

`ts` / `ts_max` are the first and last attempt's end, within one UTC hour (a batch held back by a database
outage may span hours: it is cut there, so that a period's edges are found among an hour of buckets); `failures` the attempts that got no usable answer (no answer,
a 5xx, a 429); `failovers` those after which the router asked another provider. Bucket ids derive from the batch,
so a retried batch skips what an earlier try wrote. A bucket goes at `expires_at` (PROVIDER_LEDGER_RETENTION_DAYS
after its write, through storage/expiry.py like the audit log).

A period's totals (`totals`) read the totals of the buckets wholly inside it (summed by the server) and the rows of
the few across its edges, so any period, to the millisecond, sums exactly the attempts that ended in it.
"""

from datetime import UTC, datetime, timedelta

from pymongo import ASCENDING, IndexModel
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError

from storage.db import only_duplicates
from storage.expiry import Expiry

SPAN = timedelta(hours=1)  # a bucket's attempts end within one UTC hour
INDEXES = [
    # A period's buckets by their last attempt's end: inside it, or within SPAN after either edge.
    IndexModel([("ts_max", ASCENDING), ("ts", ASCENDING)]),
    IndexModel([("expires_at", ASCENDING)], expireAfterSeconds=0),
]
AT, STATUS, ERROR, ITEMS, COST, SECONDS, ACCOUNT, FAILOVER = range(8)  # a row's columns


def failed(status: int, error: str) -> bool:
    """An attempt that got no usable answer: none at all (status 0, or an error kind), the provider's failure (5xx)
    or its rate limit (429). A 4xx other than 429 is an answer (the customer's mistake), and so is an empty page."""
    return bool(error) or status == 0 or status >= 500 or status == 429


def moment(at: float) -> datetime:
    """An attempt's wall-clock end as MongoDB keeps it (to the millisecond), so that a period reads it the same
    before and after a round trip."""
    return datetime.fromtimestamp(round(at, 3), UTC)


def totals_of(rows) -> dict:
    """Calls, failures, failovers, cost and seconds of some rows."""
    return {
        "n": len(rows),
        "failures": sum(failed(r[STATUS], r[ERROR]) for r in rows),
        "failovers": sum(bool(r[FAILOVER]) for r in rows),
        "cost_usd": sum(r[COST] for r in rows),
        "seconds": sum(r[SECONDS] for r in rows),
    }


def buckets_of(batch_id: str, records: list[dict], expires_at: datetime) -> list[dict]:
    """A batch's buckets; each record {provider, endpoint, row} (accounting/costs.py)."""
    groups: dict[tuple[str, str, str], list[list]] = {}
    for record in records:
        hour = record["row"][AT].strftime("%Y%m%d%H")
        groups.setdefault((record["provider"], record["endpoint"], hour), []).append(record["row"])
    buckets = []
    for (provider, endpoint, hour), rows in groups.items():
        times = [r[AT] for r in rows]
        buckets.append(
            {
                "_id": f"{batch_id}:{provider}:{endpoint}:{hour}",
                "provider": provider,
                "endpoint": endpoint,
                "ts": min(times),
                "ts_max": max(times),
                "expires_at": expires_at,
                **totals_of(rows),
                "rows": rows,
            }
        )
    return buckets


class ProviderCostStore:
    def __init__(self, db: AsyncDatabase, retention_days: int):
        self.buckets = db.provider_attempts
        self.retention = timedelta(days=retention_days)

    async def ensure_indexes(self, expiry: Expiry) -> None:
        await expiry.create_indexes(self.buckets, INDEXES)

    async def insert_batch(self, batch_id: str, records: list[dict]) -> int:
        """Writes a batch's buckets; what an earlier try of the same batch wrote is skipped."""
        if not records:
            return 0
        docs = buckets_of(batch_id, records, datetime.now(UTC) + self.retention)
        try:
            return len((await self.buckets.insert_many(docs, ordered=False)).inserted_ids)
        except BulkWriteError as exc:
            if not only_duplicates(exc):
                raise
            return exc.details["nInserted"]

    async def totals(self, since: datetime, until: datetime) -> dict[tuple[str, str], dict]:
        """(provider, endpoint) -> {n, failures, failovers, cost_usd, seconds} of the attempts that ended in
        [since, until]."""
        out: dict[tuple[str, str], dict] = {}

        def add(provider: str, endpoint: str, figures: dict) -> None:
            row = out.setdefault(
                (provider, endpoint), dict.fromkeys(("n", "failures", "failovers", "cost_usd", "seconds"), 0)
            )
            for name in row:
                row[name] += figures[name]

        inside = {"ts_max": {"$gte": since, "$lte": until}, "ts": {"$gte": since}}
        group = {"_id": {"p": "$provider", "e": "$endpoint"}}
        group.update({name: {"$sum": f"${name}"} for name in ("n", "failures", "failovers", "cost_usd", "seconds")})
        async for doc in await self.buckets.aggregate([{"$match": inside}, {"$group": group}]):
            add(doc["_id"]["p"], doc["_id"]["e"], doc)
        # The buckets across an edge (each within SPAN of it): their rows one by one. A bucket across both edges
        # (a period shorter than it) is found twice and counted once.
        seen = set()
        for edge in (
            {"ts_max": {"$gte": since, "$lt": since + SPAN}, "ts": {"$lt": since}},
            {"ts_max": {"$gt": until, "$lt": until + SPAN}, "ts": {"$lte": until}},
        ):
            async for bucket in self.buckets.find(edge):
                rows = [r for r in bucket["rows"] if since <= r[AT] <= until]
                if rows and bucket["_id"] not in seen:
                    seen.add(bucket["_id"])
                    add(bucket["provider"], bucket["endpoint"], totals_of(rows))
        return out
