"""Alert rules and their arming state: every query of alerts/.

Exactly once per crossing: the event of a crossing has an id derived from the rule and the crossing
(storage/webhooks.py writes it once); a balance rule's `arm_seq` counts its crossings, moved on by a
conditional update (the re-arm) only once its current crossing has fired (`fired_seq`).
"""

from datetime import datetime, timedelta

from pymongo import ASCENDING, IndexModel, ReturnDocument
from pymongo.asynchronous.database import AsyncDatabase

from storage.caps import Caps
from storage.clock import now_utc

INDEXES = [IndexModel([("account_id", ASCENDING)]), IndexModel([("changed_at", ASCENDING)])]
POLL_OVERLAP = timedelta(seconds=2)  # writers stamp with their own clocks (as accounting/coherence.py polls)


class AlertStore:
    def __init__(self, db: AsyncDatabase):
        self.rules = db.alert_rules
        self.caps = Caps(db)

    async def ensure_indexes(self) -> None:
        await self.rules.create_indexes(INDEXES)

    async def add(self, doc: dict, cap: int) -> bool:
        """False, nothing written, when the account has `cap` rules already."""
        account_id = doc["account_id"]
        doc = {**doc, "arm_seq": 0, "fired_seq": -1, "deleted": False, "changed_at": now_utc()}
        counted = {"account_id": account_id, "deleted": False}
        return await self.caps.insert(_place(account_id), cap, self.rules, doc, counted)

    async def account_rules(self, account_id: str) -> list[dict]:
        return await self.rules.find({"account_id": account_id, "deleted": False}).sort("created_at", -1).to_list(None)

    async def delete(self, account_id: str, rule_id: str) -> bool:
        """Kept, marked deleted, so that other processes' polls see it go."""
        done = await self.rules.update_one(
            {"_id": rule_id, "account_id": account_id, "deleted": False},
            {"$set": {"deleted": True, "changed_at": now_utc()}},
        )
        if done.modified_count:
            await self.caps.give_back(_place(account_id), rule_id)
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

    async def fired_day(self, rule_id: str, day: str) -> None:
        """A daily rule's crossing of `day` (UTC) has its event; it re-arms by itself the next day. Idempotent:
        of processes recording the same day, the first one's time stays."""
        await self.rules.update_one(
            {"_id": rule_id, "fired_day": {"$ne": day}},
            {"$set": {"fired_day": day, "fired_at": now_utc(), "changed_at": now_utc()}},
        )

    async def rearm(self, rule_id: str, seq: int) -> dict | None:
        """The value is back over the threshold after crossing `seq` fired: the next crossing may fire.
        Of processes re-arming at once, one moves the sequence on."""
        return await self.rules.find_one_and_update(
            {"_id": rule_id, "arm_seq": seq, "fired_seq": seq},
            {"$inc": {"arm_seq": 1}, "$set": {"changed_at": now_utc()}},
            return_document=ReturnDocument.AFTER,
        )


def _place(account_id: str) -> str:
    """The account's places under its cap of alert rules (storage/caps.py)."""
    return f"alert_rules:{account_id}"
