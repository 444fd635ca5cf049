"""Usage records: one per data call, stored in buckets.

A flush batch is written as one document per (account, day) — the MongoDB
bucket pattern — so the database does one insert and one set of index updates
per account per batch instead of per call (about 25x less database CPU on the
embedded server). A bucket carries its records and their totals:

    {_id: "<process>-<batch>:<account>:<day>", account_id, lease, day, ts, ts_max,
     n, credits, records: [{id, key_id, endpoint, ts, credits, status, request_id, replay_of?, ms?, stream_id?, cache?, saved?,
     via?, tool?, provider?}]}

`ms` is the provider's answer time of a forwarded call (absent when nothing was forwarded, and in
records from before it was kept).

Bucket ids derive from the batch, so a retried batch skips what an earlier try wrote.

Right after its buckets, a batch writes their totals, one small document per bucket (same id) with
one row per key and endpoint, for GET /usage/summary and key budgets (reading the buckets themselves
means decoding every record: seconds for a year of heavy use):

    {_id: <bucket id>, account_id, lease, day, rows: JSON of [[key_id, endpoint, calls, credits, errors], ...],
     cache?: JSON of [[key_id, endpoint, calls served from the cache, credits they saved], ...]}

`cache` is a field of its own (only where some call was served from the answer cache), not more columns in
`rows`: a process of an earlier version, which reads `rows` as five columns, still reads every totals document
(a rolling replacement, the reconcile command). Totals written before it existed count no cached calls.

Both writes are idempotent (ids from the batch), and so is the third, the batch added to its accounts' monthly
usage (storage/usage_months.py, what statements read). A process killed between the two writes of a batch
leaves that batch (at most FLUSH_BATCH records) out of summaries; its records, charges and export
rows are unaffected. Buckets of processes that never wrote totals (from before they existed) are
summed by `backfill`.
"""

from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta

import orjson
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError

from storage.db import only_duplicates
from storage.usage_months import UsageMonths, from_cache

_RECORD_FIELDS = ("key_id", "endpoint", "ts", "credits", "status", "request_id")


def bucket_id(batch_id: str, account_id: str, day: str, lease: str) -> str:
    """A batch's bucket of one account, day and lease. The lease is named only when it is not the one
    the batch id starts with: a process that registered again (accounting/meter.py heartbeat) flushes
    records of its old and its new lease id in one batch, and each needs a bucket of its own."""
    own = batch_id.rsplit("-", 1)[0] == lease
    return f"{batch_id}:{account_id}:{day}" if own else f"{batch_id}:{account_id}:{day}:{lease}"


def buckets_of(batch_id: str, records: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for record in records:
        groups.setdefault((record["account_id"], record["lease"], record["ts"].date().isoformat()), []).append(record)
    return [
        {
            "_id": bucket_id(batch_id, account_id, day, lease),
            "account_id": account_id,
            "lease": lease,
            "day": day,
            "ts": group[0]["ts"],
            "ts_max": group[-1]["ts"],
            "n": len(group),
            "credits": sum(r["credits"] for r in group),
            "records": [_stored(r) for r in group],
        }
        for (account_id, lease, day), group in groups.items()
    ]


def log_order(record: dict) -> tuple[datetime, str]:
    """The request log's order key: (time to the millisecond, as MongoDB keeps it, id). A buffered record sorts
    the same before and after its flush, so a page cursor never shows a record twice or skips one."""
    ts = record["ts"]
    return ts.replace(microsecond=ts.microsecond // 1000 * 1000), record["_id"]


def _stored(r: dict) -> dict:
    # Spelled out rather than built from _RECORD_FIELDS: this runs for every call's record.
    stored = {
        "id": r["_id"],
        "key_id": r["key_id"],
        "endpoint": r["endpoint"],
        "ts": r["ts"],
        "credits": r["credits"],
        "status": r["status"],
        "request_id": r["request_id"],
    }
    if "replay_of" in r:  # only replays carry it (Idempotency-Key)
        stored["replay_of"] = r["replay_of"]
    if "ms" in r:  # only forwarded calls carry it
        stored["ms"] = r["ms"]
    if "stream_id" in r:  # only the polls of filter rules and monitors carry it (streams/)
        stored["stream_id"] = r["stream_id"]
    if "cache" in r:  # data calls: how the answer cache answered (accounting/charged.py)
        stored["cache"] = r["cache"]
    if "saved" in r:  # a cached answer: the credits it was not charged
        stored["saved"] = r["saved"]
    if "via" in r:  # a data call that came over MCP (handlers/mcp/): how, and its tool
        stored["via"], stored["tool"] = r["via"], r["tool"]
    if "provider" in r:  # the provider that produced the answer (social/providers/router.py)
        stored["provider"] = r["provider"]
    return stored


def is_error(status: int) -> bool:
    return not 200 <= status < 300


def totals_doc(bucket: dict) -> dict:
    """The totals document of a bucket: one row [key_id, endpoint, calls, credits, errors] per key and endpoint,
    and [key_id, endpoint, calls from the cache, credits saved] where the cache answered any."""
    rows = totals_of(bucket["records"])
    doc = {
        "_id": bucket["_id"],
        "account_id": bucket["account_id"],
        "lease": bucket["lease"],
        "day": bucket["day"],
        # One binary field, not nested arrays: the server decodes one value per document (read as a
        # year of documents, nested arrays cost seconds on the embedded server); orjson reads it back.
        "rows": orjson.dumps([[t["key_id"], t["endpoint"], t["n"], t["credits"], t["errors"]] for t in rows]),
    }
    cached = [[t["key_id"], t["endpoint"], t["cached"], t["saved"]] for t in rows if t["cached"]]
    if cached:
        doc["cache"] = orjson.dumps(cached)
    return doc


def totals_of(records) -> list[dict]:
    """Calls, credits, errors, calls from the cache and the credits they saved per (key, endpoint) of some
    records."""
    sums: dict[tuple, list[int]] = {}
    for r in records:
        row = sums.setdefault((r["key_id"], r["endpoint"]), [0, 0, 0, 0, 0])
        row[0] += 1
        row[1] += r["credits"]
        row[2] += is_error(r["status"])
        if from_cache(r):
            row[3] += 1
            row[4] += r.get("saved", 0)
    return [
        {"key_id": k, "endpoint": e, "n": n, "credits": c, "errors": x, "cached": h, "saved": v}
        for (k, e), (n, c, x, h, v) in sums.items()
    ]


def flatten(bucket: dict) -> list[dict]:
    """A bucket's records in the shape the rest of the service uses (`_id`, `account_id`, `lease`)."""
    return [
        {
            "_id": r["id"],
            "account_id": bucket["account_id"],
            "lease": bucket["lease"],
            **{f: r[f] for f in _RECORD_FIELDS},
            **({"replay_of": r["replay_of"]} if "replay_of" in r else {}),
            **({"ms": r["ms"]} if "ms" in r else {}),
            **({"stream_id": r["stream_id"]} if "stream_id" in r else {}),
            **({"cache": r["cache"]} if "cache" in r else {}),
            **({"saved": r["saved"]} if "saved" in r else {}),
            **({"via": r["via"], "tool": r["tool"]} if "via" in r else {}),
            **({"provider": r["provider"]} if "provider" in r else {}),
        }
        for r in bucket["records"]
    ]


class UsageStore:
    def __init__(self, db: AsyncDatabase):
        self.buckets = db.usage_buckets
        self.totals = db.usage_totals
        self.months = UsageMonths(db)

    async def insert_batch(self, batch_id: str, records: list[dict]) -> int:
        """Writes a batch's buckets, then their totals, then adds it to the months' usage (storage/usage_months.py);
        what an earlier try of the same batch wrote is skipped."""
        if not records:
            return 0
        buckets = buckets_of(batch_id, records)
        inserted = await self._insert(self.buckets, buckets)
        await self._insert(self.totals, [totals_doc(b) for b in buckets])
        await self.months.add_batch(batch_id, records)
        return inserted

    @staticmethod
    async def _insert(collection, docs: list[dict]) -> int:
        try:
            result = await collection.insert_many(docs, ordered=False)
            return len(result.inserted_ids)
        except BulkWriteError as exc:
            if not only_duplicates(exc):
                raise
            return exc.details["nInserted"]

    async def summary(
        self, account_id: str, since_day: str, group_by: tuple[str, ...], skip: set[str] = frozenset()
    ) -> dict[tuple, list[int]]:
        """(day?, endpoint?, key_id?) -> [calls, credits, errors, calls from the cache, credits saved] over the
        totals of days from `since_day` (an ISO date, "" for all), except the buckets `skip` (batches this
        process still holds)."""
        out: dict[tuple, list[int]] = {}
        pick = [("day", "endpoint", "key_id").index(name) for name in group_by]
        query = {"account_id": account_id, "day": {"$gte": since_day}}
        async for doc in self.totals.find(query, {"day": 1, "rows": 1, "cache": 1}):
            if doc["_id"] in skip:
                continue
            day = doc["day"]
            for key_id, endpoint, n, credits, errors in orjson.loads(doc["rows"]):
                values = (day, endpoint, key_id)
                row = out.setdefault(tuple(values[i] for i in pick), [0, 0, 0, 0, 0])
                row[0] += n
                row[1] += credits
                row[2] += errors
            for key_id, endpoint, cached, saved in orjson.loads(doc.get("cache") or b"[]"):
                values = (day, endpoint, key_id)
                row = out[tuple(values[i] for i in pick)]  # its calls are in `rows`
                row[3] += cached
                row[4] += saved
        return out

    async def backfill(self) -> int:
        """Writes the totals of buckets of processes that never wrote any (buckets from before totals existed)."""
        done = set(await self.totals.distinct("lease"))
        count = 0
        for lease in await self.buckets.distinct("lease"):
            if lease not in done:
                async for bucket in self.buckets.find({"lease": lease}):  # one bucket in memory at a time
                    count += await self._insert(self.totals, [totals_doc(bucket)])
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

    async def log(
        self, account_id: str, since: datetime, until: datetime, match: Callable[[dict], bool], limit: int
    ) -> list[dict]:
        """The request log: the newest `limit` records in [since, until] that `match` accepts, newest first
        (ties by id), reading buckets newest first only as far as needed (as `recent` does)."""
        found: list[dict] = []
        query = {"account_id": account_id, "ts_max": {"$gte": since}, "ts": {"$lte": until}}
        async for bucket in self.buckets.find(query).sort("ts_max", -1):
            if len(found) >= limit and bucket["ts_max"] < found[limit - 1]["ts"]:
                break
            found.extend(r for r in flatten(bucket) if since <= r["ts"] <= until and match(r))
            found.sort(key=log_order, reverse=True)
            del found[limit:]
        return found

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

    async def charged(self, since: datetime, until: datetime) -> dict[tuple[str | None, str], list[int]]:
        """(provider, endpoint) -> [calls, credits] of every account's records in [since, until] (the margin view;
        `provider` None for a record that names none: answered by no provider, or from before providers)."""
        pipeline = [
            # A bucket holds one UTC day of records: its first is less than a day before its last (the index's range).
            {"$match": {"ts": {"$gte": since - timedelta(days=1), "$lte": until}, "ts_max": {"$gte": since}}},
            {"$project": {"records.ts": 1, "records.provider": 1, "records.endpoint": 1, "records.credits": 1}},
            {"$unwind": "$records"},
            {"$match": {"records.ts": {"$gte": since, "$lte": until}}},
            {
                "$group": {
                    "_id": {"p": "$records.provider", "e": "$records.endpoint"},
                    "calls": {"$sum": 1},
                    "credits": {"$sum": "$records.credits"},
                }
            },
        ]
        return {
            (doc["_id"].get("p"), doc["_id"]["e"]): [doc["calls"], doc["credits"]]
            async for doc in await self.buckets.aggregate(pipeline)
        }
