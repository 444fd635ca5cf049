"""A refused call changes nothing (issue 39, item 4), on a served gateway: the provider's rule calls given a
monitor's id, and the portal's refused changes. Before, `update_rule` with a monitor's id answered 404 "Rule not
found" and stored the change anyway (its interval 60 -> 10 s: 1,440 -> 8,640 polls a day, six times the cost),
and `delete_rule` deleted the monitor."""

import uuid

import orjson
import pytest
from support import Gateway, account_with_keys

pytestmark = pytest.mark.gen_test(timeout=90)

NOT_FOUND = {"status": "error", "msg": "Rule not found"}


async def call(gw: Gateway, method: str, path: str, body=None, **headers) -> tuple[int, dict]:
    answer = await gw.call(method, path, body, **headers)
    return answer.code, orjson.loads(answer.body)


async def rows(gw: Gateway, auth: dict) -> list[dict]:
    """The portal's rows, but when each was last polled (the monitor polls meanwhile)."""
    status, found = await call(gw, "GET", "/streams", **auth)
    assert status == 200, found
    return [{k: v for k, v in row.items() if k != "polled_at"} for row in found]


async def test_the_rule_calls_given_a_monitors_id_are_refused_and_change_nothing(mongo, upstream_url):
    gw = await Gateway(mongo.uri, upstream_url, f"r_{uuid.uuid4().hex[:10]}").launch()
    _, (secret,), auth = await account_with_keys(gw, 1_000_000, 1)
    key = {"X-API-Key": secret}
    status, added = await call(
        gw, "POST", "/oapi/x_user_stream/add_user_to_monitor_tweet", {"x_user_name": "bob"}, **key
    )
    assert status == 200, added
    monitor_id = added["id_for_user"]
    before = await rows(gw, auth)
    assert [(r["rule_id"], r["interval_seconds"], r["status"]) for r in before] == [(monitor_id, 60, "active")]

    change = {"rule_id": monitor_id, "tag": "cheap", "value": "coffee", "interval_seconds": 10, "is_effect": 0}
    assert await call(gw, "POST", "/oapi/tweet_filter/update_rule", change, **key) == (404, NOT_FOUND)
    assert await call(gw, "POST", "/oapi/tweet_filter/update_rule", {**change, "is_effect": 1}, **key) == (
        404,
        NOT_FOUND,
    )
    assert await rows(gw, auth) == before  # not 10 s, six times the cost a day
    assert await call(gw, "POST", "/oapi/tweet_filter/delete_rule", {"rule_id": monitor_id}, **key) == (404, NOT_FOUND)
    # The portal's refusals: another handle for a monitor (409), an interval under STREAM_MIN_INTERVAL (422).
    status, _ = await call(gw, "PATCH", f"/streams/{monitor_id}", {"value": "alice", "interval_seconds": 10}, **auth)
    assert status == 409
    status, body = await call(gw, "PATCH", f"/streams/{monitor_id}", {"tag": "t", "interval_seconds": 1}, **auth)
    assert status == 422 and body["detail"][0]["loc"] == ["body", "interval_seconds"]
    assert await rows(gw, auth) == before  # its interval, cost, tag and state as they were

    # The monitor's own calls still work: removed by its handle, then gone.
    remove = "/oapi/x_user_stream/remove_user_to_monitor_tweet"
    assert (await call(gw, "POST", remove, {"x_user_name": "bob"}, **key))[0] == 200
    assert await rows(gw, auth) == []
