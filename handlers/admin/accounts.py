"""The admin console's account actions: one account's detail, a credit or debit with a reason, suspend and resume.
Admins only (401 without a session, 403 for everyone else); each action writes the audit log (BaseHandler.audit).

Credits and debits go to the ledger the way payments do: one atomic write of the account's unleased balance that
records its id in `applied_credits` (storage/accounts.py), so a repeat with the same Idempotency-Key changes it once,
even when the kept answer is lost. A debit never takes more than the unleased balance: credits leased to gateway
processes are spent by calls in flight, and taking them would let a balance go below zero.
"""

from bson import ObjectId

from handlers.audit.handlers import entry
from handlers.base import admin_only
from handlers.errors import ApiError, ValidationError, error
from handlers.idempotent import idempotency_key, idempotent
from handlers.keys.handlers import CREDITS, KeysBase
from handlers.members import member_view
from handlers.validation import Field, validate_body
from payments.service import view as order_view

RECENT = 20  # keys, orders, calls and audit entries shown in an account's detail


def _said(value: str, loc: list) -> None:
    if len(value.strip()) < 3:
        raise ValidationError([error(loc, "A reason of at least 3 characters is required", "string_too_short")])


REASON = Field("reason", str, min_length=3, max_length=500, check=_said, description="Why: kept in the audit log")
ADJUST = [CREDITS, REASON]
# A credit the customer paid the operator for outside the crypto checkout (a bank transfer): with `paid_usd` it
# counts toward the plan as a payment does and gets a numbered receipt (billing/receipts.py `admin_paid`).
CREDIT = [
    *ADJUST,
    Field("paid_usd", float, required=False, exclusive_minimum=0, maximum=1_000_000, description="Paid: a receipt"),
    Field("payment_reference", str, required=False, max_length=200, description="On the receipt: a transfer's id"),
]
SUSPEND = [REASON]
RESUME = [Field("reason", str, required=False, max_length=500, description="Why, for the audit log")]


class AccountAdminBase(KeysBase):
    async def target(self, account_id: str) -> dict:
        account = await self.services.admin.account(account_id)
        if account is None:
            raise ApiError(404, "Account not found")
        return account

    async def summary(self, account: dict) -> dict:
        view = await self.services.admin.view(account["_id"])
        return {
            "account_id": account["_id"],
            "email": account["email"],
            "created_at": account["created_at"],
            "credits": await self.services.admin.balance(account["_id"]),
            "plan": view.plan.name,
            "total_paid_usd": round(account.get("paid_usd", 0.0), 2),
            "is_admin": bool(account.get("is_admin")),
            "internal": bool(account.get("internal")),
            "suspended": bool(account.get("suspended")),
            "suspended_reason": account.get("suspended_reason"),
        }

    def adjustment_id(self, kind: str) -> str:
        """The ledger id of this credit or debit: the same for every repeat of one Idempotency-Key."""
        key = idempotency_key(self.request.headers)
        return f"admin-{kind}:{self.current_user}:{key}" if key else f"admin-{kind}:{ObjectId()}"


class AccountDetailHandler(AccountAdminBase):
    """Balance, plan, keys, orders, recent calls, audit entries and members of one account."""

    @admin_only
    async def get(self, account_id: str) -> None:
        account = await self.target(account_id)
        found = await self.services.admin.detail(account, RECENT)
        sign_ins = found["sign_ins"]
        self.send_json(
            {
                **await self.summary(account),
                "keys": await self.rows(account_id, limit=RECENT),
                "orders": [order_view(o) for o in found["orders"]],
                "recent_calls": [
                    {
                        "timestamp": r["ts"],
                        "endpoint": r["endpoint"],
                        "status": r["status"],
                        "credits": r["credits"],
                        "key_id": r["key_id"],
                        "request_id": r["request_id"],
                    }
                    for r in found["calls"]
                ],
                "audit": [entry(doc) for doc in found["audit"]],
                "members": [member_view(m, sign_ins.get(m["person_id"])) for m in found["members"]],
            }
        )


class CreditHandler(AccountAdminBase):
    """Adds credits to the account's balance; not to what it paid (the plan stays) unless marked paid (`paid_usd`),
    which also issues a receipt."""

    @admin_only
    @idempotent
    async def post(self, account_id: str) -> None:
        body = validate_body(self.json_body(), CREDIT)
        await self.target(account_id)
        credit_id, paid = self.adjustment_id("credit"), round(body.get("paid_usd") or 0.0, 2)
        await self.services.admin.credit(account_id, credit_id, body["credits"], paid)
        details = {"credits": body["credits"], "reason": body["reason"]}
        receipt = None
        if paid:
            # After the credit: a repeat of the Idempotency-Key finds the credit applied and issues the same receipt.
            reference = body.get("payment_reference") or ""
            receipt = await self.services.billing.admin_paid(account_id, credit_id, body["credits"], paid, reference)
            details.update(paid_usd=paid, receipt=receipt["_id"])
        await self.audit("admin.credit", account_id=account_id, details=details, admin=True)
        account = await self.target(account_id)
        answer = {**await self.summary(account), "credited": body["credits"]}
        if receipt is not None:
            answer["receipt"] = receipt["_id"]
        self.send_json(answer)


class DebitHandler(AccountAdminBase):
    """Takes credits from the account's unleased balance; 409 when that holds less (never below zero)."""

    @admin_only
    @idempotent
    async def post(self, account_id: str) -> None:
        body = validate_body(self.json_body(), ADJUST)
        await self.target(account_id)
        outcome, doc = await self.services.admin.debit(account_id, self.adjustment_id("debit"), body["credits"])
        if outcome == "missing":
            raise ApiError(404, "Account not found")
        if outcome == "short":
            free = doc.get("credits", 0)
            raise ApiError(
                409,
                f"Only {free} credits can be debited now: the rest of the balance is leased to gateway processes "
                "for calls in flight (given back when the account is idle); debit less or retry later",
            )
        if outcome == "done":
            details = {"credits": body["credits"], "reason": body["reason"]}
            await self.audit("admin.debit", account_id=account_id, details=details, admin=True)
        self.send_json({**await self.summary(doc), "debited": body["credits"]})


class SuspendHandler(AccountAdminBase):
    """Suspends (POST .../suspend) or resumes (POST .../resume) the account's data calls, filter rules and
    WebSockets, on every process."""

    def initialize(self, ctx, suspend: bool) -> None:
        super().initialize(ctx)
        self.suspend = suspend

    @admin_only
    async def post(self, account_id: str) -> None:
        body = validate_body(self.json_body(), SUSPEND if self.suspend else RESUME)
        await self.target(account_id)
        reason = body.get("reason")
        # In force here at once, elsewhere through coherence; the account's stream rules stop or resume with it.
        doc = await self.services.admin.suspend(account_id, (reason or "suspended") if self.suspend else None)
        if doc is None:
            raise ApiError(404, "Account not found")
        action = "admin.suspend" if self.suspend else "admin.resume"
        await self.audit(action, account_id=account_id, details={"reason": reason}, admin=True)
        self.send_json(await self.summary(doc))


routes = [
    (r"/admin/accounts/([^/]+)", AccountDetailHandler),
    (r"/admin/accounts/([^/]+)/credit", CreditHandler),
    (r"/admin/accounts/([^/]+)/debit", DebitHandler),
    (r"/admin/accounts/([^/]+)/suspend", SuspendHandler, {"suspend": True}),
    (r"/admin/accounts/([^/]+)/resume", SuspendHandler, {"suspend": False}),
]
