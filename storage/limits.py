"""Rate limits that hold across processes: at most `limit` events of a key in any `window` seconds, counted in
MongoDB (the in-memory throttles, security/throttle.py, count per process: `--workers N` would allow N times).

One document per key keeps the times of its last `limit` events; an event is allowed and counted by one
conditional write (fewer than `limit` times kept, or the oldest kept one out of the window), so two processes
asking at once cannot both take the last place. For what protects someone else (an inbox, a receiver).

    limit_windows: {_id: key, hits: [oldest .. newest], expires_at}   expires (TTL, storage/db.py) once its newest
                                                                       event has left the window
"""

import math
from datetime import UTC, datetime, timedelta

from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError


class Limits:
    def __init__(self, db: AsyncDatabase):
        self.windows = db.limit_windows

    async def take(self, key: str, limit: int, window: float, now: datetime | None = None) -> int:
        """0 when one more event of `key` is allowed now (it is counted); else whole seconds until one is."""
        now = now or datetime.now(UTC)
        room = {
            "_id": key,
            "$or": [{f"hits.{limit - 1}": {"$exists": False}}, {"hits.0": {"$lte": now - timedelta(seconds=window)}}],
        }
        count = {
            "$push": {"hits": {"$each": [now], "$slice": -limit}},
            "$set": {"expires_at": now + timedelta(seconds=window)},
        }
        try:  # the first event of a key makes its document; a full window's filter misses and the insert collides
            await self.windows.update_one(room, count, upsert=True)
            return 0
        except DuplicateKeyError:  # full, or another process made the document a moment ago: ask once more
            if (await self.windows.update_one(room, count)).modified_count:
                return 0
        kept = await self.windows.find_one({"_id": key}, {"hits": {"$slice": 1}})
        oldest = kept["hits"][0] if kept and kept.get("hits") else now
        return max(1, math.ceil((oldest - now).total_seconds() + window))
