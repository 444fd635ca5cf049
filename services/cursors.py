"""Cursor handles for MCP clients (storage/cursor_handles.py): a provider cursor that is too long for a model, or a
page cut to fit a model's context, named by a short handle the gateway maps back on the next call.

A handle continues the call it was given for, and only for the account it was given to: its name is a digest of
the account, the call (the endpoint and its query but the cursor) and what it names, so handed to another search or
tool (where its position would skip the first items of a page never read) it resolves to nothing."""

import hashlib

from storage.cursor_handles import CursorHandleStore

PREFIX = "mcp:"  # a handle; anything else a client sends is the provider's own cursor


def _name(account_id: str, call: str, cursor: str, skip: int, after: str | None) -> str:
    named = f"{account_id}\0{call}\0{cursor}\0{skip}\0{after or ''}"
    return PREFIX + hashlib.sha256(named.encode()).hexdigest()[:32]


class CursorHandles:
    def __init__(self, store: CursorHandleStore):
        self.store = store

    async def hand_out(self, account_id: str, call: str, cursor: str, skip: int, after: str | None = None) -> str:
        """A handle for the page at `cursor` of this account's `call`, past its first `skip` items, the last of them
        `after` (an id): the same always get the same handle."""
        handle = _name(account_id, call, cursor, skip, after)
        await self.store.put(handle, account_id, cursor, skip, after)
        return handle

    async def resolve(self, account_id: str, call: str, handle: str) -> tuple[str, int, str | None] | None:
        """(provider cursor, items of its page already handed out, the id of the last of them), or None: unknown,
        expired, another account's, or given for another call."""
        found = await self.store.get(handle, account_id)
        if found is None or _name(account_id, call, *found) != handle:
            return None
        return found
