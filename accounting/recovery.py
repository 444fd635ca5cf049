"""The usage records a process that is gone left on local disk, written to the database once, before its leases
are reclaimed: its journal (accounting/journal.py: after a crash, a power loss, or a stop with the database away)
or, with JOURNAL=off, what a stop with the database away kept (accounting/unwritten.py).

Each record is written once however often this runs (two starts racing, a replay cut short and done again): a
batch already written, in part or whole, is skipped by its bucket ids (storage/usage.py), and a journal or file is
deleted only once all of it is written. The leases the records were spent from then count them: one still open is
reclaimed counting them, one reclaimed meanwhile is charged the difference once (LeaseStore.settle_stored_late).
"""

import asyncio
import contextlib
import logging
import os

from accounting import journal, unwritten
from config.settings import Settings
from runtime.metrics import Metrics
from storage.leases import LeaseStore
from storage.usage import UsageStore

log = logging.getLogger("gateway.meter")


class Recovery:
    def __init__(self, usage: UsageStore, leases: LeaseStore, metrics: Metrics):
        self.usage, self.leases, self.metrics = usage, leases, metrics

    async def write(self, settings: Settings, own: str | None) -> None:
        """Every journal of `settings.mongodb_db` under DATA_DIR but `own` (this process's) whose owner is gone,
        then every unwritten-usage file."""
        for path in await asyncio.to_thread(journal.leftovers, settings.data_dir, settings.mongodb_db, own):
            claim = await asyncio.to_thread(journal.claim, path)
            if claim is None:
                continue  # its process lives, or another replays it (and has finished when claim returns)
            try:
                await self._replay(claim)
            finally:
                claim.release()
        for path in await asyncio.to_thread(unwritten.found, settings.data_dir, settings.mongodb_db):
            # The workers of serve --workers all start here: one may have written and removed a file meanwhile.
            try:
                batches = await asyncio.to_thread(unwritten.load, path)
            except FileNotFoundError:
                continue
            await self._write(batches)
            with contextlib.suppress(FileNotFoundError):
                await asyncio.to_thread(os.remove, path)
            count = sum(len(batch) for _, batch in batches)
            log.warning("wrote %d usage records a stopped process had kept on disk (%s)", count, path)

    async def _replay(self, claim: journal.Claim) -> None:
        try:
            batches = await asyncio.to_thread(claim.batches)
        except (journal.JournalCorrupt, ValueError) as exc:
            kept = await asyncio.to_thread(claim.keep_corrupt)
            self.metrics.journals_corrupt += 1
            log.critical(
                "usage journal %s is corrupt (%s): nothing of it was replayed; kept as %s for the operator "
                "(docs/operations.md, A corrupt usage journal)",
                claim.path,
                exc,
                kept,
            )
            return
        await self._write(batches)
        await asyncio.to_thread(claim.remove)  # last: a replay cut short is done again, to no effect
        count = sum(len(batch) for _, batch in batches)
        self.metrics.journal_replayed += count
        if count:
            log.warning("replayed %d usage records from the journal of process %s", count, claim.process_id)

    async def _write(self, batches: list[tuple[str, list[dict]]]) -> None:
        for batch_id, records in batches:
            await self.usage.insert_batch(batch_id, records)
        for lease, account_id in sorted({(r["lease"], r["account_id"]) for _, batch in batches for r in batch}):
            await self.leases.settle_stored_late(lease, account_id)
