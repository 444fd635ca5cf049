"""Session checks on every portal request, from memory: the token's account must exist, its session
version must be the account's current one (a password change ends every earlier token), and the
token must not have been ended by POST /auth/logout.

The account part comes from the account-view cache the data plane uses (kept coherent across
processes). Ended tokens: this process knows at once; another process through the change feed
(accounting/coherence.py, within a second), and at the latest after NEGATIVE_CACHE_TTL (the time a
"not ended" answer is remembered per token) if the feed is down."""

from accounting.meter import Meter
from config.settings import Settings
from runtime.cache import LoadingCache
from security import tokens
from security.tokens import Session
from storage.accounts import AccountStore
from storage.sessions import SessionStore


class Sessions:
    def __init__(self, settings: Settings, accounts: AccountStore, store: SessionStore, meter: Meter):
        self.settings, self.accounts, self.store, self.meter = settings, accounts, store, meter
        self.ended = LoadingCache(
            store.is_ended, settings.key_cache_size, settings.token_ttl_seconds, settings.negative_cache_ttl
        )

    async def check(self, token: str) -> Session | None:
        """The token's session if it is valid now, else None (the caller answers 401)."""
        session = tokens.session_of(self.settings.jwt_secret, token)
        if session is None:
            return None
        view = await self.meter.account_cache.get(session.account_id)
        if view is None or view.session_version != session.version:
            return None  # the account is gone, or its password changed since
        if session.token_id is not None and await self.ended.get(session.token_id):
            return None
        return session

    def issue(self, account_id: str, version: int) -> str:
        s = self.settings
        return tokens.issue(s.jwt_secret, account_id, s.token_ttl_seconds, version=version)

    async def end(self, session: Session) -> None:
        """POST /auth/logout: this token only (a token without an id: every session of the account)."""
        if session.token_id is None:
            await self.accounts.end_all_sessions(session.account_id)
            self.meter.account_cache.invalidate(session.account_id)
            return
        await self.store.end(session.token_id, session.account_id, session.expires)
        self.ended.put(session.token_id, True)

    def ended_elsewhere(self, token_id: str) -> None:
        """Another process ended this token (accounting/coherence.py)."""
        self.ended.put(token_id, True)

    async def password_changed(self, account_id: str, password_hash: str) -> int | None:
        """Stores the new hash; every earlier token stops working here at once. The new version."""
        version = await self.accounts.change_password(account_id, password_hash)
        self.meter.account_cache.invalidate(account_id)
        return version
