"""Alert rules and webhook endpoints (handlers/alerts/): the account's caps, what a new endpoint and a rolled
secret are, the SSRF check of a receiver's URL, test events and redeliveries. The crossings themselves are found by
alerts/detector.py and delivered by webhooks/outbox.py."""

import secrets
from datetime import UTC, datetime, timedelta

from alerts.detector import Detector
from config.settings import Settings
from security.apikeys import KeyVault
from storage.alerts import AlertStore
from storage.limits import Limits
from storage.webhooks import WebhookStore
from webhooks.guard import Refused, check_host, check_url
from webhooks.outbox import PREVIOUS_SECRET_SECONDS, Outbox, secret_aad
from webhooks.signing import new_secret

MAX_RULES, MAX_ENDPOINTS = 50, 10
TESTS_PER_MINUTE = 10  # test events per account, across processes (each is an attempt on a customer's receiver)


class Alerts:
    def __init__(
        self,
        settings: Settings,
        rules: AlertStore,
        webhooks: WebhookStore,
        limits: Limits,
        outbox: Outbox,
        detector: Detector,
        vault: KeyVault,
    ):
        self.settings, self.rules, self.webhooks, self.limits = settings, rules, webhooks, limits
        self.outbox, self.detector, self.vault = outbox, detector, vault

    # --- rules ---------------------------------------------------------------------------------------------------
    async def account_rules(self, account_id: str) -> list[dict]:
        return await self.rules.account_rules(account_id)

    async def rule(self, account_id: str, rule_id: str) -> dict | None:
        return next((r for r in await self.rules.account_rules(account_id) if r["_id"] == rule_id), None)

    async def add_rule(self, account_id: str, rule: dict, created_by: dict | None) -> dict | None:
        """The new rule's document; None when the account has MAX_RULES (the cap holds under concurrency:
        storage/caps.py). `created_by`: who made it; the rule is the account's and outlives their membership."""
        doc = {"_id": "al_" + secrets.token_hex(8), "account_id": account_id, **rule, "created_at": datetime.now(UTC)}
        doc["created_by"] = created_by
        if not await self.rules.add(doc, MAX_RULES):
            return None
        self.detector.touch(account_id)
        return doc

    async def delete_rule(self, account_id: str, rule_id: str) -> bool:
        return await self.rules.delete(account_id, rule_id)

    async def events(self, account_id: str, limit: int) -> list[dict]:
        return await self.webhooks.account_events(account_id, limit)

    # --- webhook endpoints ---------------------------------------------------------------------------------------
    async def refused(self, url: str) -> str | None:
        """Why this service will not call `url` (README, SSRF rules), or None; checked again at every connection."""
        try:
            host = check_url(url, self.settings.production)
            if self.settings.production and not self.settings.webhook_allow_private:
                await check_host(host, 443, allow_private=False)
        except Refused as exc:
            return str(exc)
        return None

    async def endpoints(self, account_id: str) -> list[dict]:
        return await self.webhooks.account_endpoints(account_id)

    async def endpoint(self, account_id: str, endpoint_id: str) -> dict | None:
        return await self.webhooks.endpoint(account_id, endpoint_id)

    async def add_endpoint(
        self, account_id: str, url: str, description: str, created_by: dict | None
    ) -> tuple[dict, str] | None:
        """The new endpoint and its signing secret (shown this once); None past MAX_ENDPOINTS (under concurrency
        too: storage/caps.py)."""
        endpoint_id, secret = "we_" + secrets.token_hex(8), new_secret()
        doc = {
            "_id": endpoint_id,
            "account_id": account_id,
            "url": url,
            "description": description,
            "secret": self.vault.encrypt(secret, secret_aad(endpoint_id)),
            "enabled": True,
            "failing_since": None,
            "created_at": datetime.now(UTC),
            "created_by": created_by,  # who added it; the endpoint is the account's
        }
        if not await self.webhooks.add_endpoint(doc, MAX_ENDPOINTS):
            return None
        return doc, secret

    async def change_endpoint(self, account_id: str, endpoint_id: str, changes: dict) -> dict | None:
        """url, description, enabled; re-enabling forgets why and since when it failed. None: no such endpoint."""
        fields, unset = dict(changes), ()
        if changes.get("enabled"):
            fields["failing_since"] = None
            unset = ("disabled_reason", "disabled_at")
        return await self.webhooks.update_endpoint(account_id, endpoint_id, fields, unset)

    async def delete_endpoint(self, account_id: str, endpoint_id: str) -> bool:
        return await self.webhooks.delete_endpoint(account_id, endpoint_id)

    async def roll_secret(self, account_id: str, endpoint: dict) -> tuple[dict, str] | None:
        """A new signing secret (shown this once); the previous one also signs for PREVIOUS_SECRET_SECONDS."""
        secret, now = new_secret(), datetime.now(UTC)
        fields = {
            "secret": self.vault.encrypt(secret, secret_aad(endpoint["_id"])),
            "previous_secret": endpoint["secret"],
            "previous_until": now + timedelta(seconds=PREVIOUS_SECRET_SECONDS),
            "secret_rolled_at": now,
        }
        updated = await self.webhooks.update_endpoint(account_id, endpoint["_id"], fields)
        return None if updated is None else (updated, secret)

    async def send_test(self, account_id: str, endpoint: dict) -> int:
        """A webhook.test event to this endpoint only; or, past TESTS_PER_MINUTE, the seconds to wait (nothing
        sent)."""
        wait = await self.limits.take(f"webhook-test:{account_id}", TESTS_PER_MINUTE, 60.0)
        if wait:
            return wait
        endpoint_id = endpoint["_id"]
        crossing = f"test|{endpoint_id}|{secrets.token_hex(8)}"
        data = {"endpoint_id": endpoint_id, "summary": "A test event from the portal"}
        await self.outbox.emit(crossing, endpoint["account_id"], "webhook.test", data, only=endpoint_id)
        return 0

    async def deliveries(self, endpoint_id: str, limit: int) -> list[dict]:
        return await self.webhooks.endpoint_deliveries(endpoint_id, limit)

    async def redeliver(self, endpoint_id: str, delivery_id: str) -> dict | None:
        """Sent again now (same webhook-id) with a fresh retry window; None: unknown, or an attempt is under way."""
        until = datetime.now(UTC) + timedelta(seconds=self.settings.webhook_retry_for)
        delivery = await self.webhooks.redeliver(endpoint_id, delivery_id, until)
        if delivery is not None:
            self.outbox.wake.set()
        return delivery
