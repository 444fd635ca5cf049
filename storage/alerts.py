"""Alert rules and their arming state: every query of alerts/.

Exactly once per crossing: the event of a crossing has an id derived from the rule and the crossing
(storage/webhooks.py writes it once); a balance rule's `arm_seq` counts its crossings, moved on by a
conditional update (the re-arm) only once its current crossing has fired (`fired_seq`).
"""

from datetime import UTC, datetime, timedelta

from pymongo import ASCENDING, IndexModel, ReturnDocument
from pymongo.asynchronous.database import AsyncDatabase

INDEXES = [IndexModel([("account_id", ASCENDING)]), IndexModel([("changed_at", ASCENDING)])]
POLL_OVERLAP = timedelta(seconds=2)  # writers stamp with their own clocks (as accounting/coherence.py polls)


def now_utc() -> datetime:
    return datetime.now(UTC)


class AlertStore:
    def __init__(self, db: AsyncDatabase):
        self.rules = db.alert_rules

    async def ensure_indexes(self) -> None:
        await self.rules.create_indexes(INDEXES)

    async def add(self, doc: dict) -> None:
        await self.rules.insert_one({**doc, "arm_seq": 0, "fired_seq": -1, "deleted": False, "changed_at": now_utc()})

    async def account_rules(self, account_id: str) -> list[dict]:
        return await self.rules.find({"account_id": account_id, "deleted": False}).sort("created_at", -1).to_list(None)

    async def count(self, account_id: str) -> int:
        return await self.rules.count_documents({"account_id": account_id, "deleted": False})

    async def delete(self, account_id: str, rule_id: str) -> bool:
        """Kept, marked deleted, so that other processes' polls see it go."""
        done = await self.rules.update_one(
            {"_id": rule_id, "account_id": account_id, "deleted": False},
            {"$set": {"deleted": True, "changed_at": now_utc()}},
        )
        return bool(done.modified_count)

    async def changed_since(self, since: datetime | None) -> list[dict]:
        query = {} if since is None else {"changed_at": {"$gte": since - POLL_OVERLAP}}
        return await self.rules.find(query).to_list(None)

    async def fired(self, rule_id: str, seq: int) -> None:
        """The crossing `seq` has its event (idempotent: also after a crash between the two writes)."""
        await self.rules.update_one(
            {"_id": rule_id, "fired_seq": {"$lt": seq}},
            {"$set": {"fired_seq": seq, "fired_at": now_utc(), "changed_at": now_utc()}},
        )

    async def rearm(self, rule_id: str, seq: int) -> dict | None:
        """The value is back over the threshold after crossing `seq` fired: the next crossing may fire.
        Of processes re-arming at once, one moves the sequence on."""
        return await self.rules.find_one_and_update(
            {"_id": rule_id, "arm_seq": seq, "fired_seq": seq},
            {"$inc": {"arm_seq": 1}, "$set": {"changed_at": now_utc()}},
            return_document=ReturnDocument.AFTER,
        )
