"""API keys: integer ids from a counter, digest for lookup, sealed secret for reveal."""

from datetime import datetime

from pymongo import ReturnDocument, UpdateMany
from pymongo.asynchronous.database import AsyncDatabase

from storage.accounts import now_utc

_ROW = {
    "_id": 0,
    "key_id": 1,
    "name": 1,
    "prefix": 1,
    "revoked": 1,
    "created_at": 1,
    "last_used_at": 1,
    "account_id": 1,
}


class KeyStore:
    def __init__(self, db: AsyncDatabase):
        self.keys = db.keys
        self.counters = db.counters

    async def _next_id(self) -> int:
        doc = await self.counters.find_one_and_update(
            {"_id": "key_id"}, {"$inc": {"value": 1}}, upsert=True, return_document=ReturnDocument.AFTER
        )
        return doc["value"]

    async def create(self, account_id: str, name: str, digest: str, prefix: str, seal) -> dict:
        """`seal(key_id)` encrypts the secret bound to its id, which is known only here."""
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
        }
        await self.keys.insert_one(doc)
        return {k: doc[k] for k in _ROW if k in doc}

    async def list(self, account_id: str) -> list[dict]:
        return await self.keys.find({"account_id": account_id}, _ROW).sort("created_at", -1).to_list(None)

    async def get(self, account_id: str, key_id: int) -> dict | None:
        """The key, only if `account_id` owns it."""
        return await self.keys.find_one({"_id": key_id, "account_id": account_id})

    async def by_digest(self, digest: str) -> dict | None:
        return await self.keys.find_one({"digest": digest}, {"key_id": 1, "account_id": 1, "revoked": 1})

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
        if by_minute:
            await self.keys.bulk_write(
                [UpdateMany({"_id": {"$in": ids}}, {"$max": {"last_used_at": m}}) for m, ids in by_minute.items()],
                ordered=False,
            )
