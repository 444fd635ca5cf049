"""Webhook endpoints, the outbox of events and their deliveries: every query of the delivery engine.

An event is written once, by its unique id (a second writer of the same crossing gets DuplicateKeyError);
the dispatcher fans it out into one delivery per endpoint (ids derived from both: idempotent), and a
delivery is sent only by the process holding its claim (owner + deadline, taken by a conditional update).
"""

from datetime import UTC, datetime, timedelta

from pymongo import ASCENDING, DESCENDING, IndexModel, ReturnDocument
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from storage.caps import Caps
from storage.clock import now_utc

INDEXES = {
    "webhook_endpoints": [IndexModel([("account_id", ASCENDING), ("created_at", DESCENDING)])],
    "webhook_events": [
        IndexModel([("fan_out", ASCENDING)], sparse=True),
        IndexModel([("account_id", ASCENDING), ("created_at", DESCENDING)]),
    ],
    "webhook_deliveries": [
        IndexModel([("state", ASCENDING), ("next_attempt_at", ASCENDING)]),
        IndexModel([("endpoint_id", ASCENDING), ("created_at", DESCENDING)]),
    ],
}
LOG_ATTEMPTS = 20  # attempts kept per delivery for the log
NEVER = datetime(1970, 1, 1, tzinfo=UTC)


class WebhookStore:
    def __init__(self, db: AsyncDatabase):
        self.endpoints = db.webhook_endpoints
        self.events = db.webhook_events
        self.deliveries = db.webhook_deliveries
        self.caps = Caps(db)

    async def ensure_indexes(self) -> None:
        for name, indexes in INDEXES.items():
            await getattr(self, name.removeprefix("webhook_")).create_indexes(indexes)

    # --- endpoints -------------------------------------------------------------------------------
    async def add_endpoint(self, doc: dict, cap: int) -> bool:
        """False, nothing written, when the account has `cap` endpoints already."""
        account_id = doc["account_id"]
        return await self.caps.insert(_place(account_id), cap, self.endpoints, doc, {"account_id": account_id})

    async def endpoint(self, account_id: str | None, endpoint_id: str) -> dict | None:
        query = {"_id": endpoint_id} if account_id is None else {"_id": endpoint_id, "account_id": account_id}
        return await self.endpoints.find_one(query)

    async def account_endpoints(self, account_id: str) -> list[dict]:
        return await self.endpoints.find({"account_id": account_id}).sort("created_at", -1).to_list(None)

    async def update_endpoint(self, account_id: str, endpoint_id: str, fields: dict, unset: tuple = ()) -> dict | None:
        update: dict = {"$set": fields}
        if unset:
            update["$unset"] = {name: "" for name in unset}
        return await self.endpoints.find_one_and_update(
            {"_id": endpoint_id, "account_id": account_id}, update, return_document=ReturnDocument.AFTER
        )

    async def delete_endpoint(self, account_id: str, endpoint_id: str) -> bool:
        deleted = await self.endpoints.delete_one({"_id": endpoint_id, "account_id": account_id})
        if deleted.deleted_count:
            await self.caps.give_back(_place(account_id), endpoint_id)
            await self.deliveries.update_many(
                {"endpoint_id": endpoint_id, "state": "pending"},
                {"$set": {"state": "failed", "last_error": "endpoint deleted"}},
            )
        return bool(deleted.deleted_count)

    async def endpoint_failed(self, endpoint_id: str, at: datetime) -> dict | None:
        """Marks the start of a failing run (kept while it lasts); the endpoint as it now stands."""
        await self.endpoints.update_one({"_id": endpoint_id, "failing_since": None}, {"$set": {"failing_since": at}})
        return await self.endpoints.find_one({"_id": endpoint_id})

    async def endpoint_succeeded(self, endpoint_id: str) -> None:
        await self.endpoints.update_one(
            {"_id": endpoint_id, "failing_since": {"$ne": None}}, {"$set": {"failing_since": None}}
        )

    async def disable_endpoint(self, endpoint_id: str, reason: str) -> bool:
        """True for the one process that disabled it (the notice is sent once)."""
        done = await self.endpoints.update_one(
            {"_id": endpoint_id, "enabled": True},
            {"$set": {"enabled": False, "disabled_reason": reason, "disabled_at": now_utc()}},
        )
        return bool(done.modified_count)

    # --- events ----------------------------------------------------------------------------------
    async def add_event(self, doc: dict) -> bool:
        """Writes an event once: False when an event with its id exists (another process saw the same crossing)."""
        try:
            await self.events.insert_one({**doc, "fan_out": True})
        except DuplicateKeyError:
            return False
        return True

    async def account_events(self, account_id: str, limit: int) -> list[dict]:
        """What fired for the account; not the filter rules' tweets (listed per rule, and in the delivery log),
        which would bury an alert under a busy rule's deliveries."""
        return (
            await self.events.find({"account_id": account_id, "type": {"$ne": "tweet"}}, {"fan_out": 0})
            .sort("created_at", -1)
            .limit(limit)
            .to_list(None)
        )

    async def to_fan_out(self, limit: int) -> list[dict]:
        return await self.events.find({"fan_out": True}).limit(limit).to_list(None)

    async def add_deliveries(self, docs: list[dict]) -> None:
        for doc in docs:  # a retried fan-out finds the deliveries of the earlier try
            try:
                await self.deliveries.insert_one(doc)
            except DuplicateKeyError:
                pass

    async def fanned_out(self, event_id: str) -> None:
        await self.events.update_one({"_id": event_id}, {"$unset": {"fan_out": ""}})

    async def event(self, event_id: str) -> dict | None:
        return await self.events.find_one({"_id": event_id})

    # --- deliveries ------------------------------------------------------------------------------
    async def claim(self, owner: str, now: datetime, hold: float, skip: list[str]) -> dict | None:
        """The oldest due delivery of an account not in `skip`, claimed for `hold` seconds: no other process
        sends it meanwhile; a crashed owner's claim simply runs out."""
        due: dict = {"state": "pending", "next_attempt_at": {"$lte": now}, "claim_until": {"$lt": now}}
        if skip:
            due["account_id"] = {"$nin": skip}
        return await self.deliveries.find_one_and_update(
            due,
            {"$set": {"claim_owner": owner, "claim_until": now + timedelta(seconds=hold)}},
            sort=[("next_attempt_at", ASCENDING)],
            return_document=ReturnDocument.AFTER,
        )

    async def attempted(self, delivery_id: str, owner: str, fields: dict, attempt: dict) -> bool:
        """Records an attempt's outcome under the claim (released); False when the claim was lost."""
        done = await self.deliveries.update_one(
            {"_id": delivery_id, "claim_owner": owner},
            {
                "$set": {**fields, "claim_owner": None, "claim_until": NEVER},
                "$inc": {"attempts": 1},
                "$push": {"log": {"$each": [attempt], "$slice": -LOG_ATTEMPTS}},
            },
        )
        return bool(done.modified_count)

    async def give_up(self, delivery_id: str, owner: str, error: str) -> None:
        await self.deliveries.update_one(
            {"_id": delivery_id, "claim_owner": owner},
            {"$set": {"state": "failed", "last_error": error, "claim_owner": None, "claim_until": NEVER}},
        )

    async def redeliver(self, endpoint_id: str, delivery_id: str, retry_until: datetime) -> dict | None:
        """Due again now, with a fresh retry window; not while another process holds a claim on it."""
        now = now_utc()
        return await self.deliveries.find_one_and_update(
            {"_id": delivery_id, "endpoint_id": endpoint_id, "claim_until": {"$lt": now}},
            {"$set": {"state": "pending", "next_attempt_at": now, "retry_until": retry_until}},
            return_document=ReturnDocument.AFTER,
        )

    async def endpoint_deliveries(self, endpoint_id: str, limit: int) -> list[dict]:
        return (
            await self.deliveries.find({"endpoint_id": endpoint_id}).sort("created_at", -1).limit(limit).to_list(None)
        )

    async def next_due(self) -> datetime | None:
        doc = await self.deliveries.find_one(
            {"state": "pending"}, {"next_attempt_at": 1}, sort=[("next_attempt_at", ASCENDING)]
        )
        return doc["next_attempt_at"] if doc else None

    async def backlog(self) -> tuple[int, datetime | None]:
        """Deliveries still pending, and when the oldest of them was created (for /metrics)."""
        count = await self.deliveries.count_documents({"state": "pending"})
        oldest = await self.deliveries.find_one({"state": "pending"}, {"created_at": 1}, sort=[("created_at", 1)])
        return count, oldest["created_at"] if oldest else None


def _place(account_id: str) -> str:
    """The account's places under its cap of endpoints (storage/caps.py)."""
    return f"webhook_endpoints:{account_id}"
