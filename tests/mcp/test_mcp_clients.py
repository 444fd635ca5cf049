"""The official MCP Python client (`mcp` on PyPI, Streamable HTTP), unchanged, against served gateways (one process
and --workers 2): given only the URL and a key, it negotiates a revision, lists the tools and calls every one; the
money is exact (each balance drop is the sum of the results' `_meta` credits, every data tool call has its usage
record via mcp)."""

import asyncio
import uuid

import orjson
import pytest
from mcp import Client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from support import Gateway, account_with_keys


def every_call(catalog) -> list[tuple[str, dict]]:
    """Each tool once with arguments the sandbox's world knows, the data tools' pages twice over (so the workers
    meet on them)."""
    user, tweet = catalog["users"][0], catalog["tweets"][0]
    return [
        ("search_tweets", {"query": user["userName"]}),
        ("get_user", {"user_name": user["userName"]}),
        ("get_user", {"user_ids": [u["id"] for u in catalog["users"][:3]]}),
        ("get_user_tweets", {"user_name": catalog["big_accounts"][0]}),
        ("get_followers", {"user_name": catalog["big_accounts"][0], "page_size": 20}),
        ("get_followers", {"user_name": catalog["big_accounts"][1], "ids_only": True}),
        ("get_tweets", {"tweet_ids": catalog["tweets"][:2]}),
        ("get_tweet_thread", {"tweet_id": tweet, "part": "replies"}),
        ("get_list_tweets", {"list_id": catalog["lists"][0]}),
        ("get_community", {"community_id": catalog["communities"][0]}),
        ("get_trends", {"woeid": 1, "count": 5}),
        ("get_space", {"space_id": catalog["spaces"][0]}),
        ("estimate_cost", {"tool": "get_user_tweets", "arguments": {"user_name": user["userName"]}}),
        ("get_account", {}),
    ]


async def connected(url: str, secret: str, mode: str, calls: list[tuple[str, dict]]):
    """What the client saw: the revision it speaks, the tool names, and each call's result."""
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {secret}"})
    async with http, Client(streamable_http_client(url + "/mcp", http_client=http), mode=mode) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        results = await asyncio.gather(*(client.call_tool(name, args) for name, args in calls))
        return names, results


@pytest.mark.gen_test(timeout=240)
@pytest.mark.parametrize("workers", [1, 2])
async def test_the_official_client_lists_and_calls_every_tool_and_the_money_is_exact(
    mongo, upstream_url, catalog, workers
):
    db = f"m_{uuid.uuid4().hex[:10]}"
    gw = await Gateway(mongo.uri, upstream_url, db, workers=workers).launch()
    _, (secret,), auth = await account_with_keys(gw, 5_000_000, 1)
    before = orjson.loads((await gw.call("GET", "/account", **auth)).body)["credits"]
    calls = every_call(catalog)
    charged, data_calls = 0, 0
    for mode in ("auto", "legacy"):  # the current revision (server/discover), then the handshake
        names, results = await connected(gw.url, secret, mode, calls + calls)
        assert names[:2] == ["search_tweets", "get_user"] and len(names) == 12
        for (name, _), result in zip(calls + calls, results, strict=True):
            assert not result.is_error, (name, result.content)
            assert result.structured_content is not None
            if name not in ("estimate_cost", "get_account"):
                charged += result.meta["credits_charged"]
                data_calls += 1
                assert result.meta["rest_call"]["path"].startswith("/social/")
    assert charged > 0
    records = []
    for _ in range(200):  # every worker's records, once flushed
        records = orjson.loads((await gw.call("GET", "/usage/log?limit=500", **auth)).body)["records"]
        if len(records) >= data_calls:
            break
        await asyncio.sleep(0.05)
    assert len(records) == data_calls and {r["via"] for r in records} == {"mcp"}
    assert sum(r["credits"] for r in records) == charged
    after = None
    for _ in range(200):  # another worker's spend shows in the balance once its usage is flushed
        after = orjson.loads((await gw.call("GET", "/account", **auth)).body)["credits"]
        if before - after == charged:
            break
        await asyncio.sleep(0.05)
    assert before - after == charged
