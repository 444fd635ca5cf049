"""`backup` and `restore` as an operator runs them (the installed console script), against a served gateway: a
backup taken under load restores into a database the gateway starts on, with every account's credits adding up
to the credit and every key, rule and pending delivery there; a damaged archive and a non-empty target are
refused (docs/operations.md, Backups). A restore is all or nothing: a forged, re-signed or mislabelled archive,
or a target a gateway serves, is one line and exit 1 with the target as it was; a gateway on other secrets
refuses to start; a restored database sends nothing outward until `release-outbound`."""

import asyncio
import hashlib
import io
import json
import os
import stat
import tarfile
import uuid

import bson
import orjson
import pymongo
import pytest
from support import UPSTREAM_KEY, Gateway, Receiver, SearchProvider, account_with_keys, cli

import sandbox
from app.embedded import free_port
from gateway_testing.helpers import Inbox
from gateway_testing.stack import gateway_env
from security import seals
from storage import backup, schema

pytestmark = pytest.mark.gen_test(timeout=150)

STREAMS = {"STREAM_MIN_INTERVAL": "1", "STREAM_TICK_SECONDS": "0.1", "WEBHOOK_POLL_SECONDS": "0.5"}
KEY = gateway_env("", "", "", "")["SECRETS_KEY"]  # the served gateways'; the commands sign and check with it


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
    source = {"MONGODB_URI": mongo.uri, "MONGODB_DB": db_name, "SECRETS_KEY": KEY}
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
        target = {"MONGODB_URI": mongo.uri, "MONGODB_DB": f"o_{uuid.uuid4().hex[:10]}", "SECRETS_KEY": KEY}  # fresh
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

        # The gateway starts on it, every key answers, every rule and pending delivery is there (held: outbound is,
        # on a restored database); the processes that ran at the backup are dead to it (the restore marked their
        # heartbeats long past), so their leases are reclaimed against the usage they had stored, and after a
        # clean stop the books still add up.
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


def rewritten(archive: str, path: str, name: str, change, key: str) -> str:
    """A copy of the archive whose collection `name` is `change(documents)`, its manifest's count and checksum
    recomputed and signed with `key`: what someone who edits an archive with care writes."""
    with tarfile.open(archive, "r:gz") as src:
        members = {member.name: src.extractfile(member).read() for member in src}
    manifest = json.loads(members.pop("manifest.json"))
    docs = change(bson.decode_all(members[f"{name}.bson"]))
    data = b"".join(bson.encode(doc) for doc in docs)
    members[f"{name}.bson"] = data
    manifest["collections"][name].update(count=len(docs), bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    manifest["signature"] = seals.sign_manifest(key, backup.signed_part(manifest))
    with tarfile.open(path, "w:gz") as dst:
        for member_name, data in [("manifest.json", json.dumps(manifest).encode()), *members.items()]:
            info = tarfile.TarInfo(member_name)
            info.size = len(data)
            dst.addfile(info, io.BytesIO(data))
    return path


def everything(uri: str, db_name: str, only=None) -> dict:
    """Every collection of the database (or those `only` names) with its documents and index names: what a refused
    restore must not touch."""
    db = pymongo.MongoClient(uri)[db_name]
    return {
        name: (sorted(map(repr, db[name].find())), sorted(db[name].index_information()))
        for name in db.list_collection_names()
        if only is None or name in only
    }


async def test_a_restore_checks_the_whole_archive_first_and_a_refusal_leaves_the_target_as_it_was(
    mongo, upstream_url, tmp_path
):
    """Issue 46 (10, 11) and 47 (9): an account held twice (manifest recomputed and signed), a balance raised with its
    credits_added (manifest recomputed, signed without SECRETS_KEY), a newer schema in the data than its manifest says,
    another SECRETS_KEY, a target a gateway serves: each is one line and exit 1, and the target keeps every document
    and index it had. The archive is the operator's alone (0600); a gateway on other secrets refuses to start."""
    db_name, target_name = f"o_{uuid.uuid4().hex[:10]}", f"o_{uuid.uuid4().hex[:10]}"
    source = {"MONGODB_URI": mongo.uri, "MONGODB_DB": db_name, "SECRETS_KEY": KEY}
    target = {**source, "MONGODB_DB": target_name}
    gw = await Gateway(mongo.uri, upstream_url, db_name).launch()
    for _ in range(2):
        await account_with_keys(gw, 50_000, 1)
    archive = str(tmp_path / "backup.tar.gz")
    code, out, err = await cli("backup", "--out", archive, **source)
    assert code == 0, err
    assert stat.S_IMODE(os.stat(archive).st_mode) == 0o600  # password hashes and sealed secrets inside

    books = ("accounts", "keys", "members", "schema", "markers")  # what an idle gateway does not change itself
    served = everything(mongo.uri, db_name, books)
    code, out, err = await cli("restore", archive, "--force", **source)  # onto the database the gateway serves
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"social-gateway: restore: a gateway serves the target database {db_name} (1 process,")
    assert everything(mongo.uri, db_name, books) == served
    await asyncio.to_thread(gw.stop)

    code, out, err = await cli("restore", archive, **target)
    assert code == 0 and "signature, counts and checksums matched" in out, out + err
    good = everything(mongo.uri, target_name)

    def twice(docs):
        return docs + docs[:1]

    def richer(docs):
        docs[0]["credits"] += 1_000_000
        docs[0]["credits_added"] += 1_000_000
        return docs

    def newer(docs):
        return [{**doc, "version": schema.VERSION + 1} if doc["_id"] == "version" else doc for doc in docs]

    forged = [
        (rewritten(archive, str(tmp_path / "twice.tar.gz"), "accounts", twice, KEY), "accounts: 1 documents repeat"),
        (
            rewritten(archive, str(tmp_path / "rich.tar.gz"), "accounts", richer, "not-the-key-" * 4),
            "the manifest's signature does not match: the archive was changed after it was written",
        ),
        (
            rewritten(archive, str(tmp_path / "schema.tar.gz"), "schema", newer, KEY),
            f"its database records schema version {schema.VERSION + 1}, its manifest {schema.VERSION}",
        ),
    ]
    for path, said in forged:
        code, out, err = await cli("restore", path, "--force", **target)
        assert code == 1 and len(err.strip().splitlines()) == 1 and said in err, (path, out, err)
        assert everything(mongo.uri, target_name) == good  # no staging collection left, nothing replaced

    # Restored where the gateway's SECRETS_KEY did not come along (a new data directory): refused at the restore.
    elsewhere = {**target, "MONGODB_DB": f"o_{uuid.uuid4().hex[:10]}", "DATA_DIR": str(tmp_path / "new")}
    code, out, err = await cli("restore", archive, **{k: v for k, v in elsewhere.items() if k != "SECRETS_KEY"})
    assert code == 1 and "no SECRETS_KEY to check the archive's signature with" in err and "secrets.json" in err
    code, out, err = await cli("restore", archive, **{**elsewhere, "SECRETS_KEY": "another-secrets-key-" * 3})
    assert code == 1 and "written by a gateway with another SECRETS_KEY" in err, err

    # A gateway started on the restored database with other secrets refuses with one line naming SECRETS_KEY,
    # also when the database predates the fingerprint (one of its sealed key secrets is tried).
    serve = {**target, "SECRETS_KEY": "another-secrets-key-" * 3, "UPSTREAM_URL": upstream_url}
    serve.update(DATA_DIR=str(tmp_path / "serve"), JWT_SECRET="j" * 40)
    for _ in range(2):
        code, out, err = await cli("serve", "--port", str(free_port()), **serve)
        assert code == 1 and len(err.strip().splitlines()) == 1, err
        assert err.startswith(f"social-gateway: SECRETS_KEY is not the one the database {target_name} was written")
        pymongo.MongoClient(mongo.uri)[target_name].markers.delete_one({"_id": "secrets"})


async def test_a_restored_database_sends_nothing_outward_until_the_operator_releases_it(mongo, tmp_path):
    """Issue 47 (10): a restore drill must not reach customers. The restored gateway says at start and in /readyz that
    outbound is held; its rule does not poll the provider, its webhook test is not delivered, a reset email is not
    sent; `release-outbound` lets all of it go, in the running gateway."""
    provider, receiver, inbox = SearchProvider(), Receiver(), Inbox()
    db_name, target_name = f"o_{uuid.uuid4().hex[:10]}", f"o_{uuid.uuid4().hex[:10]}"
    source = {"MONGODB_URI": mongo.uri, "MONGODB_DB": db_name, "SECRETS_KEY": KEY}
    target = {**source, "MONGODB_DB": target_name}
    mail = {"SMTP_URL": f"smtp://127.0.0.1:{inbox.port}", **STREAMS}
    try:
        gw = await Gateway(mongo.uri, provider.url, db_name, **mail).launch()
        _, (secret,), auth = await account_with_keys(gw, 1_000_000, 1)
        email = (await call(gw, "GET", "/auth/me", **auth))[1]["email"]
        rule = {"tag": "t", "value": "from:alice", "interval_seconds": 1}
        status, body = await call(gw, "POST", "/oapi/tweet_filter/add_rule", rule, **{"X-API-Key": secret})
        update = {**rule, "rule_id": body["rule_id"], "is_effect": 1}
        assert (await call(gw, "POST", "/oapi/tweet_filter/update_rule", update, **{"X-API-Key": secret}))[0] == 200
        status, endpoint = await call(gw, "POST", "/webhooks", {"url": receiver.url}, **auth)
        assert status == 200, endpoint
        for _ in range(200):  # the source polls (a bound on a hang)
            if provider.queries:
                break
            await asyncio.sleep(0.1)
        await asyncio.to_thread(gw.stop)
        archive = str(tmp_path / "backup.tar.gz")
        assert (await cli("backup", "--out", archive, **source))[0] == 0
        code, out, err = await cli("restore", archive, **target)
        assert code == 0 and "Outbound is held" in out, out + err

        provider.queries.clear()
        log = tmp_path / "restored.log"
        restored = Gateway(mongo.uri, provider.url, target_name, LOG_LEVEL="WARNING", **mail)
        with open(log, "w") as fh:
            restored.stderr = fh
            await restored.launch()
        assert "outbound held since" in log.read_text() and "social-gateway release-outbound" in log.read_text()
        status, ready = await call(restored, "GET", "/readyz")
        assert status == 200 and ready["checks"]["outbound"] == "held", ready
        assert (await call(restored, "POST", f"/webhooks/{endpoint['endpoint_id']}/test", {}, **auth))[0] == 200
        assert (await call(restored, "POST", "/auth/password/forgot", {"email": email}))[0] == 202
        await asyncio.sleep(3)  # polls due every second, deliveries looked at every 0.5 s: none may leave
        assert (provider.queries, receiver.raw, inbox.messages) == ([], [], [])

        code, out, err = await cli("release-outbound", **target)
        assert code == 0 and f"outbound of {target_name} released" in out, out + err
        for _ in range(300):  # the running gateway sees it within seconds (a bound on a hang)
            if provider.queries and receiver.raw:
                break
            await asyncio.sleep(0.1)
        assert provider.queries and receiver.raw
        assert (await call(restored, "GET", "/readyz"))[1]["checks"]["outbound"] == "open"
        assert (await call(restored, "POST", "/auth/password/forgot", {"email": email}))[0] == 202
        assert len(await inbox.until(1)) == 1
        await asyncio.to_thread(restored.stop)
    finally:
        provider.stop()
        receiver.stop()
        inbox.stop()
