"""Connection and indexes. Every query lives in the store modules beside this one."""

from pymongo import ASCENDING, DESCENDING, AsyncMongoClient, IndexModel
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError

from storage.expiry import Expiry

DUPLICATE_KEY = 11000

INDEXES = {
    # Ended sessions are dropped once the token would have expired anyway.
    "ended_sessions": [
        IndexModel([("expires_at", ASCENDING)], expireAfterSeconds=0),
        IndexModel([("ended_at", ASCENDING)]),
    ],
    "signup_grants": [IndexModel([("expires_at", ASCENDING)], expireAfterSeconds=0)],
    # What reclaims counted, for a process declared dead that comes back (storage/leases.py): it comes
    # back within minutes or never; a month is ample.
    "lease_reclaims": [IndexModel([("at", ASCENDING)], expireAfterSeconds=30 * 86400)],
    "accounts": [
        IndexModel([("email", ASCENDING)], unique=True),
        IndexModel([("created_at", DESCENDING)]),
        IndexModel([("lease_holders", ASCENDING)]),
        # Polled by accounting/coherence.py when change streams are unavailable.
        IndexModel([("changed_at", ASCENDING)], sparse=True),
        IndexModel([("lease_wanted_at", ASCENDING)], sparse=True),
    ],
    "keys": [
        IndexModel([("digest", ASCENDING)], unique=True),
        IndexModel([("account_id", ASCENDING), ("created_at", DESCENDING)]),
        IndexModel([("account_id", ASCENDING), ("_id", DESCENDING)]),  # GET /keys pages, the key cap
        IndexModel([("revoked_at", ASCENDING)], sparse=True),
        IndexModel([("props_changed_at", ASCENDING)], sparse=True),
        IndexModel([("budget_id", ASCENDING)], sparse=True),
    ],
    "usage_buckets": [
        IndexModel([("account_id", ASCENDING), ("ts_max", DESCENDING)]),
        IndexModel([("lease", ASCENDING), ("account_id", ASCENDING)]),
        IndexModel([("ts", DESCENDING)]),
        # Exports read an account's buckets day by day (storage/usage.py).
        IndexModel([("account_id", ASCENDING), ("day", ASCENDING)]),
    ],
    "usage_totals": [
        IndexModel([("account_id", ASCENDING), ("day", ASCENDING)]),
        IndexModel([("lease", ASCENDING)]),
    ],
    # Monthly statements read an account's months (storage/usage_months.py).
    "usage_months": [IndexModel([("account_id", ASCENDING), ("month", ASCENDING)])],
    "processes": [IndexModel([("heartbeat_at", ASCENDING)])],
    # Idempotency-Key claims end with their lease, kept answers after IDEMPOTENCY_TTL (storage/idempotency.py);
    # the (account, key) pair is the _id: unique.
    "idempotency_keys": [IndexModel([("expires_at", ASCENDING)], expireAfterSeconds=0)],
    "events": [IndexModel([("anonymous_id", ASCENDING)])],
    # Login challenges used once (storage/signin.py), kept until they would have expired anyway.
    "spent_challenges": [IndexModel([("expires_at", ASCENDING)], expireAfterSeconds=0)],
    # Rate limits across processes (storage/limits.py): a key's document goes once its window is over.
    "limit_windows": [IndexModel([("expires_at", ASCENDING)], expireAfterSeconds=0)],
}


def only_duplicates(exc: BulkWriteError) -> bool:
    """True when every error of an unordered bulk write is a duplicate key: what a retried batch
    or a repeated guarded upsert runs into, and nothing to fail over."""
    return all(e["code"] == DUPLICATE_KEY for e in exc.details["writeErrors"])


def connect(uri: str, **kwargs) -> AsyncMongoClient:
    # tz_aware: timestamps leave the database as aware UTC datetimes, serialised with +00:00.
    # journal: a write is acknowledged only once it is in the database's journal. Usage batches are
    # dropped from memory and lease amounts trusted once acknowledged, so an acknowledged write that a
    # database crash then loses would be a charge without its record (measured: SecantusDB loses the
    # last ~0.3 s of unjournaled writes on SIGKILL; mongod up to its journal interval). For replica
    # sets, w=majority (the server default unless the URI says otherwise) also survives a failover.
    return AsyncMongoClient(uri, tz_aware=True, serverSelectionTimeoutMS=5000, journal=True, **kwargs)


async def ensure_indexes(db: AsyncDatabase, expiry: Expiry) -> None:
    """Idempotent: create_indexes is a no-op for indexes that already exist (TTL ones: storage/expiry.py)."""
    for name, indexes in INDEXES.items():
        await expiry.create_indexes(db[name], indexes)
