"""Credit leases in MongoDB: `accounts.leases.<process id>.amount`, moved atomically.

Every operation is one conditional single-document update, so leases stay
correct with any number of processes and need no transactions. Operations that
set an amount are guarded by the amount they expect (compare-and-set), so a
retry after an uncertain outcome cannot apply twice.
"""

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pymongo import ReturnDocument
from pymongo.asynchronous.database import AsyncDatabase

from storage.accounts import addition
from storage.clock import now_utc
from storage.usage import UsageStore

log = logging.getLogger("gateway.leases")

TAKE_ATTEMPTS = 3  # compare-and-sets of the rest of a balance that other processes keep changing


@dataclass(frozen=True)
class Grant:
    """What one take saw: this process's lease amount after it (None: nothing could be moved), the
    unleased balance left, and how many other processes hold leases on the account."""

    amount: int | None
    balance: int
    others: int


class LeaseStore:
    def __init__(self, db: AsyncDatabase, usage: UsageStore, process_id: str, node: str):
        self.accounts = db.accounts
        self.processes = db.processes
        # {_id: "<process id>:<account id>", counted, at}: what a reclaim counted as spent from a lease, for
        # the process if it comes back (settle_reclaimed). Dropped after a month (storage/db.py).
        self.reclaims = db.lease_reclaims
        self.usage = usage
        self.process_id = process_id
        self.node = node
        self._slot = f"leases.{process_id}.amount"

    async def register(self) -> None:
        await self.processes.insert_one(
            {"_id": self.process_id, "node": self.node, "started_at": now_utc(), "heartbeat_at": now_utc()}
        )

    async def register_again(self) -> None:
        """After this process was declared dead (and its leases settled: settle_reclaimed): the same node
        under a new process id, so that leases taken from now on count only the usage recorded from now on."""
        self.process_id = uuid.uuid4().hex
        self._slot = f"leases.{self.process_id}.amount"
        await self.register()

    async def settle_reclaimed(self, account_id: str, leased: int, spent: int) -> None:
        """This process was declared dead and is back: puts its lease on the account right, knowing exactly
        what it spent from it (`spent`, everything charged, flushed or not)."""
        key = f"{self.process_id}:{account_id}"
        # Read now, consumed last: if a step in between fails, the next try still knows the lease was
        # reclaimed (closing it "as at shutdown" would then charge the spend a second time).
        marker = await self.reclaims.find_one({"_id": key})
        if marker is None:
            await self.close(account_id, leased, spent)  # not reclaimed: returned as at shutdown
            return
        # Reclaimed. A lease under our id now is a take of ours that landed after the reclaim: nothing was
        # spent from it (spending had stopped), so all of it goes back.
        late = await self.amount(account_id)
        if late:
            await self._close(account_id, self.process_id, late, 0)
        # The reclaim counted only the usage stored then and gave the rest back: the calls we had not
        # stored yet were refunded, yet served and recorded. Taken again once (the marker is consumed).
        if await self.reclaims.find_one_and_delete({"_id": key}) is not None and spent > marker["counted"]:
            await self._debit(account_id, spent - marker["counted"])

    async def settle_stored_late(self, lease: str, account_id: str) -> None:
        """Usage of a dead process's lease was stored after the fact (accounting/unwritten.py). If the lease was
        reclaimed meanwhile, the reclaim counted only what was stored then and gave the rest back: the calls
        stored since are taken from the balance, once (the marker is consumed). A lease not reclaimed yet counts
        them when it is."""
        marker = await self.reclaims.find_one_and_delete({"_id": f"{lease}:{account_id}"})
        if marker is not None:
            owed = await self.usage.spent_by_lease(lease, account_id) - marker["counted"]
            if owed > 0:
                await self._debit(account_id, owed)

    async def _debit(self, account_id: str, owed: int) -> None:
        """Takes `owed` credits from the balance, or what is left of it: never below zero."""
        for _ in range(8):
            if await self.accounts.find_one_and_update(
                {"_id": account_id, "credits": {"$gte": owed}}, {"$inc": {"credits": -owed}}, {"_id": 1}
            ):
                return
            doc = await self.accounts.find_one({"_id": account_id}, {"credits": 1})
            left = doc["credits"] if doc else 0
            if left <= 0:
                break
            result = await self.accounts.update_one({"_id": account_id, "credits": left}, {"$inc": {"credits": -left}})
            if result.modified_count:
                owed -= left
                break
        # Counted where `social-gateway reconcile` looks (storage/ledger.py): served, recorded, never paid.
        await self.accounts.update_one(
            {"_id": account_id},
            {"$inc": {"credits_unpaid": owed}, "$push": {"additions": addition("unpaid", owed)}},  # statements list it
        )
        log.warning("account %s: %d credits of calls served around a lease reclaim were not paid", account_id, owed)

    async def heartbeat(self) -> bool:
        """False when this process was declared dead: its leases are being reclaimed, or have been."""
        result = await self.processes.update_one(
            {"_id": self.process_id, "reclaiming": {"$exists": False}}, {"$set": {"heartbeat_at": now_utc()}}
        )
        return result.matched_count == 1

    async def wait_reclaimed(self, longest: float) -> None:
        """Waits (at most `longest` seconds) until the reclaim of this process's leases is over: its
        document is deleted last. Putting a lease right while it is being reclaimed would race the reclaim."""
        deadline = time.monotonic() + longest
        while time.monotonic() < deadline and await self.processes.find_one({"_id": self.process_id}, {"_id": 1}):
            await asyncio.sleep(0.2)

    async def take(self, account_id: str, want: int, least: int) -> Grant:
        """Moves `want` credits (or all that is left, if at least `least`) into this process's lease."""
        update = lambda n: {"$inc": {"credits": -n, self._slot: n}, "$addToSet": {"lease_holders": self.process_id}}
        seen = {"leases": 1, "credits": 1, "lease_holders": 1}
        doc = await self.accounts.find_one_and_update(
            {"_id": account_id, "credits": {"$gte": want}},
            update(want),
            projection=seen,
            return_document=ReturnDocument.AFTER,
        )
        current = None
        for _ in range(TAKE_ATTEMPTS):
            if doc is not None:
                break
            current = await self.accounts.find_one({"_id": account_id}, {"credits": 1, "lease_holders": 1})
            if current is None or current["credits"] < least or current["credits"] <= 0:
                break
            left = current["credits"]
            doc = await self.accounts.find_one_and_update(
                {"_id": account_id, "credits": left},
                update(left),
                projection=seen,
                return_document=ReturnDocument.AFTER,
            )
        # Checked after the loop too: a last compare-and-set that moved the rest must be known, or those credits
        # sit in this process's lease unseen until it closes (three processes kept 619 credits out of reach so).
        if doc is not None:
            return Grant(doc["leases"][self.process_id]["amount"], doc["credits"], self._others(doc))
        return Grant(None, current["credits"] if current else 0, self._others(current or {}))

    def _others(self, doc: dict) -> int:
        return len(set(doc.get("lease_holders") or ()) - {self.process_id})

    async def want(self, account_id: str) -> None:
        """Asks the other holders of the account's leases for their idle credits (accounting/coherence.py)."""
        await self.accounts.update_one(
            {"_id": account_id}, {"$set": {"lease_wanted_at": now_utc(), "lease_wanted_by": self.process_id}}
        )

    async def shrink(self, account_id: str, leased: int, keep: int) -> int:
        """Gives `leased - keep` back to the balance; returns the lease amount now in the database."""
        result = await self.accounts.update_one(
            {"_id": account_id, self._slot: leased}, {"$inc": {"credits": leased - keep}, "$set": {self._slot: keep}}
        )
        if result.modified_count:
            return keep
        return await self.amount(account_id)

    async def amount(self, account_id: str) -> int:
        doc = await self.accounts.find_one({"_id": account_id}, {"leases": 1})
        return ((doc or {}).get("leases") or {}).get(self.process_id, {}).get("amount", 0)

    async def close(self, account_id: str, leased: int, spent: int) -> bool:
        """Ends this process's lease once all its usage is persisted: the unspent rest goes back."""
        if await self._close(account_id, self.process_id, leased, spent):
            return True
        # Our idea of the amount was off (a write with an unknown outcome): close what the database holds.
        amount = await self.amount(account_id)
        return amount == 0 or await self._close(account_id, self.process_id, amount, spent)

    async def _close(self, account_id: str, process_id: str, leased: int, spent: int) -> bool:
        result = await self.accounts.update_one(
            {"_id": account_id, f"leases.{process_id}.amount": leased},
            {
                "$inc": {"credits": leased - spent},
                "$unset": {f"leases.{process_id}": ""},
                "$pull": {"lease_holders": process_id},
            },
        )
        return result.modified_count == 1

    async def reclaim_dead(self, timeout: float, same_node_now: bool = False) -> int:
        """Returns the leases of processes silent for `timeout` seconds (or, at start, of earlier
        incarnations of this node): unspent = lease - that lease's persisted usage."""
        cutoff = datetime.now(UTC) - timedelta(seconds=timeout)
        query = {"_id": {"$ne": self.process_id}, "$or": [{"heartbeat_at": {"$lt": cutoff}}]}
        if same_node_now:
            query["$or"].append({"node": self.node})
        reclaimed = 0
        async for proc in self.processes.find(query, {"_id": 1}):
            dead = proc["_id"]
            # Claimed under the same condition, atomically: a process that has just sent a heartbeat is
            # left alone, and from here on its heartbeats fail (it stops spending and waits for the end).
            claim = await self.processes.update_one({"_id": dead, "$or": query["$or"]}, {"$set": {"reclaiming": True}})
            if not claim.matched_count:
                continue
            async for account in self.accounts.find({"lease_holders": dead}, {"leases": 1}):
                amount = (account.get("leases") or {}).get(dead, {}).get("amount", 0)
                spent = await self.usage.spent_by_lease(dead, account["_id"])
                if await self._close(account["_id"], dead, amount, spent):
                    # What was counted, for the process if it comes back (settle_reclaimed). Only the
                    # reclaim whose close succeeded marks; a crash right here leaves the calls unstored
                    # then uncharged, as a crash of the process itself would.
                    await self.reclaims.update_one(
                        {"_id": f"{dead}:{account['_id']}"}, {"$set": {"counted": spent, "at": now_utc()}}, upsert=True
                    )
                    reclaimed += 1
                    log.warning(
                        "reclaimed lease of dead process %s on account %s: %d back",
                        dead,
                        account["_id"],
                        amount - spent,
                    )
            await self.processes.delete_one({"_id": dead})
        return reclaimed

    async def live_others(self, timeout: float) -> list[str]:
        """The other processes that sent a heartbeat within `timeout` seconds."""
        cutoff = datetime.now(UTC) - timedelta(seconds=timeout)
        query = {"_id": {"$ne": self.process_id}, "heartbeat_at": {"$gte": cutoff}, "reclaiming": {"$exists": False}}
        return [doc["_id"] async for doc in self.processes.find(query, {"_id": 1})]

    async def others_held(self, account_id: str, doc: dict) -> int:
        """Credits other processes still hold for an account (lease minus persisted usage)."""
        others = {p: v["amount"] for p, v in (doc.get("leases") or {}).items() if p != self.process_id}
        total = 0
        for process_id, amount in others.items():
            total += amount - await self.usage.spent_by_lease(process_id, account_id)
        return total

    async def deregister(self) -> None:
        await self.processes.delete_one({"_id": self.process_id})
