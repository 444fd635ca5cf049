"""The account and its usage: its view (plan, limits), its balance, its name, and the usage reads, this process's
buffered calls included (read-your-writes; accounting/usage.py merges them with the stored records)."""

from collections.abc import AsyncIterator, Callable
from datetime import datetime

from accounting.keys import AccountView
from accounting.meter import Meter
from services.balances import RecentBalances
from storage.accounts import AccountStore
from storage.usage import log_order

__all__ = ["AccountService", "log_order"]


class AccountService:
    def __init__(self, meter: Meter, accounts: AccountStore):
        self.meter, self.accounts = meter, accounts
        self.balances = RecentBalances(meter.ledger, self.balance)

    async def view(self, account_id: str) -> AccountView:
        """The account as the data plane sees it: its plan, limits and suspension (cached)."""
        return await self.meter.account_view(account_id)

    async def balance(self, account_id: str, doc: dict | None = None) -> int:
        """Credits, leases included (from `doc`, the account as just read, when given)."""
        return await self.meter.balance(account_id, doc)

    async def rename(self, account_id: str, name: str | None) -> dict | None:
        """Names the account (None: no name); the account document after it, None if it is gone."""
        return await self.accounts.set_name(account_id, name)

    async def labels(self, account_ids: list[str]) -> dict[str, dict]:
        """Each account's name (when it has one) and email, by id: what tells a person's accounts apart."""
        return await self.accounts.labels(account_ids)

    async def balance_after(self, account_id: str) -> int:
        """The balance after this process's settled charges, read at most a second ago (services/balances.py): what
        a tool result reports on every call, without a database read each time."""
        return await self.balances.after(account_id)

    async def recent(self, account_id: str, since: datetime, limit: int) -> list[dict]:
        return await self.meter.reads.recent(account_id, since, limit)

    async def summary(self, account_id: str, since_day: str, group_by: tuple[str, ...]) -> dict[tuple, list]:
        return await self.meter.reads.summary(account_id, since_day, group_by)

    async def latency(self, account_id: str, since: datetime) -> dict[str, dict]:
        return await self.meter.reads.latency(account_id, since)

    async def log(
        self, account_id: str, since: datetime, until: datetime, match: Callable[[dict], bool], limit: int
    ) -> list[dict]:
        return await self.meter.reads.log(account_id, since, until, match, limit)

    def export(self, account_id: str, since: datetime, until: datetime) -> AsyncIterator[dict]:
        return self.meter.reads.export(account_id, since, until)
