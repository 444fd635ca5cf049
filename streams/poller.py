"""The poll scheduler: claims due rules under their leases (storage/streams.py), polls, charges, writes the
event, hands it to the sockets and the webhook outbox, and moves the rule's cursor on. One step of it
(`tick`) runs every STREAM_TICK_SECONDS in every process (app/tasks.py); `check_balances` pauses the rules of
accounts that cannot pay for their next hour and resumes them after a top-up, and resumes rules paused for
their key's budget once the key has another (a new period, a raised limit).

A rule's polls are its key's calls: a claimed rule is not polled when its account is suspended (it waits for
the resume: `suspended`), when its key is revoked, expired or gone (switched off), or when the key's budget
cannot pay (`paused_budget`, with an alert); a rule of a rolled key follows it to the new key.

Order of one poll, each step safe to redo after a crash: reserve credits (the least a poll costs must be
there) -> the provider's search -> the event `<rule>:<poll_seq>` written once -> the outbox event (its id from
the stream event's) -> the cursor moved on (compare-and-set) -> charged only if the cursor moved: of two
processes that ran the same poll (a lease that ran out mid-poll), one is charged.
"""

import asyncio
import contextlib
import logging
import math
import time
import uuid
from datetime import datetime, timedelta
from urllib.parse import quote

from accounting.budgets import BudgetExhausted
from accounting.charged import Calls, Fetched
from accounting.keys import KeyEntry
from accounting.meter import LeasesExpired, Meter
from alerts import rules as alert_kinds
from config.settings import Settings
from runtime.state import State
from social.providers.router import Router
from social.upstream import UpstreamError
from storage.clock import now_utc
from storage.streams import ACTIVE, INACTIVE, PAUSED, PAUSED_BUDGET, StreamStore
from streams import rules as polls
from streams.hub import Hub
from streams.keys import KeyStopped, RuleKeys, another_budget
from webhooks.outbox import Outbox

log = logging.getLogger("gateway.streams")
RETRY_SECONDS = 5.0  # a poll the provider failed is tried again this soon (or at its interval, if shorter)
CONCURRENT = 200  # polls under way per process
MAX_PAGES = 5  # pages one poll may read (100 tweets); a busier interval's older part is a gap the next polls read
MAX_GAPS = 20  # gaps a rule may have waiting (a rule always busier than MAX_PAGES a poll loses the oldest)
IDLE_SECONDS = 1.0  # the longest a process waits between looks for due polls when none is due


class Poller:
    def __init__(
        self,
        settings: Settings,
        store: StreamStore,
        meter: Meter,
        upstream: Router,
        state: State,
        outbox: Outbox,
        hub: Hub,
        calls: Calls,
        owner: str,
    ):
        self.settings, self.store, self.meter, self.upstream = settings, store, meter, upstream
        self.state, self.outbox, self.hub, self.owner = state, outbox, hub, owner  # state: the prices now (a reload)
        self.calls = calls  # the charged call (accounting/charged.py): polls read live, never from the cache
        # A claim outlives the longest poll: the provider's time-out, the writes after it, and margin.
        self.hold = settings.upstream_timeout + settings.upstream_connect_timeout + 10
        self._polling: set[asyncio.Task] = set()
        self.touched: set[str] = set()  # accounts polled since the last balance check
        self._skip_until = 0.0  # no claim before this (monotonic): nothing was due
        self.polls = 0  # polls answered (bench/streams.py divides the process's CPU by it)
        self.stopped = False  # shutting down: no more claims; the polls under way finish while calls drain
        self._in_order = asyncio.Lock()
        self.keys = RuleKeys(meter, store)

    # --- scheduling --------------------------------------------------------------------------------
    def nudge(self) -> None:
        """A rule was switched on here: look at once (other processes' within IDLE_SECONDS)."""
        self._skip_until = 0.0

    async def tick(self) -> None:
        if self.stopped or len(self._polling) >= CONCURRENT or time.monotonic() < self._skip_until:
            return
        now = now_utc()
        due = await self.store.due(now)
        if not due:  # nothing due: when nothing will be for IDLE_SECONDS either, look again only then
            if not await self.store.any_due_by(now + timedelta(seconds=IDLE_SECONDS)):
                self._skip_until = time.monotonic() + IDLE_SECONDS
            return
        room = CONCURRENT - len(self._polling)
        for rule in await self.store.claim(due[:room], self.owner, uuid.uuid4().hex, now, self.hold):
            task = asyncio.create_task(self.poll(rule))
            self._polling.add(task)
            task.add_done_callback(self._polled)

    def _polled(self, task: asyncio.Task) -> None:
        self._polling.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("a stream poll failed (%s); polled again soon", type(task.exception()).__name__)

    # --- one poll ------------------------------------------------------------------------------------
    async def poll(self, rule: dict) -> None:
        try:
            await self._poll(rule)
        except Exception:
            # A database error mid-poll (a dropped connection): the rule is let go to be polled again within
            # RETRY_SECONDS, not after its lease; the next poll finds what this one wrote (same poll_seq). If
            # letting go fails too, the lease runs out.
            with contextlib.suppress(Exception):
                await self.store.release(rule, self._due(rule, now_utc(), RETRY_SECONDS))
            raise

    async def _poll(self, rule: dict) -> None:
        start = now_utc()
        self.meter.metrics.poll_late.observe(rule["kind"], max(0.0, (start - rule["due_at"]).total_seconds()))
        seq, account_id = rule["poll_seq"], rule["account_id"]
        event_id = f"{rule['_id']}:{seq}"
        self.touched.add(account_id)
        allowed, key = await self._may_poll(rule)
        if not allowed:
            return
        if rule["claims"] > seq + 1:  # taken over: the previous holder may have written this poll's event
            found = await self.store.event(event_id)
            if found is not None:
                await self._deliver(found)
                after = polls.cursor_after(rule, found["tweets"]) | {"gaps": found.get("gaps", rule.get("gaps"))}
                await self.store.advance(rule, self._next(rule, start, after))
                return
        fetched = await self._fetch(rule, key, event_id, start)
        if fetched is None:
            return
        pages, new, gaps = fetched
        try:
            moved = await self._finish(rule, start, event_id, new, gaps)
        except BaseException:  # cancelled (shutdown) or failed: nothing charged; the next claimer redoes it
            self._let_go(pages)
            raise
        durable = None
        for page in pages:  # one data call per page: each charged (or not) on its own
            charged = self.calls.settle(page) if moved else 0
            if not moved:
                self.calls.release(page)
            durable = self.meter.record_poll(
                account_id, rule["key_id"], polls.ROUTE, page.status, charged, event_id, rule["_id"], page.provider
            )
        self.polls += 1
        if durable is not None:  # the poll is done once its charges are in the journal (groups end in order)
            with contextlib.suppress(Exception):  # a failed write is logged and counted by the journal
                await durable

    async def _finish(self, rule: dict, start: datetime, event_id: str, new: list, gaps: list) -> bool:
        """The poll's event written and delivered, then the cursor moved on: False if this process no longer
        held the rule (its lease ran out, or a change superseded the poll)."""
        event = None
        if new:
            doc = {
                "_id": event_id,
                "account_id": rule["account_id"],
                "rule_id": rule["_id"],
                "rule_tag": rule["tag"],
                "kind": rule["kind"],
                "tweets": new,
                "gaps": gaps,  # what a process taking this poll over goes on from
            }
            # One event at a time from stamp to sockets: this process's events reach them in `timestamp`
            # order, which a resume (from an event id) relies on.
            async with self._in_order:
                doc["created_at"] = now_utc()
                event, _ = await self.store.write_event(doc)
                self.hub.publish(event)
            await self._emit(event)
        delivered = event["tweets"] if event else []
        after = polls.cursor_after(rule, delivered) | {"gaps": event.get("gaps", gaps) if event else gaps}
        return await self.store.advance(rule, self._next(rule, start, after))

    async def _fetch(
        self, rule: dict, key: KeyEntry | None, event_id: str, start: datetime
    ) -> tuple[list, list, list] | None:
        """The poll's data calls, MAX_PAGES at most: what is new, then the gaps older polls left, each read page
        by page while every tweet of a page is new and the provider has more. Returns the pages (reservation,
        cost, status), the new tweets (newest first) and the gaps left; None when a page could not be reserved
        or the provider failed: nothing charged, the rule released to be polled again soon."""
        pages: list[tuple] = []
        new: list[dict] = []
        gaps: list[dict] = []
        seen = set(rule.get("recent_ids") or ())
        for region in polls.regions(rule):
            if len(pages) == MAX_PAGES:  # a gap not read in this poll: left as it is
                gaps.append(region)
                continue
            base = "query=" + quote(polls.poll_query(rule, region)) + "&queryType=Latest"
            cursor, oldest = "", None
            while True:
                read = await self._page(rule, key, event_id, start, pages, base + cursor)
                if read is None:
                    return None
                tweets, more = read
                found = polls.fresh(tweets, seen, region["above"])
                seen.update(str(t["id"]) for t in found)
                new += found
                oldest = str(found[-1]["id"]) if found else oldest
                # Seen tweets on a page do not end the region: tweets posted since the first page shift a
                # positional cursor, so the next page repeats some. It ends where the provider has no more, or
                # where it answers below the region (a provider ignoring since_id:).
                if not more or not tweets or polls.reached(tweets, region["above"]):
                    break
                if len(pages) == MAX_PAGES:  # the rest of the region waits for the next poll
                    gaps.append(polls.gap_below(region, oldest))
                    break
                cursor = "&cursor=" + quote(more)
        if len(gaps) > MAX_GAPS:
            log.warning("a stream rule has more than %d gaps; the oldest are dropped", MAX_GAPS)
        return pages, new, gaps[:MAX_GAPS]

    async def _page(
        self, rule: dict, key: KeyEntry | None, event_id: str, start: datetime, pages: list, query: str
    ) -> tuple | None:
        """One data call of a poll, reserved first (from the key's budget, then the balance, as a data call of
        the key) and appended to `pages`: (its tweets, the next page's cursor); None when it could not be
        reserved or the provider failed (the poll's pages released: `_failed`)."""
        try:
            reservation = await self.calls.reserve(rule["account_id"], polls.SEARCH, polls.SIZE, key)
        except LeasesExpired:
            reservation = None
        except BudgetExhausted:  # the key's budget cannot pay: its rules wait for another period or a raise
            self._let_go(pages)
            await self._out_of_budget(rule, key)
            return None
        except BaseException:  # the database failed under a lease refill (or shutdown): earlier pages let go
            self._let_go(pages)
            raise
        if reservation is None:  # no credits (the balance check pauses the rule) or none can be checked
            return await self._failed(rule, pages, start, None)
        try:
            fetched = await self.calls.fetch(self.upstream, reservation, polls.SEARCH, query, polls.SIZE, parse=True)
        except UpstreamError:  # the reservation is released
            return await self._failed(rule, pages, start, event_id)
        except BaseException:
            self._let_go(pages)
            raise
        if not fetched.data:  # the provider failed or refused
            return await self._failed(rule, [*pages, fetched], start, event_id)
        pages.append(fetched)
        return _read_page(fetched.page)

    def _let_go(self, pages: list[Fetched]) -> None:
        """The reservations of a poll's pages released: nothing of them charged."""
        for fetched in pages:
            self.calls.release(fetched)

    # --- may this rule poll: its account, its key, the key's budget ------------------------------------------
    async def _may_poll(self, rule: dict) -> tuple[bool, KeyEntry | None]:
        """(False, None) when the rule may not poll now (its lease let go, and its status says why unless its
        account is suspended); else (True, the key whose calls its polls are: None for a rule made in the portal)."""
        account_id = rule["account_id"]
        try:
            suspended = (await self.meter.account_view(account_id)).suspended
        except LookupError:  # the account is gone
            await self.store.hold_back(rule, INACTIVE)
            return False, None
        if suspended:
            # A rule switched on (in the portal) while suspended, or this process not yet told of the resume:
            # not polled, looked at again soon. Its status stays (a stale cache must not suspend it again).
            await self.store.release(rule, self._due(rule, now_utc(), RETRY_SECONDS))
            return False, None
        if not rule["key_id"]:
            return True, None
        try:
            key = await self.keys.live(account_id, rule["key_id"])
        except KeyStopped as stopped:
            await self.store.hold_back(rule, INACTIVE, {"stopped": stopped.args[0]})
            await self._stop_key(account_id, rule["key_id"], stopped.args[0])
            return False, None
        rule["key_id"] = key.key_id  # rolled: the new key's (storage moved the key's rules already)
        return True, key

    async def _stop_key(self, account_id: str, key_id: int, reason: str) -> None:
        """A revoked, expired or deleted key's other rules are switched off too (at once, not each at its poll)."""
        await self.store.set_key_status(
            account_id, key_id, (ACTIVE, PAUSED, PAUSED_BUDGET), INACTIVE, {"stopped": reason}
        )

    async def _out_of_budget(self, rule: dict, key: KeyEntry) -> None:
        """The key's budget cannot pay for a poll: this rule and the key's other active ones are paused until the
        key has another budget (resume_budgets), with one alert."""
        run = self.meter.key_budgets.run_of(key)
        fields = {"paused_for": run}
        held = await self.store.hold_back(rule, PAUSED_BUDGET, fields)
        others = await self.store.set_key_status(rule["account_id"], key.key_id, (ACTIVE,), PAUSED_BUDGET, fields)
        if held or others:
            await self._budget_alert(rule["account_id"], key, alert_kinds.STREAM_PAUSED)

    async def resume_budgets(self) -> None:
        """Rules paused for their key's budget resume once the key has another: the next period, a raised limit,
        the budget started again or removed. A key revoked or expired meanwhile stops its rules."""
        for paused in await self.store.budget_paused():
            account_id, key_id = paused["account_id"], paused["key_id"]
            try:
                key = await self.keys.live(account_id, key_id)
            except KeyStopped as stopped:
                await self._stop_key(account_id, key_id, stopped.args[0])
                continue
            if not another_budget(self.meter.key_budgets.run_of(key), paused.get("paused_for")):
                continue
            if await self.store.set_key_status(account_id, key.key_id, (PAUSED_BUDGET,), ACTIVE, {"due_at": now_utc()}):
                await self._budget_alert(account_id, key, alert_kinds.STREAM_RESUMED)
                self.nudge()

    async def _budget_alert(self, account_id: str, key: KeyEntry, type_: str) -> None:
        limit, period = key.credit_limit, key.period
        summary = (
            f"Filter rules and monitors of API key {key.key_id} paused: its credit budget ({limit:,} credits, "
            f"{period}) cannot pay for their polls; they resume by themselves in the next period or when the "
            "budget is raised"
            if type_ == alert_kinds.STREAM_PAUSED
            else f"Filter rules and monitors of API key {key.key_id} resumed: its credit budget pays for polls again"
        )
        data = {"reason": "key_budget", "key_id": key.key_id, "credit_limit": limit, "credit_limit_period": period}
        await self.outbox.emit(f"{account_id}|{type_}|{time.time_ns()}", account_id, type_, data | {"summary": summary})

    async def _failed(self, rule: dict, pages: list[Fetched], start: datetime, event_id: str | None) -> None:
        self._let_go(pages)
        if event_id is not None:  # the provider failed: a usage record of the failure, not charged
            self.meter.record_poll(rule["account_id"], rule["key_id"], polls.ROUTE, 502, 0, event_id, rule["_id"])
        await self.store.release(rule, self._due(rule, start, RETRY_SECONDS))

    async def _deliver(self, event: dict) -> None:
        """Sockets first (this process's at once, the others' through their tail), then the webhooks' outbox."""
        self.hub.publish(event)
        await self._emit(event)

    async def _emit(self, event: dict) -> None:
        await self.outbox.emit("stream|" + event["_id"], event["account_id"], "tweet", polls.message(event))

    def _next(self, rule: dict, start: datetime, cursor: dict) -> dict:
        late = (start - rule["due_at"]).total_seconds()  # kept on the rule for bench/streams.py
        due = self._due(rule, start, rule["interval_seconds"])
        return {**cursor, "due_at": due, "polled_at": start, "late_seconds": late, "polled_by": self.owner}

    @staticmethod
    def _due(rule: dict, start: datetime, wait: float) -> datetime:
        """The next poll: one interval after this one was due (polls keep their cadence); a poll that started
        later than that skips the slots it missed rather than being due again at once (one poll per interval),
        and a late one is followed no sooner than half a step after it began (two polls so close find the same
        tweets, and each is charged)."""
        step = timedelta(seconds=min(wait, rule["interval_seconds"]))
        due = rule["due_at"] + step
        if due <= start:
            due += step * (math.floor((start - due) / step) + 1)
        return max(due, start + step / 2)

    # --- the balance ----------------------------------------------------------------------------------
    async def check_balances(self) -> None:
        """Pauses an account's rules once its balance cannot pay for their next hour of polls (each at the
        per-call minimum), with an alert; resumes them once it can again (after a top-up)."""
        accounts, self.touched = self.touched, set()
        accounts |= set(await self.store.accounts_with(PAUSED))
        for account_id in accounts:
            rules = await self.store.live_rules(account_id)
            if not rules:
                continue
            need = polls.hour_need(rules, self.state.prices)
            balance = await self.meter.balance(account_id)
            paused = [r for r in rules if r.get("status") == PAUSED]
            if balance < need and len(paused) < len(rules):
                if await self.store.set_status(account_id, ACTIVE, PAUSED):
                    await self._alert(account_id, alert_kinds.STREAM_PAUSED, balance, need)
            elif balance >= need and paused:
                if await self.store.set_status(account_id, PAUSED, ACTIVE, due_at=now_utc()):
                    await self._alert(account_id, alert_kinds.STREAM_RESUMED, balance, need)
        await self.resume_budgets()

    async def _alert(self, account_id: str, type_: str, balance: int, need: int) -> None:
        paused = type_ == alert_kinds.STREAM_PAUSED
        summary = (
            f"Filter rules and monitors paused: the balance ({balance:,} credits) cannot pay for their next hour "
            f"of polls ({need:,} credits); they resume by themselves after a top-up"
            if paused
            else f"Filter rules and monitors resumed: the balance ({balance:,} credits) pays for their next hour"
        )
        data = {"reason": "balance", "balance_credits": balance, "hour_credits": need, "summary": summary}
        await self.outbox.emit(f"{account_id}|{type_}|{time.time_ns()}", account_id, type_, data)

    async def stop(self) -> None:
        """The polls still under way after the drain are cancelled: their reservations released, nothing
        charged (before the final usage flush, which then has every poll's record)."""
        self.stopped = True
        for task in list(self._polling):
            task.cancel()
        await asyncio.gather(*self._polling, return_exceptions=True)

    async def close(self) -> None:
        """The rules this process held are let go at once, so another process (or this one restarted) polls
        them on time rather than after the lease."""
        await self.store.let_go(self.owner)


def _read_page(doc: dict) -> tuple[list, str]:
    """A charged page's tweets and the next page's cursor ("" for none)."""
    tweets = doc.get("tweets") or []
    more = doc.get("next_cursor") if doc.get("has_next_page") else ""
    return (tweets if isinstance(tweets, list) else []), more if isinstance(more, str) else ""
