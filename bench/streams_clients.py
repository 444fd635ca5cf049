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
import base64
import os
import time
from collections import defaultdict
from urllib.parse import urlsplit

import orjson
import tornado.web
from standardwebhooks import Webhook

RETRY_SECONDS = 0.5  # between reconnection attempts of a dropped client


_PARSED: dict[bytes, dict] = {}  # an event's text -> the event: every client gets the same text (parsed once)


def parsed(text: bytes) -> dict:
    """The event of a message, parsed once for all clients: the bench's own CPU stays off the figures."""
    event = _PARSED.get(text)
    if event is None:
        if len(_PARSED) >= 64:
            _PARSED.pop(next(iter(_PARSED)))
        event = _PARSED[text] = orjson.loads(text)
    return event


class Client:
    """One key's socket, on a bare asyncio protocol: receiving only stamps and keeps the bytes (`_Wire`), and
    `drain` reads the frames later, so a thousand clients in this process add little to the receipt times
    they measure (each frame's time is when its last byte arrived)."""

    def __init__(self, url: str, key: str):
        parts = urlsplit(url)
        self.host, self.port, self.target = parts.hostname, parts.port or 80, parts.path
        self.key = key
        self.wire: _Wire | None = None
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
        self.closes: list[int | None] = []  # each ended connection's close code (None: lost without a close frame)
        self.resumes: list[str] = []  # the event id each reconnection resumed from
        self.reconnect_seconds: list[float] = []  # from each connection's loss to the next one's `connected`
        self.stopping = False

    async def run(self) -> None:
        lost = None
        while not self.stopping:
            try:
                wire = await self._connect()
            except OSError:
                wire = None
            if wire is None:  # refused, or closed before `connected` (1008: one socket per key)
                self.refused += 1
                await asyncio.sleep(RETRY_SECONDS)
                continue
            self.connections += 1
            if lost is not None:
                self.reconnect_seconds.append(time.monotonic() - lost)
            self.wire = wire
            await wire.lost
            lost = time.monotonic()
            self.drain()  # what it had, before a reconnect resumes after its last event
            if not self.stopping:
                self.closes.append(wire.close_code)
            self.wire = None

    async def _connect(self) -> _Wire | None:
        query = ""
        if self.last_event is not None:
            query = "?since_event_id=" + self.last_event
            self.resumes.append(self.last_event)
        elif self.connected_ms is not None:
            query = f"?since_timestamp={self.connected_ms}"
        loop = asyncio.get_running_loop()
        _, wire = await loop.create_connection(_Wire, self.host, self.port)
        wire.handshake(self.host, self.port, self.target + query, self.key)
        connected = await wire.connected
        if connected is None:
            wire.close()
            return None
        if self.connected_ms is None:
            self.connected_ms = connected["timestamp"]
        if not connected.get("replay", {"complete": True})["complete"]:  # the gateway could not replay it all
            self.incomplete_resumes += 1
        return wire

    def drain(self) -> None:
        """The tweet events received since the last drain, counted with their receipt times."""
        if self.wire is not None:
            for payload, ms in self.wire.frames():
                if b'"tweet"' in payload[:40]:
                    self.take(parsed(payload), ms)

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
        self.drain()
        if self.wire is not None:
            self.wire.close()


class _Wire(asyncio.Protocol):
    """A WebSocket client connection read as bytes: `data_received` only stamps and keeps each chunk; the
    frames (unmasked from a server, whole: the gateway does not fragment) are read from them by `frames`."""

    def __init__(self):
        loop = asyncio.get_running_loop()
        self.connected: asyncio.Future = loop.create_future()  # the `connected` event, or None if refused
        self.lost: asyncio.Future = loop.create_future()
        self.transport: asyncio.Transport | None = None
        self.chunks: list[tuple[bytes, float]] = []
        self.early: list[tuple[bytes, float]] = []  # text frames read with the `connected` event
        self.buffer = bytearray()
        self.upgraded = False
        self.close_code: int | None = None  # the server's close frame's code, once read

    def connection_made(self, transport) -> None:
        self.transport = transport

    def handshake(self, host: str, port: int, target: str, key: str) -> None:
        nonce = base64.b64encode(os.urandom(16)).decode()
        self.transport.write(
            f"GET {target} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {nonce}\r\nSec-WebSocket-Version: 13\r\nX-API-Key: {key}\r\n\r\n".encode()
        )

    def data_received(self, data: bytes) -> None:
        if self.connected.done():  # the hot path: one stamp per chunk, nothing parsed
            self.chunks.append((data, time.time() * 1000))
            if data[:1] == b"\x88":  # a close frame on its own (a drain's 1012): leave now, reconnect at once
                self.close()
            return
        self.buffer += data  # the upgrade and the `connected` event, read at once
        if not self.upgraded:
            head, found, rest = bytes(self.buffer).partition(b"\r\n\r\n")
            if not found:
                return
            if b" 101 " not in head.split(b"\r\n", 1)[0]:
                self._refused()
                return
            self.upgraded, self.buffer = True, bytearray(rest)
        now = time.time() * 1000
        for opcode, payload in self._parse():
            if opcode == 1 and not self.connected.done():
                self.connected.set_result(orjson.loads(payload))
            elif opcode == 1:  # what came with it (a resume's replay): kept as if received after it
                self.early.append((payload, now))
            elif opcode == 8:
                self._refused()

    def frames(self) -> list[tuple[bytes, float]]:
        """The text frames received since the last call, each with the time its last byte arrived."""
        out, self.early = self.early, []
        chunks, self.chunks = self.chunks, []
        for data, ms in chunks:
            self.buffer += data
            for opcode, payload in self._parse():
                if opcode == 1:
                    out.append((payload, ms))
                elif opcode == 8 and len(payload) >= 2:
                    self.close_code = int.from_bytes(payload[:2], "big")
        return out

    def _parse(self) -> list[tuple[int, bytes]]:
        done, buf = [], self.buffer
        while len(buf) >= 2:
            size, at = buf[1] & 0x7F, 2
            if size == 126:
                if len(buf) < 4:
                    break
                size, at = int.from_bytes(buf[2:4], "big"), 4
            elif size == 127:
                if len(buf) < 10:
                    break
                size, at = int.from_bytes(buf[2:10], "big"), 10
            if len(buf) < at + size:
                break
            done.append((buf[0] & 0x0F, bytes(buf[at : at + size])))
            del buf[: at + size]
        return done

    def _refused(self) -> None:
        if not self.connected.done():
            self.connected.set_result(None)
        self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc) -> None:
        if not self.connected.done():
            self.connected.set_result(None)
        if not self.lost.done():
            self.lost.set_result(None)


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
