"""A point-in-time read of the whole database, for the operations commands (backup, migrate, reconcile).

Every read given the session of `snapshot` sees the database as it was at one moment, across collections,
while the gateway keeps writing: a read-only transaction with read concern "snapshot". SecantusDB (the embedded
database) and MongoDB replica sets and sharded clusters support it; a standalone mongod has no transactions,
and then `snapshot` yields None: the callers say what that means for them. These commands run outside any event
loop, so they use the synchronous driver.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import pymongo
from pymongo.client_session import ClientSession
from pymongo.errors import OperationFailure
from pymongo.read_concern import ReadConcern
from pymongo.read_preferences import ReadPreference

# MongoDB answers a transaction on a standalone server with IllegalOperation (20).
NO_TRANSACTIONS = 20


def connect(uri: str) -> pymongo.MongoClient:
    # journal: what restore and migrate write is acknowledged once it would survive a crash, as the gateway's own
    # writes are (storage/db.py connect).
    return pymongo.MongoClient(uri, tz_aware=True, serverSelectionTimeoutMS=10000, journal=True)


def supported(client: pymongo.MongoClient) -> bool:
    """Whether the server runs transactions: a replica set member, a mongos, or SecantusDB (which names itself
    a replica set in `hello`)."""
    hello = client.admin.command("hello")
    return bool(hello.get("setName") or hello.get("msg") == "isdbgrid")


@contextmanager
def snapshot(client: pymongo.MongoClient) -> Iterator[ClientSession | None]:
    """A session whose reads all see one moment (None without transactions). Read-only: it is never committed
    with writes, and aborted on the way out, so it holds no lock on what the gateway writes."""
    if not supported(client):
        yield None
        return
    with client.start_session() as session:
        try:
            session.start_transaction(read_concern=ReadConcern("snapshot"), read_preference=ReadPreference.PRIMARY)
        except OperationFailure as exc:  # pragma: no cover - a server that said it runs transactions refused one
            if exc.code != NO_TRANSACTIONS:
                raise
            yield None
            return
        try:
            yield session
        finally:
            if session.in_transaction:
                session.abort_transaction()
