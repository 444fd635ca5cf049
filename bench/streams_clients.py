"""What `./dev bench --streams` checks as a customer would see it (bench/streams.py): WebSocket clients that
reconnect and resume as docs/streams.md tells them to, and a webhook receiver that verifies every delivery.

A `Client` is one key's socket. It counts, per client, tweets received twice for one rule (tweet id per
rule_id) and events received twice (event_id), and the time from each event's write (its `timestamp`) to its
receipt. Dropped (a worker killed), it reconnects with `?since_event_id=` (the last event it had) or
`?since_timestamp=` (its first connection, when it had none yet), retrying while the gateway still holds its
key for the dead connection (1008 for up to 6 s: docs/streams.md).

`Receiver` is the account's webhook endpoint: each delivery is verified with the `standardwebhooks` package;
it counts tweets delivered twice (one rule's tweet id under two webhook ids: a real double) apart from
redeliveries of one webhook id (allowed by Standard Webhooks: receivers dedupe on the id).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

import orjson
import tornado.web
import tornado.websocket
from standardwebhooks import Webhook
from tornado.httpclient import HTTPClientError, HTTPRequest

RETRY_SECONDS = 0.5  # between reconnection attempts of a dropped client


_PARSED: dict[str, dict] = {}  # an event's text -> the event: every client gets the same text (parsed once)


def parsed(text: str) -> dict:
    """The event of a message, parsed once for all clients: the bench's own CPU stays off the figures."""
    event = _PARSED.get(text)
    if event is None:
        if len(_PARSED) >= 64:
            _PARSED.pop(next(iter(_PARSED)))
        event = _PARSED[text] = orjson.loads(text)
    return event


class Client:
    def __init__(self, url: str, key: str):
        self.url, self.key = url, key
        self.ws = None
        self.connected_ms: int | None = None  # the first connection's time (resume point before any event)
        self.last_event: str | None = None
        self.events: dict[str, int] = {}  # event id -> the connection (1, 2, ...) that brought it first
        self.doubles: list[list] = []
        self.newest = 0  # the newest event's timestamp (ms) received
        self.out_of_order = 0
        self.events_twice = 0
        self.tweets: dict[str, set[str]] = defaultdict(set)  # rule_id -> tweet ids received
        self.tweets_twice = 0
        self.latencies: list[tuple[str, float]] = []  # (event id, ms from its write to its receipt)
        self.connections = 0  # accepted (1 unless dropped and resumed)
        self.refused = 0  # connection attempts closed at once (the key still held by a dead connection)
        self.incomplete_resumes = 0  # resumes whose `connected` said not everything missed is replayed
        self.stopping = False

    async def run(self) -> None:
        while not self.stopping:
            try:
                await self._connect()
            except (OSError, HTTPClientError, tornado.websocket.WebSocketClosedError):
                self.refused += 1
                await asyncio.sleep(RETRY_SECONDS)
                continue
            if self.ws is None:  # closed before `connected` (1008: one socket per key)
                self.refused += 1
                await asyncio.sleep(RETRY_SECONDS)
                continue
            self.connections += 1
            await self._read()

    async def _connect(self) -> None:
        url = self.url
        if self.last_event is not None:
            url += "?since_event_id=" + self.last_event
        elif self.connected_ms is not None:
            url += f"?since_timestamp={self.connected_ms}"
        ws = await tornado.websocket.websocket_connect(HTTPRequest(url, headers={"X-API-Key": self.key}))
        first = await ws.read_message()
        if first is None or '"connected"' not in first:
            ws.close()
            self.ws = None
            return
        connected = orjson.loads(first)
        if self.connected_ms is None:
            self.connected_ms = connected["timestamp"]
        if not connected.get("replay", {"complete": True})["complete"]:  # the gateway could not replay it all
            self.incomplete_resumes += 1
        self.ws = ws

    async def _read(self) -> None:
        while True:
            text = await self.ws.read_message()
            if text is None:  # dropped: reconnect and resume (unless the bench is ending)
                self.ws = None
                return
            if '"tweet"' in text[:40]:
                self.take(parsed(text), time.time() * 1000)

    def take(self, event: dict, now_ms: float) -> None:
        """One tweet event received: counted, and its doubles."""
        event_id = event["event_id"]
        if event_id in self.events:
            self.events_twice += 1
            if len(self.doubles) < 5:  # evidence: which event, on which connections, behind what newest event
                self.doubles.append([event_id, self.events[event_id], self.connections, event["timestamp"]])
        else:
            self.events[event_id] = self.connections
        if event["timestamp"] < self.newest:
            self.out_of_order += 1  # an event written before one this client already had
        self.newest = max(self.newest, event["timestamp"])
        self.last_event = event_id
        seen = self.tweets[event["rule_id"]]
        for tweet in event["tweets"]:
            if tweet["id"] in seen:
                self.tweets_twice += 1
            seen.add(tweet["id"])
        self.latencies.append((event_id, now_ms - event["timestamp"]))

    def close(self) -> None:
        self.stopping = True
        if self.ws is not None:
            self.ws.close()


class Receiver:
    """The account's webhook endpoint (POST /hook)."""

    def __init__(self, secret: str):
        self.webhook = Webhook(secret)
        self.ids: set[str] = set()  # webhook-id
        self.redeliveries = 0  # a webhook-id received again
        self.bad_signatures = 0
        self.tweets: dict[tuple[str, str], str] = {}  # (rule_id, tweet id) -> the webhook-id that brought it
        self.tweets_twice = 0
        self.events: set[str] = set()  # stream event ids (data.event_id)
        self.other_types: dict[str, int] = defaultdict(int)

    def take(self, body: bytes, headers: dict) -> int:
        try:
            payload = self.webhook.verify(body, headers)
        except Exception:  # the package raises its own WebhookVerificationError (and ValueError on bad input)
            self.bad_signatures += 1
            return 400
        msg_id = headers["webhook-id"]
        if msg_id in self.ids:
            self.redeliveries += 1
            return 200
        self.ids.add(msg_id)
        if payload.get("type") != "tweet":
            self.other_types[payload.get("type")] += 1
            return 200
        data = payload["data"]
        self.events.add(data["event_id"])
        for tweet in data["tweets"]:
            mark = (data["rule_id"], tweet["id"])
            if mark in self.tweets and self.tweets[mark] != msg_id:
                self.tweets_twice += 1
            self.tweets.setdefault(mark, msg_id)
        return 200

    def app(self) -> tornado.web.Application:
        receiver = self

        class Hook(tornado.web.RequestHandler):
            def post(self) -> None:
                headers = {name.lower(): value for name, value in self.request.headers.items()}
                self.set_status(receiver.take(self.request.body, headers))

        return tornado.web.Application([(r"/hook", Hook)])


def tally(clients: list[Client], written: dict[str, list[str]], receiver: Receiver | None) -> dict:
    """Exactly once as the clients and the receiver saw it. `written`: the database's events up to the cut-off
    ({event id: [(rule_id, tweet id), ...]}), which every client (all connected before any rule was switched on)
    and the receiver must have had."""
    expected = set(written)
    doubles = [[i, *d] for i, c in enumerate(clients) for d in c.doubles][:10]
    figures = {
        "events_written": len(expected),
        "socket_events_twice": sum(c.events_twice for c in clients),
        "socket_tweets_twice": sum(c.tweets_twice for c in clients),
        "socket_events_missed": sum(len(expected - set(c.events)) for c in clients),
        "clients_missing_an_event": sum(1 for c in clients if expected - set(c.events)),
        "clients_reconnected": sum(1 for c in clients if c.connections > 1),
        "reconnections_refused_while_held": sum(c.refused for c in clients),
        "resumes_incomplete": sum(c.incomplete_resumes for c in clients),
        "socket_events_out_of_order": sum(c.out_of_order for c in clients),
    }
    if doubles:  # [client, event id, connection first had it, connection had it again, event ms]
        figures["socket_doubles_sample"] = doubles
    if receiver is not None:
        tweets = {mark for marks in written.values() for mark in marks}
        figures |= {
            "webhook_tweets_twice": receiver.tweets_twice,
            "webhook_tweets_missed": len(tweets - set(receiver.tweets)),
            "webhook_events_missed": len(expected - receiver.events),
            "webhook_redeliveries_same_id": receiver.redeliveries,
            "webhook_bad_signatures": receiver.bad_signatures,
        }
    return figures
