"""A local stand-in for NOWPayments: the same endpoints, key header, payment objects and signed IPNs.

Tests drive it like the network would: `settle` changes a payment's state (without
telling anyone, like a lost notification), `notify` posts the signed IPN to the
payment's callback URL exactly as the processor does.
"""

from datetime import UTC, datetime, timedelta

import orjson
import tornado.web
from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from payments.provider import SIGNATURE_HEADER, sign

RATES = {"btc": 60_000.0, "eth": 3_000.0, "usdttrc20": 1.0, "usdcsol": 1.0, "ltc": 80.0}


def _now(later: timedelta = timedelta()) -> str:
    return (datetime.now(UTC) + later).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class FakeProcessor:
    def __init__(self, api_key: str, ipn_secret: str, min_usd: dict | None = None):
        self.api_key, self.ipn_secret = api_key, ipn_secret
        self.min_usd = {"btc": 10.0, "eth": 5.0, "usdttrc20": 2.5, "usdcsol": 1.0, "ltc": 2.0, **(min_usd or {})}
        self.payments: dict[str, dict] = {}
        self.down = False  # answer 500 to everything, like an outage
        self.calls: list[str] = []

    def app(self) -> tornado.web.Application:
        return tornado.web.Application(
            [
                (r"/v1/min-amount", MinAmount, {"fake": self}),
                (r"/v1/payment", CreatePayment, {"fake": self}),
                (r"/v1/payment/([^/]+)", GetPayment, {"fake": self}),
            ]
        )

    def settle(self, payment_id: str, status: str, actually_paid: float | None = None) -> dict:
        payment = self.payments[payment_id]
        payment.update(payment_status=status, updated_at=_now())
        if actually_paid is not None:
            payment["actually_paid"] = actually_paid
        return dict(payment)

    def ipn(self, payload: dict) -> tuple[bytes, dict]:
        """A notification as the processor sends it: JSON body and its signature header."""
        headers = {SIGNATURE_HEADER: sign(self.ipn_secret, payload), "Content-Type": "application/json"}
        return orjson.dumps(payload), headers

    async def notify(self, payment_id: str) -> int:
        payment = self.payments[payment_id]
        body, headers = self.ipn(payment)
        response = await AsyncHTTPClient().fetch(
            HTTPRequest(payment["ipn_callback_url"], "POST", headers, body), raise_error=False
        )
        return response.code


class FakeHandler(tornado.web.RequestHandler):
    def initialize(self, fake: FakeProcessor) -> None:
        self.fake = fake

    def prepare(self) -> None:
        self.fake.calls.append(f"{self.request.method} {self.request.path}")
        if self.fake.down:
            raise tornado.web.HTTPError(500)
        if self.request.headers.get("x-api-key") != self.fake.api_key:
            self.set_status(403)
            self.finish({"status": False, "statusCode": 403, "code": "INVALID_API_KEY", "message": "Invalid api key"})


class MinAmount(FakeHandler):
    def get(self) -> None:
        code = self.get_query_argument("currency_from")
        usd = self.fake.min_usd[code]
        self.finish(
            {
                "currency_from": code,
                "currency_to": self.get_query_argument("currency_to"),
                "min_amount": usd / RATES[code],
                "fiat_equivalent": usd,
            }
        )


class CreatePayment(FakeHandler):
    def post(self) -> None:
        body = orjson.loads(self.request.body)
        code = body["pay_currency"]
        if body["price_currency"] != "usd" or code not in RATES or body["price_amount"] < self.fake.min_usd[code]:
            self.set_status(400)
            self.finish({"status": False, "statusCode": 400, "code": "AMOUNT_MINIMAL_ERROR", "message": "too small"})
            return
        payment_id = str(5_000_000_000 + len(self.fake.payments))
        now = _now()
        payment = {
            "payment_id": payment_id,
            "payment_status": "waiting",
            "pay_address": f"fake-{code}-{payment_id}",
            "price_amount": body["price_amount"],
            "price_currency": "usd",
            "pay_amount": round(body["price_amount"] / RATES[code], 8),
            "actually_paid": 0,
            "pay_currency": code,
            "order_id": body["order_id"],
            "order_description": body.get("order_description"),
            "ipn_callback_url": body["ipn_callback_url"],
            "created_at": now,
            "updated_at": now,
            "purchase_id": str(6_000_000_000 + len(self.fake.payments)),
            "outcome_amount": None,
            "outcome_currency": code,
        }
        self.fake.payments[payment_id] = payment
        self.set_status(201)
        self.finish({**payment, "expiration_estimate_date": _now(timedelta(days=1))})


class GetPayment(FakeHandler):
    def get(self, payment_id: str) -> None:
        payment = self.fake.payments.get(payment_id)
        if payment is None:
            self.set_status(404)
            self.finish({"status": False, "statusCode": 404, "code": "NOT_FOUND", "message": "Payment not found"})
            return
        # GET answers the numeric id, as the processor does.
        self.finish({**{k: v for k, v in payment.items() if k != "ipn_callback_url"}, "payment_id": int(payment_id)})
