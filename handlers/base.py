"""The base handler: context, request id, JSON bodies, the session, and the single JSON error path.

Client-facing messages come only from ApiError (ValidationError is its 422 form); every error
reaches the client through Tornado's write_error, and exception text goes to the log, never to
the client. Sessions: get_current_user reads the bearer token; @authenticated and @admin_only
guard the methods that need one. The session token comes from `Authorization: Bearer` or, for the
web portal, from its HttpOnly cookie (bearer_token); cookie-authenticated writes need the XSRF token.
"""

import functools
import ipaddress
import itertools
import logging
import os
import re
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import orjson
import tornado.web
from pymongo.errors import ConnectionFailure
from tornado import httputil

from config.settings import Settings
from handlers.context import HandlerContext, Services
from handlers.errors import REASONS, ApiError, ValidationError, error, missing, portal_error
from handlers.validation import Field, parse_query
from security import roles, tokens
from security.addresses import parse_address, within

log = logging.getLogger("gateway.errors")  # unhandled errors (access lines: runtime/accesslog.py)

# Request ids: unique per process start plus a counter; cheaper than a uuid4 (a syscall) per request.
_ID_PREFIX, _ID_COUNTER = "", itertools.count()


def _new_id_prefix() -> None:
    global _ID_PREFIX, _ID_COUNTER
    _ID_PREFIX, _ID_COUNTER = uuid.uuid4().hex[:12], itertools.count()


_new_id_prefix()
# `serve --workers N` forks after this module is imported: each worker (and each restart) needs its own
# prefix, or workers hand out the same ids and a charge no longer matches one call.
os.register_at_fork(after_in_child=_new_id_prefix)


def next_request_id() -> str:
    return f"{_ID_PREFIX}{next(_ID_COUNTER):08x}"


# A caller's X-Request-ID is kept only if short and plain ASCII, so logs cannot be forged through it.
_CLIENT_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def request_id(incoming: str) -> str:
    """The id of a request: the caller's X-Request-ID when acceptable, else a new one."""
    return incoming if _CLIENT_ID.fullmatch(incoming) else next_request_id()


def timestamp(moment: datetime) -> str:
    """The one time format of every JSON answer: ISO 8601 UTC, milliseconds, `Z`.

    Milliseconds are truncated, as MongoDB stores them, so a value read back equals the one first returned."""
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return timestamp(value)
    raise TypeError(type(value).__name__)


def dumps(data: Any, option: int = 0) -> bytes:
    """JSON for an answer; datetimes (naive ones are UTC) in the format of `timestamp`."""
    return orjson.dumps(data, default=_json_default, option=orjson.OPT_PASSTHROUGH_DATETIME | option)


# The database is down or unreachable (after the driver's server selection timeout): a temporary
# condition the client should retry, not a server bug. Nothing was charged.
DATABASE_UNAVAILABLE = ApiError(503, "The service cannot reach its database; retry shortly", {"Retry-After": "1"})


def authenticated(method):
    """The method runs only for a valid session (self.current_user); otherwise 401 with WWW-Authenticate."""

    @functools.wraps(method)
    def wrapper(self: "BaseHandler", *args, **kwargs):
        if self.current_user is None:
            message = "Invalid or expired token" if self.bearer_token() else "Not authenticated"
            raise ApiError(401, message, {"WWW-Authenticate": "Bearer"})
        return method(self, *args, **kwargs)

    return wrapper


def admin_only(method):
    """The method runs only for an admin's session: 401 without a valid token, 403 for everyone else, and 403
    for an admin without two-factor sign-in when ADMIN_REQUIRE_2FA is on."""

    @authenticated
    @functools.wraps(method)
    async def wrapper(self: "BaseHandler", *args, **kwargs):
        person = await self.current_person()  # admin and its second factor are the person's, not the account's
        if not self.is_admin(person):
            raise ApiError(403, "Admins only")
        if self.config.admin_require_2fa and not (person.get("totp") or {}).get("enabled"):
            raise ApiError(
                403,
                "Admins must sign in with a second factor (ADMIN_REQUIRE_2FA): enrol two-factor sign-in in the "
                "portal (Security) or with POST /auth/2fa/setup",
            )
        return await method(self, *args, **kwargs)

    return wrapper


class Anonymous(tornado.web.RequestHandler):
    """No `Server` header on any answer (Tornado's names its version: nothing to tell a scanner). clear() is
    where Tornado sets it, for every answer and again before an error page; every handler of the application
    derives from this one, the static files' included (portal/pages.py).

    clear() is Tornado's own (RequestHandler.clear) without the Server header, and with the Date formatted once
    a second: Tornado formats it through email.utils for every answer."""

    def clear(self) -> None:
        self._headers = httputil.HTTPHeaders({"Content-Type": "text/html; charset=UTF-8", "Date": http_date()})
        self.set_default_headers()
        self._write_buffer = []
        self._status_code = 200
        self._reason = "OK"


_DATE = [-1, ""]  # the second http_date last formatted, and its text


def http_date() -> str:
    """The Date header's value for now (RFC 9110's IMF-fixdate), formatted once per second."""
    now = int(time.time())
    if now != _DATE[0]:
        _DATE[:] = now, httputil.format_timestamp(now)
    return _DATE[1]


def answer_headers(own: dict, body: bytes) -> httputil.HTTPHeaders:
    """The headers of an answer written without a RequestHandler (a data call, an MCP message on the front's own
    connection): the defaults every BaseHandler answer carries, then its own, then the body's length."""
    headers = httputil.HTTPHeaders()
    headers["Content-Type"] = "application/json"
    headers["Date"] = http_date()
    headers["Cache-Control"] = "no-store"
    headers["X-Content-Type-Options"] = "nosniff"
    for name, value in own.items():
        headers[name] = value
    headers["Content-Length"] = str(len(body))
    return headers


class BaseHandler(Anonymous):
    ctx: HandlerContext  # what this process's handlers see (handlers/context.py): services, no store
    acting: dict | None = None  # the member a sign-in acts as, before it has a session (handlers/auth/)
    held: list | None = None  # an idempotent write's answer, held by send_json until kept (handlers/idempotent.py)

    def initialize(self, ctx: HandlerContext, **kwargs: Any) -> None:
        self.ctx = ctx
        self.started = time.perf_counter()
        self.account_id: str | None = None
        self.person_id: str | None = None  # who signed in (storage/members.py); the account is account_id
        self.session: tokens.Session | None = None  # a valid session token's, set by prepare()
        self.log_fields: dict = {}
        self.kept_headers: dict = {}
        self.request_id = request_id(self.request.headers.get("X-Request-ID", ""))
        self.keep_header("X-Request-ID", self.request_id)

    @property
    def services(self) -> Services:
        """Each area's service: what a handler calls (`self.services.keys`)."""
        return self.ctx.services

    @property
    def config(self) -> Settings:
        """The gateway's settings as they are now (a reload replaces them); `settings` is Tornado's own."""
        return self.ctx.state.settings

    def keep_header(self, name: str, value) -> None:
        """A header that stays on the answer even when an error replaces it (request id, rate limits)."""
        self.kept_headers[name] = value
        self.set_header(name, value)

    def set_default_headers(self) -> None:
        # Also runs when an error clears the headers.
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Content-Type-Options", "nosniff")
        # Tornado calls this before initialize() too, when kept_headers does not exist yet.
        for name, value in getattr(self, "kept_headers", {}).items():
            self.set_header(name, value)

    def compute_etag(self) -> None:
        # API answers are not cached by clients; hashing every body would only cost CPU.
        return None

    def check_etag_header(self) -> bool:
        # Without an ETag no If-None-Match can match (Tornado's own check reads the header to learn as much).
        return False

    def send_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        if self.held is not None:
            self.held.append(dumps(data))
            return
        self.finish(dumps(data))

    def error_body(self, status: int, message: str) -> dict:
        """Portal errors: {"detail": message}; the data plane overrides this."""
        return portal_error(message)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        self.clear_header("Retry-After")
        status, headers, body = error_answer(exc, status_code, self._reason, self.error_body)
        if status != status_code:
            self.set_status(status)
        for name, value in headers.items():
            self.set_header(name, value)
        if status == 405:  # RFC 9110: a 405 lists the methods the resource supports
            self.set_header("Allow", ", ".join(self.allowed_methods()))
        self.finish(body)

    def allowed_methods(self) -> list[str]:
        return [
            m
            for m in self.SUPPORTED_METHODS
            if getattr(type(self), m.lower(), None) is not getattr(tornado.web.RequestHandler, m.lower(), None)
        ]

    def log_exception(self, typ, value, tb) -> None:
        log_failure(self.request.method, self.request.path, getattr(self, "request_id", "-"), value)

    # --- bodies ---------------------------------------------------------------------------
    def json_body(self) -> Any:
        body = self.request.body
        if len(body) > self.config.max_body_bytes:
            raise ApiError(413, f"Request body is larger than {self.config.max_body_bytes} bytes")
        if not body.strip():
            raise ValidationError([missing(["body"])])
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            raise ValidationError([error(["body"], "JSON decode error", "json_invalid")]) from None

    def query_arg(self, field: Field) -> Any:
        """A declared query parameter, checked against its declaration (absent: the declared default)."""
        return parse_query(field, self.get_query_argument(field.name, None))

    # --- session authentication -------------------------------------------------------------
    # Browsers send cookies on their own, so writes authenticated by the portal's cookie need the page's
    # XSRF token; handlers that set or clear that cookie (portal login, logout) need it always.
    xsrf_always = False

    def session_cookie(self) -> str:
        """The portal's cookie name; in production the __Host- prefix pins it to this exact origin over HTTPS.
        Named for this service: browsers share localhost cookies across ports, so "session" would collide."""
        return "__Host-gw_session" if self.config.production else "gw_session"

    def bearer_token(self) -> str | None:
        """The session token the request carries, if any: the one place that reads it.

        `Authorization: Bearer`, else the web portal's HttpOnly cookie; an explicit header wins, and a
        cookie beside it is ignored."""
        header = self.request.headers.get("Authorization")
        if header is not None:
            scheme, _, token = header.partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
        return self.get_cookie(self.session_cookie()) or None

    def check_xsrf_cookie(self) -> None:
        """Tornado's XSRF check, for cookie-authenticated writes only: a bearer token or an API key cannot be
        attached by another site, so those requests (and requests with no credentials) need no XSRF token."""
        if self.request.method not in self.allowed_methods():
            return  # 405 follows; nothing will be done
        cookie_auth = "Authorization" not in self.request.headers and self.get_cookie(self.session_cookie())
        if not (cookie_auth or self.xsrf_always):
            return
        try:
            super().check_xsrf_cookie()
        except tornado.web.HTTPError:
            raise ApiError(403, "Missing or invalid XSRF token: reload the page and try again") from None

    async def prepare(self) -> None:
        # The session is checked here, before any handler code, where I/O is possible: a token whose
        # account is gone, that was logged out, or that predates a password change, or whose claims
        # have the wrong types, leaves no current user, so @authenticated answers 401 before anything
        # is read or written. From memory on the usual path (services/sessions.py).
        token = self.bearer_token()
        if token is not None:
            self.session = await self.services.sessions.check(token)
            if self.session is not None:
                self.check_role(self.session)

    def check_role(self, session: tokens.Session) -> None:
        """403 unless the member's role may call this route's operation: its least role, declared once in the
        OpenAPI operations (handlers/openapi_operations.py `Operation.role`), mapped to routes by make_app."""
        op = self.application.settings.get("operations", {}).get((type(self), self.request.method))
        if op is None or roles.allows(session.role, op.role):
            return
        if op.or_self and session.member_id in self.path_args:
            return  # a member's own id: leaving
        raise ApiError(403, roles.refusal(op.role))

    def get_current_user(self) -> str | None:
        """The account id of the valid session prepare() found; Tornado caches it."""
        if self.session is None:
            return None
        self.account_id, self.person_id = self.session.account_id, self.session.person_id
        return self.session.account_id

    async def current_account(self) -> dict:
        """The session's account document; 401 when the account no longer exists. Needs @authenticated."""
        account = await self.services.auth.account(self.current_user)
        if account is None:
            raise ApiError(401, "Invalid or expired token", {"WWW-Authenticate": "Bearer"})
        return account

    async def current_person(self) -> dict:
        """The sign-in of the person behind the session (email, 2FA, admin flag). Needs @authenticated."""
        if self.current_user is not None and self.person_id == self.account_id:
            return await self.current_account()  # a person's own account carries their sign-in
        person = await self.services.auth.account(self.person_id) if self.person_id else None
        if person is None:
            raise ApiError(401, "Invalid or expired token", {"WWW-Authenticate": "Bearer"})
        return person

    def member(self) -> dict | None:
        """Who acted, for the audit log and the records a member creates: {member_id, email}."""
        session = self.session
        if session is not None and session.member_id:
            return {"member_id": session.member_id, "email": session.email}
        return self.acting  # signing in: the member the new session is for (handlers/auth/)

    async def audit(
        self, action: str, account_id: str | None = None, details: dict | None = None, admin: bool = False
    ) -> None:
        """An audit-log entry (services/audit.py) by this request's account (`admin`: acting as an admin, on
        `account_id`), from its address. account_id defaults to the session's own account."""
        actor_id = self.account_id or self.current_user  # None: not signed in (a failed login)
        acting_admin = await self.current_account() if admin else None
        target = account_id if account_id is not None else actor_id
        # The member who acted, on their own account's entries (an admin acting on another account is the actor).
        member = self.member() if not admin and target == self.account_id else None
        await self.services.audit.record(action, target, actor_id, self.client_ip(), details, member, acting_admin)

    def is_admin(self, account: dict) -> bool:
        # Only the operator's `admin grant` sets the flag: registering a listed address grants nothing.
        return bool(account.get("is_admin"))

    # --- client address -------------------------------------------------------------------------
    def client_ip(self) -> str:
        """The caller's address; X-Forwarded-For / X-Real-IP count only when the peer is in TRUSTED_PROXIES."""
        return client_address(self.request.remote_ip, self.request.headers, self.config.trusted_proxies)

    def route_label(self) -> str:
        """The matched route pattern, not the path: metric labels must not grow with key or order ids."""
        route = self.log_fields.get("route")
        if route:
            return route
        cls = type(self)
        if cls not in _ROUTE_LABELS:  # once per handler class: its one route's pattern, parameters as {}
            patterns = [
                rule.matcher.regex.pattern for rule in self.application.wildcard_router.rules if rule.target is cls
            ]
            _ROUTE_LABELS[cls] = (
                re.sub(r"\\(.)", r"\1", re.sub(r"\([^)]*\)", "{}", patterns[0].rstrip("$")))
                if len(patterns) == 1
                else None
            )
        return _ROUTE_LABELS[cls] or self.request.path

    def on_finish(self) -> None:
        answered(
            self.ctx,
            self.request.method,
            self.route_label(),
            self.get_status(),
            self.started,
            getattr(self, "request_id", None),
            self.client_ip,
            self.account_id,
            self.log_fields,
        )


def answered(ctx, method, route, status, started, request_id, client_ip, account_id, log_fields) -> None:
    """An answer sent: its count and latency in /metrics, and its access line (`client_ip` is called only for
    the line). BaseHandler.on_finish and the data plane's calls (handlers/data_call.py) alike."""
    seconds = time.perf_counter() - started
    ctx.runtime.metrics.requests[(route, status)] += 1
    ctx.runtime.metrics.latency.observe(route, seconds)
    if ctx.state.settings.access_log and ctx.runtime.access_log.enabled:
        ctx.runtime.access_log.write(
            {
                "request_id": request_id,
                "method": method,
                "route": route,
                "status": status,
                "ms": round(seconds * 1000, 2),
                "ip": client_ip(),
                "account": account_id,
                **log_fields,
            }
        )


def error_answer(exc, status: int, reason: str, error_body) -> tuple[int, dict, bytes]:
    """The answer to an error (the one error path, after Tornado's own set the status and `reason`, its phrase):
    its status, the headers it adds and its JSON body, in the part's shape (`error_body`)."""
    if isinstance(exc, ConnectionFailure):
        exc, status = DATABASE_UNAVAILABLE, DATABASE_UNAVAILABLE.status_code
    headers = {}
    if isinstance(exc, ValidationError):
        body = {"detail": exc.errors}
    else:
        if isinstance(exc, ApiError):
            message = exc.message
            headers.update(exc.extra_headers)
        else:
            message = REASONS.get(status, reason)
        body = error_body(status, message)
    if status in (429, 503) and "Retry-After" not in headers:
        headers["Retry-After"] = "1"  # every 429 and 503 says when to retry
    return status, headers, orjson.dumps(body)


def log_failure(method: str, path: str, request_id: str, value: BaseException) -> None:
    """An exception that ended a request: client errors are not logged, a database away is a warning, anything
    else an error with its traceback."""
    if isinstance(value, tornado.web.HTTPError):  # ApiError and ValidationError included: client errors
        return
    if isinstance(value, ConnectionFailure):
        log.warning("database unavailable in %s %s (request %s): %s", method, path, request_id, type(value).__name__)
        return
    log.error("unhandled error in %s %s (request %s)", method, path, request_id, exc_info=value)


def client_address(peer: str, headers, trusted: tuple) -> str:
    """The caller's address; X-Forwarded-For / X-Real-IP count only when the peer is in `trusted` (proxies)."""
    networks = _networks(trusted)
    if not networks or not within(parse_address(peer), networks):
        return peer
    hops = [h.strip() for h in headers.get("X-Forwarded-For", "").split(",") if h.strip()]
    real = headers.get("X-Real-IP", "").strip()
    hops = hops or ([real] if real else [])
    # Walk back from the nearest hop: the first address that is not one of our proxies is the client;
    # anything left of it was written by the client and proves nothing.
    for hop in reversed(hops):
        address = parse_address(hop)
        if address is None:
            return peer
        if not within(address, networks):
            return str(address)
    return str(parse_address(hops[0])) if hops else peer


_ROUTE_LABELS: dict[type, str | None] = {}


@functools.lru_cache(maxsize=8)
def _networks(trusted: tuple) -> tuple:
    return tuple(ipaddress.ip_network(n) for n in trusted)


class NotFoundHandler(BaseHandler):
    """Unknown paths: JSON 404."""

    def initialize(self, ctx: HandlerContext, **kwargs: Any) -> None:
        super().initialize(ctx, **kwargs)
        self.log_fields["route"] = "(unmatched)"  # one label for every unknown path, whatever the method

    def prepare(self) -> None:
        raise ApiError(404, "Not found")
