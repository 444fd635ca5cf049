"""The operator's cost ledger: every request the router puts to a provider on a call's behalf (social/providers
Attempt), whether it answered, failed or was failed over, counted for /metrics at once and stored in batches
(storage/provider_costs.py) off the call's path, like the usage records (accounting/meter.py).

The router calls `record` for each attempt: synchronous, a few additions and an append, never a database wait.
A background loop (app/tasks.py) writes the batches every FLUSH_INTERVAL or as soon as FLUSH_BATCH wait; a failed
batch stays, with its id, for the next try (written once). Memory is bounded by BUFFER_MAX: past it (the database
away for long) an attempt is counted in /metrics but not stored, and `gateway_provider_ledger_dropped` says how
many. A graceful stop writes what is left (`close`, from gateway.py's final flush)."""

import asyncio
import logging

from config.settings import Settings
from metering.usage import UsageBuffer
from runtime.metrics import Metrics
from runtime.state import State
from social.providers import Attempt
from storage.provider_costs import ProviderCostStore, failed, moment

log = logging.getLogger("gateway.costs")


class CostLedger:
    def __init__(self, state: State, store: ProviderCostStore, metrics: Metrics, process_id: str):
        self.state, self.store, self.metrics = state, store, metrics
        self.buffer = UsageBuffer(state.settings.buffer_max)
        self._id_prefix = process_id  # batch ids unique across processes, fixed for the process's life
        self.batch_ready = asyncio.Event()  # FLUSH_BATCH attempts wait: app/tasks.py writes now
        self._flush_lock = asyncio.Lock()

    @property
    def settings(self) -> Settings:
        return self.state.settings

    def record(self, attempt: Attempt, failover: bool = False) -> None:
        """One provider request; `failover`: the router asked another provider after it."""
        m, provider = self.metrics, attempt.provider
        failure = failed(attempt.status, attempt.error)
        m.provider_calls[provider] += 1
        m.provider_failures[provider] += failure
        m.provider_failovers[provider] += failover
        m.provider_cost_usd[provider] += attempt.cost_usd
        m.provider_latency.observe(provider, attempt.seconds)
        if self.buffer.full:
            if not m.provider_ledger_dropped:
                log.error("cost ledger full (BUFFER_MAX): provider requests are counted but not stored")
            m.provider_ledger_dropped += 1
            return
        row = [
            moment(attempt.at),
            attempt.status,
            attempt.error,
            attempt.items,
            attempt.cost_usd,
            round(attempt.seconds, 4),
            attempt.account,
            failover,
        ]
        self.buffer.add({"provider": provider, "endpoint": attempt.endpoint, "row": row})
        if self.buffer.waiting >= self.settings.flush_batch:
            self.batch_ready.set()

    async def flush(self, final: bool = False) -> int:
        """Writes the attempts buffered when it starts (all of them when `final`), one batch at a time; a failed
        batch stays for the next try, under the same id."""
        written = 0
        async with self._flush_lock:
            due = len(self.buffer)
            while len(self.buffer) and (final or written < due):
                seq, batch = self.buffer.take(self.settings.flush_batch)
                await self.store.insert_batch(f"{self._id_prefix}-{seq}", batch)
                self.buffer.done()
                written += len(batch)
        return written

    async def close(self) -> None:
        """Shutdown: every attempt written (the caller retries until its deadline)."""
        await self.flush(final=True)
