"""The charge's inputs read without building the page (social/endpoints.read_answer) against the full
parse it replaced (orjson + count_items), over every sandbox endpoint, every page of it and bodies an
untrusted upstream might send."""

import time

import orjson
import pytest

from sandbox.app import catalog as sandbox_catalog
from sandbox.endpoints import ENDPOINTS as SANDBOX_ENDPOINTS
from sandbox.endpoints import Args, BadRequest, respond
from sandbox.groups import WOEIDS
from sandbox.world import World
from social.endpoints import BY_PATH, ENDPOINTS, count_items, read_answer

WORLD = World(7)  # the seed the sandbox serves by default
NOW = int(time.time())  # one moment for every page, so live posts hold still
CATALOG = sandbox_catalog(WORLD)
# Searches and batch lookups answer an empty list rather than "not found".
NEVER_NOT_FOUND = {"tweet/advanced_search", "user/search", "tweets", "user/batch_info_by_ids"}


def full_parse(endpoint, body: bytes):
    """What the gateway did before: parse everything, then look at status and the results."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(parsed, dict):
        return None
    # The next cursor as the crawl guard read it from the parsed page.
    following = parsed.get("next_cursor") if parsed.get("has_next_page") else ""
    following = str(following) if following not in (None, "") else ""
    return parsed.get("status") in ("error", "failed"), count_items(endpoint, parsed), following


def argument_sets(path: str) -> list[dict[str, str]]:
    """Valid, unknown and boundary arguments for one endpoint, from the sandbox's catalog."""
    users, tweets = CATALOG["users"], CATALOG["tweets"]
    names = [u["userName"] for u in users[:3]] + CATALOG["big_accounts"][:2] + ["nobody_at_all_1"]
    ids = [u["id"] for u in users[:3]] + ["999999999999"]
    tweet_ids = tweets[:2] + CATALOG["deep_replies"][:2] + CATALOG["quoted_tweets"][:2] + ["1"]
    by_param = {
        "query": [f"from:{names[0]}", "lang:en", "zzzz-no-match-zzzz"],
        "userName": names,
        "userId": ids,
        "user_id": ids,
        "tweetId": tweet_ids,
        "listId": CATALOG["lists"][:2] + CATALOG["empty_lists"][:1] + ["1"],
        "community_id": CATALOG["communities"][:2] + ["1"],
        "space_id": CATALOG["spaces"][:2] + ["nope"],
        "userIds": [",".join(ids), ids[-1]],
        "tweet_ids": [",".join(tweets[:20]), ",".join(tweets[:100]), "1"],
        "woeid": [str(w) for w in list(WOEIDS)[:3]] + ["2"],
        "list_id": CATALOG["lists"][:2] + CATALOG["empty_lists"][:1] + ["1"],
        "tweet_id": CATALOG["articles"][:2] + tweets[:1] + ["1"],
        "source_user_name": names,
        "target_user_name": names[:2],
    }
    sizes = {"pageSize": ["1", "20", "200"], "count": ["1", "30", "50"]}
    if path == "user/followers_ids":
        sizes = {"count": ["50", "5000"]}
    endpoint = BY_PATH["/" + path]
    sets: list[dict[str, str]] = [{}]
    for param in endpoint.params:
        values = by_param.get(param.name) or sizes.get(param.name)
        if not values:
            continue
        if param.required or param.name in sizes:
            sets = [{**s, param.name: v} for s in sets for v in values]
        else:
            sets += [{param.name: v} for v in values]
    return sets


def pages(path: str, args: dict[str, str], most: int = 40):
    """Every page of one call, following next_cursor (at most `most` pages)."""
    query = dict(args)
    for _ in range(most):
        try:
            body = orjson.dumps(respond(WORLD, path, Args({k: [v.encode()] for k, v in query.items()}, NOW)))
        except BadRequest:
            return
        yield body
        parsed = orjson.loads(body)
        if not parsed.get("has_next_page") or not parsed.get("next_cursor"):
            return
        query["cursor"] = str(parsed["next_cursor"])


@pytest.mark.parametrize("path", sorted(SANDBOX_ENDPOINTS))
def test_fast_read_equals_full_parse_on_every_page_of_every_sandbox_endpoint(path):
    endpoint = BY_PATH["/" + path]
    seen = set()
    for args in argument_sets(path):
        for body in pages(path, args):
            expected = full_parse(endpoint, body)
            assert read_answer(endpoint, body) == expected, (path, args, body[:200])
            seen.add(expected)
    # The walk met real answers: pages with items, and "not found" error answers.
    assert any(not error and items > 0 for error, items, _ in seen), path
    assert any(error for error, _, _ in seen) or path in NEVER_NOT_FOUND, path


def test_every_data_endpoint_of_the_table_is_served_by_the_sandbox_or_unavailable():
    assert {e.path for e in ENDPOINTS if e.available} == {"/" + p for p in SANDBOX_ENDPOINTS}


LIST = BY_PATH["/tweet/advanced_search"]
SINGLE = BY_PATH["/user/info"]


@pytest.mark.parametrize(
    "endpoint, body",
    [
        (LIST, b'{"tweets": [{"id": "1"}, 2, "x", null, [], {}], "status": "success"}'),
        (LIST, b'{"status": "error", "msg": "not found", "tweets": []}'),
        (LIST, b'{"status": null, "tweets": [1]}'),
        (LIST, b'{"status": 5, "tweets": [1, 2]}'),  # not a string: the full parse decides
        (LIST, b'{"tweets": {"a": 1}}'),  # an object where a list belongs
        (LIST, b'{"tweets": "abc"}'),
        (LIST, b'{"tweets": 0}'),
        (LIST, b'{"tweets": [1, 2], "tweets": [1]}'),  # duplicate keys: the last one counts
        (LIST, b'{"status": "error", "status": "success", "tweets": [1]}'),
        (LIST, b"{}"),
        (LIST, b' \n{"tweets" : [ 1 , 2 ] }\n '),
        (LIST, b'{"tweets": [1, 2], "x": "\\u00e9\\ud83d\\ude00", "y": "caf\xc3\xa9"}'),
        (LIST, b'{"tweets": [1, 2], "x": "\xff"}'),  # invalid UTF-8 in a skipped field
        (LIST, b'{"tweets": ["\xc3"]}'),  # invalid UTF-8 inside an item
        (LIST, b'{"tweets": [1, 2], "x": "\\ud800"}'),  # lone surrogate
        (LIST, b'{"tweets": [1, 2], "x": NaN}'),
        (LIST, b'{"tweets": [1, 2]} trailing'),
        (LIST, b'{"tweets": [1, 2,]}'),
        (LIST, b'{"a": ' + b"[" * 1100 + b"]" * 1100 + b', "tweets": [1]}'),  # deeper than either parser allows
        (LIST, b'{"a": ' + b"[" * 1000 + b"]" * 1000 + b', "tweets": [1]}'),
        (LIST, b'{"tweets": [1, 2], "x": 1e999}'),  # past a double: orjson refuses the body
        (LIST, b'{"tweets": [1, 2], "x": 100000000000000000000000000000}'),
        (LIST, b'{"tweets": [1, 2], "x": -9223372036854775809}'),
        (LIST, b'{"tweets": [18446744073709551615, 1.5e-400]}'),
        (LIST, b'\xef\xbb\xbf{"tweets": [1]}'),  # a byte-order mark
        (LIST, b'{"tweets": [1]}\x00'),
        (LIST, b"[1, 2]"),
        (LIST, b'"tweets"'),
        (LIST, b""),
        (LIST, b"\xef\xbb\xbf{}"),
        (SINGLE, b'{"status": "success", "msg": "", "data": {"id": "1"}}'),
        (SINGLE, b'{"status": "success", "data": { }}'),
        (SINGLE, b'{"status": "success", "data": null}'),
        (SINGLE, b'{"status": "success"}'),
        (SINGLE, b'{"data": [1, 2, 3]}'),
        (SINGLE, b'{"data": []}'),
        (SINGLE, b'{"data": ""}'),
        (SINGLE, b'{"data": "x"}'),
        (SINGLE, b'{"data": true}'),
        (SINGLE, b'{"data": false}'),
        (SINGLE, b'{"data": 0}'),
        (SINGLE, b'{"data": 0.0}'),
        (SINGLE, b'{"data": -0}'),
        (SINGLE, b'{"data": 7}'),
        (SINGLE, b'{"data": {"a": 1}, "status": "error"}'),
        (LIST, b'{"status": {"a": 1}, "tweets": [1]}'),  # an unhashable status: compared, never hashed
        (LIST, b'{"status": ["error"], "tweets": [1]}'),
        (BY_PATH["/article"], b'{"status": "failed", "message": "no article", "article": null}'),
        (BY_PATH["/article"], b'{"status": "success", "message": "", "article": {"title": "t"}}'),
        # The next cursor (the crawl guard's input), however an untrusted provider writes it.
        (LIST, b'{"tweets": [1], "has_next_page": true, "next_cursor": "c2"}'),
        (LIST, b'{"tweets": [1], "has_next_page": false, "next_cursor": "c2"}'),
        (LIST, b'{"tweets": [1], "has_next_page": 1, "next_cursor": 12}'),
        (LIST, b'{"tweets": [1], "has_next_page": "yes", "next_cursor": 1.5e3}'),
        (LIST, b'{"tweets": [1], "has_next_page": true, "next_cursor": null}'),
        (LIST, b'{"tweets": [1], "has_next_page": true, "next_cursor": ""}'),
        (LIST, b'{"tweets": [1], "has_next_page": true, "next_cursor": false}'),
        (LIST, b'{"tweets": [1], "has_next_page": true, "next_cursor": {"a": [1]}}'),
        (LIST, b'{"tweets": [1], "has_next_page": [0], "next_cursor": ["c"]}'),
        (LIST, b'{"tweets": [1], "has_next_page": {}, "next_cursor": "c"}'),
        (LIST, b'{"tweets": [1], "next_cursor": "c"}'),
        (LIST, b'{"tweets": [1], "has_next_page": true, "next_cursor": "\\u00e9"}'),
    ],
)
def test_fast_read_equals_full_parse_on_odd_bodies(endpoint, body):
    assert read_answer(endpoint, body) == full_parse(endpoint, body)
