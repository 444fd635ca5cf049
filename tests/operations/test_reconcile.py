"""`reconcile` and the schema version, as an operator meets them: the account whose credits were changed by hand
is named; a database from before schema versions is brought forward once at the start, and one newer than the
binary stops `serve` with one line (docs/operations.md)."""

import asyncio
import uuid
from datetime import UTC, datetime

import orjson
import pymongo
import pytest
from support import UPSTREAM_KEY, Gateway, account_with_keys, cli

from accounting import reconcile
from app.embedded import free_port
from gateway_testing.stack import GatewayProcess, gateway_env
from storage import ledger

pytestmark = pytest.mark.gen_test(timeout=120)


async def test_reconcile_names_the_account_whose_credits_were_changed_by_hand(mongo, upstream_url, catalog):
    db_name = f"o_{uuid.uuid4().hex[:10]}"
    env = {"MONGODB_URI": mongo.uri, "MONGODB_DB": db_name}
    gw = await Gateway(mongo.uri, upstream_url, db_name).launch()
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    users = []
    for _ in range(3):
        user, (secret,), auth = await account_with_keys(gw, 50_000, 1)
        for _ in range(5):
            assert (await gw.call("GET", path, **{"X-API-Key": secret})).code == 200
        users.append(user)
    # A paid order too (the sandbox chain, as docs/payments.md shows it): its credits are ledger entries.
    checkout = {"currency": "USDTTRC20", "amount_usd": 25}
    order = orjson.loads((await gw.call("POST", "/billing/crypto/checkout", checkout, **auth)).body)
    code, out, err = await cli("sandbox-pay", order["order_id"], "25", **env, UPSTREAM_URL=upstream_url)
    assert code == 0, out + err
    # A member invited with no account of their own has a sign-in but no balance: no account to the books.
    invite = {"email": f"m{uuid.uuid4().hex[:8]}@example.com", "role": "viewer"}
    invitation = orjson.loads((await gw.call("POST", "/members/invitations", invite, **auth)).body)
    accept = {"token": invitation["token"], "password": "member password 1"}
    assert (await gw.call("POST", "/auth/invitations/accept", accept)).code == 200
    code, out, err = await cli("reconcile", **env)  # while the gateway serves: leases held, usage buffered or not
    assert code == 0 and out.startswith("reconcile OK: 3 accounts, 1 orders"), out + err

    db = pymongo.MongoClient(mongo.uri)[db_name]
    # The books as read without a snapshot (a standalone mongod): accounts before and after the usage sum.
    books = await asyncio.to_thread(ledger.read_books, db, None)
    assert reconcile.check(books, datetime.now(UTC)).differences == []
    tampered = users[1]
    db.accounts.update_one({"_id": tampered["account_id"]}, {"$inc": {"credits": 1}})
    code, out, err = await cli("reconcile", **env)
    assert code == 1, out + err
    assert out.splitlines() == [line for line in out.splitlines() if tampered["account_id"] in line]
    assert len(out.splitlines()) == 1 and "+1 credits unaccounted for" in out
    assert "1 differences" in err

    db.accounts.update_one({"_id": tampered["account_id"]}, {"$inc": {"credits": -1}})
    # The usage by month statements read must count what the usage records hold.
    db.usage_months.update_one({"account_id": tampered["account_id"]}, {"$inc": {"credits": 1}})
    code, out, err = await cli("reconcile", **env)
    assert code == 1 and len(out.splitlines()) == 1, out + err
    assert tampered["account_id"] in out and "the usage by month (statements) counts" in out
    db.usage_months.update_one({"account_id": tampered["account_id"]}, {"$inc": {"credits": -1}})
    db.orders.update_one({"_id": order["order_id"]}, {"$inc": {"credits_applied": 1}})
    code, out, err = await cli("reconcile", **env)
    assert code == 1 and len(out.splitlines()) == 1, out + err
    assert out.startswith(f"order {order['order_id']} (account {users[2]['account_id']} (s")
    assert out.strip().endswith("): credits applied 2500001 != its ledger entries 2500000"), out
    db.orders.update_one({"_id": order["order_id"]}, {"$inc": {"credits_applied": -1}})
    await asyncio.to_thread(gw.stop)
    assert (await cli("reconcile", **env))[0] == 0  # after the stop: leases returned, every record written


async def test_the_schema_is_brought_forward_once_and_a_newer_one_is_refused(mongo, upstream_url, catalog, tmp_path):
    """A database from before schema versions (no record, no ledger of additions) is brought forward at the start,
    logged once; a database newer than the binary stops `serve` with one line."""
    db_name = f"o_{uuid.uuid4().hex[:10]}"
    env = {"MONGODB_URI": mongo.uri, "MONGODB_DB": db_name}
    gw = await Gateway(mongo.uri, upstream_url, db_name).launch()
    _, (secret,), _ = await account_with_keys(gw, 50_000, 1)
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    assert (await gw.call("GET", path, **{"X-API-Key": secret})).code == 200
    await asyncio.to_thread(gw.stop)
    db = pymongo.MongoClient(mongo.uri)[db_name]
    db.schema.drop()  # as an older gateway left it
    db.accounts.update_many({}, {"$unset": {"credits_added": ""}})
    db.usage_months.drop()  # and without the usage by month of monthly statements
    code, out, _ = await cli("reconcile", **env)
    assert code == 1 and "no ledger of additions" in out

    async def start() -> str:
        log = tmp_path / f"serve-{uuid.uuid4().hex[:6]}.log"
        with open(log, "w") as fh:
            process = GatewayProcess(
                gateway_env(mongo.uri, db_name, upstream_url, UPSTREAM_KEY, LOG_LEVEL="INFO"), stderr=fh
            )
            await asyncio.to_thread(process.start)
            await asyncio.to_thread(process.stop)
        return log.read_text()

    first = await start()
    assert "schema 1 -> 2: started the ledger of additions (credits_added) on 1 of 1 accounts" in first
    assert "schema 2 -> 3: counted the usage by month of 1 accounts (1 documents)" in first
    assert "schema 1 -> 2" not in await start()  # idempotent: nothing to do the second time
    record = db.schema.find_one({"_id": "version"})
    assert record["version"] == 3 and len(record["steps"]) == 2
    assert (await cli("reconcile", **env))[0] == 0

    db.schema.update_one({"_id": "version"}, {"$set": {"version": 99}})
    code, out, err = await cli("serve", "--port", str(free_port()), **env, UPSTREAM_URL=upstream_url)
    assert code == 1
    assert err.strip().splitlines() == [
        f"social-gateway: the database {db_name} is at schema version 99, newer than this gateway's 3: "
        "run the newer release (or restore a backup taken before the upgrade)"
    ]
