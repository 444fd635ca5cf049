"""The base handler: context, request id, JSON bodies and the single JSON error shape.

Client-facing messages come only from HTTPError(reason=...) or ValidationError;
exception text goes to the log, never to the client.
"""

import functools
import ipaddress
import itertools
import logging
import re
import time
import uuid
from typing import Any

import orjson
import tornado.web
from pymongo.errors import ConnectionFailure

from handlers.context import Context
from handlers.validation import ValidationError, error
from security import tokens

log = logging.getLogger("gateway.access")

# Request ids: unique per process start plus a counter; cheaper than a uuid4 (a syscall) per request.
_ID_PREFIX = uuid.uuid4().hex[:12]
_ID_COUNTER = itertools.count()


def next_request_id() -> str:
    return f"{_ID_PREFIX}{next(_ID_COUNTER):08x}"


_REASONS = {
    400: "Bad request",
    401: "Not authenticated",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    409: "Conflict",
    413: "Request body too large",
    422: "Invalid input",
    500: "Internal server error",
    501: "Not implemented",
    502: "Bad gateway",
    503: "Service unavailable",
    504: "Gateway timeout",
}


class ApiError(tornado.web.HTTPError):
    """An error whose `message` is safe to show to the client."""

    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(status, reason=_REASONS.get(status))
        self.message = message
        self.extra_headers = headers or {}


class BaseHandler(tornado.web.RequestHandler):
    ctx: Context

    def initialize(self, ctx: Context, **kwargs: Any) -> None:
        self.ctx = ctx
        self.started = time.perf_counter()
        self.account_id: str | None = None
        self.session: tokens.Session | None = None  # a valid session token's, set by prepare()
        self.log_fields: dict = {}
        self.kept_headers: dict = {}
        incoming = self.request.headers.get("X-Request-ID", "")
        # Accept a caller's id only if it is short and plain, so logs cannot be forged through it.
        ok = 0 < len(incoming) <= 64 and incoming.replace("-", "").replace("_", "").isalnum()
        self.request_id = incoming if ok else next_request_id()
        self.keep_header("X-Request-ID", self.request_id)

    def keep_header(self, name: str, value) -> None:
        """A header that stays on the answer even when an error replaces it (request id, rate limits)."""
        self.kept_headers[name] = value
        self.set_header(name, value)

    def set_default_headers(self) -> None:
        # Also runs when an error clears the headers.
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Content-Type-Options", "nosniff")
        self.clear_header("Server")  # Tornado's names its version: nothing to tell a scanner
        # Tornado calls this before initialize() too, when kept_headers does not exist yet.
        for name, value in getattr(self, "kept_headers", {}).items():
            self.set_header(name, value)

    def compute_etag(self) -> None:
        # API answers are not cached by clients; hashing every body would only cost CPU.
        return None

    def send_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(orjson.dumps(data, option=orjson.OPT_NAIVE_UTC))

    def error_body(self, status: int, message: str) -> dict:
        """Portal errors: {"detail": message}; the data plane overrides this."""
        return {"detail": message}

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        self.clear_header("Retry-After")
        if isinstance(exc, ValidationError):
            self.set_status(422)
            body = {"detail": exc.errors}
        else:
            if isinstance(exc, ApiError):
                message = exc.message
                for name, value in exc.extra_headers.items():
                    self.set_header(name, value)
            else:
                message = _REASONS.get(status_code, self._reason)
            body = self.error_body(status_code, message)
        if status_code == 405:  # RFC 9110: a 405 lists the methods the resource supports
            self.set_header("Allow", ", ".join(self.allowed_methods()))
        self.finish(orjson.dumps(body))

    def allowed_methods(self) -> list[str]:
        return [
            m
            for m in self.SUPPORTED_METHODS
            if getattr(type(self), m.lower(), None) is not getattr(tornado.web.RequestHandler, m.lower(), None)
        ]

    def log_exception(self, typ, value, tb) -> None:
        if isinstance(value, (ValidationError, tornado.web.HTTPError)):
            return
        log.error(
            "unhandled error in %s %s (request %s)",
            self.request.method,
            self.request.path,
            getattr(self, "request_id", "-"),
            exc_info=(typ, value, tb),
        )

    def _handle_request_exception(self, e: BaseException) -> None:
        # ValidationError is a client error: answer 422 rather than 500.
        if isinstance(e, ValidationError):
            if not self._finished:
                self.send_error(422, exc_info=(type(e), e, e.__traceback__))
            return
        # The database is down or unreachable (after the driver's server selection timeout): a
        # temporary condition the client should retry, not a server bug. Nothing was charged.
        if isinstance(e, ConnectionFailure):
            log.warning(
                "database unavailable in %s %s (request %s): %s",
                self.request.method,
                self.request.path,
                self.request_id,
                type(e).__name__,
            )
            if not self._finished:
                unavailable = ApiError(
                    503, "The service cannot reach its database; retry shortly", {"Retry-After": "1"}
                )
                self.send_error(503, exc_info=(ApiError, unavailable, None))
            return
        super()._handle_request_exception(e)

    # --- bodies ---------------------------------------------------------------------------
    def json_body(self) -> Any:
        body = self.request.body
        if len(body) > self.ctx.settings.max_body_bytes:
            raise ApiError(413, f"Request body is larger than {self.ctx.settings.max_body_bytes} bytes")
        if not body.strip():
            raise ValidationError([error(["body"], "Field required", "missing")])
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            raise ValidationError([error(["body"], "JSON decode error", "json_invalid")]) from None

    # --- session authentication -------------------------------------------------------------
    def bearer_token(self) -> str | None:
        scheme, _, token = self.request.headers.get("Authorization", "").partition(" ")
        return token.strip() if scheme.lower() == "bearer" and token.strip() else None

    async def prepare(self) -> None:
        # The session is checked here, before any handler code, where I/O is possible: a token whose
        # account is gone, that was logged out, or that predates a password change is refused (401) by
        # bearer_account() before anything is read or written. From memory on the usual path.
        token = self.bearer_token()
        if token is not None:
            self.session = await self.ctx.sessions.check(token)

    def bearer_account(self) -> str:
        """The account id of a valid session token, else 401."""
        if self.bearer_token() is None:
            raise ApiError(401, "Not authenticated", {"WWW-Authenticate": "Bearer"})
        if self.session is None:
            raise ApiError(401, "Invalid or expired token", {"WWW-Authenticate": "Bearer"})
        self.account_id = self.session.account_id
        return self.session.account_id

    async def current_account(self) -> dict:
        account = await self.ctx.accounts.get(self.bearer_account())
        if account is None:
            raise ApiError(401, "Invalid or expired token", {"WWW-Authenticate": "Bearer"})
        return account

    def is_admin(self, account: dict) -> bool:
        # Only the operator's `admin grant` sets the flag: registering a listed address grants nothing.
        return bool(account.get("is_admin"))

    # --- client address -------------------------------------------------------------------------
    def client_ip(self) -> str:
        """The caller's address; X-Forwarded-For / X-Real-IP count only when the peer is in TRUSTED_PROXIES."""
        peer = self.request.remote_ip
        networks = _networks(self.ctx.settings.trusted_proxies)
        if not networks or not _within(_address(peer), networks):
            return peer
        hops = [h.strip() for h in self.request.headers.get("X-Forwarded-For", "").split(",") if h.strip()]
        real = self.request.headers.get("X-Real-IP", "").strip()
        hops = hops or ([real] if real else [])
        # Walk back from the nearest hop: the first address that is not one of our proxies is the client;
        # anything left of it was written by the client and proves nothing.
        for hop in reversed(hops):
            address = _address(hop)
            if address is None:
                return peer
            if not _within(address, networks):
                return str(address)
        return str(_address(hops[0])) if hops else peer

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
        status = self.get_status()
        route = self.route_label()
        seconds = time.perf_counter() - self.started
        self.ctx.metrics.requests[(route, status)] += 1
        self.ctx.metrics.latency.labels(route).observe(seconds)
        if self.ctx.settings.access_log and log.isEnabledFor(logging.INFO):
            log.info(
                "%s",
                orjson.dumps(
                    {
                        "request_id": getattr(self, "request_id", None),
                        "method": self.request.method,
                        "route": route,
                        "status": status,
                        "ms": round(seconds * 1000, 2),
                        "ip": self.client_ip(),
                        "account": self.account_id,
                        **self.log_fields,
                    }
                ).decode(),
            )


_ROUTE_LABELS: dict[type, str | None] = {}


@functools.lru_cache(maxsize=8)
def _networks(trusted: tuple) -> tuple:
    return tuple(ipaddress.ip_network(n) for n in trusted)


def _address(text: str):
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    return address.ipv4_mapped or address if address.version == 6 else address


def _within(address, networks: tuple) -> bool:
    return address is not None and any(address in network for network in networks)


class NotFoundHandler(BaseHandler):
    """Unknown paths: JSON 404."""

    def initialize(self, ctx: Context, **kwargs: Any) -> None:
        super().initialize(ctx, **kwargs)
        self.log_fields["route"] = "(unmatched)"  # one label for every unknown path, whatever the method

    def prepare(self) -> None:
        raise ApiError(404, "Not found")
