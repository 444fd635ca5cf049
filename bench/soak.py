"""Soak: the gateway for minutes under mixed traffic and faults, then the ledger, account by account.

Starts SecantusDB, the sandbox upstream (with run-wide faults: some 503s and latency by default)
and the gateway as loopback processes; creates many accounts and keys; drives data calls mixed
with top-ups, key creations, revocations, portal reads and invalid keys; stops the gateway with
SIGTERM in the middle and starts it again (graceful restart under load); with --sigkill, also
kills it hard once (the crash path: at most the flush window of records is lost). Bounded in
time and in requests. At the end, after a graceful stop, it checks for every account:

- balance == top-ups - sum of usage credits (the record is the charge), no lease left behind;
- every 200 the clients saw has its usage record (request id) and none is counted twice;
- the credits clients were charged (X-Credits-Charged) == the credits recorded;
- no call was served with a key more than 1 s after its revocation was acknowledged (in one process
  it is immediate; across a restart's overlap the change stream carries it, within 1 s).

    .venv/bin/python bench/soak.py [--seconds 120] [--accounts 30] [--concurrency 16] [--max-requests 500000]
                                   [--faults "error=503:0.02,latency=5"] [--sigkill] [--out bench/results/soak.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import time
from collections import Counter

import orjson
from tornado.curl_httpclient import CurlAsyncHTTPClient
from tornado.httpclient import HTTPClientError, HTTPRequest

from gateway_testing.stack import Stack, request
from storage import db as database
from storage.usage import UsageStore

HERE = os.path.dirname(os.path.abspath(__file__))
INITIAL = 2_000_000
CROSS_PROCESS_REVOCATION_BOUND = 1.0  # seconds (docs/scale-out.md); in one process revocation is immediate


class Soak:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.stack = Stack(faults=args.faults, gateway_env={"DRAIN_SECONDS": "10"})
        self.http = None
        self.accounts: list[dict] = []  # {account_id, token, keys: [{key_id, key, revoked_at}]}
        self.topups: Counter = Counter()  # account -> credits added (acknowledged)
        self.charged: Counter = Counter()  # account -> X-Credits-Charged seen on 200s
        self.served: dict[str, tuple] = {}  # request id -> (account, key id, credits)
        self.statuses: Counter = Counter()
        self.kinds: Counter = Counter()
        self.latencies: list[float] = []
        self.violations: list[str] = []
        self.uncertain_writes = 0  # portal writes whose answer was lost
        self.requests = 0
        self.restarting = False  # portal writes pause while the gateway restarts
        self.events: list[dict] = []

    # --- setup -----------------------------------------------------------------------------------
    def setup(self) -> None:
        catalog = request("GET", self.stack.upstream + "/sandbox/catalog")[1]
        users, tweets = catalog["users"], catalog["tweets"]
        self.paths = (
            [f"/social/user/info?userName={u['userName']}" for u in users[:30]]
            + [f"/social/tweet/advanced_search?query=from%3A{u['userName']}" for u in users[:10]]
            + [f"/social/user/followers?userName={n}&pageSize=50" for n in catalog["big_accounts"][:2]]
            + [f"/social/tweets?tweet_ids={','.join(tweets[i : i + 4])}" for i in range(0, 40, 4)]
            + [f"/social/user/last_tweets?userName={u['userName']}" for u in users[:10]]
            + ["/social/trends?woeid=1", "/social/community/moderators?community_id=1"]
        )
        for i in range(self.args.accounts):
            user = self.stack.account(f"soak{i}-{self.args.seed}@example.com")
            keys = []
            for _ in range(self.args.keys_per_account):
                key = self.stack.new_key(user["token"])
                keys.append({"key_id": key["key_id"], "key": key["key"], "revoked_at": None})
            self.stack.top_up(user["token"], keys[0]["key_id"], INITIAL)
            self.topups[user["account_id"]] += INITIAL
            self.accounts.append({"account_id": user["account_id"], "token": user["token"], "keys": keys})

    # --- traffic ---------------------------------------------------------------------------------
    async def call(self, method: str, path: str, body=None, token=None, key=None):
        headers = {}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if key:
            headers["X-API-Key"] = key
            headers["Cache-Control"] = "no-cache"  # live reads: the soak's provider calls and charges as before
        started = time.monotonic()
        self.requests += 1
        try:
            response = await self.http.fetch(
                HTTPRequest(
                    self.stack.url + path,
                    method=method,
                    headers=headers,
                    request_timeout=60,
                    body=orjson.dumps(body) if body is not None else (b"" if method == "POST" else None),
                ),
                raise_error=False,
            )
        except (OSError, HTTPClientError):
            self.statuses["connection error"] += 1
            await asyncio.sleep(0.05)  # the gateway is restarting: do not spin
            return None, None, None, started
        finally:
            self.latencies.append(time.monotonic() - started)
        self.statuses[response.code] += 1
        if response.code == 599:
            await asyncio.sleep(0.05)
            return None, None, None, started
        try:
            parsed = orjson.loads(response.body) if response.body else None
        except orjson.JSONDecodeError:
            parsed = None
        return response.code, parsed, response.headers, started

    async def data_call(self, account: dict) -> None:
        key = self.rng.choice(account["keys"])
        status, _, headers, started = await self.call("GET", self.rng.choice(self.paths), key=key["key"])
        self.kinds["data"] += 1
        if status == 200:
            credits = int(headers["X-Credits-Charged"])
            self.charged[account["account_id"]] += credits
            self.served[headers["X-Request-ID"]] = (account["account_id"], key["key_id"], credits)
            # During a graceful restart the draining process may answer the revoke while the new one
            # serves data: the revocation then reaches it through the change stream, within 1 s.
            if key["revoked_at"] is not None and started > key["revoked_at"] + CROSS_PROCESS_REVOCATION_BOUND:
                self.violations.append(f"key {key['key_id']} served after its revocation was acknowledged")

    async def portal_write(self, account: dict, kind: str) -> None:
        if self.restarting:
            return
        token = account["token"]
        if kind == "topup":
            credits = self.rng.randint(1_000, 200_000)
            status, body, _, _ = await self.call(
                "POST", f"/keys/{account['keys'][0]['key_id']}/topup", {"credits": credits}, token=token
            )
            if status == 200:
                self.topups[account["account_id"]] += credits
        elif kind == "revoke":
            live = [k for k in account["keys"][1:] if k["revoked_at"] is None]  # the first key stays for top-ups
            if not live:
                return
            key = self.rng.choice(live)
            status, body, _, _ = await self.call("POST", f"/keys/{key['key_id']}/revoke", token=token)
            if status == 200:
                key["revoked_at"] = time.monotonic()
        else:
            status, body, _, _ = await self.call("POST", "/keys", {"name": "soak"}, token=token)
            if status in (200, 201):
                account["keys"].append({"key_id": body["key_id"], "key": body["key"], "revoked_at": None})
        self.kinds[kind] += 1
        if status is None or status >= 500:
            self.uncertain_writes += 1

    async def worker(self, deadline: float) -> None:
        rng = self.rng
        while time.monotonic() < deadline and self.requests < self.args.max_requests:
            account = rng.choice(self.accounts)
            roll = rng.random()
            if roll < 0.86:
                await self.data_call(account)
            elif roll < 0.89:
                await self.portal_write(account, "topup")
            elif roll < 0.894:
                await self.portal_write(account, "revoke")
            elif roll < 0.91:
                await self.portal_write(account, "create")
            elif roll < 0.97:
                self.kinds["read"] += 1
                await self.call("GET", rng.choice(["/account", "/usage?limit=20", "/keys"]), token=account["token"])
            else:
                self.kinds["invalid key"] += 1
                status, _, _, _ = await self.call("GET", self.paths[0], key="sgw_" + "x" * 40)
                if status == 200:
                    self.violations.append("an invalid key was served")

    async def restart(self, at: float, sig: int) -> None:
        await asyncio.sleep(at)
        self.restarting = True
        await asyncio.sleep(0.3)  # portal writes in flight finish
        started = time.monotonic()
        code = await asyncio.get_running_loop().run_in_executor(None, self.stack.stop_gateway, sig, 60)
        await asyncio.get_running_loop().run_in_executor(None, self.stack.start_gateway)
        self.events.append(
            {
                "signal": signal.Signals(sig).name,
                "at_s": round(at, 1),
                "exit_code": code,
                "downtime_s": round(time.monotonic() - started, 2),
            }
        )
        self.restarting = False

    async def run(self) -> dict:
        self.http = CurlAsyncHTTPClient(force_instance=True, max_clients=self.args.concurrency)
        started = time.monotonic()
        deadline = started + self.args.seconds
        jobs = [self.worker(deadline) for _ in range(self.args.concurrency)]
        jobs.append(self.restart(self.args.seconds * 0.5, signal.SIGTERM))
        if self.args.sigkill:
            jobs.append(self.restart(self.args.seconds * 0.75, signal.SIGKILL))
        await asyncio.gather(*jobs)
        elapsed = time.monotonic() - started
        self.http.close()
        code = self.stack.stop_gateway(signal.SIGTERM)
        self.events.append({"signal": "SIGTERM", "at_s": round(elapsed, 1), "exit_code": code, "final": True})
        return await self.check(elapsed)

    # --- the ledger --------------------------------------------------------------------------------
    async def check(self, elapsed: float) -> dict:
        client = database.connect(self.stack.mongo.uri)
        db = client[self.stack.db_name]
        usage = UsageStore(db)
        records = await usage.records({})
        accounts = {a["_id"]: a async for a in db.accounts.find({}, {"credits": 1, "leases": 1})}
        processes = await db.processes.count_documents({})
        await client.close()
        by_id = Counter(r["_id"] for r in records)
        stored_200 = {r["request_id"]: r for r in records if r["status"] == 200}
        recorded = Counter()
        for r in records:
            recorded[r["account_id"]] += r["credits"]
        lost = [rid for rid in self.served if rid not in stored_200]
        unseen = [rid for rid in stored_200 if rid not in self.served]
        unbalanced, leases_left = [], 0
        for account in self.accounts:
            aid = account["account_id"]
            doc = accounts[aid]
            leases_left += len(doc.get("leases") or {})
            if doc["credits"] != self.topups[aid] - recorded[aid]:
                unbalanced.append(
                    {
                        "account": aid,
                        "balance": doc["credits"],
                        "top_ups": self.topups[aid],
                        "usage_credits": recorded[aid],
                    }
                )
        lat = sorted(self.latencies)
        figures = {
            "seconds": round(elapsed, 1),
            "requests": self.requests,
            "rps": round(self.requests / elapsed, 1),
            "by_kind": dict(self.kinds),
            "by_status": {str(k): v for k, v in sorted(self.statuses.items(), key=str)},
            "latency_ms": {
                "p50": round(lat[len(lat) // 2] * 1000, 1),
                "p99": round(lat[int(len(lat) * 0.99)] * 1000, 1),
            },
            "faults": {
                "sandbox_spec": self.args.faults,
                "upstream_failures_seen": self.statuses.get(502, 0) + self.statuses.get(504, 0),
                "restarts": self.events,
            },
            "accounts": len(self.accounts),
            "keys": sum(len(a["keys"]) for a in self.accounts),
            "revoked_keys": sum(1 for a in self.accounts for k in a["keys"] if k["revoked_at"] is not None),
            "data_calls_served": len(self.served),
            "usage_records": len(records),
            "usage_records_status_200": len(stored_200),
            "credits_charged_seen_by_clients": sum(self.charged.values()),
            "credits_recorded": sum(recorded.values()),
            "records_lost": len(lost),
            "records_without_a_client_200": len(unseen),
            "duplicate_records": sum(n - 1 for n in by_id.values() if n > 1),
            "accounts_reconciled": f"{len(self.accounts) - len(unbalanced)}/{len(self.accounts)}",
            "unbalanced_accounts": unbalanced[:5],
            "leases_left": leases_left,
            "processes_left": processes,
            "revoked_key_violations": len(self.violations),
            "uncertain_portal_writes": self.uncertain_writes,
        }
        graceful = not self.args.sigkill
        figures["ok"] = (
            not unbalanced
            and leases_left == 0
            and processes == 0
            and not self.violations
            and figures["duplicate_records"] == 0
            and self.uncertain_writes == 0
            and all(e["exit_code"] == 0 for e in self.events if e["signal"] == "SIGTERM")
            and (
                not graceful or (not lost and figures["credits_charged_seen_by_clients"] == figures["credits_recorded"])
            )
        )
        return figures


def run(args: argparse.Namespace) -> dict:
    soak = Soak(args)
    soak.stack.start()
    try:
        soak.setup()
        return asyncio.run(soak.run())
    finally:
        soak.stack.stop()


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--accounts", type=int, default=30)
    parser.add_argument("--keys-per-account", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-requests", type=int, default=500_000)
    parser.add_argument("--faults", default="error=503:0.02,latency=5")
    parser.add_argument("--sigkill", action="store_true", help="also SIGKILL the gateway once (crash path)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "soak.json"))
    return parser


def main() -> None:
    args = parser().parse_args()
    figures = run(args)
    figures["command"] = " ".join(sys.argv)
    print(json.dumps(figures, indent=2))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(figures, fh, indent=2)
    sys.exit(0 if figures["ok"] else 1)


if __name__ == "__main__":
    main()
