"""API keys: integer ids from a counter, digest for lookup, sealed secret for reveal."""

from __future__ import annotations

from datetime import datetime

from pymongo import ReturnDocument, UpdateMany, UpdateOne
from pymongo.asynchronous.database import AsyncDatabase

from storage.accounts import now_utc

TOUCH_CHUNK = 10  # key ids per last_used_at statement (touch)

_ROW = {
    "_id": 0,
    "key_id": 1,
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
    "credit_limit_period": 1,
    "budget_id": 1,
}
# Restrictions a key may carry (README, "Key properties"); absent means unrestricted.
PROPERTIES = ("expires_at", "allowed_endpoints", "allowed_ips", "credit_limit", "credit_limit_period")
# What the data plane caches per key (accounting/meter.py KeyEntry).
_ENTRY = {"key_id": 1, "account_id": 1, "revoked": 1, "digest": 1, "budget_id": 1, **{p: 1 for p in PROPERTIES}}


class KeyStore:
    def __init__(self, db: AsyncDatabase):
        self.keys = db.keys
        self.counters = db.counters
        # {_id: key_id, at: minute}: last_used_at lives apart from the key documents, whose six indexes the
        # embedded server rewrites on every update (300 keys: ~300 ms of its CPU a minute, ~80 ms here).
        # Keys written before it existed keep their own last_used_at; reads take the newer of the two.
        self.last_used = db.key_last_used

    async def _next_id(self) -> int:
        doc = await self.counters.find_one_and_update(
            {"_id": "key_id"}, {"$inc": {"value": 1}}, upsert=True, return_document=ReturnDocument.AFTER
        )
        return doc["value"]

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

    async def list(self, account_id: str) -> list[dict]:
        keys = await self.keys.find({"account_id": account_id}, _ROW).sort("created_at", -1).to_list(None)
        return await self._with_last_used(keys)

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

    async def by_digest(self, digest: str) -> dict | None:
        return await self.keys.find_one({"digest": digest}, _ENTRY)

    async def update(self, account_id: str, key_id: int, changes: dict) -> dict | None:
        """Sets the given fields (None removes one) and stamps props_changed_at, which other processes
        follow (storage/changes.py); the row plus the digest, or None if the account has no such key."""
        now = now_utc()
        update: dict = {"$set": {"props_changed_at": now, **{k: v for k, v in changes.items() if v is not None}}}
        removed = {k: "" for k, v in changes.items() if v is None}
        if removed:
            update["$unset"] = removed
        return await self.keys.find_one_and_update(
            {"_id": key_id, "account_id": account_id},
            update,
            projection={**_ROW, **_ENTRY},
            return_document=ReturnDocument.AFTER,
        )

    async def revoke(self, account_id: str, key_id: int) -> dict | None:
        return await self.keys.find_one_and_update(
            {"_id": key_id, "account_id": account_id},
            {"$set": {"revoked": True, "revoked_at": now_utc()}},
            projection=_ROW,
            return_document=ReturnDocument.AFTER,
        )

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
