"""The backup goal at its full size (issue 38): a backup taken during SECONDS of RATE calls/s on a 0.7 s provider
(`serve --workers 2`), with RULES active filter rules and a webhook receiver that is down, restored into a fresh
database: the gateway starts on it, `reconcile` exits 0 before and after, every key answers, every rule and every
pending delivery is there. tests/operations/test_backup.py is the same at the suite's size.

    ./dev bench --backup [--seconds 60 --rate 200 --rules 50]

Prints the figures as JSON: the load's requests and statuses, the backup's time and size, the reconcile lines.
"""

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time

import pymongo

from app.embedded import EmbeddedMongo, free_port
from bench import load
from gateway_testing.stack import GatewayProcess, Stack, request

SCRIPT = os.path.join(os.path.dirname(sys.executable), "social-gateway")
ACCOUNTS = 10


class TwoWorkers(Stack):
    def start_gateway(self) -> None:
        with open(self.log_path, "ab") as log:
            self.gateway = GatewayProcess(self.env(), self.port, workers=2, stdout=log, stderr=log).start()


def cli(*argv: str, **env: str) -> tuple[int, str]:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    done = subprocess.run([SCRIPT, *argv], env={**keep, "LOG_LEVEL": "WARNING", **env}, capture_output=True, text=True)
    return done.returncode, (done.stdout + done.stderr).strip()


def setup(stack: Stack, rules: int, down: str) -> tuple[list[dict], dict]:
    catalog = request("GET", stack.url + "/sandbox/catalog")[1]
    accounts = []
    for n in range(ACCOUNTS):
        user = stack.account(f"backup-{n}@example.com")
        keys = [stack.new_key(user["token"], f"k{i}") for i in range(2)]
        stack.top_up(user["token"], keys[0]["key_id"], 5_000_000)
        for r in range(rules // ACCOUNTS):
            name = catalog["users"][(n * 7 + r) % len(catalog["users"])]["userName"]
            rule = {"tag": f"t{r}", "value": f"from:{name}", "interval_seconds": 2}
            status, body, _ = stack.call("POST", "/oapi/tweet_filter/add_rule", rule, key=keys[0]["key"])
            assert status == 200, body
            update = {**rule, "rule_id": body["rule_id"], "is_effect": 1}
            assert stack.call("POST", "/oapi/tweet_filter/update_rule", update, key=keys[0]["key"])[0] == 200
        status, endpoint, _ = stack.call("POST", "/webhooks", {"url": down}, token=user["token"])
        assert status == 200, endpoint
        for _ in range(2):
            assert stack.call("POST", f"/webhooks/{endpoint['endpoint_id']}/test", {}, token=user["token"])[0] == 200
        accounts.append({"token": user["token"], "keys": [k["key"] for k in keys], "endpoint": endpoint["endpoint_id"]})
    return accounts, catalog


async def load_with_backup(stack: Stack, raw: list[bytes], args, archive: str) -> tuple[dict, dict]:
    connections = max(8, int(args.rate * 1.2))  # 0.7 s per call: rate x 0.7 in flight, with room
    task = asyncio.ensure_future(load.run("127.0.0.1", stack.port, raw, args.seconds, connections, rate=args.rate))
    await asyncio.sleep(args.seconds / 2)
    started = time.monotonic()
    code, out = await asyncio.to_thread(
        cli, "backup", "--out", archive, MONGODB_URI=stack.mongo.uri, MONGODB_DB=stack.db_name
    )
    backup = {"exit": code, "output": out, "seconds": round(time.monotonic() - started, 2)}
    backup["bytes"] = os.path.getsize(archive) if code == 0 else 0
    return await task, backup


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backup", action="store_true")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--rate", type=float, default=200)
    parser.add_argument("--rules", type=int, default=50)
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="gw-backup-")
    archive = os.path.join(work, "backup.tar.gz")
    # The answer cache off: every call goes to the 0.7 s provider, so every call is in flight that long.
    extra = {"STREAM_MIN_INTERVAL": "2", "WEBHOOK_POLL_SECONDS": "1", "QPS_DIVISOR": "2", "CACHE_MAX_BYTES": "0"}
    result: dict = {"rate": args.rate, "seconds": args.seconds, "rules": args.rules}
    with TwoWorkers(work, faults="latency=700", gateway_env=extra) as stack:
        accounts, catalog = setup(stack, args.rules, f"http://127.0.0.1:{free_port()}/hook")
        paths = [f"/social/user/info?userName={u['userName']}" for u in catalog["users"][:20]]
        raw = [
            load.request_bytes("127.0.0.1", paths[i % len(paths)], {"X-API-Key": a["keys"][i % 2]})
            for i, a in enumerate(accounts * 4)
        ]
        result["load"], result["backup"] = asyncio.run(load_with_backup(stack, raw, args, archive))
        stack.stop_gateway()
        restored = EmbeddedMongo(os.path.join(work, "restored")).start()
        try:
            target = {"MONGODB_URI": restored.uri, "MONGODB_DB": stack.db_name}
            result["restore"] = cli("restore", archive, **target)[0]
            result["reconcile_restored"] = cli("reconcile", **target)
            env = {**stack.env(), "MONGODB_URI": restored.uri, "LEASE_TIMEOUT": "5"}
            gateway = GatewayProcess(env, free_port(), workers=2).start()
            url = gateway.url
            answers = [
                request("GET", url + paths[0], headers={"X-API-Key": key})[0] for a in accounts for key in a["keys"]
            ]
            rules = [
                len(
                    request("GET", url + "/oapi/tweet_filter/get_rules", headers={"X-API-Key": a["keys"][0]})[1][
                        "rules"
                    ]
                )
                for a in accounts
            ]
            # The test events' deliveries, by state (pending: retried later), read from the database: the
            # endpoints' delivery logs list only their newest, and the rules' tweets have deliveries too.
            deliveries = pymongo.MongoClient(restored.uri)[stack.db_name].webhook_deliveries
            states: dict[str, int] = {}
            for d in deliveries.find({"type": "webhook.test"}, {"state": 1}):
                states[d["state"]] = states.get(d["state"], 0) + 1
            processes = pymongo.MongoClient(restored.uri)[stack.db_name].processes
            deadline = time.monotonic() + 120
            while processes.count_documents({}) > 2 and time.monotonic() < deadline:  # the backed-up ones reclaimed
                time.sleep(0.5)
            result["reconcile_served"] = cli("reconcile", **target)
            gateway.stop()
            result["reconcile_stopped"] = cli("reconcile", **target)
            result["restored"] = {
                "keys_answering": f"{answers.count(200)} of {len(answers)}",
                "rules": sum(rules),
                "test_deliveries": states,
            }
        finally:
            restored.stop()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
