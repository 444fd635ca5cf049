"""What a crypto payment processor must offer, its status values, and notification signatures.

Statuses and the signature follow the most common processor (reference.md): a
notification is only a trigger; the authoritative state is re-read with
get_payment before anything is credited.
"""

import hashlib
import hmac
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime

import orjson

from payments.currencies import Currency

SIGNATURE_HEADER = "x-nowpayments-sig"


class ProviderError(Exception):
    """The processor gave no usable answer; the caller retries later (nothing was changed)."""


@dataclass(frozen=True)
class Invoice:
    """A created payment: where and how much to pay."""

    payment_id: str
    pay_address: str
    pay_amount: float
    expires_at: datetime | None


@dataclass(frozen=True)
class PaymentState:
    """The processor's current view of one payment. Amounts are in the pay currency."""

    payment_id: str
    order_id: str | None
    status: str
    actually_paid: float  # everything seen on chain, confirmed or not
    confirmed_paid: float  # the part the network has confirmed: the only part ever credited
    updated_at: datetime  # millisecond precision (what MongoDB keeps), so re-reads compare equal


class Provider(ABC):
    name: str

    @abstractmethod
    async def min_usd(self, currency: Currency) -> float:
        """The smallest order the processor accepts in this currency, in USD."""

    @abstractmethod
    async def create_payment(self, order_id: str, price_usd: float, currency: Currency, callback_url: str) -> Invoice:
        """Opens a payment of `price_usd` in `currency`; raises ProviderError."""

    @abstractmethod
    async def get_payment(self, payment_id: str) -> PaymentState:
        """Re-reads the authoritative state; raises ProviderError."""


MAX_NOTIFICATION_DEPTH = 32  # a real notification is 1-2 levels deep; orjson cannot re-serialise past 255


def _depth(value) -> int:
    """Nesting depth of a decoded JSON value, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            if level > MAX_NOTIFICATION_DEPTH:
                break
            stack.extend((v, level + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def _canonical(value):
    # JSON.stringify, which the processor signs with, writes 5.0 as 5: match it.
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def sign(secret: str, payload: dict) -> str:
    """Hex HMAC-SHA512 over the payload re-serialised with keys sorted recursively and compact separators."""
    body = orjson.dumps(_canonical(payload), option=orjson.OPT_SORT_KEYS)
    return hmac.new(secret.encode(), body, hashlib.sha512).hexdigest()


def verified(secret: str, body: bytes, signature: str | None) -> dict | None:
    """The notification's payload if its signature is valid, else None. No secret: nothing is valid."""
    if not secret or not signature:
        return None
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(payload, dict) or _depth(payload) > MAX_NOTIFICATION_DEPTH:
        return None  # checked before _canonical recurses through it
    # Bytes, because compare_digest refuses non-ASCII text (a forged header may carry any).
    expected, given = sign(secret, payload).encode(), signature.strip().lower().encode()
    return payload if hmac.compare_digest(expected, given) else None


def ms(moment: datetime) -> datetime:
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)
