"""The account's balance and plan, and its usage history (buffered calls included)."""

from datetime import UTC, datetime, timedelta

from handlers.base import BaseHandler, authenticated
from handlers.validation import Field

DAYS = Field("days", int, required=False, default=14, minimum=1, maximum=365, description="Window in days, ending now")
LIMIT = Field(
    "limit", int, required=False, default=1000, minimum=1, maximum=10_000, description="At most this many records"
)


class AccountHandler(BaseHandler):
    """Credit balance and plan state."""

    @authenticated
    async def get(self) -> None:
        account = await self.current_account()
        view = await self.ctx.meter.account_view(account["_id"])
        self.send_json(
            {
                "account_id": account["_id"],
                "email": account["email"],
                "credits": await self.ctx.meter.balance(account["_id"], account),
                "plan": view.plan.name,
                "qps_limit": view.plan.qps,  # per key
                "account_qps_limit": view.plan.account_qps,  # all the account's keys together
                "max_keys": self.ctx.settings.max_keys_per_account,
                "total_paid_usd": round(account.get("paid_usd", 0.0), 2),
                "credits_per_usd": self.ctx.settings.credits_per_usd,
                "created_at": account["created_at"],
            }
        )


class UsageHandler(BaseHandler):
    """Per-call history, newest first."""

    @authenticated
    async def get(self) -> None:
        since = datetime.now(UTC) - timedelta(days=self.query_arg(DAYS))
        records = await self.ctx.meter.usage_of(self.current_user, since, self.query_arg(LIMIT))
        self.send_json(
            [
                {
                    "endpoint": r["endpoint"],
                    "timestamp": r["ts"],
                    "credits": r["credits"],
                    "status": r["status"],
                    "key_id": r["key_id"],
                    "request_id": r["request_id"],  # the X-Request-ID of the call's answer
                }
                for r in records
            ]
        )


routes = [
    (r"/account", AccountHandler),
    (r"/usage", UsageHandler),
]
