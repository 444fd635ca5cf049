"""The audit log's reads: an account's own entries or every account's, filtered, paged and streamed whole.

Entries are written by the handlers that act (BaseHandler.audit) into storage/audit.py, which this reads."""

from datetime import datetime

from storage.audit import ACTIONS, ACTOR_KINDS, AuditStore, cursor_id

__all__ = ["ACTIONS", "ACTOR_KINDS", "AuditService", "cursor_id"]


class AuditService:
    def __init__(self, store: AuditStore):
        self.store = store

    def query(
        self,
        account_id: str | None,
        actions: tuple = (),
        since: datetime | None = None,
        until: datetime | None = None,
        actor: str | None = None,
        member: str | None = None,
    ) -> dict:
        """The filter of a read (every argument optional but the account, None for every account's)."""
        return self.store.query(account_id, actions, since, until, actor, member)

    async def page(self, query: dict, after, limit: int) -> tuple[list[dict], object]:
        return await self.store.page(query, after, limit)

    def stream(self, query: dict):
        return self.store.stream(query)
