"""Which key a filter rule's polls are the calls of (streams/poller.py): the key the rule was added with, or the
key that one was rolled to (the rules move with the roll); KeyStopped once it is revoked, expired or gone. And
whether a key's budget is another than the one its rules were paused at (they resume then)."""

import time

from accounting.keys import KeyEntry
from accounting.meter import Meter
from storage.streams import StreamStore

ROLLS = 8  # rolls a rule follows from its key to the key in use (a longer chain: the rule stops)
REFERENCES = 100_000  # keys whose digest is remembered (a key's digest never changes)


class KeyStopped(Exception):
    """The rule's key is revoked, expired or gone (and was not rolled to a live key): its rules stop. The reason
    is the exception's argument: key_revoked, key_expired, key_deleted or key_rolled (too many rolls)."""


class RuleKeys:
    def __init__(self, meter: Meter, store: StreamStore):
        self.meter, self.store = meter, store
        self._references: dict[int, dict] = {}  # key id -> its digest and account

    async def live(self, account_id: str, key_id: int) -> KeyEntry:
        """The live key a rule of `key_id` polls with, as the key cache has it (revocations and changes reach
        it from every process): that key, or the key it was rolled to."""
        for _ in range(ROLLS):
            reference = self._references.get(key_id)
            if reference is None:
                reference = await self.meter.keys.reference(key_id)
                if reference is None or reference["account_id"] != account_id:
                    raise KeyStopped("key_deleted")
                if len(self._references) >= REFERENCES:
                    self._references.clear()
                self._references[key_id] = reference
            entry = await self.meter.key_cache.get(reference["digest"])
            if entry is None:
                raise KeyStopped("key_deleted")
            expired = entry.expires_at is not None and time.time() >= entry.expires_at
            if not (entry.revoked or expired):
                return entry
            rolled_to = (await self.meter.keys.reference(key_id) or {}).get("rolled_to")  # read now, not cached
            if rolled_to is None:
                raise KeyStopped("key_revoked" if entry.revoked else "key_expired")
            await self.store.move_key(account_id, key_id, rolled_to)
            key_id = rolled_to
        raise KeyStopped("key_rolled")


def another_budget(now: dict | None, paused_for: dict | None) -> bool:
    """Whether a key's budget now (KeyBudgets.run_of) differs from the one its rules were paused at, for the
    better: removed, a new period, started again, or a higher limit (a lower one would pause them again)."""
    if now is None or paused_for is None:
        return True
    if (now["period"], now["epoch"]) != (paused_for.get("period"), paused_for.get("epoch")):
        return True
    return now["limit"] > paused_for.get("limit", 0)
