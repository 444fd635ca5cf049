"""A lease take on a balance that other processes keep changing (storage/leases.py `take`), on the real database:
what the take reports is what the database moved, whichever of its compare-and-sets landed. A take whose last
compare-and-set moved the rest but reported nothing left those credits in the process's lease unseen: three
processes kept 619 credits out of reach of every call until they stopped (tests/metering/test_scaleout.py)."""

import uuid

import pytest
from pymongo import AsyncMongoClient

from storage.leases import TAKE_ATTEMPTS, LeaseStore
from storage.usage import UsageStore

pytestmark = pytest.mark.gen_test(timeout=60)
BALANCE, PRICE = 100, 18


class Contended:
    """The accounts collection as a process sees it while another one spends: after each of this process's
    first `times` reads of an account, the other process takes one credit (a real write, between the read and
    the compare-and-set that relies on it)."""

    def __init__(self, accounts, rival: LeaseStore, times: int):
        self._accounts, self._rival, self._times = accounts, rival, times

    def __getattr__(self, name):
        return getattr(self._accounts, name)

    async def find_one(self, *args, **kwargs):
        doc = await self._accounts.find_one(*args, **kwargs)
        if self._times > 0:
            self._times -= 1
            assert (await self._rival.take(doc["_id"], 1, 1)).amount is not None
        return doc


@pytest.fixture
def db(mongo, io_loop):
    client = AsyncMongoClient(mongo.uri)
    yield client.get_database(f"l_{uuid.uuid4().hex[:10]}")
    io_loop.run_sync(client.close)


@pytest.mark.parametrize("raced", range(TAKE_ATTEMPTS + 1))
async def test_a_take_reports_what_the_database_moved_however_often_it_was_raced(db, raced):
    """Asked for more than the balance holds, the take moves the rest; `raced` of its reads are overtaken by
    another process's take. It reports the lease the database holds for it, or nothing when nothing moved."""
    usage = UsageStore(db)
    mine, rival = LeaseStore(db, usage, "mine", "node-a"), LeaseStore(db, usage, "rival", "node-b")
    await db.accounts.insert_one({"_id": "acct", "credits": BALANCE, "leases": {}})
    mine.accounts = Contended(db.accounts, rival, raced)

    grant = await mine.take("acct", 10 * BALANCE, PRICE)

    account = await db.accounts.find_one({"_id": "acct"})
    held = account["leases"].get("mine", {}).get("amount")
    assert grant.amount == held, f"the take reported {grant.amount}, the database holds {held} for it"
    rival_held = account["leases"]["rival"]["amount"] if raced else 0
    assert rival_held == raced and account["credits"] + (held or 0) + rival_held == BALANCE
    if raced < TAKE_ATTEMPTS:  # a compare-and-set landed: the whole rest moved
        assert held == BALANCE - raced and grant.balance == 0 and grant.others == (1 if raced else 0)
    else:  # every compare-and-set was overtaken: nothing moved, and the take says so
        assert held is None and grant.balance == BALANCE - raced + 1 and grant.others == 1
