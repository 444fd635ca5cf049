"""API keys: integer ids from a counter, digest for lookup, sealed secret for reveal."""

from datetime import datetime

from pymongo import ReturnDocument, UpdateMany
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
        return {k: doc[k] for k in _ROW if k in doc}

    async def budget_members(self, budget_id: int) -> list[int]:
        """The keys that share a budget: a key and the keys rolled from it."""
        docs = await self.keys.find({"$or": [{"_id": budget_id}, {"budget_id": budget_id}]}, {"_id": 1}).to_list(None)
        return [d["_id"] for d in docs]

    async def list(self, account_id: str) -> list[dict]:
        return await self.keys.find({"account_id": account_id}, _ROW).sort("created_at", -1).to_list(None)

    async def get(self, account_id: str, key_id: int) -> dict | None:
        """The key, only if `account_id` owns it."""
        return await self.keys.find_one({"_id": key_id, "account_id": account_id})

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
        """Batched last_used_at (key id -> a minute), one statement per distinct minute, in one round trip."""
        by_minute: dict[datetime, list[int]] = {}
        for key_id, minute in last_used.items():
            by_minute.setdefault(minute, []).append(key_id)
        # At most TOUCH_CHUNK ids per statement: the embedded server re-checks every matched key against
        # the whole `$in` list (twice), so one statement for 300 keys cost it ~350 ms of CPU in one burst;
        # chunks of 10 cost ~50 ms, one UpdateOne per key ~100 ms (a journaled commit each).
        statements = [
            UpdateMany({"_id": {"$in": ids[i : i + TOUCH_CHUNK]}}, {"$max": {"last_used_at": m}})
            for m, ids in by_minute.items()
            for i in range(0, len(ids), TOUCH_CHUNK)
        ]
        if statements:
            await self.keys.bulk_write(statements, ordered=False)
