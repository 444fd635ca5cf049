"""Members: the people of an account, each with a role (security/roles.py), and the invitations that make them.

A person is a sign-in: email, password hash, two-factor state and session version. A person who registered has
theirs on the document of the account they registered with (so the person's id is that account's id); a person
invited without an account of their own gets a sign-in document in the same collection, marked `person: true`,
with no balance (storage/accounts.py `create_person`). One unique email index covers both.

    members      {_id: member id, account_id, person_id, email, role, joined_at, last_seen_at?, invited_by?,
                 roster_v? (the account's change it has)}
                 unique (account_id, person_id)
    invitations  {_id: invitation id, account_id, email, role, digest (sha256 of the token), created_at,
                 expires_at, invited_by: {member_id, email}, accepted_at?}

The account document keeps the roster's one point of order (no transactions: one document is what MongoDB changes
atomically):

    accounts     {..., owners: [person ids of its owners], departed: [member ids of the last members removed],
                 roster_v: how many changes of role or membership it has ordered}

Every change of a member's role, and every removal, is first one conditional update of that document: a removal
takes the person off `owners` and writes their member id into `departed`, only while another owner stays if they
were one; a promotion puts the person on `owners` only while their member id is not departed; a demotion takes
them off, under the same guard; a change by an admin only while the member is not an owner. So a promotion racing
the member's removal lands before it (and the removal's guard sees the new owner) or is refused, and `owners`
names only members. The member document then takes the change only if no later one has reached it
(`roster_v`), so its role ends as the last change the account ordered, whatever order the writes land in.
`departed` keeps the last DEPARTED_KEPT removals: it is read only by a change that found the member before their
removal and is still under way.
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
DEPARTED_KEPT = 100  # removals remembered per account (storage only: a change under way when one landed)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class LastOwner(Exception):
    """The change would leave the account without an owner."""


class OwnersOnly(Exception):
    """The member is an owner (perhaps since a moment ago), and the change is not an owner's."""


def _guard(person_id: str, may_touch_owner: bool) -> dict:
    """The condition under which the person may stop being an owner: another owner stays (an owner acting, or the
    person leaving), or they are none (an admin acting)."""
    if may_touch_owner:
        return {"$or": [{"owners": {"$ne": person_id}}, {"owners.1": {"$exists": True}}]}
    return {"owners": {"$ne": person_id}}


def _pending(account_id: str) -> dict:
    """The account's invitations not used and not expired."""
    return {"account_id": account_id, "accepted_at": {"$exists": False}, "expires_at": {"$gt": now_utc()}}


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

    async def repair_owners(self) -> int:
        """Owners lists written before the account ordered its roster (issue 46) may name a member who left as they
        were made an owner: such a name goes, in one write made only if the list did not change since, unless no
        name would stay. Each account checked once (it gets its roster_v). How many lists lost a name."""
        repaired = 0
        async for account in self.accounts.find(
            {"owners.1": {"$exists": True}, "roster_v": {"$exists": False}}, {"owners": 1}
        ):
            owners = account["owners"]
            real = await self.members.distinct("person_id", {"account_id": account["_id"], "role": OWNER})
            ghosts = [person for person in owners if person not in real]
            change: dict = {"$set": {"roster_v": 0}}
            if ghosts and len(ghosts) < len(owners):
                change["$pullAll"] = {"owners": ghosts}
            result = await self.accounts.update_one(
                {"_id": account["_id"], "owners": owners, "roster_v": {"$exists": False}}, change
            )
            repaired += 1 if "$pullAll" in change and result.modified_count else 0
        return repaired

    async def make_owner(self, account_id: str, email: str, joined_at: datetime | None = None) -> None:
        """The registering sign-in as the account's first owner (also the migration's step)."""
        if await self.add(account_id, account_id, email, OWNER, joined_at=joined_at) is None:
            # A member already (another process migrating, or a start after one stopped between the two writes)
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
        member = {**doc, "account_id": account_id, "person_id": person_id}
        if role == OWNER:  # listed once the member exists: never an owner who is not a member, even for a moment
            await self.set_role(member, role, may_touch_owner=True)
        return member

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

    async def set_role(self, member: dict, role: str, may_touch_owner: bool) -> dict | None:
        """The member with their new role (or with a later change that overtook this one); None when they were
        removed meanwhile. LastOwner if they are the account's last owner and would stop being one; OwnersOnly if
        they are an owner and `may_touch_owner` is false (an admin's change)."""
        version = await self._change(member, role, may_touch_owner)
        if version is None:
            return None
        changed = await self.members.find_one_and_update(
            {"_id": member["_id"], "$or": [{"roster_v": {"$lt": version}}, {"roster_v": {"$exists": False}}]},
            {"$set": {"role": role, "roster_v": version}},
            return_document=ReturnDocument.AFTER,
        )
        return changed or await self.members.find_one({"_id": member["_id"]})

    async def remove(self, member: dict, may_touch_owner: bool) -> bool:
        """Removes the member; False when they were gone already. LastOwner if they are the account's last owner;
        OwnersOnly if they are an owner and `may_touch_owner` is false."""
        account_id, person_id, member_id = member["account_id"], member["person_id"], member["_id"]
        query = {"_id": account_id, "departed": {"$ne": member_id}, **_guard(person_id, may_touch_owner)}
        update = {
            "$pull": {"owners": person_id},
            "$push": {"departed": {"$each": [member_id], "$slice": -DEPARTED_KEPT}},
            "$inc": {"roster_v": 1},
        }
        if (await self.accounts.update_one(query, update)).matched_count == 0:
            await self._refused(member, may_touch_owner)  # raises, unless they were removed already
        return (await self.members.delete_one({"_id": member_id})).deleted_count == 1

    async def _change(self, member: dict, role: str, may_touch_owner: bool) -> int | None:
        """The role change's place in the account's order (its roster_v); None when the member was removed."""
        person_id = member["person_id"]
        query: dict = {"_id": member["account_id"], "departed": {"$ne": member["_id"]}}
        if role == OWNER:
            change = {"$addToSet": {"owners": person_id}}
        else:
            query.update(_guard(person_id, may_touch_owner))
            change = {"$pull": {"owners": person_id}}
        doc = await self.accounts.find_one_and_update(
            query,
            {**change, "$inc": {"roster_v": 1}},
            projection={"roster_v": 1},
            return_document=ReturnDocument.AFTER,
        )
        if doc is None:
            await self._refused(member, may_touch_owner)
            return None
        return doc["roster_v"]

    async def _refused(self, member: dict, may_touch_owner: bool) -> None:
        """Why the account refused a change: the member was removed (returns), or is an owner (raises)."""
        doc = await self.accounts.find_one({"_id": member["account_id"]}, {"owners": 1, "departed": 1}) or {}
        if member["_id"] in doc.get("departed", ()):
            return
        if not may_touch_owner:
            raise OwnersOnly(member["account_id"])
        raise LastOwner(member["account_id"])

    # --- invitations --------------------------------------------------------------------------------
    async def invite(self, account_id: str, email: str, role: str, invited_by: dict) -> tuple[dict, str] | None:
        """A new invitation and its token (given once: only its digest is kept); None when the address has another
        pending one to the account (at most one each: of two made at once, each taken back that sees the other)."""
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
        other = {**_pending(account_id), "email": email, "_id": {"$ne": doc["_id"]}}
        if await self.invitations.find_one(other, {"_id": 1}) is not None:
            await self.invitations.delete_one({"_id": doc["_id"]})
            return None
        return doc, token

    async def pending(self, account_id: str) -> list[dict]:
        return await self.invitations.find(_pending(account_id)).sort("created_at", -1).to_list(None)

    async def pending_for(self, account_id: str, email: str) -> bool:
        """Whether the address has a pending invitation to the account."""
        return await self.invitations.find_one({**_pending(account_id), "email": email}, {"_id": 1}) is not None

    async def pending_invitation(self, account_id: str, invitation_id: str) -> dict | None:
        return await self.invitations.find_one({**_pending(account_id), "_id": invitation_id})

    async def revoke(self, account_id: str, invitation_id: str, role: str) -> bool:
        """Revokes the pending invitation if it is one of `role`."""
        query = {"_id": invitation_id, "account_id": account_id, "role": role, "accepted_at": {"$exists": False}}
        return (await self.invitations.delete_one(query)).deleted_count == 1

    async def revoke_invited_by(self, account_id: str, member_id: str, of_roles: list[str]) -> int:
        """Revokes the member's pending invitations of those roles; how many."""
        query = {
            "account_id": account_id,
            "invited_by.member_id": member_id,
            "role": {"$in": of_roles},
            "accepted_at": {"$exists": False},
        }
        return (await self.invitations.delete_many(query)).deleted_count

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
