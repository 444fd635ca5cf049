"""Monthly statements: per account and calendar month (UTC), the opening balance, every credit added, the usage by
endpoint with what the answer cache saved, and the closing balance (docs/billing.md, Monthly statements).

Where the figures come from, none of them by reading usage records:
- Credits added: the account's journal of additions (`additions` on the account, storage/accounts.py), each entry
  pushed in the same atomic write that changes `credits_added`, so the journal and the ledger never disagree.
  Credits an account got before the journal existed (`credits_added` + `credits_unpaid` - the journal's sum) are
  one line, "brought forward", on the day the account was created.
- Credits charged and saved: the usage by month (storage/usage_months.py), a delta inserted by each flush batch and
  folded into one summary per month, process and lease (a few documents, whatever the number of calls), plus the
  calls this process still buffers (read-your-writes, as /usage does).
- Opening balance: everything added before the month minus everything charged before it, summed forward from the
  account's first month. Exact by construction: it is the same sum the closing balance of the month before is, so
  closing(m) = opening(m + 1) always; and the sum over every month up to now is the ledger's balance, which
  `reconciled` checks with the reconcile command's own identity (accounting/reconcile.py `account_differences`:
  credits added + unpaid = balance + charged usage, the usage taken from the same monthly figures).
  Nothing the figures rest on expires (the journal lives on the account; usage and its monthly figures are never
  deleted: the ledger needs every charge since the account began), so statements of old months add up too.

A month is final once it is over; the current month is the statement so far. Months before the account was
created, after the current one, or not a month at all are refused (`BadMonth`).
"""

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

from accounting.meter import Meter
from accounting.reconcile import account_differences
from billing.receipts import Billing
from storage.accounts import AccountStore
from storage.clock import now_utc
from storage.usage_months import UsageMonths, endpoint_name, from_cache, merged, month_of

MONTH = re.compile(r"([0-9]{4})-([0-9]{2})")  # ASCII digits only (\d also matches other scripts' digits)
READS = 3  # reads of the books while a lease is given back under them (see _books)

KINDS = {
    "signup": "Signup credits",
    "credit": "Credits added (development top-up or operator)",
    "payment": "Top-up",
    "admin_credit": "Credit by the operator",
    "admin_debit": "Debit by the operator",
    "unpaid": "Calls served that the balance could not pay",
    "brought_forward": "Brought forward (credits added before statements were kept)",
}


class BadMonth(ValueError):
    pass


@dataclass
class Usage:
    endpoint: str
    calls: int = 0
    credits: int = 0
    cached_calls: int = 0
    credits_saved: int = 0


@dataclass
class Addition:
    at: datetime
    kind: str
    credits: int
    credit_id: str | None = None
    order_id: str | None = None
    receipt: str | None = None

    @property
    def description(self) -> str:
        text = KINDS.get(self.kind, self.kind)
        if self.order_id:
            text += f", order {self.order_id}"
        if self.receipt:
            text += f", receipt {self.receipt}"
        return text


@dataclass
class Statement:
    account_id: str
    month: str
    final: bool
    opening_balance: int
    additions: list[Addition] = field(default_factory=list)
    usage: list[Usage] = field(default_factory=list)
    reconciled: bool = True
    differences: list[str] = field(default_factory=list)
    holder: str = ""  # the account's name, or its email: who documents are for without billing details

    @property
    def credits_added(self) -> int:
        return sum(a.credits for a in self.additions)

    @property
    def credits_charged(self) -> int:
        return sum(u.credits for u in self.usage)

    @property
    def credits_saved(self) -> int:
        return sum(u.credits_saved for u in self.usage)

    @property
    def calls(self) -> int:
        return sum(u.calls for u in self.usage)

    @property
    def closing_balance(self) -> int:
        return self.opening_balance + self.credits_added - self.credits_charged

    @property
    def start(self) -> datetime:
        return month_start(self.month)

    @property
    def end(self) -> datetime:
        return month_start(next_month(self.month))


def month_start(month: str) -> datetime:
    year, number = int(month[:4]), int(month[5:])
    return datetime(year, number, 1, tzinfo=UTC)


def next_month(month: str) -> str:
    year, number = int(month[:4]), int(month[5:])
    return f"{year + number // 12:04d}-{number % 12 + 1:02d}"


def months_from(first: str, last: str) -> list[str]:
    out = [first]
    while out[-1] < last:
        out.append(next_month(out[-1]))
    return out


def parse_month(text: str) -> str:
    """yyyy-mm with a month 01..12, or BadMonth."""
    found = MONTH.fullmatch(text)
    if not found or not 1 <= int(found[2]) <= 12 or int(found[1]) < 1:
        raise BadMonth("Input should be a month as yyyy-mm (2026-03)")
    return text


def began(doc: dict) -> datetime:
    """When the account began: when an invited person's sign-in became an account of its own
    (storage/accounts.py `become_account`), else when it was made; the months before had no books."""
    return doc.get("became_account_at") or doc["created_at"]


def order_of(credit_id: str | None) -> str | None:
    """A payment's credit id is `<order id>:<total>` (payments/crediting.py)."""
    return credit_id.rsplit(":", 1)[0] if credit_id and ":" in credit_id else None


@dataclass
class Books:
    """One account's history as statements read it."""

    created: datetime
    holder: str
    additions: list[Addition]
    usage: dict[str, dict[str, Usage]]  # month -> endpoint -> usage
    differences: list[str]  # the ledger identity's, as the reconcile command words them (empty: it holds)


class Statements:
    def __init__(self, accounts: AccountStore, months: UsageMonths, meter: Meter, billing: Billing):
        self.accounts, self.months, self.meter = accounts, months, meter
        self.billing = billing  # receipts' numbers, the issuer and the customer's billing details

    async def available(self, account_id: str) -> list[str]:
        """The account's months, newest first: from the month it was created to the current one."""
        doc = await self.accounts.get(account_id)
        if doc is None:
            return []
        return months_from(month_of(began(doc)), month_of(now_utc()))[::-1]

    async def statement(self, account_id: str, month: str) -> Statement:
        month = parse_month(month)
        current = month_of(now_utc())
        if month > current:
            raise BadMonth(f"{month} has not begun: statements run to the current month, {current}")
        books = await self._books(account_id)
        first = month_of(books.created)
        if month < first:
            raise BadMonth(f"The account was created in {first}: there is no statement before it")
        start = month_start(month)
        added_before = sum(a.credits for a in books.additions if a.at < start)
        charged_before = sum(u.credits for m, by in books.usage.items() if m < month for u in by.values())
        additions = [a for a in books.additions if month_of(a.at) == month]
        # A receipt's source is the credit it is for (billing/receipts.py): top-ups, and admin credits marked paid.
        sources = [f"credit:{a.credit_id}" for a in additions if a.credit_id]
        numbers = await self.billing.store.numbers_of(account_id, sources) if sources else {}
        for a in additions:
            a.receipt = numbers.get(f"credit:{a.credit_id}")
        usage = sorted(books.usage.get(month, {}).values(), key=lambda u: (-u.credits, u.endpoint))
        return Statement(
            account_id,
            month,
            final=month < current,
            opening_balance=added_before - charged_before,
            additions=additions,
            usage=usage,
            reconciled=not books.differences,
            differences=books.differences,
            holder=books.holder,
        )

    async def _books(self, account_id: str) -> Books:
        """The account's journal and usage by month, with the ledger identity checked on them. The account is read
        after the usage: a lease this process or another gives back in between moves credits by what that
        process spent, which the usage read may not have seen yet; the reads are then made again."""
        for _ in range(READS):
            prefix, buffered = self.meter.reads.buffered(account_id)  # before the stored figures: see _usage
            docs = await self.months.of_account(account_id)
            doc = await self.accounts.get(account_id)
            if doc is None or "created_at" not in doc or doc.get("person"):
                raise BadMonth("No statement: this is not an account")
            usage, by_lease = _usage(docs, prefix, buffered)
            differences = account_differences(doc, by_lease)
            if not differences:
                break
        holder = doc.get("name") or doc.get("email") or ""
        return Books(began(doc), holder, _additions(doc), usage, differences)


def _additions(doc: dict) -> list[Addition]:
    journal = [
        Addition(
            e["at"], e["kind"], e["credits"], e.get("id"), order_of(e.get("id")) if e["kind"] == "payment" else None
        )
        for e in doc.get("additions") or ()
    ]
    before = doc.get("credits_added", 0) + doc.get("credits_unpaid", 0) - sum(a.credits for a in journal)
    if before:
        journal.insert(0, Addition(began(doc), "brought_forward", before))
    return sorted(journal, key=lambda a: a.at)


def _usage(docs: list[dict], prefix: str, buffered: list[tuple[int, dict]]):
    """month -> endpoint -> Usage, and credits charged per lease (the ledger's view), from the usage by month and
    this process's buffered records. A buffered record is counted unless the usage by month of its month, process
    and lease already counts its batch (`through`): the buffer is read first, so a batch written meanwhile is
    counted once, from the figures."""
    usage: dict[str, dict[str, Usage]] = {}
    by_lease: dict[str, int] = {}
    figures = merged(docs)
    for (_, month_name, _, lease), sums in figures.items():
        by_lease[lease] = by_lease.get(lease, 0) + sums["credits"]
        month = usage.setdefault(month_name, {})
        for name, by in sums["e"].items():
            endpoint = endpoint_name(name)
            u = month.setdefault(endpoint, Usage(endpoint))
            u.calls += by.get("n", 0)
            u.credits += by.get("c", 0)
            u.cached_calls += by.get("h", 0)
            u.credits_saved += by.get("s", 0)
    through = {(month, writer, lease): sums["through"] for (_, month, writer, lease), sums in figures.items()}
    for seq, r in buffered:
        month_name = month_of(r["ts"])
        if seq <= through.get((month_name, prefix, r["lease"]), -1):
            continue
        by_lease[r["lease"]] = by_lease.get(r["lease"], 0) + r["credits"]
        u = usage.setdefault(month_name, {}).setdefault(r["endpoint"], Usage(r["endpoint"]))
        u.calls += 1
        u.credits += r["credits"]
        if from_cache(r):
            u.cached_calls += 1
            u.credits_saved += r.get("saved", 0)
    return usage, by_lease
