"""CPU per call of the key restrictions in the data plane: a restricted key against an unrestricted one.

Runs the data call's own check path (handlers/social.py check_key, as handlers/data_call.py calls it: key lookup in
the cache, revoked, expired, client address, endpoint scope) and the credit reservation and
settlement (accounting/meter.py Meter.reserve / settle: the account lease, plus the key's budget
slice for a key with a credit_limit) in a loop, in process, with nothing else: no HTTP, no
database (the key entry is cached, the lease and the budget slice are already held, as they are
for a busy key). Prints microseconds of CPU per call for each key and the difference.

    .venv/bin/python bench/key_checks.py [--calls 200000]
"""

import argparse
import asyncio
import ipaddress
import json
import time
from datetime import UTC, datetime
from types import SimpleNamespace

from tornado.httputil import HTTPHeaders

import config
from accounting.keys import KeyEntry
from accounting.meter import Meter
from handlers.data_call import DataCall
from handlers.social import check_key
from metering.ledger import Budget, budget_period
from runtime.metrics import Metrics
from runtime.state import State
from social.endpoints import BY_PATH, scope_of

SECRET = "sgw_bench"
PRICE = 18


class CachedKeys:
    """The meter's authenticate() for a key whose entry is cached: a dict lookup."""

    def __init__(self, meter: Meter, entry: KeyEntry):
        self.meter, self.entry = meter, entry

    async def authenticate(self, secret: str) -> KeyEntry:
        return self.entry


def make_meter(settings) -> Meter:
    leases = SimpleNamespace(process_id="bench")
    meter = Meter(State(settings), None, None, None, leases, None, Metrics(), None)  # no store is reached
    meter.ledger.lease_is("acct", 10**15, meter.clock())  # a lease held: no database on the path
    return meter


def entries() -> dict[str, KeyEntry]:
    return {
        "unrestricted": KeyEntry(1, "acct", False),
        "restricted": KeyEntry(
            2,
            "acct",
            False,
            expires_at=time.time() + 3600,
            networks=tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "192.168.0.0/16", "127.0.0.0/8")),
            scope=scope_of(["users", "tweets"]),
            credit_limit=10**15,
            period="month",
            budget_id=2,
        ),
    }


async def per_call(meter: Meter, entry: KeyEntry, calls: int) -> float:
    """CPU microseconds per call of authenticate + reserve + settle for `entry`."""
    ctx = SimpleNamespace(meter=CachedKeys(meter, entry), settings=meter.settings)
    connection = SimpleNamespace(context=SimpleNamespace(remote_ip="127.0.0.1"))
    headers = HTTPHeaders({"X-API-Key": SECRET, "Host": "bench"})
    call = DataCall(ctx, connection, BY_PATH["/user/info"], headers, "/social/user/info", "userName=x")
    if entry.credit_limit is not None:  # the budget slice is held too, as for a busy key
        period = budget_period(entry.period, datetime.now(UTC))[0]
        slot = (entry.budget_id, entry.credit_limit, period, entry.budget_epoch)
        meter.key_budgets.budgets[slot] = Budget(
            entry.budget_id, period, entry.credit_limit, entry.budget_epoch, granted=10**15
        )
    for _ in range(1000):  # warm up
        key = await check_key(call, headers, call.endpoint.path)
        meter.settle(await meter.reserve("acct", PRICE, 15, key), PRICE)
    started = time.process_time()
    for _ in range(calls):
        key = await check_key(call, headers, call.endpoint.path)
        meter.settle(await meter.reserve("acct", PRICE, 15, key), PRICE)
    return (time.process_time() - started) / calls * 1e6


async def main(calls: int, rounds: int) -> None:
    settings = config.load(environ={}, jwt_secret="j" * 40, secrets_key="s" * 40)
    results: dict[str, list[float]] = {"unrestricted": [], "restricted": []}
    for _ in range(rounds):  # interleaved, best of `rounds`: the machine is shared
        for name, entry in entries().items():
            results[name].append(await per_call(make_meter(settings), entry, calls))
    best = {name: round(min(runs), 2) for name, runs in results.items()}
    print(
        json.dumps(
            {
                "calls": calls,
                "us_per_call": best,
                "checks_cost_us": round(best["restricted"] - best["unrestricted"], 2),
                "what": "authenticate (revoked, expired, address in 3 networks, scope) + reserve + settle",
            }
        )
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.rounds))
