"""Connection and indexes. Every query lives in the store modules beside this one."""
from pymongo import ASCENDING, DESCENDING, AsyncMongoClient, IndexModel
from pymongo.asynchronous.database import AsyncDatabase

INDEXES = {
    "accounts": [
        IndexModel([("email", ASCENDING)], unique=True),
        IndexModel([("created_at", DESCENDING)]),
        IndexModel([("lease_holders", ASCENDING)]),
    ],
    "keys": [
        IndexModel([("digest", ASCENDING)], unique=True),
        IndexModel([("account_id", ASCENDING), ("created_at", DESCENDING)]),
    ],
    "usage": [
        IndexModel([("account_id", ASCENDING), ("ts", DESCENDING)]),
        IndexModel([("lease", ASCENDING), ("account_id", ASCENDING)]),
        IndexModel([("ts", DESCENDING)]),
    ],
    "processes": [IndexModel([("heartbeat_at", ASCENDING)])],
    "events": [IndexModel([("anonymous_id", ASCENDING)])],
}


def connect(uri: str, **kwargs) -> AsyncMongoClient:
    # tz_aware: timestamps leave the database as aware UTC datetimes, serialised with +00:00.
    return AsyncMongoClient(uri, tz_aware=True, serverSelectionTimeoutMS=5000, **kwargs)


async def ensure_indexes(db: AsyncDatabase) -> None:
    """Idempotent: create_indexes is a no-op for indexes that already exist."""
    for name, indexes in INDEXES.items():
        await db[name].create_indexes(indexes)
