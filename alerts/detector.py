"""The crossing detector: a background step (app/tasks.py, every ALERT_CHECK_SECONDS) that looks only at
accounts with rules whose figures moved in this process, and the payment hook for order statuses.

Nothing here runs on a data call. Which accounts moved comes from memory: the meter's purse of the account
(its `spent` changed since the last look) and the meter's account-change listener (top-ups, payments, here
or heard through coherence). For those accounts only, it reads the balance as the meter computes it
(Meter.balance: the account document plus this process's unflushed spend), today's spend or the key budgets
(UsageReads, stored totals plus this process's buffer), and asks the outbox to write the event of each
crossing. The event id is derived from the crossing, so two processes seeing the same crossing write one
event; the balance rule's crossing number moves on only by a conditional re-arm (storage/alerts.py).
"""

import logging
from collections import OrderedDict
from datetime import UTC, datetime

from accounting.meter import Meter
from alerts import rules as kinds
from config.settings import Settings
from metering.ledger import budget_period
from storage.accounts import AccountStore
from storage.alerts import AlertStore
from storage.keys import KeyStore
from webhooks.outbox import Outbox, iso

log = logging.getLogger("gateway.alerts")
SENT_MEMORY = 10_000  # crossings this process knows have their event: not written again


class Detector:
    def __init__(
        self,
        settings: Settings,
        store: AlertStore,
        outbox: Outbox,
        meter: Meter,
        accounts: AccountStore,
        keys: KeyStore,
    ):
        self.settings, self.store, self.outbox, self.meter = settings, store, outbox, meter
        self.accounts, self.keys = accounts, keys
        self.rules: dict[str, dict[str, dict]] = {}  # account id -> rule id -> rule
        self._since: datetime | None = None
        self._seen_spent: dict[str, int] = {}
        self.dirty: set[str] = set()
        self._sent: OrderedDict[str, None] = OrderedDict()
        meter.account_listeners.append(self.touch)

    def touch(self, account_id: str) -> None:
        """The account's figures changed (a top-up, a payment, a rule): look at it at the next step."""
        self.dirty.add(account_id)

    async def refresh(self) -> None:
        """Rules changed since the last look (all of them the first time), from any process."""
        stamp = datetime.now(UTC)
        for rule in await self.store.changed_since(self._since):
            mine = self.rules.setdefault(rule["account_id"], {})
            known = mine.get(rule["_id"])
            if rule["deleted"]:
                mine.pop(rule["_id"], None)
            else:
                mine[rule["_id"]] = rule
                if known is None or known["arm_seq"] != rule["arm_seq"]:
                    self.dirty.add(rule["account_id"])
            if not mine:
                del self.rules[rule["account_id"]]
        self._since = stamp

    async def check_once(self) -> None:
        await self.refresh()
        purses = self.meter.ledger.purses
        for account_id in self.rules:
            purse = purses.get(account_id)
            if purse is not None and self._seen_spent.get(account_id) != purse.spent:
                self._seen_spent[account_id] = purse.spent
                self.dirty.add(account_id)
        due, self.dirty = self.dirty & self.rules.keys(), set()
        failed = None
        for account_id in due:
            try:
                await self.check_account(account_id)
            except Exception as exc:  # the others are still checked; this one again at the next step
                self.dirty.add(account_id)
                failed = exc
        if failed is not None:
            raise failed

    async def check_account(self, account_id: str) -> None:
        rules = list(self.rules.get(account_id, {}).values())
        present = {rule["kind"] for rule in rules}
        account = await self.accounts.get(account_id)
        if account is None:
            return
        now = datetime.now(UTC)
        balance = await self.meter.balance(account_id, account) if "balance_below" in present else 0
        spend_today = 0
        if "daily_spend_above" in present:
            today = now.date().isoformat()
            totals = await self.meter.reads.summary(account_id, today, ("day",))
            spend_today = sum(row[1] for row in totals.values())
        for rule in rules:
            if rule["kind"] == "balance_below":
                await self._balance(rule, account, balance, now)
            elif rule["kind"] == "daily_spend_above":
                await self._daily(rule, account, spend_today, now)
        budget_rules = [rule for rule in rules if rule["kind"] == "key_budget"]
        if budget_rules:
            await self._budgets(budget_rules, account_id, now)

    async def _balance(self, rule: dict, account: dict, balance: int, now: datetime) -> None:
        threshold = kinds.threshold_credits(rule, account, self.settings.credits_per_usd)
        if threshold is None:
            return
        seq = rule["arm_seq"]
        if rule["fired_seq"] >= seq:
            # Fired: re-armed once the balance is back over the threshold through credits added since. A
            # process's view of the balance may lag others' spend, never run ahead of credits, so only
            # money coming in may re-arm (no flapping on stale views).
            funded, fired = account.get("funded_at"), rule.get("fired_at")
            if balance >= threshold and funded and (fired is None or funded > fired):
                updated = await self.store.rearm(rule["_id"], seq)
                if updated is not None:
                    self.rules.get(rule["account_id"], {})[rule["_id"]] = updated
            return
        if balance < threshold:
            per_usd = self.settings.credits_per_usd
            data = {
                "rule_id": rule["_id"],
                "threshold_credits": threshold,
                "balance_credits": balance,
                "balance_usd": round(balance / per_usd, 2),
                "crossing": seq + 1,
                "summary": f"Balance {balance:,} credits is below {threshold:,} ({kinds.describe(rule)})",
            }
            if rule.get("percent") is not None:
                data["reference_credits"] = account.get("last_funding")
            await self._emit(kinds.balance_crossing(rule), rule, data)
            await self.store.fired(rule["_id"], seq)
            rule["fired_seq"], rule["fired_at"] = seq, now

    async def _daily(self, rule: dict, account: dict, spend: int, now: datetime) -> None:
        threshold = kinds.threshold_credits(rule, account, self.settings.credits_per_usd)
        if threshold is None or spend <= threshold:
            return
        day = now.date().isoformat()
        data = {
            "rule_id": rule["_id"],
            "day": day,
            "spend_credits": spend,
            "threshold_credits": threshold,
            "summary": f"Spend on {day} reached {spend:,} credits, above {threshold:,}",
        }
        await self._emit(kinds.daily_crossing(rule, day), rule, data)
        if rule.get("fired_day") != day:  # GET /alerts: fired_at, and not armed again until the next UTC day
            await self.store.fired_day(rule["_id"], day)
            rule["fired_day"], rule["fired_at"] = day, now

    async def _budgets(self, rules: list[dict], account_id: str, now: datetime) -> None:
        keys = [k for k in await self.keys.list(account_id) if k.get("credit_limit") and not k.get("revoked")]
        if not keys:
            return
        used = await self.meter.reads.credits_used(account_id, keys)
        for rule in rules:
            for key in keys:
                if rule.get("key_id") not in (None, key["key_id"]):
                    continue
                period, _ = budget_period(key["credit_limit_period"], now)
                share = used[key["key_id"]] * 100 / key["credit_limit"]
                for level in rule["levels"]:
                    if share < level:
                        continue
                    data = {
                        "rule_id": rule["_id"],
                        "key_id": key["key_id"],
                        "level": level,
                        "credits_used": used[key["key_id"]],
                        "credit_limit": key["credit_limit"],
                        "period": key["credit_limit_period"],
                        "period_id": period,
                        "summary": f"Key {key['name']} used {level} % of its {key['credit_limit_period']} budget",
                    }
                    budget_id = key.get("budget_id", key["key_id"])
                    await self._emit(kinds.budget_crossing(rule, budget_id, period, level), rule, data)

    async def order_changed(self, order: dict, status: str) -> None:
        """The payment hook (payments/crediting.py): an order reached `status` (or `credited`)."""
        for rule in list(self.rules.get(order["account_id"], {}).values()):
            if rule["kind"] != "order_status" or status not in rule["statuses"]:
                continue
            detail = str(order.get("credits_applied", 0)) if status == "credited" else ""
            data = {
                "rule_id": rule["_id"],
                "order_id": order["_id"],
                "status": status,
                "price_usd": order.get("price_usd"),
                "credits_applied": order.get("credits_applied", 0),
                "updated_at": iso(order.get("updated_at") or datetime.now(UTC)),
                "summary": f"Top-up order {order['_id']}: {status.replace('_', ' ')}",
            }
            await self._emit(kinds.order_crossing(rule, order["_id"], status, detail), rule, data)

    async def _emit(self, crossing: str, rule: dict, data: dict) -> None:
        if crossing in self._sent:
            return
        await self.outbox.emit(crossing, rule["account_id"], kinds.EVENT_TYPES[rule["kind"]], data)
        self._sent[crossing] = None
        if len(self._sent) > SENT_MEMORY:
            self._sent.popitem(last=False)
