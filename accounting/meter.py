"""The metering service: the pure ledger, limiter inputs and usage buffer wired to their stores.

Decisions (may this call go ahead, what does it cost) are made by metering/*
without I/O; this module only feeds them and persists what they decide:
key and account views from caches, lease refills, batched usage flushes,
heartbeats and lease reclaims. The Meter is the one credit service the rest of
the code talks to; it owns the key budget slices (accounting/budgets.py), the
usage reads (accounting/usage.py), each key's last use (accounting/keys.py) and
this process's usage journal (accounting/journal.py): a record's future says when
it is on disk, and a call is answered only then.
"""

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace

from accounting import journal, unwritten
from accounting.budgets import KeyBudgets
from accounting.keys import AccountView, KeyEntry, LastUsed, entry_of
from accounting.recovery import Recovery
from accounting.usage import UsageReads
from config.settings import Settings
from metering.ledger import Ledger, Reservation
from metering.plans import plan_for
from metering.usage import UsageBuffer
from runtime.cache import LoadingCache
from runtime.flight import single_flight
from runtime.metrics import Metrics
from runtime.state import State
from security.apikeys import KeyVault
from storage.accounts import AccountStore
from storage.budgets import BudgetStore
from storage.clock import now_utc
from storage.keys import KeyStore
from storage.leases import LeaseStore
from storage.usage import UsageStore

log = logging.getLogger("gateway.meter")

REFILL_ATTEMPTS = 4
RENEW_WAIT = 0.5  # seconds a call waits for the heartbeat it asked for (Meter._renewed)
HEARD_WAIT = 2.0  # seconds a key change's answer waits for every other live process to apply it (in_force)
HEARD_POLL = 0.02


def _retrieved(task: asyncio.Future) -> None:
    """Marks a background future's exception as seen (whoever needed the outcome has given up on it)."""
    if not task.cancelled():
        task.exception()


class LeasesExpired(Exception):
    """This process could not renew its heartbeat: it may not spend leases until it can."""


class Meter:
    def __init__(
        self,
        state: State,
        accounts: AccountStore,
        keys: KeyStore,
        usage: UsageStore,
        leases: LeaseStore,
        vault: KeyVault,
        metrics: Metrics,
        budget_store: BudgetStore,
        clock=time.monotonic,
    ):
        # state: the settings now (a reload replaces the plan tiers there); the rest of them never change
        self.state, self.accounts, self.keys, self.usage, self.leases = state, accounts, keys, usage, leases
        settings = state.settings
        self.vault, self.metrics, self.clock = vault, metrics, clock
        self.ledger = Ledger(settings.lease_seconds)
        self.closing = False  # close() began: no reservation from here on, whatever a heartbeat says
        self.buffer = UsageBuffer(settings.buffer_max)
        # Record and batch ids: fixed for the process's life, unlike its lease id (heartbeat), so that a
        # batch retried after registering again keeps its id and is written once.
        self._id_prefix = leases.process_id
        self.reads = UsageReads(settings, usage, self.buffer, self._id_prefix)
        self.key_budgets = KeyBudgets(settings, budget_store, keys, self.reads, leases, clock, self.spawn)
        self.key_cache = LoadingCache(
            self._load_key, settings.key_cache_size, settings.key_cache_ttl, settings.negative_cache_ttl
        )
        self.account_cache = LoadingCache(
            self._load_account, settings.key_cache_size, settings.key_cache_ttl, settings.negative_cache_ttl
        )
        self._beating: dict[str, asyncio.Future] = {}  # the heartbeat under way (heartbeat)
        self._refills: dict[str, asyncio.Future] = {}  # account -> the lease operation (take or give-back) under way
        self._background: set[asyncio.Task] = set()
        self._topups_paused_until = 0.0
        self.last_used = LastUsed(keys)
        self._record_ids = itertools.count()
        self.batch_ready = asyncio.Event()  # FLUSH_BATCH records wait: app/tasks.py flushes now
        self.journal: journal.Journal | None = None  # JOURNAL=on, from start() to close()
        self.recovery = Recovery(usage, leases, metrics)
        self._marked = 0  # the batch (sequence) whose taking the journal holds
        self._flush_lock = asyncio.Lock()
        self.last_flush_ok = time.time()
        # Told of every balance or payment change (here, or elsewhere through coherence), and of every account
        # whose usage a flush has just stored (_stored): alerts/ looks again.
        self.account_listeners: list[Callable[[str], None]] = []

    @property
    def settings(self) -> Settings:
        return self.state.settings

    # --- views from memory -----------------------------------------------------------------
    async def _load_key(self, digest: str) -> KeyEntry | None:
        doc = await self.keys.by_digest(digest)
        return entry_of(doc) if doc else None

    async def _load_account(self, account_id: str) -> AccountView | None:
        doc = await self.accounts.get(account_id)
        return self.view_of(doc) if doc else None

    def view_of(self, doc: dict) -> AccountView:
        basis = doc.get("paid_usd", 0.0) + doc.get("topup_credits", 0) / self.settings.credits_per_usd
        plan = plan_for(basis, self.settings.plan_rules)
        return AccountView(doc["_id"], plan, doc.get("session_version", 0), bool(doc.get("suspended")))

    async def authenticate(self, secret: str) -> KeyEntry | None:
        if len(secret) > 128 or not self.vault.plausible(secret):
            return None  # malformed or made up (bad tag): no cache entry, no database lookup
        return await self.key_cache.get(self.vault.digest(secret))

    def key_revoked(self, digest: str) -> None:
        """Called by the revoke handler before it answers: the key fails from this moment on."""
        entry = self.key_cache.peek(digest)
        if entry is not None:
            self.key_cache.put(digest, replace(entry, revoked=True))
        else:
            self.key_cache.invalidate(digest)

    def key_changed(self, doc: dict) -> None:
        """A key's properties changed (here or, through coherence, elsewhere): the cached entry follows at once,
        and a budget started again elsewhere hears what this process alone knows its keys spent."""
        entry = entry_of(doc)
        if self.key_cache.peek(doc["digest"]) is not None:
            self.key_cache.put(doc["digest"], entry)
        self.key_budgets.heard(entry)

    async def others(self) -> list[str]:
        """The other processes that may be spending (heartbeat within LEASE_TIMEOUT / 2): a key change lists
        them as `unheard` until each has applied it (storage/keys.py)."""
        return await self.leases.live_others(self.settings.lease_timeout / 2)

    async def in_force(self, key_ids: list[int]) -> None:
        """Waits until every process listed on the keys' latest changes has applied them (accounting/coherence.py
        acknowledges), at most HEARD_WAIT: past that, a silent process follows within the coherence lag."""
        deadline = self.clock() + HEARD_WAIT
        while await self.keys.unheard(key_ids) and self.clock() < deadline:
            await asyncio.sleep(HEARD_POLL)

    def heard(self, doc: dict | None) -> None:
        """A key change from elsewhere is applied here: acknowledged if its writer waits for this process."""
        if doc and self.leases.process_id in (doc.get("unheard") or ()):
            self.spawn(self._acknowledge(doc["_id"]))

    async def _acknowledge(self, key_id: int) -> None:
        try:
            await self.keys.heard(key_id, self.leases.process_id)
        except Exception as exc:
            log.debug("could not acknowledge a key change: %s", type(exc).__name__)  # its writer waits HEARD_WAIT

    async def account_view(self, account_id: str) -> AccountView:
        view = await self.account_cache.get(account_id)
        if view is None:
            raise LookupError(account_id)
        return view

    # --- credits -----------------------------------------------------------------------------
    async def reserve(self, account_id: str, most: int, least: int, key: KeyEntry | None = None) -> Reservation | None:
        """Reserves credits for one call from the account and, if the key has one, from its budget; None
        means the account cannot pay for it (402); BudgetExhausted that the key's budget cannot."""
        if key is None:
            return await self._reserve_account(account_id, most, least)
        if key.credit_limit is None:
            reservation = await self._reserve_account(account_id, most, least)
            if reservation is None:
                return None
            # Counted for the key's budget family: a budget set (again) while these calls are in flight counts them.
            tracker = self.key_budgets.tracker(key.budget_id)
            tracker.reserved += reservation.amount
            return Reservation(account_id, reservation.amount, tracker, reservation.purse)
        budget, amount = await self.key_budgets.reserve(key, most, least)
        try:
            reservation = await self._reserve_account(account_id, amount, least)
        except BaseException:
            budget.reserved -= amount
            raise
        if reservation is None:
            budget.reserved -= amount
            return None
        budget.reserved -= amount - reservation.amount  # the account may hold less than the budget did
        return Reservation(account_id, reservation.amount, budget, reservation.purse)

    async def _reserve_account(self, account_id: str, most: int, least: int) -> Reservation | None:
        # Concurrent calls may use up a refill before this one gets its share: ask again until the
        # database says the balance is empty (mark_empty), a few times at most.
        for _ in range(REFILL_ATTEMPTS):
            now = self.clock()
            # Less than `most` (the rest, if at least `least`) only from an account known to have nothing more
            # to lease: a lease running low is refilled first, so that no call is charged less than its price
            # while the balance could pay it (400 calls in flight took a 15-credit rest for an 18-credit call).
            empty = self.ledger.is_known_empty(account_id, now)
            reservation = self.ledger.reserve(account_id, most, least if empty else most, now)
            if reservation is not None:
                if (
                    account_id not in self._refills
                    and now >= self._topups_paused_until
                    and self.ledger.needs_topup(account_id, most, now)
                ):
                    self.spawn(self._topup(account_id, most, least))
                return reservation
            if not self.ledger.usable(now):
                if not await self._renewed():
                    raise LeasesExpired()
                continue
            if empty:
                return None
            await self._refill(account_id, most, least)
        return self.ledger.reserve(account_id, most, least, self.clock())

    async def _refill(self, account_id: str, most: int, least: int) -> None:
        async def take() -> None:
            grant = await self.leases.take(account_id, self.ledger.lease_request(account_id, most), least)
            now = self.clock()
            if grant.amount is None:
                self.ledger.mark_empty(account_id, now)
                if grant.others:
                    self.spawn(self._want(account_id))
            else:
                self.ledger.lease_is(account_id, grant.amount, now, grant.balance, grant.others)

        await self._lease_operation(account_id, take)

    async def _topup(self, account_id: str, most: int, least: int) -> None:
        """A refill off the request path, before the lease runs dry."""
        try:
            await self._refill(account_id, most, least)
        except Exception as exc:
            # Calls go on from what is left; the request path reports the database if it stays down.
            self._topups_paused_until = self.clock() + 1.0
            log.debug("background lease refill failed: %s", type(exc).__name__)

    async def _want(self, account_id: str) -> None:
        try:
            await self.leases.want(account_id)
        except Exception as exc:
            log.debug("could not ask other processes for credits: %s", type(exc).__name__)

    async def give_back(self, account_id: str, give: int) -> None:
        """Returns up to `give` unreserved credits of this process's lease to the account's balance."""

        async def shrink() -> None:
            purse = self.ledger.purses.get(account_id)
            give_now = min(give, purse.available) if purse else 0  # calls may have reserved meanwhile
            if give_now <= 0:
                return
            # Lowered before the write so that calls during it cannot reserve what is going back. If the
            # write fails the lower amount stays: never spend credits that may be back in the balance;
            # close() settles with what the database holds.
            before = purse.leased
            purse.leased -= give_now
            purse.leased = await self.leases.shrink(account_id, before, before - give_now)

        await self._lease_operation(account_id, shrink)

    async def _lease_operation(self, account_id: str, operation) -> None:
        """One take or give-back per account at a time (the compare-and-set guards assume it); callers
        arriving meanwhile wait for the one under way instead of starting their own."""
        await single_flight(self._refills, account_id, operation)

    def settle(self, reservation: Reservation, cost: int) -> int:
        charged = self.ledger.settle(reservation, cost, self.clock())
        self.metrics.credits_charged += charged
        return charged

    def release(self, reservation: Reservation) -> None:
        self.ledger.release(reservation)

    def record(
        self,
        key: KeyEntry,
        endpoint: str,
        status: int,
        credits: int,
        request_id: str,
        replay_of: str | None = None,
        upstream_seconds: float | None = None,
        cache: str | None = None,
        saved: int = 0,
        via: tuple[str, str] | None = None,
        provider: str = "",
    ) -> asyncio.Future | None:
        """One usage record per call; its credits are the charge (0 when not charged). A repeat answered with a
        kept answer (Idempotency-Key) is a record of its own, `replay_of` the first call's request id.
        `upstream_seconds`: the provider's answer time as measured for the latency histogram (kept as `ms`,
        for the portal's per-endpoint percentiles); absent when nothing was forwarded. `cache`: how the answer
        cache answered the call (hit, miss, coalesced, stale; accounting/charged.py), `saved` the credits a cached
        answer was not charged. `via`: how the call came when not over REST, ("mcp", the tool's name). `provider`: the
        provider that produced the answer (a cached one's too); absent when none did. Returns what to await before the
        call is answered (its journal group on disk), or None (JOURNAL=off)."""
        record = self._record(key.account_id, key.key_id, endpoint, status, credits, request_id)
        if replay_of is not None:
            record["replay_of"] = replay_of
        if upstream_seconds is not None:
            record["ms"] = round(upstream_seconds * 1000, 1)
        if cache is not None:
            record["cache"] = cache
        if saved:
            record["saved"] = saved
        if via is not None:
            record["via"], record["tool"] = via
        if provider:
            record["provider"] = provider
        self.last_used.seen[key.key_id] = record["ts"]
        return self._add(record)

    def record_poll(
        self,
        account_id: str,
        key_id: int,
        endpoint: str,
        status: int,
        credits: int,
        request_id: str,
        stream_id: str,
        provider: str = "",
    ) -> asyncio.Future | None:
        """The usage record of a filter rule's or monitor's poll (streams/): a data call made on the account's
        behalf, carrying the rule or monitor it served (`stream_id`) and the provider that answered it."""
        record = self._record(account_id, key_id, endpoint, status, credits, request_id)
        record["stream_id"] = stream_id
        if provider:
            record["provider"] = provider
        return self._add(record)

    def _record(self, account_id: str, key_id: int, endpoint: str, status: int, credits: int, request_id: str):
        ts = now_utc()  # the stores' clock (storage/clock.py), which tests move across a month's end
        # Unique across processes and restarts (the process id is a fresh uuid) without a syscall per call.
        return {
            "_id": f"{self._id_prefix}-{next(self._record_ids):x}",
            "account_id": account_id,
            "key_id": key_id,
            "endpoint": endpoint,
            "ts": ts,
            "credits": credits,
            "status": status,
            "lease": self.leases.process_id,
            "request_id": request_id,
        }

    def _add(self, record: dict) -> asyncio.Future | None:
        # Journal and buffer in the same order, with no await between: a flush batch is a run of the journal.
        durable = self.journal.append(record) if self.journal is not None else None
        self.buffer.add(record)
        if self.buffer.waiting >= self.settings.flush_batch:  # a batch being written does not count
            self.batch_ready.set()
        return durable

    async def add_credits(
        self, account_id: str, credits: int, paid_usd: float = 0.0, topup_credits: int = 0
    ) -> AccountView:
        return self.account_changed(
            account_id, await self.accounts.add_credits(account_id, credits, paid_usd, topup_credits)
        )

    async def apply_debit(self, account_id: str, debit_id: str, credits: int) -> tuple[str, dict | None]:
        """An admin's debit of the unleased balance, once per debit id (storage/accounts.py `debit`)."""
        outcome, doc = await self.accounts.debit(account_id, debit_id, credits)
        if doc is not None:
            self.account_changed(account_id, doc)
        return outcome, doc

    async def apply_credit(self, account_id: str, credit_id: str, credits: int, paid_usd: float) -> AccountView:
        """A settled payment's credits, once per credit id, with the same in-memory effects as add_credits."""
        return self.account_changed(
            account_id, await self.accounts.apply_credit(account_id, credit_id, credits, paid_usd)
        )

    def account_changed(self, account_id: str, doc: dict | None) -> AccountView:
        """The balance or payments of an account changed: new plan at once, and a 402 is no longer remembered."""
        if doc is None:
            raise LookupError(account_id)
        self.ledger.forget_empty(account_id)
        for listener in self.account_listeners:
            listener(account_id)
        view = self.view_of(doc)
        self.account_cache.put(account_id, view)
        return view

    async def balance(self, account_id: str, doc: dict | None = None) -> int:
        """Unleased balance + what this process holds (buffered charges already out) + other processes' leases.

        Every amount comes from the one account document: a lease take or give-back of this process
        may land between the read and now, so adding the in-memory `Purse.leased` to the document's
        `credits` would count the moved credits twice or not at all. Only the spent part is in memory
        (charges never touch the document)."""
        doc = doc or await self.accounts.get(account_id)
        mine = ((doc.get("leases") or {}).get(self.leases.process_id) or {}).get("amount", 0)
        return doc["credits"] + self.ledger.held(account_id, mine) + await self.leases.others_held(account_id, doc)

    # --- persistence ---------------------------------------------------------------------------
    async def flush(self, final: bool = False) -> int:
        """Writes the records buffered when it starts (all of them when `final`), one batch at a time;
        a failed batch stays for the next try."""
        written = 0
        async with self._flush_lock:
            # Records that arrive during the writes wait for the next flush: chasing them would turn
            # the flush interval into back-to-back writes under load.
            due = len(self.buffer)
            while len(self.buffer) and (final or written < due):
                seq, batch = self.buffer.take(self.settings.flush_batch)
                batch_id = f"{self._id_prefix}-{seq}"
                try:
                    if self.journal is not None and self._marked != seq:
                        # On disk before the database sees any of it: a replay then writes these records under
                        # this batch id, and what the database took of it is skipped.
                        await self.journal.taken(batch_id, batch)
                        self._marked = seq
                    await self.usage.insert_batch(batch_id, batch)
                except BaseException:
                    self.metrics.flush_failures += 1  # the same batch is retried as it is
                    raise
                self.buffer.done()
                if self.journal is not None:
                    self.journal.confirmed(batch_id, len(batch))
                self.reads.written(batch)
                self._stored(batch)
                written += len(batch)
                self.metrics.flushes += 1
                self.metrics.flushed_records += len(batch)
            self.last_flush_ok = time.time()
        await self.last_used.store(final)
        return written

    def _stored(self, batch: list[dict]) -> None:
        """Each process sees a balance as the stored figures minus its own unflushed spend, so a crossing may
        become visible only when a flush stores the last spend behind it, after every process last looked. The
        process whose flush comes last sees every other's spend stored: it looks again, so one always does."""
        if self.account_listeners:
            for account_id in {record["account_id"] for record in batch}:
                for listener in self.account_listeners:
                    listener(account_id)

    async def keep_unwritten(self) -> int:
        """Shutdown, the database away until the drain deadline: every buffered record to local disk, batched as
        the flushes would have written them; how many records. The journal holds them already (every group is
        on disk once close() has waited for them): it is left for the next start. Without it,
        accounting/unwritten.py."""
        if self.journal is not None:
            kept, self.journal = self.journal, None  # a record from here on is not journaled, as with JOURNAL=off
            await kept.close(remove=False)
            return len(self.buffer)
        batches = []
        while len(self.buffer):
            seq, batch = self.buffer.take(self.settings.flush_batch)
            batches.append((f"{self._id_prefix}-{seq}", batch))
            self.buffer.done()
        if batches:
            settings = self.settings
            await asyncio.to_thread(unwritten.save, settings.data_dir, settings.mongodb_db, self._id_prefix, batches)
        return sum(len(batch) for _, batch in batches)

    async def write_unwritten(self) -> None:
        """At start and before each reclaim of leases: the usage records processes that are gone left on disk,
        each written once, counted by their leases (accounting/recovery.py)."""
        await self.recovery.write(self.settings, os.path.basename(self.journal.path) if self.journal else None)

    async def start(self) -> None:
        await self.write_unwritten()
        settings = self.settings
        if settings.journal:
            self.journal = journal.Journal(
                settings.data_dir,
                settings.mongodb_db,
                self._id_prefix,
                settings.journal_group_ms,
                settings.journal_group_records,
                self._journaled,
            )
            await asyncio.to_thread(self.journal.open)
        await self.leases.register()
        # Registering is the first heartbeat: spend only until others could consider this process dead
        # (without this, a process whose database went away before its first heartbeat spent forever).
        self.ledger.valid_until = self.clock() + self.settings.lease_timeout / 2
        # Leases of an earlier incarnation of this node are known dead: return them now.
        self.metrics.lease_reclaims += await self.leases.reclaim_dead(self.settings.lease_timeout, same_node_now=True)
        self.spawn(self._backfill())

    def _journaled(self, seconds: float, records: int) -> None:
        self.metrics.journal_fsync.observe("usage", seconds)
        self.metrics.journal_group.observe("usage", records)

    async def _backfill(self) -> None:
        try:
            folded = await self.usage.backfill()
        except Exception as exc:
            log.warning("could not sum older usage buckets for summaries: %s", type(exc).__name__)
            return
        if folded:
            log.info("summed %d usage buckets written before usage totals existed", folded)

    def spawn(self, work) -> None:
        """Runs `work` in the background; close() waits for it."""
        task = asyncio.create_task(work)
        self._background.add(task)  # a reference until done: the loop keeps only weak ones
        task.add_done_callback(self._background.discard)

    async def heartbeat(self) -> None:
        """Proves this process alive, which lets it spend for LEASE_TIMEOUT / 2 more; a loop of its own
        (app/tasks.py), so that no amount of upkeep work can delay it, and calls may ask for one (_renewed):
        one at a time."""
        await single_flight(self._beating, "heartbeat", self._beat)

    async def _beat(self) -> None:
        alive = await self.leases.heartbeat()
        if self.closing:
            return  # a heartbeat answered after close() began must not open the spending window again
        if alive:
            # Spend only while others cannot yet consider us dead.
            self.ledger.valid_until = self.clock() + self.settings.lease_timeout / 2
        else:
            log.error("this process was declared dead and its leases reclaimed; registering again")
            self.ledger.valid_until = 0.0  # nothing more from the old leases while they are put right
            await asyncio.gather(*self._refills.values(), return_exceptions=True)  # under the old id
            await self.leases.wait_reclaimed(self.settings.lease_timeout)
            # The reclaim counted only the usage stored then; this process knows what it really spent.
            for account_id, purse in list(self.ledger.purses.items()):
                await self.leases.settle_reclaimed(account_id, purse.leased, purse.spent)
            # Calls still in flight are not charged (Ledger.settle): their credits went back with the lease.
            self.ledger.purses.clear()
            # Under a new lease id: the usage recorded under the old one must never count against a new lease.
            await self.leases.register_again()
            # Registering is the new id's first heartbeat (as at start).
            self.ledger.valid_until = self.clock() + self.settings.lease_timeout / 2

    async def _renewed(self) -> bool:
        """A call found the spending window closed (this process stood still, or its database is away):
        one heartbeat now for all such calls, instead of 503 until the heartbeat loop comes round."""
        if self.closing:
            return False  # shutting down: a renewal would reopen spending after the final flush; the call gets 503
        renewal = asyncio.ensure_future(self.heartbeat())
        renewal.add_done_callback(_retrieved)  # it may end after this call gave up waiting
        try:
            await asyncio.wait_for(asyncio.shield(renewal), RENEW_WAIT)
        except Exception:
            return False  # the database does not answer in time: the call gets its 503
        return self.ledger.usable(self.clock())

    async def upkeep(self) -> None:
        """Idle surplus back to the balance, idle budget slices back, leases of dead processes reclaimed."""
        for account_id, give in self.ledger.surplus(self.clock(), self.settings.lease_seconds * 3).items():
            await self.give_back(account_id, give)
        self.key_budgets.retire_idle()
        await self.write_unwritten()  # a dead process's journal first: the reclaim then counts its records
        self.metrics.lease_reclaims += await self.leases.reclaim_dead(self.settings.lease_timeout)

    async def close(self) -> None:
        """Shutdown: persist every record, then give every lease and budget slice back."""
        self.closing = True  # no reservation after this point: late calls get 503, even one asking for a heartbeat
        self.ledger.valid_until = 0.0
        # Lease operations under way change amounts that closing must see.
        await asyncio.gather(*self._background, *self._refills.values(), return_exceptions=True)
        self.key_budgets.retire_all()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.flush(final=True)
        if self.journal is not None:  # every record is in the database: nothing for a next start to replay
            done, self.journal = self.journal, None
            await done.close(remove=True)
        for account_id, purse in list(self.ledger.purses.items()):
            if purse.reserved == 0 and await self.leases.close(account_id, purse.leased, purse.spent):
                del self.ledger.purses[account_id]
        await self.leases.deregister()
