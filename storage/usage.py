"""Usage records: one per data call, written in idempotent batches."""
from datetime import datetime

from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError

DUPLICATE_KEY = 11000


class UsageStore:
    def __init__(self, db: AsyncDatabase):
        self.usage = db.usage

    async def insert_batch(self, records: list[dict]) -> int:
        """Inserts what is not there yet; records already written by an earlier try are skipped."""
        if not records:
            return 0
        try:
            result = await self.usage.insert_many(records, ordered=False)
            return len(result.inserted_ids)
        except BulkWriteError as exc:
            others = [e for e in exc.details["writeErrors"] if e["code"] != DUPLICATE_KEY]
            if others:
                raise
            return exc.details["nInserted"]

    async def recent(self, account_id: str, since: datetime, limit: int) -> list[dict]:
        return await self.usage.find({"account_id": account_id, "ts": {"$gte": since}}).sort("ts", -1).limit(limit).to_list(None)

    async def spent_by_lease(self, lease: str, account_id: str) -> int:
        pipeline = [{"$match": {"lease": lease, "account_id": account_id}},
                    {"$group": {"_id": None, "credits": {"$sum": "$credits"}}}]
        cursor = await self.usage.aggregate(pipeline)
        return next(iter([doc["credits"] async for doc in cursor]), 0)
