"""What the database holds about credits, read at one moment: the books `social-gateway reconcile` checks
(accounting/reconcile.py) and the schema step that started the ledger of additions (storage/schema.py).

The ledger of additions is one field per account, `credits_added`: every write that adds credits from outside
(signup credits, a development top-up or `admin credit`, a settled payment, an admin console credit) or takes
them away (an admin console debit) changes it in the same atomic write as `credits` (storage/accounts.py).
Charges are not additions: they are the usage records. `credits_unpaid` counts calls served around a lease
reclaim that the balance could no longer pay (storage/leases.py `_debit`). So for every account, at any moment:

    credits_added + credits_unpaid = balance + charged usage
    balance = credits + sum over its leases (lease - usage of that lease)   (docs/architecture.md)

Reads are synchronous (the operations commands run outside any event loop).
"""

from dataclasses import dataclass, field

import orjson
import pymongo
from pymongo.client_session import ClientSession

from storage import usage_months
from storage.accounts import ACCOUNTS_ONLY

ACCOUNT_FIELDS = {"email": 1, "credits": 1, "leases": 1, "credits_added": 1, "credits_unpaid": 1, "applied_credits": 1}
RETRIES = 20  # reads of an account whose leases moved while its usage was summed (no snapshot)


@dataclass
class Books:
    accounts: list[dict]
    usage: dict[str, dict[str, int]]  # account id -> lease -> credits charged
    orders: list[dict] = field(default_factory=list)
    budget_keys: list[dict] = field(default_factory=list)  # keys with a credit limit
    budgets: dict[str, int] = field(default_factory=dict)  # key_budgets _id -> taken
    key_usage: dict[int, dict[str, int]] = field(default_factory=dict)  # key id -> day -> credits
    # account id -> lease -> credits charged, as the usage by month statements read counts them (usage_months.py)
    months: dict[str, dict[str, int]] = field(default_factory=dict)


def usage_by_lease(db, session: ClientSession | None, account_id: str | None = None) -> dict[str, dict[str, int]]:
    """Charged credits per account and lease (one aggregation over the usage buckets)."""
    pipeline = [{"$group": {"_id": {"a": "$account_id", "l": "$lease"}, "credits": {"$sum": "$credits"}}}]
    if account_id is not None:
        pipeline.insert(0, {"$match": {"account_id": account_id}})
    out: dict[str, dict[str, int]] = {}
    for row in db.usage_buckets.aggregate(pipeline, session=session):
        out.setdefault(row["_id"]["a"], {})[row["_id"]["l"]] = row["credits"]
    return out


def months_by_lease(db, session: ClientSession | None, account_id: str | None = None) -> dict[str, dict[str, int]]:
    """Charged credits per account and lease as the usage by month counts them (storage/usage_months.py): its deltas
    read before its summaries, each batch counted once."""
    query = {} if account_id is None else {"account_id": account_id}
    docs = list(db.usage_months.find({**query, "kind": "d"}, session=session))
    docs += db.usage_months.find({**query, "kind": "s"}, session=session)
    out: dict[str, dict[str, int]] = {}
    for (account, _, _, lease), figures in usage_months.merged(docs).items():
        mine = out.setdefault(account, {})
        mine[lease] = mine.get(lease, 0) + figures["credits"]
    return out


def charged(by_lease: dict[str, int]) -> dict[str, int]:
    """Credits per lease, leases that charged nothing left out (the two countings keep those differently)."""
    return {lease: credits for lease, credits in by_lease.items() if credits}


def months_with_usage(db, session: ClientSession | None, usage: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """The usage by month of every account, read after `usage`. A batch is added to it right after its records are
    stored (storage/usage.py insert_batch): an account whose two countings differ while batches are written is
    read again alone, both countings, until they agree or RETRIES reads have passed; what then differs is a
    difference (and `usage` is updated with the last read)."""
    months = months_by_lease(db, session)
    for account_id in set(months) | set(usage):
        for _ in range(RETRIES if session is None else 0):
            if charged(months.get(account_id, {})) == charged(usage.get(account_id, {})):
                break
            usage[account_id] = usage_by_lease(db, None, account_id).get(account_id, {})
            months[account_id] = months_by_lease(db, None, account_id).get(account_id, {})
    return months


def accounts_with_usage(db, session: ClientSession | None) -> tuple[list[dict], dict[str, dict[str, int]]]:
    """Every account and its charged usage per lease, as at one moment. With a snapshot, plainly. Without one
    (a standalone mongod), the accounts are read before and after the usage is summed: an account whose
    `credits` or leases moved in between (a lease taken, given back or closed while the sum ran) is read again
    alone until it stands still; usage written meanwhile to a lease the account holds changes nothing (the
    lease's unspent part and the charge move together)."""
    before = {doc["_id"]: doc for doc in db.accounts.find(ACCOUNTS_ONLY, ACCOUNT_FIELDS, session=session)}
    usage = usage_by_lease(db, session)
    if session is not None:
        return list(before.values()), usage
    after = {doc["_id"]: doc for doc in db.accounts.find(ACCOUNTS_ONLY, ACCOUNT_FIELDS)}
    for account_id, doc in after.items():
        for _ in range(RETRIES):
            if _moves(before.get(account_id)) == _moves(doc):
                break
            before[account_id] = doc
            usage[account_id] = usage_by_lease(db, None, account_id).get(account_id, {})
            doc = db.accounts.find_one({"_id": account_id}, ACCOUNT_FIELDS)
        before[account_id] = doc
    return [doc for doc in before.values() if doc is not None], usage


def _moves(doc: dict | None) -> tuple:
    return (doc or {}).get("credits"), (doc or {}).get("leases"), (doc or {}).get("credits_added")


def read_books(db, session: ClientSession | None) -> Books:
    accounts, usage = accounts_with_usage(db, session)
    books = Books(accounts, usage)
    books.months = months_with_usage(db, session, usage)
    books.orders = list(
        db.orders.find(
            {"credits_applied": {"$gt": 0}}, {"account_id": 1, "credits_applied": 1, "pending": 1}, session=session
        )
    )
    books.budget_keys = list(
        db.keys.find(
            {"credit_limit": {"$type": "number"}},
            {"account_id": 1, "credit_limit": 1, "credit_limit_period": 1, "budget_id": 1, "budget_epoch": 1},
            session=session,
        )
    )
    if books.budget_keys:
        books.budgets = {doc["_id"]: doc["taken"] for doc in db.key_budgets.find({}, {"taken": 1}, session=session)}
        accounts_of = sorted({key["account_id"] for key in books.budget_keys})
        query = {"account_id": {"$in": accounts_of}}
        for doc in db.usage_totals.find(query, {"day": 1, "rows": 1}, session=session):
            # One JSON value per totals document (storage/usage.py totals_doc).
            for key_id, _endpoint, _calls, credits, _errors in orjson.loads(doc["rows"]):
                days = books.key_usage.setdefault(key_id, {})
                days[doc["day"]] = days.get(doc["day"], 0) + credits
    return books


def set_credits_added(db: pymongo.database.Database, account_id: str, value: int) -> bool:
    """Starts an account's ledger of additions (the schema step that introduced it), once."""
    result = db.accounts.update_one(
        {"_id": account_id, "credits_added": {"$exists": False}}, {"$set": {"credits_added": value}}
    )
    return result.modified_count == 1
