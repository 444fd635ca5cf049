"""Expiry on the embedded database (storage/expiry.py): SecantusDB's own TTL sweeper pins a read snapshot for a
minute and stalled the server under load, so there the gateway makes its TTL indexes without their expiry and
deletes what has expired itself. What a user sees must not change: expired documents go, the others stay, as
MongoDB's TTL monitor would decide."""

import asyncio
import time
from datetime import UTC, datetime, timedelta

import pytest
from pymongo import ASCENDING, IndexModel

from storage.expiry import Expiry

pytestmark = pytest.mark.gen_test(timeout=60)

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


async def indexes(collection) -> dict:
    return {index["name"]: index async for index in await collection.list_indexes()}


async def ids(collection) -> list:
    return sorted([doc["_id"] async for doc in collection.find({}, {"_id": 1})])


async def test_the_gateway_keeps_no_ttl_index_on_the_embedded_database_and_expires_documents_itself(ctx):
    db = ctx.client[ctx.settings.mongodb_db]
    assert ctx.expiry.passes
    for name, field in (
        ("idempotency_keys", "expires_at"),
        ("stream_events", "created_at"),
        ("audit_log", "expires_at"),
    ):
        index = (await indexes(db[name]))[f"{field}_1"]
        assert "expireAfterSeconds" not in index, f"{name} keeps a TTL index: the server's sweeper would pin"
    retention = timedelta(seconds=ctx.settings.stream_event_retention)
    await db.idempotency_keys.insert_many(
        [{"_id": "gone", "expires_at": NOW - timedelta(seconds=1)}, {"_id": "kept", "expires_at": NOW}]
    )
    await db.stream_events.insert_many(
        [
            {"_id": "old", "created_at": NOW - retention - timedelta(seconds=1), "account_id": "a"},
            {"_id": "recent", "created_at": NOW - retention + timedelta(seconds=1), "account_id": "a"},
        ]
    )

    assert await ctx.expiry.once(NOW) >= 2

    assert await ids(db.idempotency_keys) == ["kept"]
    assert await ids(db.stream_events) == ["recent"]


@pytest.mark.settings(db_expiry_seconds=0.2)
async def test_the_background_pass_deletes_an_expired_document_within_its_interval(ctx):
    keys = ctx.client[ctx.settings.mongodb_db].idempotency_keys
    await keys.insert_one({"_id": "late", "expires_at": datetime.now(UTC) - timedelta(seconds=1)})
    deadline = time.monotonic() + 10
    while await keys.count_documents({"_id": "late"}) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert await keys.count_documents({"_id": "late"}) == 0


@pytest.mark.settings(db_expiry_seconds=0)
async def test_db_expiry_seconds_0_leaves_expiry_to_the_servers_own_ttl_indexes(ctx):
    db = ctx.client[ctx.settings.mongodb_db]
    assert not ctx.expiry.passes and await ctx.expiry.once(NOW) == 0
    assert (await indexes(db.idempotency_keys))["expires_at_1"]["expireAfterSeconds"] == 0
    events = await indexes(db.stream_events)
    assert events["created_at_1"]["expireAfterSeconds"] == ctx.settings.stream_event_retention


async def test_a_pass_decides_as_mongodbs_monitor_partial_filters_arrays_and_values_that_are_not_dates(ctx):
    db = ctx.client[ctx.settings.mongodb_db]
    expiry = Expiry(db, 60)
    await expiry.start()
    await expiry.create_indexes(
        db.kinds, [IndexModel([("at", ASCENDING)], expireAfterSeconds=3600, partialFilterExpression={"kind": "x"})]
    )
    hour_ago = NOW - timedelta(hours=1, seconds=1)
    await db.kinds.insert_many(
        [
            {"_id": "expired", "at": hour_ago, "kind": "x"},
            {"_id": "outside the filter", "at": hour_ago, "kind": "y"},
            {"_id": "within the hour", "at": NOW - timedelta(minutes=59), "kind": "x"},
            {"_id": "one date of an array expired", "at": [NOW, hour_ago], "kind": "x"},
            {"_id": "not a date", "at": "2000-01-01", "kind": "x"},
            {"_id": "no date", "kind": "x"},
        ]
    )

    assert await expiry.once(NOW) == 2

    assert await ids(db.kinds) == ["no date", "not a date", "outside the filter", "within the hour"]


async def test_an_index_from_a_run_that_decided_otherwise_or_with_another_expiry_is_made_again(ctx):
    db = ctx.client[ctx.settings.mongodb_db]
    day = IndexModel([("created_at", ASCENDING)], expireAfterSeconds=86400)
    await db.kept.create_indexes([day])  # what the server's own TTL made, before this version
    await db.kept.insert_one({"_id": 1, "created_at": NOW})

    passes = Expiry(db, 60)
    await passes.start()
    await passes.create_indexes(db.kept, [day])
    assert "expireAfterSeconds" not in (await indexes(db.kept))["created_at_1"]

    server = Expiry(db, 0)
    await server.start()
    await server.create_indexes(db.kept, [IndexModel([("created_at", ASCENDING)], expireAfterSeconds=7200)])
    assert (await indexes(db.kept))["created_at_1"]["expireAfterSeconds"] == 7200  # a changed retention too
    assert await ids(db.kept) == [1]  # made again, nothing lost
