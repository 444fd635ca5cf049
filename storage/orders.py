"""Top-up orders and the sandbox chain: every payment query.

An order changes only through `update_state`, a compare-and-set on its revision
that also refuses orders in a final state, so concurrent notifications cannot
both apply the same change and a final order never moves again.
"""

from datetime import datetime

from pymongo import ASCENDING, DESCENDING, IndexModel, ReturnDocument
from pymongo.asynchronous.database import AsyncDatabase

# Order payment statuses, as the most common processor names them (reference.md).
STATUSES = (
    "waiting",
    "confirming",
    "confirmed",
    "sending",
    "partially_paid",
    "finished",
    "failed",
    "refunded",
    "expired",
)
# The whole amount actually paid is confirmed by the network.
CONFIRMED = frozenset({"confirmed", "sending", "finished"})
# An order in one of these never changes again (credits included).
FINAL = frozenset({"finished", "failed", "refunded", "expired"})

INDEXES = {
    "orders": [
        IndexModel([("account_id", ASCENDING), ("created_at", DESCENDING)]),
        IndexModel([("status", ASCENDING), ("check_at", ASCENDING)]),
        IndexModel([("pending.credit_id", ASCENDING)], sparse=True),
    ],
    "sandbox_chain": [IndexModel([("order_id", ASCENDING)], unique=True)],
}


class OrderStore:
    def __init__(self, db: AsyncDatabase):
        self.db = db
        self.orders = db.orders

    async def ensure_indexes(self) -> None:
        for name, indexes in INDEXES.items():
            await self.db[name].create_indexes(indexes)

    async def insert(self, order: dict) -> None:
        await self.orders.insert_one(order)

    async def get(self, order_id: str) -> dict | None:
        return await self.orders.find_one({"_id": order_id})

    async def owned(self, account_id: str, order_id: str) -> dict | None:
        """The order, only if `account_id` placed it."""
        return await self.orders.find_one({"_id": order_id, "account_id": account_id})

    async def count_open(self, account_id: str, now: datetime) -> int:
        """Orders of the account still waiting for any payment and not yet past their expiry."""
        return await self.orders.count_documents(
            {"account_id": account_id, "status": "waiting", "expires_at": {"$gt": now}}
        )

    async def for_account(self, account_id: str, limit: int) -> list[dict]:
        return await self.orders.find({"account_id": account_id}).sort("created_at", -1).limit(limit).to_list(None)

    async def update_state(self, order_id: str, rev: int, fields: dict, credit: dict | None) -> dict | None:
        """Applies one state change to the order as read at `rev`; None when the order moved on meanwhile.

        A credit is recorded as pending in the same write (credits_applied grows with it),
        and leaves `pending` only after the account holds it (credit_settled)."""
        update: dict = {"$set": fields, "$inc": {"rev": 1}}
        if credit is not None:
            update["$inc"]["credits_applied"] = credit["credits"]
            update["$push"] = {"pending": credit}
        return await self.orders.find_one_and_update(
            {"_id": order_id, "rev": rev, "status": {"$nin": sorted(FINAL)}},
            update,
            return_document=ReturnDocument.AFTER,
        )

    async def credit_settled(self, order_id: str, credit_id: str) -> None:
        await self.orders.update_one({"_id": order_id}, {"$pull": {"pending": {"credit_id": credit_id}}})

    async def due(self, now: datetime, limit: int) -> list[dict]:
        """Orders the reconciler should look at: unsettled credits, and open orders whose next check is due."""
        return (
            await self.orders.find(
                {
                    "$or": [
                        {"pending.0": {"$exists": True}},
                        {"status": {"$nin": sorted(FINAL)}, "check_at": {"$lte": now}, "reconcile_until": {"$gt": now}},
                    ]
                }
            )
            .sort("check_at", 1)
            .limit(limit)
            .to_list(None)
        )

    async def schedule(self, order_id: str, check_at: datetime, attempts: int) -> None:
        await self.orders.update_one({"_id": order_id}, {"$set": {"check_at": check_at, "attempts": attempts}})


class ChainStore:
    """The sandbox chain's ledger: one document per payment address with its transactions.

    Lives in MongoDB so it survives restarts and is shared by every process and the CLI."""

    def __init__(self, db: AsyncDatabase):
        self.chain = db.sandbox_chain

    async def open(self, payment: dict) -> None:
        await self.chain.insert_one({**payment, "txs": [], "rev": 0})

    async def get(self, payment_id: str) -> dict | None:
        return await self.chain.find_one({"_id": payment_id})

    async def by_order(self, order_id: str) -> dict | None:
        return await self.chain.find_one({"order_id": order_id})

    async def replace_txs(self, payment_id: str, rev: int, txs: list[dict], updated_at: datetime) -> bool:
        """Compare-and-set of the transaction list; False when another writer got there first."""
        result = await self.chain.update_one(
            {"_id": payment_id, "rev": rev}, {"$set": {"txs": txs, "updated_at": updated_at}, "$inc": {"rev": 1}}
        )
        return result.modified_count == 1
