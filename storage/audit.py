"""The audit log: who did what to which account, when, from which address. Append-only.

Writing, from a handler (BaseHandler.audit fills the actor from the session and the address):

    await self.audit("key.revoked", details={"key_id": key_id})                 # the account itself
    await self.audit("admin.credit", account_id=target, admin=True, details={"credits": 500, "reason": "..."})

or, anywhere with the context (the system crediting a payment, a background task):

    await ctx.audit.record(
        "credit.applied",              # one of ACTIONS (an unknown action is a programming error: ValueError)
        account_id="6650…",            # whose log the entry lands in; None for none (shown to admins only)
        actor=SYSTEM,                  # or account_actor(id), admin_actor(id, email), ANONYMOUS
        address="203.0.113.9",         # the client's address (BaseHandler.client_ip()), None for the system
        details={"order_id": "…", "credits": 100000},   # small, JSON-able, never a secret
        once="credit:…",               # optional: an event id; its second entry is not written (retries)
    )

An entry is {_id: ObjectId (time-ordered: the page cursor), at, account_id, action, actor: {kind: account |
admin | system | anonymous, id, member_id?, email?}, address, details, expires_at, once?}. An account's actor
names the member who acted for it (storage/members.py: `member_id` and `email`), an admin's the admin's email. Nothing here updates or deletes an entry: the
only way out is MongoDB's TTL at `expires_at` (AUDIT_RETENTION_DAYS after the write, so a changed
setting applies to entries written after the change). A write that fails is logged and swallowed: the
action it records is already done, and failing its request would invite a retry that does it twice.
Data calls never write here (a reveal does: it hands out a secret).
"""

import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

from bson import ObjectId
from bson.errors import InvalidId
from pymongo import ASCENDING, DESCENDING, IndexModel
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from storage.expiry import Expiry

log = logging.getLogger("gateway.audit")

ACTIONS = (
    "account.created",
    "account.renamed",
    "login",
    "login.failed",
    "logout",
    "password.changed",
    "password.reset_requested",
    "password.reset",
    "2fa.enabled",
    "2fa.disabled",
    "2fa.failed",
    "2fa.recovery_used",
    "2fa.recovery_regenerated",
    "key.created",
    "key.revealed",
    "key.rolled",
    "key.revoked",
    "key.edited",
    "budget.changed",
    "checkout.created",
    "credit.applied",
    "billing.details_changed",
    "receipt.voided",
    "webhook.created",
    "webhook.deleted",
    "admin.credit",
    "admin.debit",
    "admin.suspend",
    "admin.resume",
    "member.invited",
    "member.invitation_revoked",
    "member.joined",
    "member.role_changed",
    "member.removed",
    "member.left",
    "mcp.connected",
)
ACTOR_KINDS = ("account", "admin", "system", "anonymous")  # anonymous: not signed in (a failed login)
SYSTEM = {"kind": "system", "id": None}
ANONYMOUS = {"kind": "anonymous", "id": None}

INDEXES = [
    IndexModel([("account_id", ASCENDING), ("_id", DESCENDING)]),
    IndexModel([("action", ASCENDING), ("_id", DESCENDING)]),
    IndexModel([("expires_at", ASCENDING)], expireAfterSeconds=0),
    IndexModel([("once", ASCENDING)], unique=True, sparse=True),
]


def account_actor(account_id: str) -> dict:
    return {"kind": "account", "id": account_id}


def admin_actor(account_id: str, email: str) -> dict:
    return {"kind": "admin", "id": account_id, "email": email}


def cursor_id(value: str | None) -> ObjectId | None:
    """An entry id from a page cursor; None when absent or not an id (the caller answers 422)."""
    try:
        return ObjectId(value) if value else None
    except (InvalidId, TypeError):
        return None


def _id_at(moment: datetime) -> ObjectId:
    """The smallest id of that second, the time clamped to what an ObjectId holds (1970 to 2106)."""
    return ObjectId.from_datetime(max(FIRST_ID_TIME, min(moment, LAST_ID_TIME)))


FIRST_ID_TIME, LAST_ID_TIME = datetime(1970, 1, 1, tzinfo=UTC), datetime(2106, 2, 7, 6, 28, 15, tzinfo=UTC)


class AuditStore:
    def __init__(self, db: AsyncDatabase, retention_days: int):
        self.entries = db.audit_log
        self.retention = timedelta(days=retention_days)

    async def ensure_indexes(self, expiry: Expiry) -> None:
        await expiry.create_indexes(self.entries, INDEXES)

    async def record(
        self,
        action: str,
        account_id: str | None,
        actor: dict,
        address: str | None = None,
        details: dict | None = None,
        once: str | None = None,
        member: dict | None = None,
    ) -> None:
        """`once`: an id of the event (a credit id, an idempotency key): a second entry with it is not written,
        so a retried or concurrent step (two processes settling one payment) leaves one entry."""
        if action not in ACTIONS or actor.get("kind") not in ACTOR_KINDS:
            raise ValueError(f"unknown audit action or actor: {action!r}, {actor.get('kind')!r}")
        if member is not None and actor["kind"] == "account":  # who of the account's members acted
            actor = {**actor, "member_id": member["member_id"], "email": member["email"]}
        now = datetime.now(UTC)
        doc = {
            "at": now,
            "account_id": account_id,
            "action": action,
            "actor": actor,
            "address": address,
            "details": details or {},
            "expires_at": now + self.retention,
        }
        if once is not None:
            doc["once"] = once
        try:
            await self.entries.insert_one(doc)
        except DuplicateKeyError:
            pass  # this event's entry is already written
        except Exception:  # never fails the done action; the log line names it without its details
            log.exception("audit entry not written: %s for account %s", action, account_id)

    @staticmethod
    def query(
        account_id: str | None = None,
        actions: tuple[str, ...] = (),
        since: datetime | None = None,
        until: datetime | None = None,
        actor_kind: str | None = None,
        member_id: str | None = None,
    ) -> dict:
        """The filter of a list or an export; account_id None: every account (admins)."""
        query: dict = {}
        if account_id is not None:
            query["account_id"] = account_id
        if actions:
            query["action"] = {"$in": list(actions)}
        if since is not None or until is not None:
            # ObjectIds start with their second: a time range is an _id range, served by the same indexes.
            query["_id"] = {}
            if since is not None:
                query["_id"]["$gte"] = _id_at(since)
            if until is not None:
                query["_id"]["$lte"] = _id_at(until + timedelta(seconds=1))
            query["at"] = {k: v for k, v in (("$gte", since), ("$lte", until)) if v is not None}
        if actor_kind is not None:
            query["actor.kind"] = actor_kind
        if member_id is not None:
            query["actor.member_id"] = member_id
        return query

    async def page(self, query: dict, before: ObjectId | None, limit: int) -> tuple[list[dict], ObjectId | None]:
        """Newest first; the next page's cursor (the last entry's id) when there may be more."""
        if before is not None:
            query = {**query, "_id": {**query.get("_id", {}), "$lt": before}}
        rows = await self.entries.find(query, {"expires_at": 0}).sort("_id", DESCENDING).limit(limit + 1).to_list(None)
        more = len(rows) > limit
        rows = rows[:limit]
        return rows, (rows[-1]["_id"] if more and rows else None)

    async def stream(self, query: dict) -> AsyncIterator[dict]:
        """Every matching entry, newest first, for exports (read in batches, never held whole)."""
        async for doc in self.entries.find(query, {"expires_at": 0}, batch_size=500).sort("_id", DESCENDING):
            yield doc
