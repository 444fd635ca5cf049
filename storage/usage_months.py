"""Usage by account and calendar month (UTC), kept as it is written: what a monthly statement reads
(billing/statements.py) instead of the month's usage records or their per-batch totals (reading a million of
those takes minutes on the embedded server).

Two kinds of documents, both with calls, credits and per endpoint calls (n), credits (c), calls from the cache (h)
and the credits they saved (s):

    delta    {_id: "<batch id>:<account>:<yyyy-mm>:<lease>", kind: "d", account_id, month, writer, lease, seq,
              calls, credits, e: {<endpoint>: {n, c, h, s}}}
    summary  {_id: "<account>:<yyyy-mm>:<writer>:<lease>", kind: "s", account_id, month, writer, lease, through,
              calls, credits, e: {...}}

A flush batch (storage/usage.py insert_batch) inserts one delta per account, month and lease it holds, right after
its buckets and totals. Its id derives from the batch id, so a retried batch, or the records a stopped process kept
on disk written again at the next start, skip what landed before: every batch counts exactly once. Inserts only:
on the embedded server an update costs twenty times an insert, and a flush is on every call's path.

Deltas are then folded, a few dozen at a time, into the summary of their account, month, writing process (`writer`,
the batch id's prefix) and lease: `through` is the last batch (`seq`) of that process it counts. Reading them, a
delta counts unless its summary's `through` already covers it. A fold sums the deltas of a summary above its
`through`, and moves `through` by one conditional update (only from the value it read: of two folds, one lands), then
deletes the deltas it covered; a fold that dies in between leaves deltas the summary already counts, which readers
skip and the next fold deletes. A process writes its batches one at a time and in order, so every delta below the
highest one a fold sees was inserted before it; the fold reads its deltas twice, and sums the second read up to the
highest seq of the first, which therefore holds every delta it covers.

`lease` is kept apart because a process that registered again flushes the records of its old and new lease in one
batch, and a balance counts usage per lease (storage/ledger.py). Like the per-batch totals, a batch's writes are not
one: a process killed in the moment between them leaves that batch out of these figures while its buckets, the
charge, are stored; `social-gateway reconcile` compares these figures with the buckets (accounting/reconcile.py).
Nothing here expires, as usage records do not: the books need every charge since an account began.
"""

import zlib
from collections.abc import Iterable
from datetime import datetime

from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError, DuplicateKeyError

from storage.db import only_duplicates

FOLD_AT = 32  # an account's unfolded deltas that its next read folds
FOLD_EVERY = 256  # an account is folded on about one in this many batches of a process that hold it
_KEY = {"account_id": 1, "month": 1, "writer": 1, "lease": 1}


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


def summary_id(account_id: str, month: str, writer: str, lease: str) -> str:
    return f"{account_id}:{month}:{writer}:{lease}"


def _add(into: dict, figures: dict) -> None:
    """Adds one document's calls, credits and endpoints to another's."""
    into["calls"] = into.get("calls", 0) + figures.get("calls", 0)
    into["credits"] = into.get("credits", 0) + figures.get("credits", 0)
    endpoints = into.setdefault("e", {})
    for name, sums in (figures.get("e") or {}).items():
        mine = endpoints.setdefault(name, {})
        for k, v in sums.items():
            mine[k] = mine.get(k, 0) + v


def deltas(batch_id: str, records: Iterable[dict]) -> list[dict]:
    """A batch's deltas: one per account, month and lease."""
    writer, seq = writer_and_seq(batch_id)
    docs: dict[tuple, dict] = {}
    for r in records:
        account_id, month, lease = r["account_id"], month_of(r["ts"]), r["lease"]
        doc = docs.get((account_id, month, lease))
        if doc is None:
            doc = docs[(account_id, month, lease)] = {
                "_id": f"{batch_id}:{account_id}:{month}:{lease}",
                "kind": "d",
                "account_id": account_id,
                "month": month,
                "writer": writer,
                "lease": lease,
                "seq": seq,
                "calls": 0,
                "credits": 0,
                "e": {},
            }
        cached = from_cache(r)
        _add(doc, {"calls": 1, "credits": r["credits"], "e": {endpoint_field(r["endpoint"]): _endpoint(r, cached)}})
    return list(docs.values())


def _endpoint(r: dict, cached: bool) -> dict:
    sums = {"n": 1, "c": r["credits"]}
    if cached:
        sums |= {"h": 1, "s": r.get("saved", 0)}
    return sums


def merged(docs: Iterable[dict]) -> dict[tuple, dict]:
    """(account, month, writer, lease) -> the figures the documents hold together, each batch once: the summary and
    the deltas above its `through`; `through` is then the highest batch counted."""
    out: dict[tuple, dict] = {}
    pending: list[dict] = []
    for doc in docs:
        if doc.get("kind") == "d":
            pending.append(doc)
            continue
        key = (doc["account_id"], doc["month"], doc["writer"], doc["lease"])
        out[key] = {
            "calls": doc["calls"],
            "credits": doc["credits"],
            "e": _copy(doc.get("e")),
            "through": doc["through"],
        }
    covered = {key: figures["through"] for key, figures in out.items()}
    for doc in pending:
        key = (doc["account_id"], doc["month"], doc["writer"], doc["lease"])
        if doc["seq"] <= covered.get(key, -1):
            continue
        figures = out.setdefault(key, {"calls": 0, "credits": 0, "e": {}, "through": -1})
        _add(figures, doc)
        figures["through"] = max(figures["through"], doc["seq"])
    return out


def _copy(endpoints: dict | None) -> dict:
    return {name: dict(sums) for name, sums in (endpoints or {}).items()}


def from_buckets(buckets: Iterable[tuple[str, list[dict]]]) -> list[dict]:
    """The summaries that count stored batches, given as (batch id, records): what a database whose usage was
    written before these figures existed is brought forward with (storage/schema.py). Each summary's `through` is
    the highest batch of its writer it counts, so a batch written again later (the records a stopped process kept on
    disk) counts once more only where it did not land before."""
    docs: dict[str, dict] = {}
    for batch_id, records in buckets:
        for delta in deltas(batch_id, records):
            key = summary_id(delta["account_id"], delta["month"], delta["writer"], delta["lease"])
            doc = docs.setdefault(
                key,
                {
                    **{k: delta[k] for k in ("account_id", "month", "writer", "lease")},
                    "_id": key,
                    "kind": "s",
                    "through": delta["seq"],
                    "calls": 0,
                    "credits": 0,
                    "e": {},
                },
            )
            doc["through"] = max(doc["through"], delta["seq"])
            _add(doc, delta)
    return list(docs.values())


class UsageMonths:
    def __init__(self, db: AsyncDatabase):
        self.months = db.usage_months

    async def add_batch(self, batch_id: str, records: list[dict]) -> None:
        """The batch's deltas (what an earlier try inserted is skipped); then the deltas of about one in FOLD_EVERY
        of its accounts are folded, each account in turn as the batches go (so that an account whose statement
        nobody reads keeps few deltas, and no batch pays for the folds of all its accounts)."""
        docs = deltas(batch_id, records)
        try:
            await self.months.insert_many(docs, ordered=False)
        except BulkWriteError as exc:
            if not only_duplicates(exc):
                raise
        seq = writer_and_seq(batch_id)[1]
        for account_id in sorted({doc["account_id"] for doc in docs}):
            if (seq + zlib.crc32(account_id.encode())) % FOLD_EVERY == 0:
                await self.fold(account_id)

    async def of_account(self, account_id: str) -> list[dict]:
        """Every document of the account: its deltas, then its summaries. In that order: a fold that runs meanwhile
        moves a summary before it deletes the deltas it covers, so every batch is in what is read, once the
        deltas a summary covers are skipped (`merged`). Folded after the read when it has FOLD_AT deltas or more."""
        found = [doc async for doc in self.months.find({"account_id": account_id, "kind": "d"})]
        found += [doc async for doc in self.months.find({"account_id": account_id, "kind": "s"})]
        if sum(doc["kind"] == "d" for doc in found) >= FOLD_AT:
            await self.fold(account_id)
        return found

    async def fold(self, account_id: str) -> int:
        """Folds the account's deltas into their summaries (see the module's docstring); how many it folded."""
        first = [doc async for doc in self.months.find({"account_id": account_id, "kind": "d"}, {"seq": 1, **_KEY})]
        highest: dict[tuple, int] = {}
        for doc in first:
            key = tuple(doc[k] for k in _KEY)
            highest[key] = max(highest.get(key, -1), doc["seq"])
        folded = 0
        for (_, month, writer, lease), top in highest.items():
            folded += await self._fold_one(account_id, month, writer, lease, top)
        return folded

    async def _fold_one(self, account_id: str, month: str, writer: str, lease: str, top: int) -> int:
        key = summary_id(account_id, month, writer, lease)
        summary = await self.months.find_one({"_id": key}, {"through": 1})
        through = summary["through"] if summary else -1
        where = {"account_id": account_id, "kind": "d", "month": month, "writer": writer, "lease": lease}
        cover = [doc async for doc in self.months.find({**where, "seq": {"$gt": through, "$lte": top}})]
        if cover:
            sums: dict = {}
            for doc in cover:
                _add(sums, doc)
            inc = {"calls": sums["calls"], "credits": sums["credits"]}
            for name, by in sums["e"].items():
                inc |= {f"e.{name}.{k}": v for k, v in by.items()}
            if summary is None:
                fields = {"account_id": account_id, "month": month, "writer": writer, "lease": lease}
                try:
                    await self.months.insert_one({"_id": key, "kind": "s", **fields, "through": top, **sums})
                except DuplicateKeyError:
                    return 0  # another fold made the summary first: its deltas are for the next fold
            else:
                moved = await self.months.update_one(
                    {"_id": key, "through": through}, {"$inc": inc, "$set": {"through": top}}
                )
                if not moved.modified_count:
                    return 0  # another fold moved it first
        result = await self.months.delete_many({**where, "seq": {"$lte": top}})
        return result.deleted_count
