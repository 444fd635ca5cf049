"""How fast a monthly statement is made for an account with a million calls in the month.

Loads CALLS usage records (default 1,000,000) for one account into a fresh embedded database on disk, written the
way the gateway writes them (storage/usage.py insert_batch: buckets, totals and the monthly figures of
storage/usage_months.py, batches of FLUSH_BATCH records from WRITERS processes), spread over the current month's
days so far and 12 endpoints, 1 in 10 from the answer cache; with a journal of additions (signup, top-ups, admin
credits) and a balance that agrees with them. Then times what GET /billing/statements/{month} does for JSON, CSV
and PDF (billing/statements.py, billing/statement_documents.py): the reads, the sums and the rendering. First, how
long a receipt's PDF takes (billing/documents.py, billing/pdf.py) for a customer name in each of the renderer's
fonts: the built-in Helvetica, Liberation Sans (Cyrillic) and DejaVu Sans (Hebrew) embedded.

    .venv/bin/python -m bench.statements [--calls 1000000]
"""

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta

from app.context import build_context
from app.embedded import EmbeddedMongo
from bench.usage_summary import ENDPOINTS, KEYS
from billing.documents import document
from billing.pdf import render
from billing.statement_documents import as_csv, as_json, as_pdf
from gateway_testing.helpers import make_settings
from storage.accounts import addition
from storage.clock import now_utc

WRITERS = 4  # processes that wrote the month's batches (workers, restarts)


def batch(seq: int, size: int, account_id: str, lease: str, start, seconds: float) -> list[dict]:
    records = []
    for i in range(size):
        n = seq * size + i
        cached = n % 10 == 0
        records.append(
            {
                "_id": f"bench-{n:x}",
                "account_id": account_id,
                "key_id": KEYS[n % len(KEYS)],
                "endpoint": ENDPOINTS[n % len(ENDPOINTS)],
                "ts": start + timedelta(seconds=seconds * n),
                "credits": 0 if cached else 15 + n % 4,
                "status": 200,
                "lease": lease,
                "request_id": f"r{n:x}",
                **({"cache": "hit", "saved": 15} if cached else {}),
            }
        )
    return records


async def timed(label: str, work, repeat: int = 3) -> float:
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        await work()
        runs.append(time.perf_counter() - started)
    print(json.dumps({"what": label, "best_s": round(min(runs), 3), "worst_s": round(max(runs), 3)}), flush=True)
    return max(runs)


def receipts(repeat: int = 20) -> None:
    """A receipt's PDF, `repeat` times per name: wall and CPU seconds per PDF (the goal: under 200 ms)."""
    for label, name in (("Helvetica", "Example GmbH"), ("Liberation", "ООО Пример"), ("DejaVu", "דוגמה בע״מ")):
        receipt = {
            "_id": "R-2026-000123",
            "kind": "receipt",
            "account_id": "acc_bench",
            "issued_at": datetime(2026, 11, 29, 9, 30, tzinfo=UTC),
            "issuer": {
                "name": "Bench Operator Ltd",
                "address": "1 Main St\nSpringfield",
                "tax_id": "GB123",
                "footer": "",
            },
            "customer": {"legal_name": name, "address": "Street 1\n10115 Berlin", "country": "DE", "tax_id": "DE1"},
            "payment": {
                "method": "crypto",
                "order_id": "ord_1",
                "reference": "5077",
                "amount_paid": 0.25,
                "currency": "LTC",
            },
            "credits": 2_500_000,
            "amount_usd": 25.0,
        }
        wall, cpu = [], []
        for _ in range(repeat):
            started, used = time.perf_counter(), time.process_time()
            render(document(receipt))
            wall.append(time.perf_counter() - started)
            cpu.append(time.process_time() - used)
        figures = {"median_ms": round(statistics.median(wall) * 1000, 1), "worst_ms": round(max(wall) * 1000, 1)}
        figures["cpu_median_ms"] = round(statistics.median(cpu) * 1000, 1)
        print(json.dumps({"what": f"receipt PDF, {label}", **figures, "under_200_ms": max(wall) < 0.2}), flush=True)


async def main(calls: int, flush_batch: int) -> None:
    receipts()
    with tempfile.TemporaryDirectory(prefix="statements-bench-") as path:
        mongo = EmbeddedMongo(os.path.join(path, "db")).start()
        try:
            settings = make_settings(mongodb_uri=mongo.uri, upstream_url="http://127.0.0.1:9", mongodb_db="bench")
            ctx = await build_context(dataclasses.replace(settings, billing_issuer_name="Bench Operator Ltd"))
            now = now_utc()
            start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
            account = await ctx.accounts.create("bench@example.com", "x", 1_000)
            account_id = account["_id"]
            journal = [addition("payment", 20_000_000, f"ord_bench{i}:20000000") for i in range(5)]
            journal += [addition("admin_credit", 50_000, "admin-credit:bench"), addition("admin_debit", -1_234, "d")]
            added = 1_000 + sum(e["credits"] for e in journal)
            await ctx.accounts.accounts.update_one(
                {"_id": account_id}, {"$push": {"additions": {"$each": journal}}, "$set": {"credits_added": added}}
            )
            batches = calls // flush_batch
            seconds = (now - start).total_seconds() / (batches * flush_batch)
            charged, started = 0, time.perf_counter()
            for seq in range(batches):
                writer = f"bench{seq % WRITERS}"
                records = batch(seq, flush_batch, account_id, writer, start, seconds)
                charged += sum(r["credits"] for r in records)
                await ctx.usage.insert_batch(f"{writer}-{seq // WRITERS}", records)
            # The balance the journal and the charges leave (no lease open: nothing in flight).
            await ctx.accounts.accounts.update_one({"_id": account_id}, {"$set": {"credits": added - charged}})
            print(json.dumps({"loaded_calls": batches * flush_batch, "load_s": round(time.perf_counter() - started)}))
            statements, month = ctx.view.services.statements, start.strftime("%Y-%m")
            started = time.perf_counter()
            made = await statements.statement(account_id, month)  # the first read folds what is left to fold
            print(json.dumps({"what": "first statement read (folds)", "s": round(time.perf_counter() - started, 3)}))
            assert made.calls == batches * flush_batch and made.reconciled, made.differences
            issuer = ctx.view.services.billing.issuer()

            async def pdf():
                s = await statements.statement(account_id, month)
                await asyncio.to_thread(as_pdf, s, issuer, {"legal_name": "Bench GmbH"}, "A4")

            worst = [
                await timed("statement as JSON", lambda: _json(statements, account_id, month)),
                await timed("statement as CSV", lambda: _csv(statements, account_id, month)),
                await timed("statement as PDF (A4)", pdf),
            ]
            print(
                json.dumps({"calls_in_month": made.calls, "worst_s": round(max(worst), 3), "under_2_s": max(worst) < 2})
            )
            await ctx.client.close()
        finally:
            mongo.stop()


async def _json(statements, account_id: str, month: str) -> None:
    as_json(await statements.statement(account_id, month))


async def _csv(statements, account_id: str, month: str) -> None:
    as_csv(await statements.statement(account_id, month))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--flush-batch", type=int, default=500, help="records per flush batch (FLUSH_BATCH)")
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.flush_batch))
