"""Real time (docs/streams.md): the provider's filter-rule and monitor calls, its WebSocket, and the portal's view.

Provider-compatible, with X-API-Key (checked as a data call to tweet/advanced_search, which every poll makes:
scopes, address lists, expiry and revocation apply): POST /oapi/tweet_filter/add_rule, update_rule,
DELETE (the provider's method) or POST /oapi/tweet_filter/delete_rule, GET /oapi/tweet_filter/get_rules,
POST /oapi/x_user_stream/add_user_to_monitor_tweet and remove_user_to_monitor_tweet (by the provider's
id_for_user, or by x_user_name); answers {"status", "msg", ...} as the provider's. The WebSocket at
/twitter/tweet/websocket and /social/tweet/websocket. The portal (session token): GET/POST /streams,
PATCH/DELETE /streams/{rule_id}, GET /streams/{rule_id}/events. Another account's rule is 404. What they do:
streams/manage.py (`self.services.streams`); their part of the OpenAPI document: handlers/streams/openapi.py.
"""

import secrets
from collections import deque
from datetime import UTC, datetime

import orjson
import tornado.websocket

from handlers.base import Anonymous, BaseHandler, authenticated
from handlers.context import HandlerContext
from handlers.errors import ApiError, ValidationError, error
from handlers.social import api_key
from handlers.validation import Field, no_controls, validate_body
from streams import rules as polls
from streams.hub import HAND_OVER_WINDOW, Resumed
from streams.manage import LimitReached, Manager

SCOPE = polls.SEARCH.path
SENT_MEMORY = 5_000  # events a socket remembers having sent, for its hand-over when its process drains
UNSENT_LIMIT = 16 * 1024 * 1024  # bytes of events waiting for one client before it is closed as too slow
# Bytes handed to a socket's connection at once (past one frame); the rest waits in the socket's own queue,
# which a close drops: the close frame then follows at most this much, not the whole backlog.
WINDOW = 256 * 1024
EVENTS_LIMIT = Field("limit", int, required=False, default=50, minimum=1, maximum=500)
TAG = Field("tag", str, min_length=1, max_length=255, check=no_controls, description="Your label for the rule")
VALUE = Field("value", str, min_length=1, max_length=512, check=no_controls, description="An advanced_search query")
INTERVAL = Field("interval_seconds", float, description="Seconds between polls (STREAM_MIN_INTERVAL to 86400)")
RULE_ID = Field("rule_id", str, min_length=1, max_length=64)
IS_EFFECT = Field("is_effect", int, minimum=0, maximum=1, description="1: active (polled), 0: inactive")
USER = Field("x_user_name", str, min_length=1, max_length=16, description="The account's handle (@ optional)")
MONITOR_ID = Field("id_for_user", str, min_length=1, max_length=64, description="add_user_to_monitor_tweet's answer")
ADD_RULE = [TAG, VALUE, INTERVAL]
UPDATE_RULE = [RULE_ID, TAG, VALUE, INTERVAL, IS_EFFECT]  # the provider: "You must set all parameters"
DELETE_RULE = [RULE_ID]
MONITOR = [USER]
RULE_INTERVAL = 60.0  # a rule made in the portal without an interval
KIND = Field("kind", str, check=lambda v, loc: _kind(v, loc), description="rule | monitor")
ACTIVE = Field("active", bool, required=False, description="Default true: polled from now")
OPTIONAL_INTERVAL = Field(
    "interval_seconds",
    float,
    required=False,
    description="Default: 60 s for a rule, STREAM_MONITOR_INTERVAL for a monitor",
)
# The portal's create: a rule has a tag and a search, a monitor an account (its tag defaults to @handle).
RULE_CREATE = [KIND, TAG, VALUE, OPTIONAL_INTERVAL, ACTIVE]
MONITOR_CREATE = [KIND, USER, Field("tag", str, required=False, min_length=1, max_length=255, check=no_controls)]
MONITOR_CREATE += [OPTIONAL_INTERVAL, ACTIVE]
PORTAL_PATCH = [
    Field("tag", str, required=False, min_length=1, max_length=255, check=no_controls),
    Field("value", str, required=False, min_length=1, max_length=512, check=no_controls, description="rules only"),
    Field("interval_seconds", float, required=False),
    Field("active", bool, required=False, description="true: polled from now; false: paused"),
]


def _kind(value: str, loc: list) -> None:
    if value not in ("rule", "monitor"):
        raise ValidationError([error(loc, "Input should be one of rule, monitor", "enum")])


def checked_interval(settings, value: float | None, loc: list) -> int | float:
    low = settings.stream_min_interval
    if value is None or not low <= value <= 86400:
        # In a customer's words (the portal checks the same before sending): no setting's name.
        message = f"Choose from {low:g} seconds to a day (86400): a rule is polled at most every {low:g} seconds"
        raise ValidationError([error(loc, message, "value_error")])
    return whole(value)


def whole(seconds: float) -> int | float:
    """An interval as the provider shows it, an integer (60, not 60.0); only a test's sub-second one stays a float."""
    return int(seconds) if float(seconds).is_integer() else seconds


def user_name(value: str, loc: list) -> str:
    found = polls.USER_NAME.fullmatch(value.strip())
    if not found:
        raise ValidationError([error(loc, "Input should be an X handle: 1-15 letters, digits or _", "value_error")])
    return found.group(1)


SUSPENDED = "This account is suspended; its keys are refused until an admin resumes it"  # as its data calls


async def stream_key(handler, scope: str | None = SCOPE):
    """The X-API-Key checked as for the search every poll makes (handlers/social.api_key), and its account not
    suspended: 403, as its data calls (its rules wait and its sockets are closed meanwhile: docs/streams.md)."""
    key = await api_key(handler, scope)
    if (await handler.ctx.services.account.view(key.account_id)).suspended:
        raise ApiError(403, SUSPENDED)
    return key


async def not_suspended(handler, active: bool | None) -> None:
    """A portal call switching a rule on while the account is suspended: 403, nothing written (its rules wait for
    the resume; one switched on now would only be claimed and set aside at every tick)."""
    if active and (await handler.services.account.view(handler.current_user)).suspended:
        raise ApiError(403, "This account is suspended: rules cannot be switched on until an admin resumes it")


async def added(streams: Manager, *args, created_by: dict | None = None) -> dict:
    """A new rule or monitor (streams.Manager.add's arguments); 409 past the account's limit."""
    try:
        return await streams.add(*args, created_by=created_by)
    except LimitReached as exc:
        raise ApiError(409, str(exc)) from None


class ProviderApi(BaseHandler):
    """The provider's answers: {"status": "success"|"error", "msg"} (errors too, through write_error)."""

    def error_body(self, status: int, message: str) -> dict:
        return {"status": "error", "msg": message}

    async def key(self):
        return await stream_key(self)

    def ok(self, **extra) -> None:
        self.send_json({"status": "success", "msg": "success", **extra})


class AddRuleHandler(ProviderApi):
    async def post(self) -> None:
        key = await self.key()
        body = validate_body(self.json_body(), ADD_RULE)
        interval = checked_interval(self.config, body["interval_seconds"], ["body", "interval_seconds"])
        doc = await added(
            self.services.streams, key.account_id, key.key_id, "rule", body["tag"], body["value"], interval, False
        )
        self.ok(rule_id=doc["_id"])


class UpdateRuleHandler(ProviderApi):
    async def post(self) -> None:
        key = await self.key()
        body = validate_body(self.json_body(), UPDATE_RULE)
        interval = checked_interval(self.config, body["interval_seconds"], ["body", "interval_seconds"])
        fields = {"tag": body["tag"], "value": body["value"], "interval_seconds": interval}
        # Of rules only: a monitor's id is not found, and nothing of it changes.
        done = await self.services.streams.change(
            key.account_id, body["rule_id"], fields, bool(body["is_effect"]), "rule"
        )
        if done is None:
            raise ApiError(404, "Rule not found")
        self.ok()


class DeleteRuleHandler(ProviderApi):
    async def delete(self) -> None:  # the provider's method, with a JSON body
        key = await self.key()
        body = validate_body(self.json_body(), DELETE_RULE)
        if not await self.services.streams.delete(key.account_id, body["rule_id"], "rule"):  # a monitor's: 404
            raise ApiError(404, "Rule not found")
        self.ok()

    post = delete  # what docs/streams.md offered first: kept for the clients written against it


class GetRulesHandler(ProviderApi):
    async def get(self) -> None:
        key = await self.key()
        rows = [self.services.streams.row(r) for r in await self.services.streams.rules(key.account_id, "rule")]
        self.ok(rules=[{**row, "interval_seconds": whole(row["interval_seconds"])} for row in rows])


class AddMonitorHandler(ProviderApi):
    async def post(self) -> None:
        key = await self.key()
        name = user_name(validate_body(self.json_body(), MONITOR)["x_user_name"], ["body", "x_user_name"])
        found = await self.services.streams.monitor_of(key.account_id, name)
        if found is not None:  # added twice: the same monitor, switched on
            await self.services.streams.change(key.account_id, found["_id"], {}, True)
            return self.ok(id_for_user=found["_id"])
        interval = whole(self.config.stream_monitor_interval)
        doc = await added(
            self.services.streams, key.account_id, key.key_id, "monitor", "@" + name, name, interval, True
        )
        self.ok(id_for_user=doc["_id"])


class RemoveMonitorHandler(ProviderApi):
    async def post(self) -> None:
        """The provider's body names the monitor by the id add_user_to_monitor_tweet answered; by handle too."""
        key = await self.key()
        data, streams = self.json_body(), self.services.streams
        if isinstance(data, dict) and "x_user_name" not in data:
            found = await streams.rule(key.account_id, validate_body(data, [MONITOR_ID])["id_for_user"])
        else:
            name = user_name(validate_body(data, MONITOR)["x_user_name"], ["body", "x_user_name"])
            found = await streams.monitor_of(key.account_id, name)
        if (
            found is None
            or found["kind"] != "monitor"
            or not await streams.delete(key.account_id, found["_id"], "monitor")
        ):
            raise ApiError(404, "This account is not monitored")
        self.ok()


class MyInfoHandler(ProviderApi):
    """The provider's `GET /oapi/my/info`: the balance its clients read before spending, in the provider's shape
    (`recharge_credits`, credits at the provider's 100,000 a dollar: the account's one balance). Any key of the
    account may read it, whatever endpoints it is limited to."""

    async def get(self) -> None:
        key = await stream_key(self, None)
        self.send_json({"recharge_credits": await self.services.account.balance(key.account_id)})


class TweetSocket(Anonymous, tornado.websocket.WebSocketHandler):
    """The provider's WebSocket: `connected`, then `tweet` events of the key's account and `ping`s. One socket
    per key (a second is closed with 1008); beyond the provider, `?since_event_id=` or `?since_timestamp=` (ms)
    first sends what the socket missed (events are kept STREAM_EVENT_RETENTION). Anonymous: no `Server` header
    on its 101 nor on its refusals, as on every other answer."""

    def initialize(self, ctx: HandlerContext) -> None:
        self.ctx = ctx
        self.account_id, self.log_fields, self.key_entry, self.held = None, {}, None, False
        self.conn_id = secrets.token_hex(12)
        self.replaying: list[tuple] | None = []  # live events while the missed ones are sent
        self.replayed: set[str] = set()  # ids of the events the resume sent (the tail may bring them again)
        self.had: Resumed | None = None  # a handed-over resume: live events the client had (Hub.missed)
        self.sent: deque[tuple[int, str]] = deque(maxlen=SENT_MEMORY)  # (ms, id) of the last events sent
        self.leaving: tuple[int, str] | None = None  # a drain's close, once the frames queued here are sent
        self.unsent = 0  # bytes queued for this client (waiting here or handed over) and not yet sent
        self.waiting: deque[bytes] = deque()  # frames not yet handed to the connection
        self.handed = 0  # bytes handed to the connection and not yet written to the kernel

    client_ip = BaseHandler.client_ip

    async def get(self, *args, **kwargs) -> None:
        try:
            key = await stream_key(self)
            after_id = self.get_query_argument("since_event_id", None)
            after_ms = self._since_ms()
        except ApiError as exc:  # refused before the upgrade: an HTTP answer in the usual shapes
            self.set_status(exc.status_code)
            self.set_header("Content-Type", "application/json")
            for name, value in exc.extra_headers.items():
                self.set_header(name, value)
            if isinstance(exc, ValidationError):
                return self.finish({"detail": exc.errors})
            return self.finish({"status": "error", "msg": exc.message})
        self.key_entry, self.account_id = key, key.account_id
        self.key_id = key.key_id
        self.digest = self.ctx.data.vault.digest(self.request.headers["X-API-Key"].strip())  # Hub.watch re-checks it
        self.after = (after_id, after_ms)
        await super().get(*args, **kwargs)

    def _since_ms(self) -> int | None:
        raw = self.get_query_argument("since_timestamp", None)
        if raw is None:
            return None
        if not raw.isascii() or not raw.isdigit() or len(raw) > 15:
            loc = ["query", "since_timestamp"]
            raise ValidationError([error(loc, "Input should be milliseconds since 1970 (digits)", "int_parsing")])
        return int(raw)

    async def open(self) -> None:
        ctx = self.ctx
        handed = await ctx.services.hub.hold(self.key_id, self.conn_id)
        if handed is None:
            self.close(1008, "Only one connection per API key")
            return
        self.held = True
        ctx.services.hub.add(self)
        connected = {"event_type": "connected", "timestamp": polls.millis(datetime.now(UTC))}
        missed: list[tuple[str, bytes, int]] = []
        if self.after != (None, None):
            missed, connected["replay"], self.had = await ctx.services.hub.missed(self.account_id, *self.after, handed)
        if self.had is not None:  # what the client had from earlier processes, for this one's hand-over
            self.sent.extend(self.had.known)
        self._write(orjson.dumps(connected))
        for event_id, frame, at in missed:
            self._write(frame)
            self.sent.append((at, event_id))
        # Live events that came during the replay, and later the tail's, unless the replay had them already.
        self.replayed = {event_id for event_id, _, _ in missed}
        waiting, self.replaying = self.replaying or [], None
        for frame, event_id, at in waiting:
            self.send(frame, event_id, at)

    def send(self, frame: bytes, event_id: str | None = None, at: int | None = None) -> None:
        if self.leaving:  # handed over: the client has this from the process it resumes in
            return
        if self.replaying is not None:
            self.replaying.append((frame, event_id, at))
        elif event_id is None:
            self._write(frame)
        elif not (event_id in self.replayed or self._had(at, event_id)):
            self._write(frame)
            self.sent.append((at, event_id))

    def _had(self, at: int | None, event_id: str) -> bool:
        """An event the client had from the process it left (the tail of this one reads the last seconds again)."""
        if self.had is None or at is None:
            return False
        return at < self.had.since or event_id in self.had.had

    def hand_over(self) -> dict | None:
        """This process drains: what the client had, for the socket that resumes it elsewhere (Hub.missed): its
        last event, and every event it had from HAND_OVER_WINDOW before that one (`since`: from this socket's
        own replay's start, if later: before it, the client had every event). The events it had from an earlier
        process are among them (`sent` starts with them), so a second hand-over sends none of those again. The
        key's hold stays: it carries this (and its process lets go of it)."""
        self.held = False
        if not self.sent:
            return None
        last_at, last = self.sent[-1]
        since = last_at - int(HAND_OVER_WINDOW.total_seconds() * 1000)
        if self.had is not None:
            since = max(since, self.had.since)
        return {"last": last, "since": since, "had": [event_id for at, event_id in self.sent if at >= since]}

    def _write(self, frame: bytes) -> None:
        """Queues a text frame (bytes: encoded once for every socket). A client that stops reading is closed
        once UNSENT_LIMIT bytes wait for it: its backlog would otherwise grow in this process's memory."""
        if self.ws_connection is None or self.ws_connection.is_closing():
            return
        if self.unsent and self.unsent + len(frame) > UNSENT_LIMIT:  # a backlog it will never catch up
            self.close_with(1013, "Too slow: events were not read; reconnect with since_event_id")
            return
        self.unsent += len(frame)
        self.waiting.append(frame)
        self._hand_over()

    def _hand_over(self) -> None:
        """Frames to the connection while less than WINDOW bytes of earlier ones wait there to be written."""
        while self.waiting and (not self.handed or self.handed + len(self.waiting[0]) <= WINDOW):
            if self.ws_connection is None or self.ws_connection.is_closing():
                return
            frame = self.waiting.popleft()
            self.handed += len(frame)
            self.write_message(frame).add_done_callback(lambda done, n=len(frame): self._written(done, n))
        if self.leaving and not self.waiting:
            self.close(*self.leaving)

    def close_when_sent(self, code: int, reason: str) -> None:
        """Closes with `code` once every frame queued here is on the connection (a drain: the client gets all
        that its hand-over says it had, then the close)."""
        self.leaving = (code, reason)
        self._hand_over()

    def _written(self, done, size: int) -> None:
        self.unsent -= size
        self.handed -= size
        if not done.cancelled():
            done.exception()  # a connection closed under a write: nothing to do, and nothing to log
        self._hand_over()

    def close_with(self, code: int, reason: str) -> None:
        """Closes with `code`; the frames not handed over are dropped, so that the close reaches a client that
        reads again right after what its connection already holds (not behind the backlog it did not read)."""
        self.waiting.clear()
        self.close(code, reason)

    def on_message(self, message) -> None:
        pass  # the provider's clients send nothing that needs an answer

    def on_close(self) -> None:
        self.ctx.services.hub.remove(self)
        if self.held:
            self.held = False
            self.ctx.services.hub.spawn(self.ctx.services.hub.let_go(self.key_id, self.conn_id))

    def write_error(self, status_code: int, **kwargs) -> None:
        """Other methods (405, with the Allow header) and failures in the data plane's error shape."""
        self.set_header("Content-Type", "application/json")
        if status_code == 405:
            self.set_header("Allow", "GET")
        self.finish({"status": "error", "msg": self._reason})

    def check_origin(self, origin: str) -> bool:
        return True  # authenticated by the X-API-Key header, which a browser page cannot set on a WebSocket


# --- the portal --------------------------------------------------------------------------------------------
class StreamsHandler(BaseHandler):
    @authenticated
    async def get(self) -> None:
        rows = await self.services.streams.rules(self.current_user)
        self.send_json([self.services.streams.row(r) for r in rows])

    @authenticated
    async def post(self) -> None:
        data = self.json_body()
        monitor = isinstance(data, dict) and data.get("kind") == "monitor"
        body = validate_body(data, MONITOR_CREATE if monitor else RULE_CREATE)
        kind, settings = body["kind"], self.config
        if kind == "monitor":
            value = user_name(body["x_user_name"], ["body", "x_user_name"])
            tag = body.get("tag") or "@" + value
            interval = body.get("interval_seconds", settings.stream_monitor_interval)
        else:
            tag, value, interval = body["tag"], body["value"], body.get("interval_seconds", RULE_INTERVAL)
        interval = checked_interval(settings, interval, ["body", "interval_seconds"])
        await not_suspended(self, body.get("active", True))
        active = body.get("active", True)
        doc = await added(
            self.services.streams, self.current_user, 0, kind, tag, value, interval, active, created_by=self.member()
        )
        self.send_json(self.services.streams.row(doc))


class StreamHandler(BaseHandler):
    @authenticated
    async def patch(self, rule_id: str) -> None:
        body = validate_body(self.json_body(), PORTAL_PATCH)
        fields = {name: body[name] for name in ("tag", "value") if name in body}
        if "interval_seconds" in body:
            fields["interval_seconds"] = checked_interval(
                self.config, body["interval_seconds"], ["body", "interval_seconds"]
            )
        current = await self.services.streams.rule(self.current_user, rule_id)
        if current is not None and current["kind"] == "monitor" and "value" in fields:
            raise ApiError(409, "A monitor's account cannot change: add a monitor of the other account")
        await not_suspended(self, body.get("active"))
        done = await self.services.streams.change(self.current_user, rule_id, fields, body.get("active"))
        if done is None:
            raise ApiError(404, "Rule not found")
        self.send_json(self.services.streams.row(done))

    @authenticated
    async def delete(self, rule_id: str) -> None:
        streams = self.services.streams
        current = await streams.rule(self.current_user, rule_id)  # a rule or a monitor: its kind's place is freed
        if current is None or not await streams.delete(self.current_user, rule_id, current["kind"]):
            raise ApiError(404, "Rule not found")
        self.send_json({"ok": True})


class StreamEventsHandler(BaseHandler):
    @authenticated
    async def get(self, rule_id: str) -> None:
        if await self.services.streams.rule(self.current_user, rule_id) is None:
            raise ApiError(404, "Rule not found")
        limit = self.query_arg(EVENTS_LIMIT)
        events = await self.services.streams.events(rule_id, limit)
        self.send_json([{**polls.message(e), "created_at": e["created_at"]} for e in events])


_ID = r"([A-Za-z0-9_]{1,64})"
routes = [
    (r"/oapi/tweet_filter/add_rule", AddRuleHandler),
    (r"/oapi/tweet_filter/update_rule", UpdateRuleHandler),
    (r"/oapi/tweet_filter/delete_rule", DeleteRuleHandler),
    (r"/oapi/tweet_filter/get_rules", GetRulesHandler),
    (r"/oapi/x_user_stream/add_user_to_monitor_tweet", AddMonitorHandler),
    (r"/oapi/x_user_stream/remove_user_to_monitor_tweet", RemoveMonitorHandler),
    (r"/oapi/my/info", MyInfoHandler),
    (r"/streams", StreamsHandler),
    (rf"/streams/{_ID}", StreamHandler),
    (rf"/streams/{_ID}/events", StreamEventsHandler),
]
# Before the data prefixes' catch-all 404 (gateway.make_app puts them first).
socket_routes = [(r"/social/tweet/websocket", TweetSocket), (r"/twitter/tweet/websocket", TweetSocket)]
