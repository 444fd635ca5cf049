"""The admin console's rules over the stores: the service's figures (storage/admin.py: rollups plus a live tail),
the accounts list, one account's detail, credits and debits through the meter's ledger writes, and a suspension
that reaches this process at once, every other one through coherence, and the account's stream rules."""

from accounting.keys import AccountView
from accounting.meter import Meter
from payments.service import Payments
from services.account import AccountService
from services.audit import AuditService
from social.upstream import UpstreamClient
from storage.accounts import AccountStore
from storage.admin import EPOCH, NOT_FORWARDED, TOP, UPSTREAM_FAILURES, AdminStore, Day
from storage.members import MemberStore
from storage.streams import StreamStore
from streams.poller import Poller

__all__ = ["EPOCH", "NOT_FORWARDED", "TOP", "UPSTREAM_FAILURES", "AdminService", "Day"]


class AdminService:
    def __init__(
        self,
        store: AdminStore,
        accounts: AccountStore,
        meter: Meter,
        payments: Payments,
        audit: AuditService,
        members: MemberStore,
        streams: StreamStore,
        poller: Poller,
        upstream: UpstreamClient,
    ):
        self.store, self.accounts, self.meter, self.payments = store, accounts, meter, payments
        self.audit, self.members, self.streams, self.poller, self.upstream = audit, members, streams, poller, upstream
        self.usage = AccountService(meter, accounts)

    async def metrics(self, days: int, include_internal: bool, admin_emails: tuple) -> dict:
        return await self.store.metrics(days, include_internal, admin_emails)

    def upstream_latencies(self) -> list[float]:
        """This process's recent provider answer times, seconds (kept in memory per process)."""
        return list(self.upstream.latencies)

    async def users(self, include_internal: bool, admin_emails: tuple, limit: int, after, search: str):
        return await self.store.users(include_internal, admin_emails, limit, after, search)

    async def internal_accounts(self, admin_emails: tuple) -> list[dict]:
        return await self.store.internal_accounts(admin_emails)

    async def account(self, account_id: str) -> dict | None:
        return await self.accounts.get(account_id)

    async def view(self, account_id: str) -> AccountView:
        return await self.meter.account_view(account_id)

    async def balance(self, account_id: str, doc: dict | None = None) -> int:
        return await self.meter.balance(account_id, doc)

    async def detail(self, account: dict, recent: int) -> dict:
        """An account's newest orders, calls and audit entries (`recent` of each) and its members with their
        sign-ins."""
        account_id = account["_id"]
        orders = await self.payments.orders_of(account_id, recent)
        calls = await self.usage.recent(account_id, account["created_at"], recent)
        audit, _ = await self.audit.page(self.audit.query(account_id), None, recent)
        members = await self.members.of_account(account_id)
        sign_ins = await self.accounts.sign_ins([m["person_id"] for m in members])
        return {"orders": orders, "calls": calls, "audit": audit, "members": members, "sign_ins": sign_ins}

    async def credit(self, account_id: str, credit_id: str, credits: int, paid_usd: float = 0.0) -> AccountView:
        """Credits added to the balance, once per `credit_id`; to what the account paid (its plan) only when the
        operator marks them paid (`paid_usd`)."""
        return await self.meter.apply_credit(account_id, credit_id, credits, paid_usd)

    async def debit(self, account_id: str, debit_id: str, credits: int) -> tuple[str, dict | None]:
        """Credits taken from the unleased balance, once per `debit_id`: ("done" | "missing" | "short", the
        account)."""
        return await self.meter.apply_debit(account_id, debit_id, credits)

    async def suspend(self, account_id: str, reason: str | None) -> dict | None:
        """Suspends the account (a reason) or resumes it (None): the account as it is now, None when unknown."""
        doc = await self.accounts.set_suspended(account_id, reason)
        if doc is None:
            return None
        self.meter.account_changed(account_id, doc)  # here at once; elsewhere through coherence
        # Its rules stop polling on every process (the claim takes only active ones) and resume as they were;
        # its sockets are closed by each process's Hub.watch.
        if reason is not None:
            await self.streams.suspend(account_id)
        elif await self.streams.resume(account_id):
            self.poller.nudge()
        return doc
