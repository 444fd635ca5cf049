"""Idempotency keys: a request repeated with the same Idempotency-Key gets the first answer, charged once.

The first request with a key (scoped to the account) *claims* it: one insert whose (account, key) _id lets
one process win (storage/idempotency.py). It runs, and its answer, if worth keeping (a charged data answer,
a created key or order), is stored with the claim and replayed to every repeat of the same request until
IDEMPOTENCY_TTL ends. The same key with a different request (endpoint, query, body) is refused
(KeyReused: 422). A repeat while the first still runs waits for it: in this process on the first's outcome
(no database round trip), in another by reading the document every 20-250 ms, for at most as long as the
first can take (UPSTREAM_CONNECT_TIMEOUT + UPSTREAM_TIMEOUT); past that, StillRunning (409, Retry-After).

A claim is a lease, not a lock: one left by a process that died ends LEASE_MARGIN after the longest a call
can take, and the next repeat runs the request again (a claim that never ends would refuse the key forever,
with nothing charged: OpenMeter #5118). Taking a claim over changes its owner, and only the owner can store
an answer (`end`), so a late owner stores nothing and its caller does not charge (handlers/social.py): two
runs of one key are never both charged.

An answer not worth keeping (an error, anything not charged) gives the key up (`end(claim, None)`): a retry
runs again. Bodies are bounded: IDEMPOTENCY_MAX_BODY_BYTES each, IDEMPOTENCY_MAX_ACCOUNT_BYTES per account
within the TTL (counted by this process, by the hour); past either the answer is kept without its body, so
that a repeat still learns the first was charged (and is refused rather than charged again).
"""

import asyncio
import hashlib
import itertools
import logging
import math
import time
import uuid
from collections import deque
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from config.settings import Settings
from runtime.metrics import Metrics
from storage.idempotency import IdempotencyStore

log = logging.getLogger("gateway.idempotency")

# Seconds a claim outlives the longest a call can take: a provider key's wait for its rate (up to 1 s,
# social/provider_keys.py) and storing the answer.
LEASE_MARGIN = 3.0
FIRST_POLL, LAST_POLL = 0.02, 0.25  # seconds between reads of another process's claim, doubling
HOUR = 3600


@dataclass(frozen=True)
class Answer:
    """A kept answer. `body` is None when it was too large to keep: the first call was charged all the same."""

    status: int
    body: bytes | None
    charged: int
    request_id: str  # the first call's
    provider: str = ""  # a data call's: the provider that produced the answer (X-Provider on a replay too)


@dataclass(eq=False)
class Claim:
    """This process runs the keyed request; `Idempotency.end` keeps its answer or gives the key up."""

    doc_id: str
    owner: str
    account_id: str
    outcome: asyncio.Future  # what repeats waiting in this process get: the kept Answer, or None
    ended: bool = False


class KeyReused(Exception):
    """The key names a different request (422)."""


class StillRunning(Exception):
    """The first request with the key still runs after the wait (409); retry after `retry_after` seconds."""

    def __init__(self, retry_after: int):
        super().__init__(retry_after)
        self.retry_after = retry_after


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class Idempotency:
    def __init__(self, settings: Settings, store: IdempotencyStore, metrics: Metrics, clock=time.monotonic):
        self.store, self.metrics, self.clock = store, metrics, clock
        self.wait = settings.upstream_connect_timeout + settings.upstream_timeout
        self.lease = timedelta(seconds=self.wait + LEASE_MARGIN)
        self.ttl = timedelta(seconds=settings.idempotency_ttl)
        self.max_body, self.max_account = settings.idempotency_max_body_bytes, settings.idempotency_max_account_bytes
        self._ttl_hours = math.ceil(settings.idempotency_ttl / HOUR)
        self._owner_prefix, self._owners = uuid.uuid4().hex[:12], itertools.count()
        # doc id -> (request digest, outcome) of the request with that key this process handles now.
        self.handling: dict[str, tuple[str, asyncio.Future]] = {}
        self._kept: dict[str, deque[list[int]]] = {}  # account -> [[hour, body bytes kept], ...], oldest first

    async def begin(self, account_id: str, key: str, request: str) -> Claim | Answer:
        """The kept answer to replay, or the claim to run `request` under; KeyReused, StillRunning."""
        doc_id, request = f"{account_id}:{_digest(key)}", _digest(request)
        give_up = self.clock() + self.wait
        while (held := self.handling.get(doc_id)) is not None:
            if held[0] != request:
                raise KeyReused()
            try:
                answer = await asyncio.wait_for(asyncio.shield(held[1]), max(0.0, give_up - self.clock()))
            except TimeoutError:
                raise StillRunning(1) from None
            if answer is not None:
                self.metrics.idempotent_replays += 1
                return answer
            # The first gave the key up (nothing kept): this repeat runs it, or follows whoever does now.
        outcome = asyncio.get_running_loop().create_future()
        self.handling[doc_id] = (request, outcome)
        try:
            found = await self._claim(doc_id, request, give_up)
        except BaseException:
            self._settle(doc_id, outcome, None)
            raise
        if isinstance(found, Answer):
            self._settle(doc_id, outcome, found)
            self.metrics.idempotent_replays += 1
            return found
        self.metrics.idempotent_claims += 1
        return Claim(doc_id, found, account_id, outcome)

    async def _claim(self, doc_id: str, request: str, give_up: float) -> str | Answer:
        """Claims the key in the database (the owner id), or returns its kept answer, waiting while another
        process runs it."""
        pause = FIRST_POLL
        while True:
            owner = f"{self._owner_prefix}-{next(self._owners):x}"
            if await self.store.claim(doc_id, request, owner, datetime.now(UTC) + self.lease):
                return owner
            doc = await self.store.read(doc_id)
            while doc is not None:
                now = datetime.now(UTC)
                if doc["expires_at"] <= now:  # a dead owner's claim, or an answer past its time: the key is free
                    if await self.store.take_over(doc_id, doc["owner"], request, owner, now + self.lease):
                        return owner
                elif doc["request"] != request:
                    raise KeyReused()
                elif "answer" in doc:
                    answer = doc["answer"]
                    return Answer(
                        answer["status"],
                        answer.get("body"),
                        answer["charged"],
                        answer["request_id"],
                        answer.get("provider", ""),
                    )
                else:
                    left = give_up - self.clock()
                    if left <= 0:
                        raise StillRunning(max(1, math.ceil((doc["expires_at"] - now).total_seconds())))
                    await asyncio.sleep(min(pause, left))
                    pause = min(2 * pause, LAST_POLL)
                doc = await self.store.read(doc_id)
            # Gone: the first gave the key up. Claim it again.

    async def end(self, claim: Claim, answer: Answer | None) -> bool:
        """Keeps `answer` for the key's repeats, or with None gives the key up so that a retry runs again.
        False when the answer could not be stored (the claim was taken over, or the database failed): the
        caller must not charge for it then, since a repeat may run, and be charged, again."""
        claim.ended = True
        kept = None
        try:
            if answer is None:
                await self.store.drop(claim.doc_id, claim.owner)
                return True
            if not self._room(claim.account_id, answer.body):
                answer = replace(answer, body=None)
            stored = {"status": answer.status, "charged": answer.charged, "request_id": answer.request_id}
            if answer.body is not None:
                stored["body"] = answer.body
            if answer.provider:
                stored["provider"] = answer.provider
            if await self.store.keep(claim.doc_id, claim.owner, stored, datetime.now(UTC) + self.ttl):
                kept = answer
            return kept is not None
        except Exception as exc:  # the claim then ends with its lease
            log.warning("an idempotency claim could not be ended: %s", type(exc).__name__)
            return False
        finally:
            self._settle(claim.doc_id, claim.outcome, kept)

    def _room(self, account_id: str, body: bytes) -> bool:
        """Whether a body this size may be kept for the account within the bounds (and counts it if so)."""
        if len(body) > self.max_body:
            return False
        hour = int(time.time() // HOUR)
        hours = self._kept.setdefault(account_id, deque())
        while hours and hours[0][0] < hour - self._ttl_hours:  # every answer of that hour has expired
            hours.popleft()
        if sum(size for _, size in hours) + len(body) > self.max_account:
            return False
        if hours and hours[-1][0] == hour:
            hours[-1][1] += len(body)
        else:
            hours.append([hour, len(body)])
        return True

    def _settle(self, doc_id: str, outcome: asyncio.Future, answer: Answer | None) -> None:
        """The request this process handled with the key is done: repeats waiting here get `answer`."""
        held = self.handling.get(doc_id)
        if held is not None and held[1] is outcome:
            del self.handling[doc_id]
        outcome.set_result(answer)
