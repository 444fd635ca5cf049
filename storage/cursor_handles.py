"""Cursor handles for MCP clients: a short opaque name for a provider cursor (and how many items of its page were
already handed out), so a model never carries a cursor longer than handlers/mcp/tools.py CURSOR_MAX, and a page cut
to fit a model's context can be continued where it was cut. In the database, so any worker answers any handle:

    {_id: "<handle>", account_id, cursor, skip, after, expires_at}

`after`: the id of the last item handed out (None for a provider cursor named for its length only), so a page read
again after it changed (new posts on top) continues after that item rather than at a bare position.

A handle belongs to the account that was given it; the TTL index removes it after HANDLE_SECONDS.
"""

from datetime import UTC, datetime, timedelta

from pymongo import IndexModel
from pymongo.asynchronous.database import AsyncDatabase

from storage.expiry import Expiry

HANDLE_SECONDS = 24 * 3600  # a crawl paused longer than a day starts again


class CursorHandleStore:
    def __init__(self, db: AsyncDatabase):
        self.docs = db.mcp_cursors

    async def ensure_indexes(self, expiry: Expiry) -> None:
        await expiry.create_indexes(self.docs, [IndexModel("expires_at", expireAfterSeconds=0)])

    async def put(self, handle: str, account_id: str, cursor: str, skip: int, after: str | None) -> None:
        """Idempotent: the handle is derived from what it names, so writing it twice writes the same document."""
        expires = datetime.now(UTC) + timedelta(seconds=HANDLE_SECONDS)
        await self.docs.update_one(
            {"_id": handle},
            {"$set": {"account_id": account_id, "cursor": cursor, "skip": skip, "after": after, "expires_at": expires}},
            upsert=True,
        )

    async def get(self, handle: str, account_id: str) -> tuple[str, int, str | None] | None:
        doc = await self.docs.find_one({"_id": handle, "account_id": account_id})
        if doc is None or doc["expires_at"].replace(tzinfo=UTC) < datetime.now(UTC):
            return None
        return doc["cursor"], doc["skip"], doc.get("after")
