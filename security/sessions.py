"""Session tokens as authentication sees them: issued for a person acting for an account, read back with their
signature, expiry and claims checked, and the memory of the tokens ended before their expiry (POST /auth/logout,
here, or in another process: accounting/coherence.py tells). This process knows an ending at once; a "not ended"
answer is remembered per token for NEGATIVE_CACHE_TTL. Whether the person and their membership still hold needs
the stores: services/sessions.py, built on this."""

from collections.abc import Awaitable, Callable

from config.settings import Settings
from runtime.cache import LoadingCache
from security import tokens
from security.tokens import Session


class SessionTokens:
    def __init__(self, settings: Settings, is_ended: Callable[[str], Awaitable[bool]]):
        # is_ended: whether a token id was ended, as the database knows it (storage/sessions.py)
        self.settings = settings
        self.ended = LoadingCache(
            is_ended, settings.key_cache_size, settings.token_ttl_seconds, settings.negative_cache_ttl
        )

    def issue(self, person_id: str, version: int, account_id: str | None = None) -> str:
        s = self.settings
        return tokens.issue(s.jwt_secret, person_id, s.token_ttl_seconds, version=version, account_id=account_id)

    def read(self, token: str) -> Session | None:
        """The token's claims if it is signed by this service, unexpired and well-formed, else None."""
        return tokens.session_of(self.settings.jwt_secret, token)

    async def was_ended(self, session: Session) -> bool:
        """The token was ended before its expiry (a token without an id cannot be ended alone)."""
        return session.token_id is not None and await self.ended.get(session.token_id)

    def ended_here(self, token_id: str) -> None:
        self.ended.put(token_id, True)

    def ended_elsewhere(self, token_id: str) -> None:
        """Another process ended this token (accounting/coherence.py)."""
        self.ended.put(token_id, True)
