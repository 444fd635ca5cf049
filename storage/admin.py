"""The queries behind /admin: usage rollups built by aggregation, and the reads that combine them.

Usage lives in buckets (storage/usage.py). Aggregating every bucket on each admin
request costs seconds per 100k records on the embedded server, so a background
step (`refresh`) folds the buckets older than a watermark into two rollups:

    admin_days:     {_id: "YYYY-MM-DD", calls, credits, status: {"200": n}, endpoints: {ep: {calls, credits}},
                     active, signups, step}
    admin_accounts: {_id: account_id, calls, credits, last_ts, step}
    admin_state:    {_id: "usage", watermark, next}

A request reads the rollups and aggregates only the buckets newer than the watermark
(about a minute of traffic). Internal accounts are subtracted at read time, so
granting or flagging an account changes past figures too.

A step is idempotent: its interval is recorded in admin_state before any rollup
changes, every rollup write is guarded by the step id, and the day documents are
written before the account documents whose previous `last_ts` their active counts
are computed from. A crashed or concurrent step therefore repeats to the same result.
"""

import asyncio
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta

from pymongo import ASCENDING, DESCENDING, IndexModel, UpdateOne
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError, DuplicateKeyError, PyMongoError

from storage.accounts import ACCOUNTS_ONLY
from storage.db import only_duplicates

log = logging.getLogger("gateway.admin")

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Buckets reach the database within a flush interval; a minute leaves room for slow flushes.
# A bucket older than the watermark when it arrives (a flush delayed by a long outage) is not rolled up.
GRACE = timedelta(seconds=60)
REFRESH_SECONDS = 30.0
IN_CHUNK = 50  # ids per $in: the embedded server's cost grows faster than the list
FIRST_WINDOW = timedelta(hours=1)  # of signups, when paging /admin/users; widened x4 until a page is full
_USER = {
    "email": 1,
    "created_at": 1,
    "credits": 1,
    "leases": 1,
    "paid_usd": 1,
    "first_touch": 1,
    "is_admin": 1,
    "internal": 1,
    "suspended": 1,
}
UPSTREAM_FAILURES = {502, 503, 504}  # what the data plane records when the provider failed
NOT_FORWARDED = {501}  # announced but unavailable: never reaches the provider
TOP = 10

INDEXES = {
    "accounts": [
        IndexModel([("is_admin", ASCENDING)]),
        IndexModel([("internal", ASCENDING)]),
        IndexModel([("created_at", DESCENDING), ("_id", DESCENDING)]),
    ],
    "admin_accounts": [IndexModel([("last_ts", DESCENDING)])],
    "orders": [IndexModel([("updated_at", DESCENDING)])],
}


def search_filter(text: str, member_of: list[str] = ()) -> dict:
    """The accounts an admin's search names: the one with that id, those whose email contains it, and
    `member_of`: those with a member whose email contains it (an invited person has no account of their own)."""
    text = text.strip()
    if not text:
        return {}
    named = [{"_id": text}, {"email": {"$regex": re.escape(text), "$options": "i"}}]
    return {"$or": named + ([{"_id": {"$in": list(member_of)}}] if member_of else [])}


def day_start(day: str) -> datetime:
    return datetime.combine(date.fromisoformat(day), time.min, tzinfo=UTC)


def _ms(value: datetime) -> datetime:
    """MongoDB keeps milliseconds: rounding first keeps watermarks equal to what is stored."""
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


@dataclass
class Day:
    """One day's figures, added up from rollups and live aggregations (and subtracted for internal accounts)."""

    calls: int = 0
    credits: int = 0
    status: Counter = field(default_factory=Counter)
    endpoints: dict = field(default_factory=dict)  # endpoint -> [calls, credits]
    active: int = 0
    signups: int = 0
    revenue_credits: int = 0

    def add_detail(self, row: dict, sign: int = 1) -> None:
        """A row of the detail pipeline: one (endpoint, status) of this day."""
        calls, credits = sign * row["calls"], sign * row["credits"]
        self.calls += calls
        self.credits += credits
        self.status[str(row["_id"]["s"])] += calls
        totals = self.endpoints.setdefault(row["_id"]["e"], [0, 0])
        totals[0] += calls
        totals[1] += credits

    def add_rollup(self, doc: dict) -> None:
        self.calls += doc.get("calls", 0)
        self.credits += doc.get("credits", 0)
        self.status.update(doc.get("status", {}))
        for endpoint, value in doc.get("endpoints", {}).items():
            totals = self.endpoints.setdefault(endpoint, [0, 0])
            totals[0] += value.get("calls", 0)
            totals[1] += value.get("credits", 0)
        self.active += doc.get("active", 0)
        self.signups += doc.get("signups", 0)

    def add(self, other: "Day") -> None:
        """Another day's figures into this one (window totals); active accounts are not additive."""
        self.calls += other.calls
        self.credits += other.credits
        self.status.update(other.status)
        for endpoint, (calls, credits) in other.endpoints.items():
            totals = self.endpoints.setdefault(endpoint, [0, 0])
            totals[0] += calls
            totals[1] += credits
        self.signups += other.signups
        self.revenue_credits += other.revenue_credits

    def increments(self) -> dict:
        inc = {"calls": self.calls, "credits": self.credits, "active": self.active, "signups": self.signups}
        inc.update({f"status.{code}": n for code, n in self.status.items()})
        for endpoint, (calls, credits) in self.endpoints.items():
            inc[f"endpoints.{endpoint}.calls"] = calls
            inc[f"endpoints.{endpoint}.credits"] = credits
        return inc


def _on(series: dict, day: str) -> Day:
    """The day's entry; a throwaway one for a day outside the window (a writer whose clock runs ahead)."""
    return series.get(day) or Day()


def _pairs(*matches: dict) -> list:
    """Per (day, account): calls, credits, last call. One row per bucket group: no per-record work.

    Each match is its own stage, most selective first: the embedded server picks its index from the first."""
    group = {
        "_id": {"d": "$day", "a": "$account_id"},
        "calls": {"$sum": "$n"},
        "credits": {"$sum": "$credits"},
        "last": {"$max": "$ts_max"},
    }
    return [{"$match": m} for m in matches] + [{"$group": group}]


def _detail(*matches: dict) -> list:
    """Per (day, endpoint, status): calls and credits, from the records inside the buckets."""
    group = {
        "_id": {"d": "$day", "e": "$records.endpoint", "s": "$records.status"},
        "calls": {"$sum": 1},
        "credits": {"$sum": "$records.credits"},
    }
    return [{"$match": m} for m in matches] + [
        {"$project": {"day": 1, "records.endpoint": 1, "records.status": 1, "records.credits": 1}},
        {"$unwind": "$records"},
        {"$group": group},
    ]


def _per_day(matches: list, date_field: str, total: dict) -> list:
    day = {"$dateToString": {"format": "%Y-%m-%d", "date": f"${date_field}"}}
    return [{"$match": m} for m in matches] + [{"$group": {"_id": day, "n": total}}]


class AdminStore:
    def __init__(self, db: AsyncDatabase):
        self.db = db
        self.accounts, self.keys, self.buckets, self.orders = db.accounts, db.keys, db.usage_buckets, db.orders
        self.days, self.rollup_accounts, self.state = db.admin_days, db.admin_accounts, db.admin_state
        self.members = db.members

    async def ensure_indexes(self) -> None:
        for name, indexes in INDEXES.items():
            await self.db[name].create_indexes(indexes)

    async def ping(self, timeout: float) -> bool:
        """True when the database answers within `timeout` seconds (readiness)."""
        try:
            await asyncio.wait_for(self.db.command("ping"), timeout)
            return True
        except (TimeoutError, PyMongoError):
            return False

    async def _rows(self, collection, pipeline: list) -> list[dict]:
        return await (await collection.aggregate(pipeline)).to_list(None)

    # --- accounts ---------------------------------------------------------------------------
    async def internal_accounts(self, admin_emails: tuple) -> list[dict]:
        """Admins (flag or ADMIN_EMAILS) and accounts flagged internal: few, found by index.

        Three queries rather than one $or: the embedded server scans the whole collection for an $or."""
        found: dict[str, dict] = {}
        for query in ({"is_admin": True}, {"internal": True}, {"email": {"$in": list(admin_emails)}}):
            async for doc in self.accounts.find(query, {"created_at": 1}):
                found[doc["_id"]] = doc
        return list(found.values())

    async def _last_seen(self, account_ids: list[str]) -> dict[str, datetime]:
        """Each account's last call as the rollups know it (before the watermark)."""
        docs = await self._in_chunks(
            account_ids, lambda part: self.rollup_accounts.find({"_id": {"$in": part}}, {"last_ts": 1}).to_list(None)
        )
        return {doc["_id"]: doc["last_ts"] for doc in docs}

    @staticmethod
    async def _in_chunks(ids: list, read) -> list:
        found = []
        for i in range(0, len(ids), IN_CHUNK):
            found += await read(ids[i : i + IN_CHUNK])
        return found

    @staticmethod
    def _count_active(at, pairs: list[dict], seen: dict[str, datetime]) -> None:
        """Counts (day, account) pairs as active on `at(day)` unless the rollups already saw that account that day."""
        for row in pairs:
            day, account_id = row["_id"]["d"], row["_id"]["a"]
            before = seen.get(account_id)
            if before is None or before < day_start(day):
                at(day).active += 1

    # --- rollups ----------------------------------------------------------------------------
    async def watermark(self) -> datetime:
        state = await self.state.find_one({"_id": "usage"}) or {}
        return state.get("watermark") or EPOCH

    async def refresh(self, now: datetime | None = None) -> bool:
        """Folds the buckets older than now - GRACE into the rollups; False when there was nothing to fold."""
        state = await self.state.find_one({"_id": "usage"}) or {}
        if state.get("next") is None:
            end = _ms((now or datetime.now(UTC)) - GRACE)
            if end <= (state.get("watermark") or EPOCH):
                return False
            try:  # claim the interval; whoever loses the race works on the winner's interval
                await self.state.update_one(
                    {"_id": "usage", "watermark": state.get("watermark"), "next": None},
                    {"$set": {"next": end}},
                    upsert=True,
                )
            except DuplicateKeyError:
                pass
            state = await self.state.find_one({"_id": "usage"})
            if state.get("next") is None:
                return False
        start, end = state.get("watermark") or EPOCH, state["next"]
        await self._fold(start, end, f"{start.isoformat()}/{end.isoformat()}")
        await self.state.update_one({"_id": "usage", "next": end}, {"$set": {"watermark": end, "next": None}})
        return True

    async def _fold(self, start: datetime, end: datetime, step: str) -> None:
        match = {"ts": {"$gte": start, "$lt": end}}
        pairs = await self._rows(self.buckets, _pairs(match))
        details = await self._rows(self.buckets, _detail(match))
        signups = await self._rows(
            self.accounts,
            _per_day([{"created_at": {"$gte": start, "$lt": end}}, ACCOUNTS_ONLY], "created_at", {"$sum": 1}),
        )
        days: dict[str, Day] = {}
        for row in details:
            days.setdefault(row["_id"]["d"], Day()).add_detail(row)
        for row in signups:
            days.setdefault(row["_id"], Day()).signups += row["n"]
        accounts: dict[str, list] = {}
        for row in pairs:
            totals = accounts.setdefault(row["_id"]["a"], [0, 0, row["last"]])
            totals[0] += row["calls"]
            totals[1] += row["credits"]
            totals[2] = max(totals[2], row["last"])
        self._count_active(lambda d: days.setdefault(d, Day()), pairs, await self._last_seen(list(accounts)))
        # Days first: their active counts were computed from admin_accounts as it was before this step.
        await self._write(
            self.days,
            [
                UpdateOne(
                    {"_id": d, "step": {"$ne": step}}, {"$inc": day.increments(), "$set": {"step": step}}, upsert=True
                )
                for d, day in days.items()
            ],
        )
        await self._write(
            self.rollup_accounts,
            [
                UpdateOne(
                    {"_id": a, "step": {"$ne": step}},
                    {"$inc": {"calls": calls, "credits": credits}, "$max": {"last_ts": last}, "$set": {"step": step}},
                    upsert=True,
                )
                for a, (calls, credits, last) in accounts.items()
            ],
        )

    @staticmethod
    async def _write(collection, updates: list) -> None:
        """Guarded upserts: a duplicate key means the document already has this step (a repeat), not an error."""
        for i in range(0, len(updates), 1000):
            try:
                await collection.bulk_write(updates[i : i + 1000], ordered=False)
            except BulkWriteError as exc:
                if not only_duplicates(exc):
                    raise

    # --- /admin/metrics ----------------------------------------------------------------------
    async def metrics(
        self, days: int, include_internal: bool, admin_emails: tuple, now: datetime | None = None
    ) -> dict:
        """Per-day figures for the `days` days ending today (UTC), plus the window's distinct active accounts."""
        first = ((now or datetime.now(UTC)) - timedelta(days=days - 1)).date()
        since = day_start(first.isoformat())
        series = {(first + timedelta(days=i)).isoformat(): Day() for i in range(days)}
        internal = [] if include_internal else await self.internal_accounts(admin_emails)
        internal_ids = [a["_id"] for a in internal]
        watermark = await self.watermark()
        async for doc in self.days.find({"_id": {"$gte": first.isoformat()}}, {"step": 0}):
            if doc["_id"] in series:
                series[doc["_id"]].add_rollup(doc)
        if internal and watermark > since:
            await self._subtract(series, internal, since, watermark)
        live_only = await self._add_live(series, internal_ids, max(since, watermark), since)
        paid = [{"updated_at": {"$gte": since}}, {"credits_applied": {"$gt": 0}, "account_id": {"$nin": internal_ids}}]
        for row in await self._rows(self.orders, _per_day(paid, "updated_at", {"$sum": "$credits_applied"})):
            _on(series, row["_id"]).revenue_credits += row["n"]
        # Distinct accounts active in the window: what the rollups saw since `since`, less the internal ones,
        # plus the accounts only the live part saw.
        active = await self.rollup_accounts.count_documents({"last_ts": {"$gte": since}})
        active -= sum(1 for last in (await self._last_seen(internal_ids)).values() if last >= since)
        return {"days": series, "active_accounts": active + live_only, "watermark": watermark}

    async def _subtract(self, series: dict, internal: list[dict], since: datetime, watermark: datetime) -> None:
        """The rollups count everyone: takes the internal accounts' share before the watermark back out."""
        theirs = ({"account_id": {"$in": [a["_id"] for a in internal]}}, {"ts": {"$gte": since, "$lt": watermark}})
        for row in await self._rows(self.buckets, _detail(*theirs)):
            _on(series, row["_id"]["d"]).add_detail(row, -1)
        for row in await self._rows(self.buckets, _pairs(*theirs)):
            _on(series, row["_id"]["d"]).active -= 1
        for account in internal:
            if since <= account["created_at"] < watermark:
                _on(series, account["created_at"].date().isoformat()).signups -= 1

    async def _add_live(self, series: dict, internal_ids: list[str], start: datetime, since: datetime) -> int:
        """Adds what is newer than the watermark; returns how many of its accounts the rollups did not count."""
        live = ({"ts": {"$gte": start}}, {"account_id": {"$nin": internal_ids}})
        for row in await self._rows(self.buckets, _detail(*live)):
            _on(series, row["_id"]["d"]).add_detail(row)
        pairs = await self._rows(self.buckets, _pairs(*live))
        seen = await self._last_seen(sorted({row["_id"]["a"] for row in pairs}))
        self._count_active(lambda d: _on(series, d), pairs, seen)
        signed_up = [{"created_at": {"$gte": start}}, {"_id": {"$nin": internal_ids}}, ACCOUNTS_ONLY]
        for row in await self._rows(self.accounts, _per_day(signed_up, "created_at", {"$sum": 1})):
            _on(series, row["_id"]).signups += row["n"]
        return len({row["_id"]["a"] for row in pairs} - {a for a, last in seen.items() if last >= since})

    # --- /admin/users ------------------------------------------------------------------------
    async def members_matching(self, text: str) -> list[str]:
        """The accounts with a member whose email contains `text` (any case)."""
        query = {"email": {"$regex": re.escape(text.strip()), "$options": "i"}}
        return await self.members.distinct("account_id", query)

    async def users(
        self,
        include_internal: bool,
        admin_emails: tuple,
        limit: int,
        after: tuple[datetime, str] | None,
        search: str = "",
    ) -> tuple[list[dict], bool]:
        """A page of accounts, newest signup first (keyset on created_at, _id), with their lifetime counters;
        `search`: only the account with that id and those whose email, or a member's, contains it (any case).

        Accounts are read in widening created_at windows: the embedded server's cost is the number of
        documents in the scanned range, whatever the limit, so one page reads about a page of documents."""
        skip = set() if include_internal else {a["_id"] for a in await self.internal_accounts(admin_emails)}
        member_of = await self.members_matching(search) if search.strip() else []
        match = {**search_filter(search, member_of), **ACCOUNTS_ONLY}
        page: list[dict] = []
        want = lambda: limit + 1 - len(page) + len(skip)  # noqa: E731 - over-fetch what the filter may drop
        if after:  # the rest of the cursor's own instant first
            page += [
                a
                async for a in self.accounts.find({**match, "created_at": after[0], "_id": {"$lt": after[1]}}, _USER)
                .sort("_id", DESCENDING)
                .limit(want())
                if a["_id"] not in skip
            ]
        upper = after[0] if after else datetime.now(UTC) + timedelta(minutes=5)
        span = FIRST_WINDOW
        while len(page) <= limit and upper > EPOCH:
            lower = max(upper - span, EPOCH)
            page += [
                a
                async for a in self.accounts.find({**match, "created_at": {"$gte": lower, "$lt": upper}}, _USER)
                .sort([("created_at", DESCENDING), ("_id", DESCENDING)])
                .limit(want())
                if a["_id"] not in skip
            ]
            upper, span = lower, span * 4
        more, page = len(page) > limit, page[:limit]
        ids = [a["_id"] for a in page]
        keys = {
            row["_id"]: row
            for row in await self._in_chunks(
                ids,
                lambda part: self._rows(
                    self.keys,
                    [
                        {"$match": {"account_id": {"$in": part}}},
                        {
                            "$group": {
                                "_id": "$account_id",
                                "active": {"$sum": {"$cond": ["$revoked", 0, 1]}},
                                "revoked": {"$sum": {"$cond": ["$revoked", 1, 0]}},
                            }
                        },
                    ],
                ),
            )
        }
        rolled = {
            doc["_id"]: doc
            for doc in await self._in_chunks(
                ids, lambda part: self.rollup_accounts.find({"_id": {"$in": part}}).to_list(None)
            )
        }
        live = {
            row["_id"]: row
            for row in await self._rows(
                self.buckets,
                [
                    # The watermark first: only about a minute of buckets is newer, whatever the page size.
                    {"$match": {"ts": {"$gte": await self.watermark()}}},
                    {"$match": {"account_id": {"$in": ids}}},
                    {
                        "$group": {
                            "_id": "$account_id",
                            "calls": {"$sum": "$n"},
                            "credits": {"$sum": "$credits"},
                            "last_ts": {"$max": "$ts_max"},
                        }
                    },
                ],
            )
        }
        for account in page:
            parts = [part for part in (rolled.get(account["_id"]), live.get(account["_id"])) if part]
            key_counts = keys.get(account["_id"], {})
            account.update(
                calls=sum(p["calls"] for p in parts),
                spent=sum(p["credits"] for p in parts),
                keys_active=key_counts.get("active", 0),
                keys_revoked=key_counts.get("revoked", 0),
                last_activity=max((p["last_ts"] for p in parts), default=None),
            )
        return page, more
