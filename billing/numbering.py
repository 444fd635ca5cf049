"""The operator's gapless series of document numbers: receipts `R-2026-000123`, credit notes `C-2026-000001`.

One sequence per series for the operator, over every account, process and machine on the database; the year in the
number is the year of issue and the count does NOT restart with it (R-2026-000950 may be followed by R-2027-000951):
one unbroken sequence is what an auditor checks for gaps. How a number is taken and its document written in one
insert, so that no crash leaves a gap and no race a duplicate: storage/billing.py.
"""

import asyncio
import re
from collections import defaultdict
from datetime import datetime

from storage.billing import BillingStore, Taken

RECEIPT, CREDIT_NOTE = "R", "C"
NUMBER = re.compile(r"([RC])-(\d{4})-(\d{6,})")
# Each refused insert means another issuer's landed: the series moved on, so this bounds nothing but a bug.
MAX_TRIES = 10_000


def number(series: str, issued_at: datetime, seq: int) -> str:
    return f"{series}-{issued_at.year:04d}-{seq:06d}"


class Numbering:
    """Issues documents, each at most once per source, numbered one after the other without a gap."""

    def __init__(self, store: BillingStore):
        self.store = store
        # Within a process issuers of a series take turns: they would only refuse each other's inserts.
        self.turns: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        # The highest number this process knows to exist per series: the next insert tries the one after it, read
        # again only when refused. It only ever names a written document (never deleted; a restore is refused while
        # a gateway serves the database), so the guess is never past the highest + 1: a wrong one is refused.
        self.known: dict[str, int] = {}

    async def issue(self, series: str, source: str, contents: dict, issued_at: datetime) -> tuple[dict, bool]:
        """The document for `source`: the one issued before (False), or a new one with the next number (True)."""
        async with self.turns[series]:
            if series not in self.known:
                self.known[series] = await self.store.highest(series)
            for _ in range(MAX_TRIES):
                seq = self.known[series] + 1
                document = {
                    **contents,
                    "_id": number(series, issued_at, seq),
                    "series": series,
                    "seq": seq,
                    "source": source,
                    "issued_at": issued_at,
                }
                try:
                    await self.store.insert(document)
                except Taken:
                    # The number is another process's, or this source was issued already (by a retry, a sibling).
                    found = await self.store.by_source(source)
                    if found is not None:
                        return found, False
                    self.known[series] = await self.store.highest(series)
                    continue
                self.known[series] = seq
                return document, True
        raise RuntimeError(f"could not number a {series} document for {source}")
