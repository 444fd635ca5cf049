"""/mcp attacked on its promises (docs/mcp.md): results that would not fit MCP_MAX_RESULT_BYTES, cut pages whose
continuation must neither repeat nor skip posts, cursor handles used where they were not given, and keys and
accounts that must be refused by every tool."""

import random
from datetime import UTC, datetime, timedelta

import orjson
import pytest
from support import recorder, use_upstream
from test_mcp_protocol import credits, funded, rpc, tool

from social.compact import SHAPES, iso_time


async def walk(api, secret, name: str, arguments: dict, calls: int = 12) -> tuple[list[dict], list[str]]:
    """Each result of following `next_cursor` through a page cut to fit (at most `calls` calls), and the ids of
    the posts handed out."""
    results, ids, cursor = [], [], None
    for _ in range(calls):
        found = await tool(api, secret, name, {**arguments, **({"cursor": cursor} if cursor else {})})
        assert not found.get("isError"), found
        results.append(found)
        content = found["structuredContent"]
        ids += [item["id"] for item in content["items"]]
        cursor = content["next_cursor"]
        if not content["truncated"]:
            break
    return results, ids


@pytest.mark.gen_test(timeout=60)
@pytest.mark.settings(mcp_max_result_bytes=4_000)
async def test_a_post_too_large_for_one_result_is_handed_out_cut_and_the_page_goes_on(api, provider):
    _, secret = await funded(api)
    newest_first = [provider.post("bob", "short"), provider.post("carol", "long " * 5_000), provider.post("dan", "hi")]
    results, ids = await walk(api, secret, "search_tweets", {"query": "anything"})
    assert ids == newest_first[::-1]  # every post once: the long one too, none left behind
    assert all(len(orjson.dumps(found)) <= 4_000 for found in results)
    long = next(item for r in results for item in r["structuredContent"]["items"] if item["id"] == newest_first[1])
    assert long["cut"] is True and long["text"].startswith("long long") and long["text"].endswith("…")


@pytest.mark.gen_test(timeout=60)
@pytest.mark.settings(mcp_max_result_bytes=4_000)
async def test_a_result_of_posts_full_of_quotation_marks_still_fits_with_its_escaped_text_copy(api, provider):
    _, secret = await funded(api)
    posted = [provider.post("eve", '"' * 350 + f" {n}") for n in range(6)]  # code, ASCII art: escaped twice
    results, ids = await walk(api, secret, "search_tweets", {"query": "anything"})
    assert ids == posted[::-1]
    for found in results:  # both copies: the text one escapes every quotation mark again
        assert len(orjson.dumps(found)) <= 4_000, [len(orjson.dumps(found)) for found in results]


@pytest.mark.gen_test(timeout=60)
@pytest.mark.settings(mcp_max_result_bytes=4_000)
async def test_a_cursor_handle_continues_only_the_call_and_the_account_it_was_given_for(api, provider, catalog):
    user, secret = await funded(api)
    for n in range(8):
        provider.post("frank", f"post {n} " + "words " * 60)
    first = await tool(api, secret, "search_tweets", {"query": "frank"})
    handle = first["structuredContent"]["next_cursor"]
    assert first["structuredContent"]["truncated"] and handle.startswith("mcp:")
    before = await credits(api, user)
    # Handed to another search, or another tool, the handle would skip the first posts of a page never read.
    for name, arguments in (
        ("search_tweets", {"query": "something else"}),
        ("search_tweets", {"query": "frank", "sort": "Top"}),
        ("get_user_tweets", {"user_name": catalog["users"][0]["userName"]}),
    ):
        misused = await tool(api, secret, name, {**arguments, "cursor": handle})
        assert misused.get("isError"), (name, arguments, misused.get("structuredContent"))
        assert "start again without a cursor" in misused["content"][0]["text"]
    _, stranger = await funded(api)
    taken = await tool(api, stranger, "search_tweets", {"query": "frank", "cursor": handle})
    assert taken.get("isError")
    assert await credits(api, user) == before  # nothing read, nothing charged
    # Its own call goes on where the first result stopped, `fields` asked or not.
    going_on = await tool(api, secret, "search_tweets", {"query": "frank", "cursor": handle, "fields": ["lang"]})
    ids = [t["id"] for t in first["structuredContent"]["items"] + going_on["structuredContent"]["items"]]
    assert len(ids) == len(set(ids)) and not going_on.get("isError")


@pytest.mark.gen_test(timeout=60)
@pytest.mark.settings(admin_emails="boss@example.com")
async def test_a_suspended_accounts_key_is_refused_by_every_tool(api, ctx, catalog):
    admin = (await api.register("boss@example.com"))["token"]
    assert await ctx.accounts.set_admin("boss@example.com", True)
    user, secret = await funded(api)
    account_id = (await api.call("GET", "/account", token=user["token"]))[1]["account_id"]
    suspended = await api.call("POST", f"/admin/accounts/{account_id}/suspend", {"reason": "abuse"}, token=admin)
    assert suspended[0] == 200
    assert (await api.call("GET", "/oapi/my/info", key=secret))[0] == 403  # the REST balance, as its data calls
    name = catalog["users"][0]["userName"]
    for tool_name, arguments in (
        ("get_user", {"user_name": name}),
        ("get_account", {}),
        ("estimate_cost", {"tool": "get_user", "arguments": {"user_name": name}}),
    ):
        refused = await tool(api, secret, tool_name, arguments)
        assert refused.get("isError") and "suspended" in refused["content"][0]["text"], (tool_name, refused)
        assert "structuredContent" not in refused


@pytest.mark.gen_test(timeout=60)
async def test_a_dns_rebinding_page_is_refused_though_its_origin_names_the_host_it_reached(api):
    _, secret = await funded(api)
    port = api.base.rstrip("/").rsplit(":", 1)[1]
    # A page on rebind.example whose name now resolves to the gateway: its Origin and the Host it sends agree.
    rebound = {"Origin": f"http://rebind.example:{port}", "Host": f"rebind.example:{port}"}
    status, body, _ = await rpc(api, secret, "tools/list", headers=rebound)
    assert status == 403 and "Origin" in body["error"]["message"]
    own = {"Origin": f"http://127.0.0.1:{port}", "Host": f"127.0.0.1:{port}"}
    assert (await rpc(api, secret, "tools/list", headers=own))[0] == 200
    localhost = {"Origin": f"http://localhost:{port}", "Host": f"localhost:{port}"}
    assert (await rpc(api, secret, "tools/list", headers=localhost))[0] == 200


@pytest.mark.gen_test(timeout=60)
@pytest.mark.settings(public_url="https://gateway.example")
async def test_behind_its_public_url_the_gateways_own_origin_is_that_url(api):
    _, secret = await funded(api)
    named = {"Origin": "https://gateway.example", "Host": "gateway.example"}
    assert (await rpc(api, secret, "tools/list", headers=named))[0] == 200
    other = {"Origin": "https://rebind.example", "Host": "rebind.example"}
    assert (await rpc(api, secret, "tools/list", headers=other))[0] == 403


@pytest.mark.gen_test(timeout=60)
@pytest.mark.settings(mcp_max_result_bytes=4_000, cache_ttl={"tweet/advanced_search": 0})
async def test_a_cut_page_read_again_after_new_posts_continues_after_the_last_post_handed_out(api, provider):
    _, secret = await funded(api)
    older = [provider.post("grace", f"post {n} " + "words " * 60) for n in range(8)]
    first = await tool(api, secret, "search_tweets", {"query": "grace"})
    handed = [t["id"] for t in first["structuredContent"]["items"]]
    assert first["structuredContent"]["truncated"] and handed == older[::-1][: len(handed)]
    # The answer is no longer fresh (here: never cached) and two posts came since: the page read again starts with
    # them, and a bare position would hand out again what the first result ended with.
    for _ in range(2):
        provider.post("grace", "new " + "words " * 60)
    cursor, seen = first["structuredContent"]["next_cursor"], list(handed)
    for _ in range(12):
        found = await tool(api, secret, "search_tweets", {"query": "grace", "cursor": cursor})
        seen += [t["id"] for t in found["structuredContent"]["items"]]
        cursor = found["structuredContent"]["next_cursor"]
        if not found["structuredContent"]["truncated"]:
            break
    assert len(seen) == len(set(seen)), "a post handed out twice"
    assert set(older) <= set(seen), "a post of the page skipped"


@pytest.mark.gen_test(timeout=60)
async def test_followings_asked_as_ids_are_refused_not_answered_with_followers(api, catalog):
    user, secret = await funded(api)
    before = await credits(api, user)
    who = catalog["big_accounts"][0]
    asked = {"user_name": who, "direction": "followings", "ids_only": True}
    found = await tool(api, secret, "get_followers", asked)
    assert found.get("isError"), found.get("_meta")  # the provider lists followers' ids only
    assert "ids_only" in found["content"][0]["text"] and await credits(api, user) == before
    estimate = await tool(api, secret, "estimate_cost", {"tool": "get_followers", "arguments": asked})
    assert estimate.get("isError")


@pytest.mark.gen_test(timeout=90)
@pytest.mark.settings(mcp_max_result_bytes=4_000)
async def test_a_cut_batch_of_profiles_posts_or_trends_is_continued_by_its_cursor(api, catalog):
    _, secret = await funded(api)
    user_ids = [u["id"] for u in catalog["users"][:40]]
    tweet_ids = catalog["tweets"][:40]
    for name, arguments, key in (
        ("get_user", {"user_ids": user_ids}, "id"),
        ("get_tweets", {"tweet_ids": tweet_ids}, "id"),
        ("get_trends", {"count": 100}, "name"),
    ):
        handed, cursor, pieces = [], None, 0
        while pieces < 30:
            pieces += 1
            found = await tool(api, secret, name, {**arguments, **({"cursor": cursor} if cursor else {})})
            assert not found.get("isError"), (name, found["content"])
            assert len(orjson.dumps(found)) <= 4_000
            handed += [item[key] for item in found["structuredContent"]["items"]]
            cursor = found["structuredContent"]["next_cursor"]
            if not found["structuredContent"]["truncated"]:
                break
        assert pieces > 1, name  # cut at 4,000 bytes: the continuation is what is tried here
        assert len(handed) == len(set(handed)), name
        if key == "id":
            assert set(handed) == set(user_ids if name == "get_user" else tweet_ids), name


@pytest.mark.gen_test(timeout=60)
async def test_error_sentences_say_what_to_do_for_a_keys_budget_and_an_open_bound(api, catalog):
    user, _ = await funded(api)
    made = await api.call(
        "POST", "/keys", {"name": "agent", "credit_limit": 20, "credit_limit_period": "total"}, token=user["token"]
    )
    secret = made[1]["key"]
    assert not (await tool(api, secret, "get_user", {"user_name": catalog["users"][0]["userName"]})).get("isError")
    over = await tool(api, secret, "search_tweets", {"query": "budget spent"})  # 2 credits left of 20
    text = over["content"][0]["text"]
    assert over["isError"] and "credit_limit" in text
    assert "top up" not in text  # the balance is not what stopped it: topping up would change nothing
    low = await tool(api, secret, "get_trends", {"woeid": 0})
    assert low["isError"] and "woeid: must be at least 1." in low["content"][0]["text"]


@pytest.mark.gen_test(timeout=60)
async def test_a_providers_long_refusal_is_cut_to_fit_the_result(api, ctx):
    server, url, _ = await recorder(404, orjson.dumps({"status": "error", "msg": "No such user. " * 6_000}))
    use_upstream(ctx, url)
    try:
        user, secret = await funded(api)
        refused = await tool(api, secret, "get_user", {"user_name": "someone"})
    finally:
        server.stop()
    assert refused["isError"] and refused["content"][0]["text"].startswith("The provider refused this call (404)")
    assert len(orjson.dumps(refused)) <= 40_000  # MCP_MAX_RESULT_BYTES: an error is a result too
    assert refused["_meta"]["credits_charged"] == 0 and await credits(api, user) == 1_000_000


@pytest.mark.gen_test(timeout=60)
async def test_a_notification_at_a_revision_not_served_is_refused_as_a_request_is(api):
    _, secret = await funded(api)
    note = orjson.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})
    for version in ("1999-01-01", "2099-01-01"):
        status, body, _ = await rpc(api, secret, "", raw=note, headers={"MCP-Protocol-Version": version})
        assert (status, body["error"]["code"]) == (400, -32022), version
        assert body["error"]["data"]["requested"] == version
    for version in ("2026-07-28", "2025-11-25", "2025-06-18"):  # served: acknowledged, as without the header
        assert (await rpc(api, secret, "", raw=note, headers={"MCP-Protocol-Version": version}))[0] == 202


@pytest.mark.gen_test(timeout=60)
async def test_a_provider_answer_of_not_found_says_so_and_what_to_do(api):
    user, secret = await funded(api)
    missing = await tool(api, secret, "get_user", {"user_name": "nosuchuser_zz"})
    text = missing["content"][0]["text"]
    assert missing["isError"] and "user not found" in text and "Check" in text, text
    assert missing["_meta"]["credits_charged"] == 0 and await credits(api, user) == 1_000_000


@pytest.mark.gen_test(timeout=60)
async def test_odd_provider_objects_are_shaped_not_answered_with_a_500(api, ctx):
    """Empty objects sent as `[]` (as PHP serializes them), and a field nested deeper than a JSON writer goes."""
    deep = b"[" * 400 + b"]" * 400
    body = (
        b'{"tweets":[{"id":"1","text":"empty as a list","author":{"userName":"a"},"entities":[],'
        b'"extendedEntities":[]},{"id":"2","text":"deep","author":{"userName":"b"},"entities":{"x":' + deep + b"}}],"
        b'"has_next_page":false}'
    )
    server, url, _ = await recorder(200, body)
    use_upstream(ctx, url)
    try:
        user, secret = await funded(api)
        charged = 0
        for fields in ([], ["entities"]):
            status, answer, _ = await rpc(
                api, secret, "tools/call", {"name": "search_tweets", "arguments": {"query": "odd", "fields": fields}}
            )
            assert status == 200, answer
            found = answer["result"]
            assert [t["id"] for t in found["structuredContent"]["items"]] == ["1", "2"]
            charged += found["_meta"]["credits_charged"]
    finally:
        server.stop()
    assert await credits(api, user) == 1_000_000 - charged  # what was charged was answered


@pytest.mark.gen_test(timeout=60)
async def test_a_provider_refusal_of_an_odd_shape_is_a_tool_result_not_a_500(api, ctx):
    server, url, _ = await recorder(400, b'{"detail":[1,"x",null,{"loc":5}]}')
    use_upstream(ctx, url)
    try:
        user, secret = await funded(api)
        status, answer, _ = await rpc(api, secret, "tools/call", {"name": "get_user", "arguments": {"user_name": "u"}})
    finally:
        server.stop()
    assert status == 200 and answer["result"]["isError"], answer
    assert await credits(api, user) == 1_000_000


@pytest.mark.parametrize(
    "odd",
    [
        [],
        "x",
        None,
        {"metadata": "x"},
        {"metadata": {"creator_results": {"core": "z"}}},
        {"result": "x"},
        {"community_results_by_rest_id": {"result": "s"}},
        {"entities": "x", "author": [], "quoted_tweet": []},
    ],
)
def test_every_shape_takes_any_provider_object(odd):
    for shape in SHAPES.values():  # a 500 after the call was charged is what this rules out
        shape(odd, ["entities", "metadata"])


def test_the_providers_time_read_by_hand_is_what_strptime_reads():
    rng, start = random.Random(51), datetime(2006, 3, 21, tzinfo=UTC)
    for _ in range(2_000):
        moment = start + timedelta(seconds=rng.randrange(10**9))
        assert iso_time(moment.strftime("%a %b %d %H:%M:%S +0000 %Y")) == moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    for unreadable in ("Sun Feb 30 05:28:28 +0000 2026", "Sun Nov 29 24:00:00 +0000 2026", "Sun Xyz 29 05:28:28 +0000"):
        assert iso_time(unreadable) is None
    assert iso_time("Sun Nov 29 05:28:28 +0100 2026") == "2026-11-29T04:28:28Z"  # another offset: strptime's way
