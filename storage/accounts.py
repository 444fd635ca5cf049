"""Accounts: identity, credit balance (unleased part) and payment totals."""

from datetime import timedelta

from bson import ObjectId
from pymongo import ReturnDocument
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from storage.clock import now_utc

# A sign-in of an invited person (create_person) shares the accounts collection but is no account: no balance, not
# a signup, not listed, not in the books.
ACCOUNTS_ONLY = {"person": {"$ne": True}}


class DuplicateEmail(Exception):
    pass


def addition(kind: str, credits: int, credit_id: str | None = None) -> dict:
    """An entry of the account's journal of additions (`additions`, pushed in the same atomic write that changes
    `credits_added`): when, how many (negative for a debit), what kind — signup, credit (a development top-up or
    `admin credit`), payment, admin_credit, admin_debit, unpaid (storage/leases.py) — and the credit's id. What a
    monthly statement lists as credits added (billing/statements.py); the journal's sum is `credits_added` +
    `credits_unpaid` (less what was added before the journal existed)."""
    entry = {"at": now_utc(), "credits": credits, "kind": kind}
    if credit_id is not None:
        entry["id"] = credit_id
    return entry


def credit_kind(credit_id: str) -> str:
    """apply_credit's ids: `admin-credit:...` from the admin console, `<order id>:<total>` from a payment."""
    return "admin_credit" if credit_id.startswith("admin-credit:") else "payment"


def funding(credits: int) -> dict:
    """Fields of a credit addition that alerts read: when credits last came in (a top-up re-arms low-balance
    alerts) and how many (the reference of percentage balance alerts)."""
    return {"funded_at": now_utc(), "last_funding": credits} if credits > 0 else {}


class AccountStore:
    def __init__(self, db: AsyncDatabase):
        self.accounts = db.accounts
        self.events = db.events
        self.signup_grants = db.signup_grants

    async def claim_signup_credits(self, network: str, cap: int) -> bool:
        """One of the `cap` signup-credit grants of `network` today (UTC), atomically across processes."""
        if cap < 1:
            return False
        today = now_utc().strftime("%Y-%m-%d")
        try:
            await self.signup_grants.update_one(
                {"_id": f"{network} {today}", "granted": {"$lt": cap}},
                {"$inc": {"granted": 1}, "$setOnInsert": {"expires_at": now_utc() + timedelta(days=2)}},
                upsert=True,
            )
        except DuplicateKeyError:
            return False  # today's grants of this network are used up: the upsert collided with the full one
        return True

    async def create(self, email: str, password_hash: str, credits: int) -> dict:
        return await self._sign_in(email, password_hash, self._new_account(credits))

    @staticmethod
    def _new_account(credits: int) -> dict:
        """The fields that make a sign-in's document an account of its own: a balance, its books, its plan basis."""
        return {
            "credits": credits,
            "credits_added": credits,  # the ledger of additions (storage/ledger.py): signup credits first
            "additions": [addition("signup", credits)] if credits else [],
            "leases": {},
            "lease_holders": [],
            "paid_usd": 0.0,
            "topup_credits": 0,
            "is_admin": False,
            "internal": False,
            **funding(credits),  # signup credits are the first reference of percentage balance alerts
        }

    async def become_account(self, person_id: str, credits: int) -> bool:
        """An invited person's sign-in (create_person) becomes an account of their own, owned by them, with
        `credits` to start: one conditional write (of two at once, one makes it; False for the other, and for a
        sign-in that is an account already). The person's id is the account's, as for one who registered."""
        fields = {**self._new_account(credits), "owners": [person_id], "became_account_at": now_utc()}
        del fields["is_admin"]  # the sign-in's own (`admin grant` may have set it)
        result = await self.accounts.update_one(
            {"_id": person_id, "person": True}, {"$set": fields, "$unset": {"person": ""}}
        )
        return result.modified_count == 1

    async def create_person(self, email: str, password_hash: str) -> dict:
        """A sign-in without an account of its own (an invited person, storage/members.py): the same identity
        fields as an account's, marked `person`, no balance; it is no account (never listed as one)."""
        return await self._sign_in(email, password_hash, {"person": True, "is_admin": False})

    async def _sign_in(self, email: str, password_hash: str, fields: dict) -> dict:
        """Inserts a sign-in (an account's, or a person's alone) under a unique email: DuplicateEmail if taken."""
        doc = {
            "_id": str(ObjectId()),
            "email": email,
            "password_hash": password_hash,
            "created_at": now_utc(),
            **fields,
        }
        try:
            await self.accounts.insert_one(doc)
        except DuplicateKeyError as exc:
            raise DuplicateEmail(email) from exc
        return doc

    async def sign_ins(self, person_ids: list[str]) -> dict[str, dict]:
        """The people's sign-ins by id, with only what a member list shows (two-factor sign-in on or off)."""
        cursor = self.accounts.find({"_id": {"$in": person_ids}}, {"totp.enabled": 1})
        return {doc["_id"]: doc async for doc in cursor}

    async def by_email(self, email: str) -> dict | None:
        return await self.accounts.find_one({"email": email})

    async def get(self, account_id: str) -> dict | None:
        return await self.accounts.find_one({"_id": account_id}, {"password_hash": 0})

    async def set_name(self, account_id: str, name: str | None) -> dict | None:
        """The account's name as its owner chose it (None removes it); the account after the change, None if gone.
        A name is for people only: no process caches it, so no changed_at."""
        change = {"$set": {"name": name}} if name else {"$unset": {"name": ""}}
        return await self.accounts.find_one_and_update(
            {"_id": account_id, **ACCOUNTS_ONLY},
            change,
            projection={"password_hash": 0},
            return_document=ReturnDocument.AFTER,
        )

    async def labels(self, account_ids: list[str]) -> dict[str, dict]:
        """What tells accounts apart for a person in several: each one's name (if set) and email, by id."""
        cursor = self.accounts.find({"_id": {"$in": account_ids}, **ACCOUNTS_ONLY}, {"name": 1, "email": 1})
        return {doc["_id"]: doc async for doc in cursor}

    async def set_attribution(self, account_id: str, first_touch: dict | None, anonymous_id: str | None) -> bool:
        """Set-once first touch; earlier anonymous events of this browser are linked to the account.

        True when every value given was stored; False when set-once kept an earlier value (or none was given)."""
        stored = first_touch is not None or bool(anonymous_id)
        if first_touch is not None:
            result = await self.accounts.update_one(
                {"_id": account_id, "first_touch": {"$exists": False}},
                {"$set": {"first_touch": first_touch, "first_touch_at": now_utc()}},
            )
            stored = stored and result.modified_count == 1
        if anonymous_id:
            result = await self.accounts.update_one(
                {"_id": account_id, "anonymous_id": {"$exists": False}}, {"$set": {"anonymous_id": anonymous_id}}
            )
            stored = stored and result.modified_count == 1
            await self.events.update_many(
                {"anonymous_id": anonymous_id, "account_id": None}, {"$set": {"account_id": account_id}}
            )
        return stored

    async def add_credits(
        self, account_id: str, credits: int, paid_usd: float = 0.0, topup_credits: int = 0
    ) -> dict | None:
        """Adds to the unleased balance; payments and development top-ups also raise the plan basis."""
        return await self.accounts.find_one_and_update(
            {"_id": account_id},
            {
                # credits_added in the same write: the ledger of additions (storage/ledger.py).
                "$inc": {
                    "credits": credits,
                    "credits_added": credits,
                    "paid_usd": paid_usd,
                    "topup_credits": topup_credits,
                },
                "$set": {"changed_at": now_utc(), **funding(credits)},
                "$push": {"additions": addition("credit", credits)},
            },  # changed_at: other processes poll for it (accounting/coherence.py)
            projection={"password_hash": 0},
            return_document=ReturnDocument.AFTER,
        )

    async def apply_credit(self, account_id: str, credit_id: str, credits: int, paid_usd: float) -> dict | None:
        """Adds a payment's credits at most once: the credit id is recorded in the same atomic write,
        so a retry after an uncertain outcome changes nothing. Returns the account either way."""
        doc = await self.accounts.find_one_and_update(
            {"_id": account_id, "applied_credits": {"$ne": credit_id}},
            {
                "$inc": {"credits": credits, "credits_added": credits, "paid_usd": paid_usd},
                "$push": {
                    "applied_credits": credit_id,
                    "additions": addition(credit_kind(credit_id), credits, credit_id),
                },
                "$set": {"changed_at": now_utc(), **funding(credits)},
            },
            projection={"password_hash": 0},
            return_document=ReturnDocument.AFTER,
        )
        return doc or await self.get(account_id)

    async def change_password(self, account_id: str, password_hash: str) -> int | None:
        """New hash and the next session version (every earlier token stops working); the new version."""
        doc = await self.accounts.find_one_and_update(
            {"_id": account_id},
            {"$set": {"password_hash": password_hash, "changed_at": now_utc()}, "$inc": {"session_version": 1}},
            projection={"session_version": 1},
            return_document=ReturnDocument.AFTER,
        )
        return doc["session_version"] if doc else None

    async def end_all_sessions(self, account_id: str) -> None:
        await self.accounts.update_one(
            {"_id": account_id}, {"$inc": {"session_version": 1}, "$set": {"changed_at": now_utc()}}
        )

    async def set_admin(self, email: str, is_admin: bool) -> bool:
        result = await self.accounts.update_one(
            {"email": email}, {"$set": {"is_admin": is_admin, "changed_at": now_utc()}}
        )
        return result.matched_count == 1

    # --- the admin console (handlers/admin/accounts.py) -----------------------------------------------
    async def debit(self, account_id: str, debit_id: str, credits: int) -> tuple[str, dict | None]:
        """Takes `credits` from the unleased balance at most once per debit id, and only if that much is there
        (the condition and the decrement are one atomic write: never below zero, whatever runs alongside).
        ("done" | "again" | "short" | "missing", the account)."""
        doc = await self.accounts.find_one_and_update(
            {"_id": account_id, "credits": {"$gte": credits}, "applied_credits": {"$ne": debit_id}},
            {
                "$inc": {"credits": -credits, "credits_added": -credits},  # a debit is a negative addition
                "$push": {"applied_credits": debit_id, "additions": addition("admin_debit", -credits, debit_id)},
                "$set": {"changed_at": now_utc()},
            },
            projection={"password_hash": 0},
            return_document=ReturnDocument.AFTER,
        )
        if doc is not None:
            return "done", doc
        doc = await self.accounts.find_one({"_id": account_id, "applied_credits": debit_id}, {"password_hash": 0})
        if doc is not None:
            return "again", doc
        doc = await self.get(account_id)
        return ("missing", None) if doc is None else ("short", doc)

    async def set_suspended(self, account_id: str, reason: str | None) -> dict | None:
        """Suspends (a reason) or resumes (None) the account; changed_at tells every process (accounting/coherence.py)."""
        fields = {"suspended": reason is not None, "suspended_reason": reason, "changed_at": now_utc()}
        return await self.accounts.find_one_and_update(
            {"_id": account_id}, {"$set": fields}, projection={"password_hash": 0}, return_document=ReturnDocument.AFTER
        )
