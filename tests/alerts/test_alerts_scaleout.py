"""Alerts against served gateways (README, "Alerts and webhooks"): an account spent down across its threshold
from two workers at once makes exactly one event, delivered once to a real receiver that verifies its
signature, after the receiver was down for a while; a gateway stopped with an undelivered event delivers it
after its restart."""

import asyncio
import uuid

import orjson
import pytest
from support import Gateway, Receiver, account_with_keys, charged, storm

from storage import db as database

pytestmark = pytest.mark.gen_test(timeout=120)
PRICE = 18  # user/info
LEAST = 15  # the per-call minimum (metering/pricing.py)
QUICK = {
    "ALERT_CHECK_SECONDS": "0.2",
    "WEBHOOK_POLL_SECONDS": "0.3",
    "WEBHOOK_RETRY_SCHEDULE": "[0.3, 0.6]",
}


async def stored(mongo_uri: str, db_name: str, collection: str, query: dict) -> list[dict]:
    client = database.connect(mongo_uri)
    found = await client[db_name][collection].find(query).to_list(None)
    await client.close()
    return found


async def armed_account(gw: Gateway, receiver: Receiver, credits: int, threshold: int) -> tuple[dict, list, dict]:
    """An account with three keys, a webhook endpoint at `receiver` and a balance_below rule."""
    user, keys, auth = await account_with_keys(gw, credits, 3)
    response = await gw.call("POST", "/webhooks", {"url": receiver.url}, **auth)
    receiver.secret = orjson.loads(response.body)["secret"]
    response = await gw.call("POST", "/alerts", {"kind": "balance_below", "credits": threshold}, **auth)
    assert response.code == 200, response.body
    return user, keys, auth


async def attempts_made(mongo_uri: str, db_name: str, account_id: str, at_least: int) -> list[dict]:
    """The account's deliveries once one has `at_least` attempts (bounded wait on a hang, no timing assertion)."""
    for _ in range(300):
        found = await stored(mongo_uri, db_name, "webhook_deliveries", {"account_id": account_id})
        if found and found[0]["attempts"] >= at_least:
            return found
        await asyncio.sleep(0.1)
    events = await stored(mongo_uri, db_name, "webhook_events", {"account_id": account_id})
    rules = await stored(mongo_uri, db_name, "alert_rules", {"account_id": account_id})
    account = await stored(mongo_uri, db_name, "accounts", {"_id": account_id})
    raise AssertionError(f"no delivery attempt was recorded: events {events}, rules {rules}, account {account}")


async def test_two_workers_spending_across_a_threshold_make_one_event_delivered_once_after_retries(
    mongo, upstream_url, catalog
):
    db_name = f"a_{uuid.uuid4().hex[:10]}"
    receiver = Receiver()
    receiver.status = 503  # down at first
    gw = Gateway(mongo.uri, upstream_url, db_name, workers=2, **QUICK)
    await gw.launch()
    user, keys, _ = await armed_account(gw, receiver, 300 * PRICE, 100 * PRICE)
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    # Concurrent calls through both workers until the balance runs out: each spends, each checks, each sees
    # the crossing (300 calls' worth spread over both, the threshold crossed after 200).
    spent = 0
    for _ in range(30):
        responses = await asyncio.gather(*await storm([(gw, key) for key in keys], path, 40))
        assert {r.code for r in responses} <= {200, 402}
        spent += charged(responses)
        if spent > 220 * PRICE:
            break
        if any(r.code == 402 for r in responses):
            # A worker may answer 402 while the other holds the credits; asked, it gives half back (README, Scale-out).
            await asyncio.sleep(1.2)
    assert spent > 220 * PRICE
    delivery = (await attempts_made(mongo.uri, db_name, user["account_id"], 2))[0]
    assert delivery["state"] == "pending" and delivery["last_status"] == 503
    receiver.status = 200
    events = await receiver.until(1)
    await asyncio.sleep(1.5)  # more checks and dispatch rounds in both workers: nothing more may come
    # Invariant: one crossing, one event in the database, one acknowledged delivery, every attempt under one id.
    stored_events = await stored(mongo.uri, db_name, "webhook_events", {"account_id": user["account_id"]})
    assert [e["type"] for e in stored_events] == ["balance.low"]
    assert len(receiver.verified) == 1 and receiver.rejected == 0
    assert events[0]["data"]["threshold_credits"] == 100 * PRICE and events[0]["data"]["balance_credits"] < 100 * PRICE
    assert {h["webhook-id"] for _, h in receiver.raw} == {stored_events[0]["_id"]}
    (delivery,) = await stored(mongo.uri, db_name, "webhook_deliveries", {"account_id": user["account_id"]})
    assert delivery["state"] == "delivered" and delivery["attempts"] >= 3
    # Both workers served calls of this account (each held a lease), so both could have fired.
    account = (await stored(mongo.uri, db_name, "accounts", {"_id": user["account_id"]}))[0]
    usage = await stored(mongo.uri, db_name, "usage_buckets", {"account_id": user["account_id"]})
    assert len({b["lease"] for b in usage}) == 2, "the kernel sent every call to one worker"
    assert account["credits"] >= 0
    assert await asyncio.to_thread(gw.stop) == 0
    receiver.stop()


async def test_an_event_left_undelivered_at_shutdown_is_delivered_after_the_restart(mongo, upstream_url, catalog):
    db_name = f"a_{uuid.uuid4().hex[:10]}"
    receiver = Receiver()
    receiver.status = 500
    gw = Gateway(mongo.uri, upstream_url, db_name, **QUICK)
    await gw.launch()
    user, keys, _ = await armed_account(gw, receiver, 40 * PRICE, 30 * PRICE)
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    for _ in range(15):
        assert (await gw.call("GET", path, **{"X-API-Key": keys[0]})).code == 200
    await attempts_made(mongo.uri, db_name, user["account_id"], 1)
    assert await asyncio.to_thread(gw.stop) == 0  # the event is recorded, not delivered
    (event,) = await stored(mongo.uri, db_name, "webhook_events", {"account_id": user["account_id"]})
    receiver.status = 200
    again = Gateway(mongo.uri, upstream_url, db_name, **QUICK)
    await again.launch()
    delivered = await receiver.until(1)
    await asyncio.sleep(1.0)
    # Invariant: delivered after the restart, once, as the same message.
    assert len(receiver.verified) == 1 and delivered[0]["webhook-id"] == event["_id"]
    assert delivered[0]["type"] == "balance.low"
    assert await asyncio.to_thread(again.stop) == 0
    receiver.stop()


async def spend(gw: Gateway, key: str, path: str, calls: int) -> None:
    """`calls` charged calls through `gw`, 20 at a time; a 402 (the other process holds the credits and is asked
    for half of them, README "Scale-out") is tried again once they are back."""
    done = 0
    for _ in range(200):
        responses = await asyncio.gather(
            *[gw.call("GET", path, **{"X-API-Key": key}) for _ in range(min(20, calls - done))]
        )
        assert {r.code for r in responses} <= {200, 402}, [r.body for r in responses]
        # Each call is charged its price, or what its process still holds when that is less but at least the
        # call's minimum (docs/api.md, "reserves what is left and the charge is capped at it"); never more.
        assert all(LEAST <= int(r.headers["X-Credits-Charged"]) <= PRICE for r in responses if r.code == 200)
        done += sum(r.code == 200 for r in responses)
        if done == calls:
            return
        await asyncio.sleep(0.3)
    raise AssertionError(f"only {done} of {calls} calls were served")


async def stored_by(mongo_uri: str, db_name: str, account_id: str, processes: int) -> None:
    """Waits until usage of the account is stored under `processes` leases (bounded wait on a hang)."""
    for _ in range(300):
        buckets = await stored(mongo_uri, db_name, "usage_buckets", {"account_id": account_id})
        if len({b["lease"] for b in buckets}) >= processes:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("a flush did not store the usage")


async def test_a_crossing_that_only_the_other_process_flush_reveals_still_makes_its_event(mongo, upstream_url, catalog):
    # Two processes, each writing usage only once FLUSH_BATCH records wait: each sees the balance as the stored
    # figures minus its own unflushed spend, so while both hold their spend neither sees the crossing.
    db_name = f"a_{uuid.uuid4().hex[:10]}"
    held = {**QUICK, "FLUSH_INTERVAL": "3600", "FLUSH_BATCH": "121"}
    first = await Gateway(mongo.uri, upstream_url, db_name, **held).launch()
    second = await Gateway(mongo.uri, upstream_url, db_name, **held).launch()
    receiver = Receiver()
    user, keys, _ = await armed_account(first, receiver, 300 * PRICE, 100 * PRICE)
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    await spend(first, keys[0], path, 120)  # 3,240 credits seen by each: over the 1,800 threshold
    await spend(second, keys[1], path, 120)  # 1,080 left in truth
    # One uncharged call each (a user the provider does not know) fills its batch: the first process stores
    # its usage, then the second. Neither spent anything more, so neither would look again by itself.
    unknown = "/social/user/info?userName=nobody_at_all_here"
    for gw, key, count in ((first, keys[0], 1), (second, keys[1], 2)):
        response = await gw.call("GET", unknown, **{"X-API-Key": key})
        assert response.code == 200 and response.headers["X-Credits-Charged"] == "0", response.body
        await stored_by(mongo.uri, db_name, user["account_id"], count)
    delivered = await receiver.until(1)
    assert len(delivered) == 1 and delivered[0]["type"] == "balance.low", delivered
    assert delivered[0]["data"]["balance_credits"] == 300 * PRICE - 240 * PRICE
    for gw in (first, second):
        assert await asyncio.to_thread(gw.stop) == 0
    events = await stored(mongo.uri, db_name, "webhook_events", {"account_id": user["account_id"]})
    assert [e["type"] for e in events] == ["balance.low"]
    receiver.stop()
