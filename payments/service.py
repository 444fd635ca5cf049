"""ctx.payments: checkout, notifications, the sandbox chain and the reconciler, over one crediting path.

Every route to credits (a signed notification, a sandbox payment, a reconciler
poll) ends in `refresh`: re-read the payment from the processor, then
Crediting.apply_payment_state. Nothing a notification says is trusted beyond
which order to re-read.
"""

import logging
import math
import secrets
from datetime import datetime, timedelta
from decimal import Decimal

from pymongo.asynchronous.database import AsyncDatabase

from config.settings import Settings
from payments.crediting import CreditAccount, Crediting
from payments.currencies import CURRENCIES, Currency, cents, payment_uri, usd_worth
from payments.nowpayments import NowPayments
from payments.provider import Provider, ProviderError, ms
from payments.sandbox_chain import SandboxChain
from storage.clock import now_utc
from storage.orders import FINAL, ChainStore, OrderStore

log = logging.getLogger("gateway.payments")
MAX_BACKOFF = 3600.0
RECONCILE_BATCH = 50  # orders per poll: bounds the processor calls per interval
RECONCILE_WINDOW = timedelta(days=7)  # how long after its quote expires an open order is still polled


def credits_for(price_usd: float, credits_per_usd: int) -> int:
    return math.floor(Decimal(str(price_usd)) * credits_per_usd)


def view(order: dict) -> dict:
    """An order as its owner sees it."""
    price, quote = order["price_usd"], order["pay_amount"]
    return {
        "order_id": order["_id"],
        "status": order["status"],
        "pay_address": order["pay_address"],
        "pay_currency": order["currency"],
        "pay_amount": quote,
        "payment_uri": payment_uri(order["currency"], order["pay_address"], quote),
        "price_usd": price,
        "credits_expected": order["credits_expected"],
        "created_at": order["created_at"],
        "expires_at": order["expires_at"],
        "updated_at": order["updated_at"],
        "amount_received": {
            "amount": order["actually_paid"],
            "usd": cents(usd_worth(order["actually_paid"], price, quote)),
        },
        "amount_confirmed": {"amount": order["confirmed_paid"], "usd": order["confirmed_usd"]},
        "credits_applied": order["credits_applied"],
    }


class Payments:
    def __init__(
        self,
        settings: Settings,
        provider: Provider | None,
        orders: OrderStore,
        crediting: Crediting,
        chain: SandboxChain | None,
    ):
        self.settings, self.provider, self.orders, self.chain = settings, provider, orders, chain
        self.crediting = crediting

    async def min_usd(self, currency: Currency) -> float:
        return await self.provider.min_usd(currency)

    async def currencies(self) -> list[dict]:
        if self.provider is None:
            return []
        return [
            {"code": c.code, "name": c.name, "network": c.network, "min_usd": await self.min_usd(c)}
            for c in CURRENCIES.values()
        ]

    async def checkout(self, account_id: str, currency: Currency, price_usd: float) -> dict:
        """Opens the payment at the processor first: if that fails, no order exists to confuse anyone."""
        order_id = "ord_" + secrets.token_hex(10)
        callback = self.settings.public_url.rstrip("/") + "/billing/crypto/ipn"
        now = ms(now_utc())
        invoice = await self.provider.create_payment(order_id, price_usd, currency, callback)
        expires_at = invoice.expires_at or now + timedelta(seconds=self.settings.order_ttl_seconds)
        order = {
            "_id": order_id,
            "account_id": account_id,
            "provider": self.provider.name,
            "payment_id": invoice.payment_id,
            "status": "waiting",
            "currency": currency.code,
            "pay_address": invoice.pay_address,
            "pay_amount": invoice.pay_amount,
            "price_usd": price_usd,
            "credits_expected": credits_for(price_usd, self.settings.credits_per_usd),
            "created_at": now,
            "expires_at": expires_at,
            "updated_at": now,
            "actually_paid": 0.0,
            "confirmed_paid": 0.0,
            "confirmed_usd": 0.0,
            "credits_applied": 0,
            "pending": [],
            "rev": 0,
            "provider_updated_at": None,
            "attempts": 0,
            "check_at": now + timedelta(seconds=self.settings.reconcile_interval),
            "reconcile_until": expires_at + RECONCILE_WINDOW,
        }
        await self.orders.insert(order)
        log.info("order %s: %s USD in %s for account %s", order_id, price_usd, currency.code, account_id)
        return order

    async def order_of(self, account_id: str, order_id: str) -> dict | None:
        """The order, only if `account_id` placed it."""
        return await self.orders.owned(account_id, order_id)

    async def orders_of(self, account_id: str, limit: int) -> list[dict]:
        """The account's orders, newest first."""
        return await self.orders.for_account(account_id, limit)

    async def open_orders(self, account_id: str, now: datetime) -> int:
        """The account's orders still waiting for a payment and not yet expired (MAX_OPEN_ORDERS counts them)."""
        return await self.orders.count_open(account_id, now)

    async def refresh(self, order: dict) -> dict:
        """Re-reads the order's payment from the processor and applies it; raises ProviderError."""
        try:
            state = await self.provider.get_payment(order["payment_id"])
        except LookupError:
            raise ProviderError("payment unknown to the processor") from None
        if state.payment_id != order["payment_id"] or state.order_id not in (None, order["_id"]):
            log.error("order %s: the processor answered for another payment; ignored", order["_id"])
            return order
        return await self.crediting.apply_payment_state(order["_id"], state)

    async def on_notification(self, payload: dict) -> dict | None:
        """A verified notification names the order to re-read; None when it is not one of ours."""
        order = await self.orders.get(str(payload.get("order_id")))
        if order is None or str(payload.get("payment_id")) != order["payment_id"]:
            log.warning("notification for an unknown order or payment ignored")
            return None
        return await self.refresh(order)

    async def sandbox_pay(self, order: dict, amount_usd: float, confirmed: bool) -> tuple[dict, dict]:
        tx = await self.chain.send(order["payment_id"], amount_usd, confirmed)
        return tx, await self.refresh(order)

    async def sandbox_confirm(self, order: dict) -> tuple[int, dict]:
        count = await self.chain.confirm(order["payment_id"])
        return count, await self.refresh(order)

    # --- reconciliation ---------------------------------------------------------------------
    async def reconcile_once(self) -> int:
        """Finishes pending credits and re-reads due open orders; returns how many orders it looked at."""
        now = now_utc()
        due = await self.orders.due(now, RECONCILE_BATCH)
        for order in due:
            try:
                if order["status"] in FINAL:
                    await self.crediting.settle(order)
                    continue
                order = await self.refresh(order)
            except ProviderError as exc:
                log.warning("reconcile %s: %s", order["_id"], exc)
            except Exception:
                log.exception("reconcile %s failed", order["_id"])
            if order["status"] not in FINAL:
                attempts = order.get("attempts", 0) + 1
                wait = min(self.settings.reconcile_interval * 2**attempts, MAX_BACKOFF)
                await self.orders.schedule(order["_id"], now + timedelta(seconds=wait), attempts)
        return len(due)


async def build_payments(settings: Settings, db: AsyncDatabase, credit_account: CreditAccount) -> Payments:
    """The processor from settings: NOWPayments if configured, else the sandbox chain outside production, else none."""
    orders = OrderStore(db)
    await orders.ensure_indexes()
    chain = None
    if settings.payments_provider == "nowpayments":
        provider = NowPayments(settings.payments_api_url, settings.payments_api_key)
    elif not settings.production:
        provider = chain = SandboxChain(ChainStore(db), settings.order_ttl_seconds)
    else:
        provider = None
        log.warning("PAYMENTS_PROVIDER is not set: checkout answers 503 until a processor is configured")
    return Payments(settings, provider, orders, Crediting(orders, credit_account, settings.credits_per_usd), chain)
