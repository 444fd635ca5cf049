"""Every loop of background work this process runs, in one place: stores and services expose single
steps (Meter.flush, CostLedger.flush, Meter.heartbeat, Meter.upkeep, Payments.reconcile_once, AdminStore.refresh, RateLimiter.forget_idle,
Detector.check_once, Outbox.work, Expiry.once);
this module decides when they run."""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from accounting.coherence import Coherence
from app.context import Context
from runtime.accesslog import FLUSH_SECONDS
from storage.admin import REFRESH_SECONDS
from storage.changes import ChangeFeed
from storage.markers import outbound_hold
from streams.hub import WATCH_SECONDS

log = logging.getLogger("gateway.tasks")
LAG_INTERVAL = 0.05  # seconds between the lag probe's wake-ups
LAG_ALARM = 0.1  # a wake-up later than this is logged: something held the event loop

# A key's token bucket refills within 1 / QPS seconds (5 s on the free plan): one idle this long is full,
# and a full bucket behaves like a missing one, so dropping it frees memory without changing an answer.
BUCKET_IDLE_SECONDS = 300.0
OUTBOUND_SECONDS = 2.0  # how soon a process sees `release-outbound`


def _still_cancelled() -> None:
    """A cancellation that landed inside a step ends the loop even if the step swallowed it or turned it into
    another error (a driver's operation under way may): the loop went back to sleep, and a shutdown (or a
    test's teardown) then waited for it in vain."""
    if asyncio.current_task().cancelling():
        raise asyncio.CancelledError


async def every(interval: float, step: Callable[[], Awaitable[object]], what: str) -> None:
    """Runs `step` every `interval` seconds until cancelled; a failed step is logged (no exception text
    beyond its type) and tried again next time."""
    while True:
        await asyncio.sleep(interval)
        try:
            await step()
        except Exception as exc:
            _still_cancelled()
            log.warning("%s failed (%s); retrying next interval", what, type(exc).__name__)
        _still_cancelled()


async def when_told_or_every(told: asyncio.Event, interval: float, step: Callable[[], Awaitable[object]], what: str):
    """Runs `step` as soon as `told` is set, and at the latest every `interval` seconds, until cancelled; a failed
    step is logged (its type only) and tried again next time."""
    while True:
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for loses a cancellation that lands as the
            # event is set, and the loop then never ends (a shutdown waiting for it hung).
            async with asyncio.timeout(interval):
                await told.wait()
        except TimeoutError:
            pass
        told.clear()
        try:
            await step()
        except Exception as exc:
            _still_cancelled()
            log.warning("%s failed (%s); retrying", what, type(exc).__name__)
        _still_cancelled()


async def flush_usage(ctx: Context) -> None:
    """Flushes buffered usage every FLUSH_INTERVAL, or as soon as FLUSH_BATCH records wait."""
    meter = ctx.meter

    async def flush() -> None:
        if not len(meter.buffer):
            return
        try:
            await meter.flush()
        except Exception as exc:
            log.warning("usage flush failed (%s); %d records kept for retry", type(exc).__name__, len(meter.buffer))

    await when_told_or_every(meter.batch_ready, ctx.settings.flush_interval, flush, "usage flush")


async def flush_costs(ctx: Context) -> None:
    """Writes the cost ledger's provider requests as the usage flusher writes usage (accounting/costs.py)."""
    costs = ctx.costs

    async def flush() -> None:
        if not len(costs.buffer):
            return
        try:
            await costs.flush()
        except Exception as exc:
            log.warning("cost ledger flush failed (%s); %d kept for retry", type(exc).__name__, len(costs.buffer))

    await when_told_or_every(costs.batch_ready, ctx.settings.flush_interval, flush, "cost ledger flush")


async def watch_loop_lag(ctx: Context) -> None:
    """How late a periodic wake-up runs is how long the event loop was held by something else: every
    request waited that long. Published as gateway_event_loop_lag_seconds; past LAG_ALARM, a warning."""
    loop, metrics = asyncio.get_running_loop(), ctx.metrics
    while True:
        due = loop.time() + LAG_INTERVAL
        await asyncio.sleep(LAG_INTERVAL)
        lag = max(0.0, loop.time() - due)
        metrics.loop_lag_seconds = lag
        metrics.loop_lag_max_seconds = max(metrics.loop_lag_max_seconds, lag)
        if lag > LAG_ALARM:
            metrics.loop_stalls += 1
            log.warning("event loop stalled: a periodic callback ran %.0f ms late", lag * 1000)


async def flush_access_log(ctx: Context) -> None:
    """Writes the waiting access-log lines every FLUSH_SECONDS (runtime/accesslog.py)."""
    while True:
        await asyncio.sleep(FLUSH_SECONDS)
        ctx.access_log.flush()


async def forget_idle_buckets(ctx: Context, now: float | None = None) -> None:
    """Drops the rate-limit buckets of keys idle for BUCKET_IDLE_SECONDS (`now`: the handlers' monotonic clock)."""
    ctx.limiter.forget_idle(time.monotonic() if now is None else now, BUCKET_IDLE_SECONDS)


async def poll_unless_held(ctx: Context) -> None:
    """Stream rules and monitors poll the provider, and their events go out: not while outbound is held (a restored
    database); what falls due meanwhile polls once it is released."""
    if not ctx.outbound.held:
        await ctx.poller.tick()


async def watch_outbound(ctx: Context) -> None:
    """While outbound is held: reads the hold every OUTBOUND_SECONDS until `social-gateway release-outbound` lifts
    it (in every process), then wakes the dispatcher and the poller. Only a restore holds it again, and a restore
    refuses a database a gateway serves: once released, there is nothing left to watch."""
    db = ctx.client[ctx.settings.mongodb_db]
    while ctx.outbound.held:
        await asyncio.sleep(OUTBOUND_SECONDS)
        try:
            ctx.outbound.hold = await outbound_hold(db)
        except Exception as exc:
            _still_cancelled()
            log.warning("reading the outbound hold failed (%s); retrying", type(exc).__name__)
    log.warning("outbound released: webhooks, emails and stream polls go out from now on")
    ctx.outbox.wake.set()
    ctx.poller.nudge()


def start_background(ctx: Context) -> list[asyncio.Task]:
    settings = ctx.settings
    tasks = {
        "flusher": flush_usage(ctx),
        "cost-ledger": flush_costs(ctx),
        "loop-lag": watch_loop_lag(ctx),
        "access-log": flush_access_log(ctx),
        # Two loops: the heartbeat must never wait behind upkeep (many accounts' give-backs or a reclaim).
        "heartbeat": every(settings.lease_timeout / 6, ctx.meter.heartbeat, "heartbeat"),
        "leases": every(settings.lease_timeout / 6, ctx.meter.upkeep, "lease upkeep"),
        "admin-rollups": every(REFRESH_SECONDS, ctx.admin.refresh, "admin rollup refresh"),
        "idle-buckets": every(BUCKET_IDLE_SECONDS / 5, lambda: forget_idle_buckets(ctx), "idle bucket sweep"),
        "alerts": every(settings.alert_check_seconds, ctx.alerts.check_once, "alert check"),
        # Told when this process writes an event or a retry falls due; polls for what other processes left.
        "webhooks": when_told_or_every(
            ctx.outbox.wake, settings.webhook_poll_seconds, ctx.outbox.work, "webhook dispatch"
        ),
        # Real time: due polls claimed, other processes' events tailed to this one's sockets, keys re-checked.
        "stream-polls": every(settings.stream_tick_seconds, lambda: poll_unless_held(ctx), "stream poll"),
        "stream-tail": every(settings.stream_tick_seconds, ctx.hub.tail, "stream tail"),
        "stream-sockets": every(WATCH_SECONDS, ctx.hub.watch, "stream socket watch"),
        "stream-balance": every(settings.stream_balance_check_seconds, ctx.poller.check_balances, "stream balance"),
        "coherence": Coherence(settings, ChangeFeed(ctx.client[settings.mongodb_db]), ctx.meter, ctx.sessions).run(),
    }
    if ctx.outbound.held:
        tasks["outbound"] = watch_outbound(ctx)
    if ctx.expiry.passes:  # on SecantusDB: expired documents deleted here, not by its sweeper (storage/expiry.py)
        tasks["expiry"] = every(settings.db_expiry_seconds, ctx.expiry.once, "expiry pass")
    if ctx.payments.provider is not None:  # a missed notification still credits within a few intervals
        tasks["reconcile"] = every(settings.reconcile_interval, ctx.payments.reconcile_once, "reconciliation")
    return [asyncio.create_task(work, name=name) for name, work in tasks.items()]
