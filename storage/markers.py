"""What a database says about its own custody, in the `markers` collection (one document each), and who holds it:

- `secrets`: the fingerprint of the SECRETS_KEY its API keys, revealable secrets and webhook secrets were sealed
  with (security/seals.py), kept by the first start; a start with another SECRETS_KEY is refused (app/preflight.py);
- `outbound`: present while the database is a restored copy whose outward sending (webhooks, emails, rule and
  monitor polls) is held, until the operator releases it (`social-gateway release-outbound`);
- `migrated`: the database was copied to another server by `migrate`; `serve` on it is refused unless told to.

And `live_processes`: the gateway processes whose heartbeat (storage/leases.py) is recent, for the commands that
must not write under a serving gateway (restore, migrate). Synchronous, for the commands and the start-up checks,
but for `outbound_hold`, which the serving process reads on its event loop.
"""

from datetime import UTC, datetime, timedelta

from pymongo.asynchronous.database import AsyncDatabase
from pymongo.database import Database
from pymongo.errors import DuplicateKeyError

COLLECTION = "markers"
SECRETS, OUTBOUND, MIGRATED = "secrets", "outbound", "migrated"


def secrets_fingerprint(db: Database) -> str | None:
    doc = db[COLLECTION].find_one({"_id": SECRETS})
    return doc["fingerprint"] if doc else None


def keep_fingerprint(db: Database, fingerprint: str) -> str:
    """Records `fingerprint` unless one is recorded already; the one recorded (of two first starts, one wins).
    An insert under the one `_id`, not an upserting find_one_and_update: SecantusDB answered that one with nothing
    to processes starting at once on one database (as it did the answer cache's fill claim, docs/changelog.md)."""
    try:
        db[COLLECTION].insert_one({"_id": SECRETS, "fingerprint": fingerprint, "at": _now()})
    except DuplicateKeyError:
        return db[COLLECTION].find_one({"_id": SECRETS})["fingerprint"]
    return fingerprint


def hold_outbound(db: Database, reason: str) -> None:
    db[COLLECTION].replace_one({"_id": OUTBOUND}, {"reason": reason, "since": _now()}, upsert=True)


def release_outbound(db: Database) -> dict | None:
    """The hold released, or None when there was none."""
    return db[COLLECTION].find_one_and_delete({"_id": OUTBOUND})


async def outbound_hold(db: AsyncDatabase) -> dict | None:
    return await db[COLLECTION].find_one({"_id": OUTBOUND})


def outbound_hold_now(db: Database) -> dict | None:
    return db[COLLECTION].find_one({"_id": OUTBOUND})


def mark_migrated(db: Database, to: str, database: str) -> None:
    db[COLLECTION].replace_one({"_id": MIGRATED}, {"to": to, "database": database, "at": _now()}, upsert=True)


def migrated(db: Database) -> dict | None:
    return db[COLLECTION].find_one({"_id": MIGRATED})


def forget_migrated(db: Database) -> None:
    db[COLLECTION].delete_one({"_id": MIGRATED})


def live_processes(db: Database, timeout: float) -> list[tuple[str, float]]:
    """The gateway processes that sent a heartbeat within `timeout` seconds (LEASE_TIMEOUT: the time after which
    the others are declared dead) and are not being reclaimed: (process id, seconds since its heartbeat), the
    most recent first. A process stopped cleanly deletes its document; one killed stays until it is reclaimed."""
    now = _now()
    query = {"heartbeat_at": {"$gte": now - timedelta(seconds=timeout)}, "reclaiming": {"$exists": False}}
    found = [(doc["_id"], (now - doc["heartbeat_at"]).total_seconds()) for doc in db.processes.find(query)]
    return sorted(found, key=lambda pair: pair[1])


def _now() -> datetime:
    return datetime.now(UTC)
