"""The development payment processor: a simulated chain with fixed USD rates.

Each order gets a deterministic address (a hash of currency and order id, in the
network's address style). Payments to it are transactions in MongoDB (see
storage.orders.ChainStore), so they survive restarts and the CLI sees what the
server does. The processor-side status is derived from those transactions the
way a real processor reports it; crediting then goes through the same path as a
real notification.
"""

import hashlib
import secrets
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

from payments.currencies import CURRENCIES, Currency, coins, dec
from payments.provider import Invoice, PaymentState, Provider, ms
from storage.clock import now_utc
from storage.orders import ChainStore

_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


class SandboxRefused(Exception):
    """The simulated network will not send this payment; the message is safe for the client."""


def _base58(data: bytes) -> str:
    number, out = int.from_bytes(data, "big"), ""
    while number:
        number, digit = divmod(number, 58)
        out = _B58[digit] + out
    return out


def address_for(currency: Currency, order_id: str) -> str:
    digest = hashlib.sha256(f"sandbox:{currency.code}:{order_id}".encode()).digest()
    return {
        "bitcoin": lambda: "bc1q" + digest.hex()[:38],
        "litecoin": lambda: "ltc1q" + digest.hex()[:38],
        "ethereum": lambda: "0x" + digest[:20].hex(),
        "tron": lambda: "T" + _base58(digest)[:33],
        "solana": lambda: _base58(digest),
    }[currency.network]()


def _units(amount, decimals: int) -> int:
    return int(dec(amount).scaleb(decimals))


def _amount(units: int, decimals: int) -> float:
    return float(Decimal(units).scaleb(-decimals))


class SandboxChain(Provider):
    name = "sandbox"

    def __init__(self, chain: ChainStore, ttl_seconds: int):
        self.chain, self.ttl = chain, timedelta(seconds=ttl_seconds)

    async def min_usd(self, currency: Currency) -> float:
        return currency.min_usd

    async def create_payment(self, order_id: str, price_usd: float, currency: Currency, callback_url: str) -> Invoice:
        now = ms(now_utc())
        pay_amount = coins(dec(price_usd) / dec(currency.sandbox_usd), currency)
        payment = {
            "_id": "sbx_" + order_id.removeprefix("ord_"),
            "order_id": order_id,
            "currency": currency.code,
            "address": address_for(currency, order_id),
            "pay_units": _units(pay_amount, currency.decimals),
            "price_usd": price_usd,
            "expires_at": now + self.ttl,
            "updated_at": now,
        }
        await self.chain.open(payment)
        return Invoice(payment["_id"], payment["address"], float(pay_amount), payment["expires_at"])

    async def get_payment(self, payment_id: str) -> PaymentState:
        doc = await self.chain.get(payment_id)
        if doc is None:
            raise LookupError(payment_id)
        return self._state(doc, now_utc())

    def _state(self, doc: dict, now: datetime) -> PaymentState:
        decimals = CURRENCIES[doc["currency"]].decimals
        received = sum(tx["units"] for tx in doc["txs"])
        confirmed = sum(tx["units"] for tx in doc["txs"] if tx["confirmed"])
        updated_at = doc["updated_at"]
        if received > confirmed:
            status = "confirming"
        elif confirmed >= doc["pay_units"]:
            status = "finished"
        elif confirmed:
            status = "partially_paid"
        elif now >= doc["expires_at"]:
            status, updated_at = "expired", doc["expires_at"]
        else:
            status = "waiting"
        return PaymentState(
            doc["_id"],
            doc["order_id"],
            status,
            _amount(received, decimals),
            _amount(confirmed, decimals),
            ms(updated_at),
        )

    async def send(self, payment_id: str, amount_usd: float, confirmed: bool) -> dict:
        """One new on-chain payment worth `amount_usd` at the order's quote; confirmed now or by confirm()."""
        for _ in range(10):
            doc = await self.chain.get(payment_id)
            if doc is None:
                raise LookupError(payment_id)
            currency = CURRENCIES[doc["currency"]]
            now = ms(now_utc())
            status = self._state(doc, now).status
            if status == "expired":
                raise SandboxRefused("The order expired before anything was paid; create a new order")
            if status == "finished":
                raise SandboxRefused("The order is paid in full; create a new order to buy more credits")
            price_in_units = Decimal(doc["pay_units"]) / dec(doc["price_usd"])
            units = int((dec(amount_usd) * price_in_units).quantize(Decimal(1), ROUND_HALF_UP))
            if units <= 0:
                raise SandboxRefused(f"The amount is below the smallest unit of {currency.code}")
            tx = {"txid": secrets.token_hex(32), "units": units, "confirmed": confirmed, "at": now}
            if await self.chain.replace_txs(payment_id, doc["rev"], doc["txs"] + [tx], now):
                return {
                    "txid": tx["txid"],
                    "amount": _amount(units, currency.decimals),
                    "currency": currency.code,
                    "confirmed": confirmed,
                }
        raise SandboxRefused("The sandbox chain is busy; try again")

    async def confirm(self, payment_id: str) -> int:
        """Confirms every pending payment to the order's address; returns how many."""
        for _ in range(10):
            doc = await self.chain.get(payment_id)
            if doc is None:
                raise LookupError(payment_id)
            pending = sum(not tx["confirmed"] for tx in doc["txs"])
            if not pending:
                return 0
            txs = [{**tx, "confirmed": True} for tx in doc["txs"]]
            if await self.chain.replace_txs(payment_id, doc["rev"], txs, ms(now_utc())):
                return pending
        raise SandboxRefused("The sandbox chain is busy; try again")
