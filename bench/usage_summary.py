"""How fast GET /usage/summary answers for an account with a year of heavy use.

Loads CALLS usage records (default 1,000,000) for one account into a fresh embedded database on
disk, written the way the gateway writes them (storage/usage.py insert_batch: one bucket per flush
batch of FLUSH_BATCH records, per account and day), spread over 365 days, 5 keys and 12 endpoints,
1 call in 20 an error (each batch also writes its totals documents). Then times the
summary query the endpoint runs (storage/usage.py summary: the totals) for each grouping, and,
with --export, a full streamed read of the year (what GET /usage/export does, without the HTTP writes).

    .venv/bin/python bench/usage_summary.py [--calls 1000000] [--export]
"""

import argparse
import asyncio
import json
import os
import tempfile
import time
from datetime import UTC, datetime, timedelta

from app.embedded import EmbeddedMongo
from storage import db as database
from storage.expiry import Expiry
from storage.usage import UsageStore

ACCOUNT = "bench-account"
KEYS = [101, 102, 103, 104, 105]
ENDPOINTS = [
    f"/social/{p}"
    for p in (
        "user/info",
        "tweet/advanced_search",
        "user/followers",
        "user/followings",
        "tweets",
        "user/last_tweets",
        "tweet/replies",
        "user/search",
        "trends",
        "list/tweets_timeline",
        "user/batch_info_by_ids",
        "community/info",
    )
]


def batch(seq: int, size: int, day: datetime) -> list[dict]:
    records = []
    for i in range(size):
        n = seq * size + i
        status = 502 if n % 20 == 0 else 200
        records.append(
            {
                "_id": f"bench-{n:x}",
                "account_id": ACCOUNT,
                "key_id": KEYS[n % len(KEYS)],
                "endpoint": ENDPOINTS[n % len(ENDPOINTS)],
                "ts": day + timedelta(seconds=i * 86400 // size),
                "credits": 0 if status != 200 else 15 + n % 4,
                "status": status,
                "lease": "bench",
                "request_id": f"r{n:x}",
            }
        )
    return records


async def timed(label: str, work, repeat: int = 3) -> dict:
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        result = await work()
        runs.append(time.perf_counter() - started)
    figure = {"what": label, "best_s": round(min(runs), 3), "worst_s": round(max(runs), 3), "rows": result}
    print(json.dumps(figure), flush=True)
    return figure


async def main(calls: int, flush_batch: int, export: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="usage-bench-") as path:
        mongo = EmbeddedMongo(os.path.join(path, "db")).start()
        try:
            client = database.connect(mongo.uri)
            db = client["usage_bench"]
            await database.ensure_indexes(db, Expiry(db, 0))  # a short run: nothing expires
            usage = UsageStore(db)
            batches = calls // flush_batch
            today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
            started = time.perf_counter()
            for seq in range(batches):
                day = today - timedelta(days=364 - seq * 365 // batches)
                await usage.insert_batch(f"bench-{seq}", batch(seq, flush_batch, day))
            load_s = time.perf_counter() - started
            print(json.dumps({"loaded_calls": batches * flush_batch, "buckets": batches, "load_s": round(load_s, 1)}))
            since = (today - timedelta(days=364)).date().isoformat()
            figures = []
            for group_by in (("day",), ("endpoint",), ("key_id",), ("day", "key_id"), ("day", "endpoint", "key_id")):
                figures.append(
                    await timed(
                        f"summary days=365 group_by={','.join(group_by)}",
                        lambda g=group_by: _count(usage.summary(ACCOUNT, since, g)),
                    )
                )
            month = today.replace(day=1).date().isoformat()
            figures.append(
                await timed("summary days=30 group_by=day", lambda: _count(usage.summary(ACCOUNT, month, ("day",))))
            )
            if export:

                async def read_all() -> int:
                    n = 0
                    async for _ in usage.stream(ACCOUNT, today - timedelta(days=365), datetime.now(UTC)):
                        n += 1
                    return n

                figures.append(await timed("export read of every record, 365 days", read_all, repeat=1))
            await client.close()
        finally:
            mongo.stop()


async def _count(work) -> int:
    return len(await work)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--flush-batch", type=int, default=500, help="records per flush batch (FLUSH_BATCH)")
    parser.add_argument("--export", action="store_true", help="also time reading every record (export)")
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.flush_batch, args.export))
