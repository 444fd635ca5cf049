"""`social-gateway reconcile`: the books (storage/ledger.py, read at one moment) checked against each other, the way
a ledger's balances are checked against its transfers. Pure: no I/O.

- Every account: credits added (+ calls served that no balance could pay) = balance + charged usage, where the
  balance counts what its leases still hold for calls in flight (docs/architecture.md, Credits).
- Every account: its usage by month (what monthly statements read) counts the same charges as its usage records.
- Every order: the credits it says it applied = its ledger entries. Each credit of an order is named after the
  total it brings the order to (`<order id>:<total>`, payments/crediting.py), on the account once settled and in
  the order's `pending` until then: the highest total among them is what the entries add up to.
- Every key budget of the current period: the credits its keys' stored usage spent are at most what processes
  took from the budget, and that at most its limit (storage/budgets.py).
"""

from dataclasses import dataclass, field
from datetime import datetime

from metering.ledger import budget_period
from storage.ledger import Books, charged


@dataclass
class Report:
    differences: list[str] = field(default_factory=list)
    accounts: int = 0
    orders: int = 0
    budgets: int = 0
    added: int = 0
    balance: int = 0
    charged: int = 0
    held: int = 0  # in leases: reserved by calls in flight, or taken for calls to come
    pending_orders: int = 0  # orders with credits recorded but not yet on the account

    def summary(self) -> str:
        state = "OK" if not self.differences else f"{len(self.differences)} differences"
        return (
            f"reconcile {state}: {self.accounts} accounts, {self.orders} orders, {self.budgets} key budgets; "
            f"credits added {self.added} = balance {self.balance} (of which {self.held} held in leases) "
            f"+ charged usage {self.charged}"
            + (f"; {self.pending_orders} order credits pending" if self.pending_orders else "")
        )


def figures(doc: dict, usage: dict[str, int]) -> dict:
    """One account's side of the equation."""
    leases = {process: lease.get("amount", 0) for process, lease in (doc.get("leases") or {}).items()}
    held = sum(amount - usage.get(process, 0) for process, amount in leases.items())
    charged = sum(usage.values())
    return {"credits": doc.get("credits", 0), "held": held, "balance": doc.get("credits", 0) + held, "charged": charged}


def check(books: Books, now: datetime) -> Report:
    report = Report()
    by_id = {doc["_id"]: doc for doc in books.accounts}
    for doc in books.accounts:
        _account(report, doc, books.usage.get(doc["_id"], {}))
        _months(report, doc, books.usage.get(doc["_id"], {}), books.months.get(doc["_id"], {}))
    for order in books.orders:
        _order(report, order, by_id.get(order["account_id"]))
    _budgets(report, books, now)
    return report


def _name(doc: dict) -> str:
    return f"account {doc['_id']} ({doc.get('email', 'no email')})"


def _account(report: Report, doc: dict, usage: dict[str, int]) -> None:
    report.accounts += 1
    f = figures(doc, usage)
    report.balance += f["balance"]
    report.held += f["held"]
    report.charged += f["charged"]
    if "credits_added" in doc:
        report.added += doc["credits_added"]
    report.differences.extend(account_differences(doc, usage))


def account_differences(doc: dict, usage: dict[str, int]) -> list[str]:
    """The account's side of the books checked: credits added (+ unpaid) = balance + charged usage (`usage`: credits
    charged per lease). Empty when it holds. Monthly statements check their figures with it too
    (billing/statements.py)."""
    if "credits_added" not in doc:
        return [
            f"{_name(doc)}: no ledger of additions (credits_added); start the gateway once to bring the schema up to date"
        ]
    f = figures(doc, usage)
    added, unpaid = doc["credits_added"], doc.get("credits_unpaid", 0)
    if added + unpaid == f["balance"] + f["charged"]:
        return []
    gap = f["balance"] + f["charged"] - added - unpaid
    return [
        f"{_name(doc)}: credits added {added}"
        + (f" + unpaid {unpaid}" if unpaid else "")
        + f" != balance {f['balance']} + charged usage {f['charged']} ({gap:+d} credits unaccounted for; "
        f"unleased {f['credits']}, held in leases {f['held']})"
    ]


def _months(report: Report, doc: dict, usage: dict[str, int], months: dict[str, int]) -> None:
    """The usage by month that statements read (storage/usage_months.py) counts every stored charge once."""
    if charged(months) != charged(usage):
        report.differences.append(
            f"{_name(doc)}: the usage by month (statements) counts {sum(months.values())} credits charged, "
            f"the usage records {sum(usage.values())}"
        )


def _totals(credit_ids, order_id: str) -> set[int]:
    """The order totals named by credit ids `<order id>:<total>` (other ids: admin credits, other orders)."""
    prefix = order_id + ":"
    return {int(c[len(prefix) :]) for c in credit_ids if c.startswith(prefix) and c[len(prefix) :].isdigit()}


def _order(report: Report, order: dict, account: dict | None) -> None:
    report.orders += 1
    if account is None:
        report.differences.append(f"order {order['_id']}: its account {order['account_id']} does not exist")
        return
    settled = _totals(account.get("applied_credits") or (), order["_id"])
    pending = _totals((c["credit_id"] for c in order.get("pending") or ()), order["_id"])
    if pending - settled:
        report.pending_orders += 1
    entries = max(settled | pending, default=0)
    if entries != order["credits_applied"]:
        report.differences.append(
            f"order {order['_id']} ({_name(account)}): credits applied {order['credits_applied']} "
            f"!= its ledger entries {entries}"
        )


def _budgets(report: Report, books: Books, now: datetime) -> None:
    runs: dict[tuple, list[dict]] = {}
    for key in books.budget_keys:
        budget_id = key.get("budget_id", key["_id"])
        kind = key.get("credit_limit_period") or "month"
        runs.setdefault((budget_id, key["credit_limit"], kind, key.get("budget_epoch", 0)), []).append(key)
    for (budget_id, limit, kind, epoch), keys in runs.items():
        period, since_day = budget_period(kind, now)
        doc_id = f"{budget_id}:{period}:{epoch}" if epoch else f"{budget_id}:{period}"  # storage/budgets.py _doc_id
        taken = books.budgets.get(doc_id)
        if taken is None:  # nothing taken from it this period: no call of its keys was charged to it
            continue
        report.budgets += 1
        spent = sum(
            credits for key in keys for day, credits in books.key_usage.get(key["_id"], {}).items() if day >= since_day
        )
        where = f"key budget {budget_id} (account {keys[0]['account_id']}, {kind} {period})"
        if spent > taken:
            report.differences.append(f"{where}: its keys spent {spent} credits, more than the {taken} taken from it")
        if taken > limit:
            report.differences.append(f"{where}: {taken} credits taken, more than its limit {limit}")
