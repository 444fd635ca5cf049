"""Filter rules, account monitors and the events their polls found: every query of streams/.

A rule (or monitor) document carries its own poll lease and cursor:

    {_id, account_id, key_id, kind: rule|monitor, tag, value, interval_seconds, status, deleted,
     due_at, poll_seq, claims, since_id, recent_ids, gaps, lease_owner, lease_token, lease_until, ...}

Exactly once, with any number of processes: a process claims due rules with one conditional update
(`lease_until` passed), polls, writes the poll's event under the id `<rule>:<poll_seq>` (a second writer of
the same poll finds the first one's event), then moves the cursor on with a compare-and-set on `poll_seq`
and its own claim token. A process that dies mid-poll leaves the lease to run out; the next claimer redoes
the same `poll_seq` and, finding its event written, delivers that one instead of polling again.
"""

from datetime import UTC, datetime, timedelta

from pymongo import ASCENDING, DESCENDING, IndexModel, UpdateOne
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from storage.caps import Caps
from storage.clock import now_utc
from storage.expiry import Expiry

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ACTIVE, INACTIVE, PAUSED = "active", "inactive", "paused_balance"  # a rule's status
PAUSED_BUDGET = "paused_budget"  # its key's credit budget cannot pay for a poll: until the next period or a raise
SUSPENDED = "suspended"  # its account is suspended by an admin: until it is resumed
LIVE = (ACTIVE, PAUSED, PAUSED_BUDGET, SUSPENDED)  # switched on (is_effect 1), polled or waiting to be


class StreamStore:
    def __init__(self, db: AsyncDatabase, retention_seconds: float):
        self.rules = db.stream_rules
        self.events = db.stream_events
        self.sockets = db.stream_sockets
        self.holders = db.stream_holders
        self.retention = retention_seconds
        self.caps = Caps(db)

    async def ensure_indexes(self, expiry: Expiry) -> None:
        await self.rules.create_indexes(
            [
                IndexModel([("status", ASCENDING), ("due_at", ASCENDING)]),  # the claim
                IndexModel([("account_id", ASCENDING), ("created_at", DESCENDING)]),
                IndexModel([("lease_token", ASCENDING)], sparse=True),
            ]
        )
        await expiry.create_indexes(
            self.events,
            [
                IndexModel([("created_at", ASCENDING)], expireAfterSeconds=int(self.retention)),
                IndexModel([("account_id", ASCENDING), ("created_at", ASCENDING)]),
                IndexModel([("rule_id", ASCENDING), ("created_at", DESCENDING)]),
            ],
        )

    # --- rules, as the API and the portal see them ------------------------------------------------
    async def add(self, doc: dict, cap: int) -> bool:
        """False, nothing written, when the account has `cap` rules (or monitors: the doc's kind) already;
        storage.caps.Held, nothing written, when a monitor of the handle is there (or being added)."""
        base = {"deleted": False, "poll_seq": 0, "claims": 0, "since_id": None, "recent_ids": [], "gaps": []}
        base |= {"lease_owner": None, "lease_token": None, "lease_until": EPOCH, "changed_at": now_utc()}
        account_id, kind = doc["account_id"], doc["kind"]
        counted = {"account_id": account_id, "kind": kind, "deleted": False}
        unique = "user_lower" if kind == "monitor" else None  # one monitor of a handle, concurrent adds too
        return await self.caps.insert(_place(account_id, kind), cap, self.rules, {**base, **doc}, counted, unique)

    async def account_rules(self, account_id: str, kind: str | None = None) -> list[dict]:
        query: dict = {"account_id": account_id, "deleted": False}
        if kind:
            query["kind"] = kind
        return await self.rules.find(query, {"recent_ids": 0}).sort("created_at", DESCENDING).to_list(None)

    async def rule(self, account_id: str, rule_id: str, kind: str | None = None) -> dict | None:
        """The account's rule or monitor; with `kind`, only one of that kind."""
        query = {"_id": rule_id, "account_id": account_id, "deleted": False}
        return await self.rules.find_one(query if kind is None else {**query, "kind": kind})

    async def monitor_of(self, account_id: str, user_name: str) -> dict | None:
        return await self.rules.find_one(
            {"account_id": account_id, "kind": "monitor", "user_lower": user_name.lower(), "deleted": False}
        )

    async def update(self, account_id: str, rule_id: str, fields: dict, supersede: bool = False) -> dict | None:
        """`supersede`: the change starts a new cursor, so a poll in flight must not move it. The next poll gets
        a new `poll_seq` (the one in flight then fails its compare-and-set in `advance`: not charged) and the
        lease is let go, so the new search is polled at its due time. `claims` moves with `poll_seq`: a claim
        left unfinished is still told from one that was superseded."""
        change: dict = {"$set": {**fields, "changed_at": now_utc()}}
        if supersede:
            change["$set"] |= {"lease_owner": None, "lease_token": None, "lease_until": EPOCH}
            change["$inc"] = {"poll_seq": 1, "claims": 1}
        # An update and a read rather than find_one_and_update, which the embedded server makes ten times dearer.
        mine = {"_id": rule_id, "account_id": account_id, "deleted": False}
        if not (await self.rules.update_one(mine, change)).matched_count:
            return None
        return await self.rules.find_one({"_id": rule_id})

    async def delete(self, account_id: str, rule_id: str, kind: str) -> bool:
        """Deletes the account's rule or monitor, only if it is of `kind`; its place under the cap is free."""
        done = await self.rules.update_one(
            {"_id": rule_id, "account_id": account_id, "kind": kind, "deleted": False},
            {"$set": {"deleted": True, "status": INACTIVE, "changed_at": now_utc()}},
        )
        if done.modified_count:
            await self.caps.give_back(_place(account_id, kind), rule_id)
        return bool(done.modified_count)

    # --- the poll lease -------------------------------------------------------------------------------
    async def due(self, now: datetime) -> list[str]:
        """Active rules due and not leased: a range on the claim index, never a sort (the embedded server
        answers a sort by reading every rule)."""
        found = await self.rules.find({"status": ACTIVE, "due_at": {"$lte": now}}, {"lease_until": 1}).to_list(None)
        return [r["_id"] for r in found if r["lease_until"] <= now]

    async def any_due_by(self, until: datetime) -> bool:
        return await self.rules.find_one({"status": ACTIVE, "due_at": {"$lte": until}}, {"_id": 1}) is not None

    async def claim(self, ids: list[str], owner: str, token: str, now: datetime, hold: float) -> list[dict]:
        """Takes those of `ids` still due and unleased (two round trips, however many): each document is
        updated atomically, so processes claiming at once share them out and never take the same one."""
        await self.rules.update_many(
            {"_id": {"$in": ids}, "status": ACTIVE, "due_at": {"$lte": now}, "lease_until": {"$lte": now}},
            {
                "$set": {"lease_owner": owner, "lease_token": token, "lease_until": now + timedelta(seconds=hold)},
                "$inc": {"claims": 1},
            },
        )
        return await self.rules.find({"_id": {"$in": ids}, "lease_token": token}).to_list(None)

    async def advance(self, rule: dict, fields: dict) -> bool:
        """The poll `poll_seq` is done (its event written): the cursor moves on and the lease is let go. False
        when this process no longer held it (its lease ran out and another process took the rule)."""
        done = await self.rules.update_one(
            {"_id": rule["_id"], "poll_seq": rule["poll_seq"], "lease_token": rule["lease_token"]},
            {
                "$set": {**fields, "lease_owner": None, "lease_token": None, "lease_until": EPOCH},
                "$inc": {"poll_seq": 1},
            },
        )
        return bool(done.modified_count)

    async def release(self, rule: dict, due_at: datetime) -> None:
        """A poll that could not run (upstream failure, no credits): tried again at `due_at`, same poll_seq."""
        await self.rules.update_one(
            {"_id": rule["_id"], "lease_token": rule["lease_token"]},
            {"$set": {"lease_owner": None, "lease_token": None, "lease_until": EPOCH, "due_at": due_at}},
        )

    async def let_go(self, owner: str) -> None:
        """A process shutting down: the rules it still holds are free to claim (same poll_seq, same due time)."""
        await self.rules.update_many(
            {"lease_owner": owner}, {"$set": {"lease_owner": None, "lease_token": None, "lease_until": EPOCH}}
        )

    # --- paused for the balance -------------------------------------------------------------------------
    async def set_status(self, account_id: str, before: str, after: str, due_at: datetime | None = None) -> int:
        fields: dict = {"status": after, "changed_at": now_utc()}
        if due_at is not None:
            fields["due_at"] = due_at
        done = await self.rules.update_many(
            {"account_id": account_id, "status": before, "deleted": False}, {"$set": fields}
        )
        return done.modified_count

    # --- suspended with the account, stopped with the key, paused for the key's budget ---------------------
    async def suspend(self, account_id: str) -> None:
        """Every rule switched on waits for the account's resume, remembering the status it had (a poll in
        flight finishes; none starts: the claim takes only active rules)."""
        for status in (ACTIVE, PAUSED, PAUSED_BUDGET):
            await self.rules.update_many(
                {"account_id": account_id, "status": status, "deleted": False},
                {"$set": {"status": SUSPENDED, "suspended_from": status, "changed_at": now_utc()}},
            )

    async def resume(self, account_id: str) -> int:
        """The account's rules back to the status they had when it was suspended; how many."""
        resumed = 0
        for status in (ACTIVE, PAUSED, PAUSED_BUDGET):
            done = await self.rules.update_many(
                {"account_id": account_id, "status": SUSPENDED, "suspended_from": status, "deleted": False},
                {"$set": {"status": status, "changed_at": now_utc()}},
            )
            resumed += done.modified_count
        return resumed

    async def hold_back(self, rule: dict, status: str, fields: dict | None = None) -> bool:
        """A claimed rule that may not be polled (its key stopped or out of budget, its account gone): its status
        set and its lease let go, unless it was switched off or changed meanwhile (then only let go)."""
        free = {"lease_owner": None, "lease_token": None, "lease_until": EPOCH}
        done = await self.rules.update_one(
            {"_id": rule["_id"], "lease_token": rule["lease_token"], "status": ACTIVE},
            {"$set": {**free, **(fields or {}), "status": status, "changed_at": now_utc()}},
        )
        if not done.modified_count:
            await self.rules.update_one({"_id": rule["_id"], "lease_token": rule["lease_token"]}, {"$set": free})
        return bool(done.modified_count)

    async def set_key_status(
        self, account_id: str, key_id: int, before: tuple, after: str, fields: dict | None = None
    ) -> int:
        """The rules of one key from one of the statuses `before` to `after`: how many changed."""
        done = await self.rules.update_many(
            {"account_id": account_id, "key_id": key_id, "status": {"$in": list(before)}, "deleted": False},
            {"$set": {**(fields or {}), "status": after, "changed_at": now_utc()}},
        )
        return done.modified_count

    async def move_key(self, account_id: str, key_id: int, to: int) -> None:
        """A rolled key's rules go on with the key it was rolled to."""
        await self.rules.update_many({"account_id": account_id, "key_id": key_id}, {"$set": {"key_id": to}})

    async def budget_paused(self) -> list[dict]:
        """One rule of each key with rules paused for its budget: its account, key and what it was paused at."""
        found = await self.rules.find(
            {"status": PAUSED_BUDGET, "deleted": False}, {"account_id": 1, "key_id": 1, "paused_for": 1}
        ).to_list(None)
        return list({(r["account_id"], r["key_id"]): r for r in found}.values())

    async def accounts_with(self, status: str) -> list[str]:
        return await self.rules.distinct("account_id", {"status": status, "deleted": False})

    async def live_rules(self, account_id: str) -> list[dict]:
        """Rules that poll, or would poll after a top-up: what the next hour costs."""
        return await self.rules.find(
            {"account_id": account_id, "status": {"$in": [ACTIVE, PAUSED]}, "deleted": False},
            {"interval_seconds": 1, "kind": 1, "status": 1},
        ).to_list(None)

    # --- events -----------------------------------------------------------------------------------------
    async def write_event(self, doc: dict) -> tuple[dict, bool]:
        """The poll's event, once: (the stored event, True if this call wrote it)."""
        try:
            await self.events.insert_one(doc)
            return doc, True
        except DuplicateKeyError:
            return await self.events.find_one({"_id": doc["_id"]}), False

    async def event(self, event_id: str) -> dict | None:
        return await self.events.find_one({"_id": event_id})

    async def events_after(self, account_id: str, after: datetime, after_id: str | None, limit: int) -> list[dict]:
        """An account's events after a point (a reconnecting socket's resume), oldest first."""
        query: dict = {"account_id": account_id, "created_at": {"$gte": after}}
        found = await self.events.find(query).sort([("created_at", ASCENDING), ("_id", ASCENDING)]).to_list(limit)
        if after_id is None:
            return found
        return [e for e in found if (e["created_at"], e["_id"]) > (after, after_id)]

    async def recent_ids(self, since: datetime, accounts: list[str]) -> list[str]:
        """The ids of these accounts' events written since `since` (the tail that feeds this process's sockets:
        it reads the same overlap many times, so it reads ids and fetches only the events it has not seen)."""
        query = {"created_at": {"$gte": since}, "account_id": {"$in": accounts}}
        found = await self.events.find(query, {"_id": 1}).to_list(None)
        return [e["_id"] for e in found]

    async def events_by_id(self, ids: list[str]) -> list[dict]:
        return await self.events.find({"_id": {"$in": ids}}).sort("created_at", ASCENDING).to_list(None)

    async def rule_events(self, rule_id: str, limit: int) -> list[dict]:
        return await self.events.find({"rule_id": rule_id}).sort("created_at", DESCENDING).to_list(limit)

    # --- one socket per key, across processes -------------------------------------------------------------
    # A key's hold names its socket and the process serving it; a process renews one document of its own
    # (`stream_holders`) for all its sockets, so a thousand sockets cost one write per beat, not a thousand.
    async def beat(self, holder: str) -> None:
        await self.holders.update_one({"_id": holder}, {"$set": {"beat_at": now_utc()}}, upsert=True)

    async def forget(self, holder: str) -> None:
        """A process stopping: its holds are free at once."""
        await self.holders.delete_one({"_id": holder})

    async def take_socket(self, key_id: int, conn_id: str, holder: str, stale: datetime) -> dict | None:
        """Registers the key's socket unless a live one holds it (its process renewed since `stale`): None when
        refused, else what the key's last socket handed over when its process drained (`hand_over`), or {}."""
        held = await self.sockets.find_one({"_id": key_id})
        if held is None:
            try:
                await self.sockets.insert_one({"_id": key_id, "conn_id": conn_id, "holder": holder})
            except DuplicateKeyError:  # another socket of the key, just now
                return None
            return {}
        if await self.holders.find_one({"_id": held.get("holder"), "beat_at": {"$gte": stale}}):
            return None
        taken = await self.sockets.update_one(  # the dead process's hold, unless another socket took it first
            {"_id": key_id, "conn_id": held["conn_id"]},
            {"$set": {"conn_id": conn_id, "holder": holder}, "$unset": {"handed": ""}},
        )
        return held.get("handed", {}) if taken.modified_count else None

    async def hand_over(self, handed: list[tuple[int, str, dict]]) -> None:
        """A draining process's sockets, (key id, conn id, what its client had): kept on each key's hold for the
        socket that resumes it in another process (the holder is forgotten, so the hold is free)."""
        if handed:
            updates = [UpdateOne({"_id": k, "conn_id": c}, {"$set": {"handed": h}}) for k, c, h in handed]
            await self.sockets.bulk_write(updates, ordered=False)

    async def drop_socket(self, key_id: int, conn_id: str) -> None:
        await self.sockets.delete_one({"_id": key_id, "conn_id": conn_id})


def _place(account_id: str, kind: str) -> str:
    """The account's places under its cap of rules, or of monitors (storage/caps.py)."""
    return f"stream_rules:{kind}:{account_id}"
