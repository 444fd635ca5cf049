"""Restarts that fail no call (docs/operations.md, Reloading): SIGUSR2 to `serve --workers 2` replaces its
workers while calls to a slow provider keep coming on keep-alive connections and a WebSocket client listens.
No call fails, the socket is told to reconnect (1012) and resumes without missing or doubling an event, a
second replacement soon after included (issue 46: its resume sent again what the first generation had), the
new workers are fresh programs (new pids, started from the code on disk) that read the settings anew, and
/metrics counts every call across the replacement. SIGHUP re-prices the next call on every worker, and the next
stream poll."""

import asyncio
import os
import signal
import time
import uuid

import orjson
import pytest
import tornado.httpserver
import tornado.web
import tornado.websocket
from prometheus_client.parser import text_string_to_metric_families
from support import Gateway, account_with_keys, ledger_of
from tornado.httpclient import HTTPRequest
from tornado.testing import bind_unused_port

from social.http1 import Http1Pool

pytestmark = pytest.mark.gen_test(timeout=180)
LATENCY = 0.3  # seconds the provider takes for a data call
ROUTE = "/social/user/info"


class SlowProvider:
    """A provider whose user/info takes LATENCY and whose search answers the tweets posted so far."""

    def __init__(self):
        self.tweets: list[dict] = []
        provider = self

        class Info(tornado.web.RequestHandler):
            async def get(self):
                await asyncio.sleep(LATENCY)
                self.finish({"status": "success", "msg": "success", "data": {"userName": "someone", "id": "1"}})

        class Search(tornado.web.RequestHandler):
            def get(self):
                since = [w for w in self.get_query_argument("query").split() if w.startswith("since_id:")]
                after = int(since[0].split(":")[1]) if since else 0
                found = sorted((t for t in provider.tweets if int(t["id"]) > after), key=lambda t: -int(t["id"]))
                self.finish(orjson.dumps({"tweets": found[:20], "has_next_page": False, "next_cursor": ""}))

        sock, port = bind_unused_port()
        app = tornado.web.Application([(r".*/user/info", Info), (r".*/tweet/advanced_search", Search)])
        self.server = tornado.httpserver.HTTPServer(app)
        self.server.add_sockets([sock])
        self.url = f"http://127.0.0.1:{port}"
        self._next = 1_900_000_000_000_000_000

    def post(self) -> str:
        self._next += 1
        self.tweets.append({"id": str(self._next), "text": "hello", "author": {"userName": "alice"}})
        return str(self._next)


class Listener:
    """One key's WebSocket: reconnects when closed, resuming after the last event it had."""

    def __init__(self, url: str, key: str):
        self.url, self.key = url.replace("http", "ws", 1) + "/social/tweet/websocket", key
        self.events: list[str] = []  # event ids, as received
        self.tweets: list[str] = []
        self.closes: list[int | None] = []  # the close code of each connection that ended
        self.stopping = False
        self.log = []

    async def run(self) -> None:
        while not self.stopping:
            query = f"?since_event_id={self.events[-1]}" if self.events else ""
            request = HTTPRequest(self.url + query, headers={"X-API-Key": self.key})
            ws = await tornado.websocket.websocket_connect(request)
            self.ws = ws
            while (text := await ws.read_message()) is not None:
                event = orjson.loads(text)
                if event["event_type"] == "tweet":
                    self.events.append(event["event_id"])
                    self.log.append((event["event_id"], event["timestamp"], len(self.closes)))
                    self.tweets += [t["id"] for t in event["tweets"]]
            self.closes.append(ws.close_code)


def workers_of(pid: int) -> set[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        return {int(child) for child in fh.read().split()}


def served(body: bytes) -> dict[str, float]:
    """The data calls answered 200, by worker, in one scrape of /metrics."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if (
                s.name == "gateway_requests_total"
                and s.labels.get("route") == ROUTE
                and s.labels.get("status") == "200"
            ):
                found[s.labels.get("worker", "")] = found.get(s.labels.get("worker", ""), 0) + s.value
    return found


def requests_total(body: bytes) -> float:
    return sum(served(body).values())


async def replaced(gw: Gateway, workers: int) -> set[int]:
    """SIGUSR2 to the supervisor: the new workers' pids, once they serve and the old ones have exited."""
    old = workers_of(gw.proc.pid)
    os.kill(gw.proc.pid, signal.SIGUSR2)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        new = workers_of(gw.proc.pid)
        if len(new) == workers and not new & old:
            return new
        await asyncio.sleep(0.1)
    raise AssertionError(f"not replaced: {old} -> {workers_of(gw.proc.pid)}")


async def delivered(listener: Listener, posted: list[str]) -> None:
    """Until the socket has had every tweet posted (a bound on a hang, not a deadline)."""
    deadline = time.monotonic() + 20
    while len(set(listener.tweets)) < len(posted) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("workers", [2, 1], ids=["workers-2", "workers-1"])
async def test_sigusr2_replaces_the_workers_without_failing_a_call_or_missing_an_event(mongo, tmp_path, workers):
    """`--workers 1` is the one-process way: one worker under the supervisor that replaces it."""
    provider = SlowProvider()
    config_file = tmp_path / "gateway.toml"
    config_file.write_text("twitter_alias = false\n")
    env = {"CONFIG_FILE": str(config_file), "STREAM_MIN_INTERVAL": "0.3", "STREAM_TICK_SECONDS": "0.05"}
    db_name = f"reload_{uuid.uuid4().hex[:10]}"
    gw = await Gateway(mongo.uri, provider.url, db_name, workers=workers, supervised=True, **env).launch()
    _, keys, _ = await account_with_keys(gw, 100_000_000, 2)
    assert (await gw.call("GET", "/twitter/user/info?userName=someone", **{"X-API-Key": keys[0]})).code == 404

    rule = {"tag": "t", "value": "hello", "interval_seconds": 0.3}
    added = orjson.loads((await gw.call("POST", "/oapi/tweet_filter/add_rule", rule, **{"X-API-Key": keys[1]})).body)
    switched_on = {**rule, "rule_id": added["rule_id"], "is_effect": 1}
    assert (await gw.call("POST", "/oapi/tweet_filter/update_rule", switched_on, **{"X-API-Key": keys[1]})).code == 200
    listener = Listener(gw.url, keys[1])
    listening = asyncio.create_task(listener.run())

    pool = Http1Pool(gw.url, 5.0, 1 << 20)  # keep-alive connections, as a customer's client keeps them
    answers: list[int | str] = []
    calling = True

    async def caller() -> None:
        while calling:
            try:
                answer = await pool.get(f"{gw.url}{ROUTE}?userName=someone", f"X-API-Key: {keys[0]}\r\n".encode(), 30)
                answers.append(answer.status)
            except Exception as exc:  # a call refused or cut: what this test is about
                answers.append(type(exc).__name__)

    async def posting() -> None:
        while calling:
            posted.append(provider.post())
            await asyncio.sleep(0.1)

    posted: list[str] = []
    callers = [asyncio.create_task(caller()) for _ in range(20)]
    poster = asyncio.create_task(posting())
    try:
        while len(answers) < 60 or not listener.events:  # calls on every connection, events on the socket
            await asyncio.sleep(0.1)
        config_file.write_text("twitter_alias = true\n")  # a setting SIGHUP does not re-read
        new = await replaced(gw, workers)
        served_before = len(answers)
        while len(answers) < served_before + 60:  # calls served by the new workers too
            await asyncio.sleep(0.1)
    finally:
        calling = False
        await asyncio.gather(*callers, poster)
    await delivered(listener, posted)
    # A second replacement soon after, with no event meanwhile: the socket resumes from what it had from two
    # generations (the events of the first, within the hand-over's window of its last one, came from the first).
    new = await replaced(gw, workers)
    posted.append(provider.post())  # had once the resume's replay is
    await delivered(listener, posted)
    listener.stopping = True
    listener.ws.close()
    await listening
    pool.close()

    failed = [a for a in answers if a != 200]
    assert not failed and len(answers) >= 120, (len(answers), failed[:10])
    for pid in new:  # fresh programs, not copies of the parent: the code on disk at the reload
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            assert b"__worker__" in fh.read()
    response = await gw.call("GET", "/twitter/user/info?userName=someone", **{"X-API-Key": keys[0]})
    assert response.code == 200, "the setting changed in CONFIG_FILE is read by the new workers"
    answers.append(200)

    # The socket was told to reconnect, and resumed: every event once, every tweet of the rule once.
    assert 1012 in listener.closes and set(listener.closes[:-1]) == {1012}, listener.closes  # never refused
    assert len(listener.events) == len(set(listener.events)), "\n".join(map(str, listener.log))
    assert sorted(listener.tweets) == sorted(posted), "a tweet was missed or received twice"

    # /metrics counts every call, those the old workers answered while they drained included.
    metrics = await gw.call("GET", "/metrics")
    assert requests_total(metrics.body) == len(answers)
    assert gw.stop() == 0
    provider.server.stop()


async def test_sighup_prices_the_next_call_on_every_worker_and_the_next_poll(mongo, tmp_path):
    """SIGHUP to `serve --workers 2` after a price change in CONFIG_FILE: once every worker says it reloaded,
    every call is charged the new price, whichever worker answers it, and so is every stream poll (issue 46:
    the charged call and the poller kept the prices they were built with)."""
    provider = SlowProvider()
    config_file = tmp_path / "gateway.toml"
    config_file.write_text("price_rules = { minimum = 15 }\n")  # a profile: 18, a poll that finds nothing: 15
    env = {"CONFIG_FILE": str(config_file), "LOG_LEVEL": "INFO", "STREAM_MIN_INTERVAL": "0.3"}
    db_name = f"reload_{uuid.uuid4().hex[:10]}"
    gw = Gateway(mongo.uri, provider.url, db_name, workers=2, **env)
    gw.stderr = (tmp_path / "gateway.log").open("wb")
    await gw.launch()
    user, keys, _ = await account_with_keys(gw, 1_000_000, 1)
    call = {"X-API-Key": keys[0], "Connection": "close"}  # one connection a call: the kernel picks the worker
    assert (await gw.call("GET", f"{ROUTE}?userName=someone", **call)).headers["X-Credits-Charged"] == "18"

    config_file.write_text("price_rules = { minimum = 40 }\n")
    os.kill(gw.proc.pid, signal.SIGHUP)
    deadline = time.monotonic() + 20
    while (tmp_path / "gateway.log").read_text().count("reloaded price rules and plan tiers") < 2:
        assert time.monotonic() < deadline, "the workers did not say they reloaded"
        await asyncio.sleep(0.1)
    before = served((await gw.call("GET", "/metrics")).body)
    charges = []
    while True:  # until both workers answered calls since the reload
        answers = await asyncio.gather(*[gw.call("GET", f"{ROUTE}?userName=someone", **call) for _ in range(10)])
        charges += [a.headers.get("X-Credits-Charged") for a in answers]
        after = served((await gw.call("GET", "/metrics")).body)
        if all(after.get(w, 0) > before.get(w, 0) for w in ("0", "1")) or len(charges) >= 200:
            break
    assert set(charges) == {"40"}, charges
    assert all(after.get(w, 0) > before.get(w, 0) for w in ("0", "1")), (before, after)

    rule = {"tag": "t", "value": "hello", "interval_seconds": 0.3}
    added = orjson.loads((await gw.call("POST", "/oapi/tweet_filter/add_rule", rule, **{"X-API-Key": keys[0]})).body)
    switched_on = {**rule, "rule_id": added["rule_id"], "is_effect": 1}
    assert (await gw.call("POST", "/oapi/tweet_filter/update_rule", switched_on, **{"X-API-Key": keys[0]})).code == 200

    async def polls() -> list[dict]:  # the usage records of the rule's polls (written every FLUSH_INTERVAL)
        return [r for r in (await ledger_of(mongo.uri, db_name, user["account_id"]))[1] if r.get("stream_id")]

    deadline = time.monotonic() + 20
    while len(found := await polls()) < 3:
        assert time.monotonic() < deadline, found
        await asyncio.sleep(0.2)
    assert {(r["status"], r["credits"]) for r in found} == {(200, 40)}, found
    assert gw.stop() == 0
    gw.stderr.close()
    provider.server.stop()
