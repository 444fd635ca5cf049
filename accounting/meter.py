"""The metering service: the pure ledger, limiter inputs and usage buffer wired to their stores.

Decisions (may this call go ahead, what does it cost) are made by metering/*
without I/O; this module only feeds them and persists what they decide:
key and account views from caches, lease refills, batched usage flushes,
heartbeats and lease reclaims.
"""

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from accounting.cache import LoadingCache
from accounting.metrics import Metrics
from config.settings import Settings
from metering.ledger import Ledger, Reservation
from metering.plans import Plan, plan_for
from metering.usage import UsageBuffer
from security.apikeys import KeyVault
from storage.accounts import AccountStore
from storage.keys import KeyStore
from storage.leases import LeaseStore
from storage.usage import UsageStore

log = logging.getLogger("gateway.meter")

TOUCH_INTERVAL = 5.0  # seconds between writes of keys' last_used_at
REFILL_ATTEMPTS = 4


@dataclass(frozen=True)
class KeyEntry:
    key_id: int
    account_id: str
    revoked: bool


@dataclass(frozen=True)
class AccountView:
    account_id: str
    plan: Plan
    session_version: int = 0  # tokens issued under another version are refused (password change)


class LeasesExpired(Exception):
    """This process could not renew its heartbeat: it may not spend leases until it can."""


class Meter:
    def __init__(
        self,
        settings: Settings,
        accounts: AccountStore,
        keys: KeyStore,
        usage: UsageStore,
        leases: LeaseStore,
        vault: KeyVault,
        metrics: Metrics,
        clock=time.monotonic,
    ):
        self.settings, self.accounts, self.keys, self.usage, self.leases = settings, accounts, keys, usage, leases
        self.vault, self.metrics, self.clock = vault, metrics, clock
        self.ledger = Ledger(settings.lease_seconds)
        self.buffer = UsageBuffer(settings.buffer_max)
        self.key_cache = LoadingCache(
            self._load_key, settings.key_cache_size, settings.key_cache_ttl, settings.negative_cache_ttl
        )
        self.account_cache = LoadingCache(
            self._load_account, settings.key_cache_size, settings.key_cache_ttl, settings.negative_cache_ttl
        )
        self._refills: dict[str, asyncio.Future] = {}  # account -> the lease operation (take or give-back) under way
        self._background: set[asyncio.Task] = set()
        self._topups_paused_until = 0.0
        self._last_used: dict[int, datetime] = {}
        self._record_ids = itertools.count()
        self.batch_ready = asyncio.Event()  # FLUSH_BATCH records wait: app/tasks.py flushes now
        self._touched_at = 0.0
        self._flush_lock = asyncio.Lock()
        self.last_flush_ok = time.time()

    # --- views from memory -----------------------------------------------------------------
    async def _load_key(self, digest: str) -> KeyEntry | None:
        doc = await self.keys.by_digest(digest)
        return KeyEntry(doc["key_id"], doc["account_id"], doc["revoked"]) if doc else None

    async def _load_account(self, account_id: str) -> AccountView | None:
        doc = await self.accounts.get(account_id)
        return self.view_of(doc) if doc else None

    def view_of(self, doc: dict) -> AccountView:
        basis = doc.get("paid_usd", 0.0) + doc.get("topup_credits", 0) / self.settings.credits_per_usd
        return AccountView(doc["_id"], plan_for(basis, self.settings.plan_rules), doc.get("session_version", 0))

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

    async def account_view(self, account_id: str) -> AccountView:
        view = await self.account_cache.get(account_id)
        if view is None:
            raise LookupError(account_id)
        return view

    # --- credits -----------------------------------------------------------------------------
    async def reserve(self, account_id: str, most: int, least: int) -> Reservation | None:
        """Reserves credits for one call; None means the account cannot pay for it (402)."""
        # Concurrent calls may use up a refill before this one gets its share: ask again until the
        # database says the balance is empty (mark_empty), a few times at most.
        for _ in range(REFILL_ATTEMPTS):
            now = self.clock()
            reservation = self.ledger.reserve(account_id, most, least, now)
            if reservation is not None:
                if (
                    account_id not in self._refills
                    and now >= self._topups_paused_until
                    and self.ledger.needs_topup(account_id, most, now)
                ):
                    self.spawn(self._topup(account_id, most, least))
                return reservation
            if not self.ledger.usable(now):
                raise LeasesExpired()
            if self.ledger.is_known_empty(account_id, now):
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
        pending = self._refills.get(account_id)
        if pending is not None:
            return await asyncio.shield(pending)
        future = self._refills[account_id] = asyncio.get_running_loop().create_future()
        try:
            await operation()
            future.set_result(None)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()
            raise
        finally:
            del self._refills[account_id]

    def settle(self, reservation: Reservation, cost: int) -> int:
        charged = self.ledger.settle(reservation, cost, self.clock())
        self.metrics.credits_charged += charged
        return charged

    def release(self, reservation: Reservation) -> None:
        self.ledger.release(reservation)

    def record(self, key: KeyEntry, endpoint: str, status: int, credits: int, request_id: str) -> None:
        """One usage record per call; its credits are the charge (0 when not charged)."""
        ts = datetime.now(UTC)
        # Unique across processes and restarts (the process id is a fresh uuid) without a syscall per call.
        self.buffer.add(
            {
                "_id": f"{self.leases.process_id}-{next(self._record_ids):x}",
                "account_id": key.account_id,
                "key_id": key.key_id,
                "endpoint": endpoint,
                "ts": ts,
                "credits": credits,
                "status": status,
                "lease": self.leases.process_id,
                "request_id": request_id,
            }
        )
        self._last_used[key.key_id] = ts
        if len(self.buffer) >= self.settings.flush_batch:
            self.batch_ready.set()

    async def add_credits(
        self, account_id: str, credits: int, paid_usd: float = 0.0, topup_credits: int = 0
    ) -> AccountView:
        return self.account_changed(
            account_id, await self.accounts.add_credits(account_id, credits, paid_usd, topup_credits)
        )

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
        view = self.view_of(doc)
        self.account_cache.put(account_id, view)
        return view

    async def balance(self, account_id: str, doc: dict | None = None) -> int:
        """Unleased balance + what this process holds (buffered charges already out) + other processes' leases."""
        doc = doc or await self.accounts.get(account_id)
        return doc["credits"] + self.ledger.held(account_id) + await self.leases.others_held(account_id, doc)

    async def usage_of(self, account_id: str, since: datetime, limit: int) -> list[dict]:
        buffered = [r for r in self.buffer.for_account(account_id) if r["ts"] >= since]
        stored = await self.usage.recent(account_id, since, limit)
        seen = {r["_id"] for r in buffered}
        merged = buffered + [r for r in stored if r["_id"] not in seen]
        merged.sort(key=lambda r: r["ts"], reverse=True)
        return merged[:limit]

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
                try:
                    await self.usage.insert_batch(f"{self.leases.process_id}-{seq}", batch)
                except BaseException:
                    self.metrics.flush_failures += 1  # the same batch is retried as it is
                    raise
                self.buffer.done()
                written += len(batch)
                self.metrics.flushes += 1
                self.metrics.flushed_records += len(batch)
            self.last_flush_ok = time.time()
        # last_used_at is informative: written at most every few seconds, not with every batch.
        if final or time.monotonic() - self._touched_at >= TOUCH_INTERVAL:
            await self._touch_keys()
        return written

    async def _touch_keys(self) -> None:
        self._touched_at = time.monotonic()
        last_used, self._last_used = self._last_used, {}
        try:
            await self.keys.touch(last_used)
        except Exception:
            log.warning("could not update last_used_at of %d keys", len(last_used))
            for key_id, ts in last_used.items():
                self._last_used.setdefault(key_id, ts)

    async def start(self) -> None:
        await self.leases.register()
        # Registering is the first heartbeat: spend only until others could consider this process dead
        # (without this, a process whose database went away before its first heartbeat spent forever).
        self.ledger.valid_until = self.clock() + self.settings.lease_timeout / 2
        # Leases of an earlier incarnation of this node are known dead: return them now.
        await self.leases.reclaim_dead(self.settings.lease_timeout, same_node_now=True)

    def spawn(self, work) -> None:
        """Runs `work` in the background; close() waits for it."""
        task = asyncio.create_task(work)
        self._background.add(task)  # a reference until done: the loop keeps only weak ones
        task.add_done_callback(self._background.discard)

    async def maintain(self) -> None:
        """One round of lease upkeep: heartbeat, give back idle surplus, reclaim leases of dead processes."""
        if await self.leases.heartbeat():
            # Spend only while others cannot yet consider us dead.
            self.ledger.valid_until = self.clock() + self.settings.lease_timeout / 2
        else:
            log.error("this process was declared dead and its leases reclaimed; re-registering")
            self.ledger.purses.clear()
            await self.leases.register()
        for account_id, give in self.ledger.surplus(self.clock(), self.settings.lease_seconds * 3).items():
            await self.give_back(account_id, give)
        await self.leases.reclaim_dead(self.settings.lease_timeout)

    async def close(self) -> None:
        """Shutdown: persist every record, then give every lease back."""
        self.ledger.valid_until = 0.0  # no reservation after this point: late calls get 503
        # Lease operations under way change amounts that closing must see.
        await asyncio.gather(*self._background, *self._refills.values(), return_exceptions=True)
        await self.flush(final=True)
        for account_id, purse in list(self.ledger.purses.items()):
            if purse.reserved == 0 and await self.leases.close(account_id, purse.leased, purse.spent):
                del self.ledger.purses[account_id]
        await self.leases.deregister()
