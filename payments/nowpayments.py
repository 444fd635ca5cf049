"""The real processor: NOWPayments' public API conventions (x-api-key, /v1/payment, /v1/min-amount).

Payment calls are rare, so a simple client without keep-alive is enough; it is our
own instance so that other users of the loop's shared client cannot starve
notification handling. Failures become ProviderError without the key or the
response body in the message; callers retry (checkout answers 502, the reconciler
polls later).
"""

import logging
import math
import time
from datetime import UTC, datetime
from urllib.parse import quote, urlencode

import orjson
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.simple_httpclient import SimpleAsyncHTTPClient

from payments.currencies import Currency
from payments.provider import Invoice, PaymentState, Provider, ProviderError, ms
from storage.orders import CONFIRMED, STATUSES

log = logging.getLogger("gateway.payments")
MIN_AMOUNT_TTL = 600.0  # the processor's minimums move with fees and prices, but not by the second


def _time(value) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return ms(moment if moment.tzinfo else moment.replace(tzinfo=UTC))


def _number(data: dict, name: str) -> float:
    value = data.get(name)
    if value is None:
        return 0.0
    try:
        number = float(value)  # the processor sends some amounts as strings
    except (TypeError, ValueError):
        raise ProviderError(f"{name} is not a number") from None
    if not math.isfinite(number) or number < 0:
        raise ProviderError(f"{name} is out of range")
    return number


def state_of(data: dict) -> PaymentState:
    """A payment as the processor reports it; only confirmed statuses count as confirmed money."""
    status = data.get("payment_status")
    if status not in STATUSES or data.get("payment_id") is None:
        raise ProviderError("unexpected payment object")
    paid = _number(data, "actually_paid")
    if status in CONFIRMED:
        # A payment the processor reports confirmed without an amount was paid in full.
        confirmed = paid or _number(data, "pay_amount")
    elif status == "partially_paid":
        confirmed = paid
    else:
        confirmed = 0.0
    updated_at = _time(data.get("updated_at")) or _time(data.get("created_at")) or ms(datetime.now(UTC))
    order_id = data.get("order_id")
    return PaymentState(
        str(data["payment_id"]), str(order_id) if order_id is not None else None, status, paid, confirmed, updated_at
    )


class NowPayments(Provider):
    name = "nowpayments"

    def __init__(self, base_url: str, api_key: str, timeout: float = 15.0, clock=time.monotonic):
        self.base_url, self.api_key, self.timeout, self.clock = base_url.rstrip("/"), api_key, timeout, clock
        self._minimums: dict[str, tuple[float, float]] = {}  # code -> (min_usd, fresh until)
        # Holds no connections between calls, so there is nothing to close at shutdown.
        self.http = SimpleAsyncHTTPClient(force_instance=True, max_clients=20)

    async def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        request = HTTPRequest(
            self.base_url + path,
            method=method,
            headers={"x-api-key": self.api_key, "Content-Type": "application/json", "Accept": "application/json"},
            body=orjson.dumps(body) if body is not None else None,
            follow_redirects=False,
            connect_timeout=min(5.0, self.timeout),
            request_timeout=self.timeout,
        )
        endpoint = path.split("?")[0]
        try:
            response = await self.http.fetch(request, raise_error=False)
        except (OSError, HTTPClientError) as exc:
            raise ProviderError(f"{method} {endpoint}: {type(exc).__name__}") from None
        if response.code not in (200, 201):
            raise ProviderError(f"{method} {endpoint}: HTTP {response.code}")
        try:
            data = orjson.loads(response.body)
        except orjson.JSONDecodeError:
            raise ProviderError(f"{method} {endpoint}: not JSON") from None
        if not isinstance(data, dict):
            raise ProviderError(f"{method} {endpoint}: not an object")
        return data

    async def min_usd(self, currency: Currency) -> float:
        """Our floor or the processor's minimum, whichever is higher; our floor while the processor is unreachable."""
        cached = self._minimums.get(currency.code)
        if cached and cached[1] > self.clock():
            return cached[0]
        code = currency.code.lower()
        try:
            data = await self._call(
                "GET",
                "/v1/min-amount?" + urlencode({"currency_from": code, "currency_to": code, "fiat_equivalent": "usd"}),
            )
            theirs = math.ceil(_number(data, "fiat_equivalent") * 100) / 100
        except ProviderError as exc:
            log.warning("minimum amount for %s unavailable (%s); using %s USD", code, exc, currency.min_usd)
            return currency.min_usd
        minimum = max(currency.min_usd, theirs)
        self._minimums[currency.code] = (minimum, self.clock() + MIN_AMOUNT_TTL)
        return minimum

    async def create_payment(self, order_id: str, price_usd: float, currency: Currency, callback_url: str) -> Invoice:
        data = await self._call(
            "POST",
            "/v1/payment",
            {
                "price_amount": price_usd,
                "price_currency": "usd",
                "pay_currency": currency.code.lower(),
                "ipn_callback_url": callback_url,
                "order_id": order_id,
                "order_description": f"Credits, order {order_id}",
            },
        )
        address, amount = data.get("pay_address"), _number(data, "pay_amount")
        if not isinstance(address, str) or not address or amount <= 0 or data.get("payment_id") is None:
            raise ProviderError("POST /v1/payment: incomplete payment object")
        return Invoice(str(data["payment_id"]), address, amount, _time(data.get("expiration_estimate_date")))

    async def get_payment(self, payment_id: str) -> PaymentState:
        return state_of(await self._call("GET", f"/v1/payment/{quote(payment_id, safe='')}"))
