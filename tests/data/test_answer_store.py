"""The shared answer tier's fill claim (storage/answers.py) against the real database server, from two processes'
stores at once: however many misses of one key arrive together, exactly one of them asks the provider, whether
the key was never seen or its last claim is gone."""

import asyncio
import time
import uuid

import pytest
from pymongo import AsyncMongoClient

from storage.answers import AnswerStore, Cached

pytestmark = pytest.mark.gen_test(timeout=120)
KEYS, AT_ONCE = 10, 20


@pytest.fixture
def stores(mongo, io_loop):
    """Two machines' stores on one database: two clients (two connection pools), two owners."""
    clients = [AsyncMongoClient(mongo.uri) for _ in range(2)]
    db_name = f"a_{uuid.uuid4().hex[:10]}"
    yield [AnswerStore(client.get_database(db_name), f"machine-{i}") for i, client in enumerate(clients)]
    for client in clients:
        io_loop.run_sync(client.close)


async def test_identical_misses_at_once_make_one_claim(stores):
    """Twenty misses of a new key at once, from both machines: one holds the claim, the others wait for it (a
    database whose upsert is not atomic handed the claim to several at once, and each asked the provider)."""
    for n in range(KEYS):
        key = f"new-{n}"
        found = await asyncio.gather(*[stores[i % 2].claim(key, 30.0) for i in range(AT_ONCE)])
        holders = [doc for doc in found if doc is None]
        assert len(holders) == 1, f"{len(holders)} claims of {key}"
        assert all(doc and doc["owner"] in ("machine-0", "machine-1") for doc in found if doc is not None)


async def test_misses_of_a_gone_claim_take_it_once_and_the_rest_get_its_answer(stores):
    """A key whose document went away (expired, dropped) while calls waited on it: one of them takes the claim
    and keeps its answer; every other one is served that answer instead of asking the provider itself."""
    for n in range(KEYS):
        key = f"gone-{n}"
        entry = Cached(200, b'{"n": %d}' % n, 18, time.time())

        async def miss(store: AnswerStore, key: str = key, entry: Cached = entry):
            found = await store.wait(key, {}, 60.0, 5.0)
            if found is None:  # this call asks the provider, and keeps its answer a little later
                await asyncio.sleep(0.1)
                await store.put(key, entry, 60.0)
            return found

        found = await asyncio.gather(*[miss(stores[i % 2]) for i in range(AT_ONCE)])
        assert sum(f is None for f in found) == 1
        assert all(f.body == entry.body for f in found if f is not None)


async def test_a_claim_finds_a_kept_answer(stores):
    entry = Cached(200, b'{"kept": true}', 18, time.time())
    await stores[0].put("kept", entry, 60.0)
    doc = await stores[1].claim("kept", 30.0)
    assert bytes(doc["body"]) == entry.body and "owner" not in doc
