"""The answer cache's second tier: provider answers shared by every gateway process and machine on the
database, and the fill claims that let one process fetch a key while the others wait for its answer.

    answers:      {_id: <cache key>, status, body (binary), worth, fetched_at (epoch seconds), expires_at}
    answer_fills: {_id: <cache key>, owner, until, failed?}

A process missing a key in its memory reads `answers`; missing there too, it claims the key in
`answer_fills` (one insert) and asks the provider, or, when another process holds the claim, polls for that
process's answer for as long as the claim lasts (bounded by the provider's time-out). A claim whose holder
failed says so (`failed`), and the waiters fail the same way instead of asking the provider again; a claim
past its `until` (its holder died) is taken over. Both collections expire by TTL index (storage/expiry.py).
"""

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from bson import Binary
from pymongo import IndexModel
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from storage.expiry import Expiry

POLL_SECONDS = 0.05  # how often a process waiting on another's fill looks for its answer
FAILED_SECONDS = 1.0  # how long a failed fill answers its waiters (and later arrivals) with the failure


@dataclass(frozen=True)
class Cached:
    """An answer as both tiers keep it (social/answer_cache.py in memory, this module in the database)."""

    status: int
    body: bytes
    worth: int  # the credits the answer was charged at full price: a hit's charge is a fraction of it
    fetched_at: float  # wall-clock seconds when it was asked of the provider (shared across processes)

    def age(self, now: float) -> float:
        return max(0.0, now - self.fetched_at)


class AnswerStore:
    def __init__(self, db: AsyncDatabase, owner: str):
        self.answers, self.fills, self.owner = db.answers, db.answer_fills, owner

    async def ensure_indexes(self, expiry: Expiry) -> None:
        for collection in (self.answers, self.fills):
            await expiry.create_indexes(collection, [IndexModel("expires_at", expireAfterSeconds=0)])

    async def get(self, key: str, max_age: float) -> Cached | None:
        doc = await self.answers.find_one({"_id": key})
        if doc is None:
            return None
        found = Cached(doc["status"], bytes(doc["body"]), doc["worth"], doc["fetched_at"])
        return found if found.age(time.time()) <= max_age else None

    async def put(self, key: str, entry: Cached, keep: float) -> None:
        """Keeps an answer charged from the provider for `keep` seconds, and ends the key's fill claim."""
        expires = datetime.fromtimestamp(entry.fetched_at, UTC) + timedelta(seconds=keep)
        doc = {"status": entry.status, "body": Binary(entry.body), "worth": entry.worth}
        await self.answers.update_one(
            {"_id": key}, {"$set": {**doc, "fetched_at": entry.fetched_at, "expires_at": expires}}, upsert=True
        )
        await self.fills.delete_one({"_id": key, "owner": self.owner})

    async def claim_or_wait(self, key: str, fresh: float, patience: float) -> Cached | str | None:
        """A fresh shared answer (Cached), the failure (its kind) of another process's fill this call waited
        for, or None: this process claimed the key (or gave up waiting) and asks the provider itself."""
        found = await self.get(key, fresh)
        if found is not None:
            return found
        deadline = time.monotonic() + patience
        while True:
            now = datetime.now(UTC)
            if await self._claim(key, now, patience):
                return None
            fill = await self.fills.find_one({"_id": key})
            if fill is not None and fill.get("failed") and fill["until"].replace(tzinfo=UTC) > now:
                return fill["failed"]
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(POLL_SECONDS)
            found = await self.get(key, fresh)
            if found is not None:
                return found

    async def _claim(self, key: str, now: datetime, patience: float) -> bool:
        until = now + timedelta(seconds=patience)
        try:
            await self.fills.insert_one({"_id": key, "owner": self.owner, "until": until, "expires_at": until})
            return True
        except DuplicateKeyError:
            pass
        taken = await self.fills.update_one(  # a claim whose holder died (or ended long ago) is taken over
            {"_id": key, "until": {"$lt": now}},
            {"$set": {"owner": self.owner, "until": until, "expires_at": until}, "$unset": {"failed": ""}},
        )
        return taken.modified_count == 1

    async def failed(self, key: str, kind: str) -> None:
        """This process's fill got no answer to keep: its waiters fail the same way (`kind`), or, for an answer
        that is no failure but not kept either (kind ""), ask the provider themselves."""
        if not kind:
            await self.fills.delete_one({"_id": key, "owner": self.owner})
            return
        until = datetime.now(UTC) + timedelta(seconds=FAILED_SECONDS)
        await self.fills.update_one(
            {"_id": key, "owner": self.owner}, {"$set": {"failed": kind, "until": until, "expires_at": until}}
        )
