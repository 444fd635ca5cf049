"""Usage by account and calendar month (UTC), kept as it is written: what a monthly statement reads
(billing/statements.py) instead of the month's usage records or their per-batch totals (reading a million of
those takes minutes on the embedded server; these are one document per account, month, writing process and lease).

    {_id: "<account>:<yyyy-mm>:<writer>:<lease>", account_id, month, writer, lease, through,
     calls, credits, e: {<endpoint>: {n: calls, c: credits, h: calls from the cache, s: credits saved}}}

A flush batch (storage/usage.py insert_batch) adds its records here after its buckets and totals. `writer` is the
process whose batches these are (the batch id's prefix) and `through` the sequence number of its last batch
counted: a process writes its batches one at a time, in order, and retries a failed one as it was before the next
(accounting/meter.py flush; the records kept on disk at a stop are written later under their own batch ids in the
same order), so `through < seq` in the update's filter makes every batch count exactly once however often it is
retried: a retry finds nothing to update and its upsert hits the existing `_id` (a duplicate, skipped). `lease` is
kept apart because a process that registered again flushes the records of its old and new lease in one batch, and
a balance counts usage per lease (storage/ledger.py).

Like the per-batch totals, the batch's three writes are not one: a process killed between them (SIGKILL, in the
moment between two writes) leaves that batch out of these figures while its buckets, the charge, are stored.
`social-gateway reconcile` compares these figures with the buckets for every account (accounting/reconcile.py).
Nothing here expires, as usage records do not: the books need every charge since an account began.
"""

from collections.abc import Iterable
from datetime import datetime

from pymongo import UpdateOne
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError

from storage.db import only_duplicates


def from_cache(record: dict) -> bool:
    """The call was answered from the answer cache (a hit, or a stale answer while the provider failed)."""
    return record.get("cache") in ("hit", "stale")


def month_of(ts: datetime) -> str:
    return ts.strftime("%Y-%m")


def endpoint_field(endpoint: str) -> str:
    """An endpoint's name as a field name: MongoDB reads '.' as a path and '$' as an operator."""
    return endpoint.replace("%", "%25").replace(".", "%2E").replace("$", "%24")


def endpoint_name(field: str) -> str:
    return field.replace("%2E", ".").replace("%24", "$").replace("%25", "%")


def writer_and_seq(batch_id: str) -> tuple[str, int]:
    """`<process>-<seq>` (accounting/meter.py); any other id (tools writing a batch by hand) counts as batch 0."""
    writer, _, seq = batch_id.rpartition("-")
    return (writer, int(seq)) if writer and seq.isdigit() else (batch_id, 0)


def sums(records: Iterable[dict]) -> dict[tuple, dict[str, int]]:
    """(account, month, lease) -> the fields to add: calls, credits, and per endpoint calls (n), credits (c), calls
    from the cache (h) and the credits they saved (s)."""
    groups: dict[tuple, dict[str, int]] = {}
    for r in records:
        inc = groups.setdefault((r["account_id"], month_of(r["ts"]), r["lease"]), {})
        e = "e." + endpoint_field(r["endpoint"])
        for name, value in (("calls", 1), ("credits", r["credits"]), (e + ".n", 1), (e + ".c", r["credits"])):
            inc[name] = inc.get(name, 0) + value
        if from_cache(r):
            inc[e + ".h"] = inc.get(e + ".h", 0) + 1
            inc[e + ".s"] = inc.get(e + ".s", 0) + r.get("saved", 0)
    return groups


def doc_id(account_id: str, month: str, writer: str, lease: str) -> str:
    return f"{account_id}:{month}:{writer}:{lease}"


def updates(batch_id: str, records: Iterable[dict]) -> list[UpdateOne]:
    """One conditional upsert per (account, month, lease) of the batch."""
    writer, seq = writer_and_seq(batch_id)
    return [
        UpdateOne(
            {"_id": doc_id(account_id, month, writer, lease), "through": {"$lt": seq}},
            {
                "$inc": inc,
                "$set": {"through": seq},
                "$setOnInsert": {"account_id": account_id, "month": month, "writer": writer, "lease": lease},
            },
            upsert=True,
        )
        for (account_id, month, lease), inc in sums(records).items()
    ]


def from_buckets(buckets: Iterable[tuple[str, list[dict]]]) -> list[dict]:
    """The documents that count stored batches, given as (batch id, records): what a database whose usage was
    written before these figures existed is brought forward with (storage/schema.py). Each document's `through` is
    the highest batch of its writer it counts, so a batch written again later (the records a stopped process kept
    on disk) counts once more only where it did not land before."""
    docs: dict[str, dict] = {}
    for batch_id, records in buckets:
        writer, seq = writer_and_seq(batch_id)
        for (account_id, month, lease), inc in sums(records).items():
            key = doc_id(account_id, month, writer, lease)
            doc = docs.setdefault(
                key,
                {
                    "_id": key,
                    "account_id": account_id,
                    "month": month,
                    "writer": writer,
                    "lease": lease,
                    "through": seq,
                },
            )
            doc["through"] = max(doc["through"], seq)
            for name, value in inc.items():
                where = doc
                *path, last = name.split(".")
                for part in path:
                    where = where.setdefault(part, {})
                where[last] = where.get(last, 0) + value
    return list(docs.values())


class UsageMonths:
    def __init__(self, db: AsyncDatabase):
        self.months = db.usage_months

    async def add_batch(self, batch_id: str, records: list[dict]) -> None:
        ops = updates(batch_id, records)
        if not ops:
            return
        try:
            await self.months.bulk_write(ops, ordered=False)
        except BulkWriteError as exc:
            if not only_duplicates(exc):  # a batch counted before: its upsert met the document's _id
                raise

    async def of_account(self, account_id: str) -> list[dict]:
        """Every document of the account, oldest month first."""
        return [doc async for doc in self.months.find({"account_id": account_id}).sort("month", 1)]
