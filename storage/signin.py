"""Account security kept on the account document: two-factor sign-in and the password reset's write.

    totp_pending: {sealed, created_at}                        an enrolment waiting for its first code
    totp: {sealed, enabled, enrolled_at, last_step, recovery}  sealed: the secret, AES-GCM (security/apikeys.py);
                                                               last_step: the last time step used (no replay);
                                                               recovery: keyed digests of unused recovery codes

    spent_challenges: {_id: the challenge's jti, account_id, expires_at}   a login challenge used once (TTL:
                                                                          storage/db.py, gone when it expires)

Every write that decides something is conditional, so two processes (or two requests) racing cannot both
win: a time step is used once, a recovery code is spent once, a login challenge opens one session, a reset
link changes the password once."""

from datetime import datetime

from pymongo import ReturnDocument
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from storage.clock import now_utc


class SignInStore:
    def __init__(self, db: AsyncDatabase):
        self.accounts = db.accounts
        self.spent = db.spent_challenges

    async def state(self, account_id: str) -> dict | None:
        return await self.accounts.find_one(
            {"_id": account_id}, {"totp": 1, "totp_pending": 1, "email": 1, "session_version": 1}
        )

    async def for_reset(self, account_id: str) -> dict | None:
        """What a reset reads: the email, the password hash (the link is bound to it) and the session version."""
        return await self.accounts.find_one({"_id": account_id}, {"email": 1, "password_hash": 1, "session_version": 1})

    async def begin(self, account_id: str, sealed: str) -> bool:
        """A new pending enrolment (replacing an unconfirmed one); False when 2FA is already on."""
        done = await self.accounts.update_one(
            {"_id": account_id, "totp.enabled": {"$ne": True}},
            {"$set": {"totp_pending": {"sealed": sealed, "created_at": now_utc()}}},
        )
        return done.matched_count == 1

    async def enable(self, account_id: str, sealed: str, step: int, recovery: list[str]) -> bool:
        """The pending enrolment `sealed` becomes the account's second factor; False if it is no longer pending."""
        done = await self.accounts.update_one(
            {"_id": account_id, "totp_pending.sealed": sealed, "totp.enabled": {"$ne": True}},
            {
                "$set": {
                    "totp": {
                        "sealed": sealed,
                        "enabled": True,
                        "enrolled_at": now_utc(),
                        "last_step": step,
                        "recovery": recovery,
                    },
                    "changed_at": now_utc(),  # other processes' account views learn it (admins must have 2FA)
                },
                "$unset": {"totp_pending": ""},
            },
        )
        return done.modified_count == 1

    async def use_step(self, account_id: str, step: int) -> bool:
        """Claims a time step: True once per step (and never for one before the last used)."""
        done = await self.accounts.update_one(
            {"_id": account_id, "totp.enabled": True, "totp.last_step": {"$lt": step}},
            {"$set": {"totp.last_step": step}},
        )
        return done.modified_count == 1

    async def use_recovery(self, account_id: str, digest: str) -> int | None:
        """Spends a recovery code: the codes left, or None when it is not (or no longer) one of them."""
        doc = await self.accounts.find_one_and_update(
            {"_id": account_id, "totp.enabled": True, "totp.recovery": digest},
            {"$pull": {"totp.recovery": digest}},
            projection={"totp.recovery": 1},
            return_document=ReturnDocument.AFTER,
        )
        return None if doc is None else len(doc["totp"]["recovery"])

    async def replace_recovery(self, account_id: str, recovery: list[str]) -> bool:
        done = await self.accounts.update_one(
            {"_id": account_id, "totp.enabled": True}, {"$set": {"totp.recovery": recovery}}
        )
        return done.matched_count == 1

    async def disable(self, account_id: str) -> bool:
        done = await self.accounts.update_one(
            {"_id": account_id, "totp.enabled": True},
            {"$unset": {"totp": "", "totp_pending": ""}, "$set": {"changed_at": now_utc()}},
        )
        return done.modified_count == 1

    async def challenge_spent(self, token_id: str) -> bool:
        return await self.spent.find_one({"_id": token_id}, {"_id": 1}) is not None

    async def spend_challenge(self, token_id: str, account_id: str, expires_at: datetime) -> bool:
        """True once per challenge, in every process (a unique insert); False when it was spent already."""
        try:
            await self.spent.insert_one({"_id": token_id, "account_id": account_id, "expires_at": expires_at})
        except DuplicateKeyError:
            return False
        return True

    async def reset_password(self, account_id: str, old_hash: str, new_hash: str) -> int | None:
        """The new hash, only if the password is still `old_hash` (a reset link works once), and the next
        session version (every session ends); the new version, or None when the link was used already."""
        doc = await self.accounts.find_one_and_update(
            {"_id": account_id, "password_hash": old_hash},
            {"$set": {"password_hash": new_hash, "changed_at": now_utc()}, "$inc": {"session_version": 1}},
            projection={"session_version": 1},
            return_document=ReturnDocument.AFTER,
        )
        return doc["session_version"] if doc else None
