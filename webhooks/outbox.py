"""The outbox: events in, signed deliveries out, retried on a schedule, in whichever process gets there first.

emit() writes an event once (its id is the crossing's: a second writer changes nothing). The dispatcher
(work, a step app/tasks.py runs in every process) fans each new event out into deliveries, one per enabled
endpoint of the account (and one email when SMTP_URL is set), claims due deliveries under a lease
(storage/webhooks.py), sends, and records the attempt: a 2xx ends it; anything else is tried again after
WEBHOOK_RETRY_SCHEDULE (the last step repeats) until WEBHOOK_RETRY_FOR has passed since the event. Claims are
fair between accounts: one account has at most WEBHOOK_ACCOUNT_CONCURRENCY of this process's
WEBHOOK_CONCURRENCY attempts under way, and a free place goes first to an account with none under way here, so a
receiver that never answers holds only its own account's share. An
endpoint failing without a success for WEBHOOK_DISABLE_AFTER is disabled, with a notice to the account.
Nothing here runs on a request's path: a process wakes its dispatcher when it writes an event, and polls
every WEBHOOK_POLL_SECONDS for what other processes left (retries due, claims of crashed processes).
"""

import asyncio
import hashlib
import logging
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import orjson

from config.settings import Settings
from runtime.outbound import Outbound
from security.apikeys import KeyVault
from storage.accounts import AccountStore
from storage.clock import now_utc
from storage.webhooks import NEVER, WebhookStore
from webhooks.mail import Mailer
from webhooks.sender import Outcome, Sender
from webhooks.signing import signed_headers

log = logging.getLogger("gateway.webhooks")
EMAIL = "email"  # the endpoint id of an account's email channel
FAN_OUT_BATCH = 100
PREVIOUS_SECRET_SECONDS = 86400
BACKLOG_SECONDS = 10.0  # how often the queue depth and oldest age for /metrics are counted  # after a roll, the previous secret signs too for a day


def event_id(crossing: str) -> str:
    """A stable id for one crossing (rule, what crossed, which time): the same in every process."""
    return "evt_" + hashlib.sha256(crossing.encode()).hexdigest()[:32]


def iso(moment: datetime) -> str:
    moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def payload(event: dict) -> bytes:
    """The body every channel sends: {"type", "timestamp", "data"} (the Standard Webhooks convention)."""
    return orjson.dumps({"type": event["type"], "timestamp": iso(event["created_at"]), "data": event["data"]})


def secret_aad(endpoint_id: str) -> str:
    return f"webhook:{endpoint_id}"


class Outbox:
    def __init__(
        self,
        settings: Settings,
        store: WebhookStore,
        accounts: AccountStore,
        vault: KeyVault,
        owner: str,
        outbound: Outbound | None = None,
    ):
        self.settings, self.store, self.accounts, self.vault, self.owner = settings, store, accounts, vault, owner
        self.outbound = outbound or Outbound()  # held: deliveries wait, pending (a restored database)
        self.sender = Sender(
            settings.webhook_timeout, settings.production, settings.webhook_allow_private, settings.webhook_concurrency
        )
        self.mailer = Mailer(settings.smtp_url, settings.smtp_from, self.outbound) if settings.smtp_url else None
        self.wake = asyncio.Event()
        self.outcomes: Counter = Counter()  # delivered, retried, failed: for /metrics
        self.depth, self.oldest_age = 0, 0.0  # pending deliveries, age of the oldest (seconds), as last polled
        self._sending: dict[asyncio.Task, str] = {}  # attempts under way -> their account
        self._accounts: Counter = Counter()  # attempts under way per account (only accounts with some)
        self.hold = settings.webhook_timeout * 2 + 5  # a claim outlives the longest attempt
        self._backlog_due = 0.0

    # --- events in -------------------------------------------------------------------------------
    async def emit(self, crossing: str, account_id: str, type_: str, data: dict, only: str | None = None) -> bool:
        """Records the event of `crossing` (once, whichever process comes first); True for the one that did.
        `only`: one endpoint id (a test event), or EMAIL."""
        doc = {"_id": event_id(crossing), "account_id": account_id, "type": type_, "data": data}
        doc["created_at"] = now_utc()
        if only is not None:
            doc["only"] = only
        created = await self.store.add_event(doc)
        if created:
            self.wake.set()
        return created

    # --- the dispatcher (one step; app/tasks.py runs it when woken, or every WEBHOOK_POLL_SECONDS) ------------
    async def work(self) -> None:
        await self.fan_out()
        if self.outbound.held:  # no attempt leaves; the deliveries stay pending until the hold is released
            return
        # Oldest first alone handed every free place back to the longest backlog (an account's receivers that
        # never answer held all of them): first an account with nothing under way here, then any below its share.
        idle_first = True
        while len(self._sending) < self.settings.webhook_concurrency:
            delivery = None
            if idle_first and self._accounts:
                delivery = await self.store.claim(self.owner, now_utc(), self.hold, skip=list(self._accounts))
                idle_first = delivery is not None  # none waiting: not asked again this round
            if delivery is None:
                share = self.settings.webhook_account_concurrency
                full = [account for account, count in self._accounts.items() if count >= share]
                delivery = await self.store.claim(self.owner, now_utc(), self.hold, skip=full)
            if delivery is None:
                break
            task = asyncio.create_task(self.deliver(delivery))
            self._sending[task] = delivery["account_id"]
            self._accounts[delivery["account_id"]] += 1
            task.add_done_callback(self._sent)
        if time.monotonic() >= self._backlog_due:  # two counting reads: at most every BACKLOG_SECONDS
            self._backlog_due = time.monotonic() + BACKLOG_SECONDS
            count, oldest = await self.store.backlog()
            self.depth, self.oldest_age = count, (now_utc() - oldest).total_seconds() if oldest else 0.0

    def _sent(self, task: asyncio.Task) -> None:
        account = self._sending.pop(task)
        self._accounts[account] -= 1
        if not self._accounts[account]:
            del self._accounts[account]
        if not task.cancelled() and task.exception() is not None:
            log.warning("a webhook attempt failed to record (%s)", type(task.exception()).__name__)
        self.wake.set()  # room for the next claim

    async def fan_out(self) -> None:
        for event in await self.store.to_fan_out(FAN_OUT_BATCH):
            now = now_utc()
            targets: list[tuple[str, dict]] = []
            only = event.get("only")
            if only != EMAIL:
                for endpoint in await self.store.account_endpoints(event["account_id"]):
                    if endpoint["enabled"] and only in (None, endpoint["_id"]):
                        targets.append((endpoint["_id"], {}))
            if self.mailer is not None and only in (None, EMAIL):
                account = await self.accounts.get(event["account_id"])
                if account and account.get("email"):
                    targets.append((EMAIL, {"to": account["email"]}))
            await self.store.add_deliveries(
                [
                    {
                        "_id": f"{event['_id']}.{endpoint_id}",
                        "event_id": event["_id"],
                        "endpoint_id": endpoint_id,
                        "account_id": event["account_id"],
                        "type": event["type"],
                        "state": "pending",
                        "attempts": 0,
                        "next_attempt_at": now,
                        "retry_until": event["created_at"] + timedelta(seconds=self.settings.webhook_retry_for),
                        "claim_owner": None,
                        "claim_until": NEVER,
                        "created_at": now,
                        "log": [],
                        **extra,
                    }
                    for endpoint_id, extra in targets
                ]
            )
            await self.store.fanned_out(event["_id"])

    async def deliver(self, delivery: dict) -> None:
        event = await self.store.event(delivery["event_id"])
        if event is None:
            await self.store.give_up(delivery["_id"], self.owner, "event missing")
            return
        started, at = time.monotonic(), now_utc()
        endpoint = None
        if delivery["endpoint_id"] == EMAIL:
            outcome = await self._mail(delivery, event)
        else:
            endpoint = await self.store.endpoint(None, delivery["endpoint_id"])
            if endpoint is None or not endpoint["enabled"]:
                await self.store.give_up(delivery["_id"], self.owner, "endpoint disabled or deleted")
                return
            body = payload(event)
            headers = signed_headers(self._secrets(endpoint, at), event["_id"], at, body)
            outcome = await self.sender.post(endpoint["url"], headers, body)
        await self._record(delivery, outcome, at, time.monotonic() - started, endpoint)

    def _secrets(self, endpoint: dict, at: datetime) -> list[str]:
        aad = secret_aad(endpoint["_id"])
        found = [self.vault.decrypt(endpoint["secret"], aad)]
        previous = endpoint.get("previous_secret")
        if previous and endpoint.get("previous_until") and endpoint["previous_until"] > at:
            found.append(self.vault.decrypt(previous, aad))
        return found

    async def _mail(self, delivery: dict, event: dict) -> Outcome:
        if self.mailer is None:
            return Outcome(None, "SMTP_URL is not set")
        data = event["data"]
        text = data.get("summary", event["type"]) + "\n\n" + orjson.dumps(data, option=orjson.OPT_INDENT_2).decode()
        try:
            await self.mailer.send(delivery["to"], f"[social-gateway] {data.get('summary', event['type'])}", text)
        except Exception as exc:
            return Outcome(None, f"smtp: {type(exc).__name__}")
        return Outcome(250, None)

    async def _record(
        self, delivery: dict, outcome: Outcome, at: datetime, seconds: float, endpoint: dict | None
    ) -> None:
        attempt = {"at": at, "status": outcome.status, "error": outcome.error, "ms": round(seconds * 1000, 1)}
        fields: dict = {"last_status": outcome.status, "last_error": outcome.error, "last_attempt_at": at}
        if outcome.ok:
            fields.update(state="delivered", delivered_at=now_utc())
            self.outcomes["delivered"] += 1
        else:
            schedule = self.settings.webhook_retry_schedule
            delay = schedule[min(delivery["attempts"], len(schedule) - 1)]
            due = now_utc() + timedelta(seconds=delay)
            if due > delivery["retry_until"]:
                fields["state"] = "failed"
                self.outcomes["failed"] += 1
            else:
                fields["next_attempt_at"] = due
                self.outcomes["retried"] += 1
                asyncio.get_running_loop().call_later(delay, self.wake.set)
        if not await self.store.attempted(delivery["_id"], self.owner, fields, attempt):
            log.warning("a webhook claim ran out before its attempt ended; another process may send it again")
        if endpoint is not None:
            await self._endpoint_health(endpoint, outcome, at)

    async def _endpoint_health(self, endpoint: dict, outcome: Outcome, at: datetime) -> None:
        if outcome.ok:
            if endpoint.get("failing_since"):
                await self.store.endpoint_succeeded(endpoint["_id"])
            return
        current = await self.store.endpoint_failed(endpoint["_id"], at)
        since = (current or {}).get("failing_since")
        if since and (at - since).total_seconds() >= self.settings.webhook_disable_after:
            reason = f"failing since {iso(since)} ({outcome.error})"
            if await self.store.disable_endpoint(endpoint["_id"], reason):
                log.warning("webhook endpoint %s disabled: %s", endpoint["_id"], reason)
                await self.emit(
                    f"disabled|{endpoint['_id']}|{iso(since)}",
                    endpoint["account_id"],
                    "webhook.endpoint_disabled",
                    {
                        "endpoint_id": endpoint["_id"],
                        "url": endpoint["url"],
                        "reason": reason,
                        "summary": f"Webhook endpoint {endpoint['url']} was disabled after failing for days",
                    },
                    only=EMAIL,
                )

    async def close(self) -> None:
        under_way = list(self._sending)
        for task in under_way:
            task.cancel()
        await asyncio.gather(*under_way, return_exceptions=True)
        self.sender.close()
