"""API keys: integer ids from a counter, digest for lookup, sealed secret for reveal."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime

from pymongo import ReturnDocument, UpdateMany, UpdateOne
from pymongo.asynchronous.database import AsyncDatabase

from storage.clock import now_utc

TOUCH_CHUNK = 10  # key ids per last_used_at statement (touch)

_ROW = {
    "_id": 0,
    "key_id": 1,
    "created_by": 1,
    "name": 1,
    "prefix": 1,
    "revoked": 1,
    "created_at": 1,
    "last_used_at": 1,
    "account_id": 1,
    "expires_at": 1,
    "allowed_endpoints": 1,
    "allowed_ips": 1,
    "credit_limit": 1,
    "rolled_to": 1,
    "credit_limit_period": 1,
    "budget_id": 1,
}
# Restrictions a key may carry (docs/api.md, "Key properties"); absent means unrestricted.
PROPERTIES = ("expires_at", "allowed_endpoints", "allowed_ips", "credit_limit", "credit_limit_period")
# What the data plane caches per key (accounting/keys.py KeyEntry).
_ENTRY = {
    "key_id": 1,
    "account_id": 1,
    "revoked": 1,
    "digest": 1,
    "budget_id": 1,
    "budget_epoch": 1,
    **{p: 1 for p in PROPERTIES},
}


# A budget's own fields: the same on every key sharing it (update_budget).
BUDGET_FIELDS = ("credit_limit", "credit_limit_period", "budget_epoch")


def _changing(changes: dict, unheard: list[str]) -> dict:
    """The update setting `changes` (None removes a field), stamping props_changed_at, which other
    processes follow (storage/changes.py), and listing those that have yet to apply it (`unheard`: heard)."""
    update: dict = {
        "$set": {
            "props_changed_at": now_utc(),
            "unheard": unheard,
            **{k: v for k, v in changes.items() if v is not None},
        }
    }
    removed = {k: "" for k, v in changes.items() if v is None}
    if removed:
        update["$unset"] = removed
    return update


class KeyStore:
    def __init__(self, db: AsyncDatabase):
        self.keys = db.keys
        self.counters = db.counters
        # {_id: key_id, at: minute}: last_used_at lives apart from the key documents, whose six indexes the
        # embedded server rewrites on every update (300 keys: ~300 ms of its CPU a minute, ~80 ms here).
        # Keys written before it existed keep their own last_used_at; reads take the newer of the two.
        self.last_used = db.key_last_used
        self._serial: dict[tuple, list] = {}  # what -> [lock, holders and waiters] (one_at_a_time)

    @contextlib.asynccontextmanager
    async def one_at_a_time(self, what: tuple):
        """One operation on `what` at a time in this process: ("create", account) counts the key cap
        then inserts, and concurrent creations must not all pass the count before any is inserted;
        ("key changes", account) decides a key change from the key as the one before left it (keys rolled
        from one another share a budget, written on all of them: two changes must not cross)."""
        entry = self._serial.setdefault(what, [asyncio.Lock(), 0])
        entry[1] += 1
        try:
            async with entry[0]:
                yield
        finally:
            entry[1] -= 1
            if not entry[1]:
                del self._serial[what]

    async def _next_id(self) -> int:
        # Concurrent first upserts of the counter can race: the loser sees no document; it asks again.
        for _ in range(5):
            doc = await self.counters.find_one_and_update(
                {"_id": "key_id"}, {"$inc": {"value": 1}}, upsert=True, return_document=ReturnDocument.AFTER
            )
            if doc is not None:
                return doc["value"]
        raise RuntimeError("the key id counter could not be read")

    async def create(
        self, account_id: str, name: str, digest: str, prefix: str, seal, properties: dict | None = None
    ) -> dict:
        """`seal(key_id)` encrypts the secret bound to its id, which is known only here. `properties`:
        restrictions (PROPERTIES) and, for a rolled key, the budget_id it shares with its predecessor."""
        key_id = await self._next_id()
        doc = {
            "_id": key_id,
            "key_id": key_id,
            "account_id": account_id,
            "name": name,
            "prefix": prefix,
            "digest": digest,
            "sealed": seal(key_id),
            "revoked": False,
            "created_at": now_utc(),
            "last_used_at": None,
            **{k: v for k, v in (properties or {}).items() if v is not None},
        }
        await self.keys.insert_one(doc)
        # Its last_used_at document now, so that touch finds it (an upsert costs a commit per key).
        await self.last_used.insert_one({"_id": key_id, "at": None})
        return {k: doc[k] for k in _ROW if k in doc}

    async def budget_members(self, budget_id: int) -> list[int]:
        """The keys that share a budget: a key and the keys rolled from it."""
        docs = await self.keys.find({"$or": [{"_id": budget_id}, {"budget_id": budget_id}]}, {"_id": 1}).to_list(None)
        return [d["_id"] for d in docs]

    async def list(self, account_id: str, limit: int = 0, before: int | None = None) -> list[dict]:
        """Newest first (key ids grow with creation); `before`: only keys with a smaller id (the cursor)."""
        query: dict = {"account_id": account_id}
        if before is not None:
            query["_id"] = {"$lt": before}
        keys = await self.keys.find(query, _ROW).sort("_id", -1).limit(limit).to_list(None)
        return await self._with_last_used(keys)

    async def count_active(self, account_id: str, up_to: int | None = None) -> int:
        """Unrevoked, unexpired keys of the account; with `up_to`, only those with an id up to it."""
        # An expired key (a rolled one past its grace included) no longer counts.
        # `$not $lte` (no expiry, or a later one) rather than an `$or`, which the embedded server answers by
        # reading every key of every account.
        query: dict = {"account_id": account_id, "revoked": False, "expires_at": {"$not": {"$lte": now_utc()}}}
        if up_to is not None:
            query["_id"] = {"$lte": up_to}
        return await self.keys.count_documents(query)

    async def delete(self, key_id: int) -> None:
        """Only for a key that was never shown to anybody (creation refused after the insert)."""
        await self.keys.delete_one({"_id": key_id})
        await self.last_used.delete_one({"_id": key_id})

    async def get(self, account_id: str, key_id: int) -> dict | None:
        """The key, only if `account_id` owns it."""
        key = await self.keys.find_one({"_id": key_id, "account_id": account_id})
        return (await self._with_last_used([key]))[0] if key else None

    async def _with_last_used(self, keys: list[dict]) -> list[dict]:
        """The keys with last_used_at from key_last_used where that is newer (`at` is None until first stored)."""
        if keys:
            ids = [k["key_id"] for k in keys]
            stored = {d["_id"]: d["at"] async for d in self.last_used.find({"_id": {"$in": ids}})}
            for key in keys:
                at = stored.get(key["key_id"])
                if at is not None and (key.get("last_used_at") is None or at > key["last_used_at"]):
                    key["last_used_at"] = at
        return keys

    async def reference(self, key_id: int) -> dict | None:
        """What a filter rule needs of its key (streams/poller.py): its digest (the key cache's name for it), its
        account, and the key it was rolled to."""
        return await self.keys.find_one({"_id": key_id}, {"account_id": 1, "digest": 1, "rolled_to": 1})

    async def by_digest(self, digest: str) -> dict | None:
        return await self.keys.find_one({"digest": digest}, _ENTRY)

    async def update(self, account_id: str, key_id: int, changes: dict, unheard: list[str]) -> dict | None:
        """Sets the given fields (None removes one) and stamps props_changed_at, which other processes
        follow (storage/changes.py) and, those in `unheard`, acknowledge (heard); the row plus the digest, or
        None if the account has no such key."""
        return await self.keys.find_one_and_update(
            {"_id": key_id, "account_id": account_id},
            _changing(changes, unheard),
            projection={**_ROW, **_ENTRY},
            return_document=ReturnDocument.AFTER,
        )

    async def update_budget(self, account_id: str, budget_id: int, changes: dict, unheard: list[str]) -> list[dict]:
        """Budget fields (BUDGET_FIELDS) on every key sharing the budget, in one statement, as update()
        does: a key and the keys rolled from it have one budget, so one limit, one period, one run."""
        members = {"account_id": account_id, "$or": [{"_id": budget_id}, {"budget_id": budget_id}]}
        await self.keys.update_many(members, _changing(changes, unheard))
        return await self.keys.find(members, {**_ROW, **_ENTRY}).to_list(None)

    async def revoke(self, account_id: str, key_id: int, unheard: list[str]) -> dict | None:
        return await self.keys.find_one_and_update(
            {"_id": key_id, "account_id": account_id},
            {"$set": {"revoked": True, "revoked_at": now_utc(), "unheard": unheard}},
            projection=_ROW,
            return_document=ReturnDocument.AFTER,
        )

    async def heard(self, key_id: int, process_id: str) -> None:
        """`process_id` applies the key's latest change (not streamed: it sets neither revoked nor props_changed_at)."""
        await self.keys.update_one({"_id": key_id, "unheard": process_id}, {"$pull": {"unheard": process_id}})

    async def unheard(self, key_ids: list[int]) -> bool:
        """Whether a process has yet to apply the latest change of one of these keys."""
        query = {"_id": {"$in": key_ids}, "unheard": {"$exists": True, "$ne": []}}
        return await self.keys.find_one(query, {"_id": 1}) is not None

    async def touch(self, last_used: dict[int, datetime]) -> None:
        """Batched last_used_at (key id -> a minute) in one round trip (two for keys older than key_last_used)."""
        by_minute: dict[datetime, list[int]] = {}
        for key_id, minute in last_used.items():
            by_minute.setdefault(minute, []).append(key_id)
        # At most TOUCH_CHUNK ids per statement: the embedded server re-checks every matched key against
        # the whole `$in` list (twice), so one statement for 300 keys cost it several times more CPU than
        # statements of 10; one UpdateOne per key costs a journaled commit each.
        statements = [
            UpdateMany({"_id": {"$in": ids[i : i + TOUCH_CHUNK]}}, {"$max": {"at": m}})
            for m, ids in by_minute.items()
            for i in range(0, len(ids), TOUCH_CHUNK)
        ]
        if not statements:
            return
        result = await self.last_used.bulk_write(statements, ordered=False)
        if result.matched_count < len(last_used):
            # Keys created before key_last_used existed, at their first use since (once): one upsert each.
            # $max keeps a newer minute another process wrote meanwhile.
            await self.last_used.bulk_write(
                [UpdateOne({"_id": k}, {"$max": {"at": m}}, upsert=True) for k, m in last_used.items()], ordered=False
            )
