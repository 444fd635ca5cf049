"""Cache coherence across gateway processes.

Every process caches keys and accounts (accounting/meter.py). What another process changes reaches
this one through a MongoDB change stream within milliseconds; where change streams are
unavailable (a standalone server), by polling every COHERENCE_POLL_SECONDS. Applied here:
- a key revoked elsewhere stops working here (the revoking process already stopped it);
- a key's properties changed elsewhere (expiry, roll, scopes, addresses, budget): the cached entry follows;
- a top-up, payment or admin change elsewhere: new plan at once, and a remembered 402 is forgotten;
- another process found the balance empty while this one holds leased credits: give half back;
- a session token ended elsewhere (POST /auth/logout) stops working here.
"""

import asyncio
import logging
from datetime import UTC, datetime, timedelta

from pymongo.errors import InvalidOperation, OperationFailure, PyMongoError

from accounting.meter import Meter
from config.settings import Settings
from security.sessions import SessionTokens
from storage.changes import Change, ChangeFeed

log = logging.getLogger("gateway.coherence")

# Polls re-read this much before the previous poll: writers stamp with their own clocks, and a
# write may land after a poll that started later. Changes seen twice are applied once.
POLL_OVERLAP = timedelta(seconds=2)
MAX_BACKOFF = 5.0
STREAM_PAUSE = (
    0.5  # seconds between empty change-stream batches: at most 2 round trips a second, revocations within ~0.6 s
)
PLAN_FIELDS = frozenset(("changed_at", "paid_usd", "topup_credits", "is_admin"))


class Coherence:
    def __init__(self, settings: Settings, feed: ChangeFeed, meter: Meter, sessions: SessionTokens):
        self.settings, self.feed, self.meter, self.sessions = settings, feed, meter, sessions
        self._failing = False

    async def run(self) -> None:
        if self.settings.coherence == "off":
            return
        if self.settings.coherence == "changestream" and await self._watch():
            return
        await self._poll_forever()

    # --- applying a change ------------------------------------------------------------------------
    def apply(self, change: Change) -> None:
        meter = self.meter
        if change.kind == "ended":
            self.sessions.ended_elsewhere(change.id)
            return
        if change.kind == "revoked":
            meter.key_revoked(change.id)
            meter.heard(change.doc)  # in force here: the revoking process may answer
            return
        if change.kind == "key":
            meter.key_changed(change.doc)
            meter.heard(change.doc)
            return
        account_id, doc = change.id, change.doc
        if "lease_wanted_at" in change.fields and doc.get("lease_wanted_by") != meter.leases.process_id:
            give = meter.ledger.wanted_share(account_id, meter.clock())
            if give:
                meter.spawn(self._give_back(account_id, give))
        # Only accounts this process serves: the others load fresh when first needed.
        if change.fields & PLAN_FIELDS and (
            account_id in meter.ledger.purses or meter.account_cache.peek(account_id) is not None
        ):
            meter.account_changed(account_id, doc)

    async def _give_back(self, account_id: str, give: int) -> None:
        try:
            await self.meter.give_back(account_id, give)
        except Exception as exc:
            log.warning("could not give back credits another process asked for: %s", type(exc).__name__)

    # --- change stream ----------------------------------------------------------------------------
    async def _watch(self) -> bool:
        """Follows the change stream until cancelled; False at once if the server has none."""
        token, delay, opened, failed_at = None, 0.5, False, None
        while True:
            try:
                async with await self.feed.stream(token) as stream:
                    if failed_at is not None and token is None:
                        # The stream could not resume where it stopped: read what changed meanwhile.
                        await self._catch_up(failed_at - POLL_OVERLAP)
                    opened, failed_at, delay = True, None, 0.5
                    self._recovered("change stream")
                    while True:
                        event = await stream.try_next()
                        token = stream.resume_token
                        if event is None:
                            # An empty batch: servers answer one after writes the filter drops (usage
                            # flushes, lease takes), many a second. Pausing bounds the round trips.
                            await asyncio.sleep(STREAM_PAUSE)
                            continue
                        change = self.feed.parse(event)
                        if change is not None:
                            self.apply(change)
            except InvalidOperation:
                return True  # the client was closed: the process is stopping
            except OperationFailure as exc:
                _unless_cancelled()
                if not opened:
                    log.warning(
                        "change streams unavailable (code %s); polling every %gs instead",
                        exc.code,
                        self.settings.coherence_poll_seconds,
                    )
                    return False
                token = None  # the resume point is gone (history lost): start afresh after a catch-up
                failed_at = failed_at or datetime.now(UTC)
                self._failed("change stream", exc)
            except PyMongoError as exc:
                _unless_cancelled()
                failed_at = failed_at or datetime.now(UTC)
                self._failed("change stream", exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF)

    async def _catch_up(self, since: datetime) -> None:
        for _, change in await self.feed.poll(since):
            self.apply(change)

    # --- polling ----------------------------------------------------------------------------------
    async def _poll_forever(self) -> None:
        since = datetime.now(UTC)
        applied: dict[tuple, datetime] = {}  # changes applied within the overlap: not again
        delay = self.settings.coherence_poll_seconds
        while True:
            await asyncio.sleep(delay)
            started = datetime.now(UTC)
            try:
                found = await self.feed.poll(since - POLL_OVERLAP)
            except InvalidOperation:
                return  # the client was closed: the process is stopping
            except PyMongoError as exc:
                _unless_cancelled()
                self._failed("coherence poll", exc)
                delay = min(delay * 2, MAX_BACKOFF)
                continue
            self._recovered("coherence poll")
            delay = self.settings.coherence_poll_seconds
            for stamp, change in found:
                seen = (change.kind, change.id, tuple(sorted(change.fields)), stamp)
                if seen not in applied:
                    applied[seen] = stamp
                    self.apply(change)
            since = started
            applied = {k: t for k, t in applied.items() if t >= since - POLL_OVERLAP}

    # --- logging once per outage ----------------------------------------------------------------------
    def _failed(self, what: str, exc: Exception) -> None:
        if not self._failing:
            log.warning(
                "%s failed (%s); caches follow other processes only by TTL until it is back", what, type(exc).__name__
            )
        self._failing = True

    def _recovered(self, what: str) -> None:
        if self._failing:
            log.info("%s restored", what)
        self._failing = False


def _unless_cancelled() -> None:
    """A driver error raised while this task was being cancelled (the stream's close on the way out failed, and
    replaced the cancellation): the cancellation wins. Retrying instead kept a stopped process's task alive (seen
    once in a test's teardown: 'coherence' ignored its cancellation for 20 s)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
