"""Usage records: one per data call, stored in buckets.

A flush batch is written as one document per (account, day) — the MongoDB
bucket pattern — so the database does one insert and one set of index updates
per account per batch instead of per call (about 25x less database CPU on the
embedded server). A bucket carries its records and their totals:

    {_id: "<process>-<batch>:<account>:<day>", account_id, lease, day, ts, ts_max,
     n, credits, records: [{id, key_id, endpoint, ts, credits, status, request_id}]}

Bucket ids derive from the batch, so a retried batch skips what an earlier try wrote.

Right after its buckets, a batch is folded into day rollups, one document per account, day and
process, for GET /usage/summary and key budgets (reading buckets means decoding every record:
seconds for a year of heavy use; the rollups hold one entry per key and endpoint):

    {_id: "<account>:<day>:<process>", account_id, day, seq, rows: {"<key_id>|<endpoint>": {n, credits, errors}}}

`seq` is the last batch folded: a retried batch is folded once. A process killed between the two
writes of a batch leaves that batch (at most FLUSH_BATCH records) out of the rollups; its records,
charges and export rows are unaffected. Buckets of processes that never wrote rollups (written before
rollups existed) are folded by `backfill`.
"""

from collections.abc import AsyncIterator
from datetime import datetime

from pymongo import UpdateOne
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError

from storage.db import only_duplicates

_RECORD_FIELDS = ("key_id", "endpoint", "ts", "credits", "status", "request_id")


def buckets_of(batch_id: str, records: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for record in records:
        groups.setdefault((record["account_id"], record["lease"], record["ts"].date().isoformat()), []).append(record)
    return [
        {
            "_id": f"{batch_id}:{account_id}:{day}",
            "account_id": account_id,
            "lease": lease,
            "day": day,
            "ts": group[0]["ts"],
            "ts_max": group[-1]["ts"],
            "n": len(group),
            "credits": sum(r["credits"] for r in group),
            "records": [{"id": r["_id"], **{f: r[f] for f in _RECORD_FIELDS}} for r in group],
        }
        for (account_id, lease, day), group in groups.items()
    ]


def is_error(status: int) -> bool:
    return not 200 <= status < 300


def totals_of(records) -> list[dict]:
    """Calls, credits and errors per (key, endpoint) of some records."""
    sums: dict[tuple, list[int]] = {}
    for r in records:
        row = sums.setdefault((r["key_id"], r["endpoint"]), [0, 0, 0])
        row[0] += 1
        row[1] += r["credits"]
        row[2] += is_error(r["status"])
    return [{"key_id": k, "endpoint": e, "n": n, "credits": c, "errors": x} for (k, e), (n, c, x) in sums.items()]


def flatten(bucket: dict) -> list[dict]:
    """A bucket's records in the shape the rest of the service uses (`_id`, `account_id`, `lease`)."""
    return [
        {
            "_id": r["id"],
            "account_id": bucket["account_id"],
            "lease": bucket["lease"],
            **{f: r[f] for f in _RECORD_FIELDS},
        }
        for r in bucket["records"]
    ]


class UsageStore:
    def __init__(self, db: AsyncDatabase):
        self.buckets = db.usage_buckets
        self.days = db.usage_days

    async def insert_batch(self, batch_id: str, records: list[dict]) -> int:
        """Writes a batch ("<process>-<seq>"), then folds it into the day rollups; buckets already
        written by an earlier try of the same batch are skipped, and a batch is folded once."""
        if not records:
            return 0
        try:
            result = await self.buckets.insert_many(buckets_of(batch_id, records), ordered=False)
            inserted = len(result.inserted_ids)
        except BulkWriteError as exc:
            if not only_duplicates(exc):
                raise
            inserted = exc.details["nInserted"]
        process, _, seq = batch_id.rpartition("-")
        await self._fold(process, int(seq), records)
        return inserted

    async def _fold(self, process: str, seq: int, records) -> None:
        groups: dict[tuple, list[dict]] = {}
        for record in records:
            groups.setdefault((record["account_id"], record["ts"].date().isoformat()), []).append(record)
        updates = []
        for (account_id, day), group in groups.items():
            inc = {}
            for t in totals_of(group):
                for name in ("n", "credits", "errors"):
                    inc[f"rows.{t['key_id']}|{t['endpoint']}.{name}"] = t[name]
            # Matches only if this batch is newer than the last one folded; else the upsert's insert
            # collides with the existing document: a duplicate, i.e. already folded.
            updates.append(
                UpdateOne(
                    {"_id": f"{account_id}:{day}:{process}", "seq": {"$lt": seq}},
                    {"$inc": inc, "$set": {"seq": seq, "account_id": account_id, "day": day, "process": process}},
                    upsert=True,
                )
            )
        try:
            await self.days.bulk_write(updates, ordered=False)
        except BulkWriteError as exc:
            if not only_duplicates(exc):
                raise

    async def summary(
        self, account_id: str, since_day: str, group_by: tuple[str, ...], process: str
    ) -> tuple[dict[tuple, list[int]], dict[str, int]]:
        """(day?, endpoint?, key_id?) -> [calls, credits, errors] from the rollups of days from `since_day`
        (an ISO date, "" for all); and per day, the last batch of `process` they hold."""
        out: dict[tuple, list[int]] = {}
        folded: dict[str, int] = {}
        query = {"account_id": account_id, "day": {"$gte": since_day}}
        async for doc in self.days.find(query, {"day": 1, "rows": 1, "seq": 1}):
            day = doc["day"]
            if doc["_id"].endswith(":" + process):
                folded[day] = doc["seq"]
            for name, totals in doc["rows"].items():
                key_id, _, endpoint = name.partition("|")
                values = {"day": day, "endpoint": endpoint, "key_id": int(key_id)}
                add(out, tuple(values[g] for g in group_by), totals)
        return out, folded

    async def backfill(self) -> int:
        """Folds the buckets of processes that never wrote rollups (buckets from before they existed)."""
        processes = set(await self.days.distinct("process"))
        count = 0
        for lease in await self.buckets.distinct("lease"):
            if lease in processes:
                continue
            # In batch order, one bucket in memory at a time: a fold is skipped unless newer than the last.
            ids = [doc["_id"] async for doc in self.buckets.find({"lease": lease}, {"_id": 1})]
            for _id in sorted(ids, key=_batch_seq):
                bucket = await self.buckets.find_one({"_id": _id})
                if bucket is not None:
                    await self._fold(lease, _batch_seq(_id), flatten(bucket))
                    count += 1
        return count

    async def recent(self, account_id: str, since: datetime, limit: int) -> list[dict]:
        """The newest `limit` records since `since`, reading buckets newest first only as far as needed."""
        found: list[dict] = []
        cursor = self.buckets.find({"account_id": account_id, "ts_max": {"$gte": since}}).sort("ts_max", -1)
        async for bucket in cursor:
            # Buckets of several processes overlap in time: stop only once no older bucket can place.
            if len(found) >= limit and bucket["ts_max"] < found[limit - 1]["ts"]:
                break
            found.extend(r for r in flatten(bucket) if r["ts"] >= since)
            found.sort(key=lambda r: r["ts"], reverse=True)
        return found[:limit]

    async def stream(self, account_id: str, since: datetime, until: datetime) -> AsyncIterator[dict]:
        """Every stored record of the account in [since, until], bucket by bucket, day by day (the index
        order, so that the server does not sort the period in memory); a few buckets in memory at a time."""
        query = {"account_id": account_id, "day": {"$gte": since.date().isoformat(), "$lte": until.date().isoformat()}}
        async for bucket in self.buckets.find(query, batch_size=16).sort([("account_id", 1), ("day", 1)]):
            for record in bucket["records"]:
                if since <= record["ts"] <= until:
                    yield record

    async def records(self, query: dict) -> list[dict]:
        """Every record of the buckets matching `query` (tests and reconciliation tools)."""
        return [r async for bucket in self.buckets.find(query) for r in flatten(bucket)]

    async def spent_by_lease(self, lease: str, account_id: str) -> int:
        pipeline = [
            {"$match": {"lease": lease, "account_id": account_id}},
            {"$group": {"_id": None, "credits": {"$sum": "$credits"}}},
        ]
        cursor = await self.buckets.aggregate(pipeline)
        return next(iter([doc["credits"] async for doc in cursor]), 0)


def add(out: dict[tuple, list[int]], group: tuple, totals: dict) -> None:
    row = out.setdefault(group, [0, 0, 0])
    row[0] += totals["n"]
    row[1] += totals["credits"]
    row[2] += totals["errors"]


def _batch_seq(bucket_id: str) -> int:
    seq = bucket_id.split(":", 1)[0].rpartition("-")[2]
    return int(seq) if seq.isdigit() else 0
