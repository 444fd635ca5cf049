"""`backup` and `restore` as an operator runs them (the installed console script), against a served gateway: a
backup taken under load restores into a database the gateway starts on, with every account's credits adding up
to the credit and every key, rule and pending delivery there; a damaged archive and a non-empty target are
refused (docs/operations.md, Backups)."""

import asyncio
import io
import tarfile
import uuid

import orjson
import pymongo
import pytest
from support import UPSTREAM_KEY, Gateway, account_with_keys, cli

import sandbox
from app.embedded import free_port

pytestmark = pytest.mark.gen_test(timeout=150)

STREAMS = {"STREAM_MIN_INTERVAL": "1", "STREAM_TICK_SECONDS": "0.1", "WEBHOOK_POLL_SECONDS": "0.5"}


async def call(gw: Gateway, method: str, path: str, body=None, **headers) -> tuple[int, object]:
    response = await gw.call(method, path, body, **headers)
    return response.code, orjson.loads(response.body) if response.body else None


async def test_a_backup_taken_under_load_restores_into_a_database_the_gateway_serves_with_every_credit(
    mongo, catalog, tmp_path
):
    """Calls in flight on a 0.7 s provider from two processes, 20 active rules polling, webhook deliveries pending
    for a receiver that is down: the backup is read at one moment, so after the restore and the start-up
    recovery (the leases of the processes running at the backup reclaimed) every account's credits added =
    balance + charged usage, and every key, rule and pending delivery is there."""
    sim = sandbox.start("127.0.0.1", 0, UPSTREAM_KEY, faults="latency=700")
    db_name = f"o_{uuid.uuid4().hex[:10]}"
    source = {"MONGODB_URI": mongo.uri, "MONGODB_DB": db_name}
    try:
        gw = await Gateway(mongo.uri, sim.url, db_name, workers=2, **STREAMS).launch()
        path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
        down = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens there: every attempt fails
        accounts = []
        for _ in range(2):
            user, secrets, auth = await account_with_keys(gw, 2_000_000, 3)
            keys = (await call(gw, "GET", "/keys", **auth))[1]
            budgeted = keys[-1]["key_id"]  # one key spends from a budget: reconcile checks its counter
            budget = {"credit_limit": 100_000, "credit_limit_period": "day"}
            assert (await call(gw, "PATCH", f"/keys/{budgeted}", budget, **auth))[0] == 200
            for r in range(10):
                rule = {"tag": f"t{r}", "value": f"from:{catalog['users'][r]['userName']}", "interval_seconds": 1}
                status, body = await call(gw, "POST", "/oapi/tweet_filter/add_rule", rule, **{"X-API-Key": secrets[0]})
                assert status == 200, body
                update = {**rule, "rule_id": body["rule_id"], "is_effect": 1}
                assert (await call(gw, "POST", "/oapi/tweet_filter/update_rule", update, **{"X-API-Key": secrets[0]}))[
                    0
                ] == 200
            status, endpoint = await call(gw, "POST", "/webhooks", {"url": down}, **auth)
            assert status == 200, endpoint
            for _ in range(3):
                assert (await call(gw, "POST", f"/webhooks/{endpoint['endpoint_id']}/test", {}, **auth))[0] == 200
            accounts.append({"user": user, "secrets": secrets, "auth": auth, "endpoint": endpoint["endpoint_id"]})

        stop = asyncio.Event()
        answered: list[int] = []

        async def client(secret: str) -> None:
            while not stop.is_set():
                answered.append((await gw.call("GET", path, **{"X-API-Key": secret})).code)

        clients = [asyncio.ensure_future(client(a["secrets"][i % 3])) for a in accounts for i in range(12)]
        while len(answered) < 48:  # the load is under way: every client has had answers and has a call in flight
            await asyncio.sleep(0.1)
        code, out, err = await cli("backup", "--out", str(tmp_path / "backup.tar.gz"), **source)
        assert code == 0, err
        assert "read at one moment" in out
        more = len(answered) + 24
        while len(answered) < more:  # the gateway served on while and after the backup was read
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.gather(*clients)
        assert set(answered) == {200}
        await asyncio.to_thread(gw.stop)

        # One document of the archive changed, its manifest kept: refused, nothing written.
        archive = str(tmp_path / "backup.tar.gz")
        target = {"MONGODB_URI": mongo.uri, "MONGODB_DB": f"o_{uuid.uuid4().hex[:10]}"}  # a fresh database
        code, out, err = await cli("restore", damaged(archive, tmp_path), **target)
        assert code == 1 and err.strip().splitlines() == [
            "social-gateway: restore: accounts: its documents do not match the manifest"
        ], out + err
        assert target["MONGODB_DB"] not in pymongo.MongoClient(mongo.uri).list_database_names()

        # Restored into the fresh database: the manifest's checksums hold, and the books add up as they stood,
        # calls in flight (what the leases still held) included. A second restore finds it no longer empty.
        code, out, err = await cli("restore", archive, **target)
        assert code == 0, err
        assert "counts and checksums matched" in out and "usage_buckets" in out
        code, out, err = await cli("restore", archive, **target)
        assert code == 1 and "is not empty" in err and "--force" in err, err
        code, out, err = await cli("reconcile", **target)
        assert code == 0, out + err
        held = int(out.split("(of which ")[1].split()[0])
        assert held > 0, out  # the processes' leases were holding credits for calls in flight at that moment

        # The gateway starts on it, every key answers, every rule and pending delivery is there; once the
        # processes that ran at the backup are declared dead (LEASE_TIMEOUT, short here) their leases are
        # reclaimed against the usage they had stored, and after a clean stop the books still add up.
        restored = await Gateway(mongo.uri, sim.url, target["MONGODB_DB"], LEASE_TIMEOUT="3", **STREAMS).launch()
        every_key = [restored.call("GET", path, **{"X-API-Key": s}) for a in accounts for s in a["secrets"]]
        assert {r.code for r in await asyncio.gather(*every_key)} == {200}
        for account in accounts:
            rules = (
                await call(restored, "GET", "/oapi/tweet_filter/get_rules", **{"X-API-Key": account["secrets"][0]})
            )[1]
            assert len(rules["rules"]) == 10 and all(r["is_effect"] == 1 for r in rules["rules"])
            status, deliveries = await call(
                restored, "GET", f"/webhooks/{account['endpoint']}/deliveries?limit=500", **account["auth"]
            )
            tests = [d for d in deliveries if d["type"] == "webhook.test"]  # the rules' tweets have deliveries too
            assert status == 200 and len(tests) == 3, deliveries
            assert all(d["state"] == "pending" and d["attempts"] >= 1 for d in tests), tests
        processes = pymongo.MongoClient(mongo.uri)[target["MONGODB_DB"]].processes
        for _ in range(600):  # until their leases are reclaimed (a bound on a hang, not a timing)
            if processes.count_documents({}) == 1:
                break
            await asyncio.sleep(0.1)
        await asyncio.to_thread(restored.stop)
        code, out, err = await cli("reconcile", **target)  # after a clean stop too
        assert code == 0 and "(of which 0 held in leases)" in out, out + err
    finally:
        sim.stop()


def damaged(archive: str, tmp_path) -> str:
    """A copy of the archive with one byte of one account changed and the manifest kept."""
    path = str(tmp_path / "damaged.tar.gz")
    with tarfile.open(archive, "r:gz") as src, tarfile.open(path, "w:gz") as dst:
        for member in src:
            data = src.extractfile(member).read()
            if member.name == "accounts.bson":
                data = data.replace(b"@example.com", b"@example.org", 1)
            member.size = len(data)
            dst.addfile(member, io.BytesIO(data))
    return path
