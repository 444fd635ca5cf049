"""Attacks on several providers behind the one API (docs/providers.md), each against a served gateway with providers
of its own (as tests/data/test_providers.py): a provider whose answers cannot be read, whose keys are refused
(slowly), whose ids are not ids or whose fields have the wrong type; a provider that cannot map the call; PROVIDERS
that would bend the request line; cursors no serving provider issued, or at the length limit; the in-flight
horizon during a failover; Idempotency-Key replays."""

import orjson
import pytest
import tornado.httpserver
import tornado.testing
import tornado.web
from support import UPSTREAM_KEY, make_settings, qs
from test_providers import QUICK, dead, entry, search, use_providers

import sandbox
from config.settings import SettingsError
from social.providers import router as routing
from social.providers.ledger import MemoryLedger

pytestmark = pytest.mark.gen_test(timeout=60)


class Scripted:
    """A provider answering every GET with `body` (set by the test)."""

    def __init__(self, body: bytes):
        self.body = body
        scripted = self

        class Any(tornado.web.RequestHandler):
            def get(self):
                self.finish(scripted.body)

        sock, port = tornado.testing.bind_unused_port()
        self.server = tornado.httpserver.HTTPServer(tornado.web.Application([(r".*", Any)]))
        self.server.add_sockets([sock])
        self.url = f"http://127.0.0.1:{port}"

    def stop(self):
        self.server.stop()


class Flagged(MemoryLedger):
    """The in-memory ledger, with each attempt's failover flag (what the margin view's `failovers` counts)."""

    def __init__(self):
        super().__init__()
        self.failovers: list[bool] = []

    def record(self, attempt, failover: bool = False) -> None:
        super().record(attempt, failover)
        self.failovers.append(failover)


async def profile(api, key: str, name: str):
    return await api.call("GET", f"/social/user/info?userName={name}", key=key)


@pytest.mark.settings(**QUICK, upstream_max_body_bytes=100_000)
@pytest.mark.parametrize(
    "kind,fault,status_at_a",
    [
        ("socialdata", "malformed", 502),  # 200 with half a body: its adapter's 502
        ("twitterapi", "malformed", 502),
        ("socialdata", "oversize=200000", 0),  # past UPSTREAM_MAX_BODY_BYTES: no answer
        ("twitterapi", "oversize=200000", 0),
    ],
)
async def test_an_answer_that_cannot_be_read_fails_over_to_the_next_provider(
    api, ctx, catalog, kind, fault, status_at_a
):
    a = sandbox.start("127.0.0.1", 0, UPSTREAM_KEY, dialect=kind, faults=fault)
    b = sandbox.start("127.0.0.1", 0, UPSTREAM_KEY)
    ledger = use_providers(ctx, entry("a", a.url, kind=kind), entry("b", b.url))
    try:
        user, key = await api.funded_key(10_000)
        status, body, headers = await profile(api, key["key"], catalog["users"][0]["userName"])
    finally:
        a.stop()
        b.stop()
    assert status == 200 and headers["X-Provider"] == "b" and body["data"]["userName"]
    assert [(t.provider, t.status) for t in ledger.recent] == [("a", status_at_a), ("b", 200)]


@pytest.mark.settings(**QUICK)
@pytest.mark.parametrize("keys", [1, 3])
async def test_each_refused_key_is_one_ledger_entry_for_one_request(api, ctx, catalog, keys):
    """A provider whose keys are all refused (429), each once: one entry and one `call` price per request on the
    wire, not one more for the pool then having no key left; B asked once."""
    a = sandbox.start("127.0.0.1", 0, UPSTREAM_KEY, faults="error=429:1")
    b = sandbox.start("127.0.0.1", 0, UPSTREAM_KEY)
    pool = {"keys": [f"k{i}" for i in range(keys)]}
    use_providers(ctx, entry("a", a.url, call=0.01, failed=True) | pool, entry("b", b.url))
    ctx.upstream.ledger = ledger = Flagged()
    try:
        _, key = await api.funded_key(10_000)
        status, _, headers = await profile(api, key["key"], catalog["users"][0]["userName"])
    finally:
        a.stop()
        b.stop()
    assert status == 200 and headers["X-Provider"] == "b"
    at_a = [t for t in ledger.recent if t.provider == "a"]
    assert len(at_a) == a.stats["requests"] == keys and sum(t.cost_usd for t in at_a) == pytest.approx(0.01 * keys)
    # The last refusal is the one after which B was asked: the failover the margin view counts, once.
    assert ledger.failovers[:keys] == [False] * (keys - 1) + [True]
    assert b.stats["requests"] == 1


@pytest.mark.settings(**QUICK)
async def test_a_key_pools_slow_refusals_leave_the_next_provider_its_time(api, ctx, catalog):
    """Each of A's three keys refused after 0.8 s: A's share of the 2 s is 1 s in all, not 1 s per key."""
    a = sandbox.start("127.0.0.1", 0, UPSTREAM_KEY, faults="latency=800,error=429:1")
    b = sandbox.start("127.0.0.1", 0, UPSTREAM_KEY)
    use_providers(ctx, entry("a", a.url) | {"keys": ["k1", "k2", "k3"]}, entry("b", b.url))
    try:
        _, key = await api.funded_key(10_000)
        status, _, headers = await profile(api, key["key"], catalog["users"][0]["userName"])
    finally:
        a.stop()
        b.stop()
    assert status == 200 and headers["X-Provider"] == "b"
    assert b.stats["requests"] == 1


@pytest.mark.settings(**QUICK)
@pytest.mark.parametrize(
    "served,body",
    [
        ("user/info", b'{"id": 123456789012345678901234567890, "screen_name": "x"}'),  # read as a rounded float
        ("user/info", b'{"id": 1.5e300, "screen_name": "x"}'),
        ("user/info", b'{"id": true, "screen_name": "x"}'),
        ("user/info", b'{"id_str": {"a": 1}, "screen_name": "x"}'),
        ("search", b'{"tweets": [{"full_text": "no id", "user": {"id_str": "1"}}]}'),
        ("search", b'{"tweets": [{"id_str": "1", "user": {"screen_name": "no id"}}]}'),
    ],
)
async def test_socialdata_objects_without_a_real_id_are_a_502_never_charged(api, ctx, served, body):
    s = Scripted(body)
    use_providers(ctx, entry("a", s.url, kind="socialdata"), entry("b", dead()))
    try:
        user, key = await api.funded_key(10_000)
        if served == "search":
            status, _, headers = await search(api, key["key"])
        else:
            status, _, headers = await profile(api, key["key"], "abc")
    finally:
        s.stop()
    assert status == 502 and headers.get("X-Credits-Charged", "0") == "0"
    assert (await api.call("GET", "/account", token=user["token"]))[1]["credits"] == 10_000


@pytest.mark.settings(**QUICK)
async def test_a_socialdata_post_whose_author_has_no_handle_has_no_made_up_url(api, ctx):
    s = Scripted(b'{"tweets": [{"id_str": "7", "full_text": "hi", "user": {"id_str": "1"}}]}')
    use_providers(ctx, entry("a", s.url, kind="socialdata"), entry("b", dead()))
    try:
        _, key = await api.funded_key(10_000)
        status, body, _ = await search(api, key["key"])
    finally:
        s.stop()
    assert status == 200 and body["tweets"][0]["id"] == "7"
    assert body["tweets"][0]["url"] is None and body["tweets"][0]["author"]["userName"] is None


@pytest.mark.parametrize(
    "field,value",
    [
        ("url", "http://x/\r\nX-Evil: 1"),
        ("url", "http://x?y=1"),
        ("url", "http://x#f"),
        ("url", "http://"),
        ("url", "http://sekrit:pw@x"),
        ("prefix", "/twitter\r\nX-Evil: 1"),
        ("prefix", "/twitter?y=1"),
        ("keys", [None]),
        ("costs", {"by": {"user_info": {"item": 1}}}),  # a misspelt path would price nothing
    ],
)
def test_providers_that_would_bend_requests_or_misprice_are_refused_at_start(field, value):
    found = {"name": "a", "kind": "twitterapi", "url": "http://x", "keys": ["sekrit"]} | {field: value}
    with pytest.raises(SettingsError) as refused:
        routing.build(make_settings(providers=orjson.dumps([found]).decode()), MemoryLedger())
    assert "sekrit" not in str(refused.value) and "provider a" in str(refused.value)


@pytest.mark.settings(**QUICK)
@pytest.mark.parametrize(
    "kind,body",
    [
        ("twitterapi", {"tweets": [{"id": "1", "text": "x"}], "has_next_page": True, "next_cursor": "C" * 999}),
        ("socialdata", {"tweets": [{"id_str": "1", "user": {"id_str": "2"}}], "next_cursor": "\u00ff" * 400}),
    ],
)
async def test_a_cursor_the_gateway_handed_out_is_accepted_back(api, ctx, kind, body):
    s = Scripted(orjson.dumps(body))
    use_providers(ctx, entry("a", s.url, kind=kind), entry("b", dead()))
    try:
        _, key = await api.funded_key(10_000)
        status, first, _ = await search(api, key["key"])
        assert status == 200 and first["next_cursor"].startswith("a~")
        status, _, _ = await search(api, key["key"], cursor=first["next_cursor"])
    finally:
        s.stop()
    assert status == 200


@pytest.mark.settings(**QUICK)
async def test_an_idempotent_replay_names_the_provider_that_produced_it(api, ctx, catalog):
    b = sandbox.start("127.0.0.1", 0, UPSTREAM_KEY)
    use_providers(ctx, entry("a", dead()), entry("b", b.url))
    path = f"/social/user/info?userName={catalog['users'][1]['userName']}"
    try:
        user, key = await api.funded_key(10_000)
        answers = [await api.call("GET", path, key=key["key"], headers={"Idempotency-Key": "k1"}) for _ in range(2)]
    finally:
        b.stop()
    assert answers[1][2].get("Idempotent-Replayed") == "true"
    assert [h.get("X-Provider") for _, _, h in answers] == ["b", "b"]
    records = (await api.call("GET", "/usage/log", token=user["token"]))[1]["records"]
    assert [r["provider"] for r in records] == ["b", "b"]  # the replay's record too


@pytest.mark.settings(**QUICK)
@pytest.mark.parametrize("cursor", ["DAACCgACGdy", "a~DAACCgACGdy"])
async def test_a_cursor_no_provider_serving_the_endpoint_issued_goes_to_one_that_serves_it(api, ctx, catalog, cursor):
    """SocialData first, and a followers crawl (only twitterapi serves it): a cursor naming no provider (handed
    out before PROVIDERS) or naming SocialData (forged, or its kind changed) goes to the provider that serves the
    endpoint, as sent, which answers it; never a 503 that no retry ends."""
    a = sandbox.start("127.0.0.1", 0, UPSTREAM_KEY, dialect="socialdata")
    b = sandbox.start("127.0.0.1", 0, UPSTREAM_KEY)
    use_providers(ctx, entry("a", a.url, kind="socialdata"), entry("b", b.url))
    try:
        _, key = await api.funded_key(10_000)
        query = qs({"userName": catalog["big_accounts"][0], "cursor": cursor})
        status, _, headers = await api.call("GET", f"/social/user/followers?{query}", key=key["key"])
    finally:
        a.stop()
        b.stop()
    assert status not in (502, 503, 504) and headers["X-Provider"] == "b"
    assert a.stats["requests"] == 0 and b.stats["requests"] == 1


@pytest.mark.settings(**QUICK)
async def test_a_provider_that_cannot_map_the_call_takes_no_share_of_the_deadline(api, ctx, catalog):
    """Several posts at once: SocialData looks up one a call, so A is the only provider for it and has the
    whole 2 s, not half of it kept for a provider that will not be asked."""
    a = sandbox.start("127.0.0.1", 0, UPSTREAM_KEY, faults="latency=1300")
    b = sandbox.start("127.0.0.1", 0, UPSTREAM_KEY, dialect="socialdata")
    use_providers(ctx, entry("a", a.url), entry("b", b.url, kind="socialdata"))
    ids = ",".join(catalog["tweets"][:2])
    try:
        _, key = await api.funded_key(10_000)
        status, body, headers = await api.call("GET", f"/social/tweets?{qs({'tweet_ids': ids})}", key=key["key"])
    finally:
        a.stop()
        b.stop()
    assert status == 200 and headers["X-Provider"] == "a" and len(body["tweets"]) == 2
    assert b.stats["requests"] == 0


@pytest.mark.settings(**QUICK)
async def test_socialdata_fields_of_the_wrong_type_are_null_never_another_shape(api, ctx):
    """Customers' code sees one shape: a count that is not a number, a flag that is not a boolean, a text that is
    not a string, from a provider gone wrong, is null (as a field SocialData cannot fill), never passed on."""
    post = {"id_str": "7", "full_text": ["x"], "favorite_count": "many", "views_count": {"n": 1}, "lang": 5}
    author = {"id_str": "1", "screen_name": "u", "name": 5, "followers_count": "lots", "friends_count": 1.5}
    author |= {"verified": "yes", "can_dm": 1, "statuses_count": True, "description": {"a": 1}, "location": 3}
    s = Scripted(orjson.dumps({"tweets": [post | {"user": author}]}))
    use_providers(ctx, entry("a", s.url, kind="socialdata"), entry("b", dead()))
    try:
        _, key = await api.funded_key(10_000)
        status, body, _ = await search(api, key["key"])
    finally:
        s.stop()
    assert status == 200
    tweet = body["tweets"][0]
    assert (tweet["id"], tweet["text"], tweet["likeCount"], tweet["viewCount"], tweet["lang"]) == (
        "7",
        None,
        None,
        None,
        None,
    )
    user = tweet["author"]
    assert user["userName"] == "u"
    fields = ("name", "followers", "following", "isBlueVerified", "canDm", "statusesCount", "description", "location")
    assert {f: user[f] for f in fields} == dict.fromkeys(fields)


@pytest.mark.settings(**QUICK)
async def test_the_in_flight_horizon_is_measured_on_whole_calls_not_on_the_first_provider(api, ctx, catalog):
    """An account's calls under way are bounded by its rate x twice the recent p99 of a call (handlers/
    data_call.py): with A refusing at once and B taking 0.3 s, a call takes 0.3 s, not A's millisecond, or the
    bound shrinks to its floor and customers at their plan's rate are refused 429 during the failover."""
    b = sandbox.start("127.0.0.1", 0, UPSTREAM_KEY, faults="latency=300")
    use_providers(ctx, entry("a", dead()), entry("b", b.url))
    try:
        _, key = await api.funded_key(10_000)
        for user in catalog["users"][:3]:
            status, _, headers = await profile(api, key["key"], user["userName"])
            assert status == 200 and headers["X-Provider"] == "b"
    finally:
        b.stop()
    assert len(ctx.upstream.latency.samples) == 3 and min(ctx.upstream.latency.samples) >= 0.3
