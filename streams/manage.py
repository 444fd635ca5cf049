"""The streams service: reading, creating, changing and removing rules and monitors, shared by the
provider-compatible API and the portal (handlers/streams/): the account's limits, what switching on means (polls
from now, never the past), each rule's row with its cost per day, and its recent events."""

import asyncio
import secrets
import time
import zlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from config.settings import Settings
from runtime.state import State
from storage.caps import Held
from storage.streams import ACTIVE, INACTIVE, LIVE, StreamStore
from streams import rules as polls

HELD_LOOKS = 40  # x 0.05 s: how long an add waits for a concurrent add of the same handle to insert its monitor


class LimitReached(Exception):
    """The account has as many rules (or monitors) as STREAM_MAX_RULES (STREAM_MAX_MONITORS) allows."""


class Manager:
    def __init__(self, settings: Settings, store: StreamStore, state: State, switched_on: Callable[[], None]):
        # switched_on: the poller looks for due polls at once (Poller.nudge)
        # state: the prices now (a reload replaces them there)
        self.settings, self.store, self.state, self.switched_on = settings, store, state, switched_on

    async def add(
        self,
        account_id: str,
        key_id: int,
        kind: str,
        tag: str,
        value: str,
        interval: float,
        active: bool,
        created_by: dict | None = None,  # the member who added it in the portal; none through an API key
    ) -> dict:
        limit = self.settings.stream_max_rules if kind == "rule" else self.settings.stream_max_monitors
        now = datetime.now(UTC)
        doc = {
            "_id": ("fr_" if kind == "rule" else "mo_") + secrets.token_hex(8),
            "account_id": account_id,
            "key_id": key_id,  # whose usage records its polls carry (0: made in the portal)
            "kind": kind,
            "tag": tag,
            "value": value,
            "interval_seconds": interval,
            "status": INACTIVE,
            "created_at": now,
            "due_at": now,
            "since_time": int(time.time()),
            "created_by": created_by,
        }
        if kind == "monitor":
            doc["user_name"], doc["user_lower"] = value, value.lower()
        if active:
            doc |= _switched_on(doc["_id"], interval)
        try:
            fits = await self.store.add(doc, limit)  # the cap holds under concurrent adds (storage/caps.py)
        except Held as held:  # a monitor of this handle exists, or is being added this moment: that one
            return await self._same_monitor(account_id, held.item_id, active)
        if not fits:
            noun = "filter rules" if kind == "rule" else "monitored accounts"
            raise LimitReached(f"An account may have {limit} {noun}; delete one first")
        if active:
            self.switched_on()
        return doc

    async def rules(self, account_id: str, kind: str | None = None) -> list[dict]:
        """The account's rules and monitors (of `kind`, if given)."""
        return await self.store.account_rules(account_id, kind)

    async def rule(self, account_id: str, rule_id: str) -> dict | None:
        """The account's rule or monitor; None for another account's."""
        return await self.store.rule(account_id, rule_id)

    async def monitor_of(self, account_id: str, user_name: str) -> dict | None:
        """The account's monitor of this handle (any case)."""
        return await self.store.monitor_of(account_id, user_name)

    async def delete(self, account_id: str, rule_id: str, kind: str) -> bool:
        """Deletes the account's rule or monitor, only if it is of `kind`; its place under the limit is free."""
        return await self.store.delete(account_id, rule_id, kind)

    async def events(self, rule_id: str, limit: int) -> list[dict]:
        """A rule's recent events, newest first."""
        return await self.store.rule_events(rule_id, limit)

    async def _same_monitor(self, account_id: str, monitor_id: str, active: bool) -> dict:
        """Adding a handle monitored already is the same monitor (switched on when asked). A concurrent add holds
        its place an instant before its insert: looked for a little while, then refused as being added."""
        for _ in range(HELD_LOOKS):
            found = await self.change(account_id, monitor_id, {}, True if active else None, "monitor")
            if found is not None:
                return found
            await asyncio.sleep(0.05)
        raise LimitReached("This account is being added as a monitor this moment; try again")

    async def change(
        self, account_id: str, rule_id: str, fields: dict, active: bool | None, kind: str | None = None
    ) -> dict | None:
        """Changes a rule; `active` True switches it on (polled from now: nothing from before is delivered,
        whatever it delivered before it was switched off), False off, None leaves it as it is. None, nothing
        changed, when the account has no such rule (of `kind`, if given)."""
        current = await self.store.rule(account_id, rule_id, kind)
        if current is None:
            return None
        changed = dict(fields)
        if "value" in changed and changed["value"] != current["value"]:
            changed |= {"since_id": None, "recent_ids": [], "gaps": [], "since_time": int(time.time())}  # a new search
        if active is True and current["status"] == INACTIVE:
            changed |= _switched_on(rule_id, changed.get("interval_seconds", current["interval_seconds"]))
        elif active is False:
            changed["status"] = INACTIVE
        # A new cursor supersedes a poll in flight: its end must not write the old search's cursor back.
        done = await self.store.update(account_id, rule_id, changed, supersede="since_time" in changed)
        self.switched_on()
        return done

    def row(self, rule: dict) -> dict:
        """A rule or monitor as the portal shows it: its state and what it costs a day at its interval."""
        per_day = polls.polls_per_day(rule["interval_seconds"])
        least = polls.least_cost(self.state.prices)
        return {
            "rule_id": rule["_id"],
            "kind": rule["kind"],
            "tag": rule["tag"],
            "value": rule["value"],
            "interval_seconds": rule["interval_seconds"],
            "is_effect": 1 if rule["status"] in LIVE else 0,
            "status": rule["status"],
            "polls_per_day": per_day,
            "cost_per_day_credits": per_day * least,
            "cost_per_day_usd": round(per_day * least / self.settings.credits_per_usd, 4),
            "cost_note": "the least a day costs (every poll finding nothing); each new tweet adds its price",
            "polled_at": rule.get("polled_at"),
            "created_at": rule["created_at"],
        }


def _switched_on(rule_id: str, interval: float) -> dict:
    """A rule switched on delivers from now on. Its first poll is due at a point of its first interval fixed
    by its id: rules switched on together (a client looping over its rules) would otherwise poll in the same
    second at every interval, and each of those seconds is late for all of them. A poll at once would find
    nothing anyway (nothing from before is delivered): the first tweets come no later than with it."""
    now = datetime.now(UTC)
    return {
        "status": ACTIVE,
        "due_at": now + timedelta(seconds=interval * zlib.crc32(rule_id.encode()) / 2**32),
        "since_id": None,
        "recent_ids": [],
        "gaps": [],
        "since_time": int(time.time()),
    }
