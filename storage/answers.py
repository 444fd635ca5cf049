"""The answer cache's second tier: provider answers shared by every gateway process and machine on the
database, each with the fill claim that lets one process fetch a key while the others wait for its answer.

    answers: {_id: <cache key>, status, body (binary), worth, fetched_at (epoch seconds), expires_at,
              provider?, owner?, until?, failed?}

A process missing a key in its memory claims it here by inserting a claim under the key (one round trip, and a
second to read what was there when the key is taken): nothing there, the claim is its own and it asks the
provider; a fresh answer there is a hit; a claim of another process's, it polls for that process's answer
for as long as the claim lasts (bounded by the provider's time-out). A claim whose holder failed says so
(`failed`), and the waiters fail the same way instead of asking the provider again; a claim past its `until`
(its holder died), or a stale answer without a claim, is taken over. Keeping an answer is one write that also
ends the claim: a miss costs two round trips. Documents expire by TTL index (storage/expiry.py).
"""

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from bson import Binary
from pymongo import IndexModel, WriteConcern
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
    provider: str = ""  # the name of the provider that produced it (X-Provider of every answer it serves)

    def age(self, now: float) -> float:
        return max(0.0, now - self.fetched_at)


class AnswerStore:
    def __init__(self, db: AsyncDatabase, owner: str):
        # Not journaled (the client's default is, for the money): a kept answer or a claim lost in a crash only
        # costs a provider call, and a journal commit per miss held the database back for everything else.
        self.answers = db.get_collection("answers", write_concern=WriteConcern(w=1, j=False))
        self.owner = owner

    async def ensure_indexes(self, expiry: Expiry) -> None:
        await expiry.create_indexes(self.answers, [IndexModel("expires_at", expireAfterSeconds=0)])

    async def get(self, key: str, max_age: float) -> Cached | None:
        return _fresh(await self.answers.find_one({"_id": key}), max_age)

    async def put(self, key: str, entry: Cached, keep: float) -> None:
        """Keeps an answer charged from the provider for `keep` seconds, and ends the key's fill claim."""
        expires = datetime.fromtimestamp(entry.fetched_at, UTC) + timedelta(seconds=keep)
        doc = {"status": entry.status, "body": Binary(entry.body), "worth": entry.worth, "provider": entry.provider}
        await self.answers.update_one(
            {"_id": key},
            {
                "$set": {**doc, "fetched_at": entry.fetched_at, "expires_at": expires},
                "$unset": {"owner": "", "until": "", "failed": ""},
            },
            upsert=True,
        )

    async def drop(self, key: str, fetched_at: float) -> None:
        """Forgets an answer that was kept for a call that did not charge it after all (not a newer one)."""
        await self.answers.delete_one({"_id": key, "fetched_at": fetched_at})

    async def claim(self, key: str, patience: float) -> dict | None:
        """Claims the key if nothing is kept for it (None: the claim is this process's); else what is there.

        An insert, not an upsert: the unique `_id` makes exactly one of any number of claims at once succeed.
        (An upserting find_one_and_update is that atomic on MongoDB, but SecantusDB ran concurrent ones side by
        side: 20 at once from two clients handed the claim to several of them, and each asked the provider.)"""
        until = datetime.now(UTC) + timedelta(seconds=patience)
        try:
            await self.answers.insert_one({"_id": key, "owner": self.owner, "until": until, "expires_at": until})
            return None
        except DuplicateKeyError:  # something is kept for the key: an answer, or another process's claim
            return await self.answers.find_one({"_id": key}) or {}

    async def wait(self, key: str, doc: dict, fresh: float, patience: float) -> Cached | str | None:
        """After `claim` found `doc`: a fresh shared answer (Cached), the failure (its kind) of another
        process's fill this call waited for, or None: this process claimed the key (a claim that ended, a stale
        answer) or gave up waiting, and asks the provider itself."""
        now = datetime.now(UTC)
        until = now + timedelta(seconds=patience)
        deadline = time.monotonic() + patience
        while True:
            found = _fresh(doc, fresh)
            if found is not None:
                return found
            held = doc.get("until") is not None and doc["until"].replace(tzinfo=UTC) > now
            if held and doc.get("failed"):
                return doc["failed"]
            if not held and await self._take(key, doc, now, until):
                return None
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(POLL_SECONDS)
            now = datetime.now(UTC)
            doc = await self.answers.find_one({"_id": key}) or {}

    async def _take(self, key: str, doc: dict, now: datetime, until: datetime) -> bool:
        """Claims a key whose claim ended (its holder died, or it has none: a stale answer), or whose document is
        gone (`doc` empty: expired or dropped), as `claim` does."""
        if not doc:
            try:
                await self.answers.insert_one({"_id": key, "owner": self.owner, "until": until, "expires_at": until})
                return True
            except DuplicateKeyError:  # another process claimed it in between
                return False
        taken = await self.answers.update_one(
            {"_id": key, "$or": [{"until": {"$exists": False}}, {"until": {"$lt": now}}]},
            {"$set": {"owner": self.owner, "until": until}, "$unset": {"failed": ""}},
        )
        return taken.modified_count == 1

    async def failed(self, key: str, kind: str) -> None:
        """This process's fill got no answer to keep: its waiters fail the same way (`kind`), or, for an answer
        that is no failure but not kept either (kind ""), ask the provider themselves."""
        if not kind:
            await self.answers.update_one({"_id": key, "owner": self.owner}, {"$unset": {"owner": "", "until": ""}})
            return
        until = datetime.now(UTC) + timedelta(seconds=FAILED_SECONDS)
        await self.answers.update_one({"_id": key, "owner": self.owner}, {"$set": {"failed": kind, "until": until}})


def _fresh(doc: dict | None, max_age: float) -> Cached | None:
    if not doc or "body" not in doc:
        return None
    found = Cached(doc["status"], bytes(doc["body"]), doc["worth"], doc["fetched_at"], doc.get("provider", ""))
    return found if found.age(time.time()) <= max_age else None
