"""Retries attacked on served gateways (issue 22), with a provider that takes its time, as customers' clients meet
it: a client that gives up and retries, fifty repeats at once through `--workers 2`, a repeat reaching another
process, a restart, a process killed while it runs a keyed call, a client hammering above its rate, and a retry
spelling its query differently.

The invariant in every test: a call repeated with one Idempotency-Key reaches the provider once and is charged
once, and every repeat gets the first answer whole."""

import asyncio
import pathlib
import time
import uuid

import orjson
import pytest
import tornado.httpserver
import tornado.web
from support import Gateway, account_with_keys
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.simple_httpclient import HTTPStreamClosedError, HTTPTimeoutError
from tornado.testing import bind_unused_port

pytestmark = pytest.mark.gen_test(timeout=90)

PROFILE = b'{"status":"success","msg":"","data":{"id":"1","userName":"someone"}}'
PRICE = 18  # one profile
PATH = "/social/user/info?userName=someone"


class SlowProvider(tornado.web.RequestHandler):
    """Answers a profile after `state["delay"]` seconds and counts the calls it gets."""

    def initialize(self, state: dict) -> None:
        self.state = state

    async def get(self, path):
        self.state["calls"] += 1
        await asyncio.sleep(self.state["delay"])
        self.finish(PROFILE)


def slow_provider(delay: float) -> tuple[dict, str]:
    state = {"calls": 0, "delay": delay}
    sock, port = bind_unused_port()
    server = tornado.httpserver.HTTPServer(tornado.web.Application([(r"(.*)", SlowProvider, {"state": state})]))
    server.add_sockets([sock])
    return state, f"http://127.0.0.1:{port}"


async def fetch(gw: Gateway, headers: dict, path: str = PATH, timeout: float = 30, client=None):
    client = client or AsyncHTTPClient(force_instance=True)
    request = HTTPRequest(gw.url + path, headers=headers, request_timeout=timeout)
    return await client.fetch(request, raise_error=False)


async def usage(gw: Gateway, auth: dict, count: int) -> list[dict]:
    """GET /usage once it shows `count` records (other processes' records arrive with their next flush)."""
    for _ in range(100):
        rows = orjson.loads((await gw.call("GET", "/usage", **auth)).body)
        if len(rows) >= count:
            return rows
        await asyncio.sleep(0.1)
    raise AssertionError(f"{len(rows)} usage records, {count} expected")


async def until(condition) -> None:
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("never happened")


def replayed(response, first) -> bool:
    return (
        response.code == 200
        and response.body == PROFILE
        and response.headers["Idempotent-Replayed"] == "true"
        and response.headers["X-Credits-Charged"] == "0"
        and response.headers["X-Request-ID"] == first.headers["X-Request-ID"]
    )


async def test_a_retry_after_the_client_gave_up_gets_the_first_answer_even_after_a_restart(mongo):
    """The client gives up on a call the gateway has forwarded (its own 0.3 s timeout, the provider takes 1 s) and
    retries with the same key: the retry waits for the first and gets its whole answer, charged 0; the call was
    charged once. Another query with the key: 422, no provider call. After a restart the kept answer is still
    replayed. Before: every call cut by the client was charged, and so was its retry."""
    provider, url = slow_provider(1.0)
    db_name = f"i_{uuid.uuid4().hex[:10]}"
    gw = await Gateway(mongo.uri, url, db_name).launch()
    _, (secret,), auth = await account_with_keys(gw, 10_000, 1)
    headers = {"X-API-Key": secret, "Idempotency-Key": "report-2026-11-25"}
    with pytest.raises(HTTPTimeoutError):  # the client's own time-out: it never sees an answer
        await fetch(gw, headers, timeout=0.3)
    retry = await fetch(gw, headers)
    assert retry.code == 200 and retry.body == PROFILE, retry.body
    assert retry.headers["Idempotent-Replayed"] == "true" and retry.headers["X-Credits-Charged"] == "0"
    other = await fetch(gw, headers, PATH.replace("someone", "someone-else"))
    assert other.code == 422 and orjson.loads(other.body)["detail"][0]["loc"] == ["header", "Idempotency-Key"]
    assert provider["calls"] == 1
    rows = await usage(gw, auth, 2)
    assert sorted((r["credits"], r["replay_of"]) for r in rows) == [(0, retry.headers["X-Request-ID"]), (PRICE, None)]
    await asyncio.to_thread(gw.stop)
    gw = await Gateway(mongo.uri, url, db_name).launch()
    assert replayed(await fetch(gw, headers), retry)
    assert provider["calls"] == 1
    assert orjson.loads((await gw.call("GET", "/account", **auth)).body)["credits"] == 10_000 - PRICE


async def test_fifty_repeats_at_once_through_two_workers_reach_the_provider_once(mongo):
    """Fifty clients send the same keyed call at once, each on its own connection, to `--workers 2` (the kernel
    spreads them over both processes): one provider call, one charge, fifty identical bodies; the repeats on the
    first's process wait on it, those on the other process read the database until it is kept."""
    provider, url = slow_provider(0.7)
    gw = await Gateway(mongo.uri, url, f"i_{uuid.uuid4().hex[:10]}", workers=2).launch()
    _, (secret,), auth = await account_with_keys(gw, 10_000, 1)
    client = AsyncHTTPClient(force_instance=True, max_clients=50)
    headers = {"X-API-Key": secret, "Idempotency-Key": "batch-7"}
    answers = await asyncio.gather(*(fetch(gw, headers, client=client) for _ in range(50)))
    assert [a.code for a in answers] == [200] * 50
    assert {a.body for a in answers} == {PROFILE}
    assert sorted(a.headers["X-Credits-Charged"] for a in answers) == ["0"] * 49 + [str(PRICE)]
    assert sum(a.headers.get("Idempotent-Replayed") == "true" for a in answers) == 49
    assert len({a.headers["X-Request-ID"] for a in answers}) == 1
    assert provider["calls"] == 1
    rows = await usage(gw, auth, 50)
    assert sum(r["credits"] for r in rows) == PRICE and sum(r["replay_of"] is not None for r in rows) == 49


async def test_a_repeat_on_another_process_waits_for_the_first(mongo):
    """Two gateway processes on one database. The first call runs on A (the provider takes 1 s); its repeat reaches
    B meanwhile: B finds A's claim, waits for A's answer and replays it; a later repeat on B is answered from the
    database. One provider call, one charge."""
    provider, url = slow_provider(1.0)
    db_name = f"i_{uuid.uuid4().hex[:10]}"
    a, b = Gateway(mongo.uri, url, db_name), Gateway(mongo.uri, url, db_name)
    await asyncio.gather(a.launch(), b.launch())
    _, (secret,), auth = await account_with_keys(a, 10_000, 1)
    headers = {"X-API-Key": secret, "Idempotency-Key": "one-and-only"}
    first = asyncio.ensure_future(fetch(a, headers))
    await until(lambda: provider["calls"] == 1)  # A's call is at the provider
    repeat = await fetch(b, headers)
    first = await first
    assert first.code == 200 and first.headers["X-Credits-Charged"] == str(PRICE)
    assert replayed(repeat, first) and replayed(await fetch(b, headers), first)
    assert provider["calls"] == 1
    rows = await usage(b, auth, 3)
    assert sum(r["credits"] for r in rows) == PRICE


async def test_a_claim_left_by_a_killed_process_ends_with_its_lease(mongo):
    """A process is killed (SIGKILL) while its keyed call waits for the provider: its claim must not hold the key
    forever (OpenMeter #5118: a dedup claim recorded before the charge, then a crash, and the event was never
    counted). A retry on another process gets 409 with Retry-After while the claim's lease runs
    (UPSTREAM_CONNECT_TIMEOUT + UPSTREAM_TIMEOUT + 3 s), then runs the call: charged once in all, since the
    killed call was never charged."""
    provider, url = slow_provider(1.5)
    db_name = f"i_{uuid.uuid4().hex[:10]}"
    timeouts = {"UPSTREAM_TIMEOUT": "2", "UPSTREAM_CONNECT_TIMEOUT": "0.5"}
    a = await Gateway(mongo.uri, url, db_name, **timeouts).launch()
    _, (secret,), auth = await account_with_keys(a, 10_000, 1)
    headers = {"X-API-Key": secret, "Idempotency-Key": "survives-a-crash"}
    lost = asyncio.ensure_future(fetch(a, headers))
    await until(lambda: provider["calls"] == 1)
    a.kill()
    with pytest.raises(HTTPStreamClosedError):
        await lost
    b = await Gateway(mongo.uri, url, db_name, **timeouts).launch()
    answers = []
    while not answers or answers[-1].code == 409:
        assert len(answers) < 10, [r.code for r in answers]
        answers.append(await fetch(b, headers))
        if answers[-1].code == 409:
            await asyncio.sleep(int(answers[-1].headers["Retry-After"]))
    done = answers[-1]
    assert done.code == 200 and done.body == PROFILE and done.headers["X-Credits-Charged"] == str(PRICE)
    assert "Idempotent-Replayed" not in done.headers
    assert replayed(await fetch(b, headers), done)
    assert provider["calls"] == 2  # the killed process's call, and the one run after its lease
    rows = await usage(b, auth, 2)  # the run after the lease, and its replay
    assert sorted((r["credits"], r["replay_of"]) for r in rows) == [(0, done.headers["X-Request-ID"]), (PRICE, None)]


def readme_client():
    """The documented example client (docs/api.md, Retries and idempotency): its code block up to the line that
    makes a client."""
    text = (pathlib.Path(__file__).parents[2] / "docs" / "api.md").read_text()
    block = text.split("### Retries and idempotency", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(block.split("\nclient = ", 1)[0], namespace)
    return namespace


async def test_the_readme_client_is_charged_once_for_a_call_it_retried(mongo):
    """The README's httpx example, as a customer runs it, with a time-out (0.5 s) shorter than the provider (1 s):
    its first try times out, its retry (same key) gets the whole answer; one provider call, one charge."""
    provider, url = slow_provider(1.0)
    gw = await Gateway(mongo.uri, url, f"i_{uuid.uuid4().hex[:10]}").launch()
    _, (secret,), auth = await account_with_keys(gw, 10_000, 1)
    example = readme_client()
    client = example["httpx"].Client(base_url=gw.url, headers={"X-API-Key": secret}, timeout=0.5)
    with client:
        answer = await asyncio.to_thread(example["get"], client, "/social/user/info", {"userName": "someone"})
    assert answer == orjson.loads(PROFILE) and provider["calls"] == 1
    rows = await usage(gw, auth, 2)
    assert sorted(r["credits"] for r in rows) == [0, PRICE] and any(r["replay_of"] for r in rows)


TEN_A_SECOND = '[{"name": "ten", "min_paid_usd": 0, "qps": 10, "account_qps": 10}]'


async def test_a_client_hammering_above_its_rate_gets_its_rate(mongo, upstream_url, catalog):
    """Rejected calls consume nothing (Tyk #1876, Unkey #1995: refused calls took tokens, so a client above its rate
    never recovered). An account limited to 10 calls/s per key and per account sends 5 x its rate of good calls
    for 10 s, and as many refused ones beside them: calls with a bad parameter (422) on the same key and calls of
    a second key whose budget cannot pay (402). The good calls get exactly the rate: 10 per second of the run,
    plus at most the first burst (10); every 429 says when to retry. Before, each refusal took a token from the
    key's or the account's bucket and the good calls got half."""
    gw = await Gateway(mongo.uri, upstream_url, f"i_{uuid.uuid4().hex[:10]}", PLAN_RULES=TEN_A_SECOND).launch()
    _, (good, broke), auth = await account_with_keys(gw, 10**7, 2)
    broke_id = orjson.loads((await gw.call("GET", "/keys", **auth)).body)[0]["key_id"]
    budget = {"credit_limit": 1, "credit_limit_period": "day"}
    assert (await gw.call("PATCH", f"/keys/{broke_id}", budget, **auth)).code == 200
    path = f"/social/user/info?userName={catalog['users'][0]['userName']}"
    kinds = [("good", path, good), ("good", path, good), ("bad", "/social/user/info", good), ("broke", path, broke)]
    client = AsyncHTTPClient(force_instance=True, max_clients=200)
    answers: list[tuple[str, object]] = []

    async def send(kind: str, target: str, secret: str) -> None:
        answers.append((kind, await fetch(gw, {"X-API-Key": secret}, target, client=client)))

    sent, started = [], time.monotonic()
    for i in range(1000):  # 100 calls a second for 10 s: 50 good ones (5 x the rate), 25 of 422, 25 of 402
        await asyncio.sleep(max(0.0, started + i / 100 - time.monotonic()))
        sent.append(asyncio.ensure_future(send(*kinds[i % 4])))
    elapsed = time.monotonic() - started
    await asyncio.gather(*sent)
    answered = time.monotonic() - started  # a busy machine answers the last calls after the loop ended
    codes = {kind: sorted({a.code for k, a in answers if k == kind}) for kind in ("good", "bad", "broke")}
    # The rate limits are checked first: a refused call is refused by them (429) or for itself, never charged.
    assert codes == {"good": [200, 429], "bad": [422, 429], "broke": [402, 429]}, codes
    assert all(int(a.headers["Retry-After"]) >= 1 for _, a in answers if a.code == 429)
    served = sum(a.code == 200 for _, a in answers)
    # Never more than the rate (plus the first burst) over the whole time calls were admitted...
    assert served <= 10 * answered + 10 + 1, (served, answered)
    # ...and not half of it, as when refusals took tokens. Not all of it to the call either: a machine busy
    # elsewhere stalls the sender and the gateway alike, and a bucket refills no further than its burst
    # meanwhile; three quarters of the rate tells the two apart with 2.5 s of stalls to spare.
    assert served >= 7.5 * elapsed, (served, elapsed)


async def test_a_repeat_with_its_query_spelled_differently_gets_the_first_answer(mongo, upstream_url):
    """A retry that sends the same parameters in another order, percent-encoded otherwise, or with a repeat, is
    the same request (docs/api.md): replayed, not 422 (issue 39, item 6: `?query=coffee&queryType=Latest`, then
    `?queryType=Latest&query=coffee`, was `idempotency_key_reused`). Another value or another forwarded
    parameter is another request: 422."""
    gw = await Gateway(mongo.uri, upstream_url, f"i_{uuid.uuid4().hex[:10]}").launch()
    _, (secret,), auth = await account_with_keys(gw, 1_000_000, 1)
    headers = {"X-API-Key": secret, "Idempotency-Key": "search-1"}
    first = await fetch(gw, headers, "/social/tweet/advanced_search?query=coffee&queryType=Latest")
    assert first.code == 200 and int(first.headers["X-Credits-Charged"]) > 0, first.body
    for spelling in (
        "/social/tweet/advanced_search?queryType=Latest&query=coffee",
        "/social/tweet/advanced_search?queryType=Latest&query=%63offee",
        "/twitter/tweet/advanced_search?query=tea&queryType=Latest&query=coffee",  # a repeat: the last one counts
    ):
        again = await fetch(gw, headers, spelling)
        assert again.code == 200 and again.headers.get("Idempotent-Replayed") == "true", (spelling, again.body)
        assert again.body == first.body and again.headers["X-Credits-Charged"] == "0"
        assert again.headers["X-Request-ID"] == first.headers["X-Request-ID"]
    for other in ("query=coffee&queryType=Top", "queryType=Latest&query=coffee&lang=en"):
        refused = await fetch(gw, headers, "/social/tweet/advanced_search?" + other)
        detail = orjson.loads(refused.body)["detail"]
        assert refused.code == 422 and detail[0]["type"] == "idempotency_key_reused", (other, refused.body)
        assert detail[0]["loc"] == ["header", "Idempotency-Key"]
    rows = await usage(gw, auth, 4)
    assert [r["credits"] > 0 for r in rows if r["status"] == 200].count(True) == 1  # the provider's answer, once
