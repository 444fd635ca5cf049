"""The metering service: the pure ledger, limiter inputs and usage buffer wired to their stores.

Decisions (may this call go ahead, what does it cost) are made by metering/*
without I/O; this module only feeds them and persists what they decide:
key and account views from caches, lease refills, batched usage flushes,
heartbeats and lease reclaims.
"""

import asyncio
import functools
import ipaddress
import itertools
import logging
import math
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from accounting.cache import LoadingCache
from accounting.metrics import Metrics
from config.settings import Settings
from metering.ledger import Budget, Ledger, Reservation, budget_period
from metering.plans import Plan, plan_for
from metering.usage import UsageBuffer
from security.apikeys import KeyVault
from social.endpoints import scope_of
from storage.accounts import AccountStore
from storage.budgets import BudgetStore
from storage.keys import KeyStore
from storage.leases import LeaseStore
from storage.usage import UsageStore, is_error

log = logging.getLogger("gateway.meter")

TOUCH_INTERVAL = 5.0  # seconds between checks for keys whose last_used_at is due
# The stored last_used_at is the minute of a key's newest use: a busy key costs the database one write a
# minute, not one every TOUCH_INTERVAL (rewriting 300 busy keys every 5 s was ~85 % of the database's CPU
# under load), and the keys of one minute are written by one statement. GET /keys shows the exact newest
# use this process has seen (last_used_at()), the stored minute otherwise.
LAST_USED_GRANULARITY = 60.0
REFILL_ATTEMPTS = 4
ADDRESS_MEMO = 1024  # client addresses remembered per key with allowed_ips
BUDGET_ATTEMPTS = 64  # each attempt either reserves, takes a slice of at least one credit, or finds none left


@dataclass(frozen=True)
class KeyEntry:
    """A key as the data plane checks it; restrictions are pre-parsed once per load (None: unrestricted)."""

    key_id: int
    account_id: str
    revoked: bool
    expires_at: float | None = None  # epoch seconds
    networks: tuple | None = None  # allowed_ips as ip_network objects
    scope: frozenset[str] | None = None  # the data paths allowed_endpoints permits
    credit_limit: int | None = None
    period: str | None = None  # credit_limit_period: day | month | total
    budget_id: int = 0  # shared by a key and the keys rolled from it
    budget_epoch: int = 0  # changes when the budget starts again or changes period (storage/budgets.py)
    # client address -> allowed, for keys with allowed_ips: a dict lookup per call instead of parsing
    # the address and testing each network (bounded; a new entry per key change starts it afresh).
    verdicts: dict = field(default_factory=dict, compare=False, repr=False)

    def allows(self, address: str, parse) -> bool:
        """Whether a call from `address` may use this key; `parse` turns it into an address object (or None)."""
        verdict = self.verdicts.get(address)
        if verdict is None:
            parsed = parse(address)
            verdict = parsed is not None and any(parsed in network for network in self.networks)
            if len(self.verdicts) >= ADDRESS_MEMO:
                self.verdicts.clear()
            self.verdicts[address] = verdict
        return verdict


def entry_of(doc: dict) -> KeyEntry:
    expires = doc.get("expires_at")
    ips, endpoints = doc.get("allowed_ips"), doc.get("allowed_endpoints")
    return KeyEntry(
        doc["key_id"],
        doc["account_id"],
        doc["revoked"],
        expires.timestamp() if expires is not None else None,
        tuple(ipaddress.ip_network(n) for n in ips) if ips is not None else None,
        scope_of(endpoints) if endpoints is not None else None,
        doc.get("credit_limit"),
        doc.get("credit_limit_period"),
        doc.get("budget_id", doc["key_id"]),
        doc.get("budget_epoch", 0),
    )


class BudgetExhausted(Exception):
    """The key's credit budget for the period cannot pay for the call (402, not the balance)."""


@dataclass(frozen=True)
class AccountView:
    account_id: str
    plan: Plan
    session_version: int = 0  # tokens issued under another version are refused (password change)


class LeasesExpired(Exception):
    """This process could not renew its heartbeat: it may not spend leases until it can."""


def _started_within(epoch: int, since_day: str) -> bool:
    """Whether a budget run that started at `epoch` (ms; 0: with its key) started within the period that
    began on `since_day` ("" for `total`). A run older than the period spent all of it through slices."""
    if not epoch:
        return False
    return not since_day or epoch >= datetime.fromisoformat(since_day).replace(tzinfo=UTC).timestamp() * 1000


async def single_flight(under_way: dict, key, operation) -> None:
    """Runs `operation` unless one is under way for `key` in `under_way`, in which case it waits for that
    one instead; the registry holds the future while it runs (close() waits for what it holds)."""
    pending = under_way.get(key)
    if pending is not None:
        return await asyncio.shield(pending)
    future = under_way[key] = asyncio.get_running_loop().create_future()
    try:
        await operation()
        future.set_result(None)
    except BaseException as exc:
        future.set_exception(exc)
        future.exception()  # retrieved: no "exception never retrieved" when nobody waited
        raise
    finally:
        del under_way[key]


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
        budget_store: BudgetStore,
        clock=time.monotonic,
    ):
        self.settings, self.accounts, self.keys, self.usage, self.leases = settings, accounts, keys, usage, leases
        self.budget_store = budget_store
        # (budget id, limit, period) -> this process's slice. Keys rolled from one another share a budget
        # id and may carry different limits: each checks its own against the shared spend.
        self.budgets: dict[tuple, Budget] = {}
        self._budget_takes: dict[tuple, asyncio.Future] = {}
        self._periods: dict[str, tuple[str, str]] = {}
        self._periods_until = 0.0
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
        self._last_used: dict[int, datetime] = {}  # newest use of each key in the last two minutes
        self._written: dict[int, datetime] = {}  # the minute this process last stored, per key
        self._record_ids = itertools.count()
        # Record and batch ids: fixed for the process's life, unlike its lease id (maintain), so that a
        # batch retried after registering again keeps its id and is written once.
        self._id_prefix = leases.process_id
        self.batch_ready = asyncio.Event()  # FLUSH_BATCH records wait: app/tasks.py flushes now
        self._touched_at = 0.0
        self._flush_lock = asyncio.Lock()
        self.last_flush_ok = time.time()

    # --- views from memory -----------------------------------------------------------------
    async def _load_key(self, digest: str) -> KeyEntry | None:
        doc = await self.keys.by_digest(digest)
        return entry_of(doc) if doc else None

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

    def key_changed(self, doc: dict) -> None:
        """A key's properties changed (here or, through coherence, elsewhere): the cached entry follows at once."""
        if self.key_cache.peek(doc["digest"]) is not None:
            self.key_cache.put(doc["digest"], entry_of(doc))

    async def account_view(self, account_id: str) -> AccountView:
        view = await self.account_cache.get(account_id)
        if view is None:
            raise LookupError(account_id)
        return view

    # --- credits -----------------------------------------------------------------------------
    async def reserve(self, account_id: str, most: int, least: int, key: KeyEntry | None = None) -> Reservation | None:
        """Reserves credits for one call from the account and, if the key has one, from its budget; None
        means the account cannot pay for it (402); BudgetExhausted that the key's budget cannot."""
        if key is None or key.credit_limit is None:
            return await self._reserve_account(account_id, most, least)
        budget, amount = await self._reserve_budget(key, most, least)
        try:
            reservation = await self._reserve_account(account_id, amount, least)
        except BaseException:
            budget.reserved -= amount
            raise
        if reservation is None:
            budget.reserved -= amount
            return None
        budget.reserved -= amount - reservation.amount  # the account may hold less than the budget did
        return replace(reservation, budget=budget)

    async def _reserve_budget(self, key: KeyEntry, most: int, least: int) -> tuple[Budget, int]:
        period, since_day = self._period(key.period)
        # A new period or a changed limit is a new slot; the old one goes back once idle (maintain).
        slot = (key.budget_id, key.credit_limit, period, key.budget_epoch)
        budget = self.budgets.get(slot)
        if budget is None:
            budget = self.budgets[slot] = Budget(key.budget_id, period, key.credit_limit, key.budget_epoch)
        for _ in range(BUDGET_ATTEMPTS):
            now = self.clock()
            empty = budget.empty_until > now
            # Less than a full call is accepted only once the budget has nothing more to give (the account's
            # rule for its last credits): a slice running low is topped up first, not charged short.
            amount = budget.reserve(most, least if empty else most, now)
            if amount:
                return budget, amount
            if empty:
                break
            await self._take_slice(key, budget, slot, most, since_day)
        raise BudgetExhausted()

    def _period(self, kind: str) -> tuple[str, str]:
        """budget_period for now, recomputed once a second rather than per call."""
        now = time.time()
        if now >= self._periods_until:
            self._periods = {k: budget_period(k, datetime.fromtimestamp(now, UTC)) for k in ("day", "month", "total")}
            self._periods_until = math.floor(now) + 1.0
        return self._periods[kind]

    async def _take_slice(self, key: KeyEntry, budget: Budget, slot: tuple, most: int, since_day: str) -> None:
        """One take per slot at a time; callers arriving meanwhile wait for it."""

        async def take() -> None:
            spent_so_far = None
            if _started_within(budget.epoch, since_day):
                # Set (again) during this period: its keys may have spent before, outside any budget document.
                spent_so_far = functools.partial(self._spent_by_budget, key.account_id, budget.budget_id, since_day)
            grant = await self.budget_store.take(
                budget.budget_id,
                budget.period,
                budget.limit,
                budget.slice_request(most),
                most,
                spent_so_far,
                budget.epoch,
            )
            if grant:
                budget.granted += grant
            else:
                budget.empty_until = self.clock() + 1.0

        await single_flight(self._budget_takes, slot, take)

    def _retire(self, budget: Budget) -> None:
        """Gives back what this process holds unreserved of a budget it stops spending from."""
        give = budget.available
        if give > 0:
            budget.granted -= give
            self.spawn(self._give_budget_back(budget.budget_id, budget.period, give, budget.epoch))

    async def _give_budget_back(self, budget_id: int, period: str, give: int, epoch: int) -> None:
        try:
            await self.budget_store.give_back(budget_id, period, give, epoch)
        except Exception as exc:
            # The credits stay counted as taken: the budget under-spends, it never overspends.
            log.warning("could not give back %d credits of key budget %s: %s", give, budget_id, type(exc).__name__)

    async def _spent_by_budget(self, account_id: str, budget_id: int, since_day: str) -> int:
        """What the keys of a budget spent since `since_day`, stored and buffered here: the start of a
        budget document for a period (other processes' unflushed records are not seen; README)."""
        members = set(await self.keys.budget_members(budget_id))
        rows = await self.usage_summary(account_id, since_day, ("key_id",))
        return sum(row[1] for (key_id,), row in rows.items() if key_id in members)

    async def _reserve_account(self, account_id: str, most: int, least: int) -> Reservation | None:
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
        await single_flight(self._refills, account_id, operation)

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
                "_id": f"{self._id_prefix}-{next(self._record_ids):x}",
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
        if self.buffer.waiting >= self.settings.flush_batch:  # a batch being written does not count
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
        """Unleased balance + what this process holds (buffered charges already out) + other processes' leases.

        Every amount comes from the one account document: a lease take or give-back of this process
        may land between the read and now, so adding the in-memory `Purse.leased` to the document's
        `credits` would count the moved credits twice or not at all. Only the spent part is in memory
        (charges never touch the document)."""
        doc = doc or await self.accounts.get(account_id)
        mine = ((doc.get("leases") or {}).get(self.leases.process_id) or {}).get("amount", 0)
        return doc["credits"] + self.ledger.held(account_id, mine) + await self.leases.others_held(account_id, doc)

    async def usage_summary(self, account_id: str, since_day: str, group_by: tuple[str, ...]) -> dict[tuple, list]:
        """(group values) -> [calls, credits, errors] from `since_day` (an ISO date, "" for all): stored
        totals plus this process's buffered calls, each call counted once."""
        buffered = self.buffer.with_batches(account_id, self.settings.flush_batch)
        # The buckets the buffered records are (or will be) written to: their stored totals are skipped,
        # the records counted instead, whether or not a flush writes them meanwhile.
        pid = self.leases.process_id
        skip = {f"{pid}-{seq}:{account_id}:{r['ts'].date().isoformat()}" for seq, r in buffered}
        out = await self.usage.summary(account_id, since_day, group_by, skip)
        for _, r in buffered:
            day = r["ts"].date().isoformat()
            if day >= since_day:
                values = {"day": day, "endpoint": r["endpoint"], "key_id": r["key_id"]}
                row = out.setdefault(tuple(values[name] for name in group_by), [0, 0, 0])
                row[0] += 1
                row[1] += r["credits"]
                row[2] += is_error(r["status"])
        return out

    async def credits_used(self, account_id: str, keys: list[dict]) -> dict[int, int]:
        """Per key: what its budget (the key and keys rolled from it) spent in the key's credit_limit_period,
        the current UTC month for keys without a budget."""
        if not keys:
            return {}
        now = datetime.now(UTC)
        since = {k["key_id"]: budget_period(k.get("credit_limit_period") or "month", now)[1] for k in keys}
        by_key: dict[int, list[tuple[str, int]]] = {}
        for (day, key_id), row in (
            await self.usage_summary(account_id, min(since.values()), ("day", "key_id"))
        ).items():
            by_key.setdefault(key_id, []).append((day, row[1]))
        members: dict[int, list[int]] = {}
        for k in keys:
            members.setdefault(k.get("budget_id", k["key_id"]), []).append(k["key_id"])
        return {
            k["key_id"]: sum(
                credits
                for member in members[k.get("budget_id", k["key_id"])]
                for day, credits in by_key.get(member, ())
                if day >= since[k["key_id"]]
            )
            for k in keys
        }

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
                    await self.usage.insert_batch(f"{self._id_prefix}-{seq}", batch)
                except BaseException:
                    self.metrics.flush_failures += 1  # the same batch is retried as it is
                    raise
                self.buffer.done()
                written += len(batch)
                self.metrics.flushes += 1
                self.metrics.flushed_records += len(batch)
            self.last_flush_ok = time.time()
        # last_used_at is informative: checked every TOUCH_INTERVAL, a key written once a minute at most.
        if final or time.monotonic() - self._touched_at >= TOUCH_INTERVAL:
            await self._touch_keys()
        return written

    def last_used_at(self, key_id: int) -> datetime | None:
        """The newest use of a key this process knows of, written or not."""
        return self._last_used.get(key_id) or self._written.get(key_id)

    async def _touch_keys(self) -> None:
        """Stores the minute of each key's newest use, for keys whose stored minute is older."""
        self._touched_at = time.monotonic()
        # Uses older than two minutes are in the database (or their write failed and is retried below
        # until it works: a failed write leaves `_written` as it was, so the key stays due).
        horizon = datetime.now(UTC) - timedelta(seconds=2 * LAST_USED_GRANULARITY)
        due = {}
        for key_id, ts in self._last_used.items():
            minute = ts.replace(second=0, microsecond=0)
            written = self._written.get(key_id)
            if written is None or minute > written:
                due[key_id] = minute
        if due:
            try:
                await self.keys.touch(due)
            except Exception:
                log.warning("could not update last_used_at of %d keys", len(due))
                return
            self._written.update(due)
        self._last_used = {k: ts for k, ts in self._last_used.items() if ts >= horizon}
        self._written = {k: m for k, m in self._written.items() if m >= horizon}

    async def start(self) -> None:
        await self.leases.register()
        # Registering is the first heartbeat: spend only until others could consider this process dead
        # (without this, a process whose database went away before its first heartbeat spent forever).
        self.ledger.valid_until = self.clock() + self.settings.lease_timeout / 2
        # Leases of an earlier incarnation of this node are known dead: return them now.
        await self.leases.reclaim_dead(self.settings.lease_timeout, same_node_now=True)
        self.spawn(self._backfill())

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

    async def maintain(self) -> None:
        """One round of lease upkeep: heartbeat, give back idle surplus, reclaim leases of dead processes."""
        if await self.leases.heartbeat():
            # Spend only while others cannot yet consider us dead.
            self.ledger.valid_until = self.clock() + self.settings.lease_timeout / 2
        else:
            # Under a new lease id: the usage recorded under the old one was counted when its leases were
            # reclaimed, and must not count again against a new lease (storage/leases.py reclaim_dead).
            # Calls still in flight were counted as unspent by the reclaim: they are not charged (Ledger.settle).
            log.error("this process was declared dead and its leases reclaimed; registering again")
            await asyncio.gather(*self._refills.values(), return_exceptions=True)  # under the old id
            self.ledger.purses.clear()
            await self.leases.register_again()
        for account_id, give in self.ledger.surplus(self.clock(), self.settings.lease_seconds * 3).items():
            await self.give_back(account_id, give)
        self._retire_idle_budgets()
        await self.leases.reclaim_dead(self.settings.lease_timeout)

    def _retire_idle_budgets(self) -> None:
        """Slices of budgets idle for 3 lease windows (or of a past period) go back for other processes."""
        now, today = self.clock(), datetime.now(UTC)
        current = {budget_period(kind, today)[0] for kind in ("day", "month", "total")}
        for slot, budget in list(self.budgets.items()):
            if (
                budget.reserved == 0
                and slot not in self._budget_takes  # a take under way grants to this very slot
                and (now - budget.last_used > self.settings.lease_seconds * 3 or budget.period not in current)
            ):
                del self.budgets[slot]
                if budget.period in current:
                    self._retire(budget)

    async def close(self) -> None:
        """Shutdown: persist every record, then give every lease and budget slice back."""
        self.ledger.valid_until = 0.0  # no reservation after this point: late calls get 503
        # Lease operations under way change amounts that closing must see.
        await asyncio.gather(*self._background, *self._refills.values(), return_exceptions=True)
        for budget in self.budgets.values():
            self._retire(budget)
        self.budgets.clear()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.flush(final=True)
        for account_id, purse in list(self.ledger.purses.items()):
            if purse.reserved == 0 and await self.leases.close(account_id, purse.leased, purse.spent):
                del self.ledger.purses[account_id]
        await self.leases.deregister()
