"""Cursor handles for MCP clients (storage/cursor_handles.py): a provider cursor that is too long for a model, or a
page cut to fit a model's context, named by a short handle the gateway maps back on the next call."""

import hashlib

from storage.cursor_handles import CursorHandleStore

PREFIX = "mcp:"  # a handle; anything else a client sends is the provider's own cursor


class CursorHandles:
    def __init__(self, store: CursorHandleStore):
        self.store = store

    async def hand_out(self, account_id: str, cursor: str, skip: int) -> str:
        """A handle for (cursor, skip) of this account: the same pair always gets the same handle."""
        digest = hashlib.sha256(f"{account_id}\0{cursor}\0{skip}".encode()).hexdigest()[:32]
        handle = PREFIX + digest
        await self.store.put(handle, account_id, cursor, skip)
        return handle

    async def resolve(self, account_id: str, handle: str) -> tuple[str, int] | None:
        """(provider cursor, items of its page already handed out), or None: unknown, expired or another's."""
        return await self.store.get(handle, account_id)
