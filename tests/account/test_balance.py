"""The balance GET /account shows (Meter.balance) while this process's lease operations land: exact
whichever of the account read and a lease take or give-back the database or this process handles
first, and under concurrent calls always the initial credits minus what was charged; after a burst,
the initial credits are the balance plus the credits of the usage records, flushed or not."""

import asyncio
import random
import time
import uuid

import orjson
import pytest
from support import FAST
from tornado.httpclient import AsyncHTTPClient

pytestmark = pytest.mark.gen_test(timeout=60)

INITIAL = 1_000_000


def info(catalog) -> str:
    return f"/social/user/info?userName={catalog['users'][0]['userName']}"


class Hold:
    """Holds the answer of the next call of `owner.<name>` (for `arg`, if given) once the database has
    answered, until `release` is set: this process handles it after whatever the test runs meanwhile."""

    def __init__(self, monkeypatch, owner, name: str, arg=None):
        self.original, self.arg, self.armed = getattr(owner, name), arg, True
        self.reached, self.release = asyncio.Event(), asyncio.Event()
        monkeypatch.setattr(owner, name, self._call)

    async def _call(self, *args, **kwargs):
        result = await self.original(*args, **kwargs)
        if self.armed and (self.arg is None or args[:1] == (self.arg,)):
            self.armed = False
            self.reached.set()
            await self.release.wait()
        return result


async def funded(api) -> tuple[dict, dict, str]:
    user, key = await api.funded_key(INITIAL)
    status, body, _ = await api.call("GET", "/account", token=user["token"])
    assert status == 200 and body["credits"] == INITIAL
    return user, key, body["account_id"]


async def shown(api, user) -> int:
    status, body, _ = await api.call("GET", "/account", token=user["token"])
    assert status == 200, body
    return body["credits"]


async def test_an_account_read_answered_after_a_lease_take_it_preceded(api, ctx, catalog, monkeypatch):
    """The database reads the account before the take moves credits into the lease, this process
    handles the take's answer first: the moved credits were counted twice (once in `credits`)."""
    user, key, aid = await funded(api)
    read = Hold(monkeypatch, ctx.accounts, "get", aid)
    account = asyncio.ensure_future(shown(api, user))
    await read.reached.wait()  # the document read still has every credit unleased
    status, _, headers = await api.call("GET", info(catalog), key=key["key"])  # the first call leases
    assert status == 200 and ctx.meter.ledger.purses[aid].leased > 0
    read.release.set()
    assert await account == INITIAL - int(headers["X-Credits-Charged"])


async def test_an_account_read_answered_before_the_lease_take_it_followed(api, ctx, catalog, monkeypatch):
    """The database moves credits into the lease before it reads the account, this process handles
    the read first: the moved credits were counted nowhere."""
    user, key, aid = await funded(api)
    take = Hold(monkeypatch, ctx.meter.leases, "take")
    call = asyncio.ensure_future(api.call("GET", info(catalog), key=key["key"]))
    await take.reached.wait()  # the lease is in the database, not yet in this process's ledger
    assert aid not in ctx.meter.ledger.purses
    assert await shown(api, user) == INITIAL
    take.release.set()
    status, _, headers = await call
    assert status == 200
    assert await shown(api, user) == INITIAL - int(headers["X-Credits-Charged"])


async def test_balance_of_any_account_snapshot_around_takes_and_give_backs(ctx):
    """Meter.balance of a document read before, between and after lease operations (GET /admin/users
    passes documents read earlier): always the credits minus the charges."""
    aid = (await ctx.accounts.create(f"b{uuid.uuid4().hex[:8]}@example.com", "unused", INITIAL))["_id"]
    meter = ctx.meter
    first = await meter.reserve(aid, 1000, 1000)  # takes a lease of 20 calls
    meter.settle(first, 700)
    snapshots = [await ctx.accounts.get(aid)]
    second = await meter.reserve(aid, 25_000, 25_000)  # more than is left in the lease: a second take
    assert meter.ledger.purses[aid].leased > 20_000
    snapshots.append(await ctx.accounts.get(aid))
    meter.settle(second, 24_000)
    await meter.give_back(aid, 100_000)  # part of the lease goes back to `credits`
    snapshots.append(await ctx.accounts.get(aid))
    leases = [doc["leases"][meter.leases.process_id]["amount"] for doc in snapshots]
    assert leases[0] < leases[1] and leases[2] < leases[1]  # three different splits of the credits
    for doc in snapshots:
        assert await meter.balance(aid, doc) == INITIAL - 700 - 24_000
    assert await meter.balance(aid) == INITIAL - 700 - 24_000


@pytest.mark.settings(lease_seconds=0.05, plan_rules=FAST)
async def test_account_reads_during_concurrent_calls_show_exactly_what_was_charged(
    api, ctx, catalog, base_url, monkeypatch
):
    """200 calls, 20 at a time (a lease take every few calls), and /account read throughout: every
    balance shown lies between the initial credits minus the charges of the calls answered before the
    read was sent and minus those of the calls sent before it was answered; nothing more, nothing less."""
    user, key, aid = await funded(api)
    calls: list[tuple[float, float, int]] = []  # (sent, answered, charged)
    reads: list[tuple[float, float, int]] = []  # (sent, answered, credits shown)
    caller, reader = AsyncHTTPClient(force_instance=True, max_clients=20), AsyncHTTPClient(force_instance=True)

    async def calls_in_a_row(count: int):
        for _ in range(count):
            sent = time.monotonic()
            response = await caller.fetch(base_url + info(catalog), headers={"X-API-Key": key["key"]})
            calls.append((sent, time.monotonic(), int(response.headers["X-Credits-Charged"])))

    async def reads_in_a_row():
        # Reads go on past the calls until there are 20: how many fall during the calls depends on speed.
        while len(calls) < 200 or len(reads) < 20:
            sent = time.monotonic()
            response = await reader.fetch(base_url + "/account", headers={"Authorization": f"Bearer {user['token']}"})
            reads.append((sent, time.monotonic(), orjson.loads(response.body)["credits"]))

    # Answers of account reads and lease takes reach this process up to 20 ms late, at random: reads and
    # takes overlap in every order, as on a loaded machine.
    late = random.Random(7)
    takes = []

    def answered_late(method, seen=None):
        async def wrapper(*args):
            result = await method(*args)
            if seen is not None:
                seen.append(result)
            await asyncio.sleep(late.uniform(0, 0.02))
            return result

        return wrapper

    monkeypatch.setattr(ctx.accounts, "get", answered_late(ctx.accounts.get))
    monkeypatch.setattr(ctx.meter.leases, "take", answered_late(ctx.meter.leases.take, takes))
    try:
        await asyncio.gather(*(calls_in_a_row(10) for _ in range(20)), reads_in_a_row(), reads_in_a_row())
    finally:
        caller.close()
        reader.close()
    last_answer = max(answered for _, answered, _ in calls)
    during = [read for read in reads if read[0] < last_answer]
    assert len(takes) >= 5 and len(during) >= 5  # a short LEASE_SECONDS: leases of a few calls, refilled
    for sent, answered, credits in reads:
        settled_before = sum(c for s, a, c in calls if a < sent)
        started_before = sum(c for s, a, c in calls if s < answered)
        assert INITIAL - started_before <= credits <= INITIAL - settled_before, (credits, sent, answered)
    assert await shown(api, user) == INITIAL - sum(c for _, _, c in calls)


@pytest.mark.settings(plan_rules=FAST)
async def test_after_a_burst_the_initial_credits_are_the_balance_plus_the_usage(api, ctx, catalog):
    """Money end to end: what the calls said they charged, what /usage lists and what /account shows
    add up to the initial credits, with records still buffered and after they are written."""
    user, key, _ = await funded(api)
    answers = await asyncio.gather(*(api.call("GET", info(catalog), key=key["key"]) for _ in range(150)))
    assert {status for status, _, _ in answers} == {200}
    charged = sum(int(headers["X-Credits-Charged"]) for _, _, headers in answers)
    assert charged > 0
    for flush in (False, True):  # then with every record written (the background flush may have been first)
        if flush:
            await ctx.meter.flush()
            assert len(ctx.meter.buffer) == 0
        status, usage, _ = await api.call("GET", "/usage?limit=1000", token=user["token"])
        assert status == 200 and len(usage) == 150
        assert sum(r["credits"] for r in usage) == charged
        assert await shown(api, user) + charged == INITIAL


async def test_calls_arriving_while_the_gateway_closes_are_refused_or_recorded_never_served_unrecorded(
    api, ctx, catalog
):
    """Shutdown's final flush is the last word on charges. A call that reaches the ledger while close() runs
    finds the spending window shut; it used to ask for a heartbeat, which opened the window again, so it was
    served and charged after the final flush and its record lost (a SIGTERM under load: 120 served, 60 recorded).
    Invariant: once close() returned, every 200 has its persisted usage record; the others are refused, uncharged."""
    user, key = await api.funded_key(INITIAL)
    assert (await api.call("GET", info(catalog), key=key["key"]))[0] == 200
    closing = asyncio.ensure_future(ctx.meter.close())
    late = [asyncio.ensure_future(api.call("GET", info(catalog), key=key["key"])) for _ in range(20)]
    await closing
    answers = await asyncio.gather(*late)
    assert {status for status, _, _ in answers} <= {200, 429, 503}  # 429: the key's rate, if a slow machine
    served = [headers for status, _, headers in answers if status == 200]
    refused = [body for status, body, _ in answers if status == 503]
    assert all("Credits cannot be checked" in body["msg"] for body in refused)
    stored = [r for r in await ctx.usage.records({"account_id": user["account_id"]}) if r["status"] == 200]
    assert len(stored) == 1 + len(served)
    assert len(ctx.meter.buffer) == 0  # nothing recorded after the final flush


async def test_a_lease_running_low_is_refilled_before_a_call_is_charged_less_than_its_price(api, ctx, catalog):
    """With plenty in the balance, a call whose process lease holds less than its price (18 credits for a profile)
    waits for a refill and is charged in full; only an account with nothing more to lease pays its last credits
    for a call (400 calls in flight once took a lease's 15-credit rest for an 18-credit call)."""
    user, key = await api.funded_key(INITIAL)
    assert (await api.call("GET", info(catalog), key=key["key"]))[0] == 200  # this process holds a lease now
    ledger = ctx.meter.ledger
    purse = ledger.purses[user["account_id"]]
    held = ledger.reserve(user["account_id"], purse.available - 15, 0, ctx.meter.clock())  # 15 credits left
    assert purse.available == 15
    status, _, headers = await api.call("GET", info(catalog), key=key["key"])
    ctx.meter.release(held)
    assert status == 200 and headers["X-Credits-Charged"] == "18"
