"""Per-key credit budgets: what the keys of one budget may still spend in a period.

One document per budget, period and epoch, `{_id: "<budget_id>:<period>[:<epoch>]", taken}`. The epoch
(the key's `budget_epoch`) changes when a budget starts again after being removed or changes its period:
the spend made meanwhile is in no document, so the new run counts it afresh from the usage. `taken` counts the
credits spent in the period before the document existed (read from the usage buckets when it is
created) plus every slice a process has taken since, minus what processes gave back. A process
spends only from slices it holds (accounting/budgets.py), and slices are taken only while
`taken + slice <= limit`, so no number of processes can spend more than the limit.
"""

from collections.abc import Awaitable, Callable

from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

CAS_ATTEMPTS = 8


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
        try:
            result = await self.budgets.update_one(
                {"_id": _id, "taken": {"$lte": limit - 2 * want}},
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
            left = limit - doc["taken"]
            grant = min(left, max(one_call, min(want, left // 2)))
            if grant <= 0:
                return 0
            # Compare-and-set on `taken`: a concurrent take in another process makes this one read again.
            result = await self.budgets.update_one({"_id": _id, "taken": doc["taken"]}, {"$inc": {"taken": grant}})
            if result.modified_count:
                return grant
        return 0

    async def give_back(self, budget_id: int, period: str, amount: int, epoch: int = 0) -> None:
        if amount > 0:
            await self.budgets.update_one({"_id": _doc_id(budget_id, period, epoch)}, {"$inc": {"taken": -amount}})


def _doc_id(budget_id: int, period: str, epoch: int) -> str:
    return f"{budget_id}:{period}:{epoch}" if epoch else f"{budget_id}:{period}"
