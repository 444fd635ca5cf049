"""WebSocket fan-out: the sockets of this process, by account, and what reaches them.

An event reaches a socket once: from this process's poller at once (`publish`), from other processes' through
the tail (`tail`, every STREAM_TICK_SECONDS while this process has sockets, reading the events written since
its last look, with an overlap for writers' clocks); a memory of recent event ids drops the second sighting.
Each event is serialised once for all its sockets. `watch` sends pings, renews each key's hold on its one
socket (storage/streams.py) and closes, within a second, the sockets of keys revoked, expired or deleted, and
of accounts suspended (an admin's suspension reaches every process's account cache: accounting/coherence.py).
"""

import asyncio
import logging
import time
from collections import OrderedDict
from datetime import UTC, datetime, timedelta
from typing import NamedTuple, Protocol

import orjson

from runtime.cache import LoadingCache
from runtime.metrics import Metrics
from storage.streams import StreamStore
from streams.rules import message, millis

log = logging.getLogger("gateway.streams")
SEEN_MEMORY = 50_000  # event ids this process knows its sockets have had
TAIL_OVERLAP = timedelta(seconds=2)  # writers stamp with their own clocks (as storage/alerts.py polls)
RESUME_LIMIT = 5_000  # events a reconnecting socket may be sent at once
WATCH_SECONDS = 0.5  # how often key revocations and pings are looked at
HOLD_BEAT = 2.0  # seconds between renewals of this process's sockets' holds on their keys
HAND_OVER_WINDOW = timedelta(seconds=10)  # a drain's hand-over covers what was written this long before a client's
# last event: an event stamped earlier but written later (a loaded database took seconds) is not missed
HAND_OVER_SECONDS = 2.0  # the most a drain waits to keep its sockets' hand-overs before it closes them
HOLD_STALE = 6.0  # a hold not renewed this long belongs to a process that died: a new socket may take it


class Resumed(NamedTuple):
    """A socket resumed from what its key's last socket handed over (Hub.missed): the live events its client
    had are those stamped before `since` (ms) and those in `had`; `known` lists the latter found in the replay's
    window, (ms, id), its last event last: its own hand-over passes them on (the client had them from a process
    before this one, which its next process cannot otherwise know)."""

    since: int
    had: set[str]
    known: list[tuple[int, str]]


class Socket(Protocol):
    account_id: str
    key_id: int
    digest: str
    conn_id: str

    def send(self, frame: bytes, event_id: str | None = None, at: int | None = None) -> None: ...

    def close_with(self, code: int, reason: str) -> None: ...

    def hand_over(self) -> dict | None: ...

    def close_when_sent(self, code: int, reason: str) -> None: ...


class Hub:
    def __init__(
        self,
        store: StreamStore,
        key_cache: LoadingCache,
        account_cache: LoadingCache,
        metrics: Metrics,
        ping_seconds: float,
        owner: str,
    ):
        self.store, self.key_cache, self.metrics, self.ping_seconds = store, key_cache, metrics, ping_seconds
        self.account_cache = account_cache  # account id -> its view (AccountView.suspended)
        self.owner = owner  # this process, as its sockets' holds name it
        self.sockets: dict[str, set[Socket]] = {}  # account id -> its sockets here
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._tail_since: datetime | None = None
        self._last_ping, self._last_beat = time.monotonic(), 0.0
        self._background: set[asyncio.Task] = set()

    def spawn(self, work) -> None:
        """Runs `work` (a socket's release) in the background, kept referenced until it ends."""
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def count(self) -> int:
        return sum(len(s) for s in self.sockets.values())

    def add(self, socket: Socket) -> None:
        self.sockets.setdefault(socket.account_id, set()).add(socket)

    def remove(self, socket: Socket) -> None:
        mine = self.sockets.get(socket.account_id)
        if mine is not None:
            mine.discard(socket)
            if not mine:
                del self.sockets[socket.account_id]

    # --- events in -----------------------------------------------------------------------------------
    def publish(self, event: dict) -> None:
        if event["_id"] in self._seen:
            return
        self._seen[event["_id"]] = None
        if len(self._seen) > SEEN_MEMORY:
            self._seen.popitem(last=False)
        targets = self.sockets.get(event["account_id"])
        if not targets:
            return
        frame = orjson.dumps(message(event))  # encoded once for all the account's sockets
        at = millis(event["created_at"])
        for socket in list(targets):
            socket.send(frame, event["_id"], at)
        self.metrics.fanout.observe(event["kind"], time.time() - event["created_at"].timestamp())

    async def tail(self) -> None:
        """Events written by other processes since the last look, for the accounts with sockets here."""
        now = datetime.now(UTC)
        if not self.sockets:
            self._tail_since = None
            return
        since = self._tail_since or now
        self._tail_since = now
        written = await self.store.recent_ids(since - TAIL_OVERLAP, list(self.sockets))
        unseen = [i for i in written if i not in self._seen]
        if unseen:
            for event in await self.store.events_by_id(unseen):
                self.publish(event)

    async def missed(
        self, account_id: str, after_id: str | None, after_ms: int | None, handed: dict | None = None
    ) -> tuple[list[tuple[str, bytes, int]], dict, Resumed | None]:
        """What a reconnecting socket asks for: the account's events after an event id or a time (ms), as (id,
        frame, ms), and what its `connected` event says of them (`replay`: how many, and whether that is all it
        missed). `handed`: what the key's last socket had when its process drained (TweetSocket.hand_over);
        resuming from its last event, the replay starts HAND_OVER_WINDOW earlier (or where that socket's own
        knowledge began, `since`) and leaves out what it had: an event another process stamped earlier but wrote
        later is not missed, and none is sent twice. Then the third value tells which live events the client had."""
        kept_since = datetime.now(UTC) - timedelta(seconds=self.store.retention)
        after, mark, had, resume = None, None, set(), None
        if after_id is not None:
            found = await self.store.event(after_id)
            if found is None or found["account_id"] != account_id:
                msg = "Unknown event_id, or older than events are kept: nothing replayed; resume with since_timestamp"
                return [], {"events": 0, "complete": False, "msg": msg}, None
            after, mark = found["created_at"], found["_id"]
            if handed and handed.get("last") == after_id:
                after, mark, had = after - HAND_OVER_WINDOW, None, {*handed["had"], after_id}
                if "since" in handed:  # that socket was resumed too: before its own replay, its client had all
                    after = max(after, datetime.fromtimestamp(handed["since"] / 1000, UTC))
        else:
            after = datetime.fromtimestamp(after_ms / 1000, UTC) + timedelta(milliseconds=1)
        found_events = await self.store.events_after(account_id, after, mark, RESUME_LIMIT + 1 + len(had))
        if had:
            known = [(millis(e["created_at"]), e["_id"]) for e in found_events if e["_id"] in had - {after_id}]
            resume = Resumed(millis(after), had, [*known, (millis(found["created_at"]), after_id)])
        events = [e for e in found_events if e["_id"] not in had]
        replay = {"events": min(len(events), RESUME_LIMIT), "complete": True}
        if len(events) > RESUME_LIMIT:
            events = events[:RESUME_LIMIT]
            replay |= {"complete": False, "msg": f"More than {RESUME_LIMIT:,} events: resume again from the last one"}
        elif after < kept_since:
            when = kept_since.strftime("%Y-%m-%d %H:%M:%S UTC")
            replay |= {"complete": False, "msg": f"Events before {when} are no longer kept"}
        return [(e["_id"], orjson.dumps(message(e)), millis(e["created_at"])) for e in events], replay, resume

    # --- upkeep ----------------------------------------------------------------------------------------
    async def watch(self) -> None:
        """Every WATCH_SECONDS: suspended accounts' and revoked or expired keys' sockets closed; pings every
        `ping_seconds`; the holds of this process's sockets on their keys renewed every HOLD_BEAT (one write for
        all of them)."""
        now = time.monotonic()
        ping, beat = now - self._last_ping >= self.ping_seconds, now - self._last_beat >= HOLD_BEAT
        if ping:
            self._last_ping = now
            ping_frame = orjson.dumps({"event_type": "ping", "timestamp": millis(datetime.now(UTC))})
        live = []
        suspended = set()
        for account_id in list(self.sockets):
            view = await self.account_cache.get(account_id)
            if view is None or view.suspended:
                suspended.add(account_id)
        for socket in [s for group in self.sockets.values() for s in group]:
            if socket.account_id in suspended:
                socket.close_with(1008, "Account suspended")
                continue
            entry = await self.key_cache.get(socket.digest)
            if entry is None or entry.revoked or (entry.expires_at is not None and time.time() >= entry.expires_at):
                socket.close_with(1008, "API key revoked or expired")
                continue
            live.append(socket)
            if ping:
                socket.send(ping_frame)
        if beat and live:
            await self.renew()

    async def renew(self) -> None:
        """This process's holds renewed (one write for all its sockets): before a socket takes a hold, and
        every HOLD_BEAT while it has sockets."""
        self._last_beat = time.monotonic()
        await self.store.beat(self.owner)

    async def close(self) -> None:
        await self.store.forget(self.owner)

    async def goodbye(self, code: int, reason: str) -> None:
        """A drain: every socket here closed with `code`, after what each client had is kept on its key's hold
        for the socket that resumes it in another process (`missed`)."""
        sockets = [s for group in self.sockets.values() for s in group]
        handed = [(s.key_id, s.conn_id, h) for s in sockets if (h := s.hand_over())]
        try:
            async with asyncio.timeout(HAND_OVER_SECONDS):
                await self.store.hand_over(handed)
        except Exception as exc:  # they resume from their last event, as after a crash
            log.warning("could not hand over %d sockets' last events (%s)", len(handed), type(exc).__name__)
        for socket in sockets:
            socket.close_when_sent(code, reason)

    async def hold(self, key_id: int, conn_id: str) -> dict | None:
        """The key's one socket, this one, unless a live socket holds it (here or in another process): None
        when refused, else what the key's last socket handed over as its process drained, or {}."""
        if time.monotonic() - self._last_beat > HOLD_BEAT / 2:
            await self.renew()
        stale = datetime.now(UTC) - timedelta(seconds=HOLD_STALE)
        return await self.store.take_socket(key_id, conn_id, self.owner, stale)

    async def let_go(self, key_id: int, conn_id: str) -> None:
        """The key's socket closed: another may connect (its hold is this socket's only)."""
        await self.store.drop_socket(key_id, conn_id)
