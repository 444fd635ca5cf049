"""Members: the people of an account, each with a role (security/roles.py), and the invitations that make them.

A person is a sign-in: email, password hash, two-factor state and session version. A person who registered has
theirs on the document of the account they registered with (so the person's id is that account's id); a person
invited without an account of their own gets a sign-in document in the same collection, marked `person: true`,
with no balance (storage/accounts.py `create_person`). One unique email index covers both.

    members      {_id: member id, account_id, person_id, email, role, joined_at, last_seen_at?, invited_by?}
                 unique (account_id, person_id)
    invitations  {_id: invitation id, account_id, email, role, digest (sha256 of the token), created_at,
                 expires_at, invited_by: {member_id, email}, accepted_at?}

The account document keeps `owners`, the person ids of its owners: removing or demoting an owner is one
conditional update of that list (only while another owner stays), so two owners demoting each other at once
cannot leave the account without one, whichever processes they reach.
"""

import hashlib
import secrets
from datetime import datetime, timedelta

from bson import ObjectId
from pymongo import ASCENDING, IndexModel, ReturnDocument
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from security.roles import OWNER
from storage.accounts import ACCOUNTS_ONLY
from storage.clock import now_utc

INVITATION_DAYS = 7


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class LastOwner(Exception):
    """The change would leave the account without an owner."""


class MemberStore:
    def __init__(self, db: AsyncDatabase):
        self.members, self.invitations, self.accounts = db.members, db.invitations, db.accounts

    async def ensure_indexes(self) -> None:
        await self.members.create_indexes(
            [
                IndexModel([("account_id", ASCENDING), ("person_id", ASCENDING)], unique=True),
                IndexModel([("person_id", ASCENDING), ("joined_at", ASCENDING)]),
            ]
        )
        await self.invitations.create_indexes(
            [IndexModel([("digest", ASCENDING)], unique=True), IndexModel([("account_id", ASCENDING)])]
        )

    async def migrate(self) -> int:
        """Every account registered before members existed: its sign-in becomes its owner. Idempotent (upserts;
        run by every starting process, concurrently too); how many accounts it changed."""
        changed = 0
        async for account in self.accounts.find(
            {"owners": {"$exists": False}, **ACCOUNTS_ONLY, "password_hash": {"$exists": True}},
            {"email": 1, "created_at": 1},
        ):
            await self.make_owner(account["_id"], account["email"], account.get("created_at"))
            changed += 1
        return changed

    async def make_owner(self, account_id: str, email: str, joined_at: datetime | None = None) -> None:
        """The registering sign-in as the account's first owner (also the migration's step)."""
        await self.add(account_id, account_id, email, OWNER, joined_at=joined_at)
        await self.accounts.update_one({"_id": account_id}, {"$addToSet": {"owners": account_id}})

    # --- members ------------------------------------------------------------------------------------
    async def add(
        self,
        account_id: str,
        person_id: str,
        email: str,
        role: str,
        joined_at: datetime | None = None,
        invited_by: dict | None = None,
    ) -> dict | None:
        """Makes the person a member (an owner: also listed in the account's owners); None when already one."""
        if role == OWNER:
            await self.accounts.update_one({"_id": account_id}, {"$addToSet": {"owners": person_id}})
        doc = {"_id": str(ObjectId()), "email": email, "role": role, "joined_at": joined_at or now_utc()}
        if invited_by:
            doc["invited_by"] = invited_by
        try:
            result = await self.members.update_one(
                {"account_id": account_id, "person_id": person_id}, {"$setOnInsert": doc}, upsert=True
            )
        except DuplicateKeyError:  # two upserts at once (processes migrating together): the other one made it
            return None
        if result.upserted_id is None:
            return None
        return {**doc, "account_id": account_id, "person_id": person_id}

    async def role(self, account_id: str, person_id: str) -> dict | None:
        """The person's membership of the account ({_id, role, email}), None if they are not a member."""
        return await self.members.find_one({"account_id": account_id, "person_id": person_id}, {"role": 1, "email": 1})

    async def of_person(self, person_id: str) -> list[dict]:
        """The accounts of a person, first joined first."""
        cursor = self.members.find({"person_id": person_id}, {"account_id": 1, "role": 1, "email": 1}).sort(
            "joined_at", 1
        )
        return await cursor.to_list(None)

    async def of_account(self, account_id: str) -> list[dict]:
        return await self.members.find({"account_id": account_id}).sort("joined_at", 1).to_list(None)

    async def get(self, account_id: str, member_id: str) -> dict | None:
        return await self.members.find_one({"_id": member_id, "account_id": account_id})

    async def seen(self, account_id: str, person_id: str) -> None:
        await self.members.update_one(
            {"account_id": account_id, "person_id": person_id}, {"$set": {"last_seen_at": now_utc()}}
        )

    async def set_role(self, member: dict, role: str) -> dict | None:
        """The member's new role; LastOwner if they are the account's last owner and would stop being one."""
        account_id, person_id = member["account_id"], member["person_id"]
        if role == OWNER:
            await self.accounts.update_one({"_id": account_id}, {"$addToSet": {"owners": person_id}})
        elif member["role"] == OWNER:
            await self._release_owner(account_id, person_id)
        return await self.members.find_one_and_update(
            {"_id": member["_id"]}, {"$set": {"role": role}}, return_document=ReturnDocument.AFTER
        )

    async def remove(self, member: dict) -> bool:
        """Removes the member; LastOwner if they are the account's last owner."""
        if member["role"] == OWNER:
            await self._release_owner(member["account_id"], member["person_id"])
        result = await self.members.delete_one({"_id": member["_id"]})
        return result.deleted_count == 1

    async def _release_owner(self, account_id: str, person_id: str) -> None:
        # One conditional write: the owner leaves the list only while someone else is on it.
        result = await self.accounts.update_one(
            {"_id": account_id, "owners": person_id, "owners.1": {"$exists": True}}, {"$pull": {"owners": person_id}}
        )
        if result.matched_count == 0:
            raise LastOwner(account_id)

    # --- invitations --------------------------------------------------------------------------------
    async def invite(self, account_id: str, email: str, role: str, invited_by: dict) -> tuple[dict, str]:
        """A new invitation and its token (given once: only its digest is kept)."""
        token = secrets.token_urlsafe(32)
        created = now_utc()
        doc = {
            "_id": "inv_" + secrets.token_hex(8),
            "account_id": account_id,
            "email": email,
            "role": role,
            "digest": digest(token),
            "created_at": created,
            "expires_at": created + timedelta(days=INVITATION_DAYS),
            "invited_by": invited_by,
        }
        await self.invitations.insert_one(doc)
        return doc, token

    async def pending(self, account_id: str) -> list[dict]:
        query = {"account_id": account_id, "accepted_at": {"$exists": False}, "expires_at": {"$gt": now_utc()}}
        return await self.invitations.find(query).sort("created_at", -1).to_list(None)

    async def revoke(self, account_id: str, invitation_id: str) -> bool:
        query = {"_id": invitation_id, "account_id": account_id, "accepted_at": {"$exists": False}}
        return (await self.invitations.delete_one(query)).deleted_count == 1

    async def find_invitation(self, token: str) -> dict | None:
        """A pending invitation by its token, not used and not expired."""
        query = {"digest": digest(token), "accepted_at": {"$exists": False}, "expires_at": {"$gt": now_utc()}}
        return await self.invitations.find_one(query)

    async def spend(self, invitation_id: str) -> dict | None:
        """Marks the invitation used: one write, so of two accepts at once only one gets it back."""
        return await self.invitations.find_one_and_update(
            {"_id": invitation_id, "accepted_at": {"$exists": False}, "expires_at": {"$gt": now_utc()}},
            {"$set": {"accepted_at": now_utc()}},
        )
