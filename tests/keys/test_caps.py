"""Per-account caps attacked with concurrent creates on a served gateway (issue 39, item 1), in one process and
through `--workers 2`: filter rules (STREAM_MAX_RULES), monitors (STREAM_MAX_MONITORS), alert rules and webhook
endpoints. Each was counted, then inserted: every create in flight passed the count before any was inserted
(80 `add_rule` with one key made 79 rules under a cap of 50; 40 endpoints 16 of 10; 80 alert rules 79 of 50;
20 monitors 20 of 5). The invariant: exactly the cap is created, every other call gets the documented 409, and
a deleted item's place is free again for exactly one more."""

import asyncio
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from support import Gateway, account_with_keys

from storage import db as database
from storage.caps import GRACE

pytestmark = pytest.mark.gen_test(timeout=120)

MONITORS = 5  # STREAM_MAX_MONITORS of these gateways


@dataclass
class Case:
    cap: int
    attempts: int
    refusal: dict  # the 409's body
    with_key: bool  # the provider's API (X-API-Key) rather than the portal (session)

    def create(self, i: int) -> tuple[str, dict]:
        raise NotImplementedError

    def made_id(self, body: dict) -> str:
        raise NotImplementedError

    def delete(self, made: str, i: int) -> tuple[str, str, Any]:
        raise NotImplementedError

    async def count(self, gw: Gateway, auth: dict, secret: str) -> int:
        raise NotImplementedError


class FilterRules(Case):
    def create(self, i):
        return "/oapi/tweet_filter/add_rule", {"tag": f"t{i}", "value": f"coffee {i}", "interval_seconds": 60}

    def made_id(self, body):
        return body["rule_id"]

    def delete(self, made, i):
        return "POST", "/oapi/tweet_filter/delete_rule", {"rule_id": made}

    async def count(self, gw, auth, secret):
        answer = await gw.call("GET", "/oapi/tweet_filter/get_rules", **{"X-API-Key": secret})
        return len(orjson.loads(answer.body)["rules"])


class Monitors(Case):
    def create(self, i):
        return "/oapi/x_user_stream/add_user_to_monitor_tweet", {"x_user_name": f"user{i}"}

    def made_id(self, body):
        return body["id_for_user"]

    def delete(self, made, i):
        return "POST", "/oapi/x_user_stream/remove_user_to_monitor_tweet", {"x_user_name": f"user{i}"}

    async def count(self, gw, auth, secret):
        rows = orjson.loads((await gw.call("GET", "/streams", **auth)).body)
        return sum(r["kind"] == "monitor" for r in rows)


class AlertRules(Case):
    def create(self, i):
        return "/alerts", {"kind": "balance_below", "credits": i + 1}

    def made_id(self, body):
        return body["rule_id"]

    def delete(self, made, i):
        return "DELETE", f"/alerts/{made}", None

    async def count(self, gw, auth, secret):
        return len(orjson.loads((await gw.call("GET", "/alerts", **auth)).body))


class Endpoints(Case):
    def create(self, i):
        return "/webhooks", {"url": f"http://127.0.0.1:9/hook{i}"}

    def made_id(self, body):
        return body["endpoint_id"]

    def delete(self, made, i):
        return "DELETE", f"/webhooks/{made}", None

    async def count(self, gw, auth, secret):
        return len(orjson.loads((await gw.call("GET", "/webhooks", **auth)).body))


CASES = {
    "filter-rules": FilterRules(
        50, 80, {"status": "error", "msg": "An account may have 50 filter rules; delete one first"}, True
    ),
    "monitors": Monitors(
        MONITORS,
        20,
        {"status": "error", "msg": f"An account may have {MONITORS} monitored accounts; delete one first"},
        True,
    ),
    "alert-rules": AlertRules(50, 80, {"detail": "An account may have 50 alert rules; delete one first"}, False),
    "webhook-endpoints": Endpoints(
        10, 40, {"detail": "An account may have 10 webhook endpoints; delete one first"}, False
    ),
}


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("name", list(CASES))
async def test_concurrent_creates_make_exactly_the_cap(mongo, upstream_url, name, workers):
    """Invariant: an account never has more than its cap. Many concurrent creates (through both workers with
    `--workers 2`): exactly `cap` succeed, the others get the 409 in their API's error shape, and the listing
    shows `cap`. Delete one: exactly one more create fits again."""
    case = CASES[name]
    db_name = f"c_{uuid.uuid4().hex[:10]}"
    gw = await Gateway(mongo.uri, upstream_url, db_name, workers=workers, STREAM_MAX_MONITORS=str(MONITORS)).launch()
    _, (secret,), auth = await account_with_keys(gw, 1_000_000, 1)
    headers = {"X-API-Key": secret} if case.with_key else auth

    async def create(i: int) -> tuple[int, dict]:
        path, body = case.create(i)
        answer = await gw.call("POST", path, body, **headers)
        return answer.code, orjson.loads(answer.body)

    answers = await asyncio.gather(*(create(i) for i in range(case.attempts)))
    made = [(i, case.made_id(body)) for i, (status, body) in enumerate(answers) if status == 200]
    refused = [body for status, body in answers if status != 200]
    assert len(made) == case.cap, sorted(status for status, _ in answers)
    assert refused == [case.refusal] * (case.attempts - case.cap), refused[:3]
    assert len({made_id for _, made_id in made}) == case.cap
    assert await case.count(gw, auth, secret) == case.cap
    # A deleted item gives its place back: one more fits, and then none.
    i, made_id = made[0]
    method, path, body = case.delete(made_id, i)
    assert (await gw.call(method, path, body, **headers)).code == 200
    assert (await create(case.attempts))[0] == 200
    assert await create(case.attempts + 1) == (409, case.refusal)
    assert await case.count(gw, auth, secret) == case.cap


@pytest.mark.parametrize("name", list(CASES))
async def test_as_many_creates_as_the_cap_at_once_all_succeed(mongo, upstream_url, name):
    """No create is refused below the cap: a new account's first creates, as many as its cap and all at once
    through `--workers 2`, all succeed (the places' document is made by one of them meanwhile)."""
    case = CASES[name]
    gw = await Gateway(
        mongo.uri, upstream_url, f"c_{uuid.uuid4().hex[:10]}", workers=2, STREAM_MAX_MONITORS=str(MONITORS)
    ).launch()
    _, (secret,), auth = await account_with_keys(gw, 1_000_000, 1)
    headers = {"X-API-Key": secret} if case.with_key else auth
    answers = await asyncio.gather(*(gw.call("POST", *case.create(i), **headers) for i in range(case.cap)))
    assert [a.code for a in answers] == [200] * case.cap, [a.body for a in answers if a.code != 200][:3]
    assert await case.count(gw, auth, secret) == case.cap


@pytest.mark.parametrize("workers", [1, 2])
async def test_concurrent_adds_of_one_handle_are_the_same_monitor(mongo, upstream_url, workers):
    """ "Adding it again is the same monitor" (docs/streams.md), 20 adds of one handle at once too (through both
    workers): each answers 200 with the same `id_for_user`, one monitor exists and it holds one place, so the
    account can still add STREAM_MAX_MONITORS - 1 others. (Looked up, then inserted, 20 at once made 3.)"""
    gw = await Gateway(
        mongo.uri, upstream_url, f"c_{uuid.uuid4().hex[:10]}", workers=workers, STREAM_MAX_MONITORS=str(MONITORS)
    ).launch()
    _, (secret,), auth = await account_with_keys(gw, 1_000_000, 1)
    headers = {"X-API-Key": secret}
    path, body = CASES["monitors"].create(0)
    answers = await asyncio.gather(*(gw.call("POST", path, {"x_user_name": "@User0"}, **headers) for _ in range(20)))
    assert [a.code for a in answers] == [200] * 20, [a.body for a in answers if a.code != 200][:3]
    assert len({orjson.loads(a.body)["id_for_user"] for a in answers}) == 1
    rows = orjson.loads((await gw.call("GET", "/streams", **auth)).body)
    assert [(r["kind"], r["status"]) for r in rows] == [("monitor", "active")]
    others = [await gw.call("POST", *CASES["monitors"].create(i), **headers) for i in range(1, MONITORS)]
    assert [a.code for a in others] == [200] * (MONITORS - 1)


async def test_a_place_outliving_its_item_is_freed_and_items_from_before_the_places_count(mongo, upstream_url):
    """The places' document (storage/caps.py) heals: made from the items there when it is missing (a database
    from before it), and at the cap a place whose item never came (a process died between taking it and the
    insert) is freed once GRACE has passed; a younger one may be a create under way, and is kept."""
    db_name = f"c_{uuid.uuid4().hex[:10]}"
    gw = await Gateway(mongo.uri, upstream_url, db_name).launch()
    user, _, auth = await account_with_keys(gw, 0, 1)
    case = CASES["webhook-endpoints"]

    async def create(i: int) -> tuple[int, dict]:
        path, body = case.create(i)
        answer = await gw.call("POST", path, body, **auth)
        return answer.code, orjson.loads(answer.body)

    made = [(await create(i))[1]["endpoint_id"] for i in range(4)]
    client = database.connect(mongo.uri)
    places = client[db_name].cap_places
    place = f"webhook_endpoints:{user['account_id']}"
    try:
        assert (await places.delete_one({"_id": place})).deleted_count == 1
        assert [(await create(i))[0] for i in range(4, 11)] == [200] * 6 + [409]
        # A place taken by a create that died before its insert, two minutes ago: freed for the next create.
        assert (await gw.call("DELETE", f"/webhooks/{made[0]}", **auth)).code == 200
        ghost = {"id": "we_ghost", "at": datetime.now(UTC) - GRACE - timedelta(seconds=60)}
        await places.update_one({"_id": place}, {"$push": {"held": ghost}})
        assert (await create(20))[0] == 200
        assert await create(21) == (409, case.refusal)
        # A place taken a moment ago, its insert perhaps still under way: kept, the cap holds.
        assert (await gw.call("DELETE", f"/webhooks/{made[1]}", **auth)).code == 200
        await places.update_one({"_id": place}, {"$push": {"held": {"id": "we_young", "at": datetime.now(UTC)}}})
        assert await create(22) == (409, case.refusal)
    finally:
        await client.close()
    assert await case.count(gw, auth, "") == case.cap - 1
