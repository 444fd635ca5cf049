"""The database's schema version, and the steps that bring an older database forward.

Recorded in `schema` as `{_id: "version", version, steps: [{from, to, at, did}]}`. A database the gateway wrote
before versions were recorded (it has accounts, no record) is version 1. `serve` checks it before anything else
touches the database (gateway.py): a database newer than this binary is refused with one line (its documents may
mean what this code does not know); an older one is brought forward step by step, each step idempotent (a start
that dies midway, or two starting at once, run it again to no effect), and the record says what each did.

Run the new binary's first start with the older processes stopped: a step reads the database as it finds it.
"""

import logging
from collections.abc import Callable
from datetime import UTC, datetime

from pymongo.database import Database

from storage import ledger, snapshot, usage_months
from storage.usage import flatten

log = logging.getLogger("gateway.schema")

VERSION = 3
RECORD = {"_id": "version"}


class SchemaTooNew(RuntimeError):
    """The database was written by a newer gateway."""


def recorded(db: Database) -> int | None:
    """The version the database records; 1 for a database from before versions (accounts, no record); None for
    an empty one."""
    doc = db.schema.find_one(RECORD)
    if doc is not None:
        return doc["version"]
    return 1 if "accounts" in db.list_collection_names() else None


def _ledger_of_additions(db: Database) -> str:
    """1 -> 2: every account's `credits_added` (storage/ledger.py). There was no record of additions before, so the
    ledger starts from what the account holds now: its balance and everything it was charged, read at one moment."""
    client = db.client
    with snapshot.snapshot(client) as session:
        accounts, usage = ledger.accounts_with_usage(db, session)
    started = 0
    for doc in accounts:
        if "credits_added" in doc:
            continue
        mine = usage.get(doc["_id"], {})
        leases = {p: lease.get("amount", 0) for p, lease in (doc.get("leases") or {}).items()}
        balance = doc.get("credits", 0) + sum(amount - mine.get(p, 0) for p, amount in leases.items())
        started += ledger.set_credits_added(db, doc["_id"], balance + sum(mine.values()))
    return f"started the ledger of additions (credits_added) on {started} of {len(accounts)} accounts"


def _monthly_usage(db: Database) -> str:
    """2 -> 3: the usage by month that statements read (storage/usage_months.py), counted from every stored usage
    record (never from the per-batch totals, which can miss a batch). No gateway of this version has written any
    before this step runs, so the step writes every document whole: run again after a start that died midway, it
    writes the same documents again."""
    batches = (
        (bucket["_id"].split(":", 1)[0], flatten(bucket))
        for bucket in db.usage_buckets.find({}, {"account_id": 1, "lease": 1, "records": 1}, batch_size=16)
    )
    docs = usage_months.from_buckets(batches)
    for doc in docs:
        db.usage_months.replace_one({"_id": doc["_id"]}, doc, upsert=True)
    accounts = len({doc["account_id"] for doc in docs})
    return f"counted the usage by month of {accounts} accounts ({len(docs)} documents)"


STEPS: dict[int, Callable[[Database], str]] = {1: _ledger_of_additions, 2: _monthly_usage}


def refuse_newer(db: Database, version: int = VERSION) -> int | None:
    """The version the database records (recorded); SchemaTooNew when it is newer than `version`."""
    found = recorded(db)
    if found is not None and found > version:
        raise SchemaTooNew(
            f"the database {db.name} is at schema version {found}, newer than this gateway's {version}: "
            "run the newer release (or restore a backup taken before the upgrade)"
        )
    return found


def bring_forward(db: Database, version: int = VERSION) -> list[str]:
    """Checks the database's version and runs the steps up to `version`; what was done, one line per step.
    SchemaTooNew when the database is newer."""
    found = refuse_newer(db, version)
    done = []
    for step in range(found or version, version):
        did = STEPS[step](db)
        db.schema.update_one(
            RECORD,
            {
                "$max": {"version": step + 1},
                "$push": {"steps": {"from": step, "to": step + 1, "at": _now(), "did": did}},
            },
            upsert=True,
        )
        log.info("schema %d -> %d: %s", step, step + 1, did)
        done.append(f"schema {step} -> {step + 1}: {did}")
    if found is None:  # an empty database starts at this version
        db.schema.update_one(RECORD, {"$max": {"version": version}, "$setOnInsert": {"steps": []}}, upsert=True)
    return done


def _now() -> datetime:
    return datetime.now(UTC)
