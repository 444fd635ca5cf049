"""The account's balance and plan, and its usage history (buffered calls included)."""

from datetime import UTC, datetime, timedelta

from handlers.base import BaseHandler
from handlers.validation import parse_int


class AccountHandler(BaseHandler):
    """Credit balance and plan state."""

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

    async def get(self) -> None:
        account_id = self.bearer_account()
        days = parse_int(self.get_query_argument("days", "14"), ["query", "days"], 1, 365)
        limit = parse_int(self.get_query_argument("limit", "1000"), ["query", "limit"], 1, 10_000)
        since = datetime.now(UTC) - timedelta(days=days)
        records = await self.ctx.meter.usage_of(account_id, since, limit)
        self.send_json(
            [
                {
                    "endpoint": r["endpoint"],
                    "timestamp": r["ts"].isoformat().replace("+00:00", "Z"),
                    "credits": r["credits"],
                    "status": r["status"],
                    "key_id": r["key_id"],
                    "request_id": r["_id"],
                }
                for r in records
            ]
        )


routes = [
    (r"/account", AccountHandler),
    (r"/usage", UsageHandler),
]
