"""The Idempotency-Key header over HTTP (the rules: accounting/idempotency.py): its one declaration (read here,
documented from it by handlers/openapi_paths.py), the answers it adds (422 for a bad or reused key, 409 while
the first still runs or when its answer was too large to keep, a replay), and `idempotent`, which makes a
portal write that creates something (a key, an order, credits) safe to retry.

A key is the customer's text: it is never logged (the access line carries the request id, not the key).
"""

import functools
import re

import orjson

from accounting.idempotency import Answer, Claim, KeyReused, StillRunning
from handlers.errors import ApiError, ValidationError, error
from handlers.validation import Field, check_length

HEADER = "Idempotency-Key"
KEY = Field(
    HEADER,
    str,
    required=False,
    min_length=1,
    max_length=255,
    description="A key you choose for this request (printable ASCII), kept for IDEMPOTENCY_TTL (24 h): sent "
    "again with the same request it returns the first answer (charged 0, Idempotent-Replayed: true); with "
    "another request, 422",
)
# Printable ASCII, neither starting nor ending with a space (HTTP drops those); the OpenAPI document states it.
PATTERN = "^[!-~](?:[ -~]*[!-~])?$"
_PRINTABLE = re.compile(PATTERN)
_LOC = ["header", HEADER]


def idempotency_key(headers) -> str | None:
    """The key in a request's `headers`, None without the header; 422 for an empty, too long or non-printable one (`" a "` too).
    The draft's quoted form (`"abc"`, a structured-field string) names the same key as `abc`."""
    value = headers.get(HEADER)
    if value is None:
        return None
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    check_length(value, _LOC, KEY.min_length, KEY.max_length)
    if not _PRINTABLE.fullmatch(value):
        raise ValidationError(
            [
                error(
                    _LOC,
                    "String should be printable ASCII, not starting or ending with a space",
                    "string_pattern_mismatch",
                )
            ]
        )
    return value


async def start(handler, account_id: str, key: str, request: str) -> Claim | Answer:
    """The kept answer to replay, or the claim to run `request` under (accounting/idempotency.py)."""
    try:
        return await handler.ctx.data.idempotency.begin(account_id, key, request)
    except KeyReused:
        raise ValidationError(
            [
                error(
                    _LOC,
                    "This Idempotency-Key was used for a different request (another endpoint, query or body); "
                    "use a new key for a new request",
                    "idempotency_key_reused",
                )
            ]
        ) from None
    except StillRunning as exc:
        raise ApiError(
            409,
            "The first request with this Idempotency-Key is still under way; retry with the same key after Retry-After",
            {"Retry-After": str(exc.retry_after)},
        ) from None


def kept_body(answer: Answer) -> bytes:
    """The body to replay; 409 when the first answer was too large to keep (it was charged; this is not)."""
    if answer.body is None:
        raise ApiError(
            409,
            f"The first answer to this Idempotency-Key (request {answer.request_id}) was charged but was too large "
            "to keep, so it cannot be sent again; nothing was charged now. Send a new Idempotency-Key to call again",
        )
    return answer.body


def send_replay(handler, answer: Answer, body: bytes) -> None:
    """The first answer again, with its status and request id, marked as a replay."""
    handler.set_header("Idempotent-Replayed", "true")
    handler.keep_header("X-Request-ID", answer.request_id)
    handler.set_status(answer.status)
    handler.finish(body)


def _request(handler) -> str:
    """What a repeat must match: method, path and the body's JSON (key order does not count)."""
    body = handler.request.body
    try:
        body = orjson.dumps(orjson.loads(body), option=orjson.OPT_SORT_KEYS)
    except orjson.JSONDecodeError:
        pass  # not JSON (the handler answers 422): the bytes as sent
    return f"{handler.request.method} {handler.request.path}\n{body.decode('utf-8', 'replace')}"


def idempotent(method):
    """A portal write sent again with the same Idempotency-Key answers what the first did (its 2xx answer is
    kept, sealed: a new key's secret is in it) instead of creating a second key, order or top-up. Errors are
    not kept: a retry runs again. Goes under @authenticated."""

    @functools.wraps(method)
    async def wrapper(self, *args) -> None:
        key = idempotency_key(self.request.headers)
        if key is None:
            return await method(self, *args)
        found = await start(self, self.current_user, key, _request(self))
        if isinstance(found, Answer):
            return send_replay(self, found, self.ctx.data.vault.unseal(kept_body(found), found.request_id))
        self.held = []  # send_json holds the answer until it is kept
        kept = None
        try:
            await method(self, *args)
            if self.held and 200 <= self.get_status() < 300:
                kept = Answer(
                    self.get_status(), self.ctx.data.vault.seal(self.held[0], self.request_id), 0, self.request_id
                )
        finally:
            await self.ctx.data.idempotency.end(found, kept)
        self.finish(self.held[0])

    wrapper.idempotent = True  # handlers/openapi_operations.py documents the header on exactly these
    return wrapper
