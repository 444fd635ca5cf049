"""The audit log: an entry written for the request that acted (BaseHandler.audit), and the reads: an account's own
entries or every account's, filtered, paged and streamed whole (storage/audit.py keeps them)."""

from datetime import datetime

from storage.audit import ACTIONS, ACTOR_KINDS, ANONYMOUS, AuditStore, account_actor, admin_actor, cursor_id

__all__ = ["ACTIONS", "ACTOR_KINDS", "AuditService", "cursor_id"]


class AuditService:
    def __init__(self, store: AuditStore):
        self.store = store

    async def record(
        self,
        action: str,
        target: str | None,
        actor_id: str | None,
        address: str,
        details: dict | None,
        member: dict | None,
        admin: dict | None = None,
    ) -> None:
        """An entry by the account `actor_id` (None: not signed in, as a failed login), or by `admin` (the admin's
        account document) acting on `target`."""
        if admin is not None:
            actor = admin_actor(admin["_id"], admin["email"])
        else:
            actor = account_actor(actor_id) if actor_id else ANONYMOUS
        await self.store.record(action, target, actor, address, details, member=member)

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
