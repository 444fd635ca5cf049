"""Session tokens ended before their expiry (POST /auth/logout), kept until they would have expired."""

from datetime import UTC, datetime

from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError


class SessionStore:
    def __init__(self, db: AsyncDatabase):
        self.ended = db.ended_sessions

    async def end(self, token_id: str, account_id: str, expires: int) -> None:
        try:
            await self.ended.insert_one(
                {
                    "_id": token_id,
                    "account_id": account_id,
                    "expires_at": datetime.fromtimestamp(expires, UTC),
                    "ended_at": datetime.now(UTC),  # other processes polling for logouts read from it
                }
            )
        except DuplicateKeyError:
            pass  # logged out twice: already ended

    async def is_ended(self, token_id: str) -> bool | None:
        """True when ended; None (not False) otherwise, so a cache remembers it only briefly."""
        return True if await self.ended.find_one({"_id": token_id}, {"_id": 1}) else None
