"""What other processes change that this one caches: key revocations and property changes (expiry,
scopes, address lists, budgets), account top-ups and plan changes, requests for leased credits, and
logouts.
Read from a change stream (replica sets and the embedded server), or by polling indexed timestamps
where change streams are unavailable."""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pymongo.asynchronous.change_stream import AsyncChangeStream
from pymongo.asynchronous.database import AsyncDatabase

# Fields whose change matters to other processes. Lease takes and give-backs (credits, leases.*,
# lease_holders) happen on every refill and are filtered out by the server.
ACCOUNT_FIELDS = ("changed_at", "paid_usd", "topup_credits", "is_admin", "lease_wanted_at")
# Never needed to apply a change, and not worth shipping to every process.
_HIDDEN = {"password_hash": 0, "applied_credits": 0, "sealed": 0}

_PIPELINE = [
    {
        "$match": {
            "$or": [
                {
                    "operationType": "update",
                    "$or": [
                        {"ns.coll": "keys", "updateDescription.updatedFields.revoked": True},
                        {"ns.coll": "keys", "updateDescription.updatedFields.props_changed_at": {"$exists": True}},
                        {
                            "ns.coll": "accounts",
                            "$or": [
                                {f"updateDescription.updatedFields.{f}": {"$exists": True}} for f in ACCOUNT_FIELDS
                            ],
                        },
                    ],
                },
                {"operationType": "insert", "ns.coll": "ended_sessions"},  # a logout
            ],
        }
    },
    {"$project": {f"fullDocument.{name}": 0 for name in _HIDDEN}},
]


@dataclass(frozen=True)
class Change:
    kind: str  # "revoked": a key (by digest); "key": a key's properties; "account": an account document;
    # "ended": a session token ended by a logout (by token id)
    id: Any  # the key's digest, the account id or the token id
    fields: frozenset[str]  # for accounts: which of ACCOUNT_FIELDS changed
    doc: dict | None = None


class ChangeFeed:
    def __init__(self, db: AsyncDatabase):
        self.db = db

    async def stream(self, resume_after: dict | None) -> AsyncChangeStream:
        # One stream over the database, filtered server-side to the two collections and fields above.
        # Each read waits at most 50 ms on the server: the caller's pause between empty batches sets
        # the pace, and a cancelled read (shutdown) is answered at once.
        return await self.db.watch(
            _PIPELINE, full_document="updateLookup", resume_after=resume_after, max_await_time_ms=50
        )

    @staticmethod
    def parse(event: dict) -> Change | None:
        doc = event.get("fullDocument")
        if doc is None:  # deleted before the lookup: nothing left to apply
            return None
        if event["ns"]["coll"] == "ended_sessions":
            return Change("ended", doc["_id"], frozenset())
        if event["ns"]["coll"] == "keys":
            if doc.get("revoked"):
                return Change("revoked", doc["digest"], frozenset(), doc)
            return Change("key", doc["digest"], frozenset(), doc)
        updated = set(event.get("updateDescription", {}).get("updatedFields", {}))
        return Change("account", doc["_id"], frozenset(updated.intersection(ACCOUNT_FIELDS)), doc)

    async def poll(self, since: datetime) -> list[tuple[datetime, Change]]:
        """Revocations and account changes stamped at or after `since`, each with its stamp."""
        found = []
        revoked = {"digest": 1, "revoked_at": 1, "unheard": 1}
        async for key in self.db.keys.find({"revoked_at": {"$gte": since}}, revoked):
            found.append((key["revoked_at"], Change("revoked", key["digest"], frozenset(), key)))
        async for key in self.db.keys.find({"props_changed_at": {"$gte": since}}, _HIDDEN):
            if not key.get("revoked"):
                found.append((key["props_changed_at"], Change("key", key["digest"], frozenset(), key)))
        async for ended in self.db.ended_sessions.find({"ended_at": {"$gte": since}}, {"ended_at": 1}):
            found.append((ended["ended_at"], Change("ended", ended["_id"], frozenset())))
        query = {"$or": [{"changed_at": {"$gte": since}}, {"lease_wanted_at": {"$gte": since}}]}
        async for doc in self.db.accounts.find(query, _HIDDEN):
            for field in ("changed_at", "lease_wanted_at"):
                if doc.get(field) is not None and doc[field] >= since:
                    found.append((doc[field], Change("account", doc["_id"], frozenset([field]), doc)))
        return found
