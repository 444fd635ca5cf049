"""Idempotency keys: who runs a keyed request, and the answer kept for its repeats.

One document per (account, key), the pair being its `_id`, so the primary key's unique index lets one
insert, and only one, claim a key across every process:

    {_id: "<account_id>:<sha-256 of the key>", request: <sha-256 of the request>, owner, expires_at,
     answer?: {status, body, charged, request_id}}

Without `answer` the document is a claim: `owner` (a process and a counter, new for each claim) runs the
request, and `expires_at` is its lease. A claim whose lease has passed belongs to an owner that died or
stalled: another may take it over, which changes `owner`, so the late owner's answer is refused
(`keep` matches on the owner). With `answer` the first answer is kept until `expires_at`
(IDEMPOTENCY_TTL); `body` is absent when it was too large to keep. The TTL index removes either kind
once its time is over (within the server's TTL pass, about a minute); until then readers treat an
expired document as absent (accounting/idempotency.py).
"""

from datetime import datetime

from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError


class IdempotencyStore:
    def __init__(self, db: AsyncDatabase):
        self.docs = db.idempotency_keys

    async def claim(self, doc_id: str, request: str, owner: str, lease_until: datetime) -> bool:
        """Claims the key for `owner` until `lease_until`; False when a document holds it already."""
        try:
            await self.docs.insert_one({"_id": doc_id, "request": request, "owner": owner, "expires_at": lease_until})
        except DuplicateKeyError:
            return False
        return True

    async def take_over(self, doc_id: str, holder: str, request: str, owner: str, lease_until: datetime) -> bool:
        """Claims a key whose document has run out of time (a dead owner's claim, or an answer past its TTL),
        provided `holder` still holds it: of several processes taking over at once, one wins."""
        result = await self.docs.update_one(
            {"_id": doc_id, "owner": holder},
            {"$set": {"request": request, "owner": owner, "expires_at": lease_until}, "$unset": {"answer": ""}},
        )
        return result.matched_count == 1

    async def keep(self, doc_id: str, owner: str, answer: dict, until: datetime) -> bool:
        """Stores the claim's answer until `until`; False when `owner` no longer holds the claim (taken over)."""
        result = await self.docs.update_one(
            {"_id": doc_id, "owner": owner}, {"$set": {"answer": answer, "expires_at": until}}
        )
        return result.matched_count == 1

    async def drop(self, doc_id: str, owner: str) -> None:
        """Ends a claim without an answer (nothing charged): the next request with the key runs again."""
        await self.docs.delete_one({"_id": doc_id, "owner": owner})

    async def read(self, doc_id: str) -> dict | None:
        return await self.docs.find_one({"_id": doc_id})
