"""Admin endpoints: service metrics and the accounts list. No token 401, not an admin 403.

Figures come from services/admin.py (storage/admin.py's rollups plus a live tail); this module only
checks the caller, validates parameters and shapes the answer.
"""

import base64
import binascii
from collections import Counter
from datetime import UTC, datetime, timedelta

import orjson

from handlers.base import BaseHandler, admin_only
from handlers.validation import Field, ValidationError, error
from services.admin import EPOCH, NOT_FORWARDED, TOP, UPSTREAM_FAILURES, Day

_MS = timedelta(milliseconds=1)
_SOURCE_KEYS = ("utm_source", "source", "ref", "referrer")

DAYS = Field(
    "days", int, required=False, default=30, minimum=1, maximum=365, description="Window in days, ending today (UTC)"
)
INCLUDE_INTERNAL = Field(
    "include_internal", bool, required=False, default=False, description="Include admins and internal accounts"
)
USERS_LIMIT = Field("limit", int, required=False, default=50, minimum=1, maximum=500)
CURSOR = Field("cursor", str, required=False, default="", description="next_cursor of the previous page")
SEARCH = Field(
    "q", str, required=False, default="", max_length=320, description="An account id, or part of an email (any case)"
)


def _classes(status: Counter) -> dict:
    classes = {"2xx": 0, "3xx": 0, "4xx": 0, "5xx": 0}
    for code, calls in status.items():
        name = f"{code[0]}xx"
        classes[name] = classes.get(name, 0) + calls
    return classes


def _usd(credits: int, per_usd: int) -> float:
    return round(credits / per_usd, 2)


def _percentiles(samples: list[float]) -> dict:
    """Nearest-rank percentiles in milliseconds."""
    ordered = sorted(samples)

    def pick(percent: int) -> float | None:
        return round(ordered[min(len(ordered) - 1, percent * len(ordered) // 100)] * 1000, 2) if ordered else None

    return {"p50": pick(50), "p90": pick(90), "p99": pick(99), "samples": len(ordered)}


class AdminMetricsHandler(BaseHandler):
    """Per-day series and window totals: signups, activity, calls, credits, revenue, endpoints, upstream health."""

    @admin_only
    async def get(self) -> None:
        days = self.query_arg(DAYS)
        include_internal = self.query_arg(INCLUDE_INTERNAL)
        settings = self.config
        data = await self.services.admin.metrics(days, include_internal, settings.admin_emails)
        per_usd = settings.credits_per_usd
        total, series = Day(), []
        for date, day in data["days"].items():
            series.append(
                {
                    "date": date,
                    "signups": day.signups,
                    "active_accounts": day.active,
                    "calls": day.calls,
                    "calls_by_status": _classes(day.status),
                    "credits_spent": day.credits,
                    "revenue_usd": _usd(day.revenue_credits, per_usd),
                }
            )
            total.add(day)
        # Rollups count everyone; an endpoint only internal accounts called is left at 0 once they are taken out.
        endpoints = [{"endpoint": e, "calls": c, "credits": k} for e, (c, k) in total.endpoints.items() if c > 0]
        failures = sum(n for code, n in total.status.items() if int(code) in UPSTREAM_FAILURES)
        forwarded = total.calls - sum(n for code, n in total.status.items() if int(code) in NOT_FORWARDED)
        self.send_json(
            {
                "window": {
                    "days": days,
                    "from": series[0]["date"],
                    "to": series[-1]["date"],
                    "include_internal": include_internal,
                },
                "totals": {
                    "signups": total.signups,
                    "active_accounts": data["active_accounts"],
                    "calls": total.calls,
                    "calls_by_status": _classes(total.status),
                    "credits_spent": total.credits,
                    "revenue_usd": _usd(total.revenue_credits, per_usd),
                },
                "series": series,
                "top_endpoints": {
                    "by_calls": sorted(endpoints, key=lambda e: (-e["calls"], e["endpoint"]))[:TOP],
                    "by_credits": sorted(endpoints, key=lambda e: (-e["credits"], e["endpoint"]))[:TOP],
                },
                "upstream": {
                    "calls": forwarded,
                    "errors": failures,
                    "error_rate": round(failures / forwarded, 4) if forwarded else 0.0,
                    # Latencies are kept in memory per process: they describe this process's recent calls.
                    "latency_ms": {
                        **_percentiles(self.services.admin.upstream_latencies()),
                        "scope": "this process, recent calls",
                    },
                },
                "rolled_up_until": data["watermark"] if data["watermark"] > EPOCH else None,
                "generated_at": datetime.now(UTC),
            }
        )


def _cursor(account: dict) -> str:
    key = [(account["created_at"] - EPOCH) // _MS, account["_id"]]
    return base64.urlsafe_b64encode(orjson.dumps(key)).decode().rstrip("=")


def _after(cursor: str) -> tuple[datetime, str] | None:
    if not cursor:
        return None
    try:
        millis, account_id = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if isinstance(millis, int) and isinstance(account_id, str):
            return EPOCH + millis * _MS, account_id
    except (binascii.Error, ValueError, TypeError, OverflowError):
        pass
    raise ValidationError(
        [error(["query", "cursor"], "Invalid cursor: pass next_cursor back unchanged", "value_error")]
    )


def _source(first_touch) -> str | None:
    """The first-touch source from the attribution blob, whichever common key the site used."""
    if isinstance(first_touch, dict):
        for key in _SOURCE_KEYS:
            if isinstance(first_touch.get(key), str) and first_touch[key]:
                return first_touch[key][:200]
    return None


class AdminUsersHandler(BaseHandler):
    """One row per account, newest signup first, paged with limit and cursor."""

    @admin_only
    async def get(self) -> None:
        include_internal = self.query_arg(INCLUDE_INTERNAL)
        limit = self.query_arg(USERS_LIMIT)
        after = _after(self.query_arg(CURSOR))
        search = self.query_arg(SEARCH)
        admins = self.config.admin_emails
        page, more = await self.services.admin.users(include_internal, admins, limit, after, search)
        # What the default filter hides, so that an empty page can say why (the portal's empty state).
        hidden = 0 if include_internal else len(await self.services.admin.internal_accounts(admins))
        rows = [
            {
                "account_id": a["_id"],
                "email": a["email"],
                "created_at": a["created_at"],
                "keys": {"active": a["keys_active"], "revoked": a["keys_revoked"]},
                "calls": a["calls"],
                "credits_spent": a["spent"],
                "total_paid_usd": round(a.get("paid_usd", 0.0), 2),
                "balance": await self.services.admin.balance(a["_id"], a),
                "first_touch_source": _source(a.get("first_touch")),
                "last_activity": a["last_activity"],
                "is_admin": bool(a.get("is_admin")),
                "internal": bool(a.get("internal")),
                "suspended": bool(a.get("suspended")),
            }
            for a in page
        ]
        self.send_json(
            {
                "users": rows,
                "has_next_page": more,
                "next_cursor": _cursor(page[-1]) if more else "",
                "internal_hidden": hidden,
            }
        )


routes = [
    (r"/admin/metrics", AdminMetricsHandler),
    (r"/admin/users", AdminUsersHandler),
]
