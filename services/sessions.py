"""Session checks on every portal request: the token's person must exist, their session version must be the
current one (a password change ends every earlier token), the token must not have been ended by POST
/auth/logout, and the person must still be a member of the token's account, whose role the request then has.

The person part comes from the account-view cache the data plane uses (kept coherent across processes). The
membership is read from the database on every request (one indexed read): a removed or demoted member loses the
old rights at once, on every process, with no cache to wait for. Ended tokens: this process knows at once; another
process through the change feed (accounting/coherence.py, within a second), and at the latest after
NEGATIVE_CACHE_TTL (the time a "not ended" answer is remembered per token) if the feed is down. The tokens themselves
and that memory: security/sessions.py."""

import dataclasses

from accounting.meter import Meter
from config.settings import Settings
from security.sessions import SessionTokens
from security.tokens import Session
from storage.accounts import AccountStore
from storage.members import MemberStore
from storage.sessions import SessionStore


class Sessions(SessionTokens):
    def __init__(
        self, settings: Settings, accounts: AccountStore, store: SessionStore, meter: Meter, members: MemberStore
    ):
        super().__init__(settings, store.is_ended)
        self.accounts, self.store, self.meter, self.members = accounts, store, meter, members

    async def check(self, token: str) -> Session | None:
        """The token's session if it is valid now, else None (the caller answers 401)."""
        session = self.read(token)
        if session is None:
            return None
        view = await self.meter.account_cache.get(session.person_id)
        if view is None or view.session_version != session.version:
            return None  # the person is gone, or their password changed since
        if await self.was_ended(session):
            return None
        member = await self.members.role(session.account_id, session.person_id)
        if member is None:
            return None  # no longer a member of this account
        return dataclasses.replace(session, role=member["role"], member_id=member["_id"], email=member["email"])

    async def end(self, session: Session) -> None:
        """POST /auth/logout: this token only (a token without an id: every session of the account)."""
        if session.token_id is None:
            await self.accounts.end_all_sessions(session.person_id)
            self.meter.account_cache.invalidate(session.person_id)
            return
        await self.store.end(session.token_id, session.person_id, session.expires)
        self.ended_here(session.token_id)

    async def password_changed(self, account_id: str, password_hash: str) -> int | None:
        """Stores the new hash; every earlier token stops working here at once. The new version."""
        version = await self.accounts.change_password(account_id, password_hash)
        self.meter.account_cache.invalidate(account_id)
        return version
