"""Per-key credit budgets: what the keys of one budget may still spend in a period.

One document per budget, period and epoch, `{_id: "<budget_id>:<period>[:<epoch>]", taken}`. The epoch
(the key's `budget_epoch`) changes when a budget starts again after being removed or changes its period:
the spend made meanwhile is in no document, so the new run counts it afresh from the usage. `taken` counts the
credits spent in the period before the document existed (read from the usage buckets when it is
created) plus every slice a process has taken since, minus what processes gave back. A process
spends only from slices it holds (accounting/budgets.py), and slices are taken only while
`taken + slice <= limit`, so no number of processes can spend more than the limit.

A run started by a PATCH is opened by the process answering it (`open`), with what the stored usage and
that process know the keys spent; the other live processes are `waiting` to add what only they know
(their calls in flight and records not yet stored: `report`). No slice is taken until they all have, or
until `open_at` (a few seconds: a process that does not answer by then, a dead one, is not waited for).
"""

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

CAS_ATTEMPTS = 8


class RunOpening(Exception):
    """The run's document still waits for other processes' reports: take again in a moment."""


class BudgetStore:
    def __init__(self, db: AsyncDatabase):
        self.budgets = db.key_budgets

    async def take(
        self,
        budget_id: int,
        period: str,
        limit: int,
        want: int,
        one_call: int,
        spent_so_far: Callable[[], Awaitable[int]] | None,
        epoch: int = 0,
    ) -> int:
        """Moves up to `want` credits into a slice: at most half of what the limit leaves (so that other
        processes spending from the budget still find some) but at least `one_call`, and never more than
        is left; 0 when nothing is left. `spent_so_far` counts what the budget spent in the period before
        its document existed; None when that is nothing (the budget ran all period: accounting/budgets.py)."""
        _id = _doc_id(budget_id, period, epoch)
        # The usual take, one round trip: the whole `want` while it is at most half of what is left,
        # creating the document when the period's spend so far is known to be nothing.
        if 2 * want > limit:
            # Never upsert then: a new document would start at `want`, past half the limit (or past it).
            return await self._take_what_is_left(_id, limit, want, one_call, spent_so_far)
        query: dict = {"_id": _id, "taken": {"$lte": limit - 2 * want}}
        if spent_so_far is not None:  # a run started within the period may still wait for reports (open)
            query["$or"] = [
                {"waiting": {"$exists": False}},
                {"waiting": {"$size": 0}},
                {"open_at": {"$lte": datetime.now(UTC)}},
            ]
        try:
            result = await self.budgets.update_one(
                query,
                {"$inc": {"taken": want}},
                upsert=spent_so_far is None,
            )
            if result.modified_count or result.upserted_id is not None:
                return want
        except DuplicateKeyError:
            pass  # the document exists with less left: the careful take below
        return await self._take_what_is_left(_id, limit, want, one_call, spent_so_far)

    async def _take_what_is_left(
        self, _id: str, limit: int, want: int, one_call: int, spent_so_far: Callable[[], Awaitable[int]] | None
    ) -> int:
        for _ in range(CAS_ATTEMPTS):
            doc = await self.budgets.find_one({"_id": _id})
            if doc is None:
                try:
                    taken = await spent_so_far() if spent_so_far is not None else 0
                    await self.budgets.insert_one({"_id": _id, "taken": taken})
                except DuplicateKeyError:
                    pass  # another process created it meanwhile
                continue
            if doc.get("waiting") and doc["open_at"] > datetime.now(UTC):
                raise RunOpening()
            left = limit - doc["taken"]
            grant = min(left, max(one_call, min(want, left // 2)))
            if grant <= 0:
                return 0
            # Compare-and-set on `taken`: a concurrent take in another process makes this one read again.
            result = await self.budgets.update_one({"_id": _id, "taken": doc["taken"]}, {"$inc": {"taken": grant}})
            if result.modified_count:
                return grant
        return 0

    async def open(
        self, budget_id: int, period: str, epoch: int, taken: int, waiting: list[str], open_at: datetime
    ) -> None:
        """A new run's document, before any key carries the run: what its keys spent as far as the opening
        process knows, and the live processes whose reports it waits for until `open_at`."""
        await self.budgets.insert_one(
            {"_id": _doc_id(budget_id, period, epoch), "taken": taken, "waiting": waiting, "open_at": open_at}
        )

    async def report(self, budget_id: int, period: str, epoch: int, reporter: str, spent: int) -> None:
        """Adds what `reporter` (a process id) alone knows the run's keys spent, once."""
        await self.budgets.update_one(
            {"_id": _doc_id(budget_id, period, epoch), "waiting": reporter},
            {"$inc": {"taken": spent}, "$pull": {"waiting": reporter}},
        )

    async def give_back(self, budget_id: int, period: str, amount: int, epoch: int = 0) -> None:
        if amount > 0:
            await self.budgets.update_one({"_id": _doc_id(budget_id, period, epoch)}, {"$inc": {"taken": -amount}})


def _doc_id(budget_id: int, period: str, epoch: int) -> str:
    return f"{budget_id}:{period}:{epoch}" if epoch else f"{budget_id}:{period}"
