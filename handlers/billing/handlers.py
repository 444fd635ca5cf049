"""Crypto top-ups: currencies, checkout, orders, the processor's notifications, and the development sandbox chain."""

import asyncio
import functools
import io
import logging
import re
import time
from datetime import UTC, datetime

import segno

from handlers.base import BaseHandler, authenticated
from handlers.errors import ApiError
from handlers.idempotent import idempotent
from handlers.validation import Field, ValidationError, error, validate_body
from payments.currencies import CURRENCIES
from payments.provider import SIGNATURE_HEADER, ProviderError, verified
from payments.sandbox_chain import SandboxRefused
from payments.service import view

log = logging.getLogger("gateway.payments")
ORDER_ID = re.compile(r"ord_[0-9a-f]{20}")

# Also the bound of `social-gateway sandbox-pay`.
AMOUNT_USD = Field("amount_usd", float, exclusive_minimum=0, maximum=1_000_000)
CHECKOUT = [Field("currency", str, enum=tuple(CURRENCIES)), AMOUNT_USD]
SANDBOX_PAY = [Field("order_id", str), AMOUNT_USD, Field("confirmed", bool, required=False)]
SANDBOX_CONFIRM = [Field("order_id", str)]
ORDERS_LIMIT = Field("limit", int, required=False, default=100, minimum=1, maximum=1000)


class BillingBase(BaseHandler):
    def processor(self):
        if self.services.payments.provider is None:
            raise ApiError(503, "Crypto payments are not configured on this server", {"Retry-After": "3600"})
        return self.services.payments

    async def owned_order(self, order_id: str) -> dict:
        """The caller's order; another account's order or an unknown id is 404 (no existence oracle)."""
        account_id = self.current_user
        order = await self.services.payments.order_of(account_id, order_id) if ORDER_ID.fullmatch(order_id) else None
        if order is None:
            raise ApiError(404, "Order not found")
        return order


class ConfigHandler(BillingBase):
    """Accepted currencies with their minimum order, and the credit price; public."""

    async def get(self) -> None:
        self.send_json(
            {"currencies": await self.services.payments.currencies(), "credits_per_usd": self.config.credits_per_usd}
        )


class CheckoutHandler(BillingBase):
    """Creates a top-up order and returns where and how much to pay."""

    @authenticated
    @idempotent
    async def post(self) -> None:
        account_id = self.current_user
        body = validate_body(self.json_body(), CHECKOUT)
        payments = self.processor()
        currency, amount = CURRENCIES[body["currency"].upper()], round(body["amount_usd"], 2)
        minimum = await payments.min_usd(currency)
        if amount < minimum:
            raise ValidationError(
                [
                    error(
                        ["body", "amount_usd"],
                        f"Input should be greater than or equal to {minimum} (the minimum order in {currency.code})",
                        "greater_than_equal",
                    )
                ]
            )
        # Every checkout costs a call to the processor: one account may not flood it.
        throttle = self.ctx.throttles.checkout
        wait = throttle.begin(account_id, time.monotonic())
        if wait:
            raise ApiError(429, "Too many checkouts; retry later", {"Retry-After": str(wait)})
        try:
            most = self.config.max_open_orders
            if await payments.open_orders(account_id, datetime.now(UTC)) >= most:
                raise ApiError(
                    429,
                    f"This account already has {most} unpaid orders (MAX_OPEN_ORDERS); pay one or wait until it expires",
                    {"Retry-After": "60"},
                )
            order = await payments.checkout(account_id, currency, amount)
        except ProviderError as exc:
            log.warning("checkout failed at the processor: %s", exc)
            raise ApiError(502, "The payment processor is unavailable; try again shortly") from None
        finally:
            throttle.end(account_id)
        self.log_fields["order_id"] = order["_id"]
        details = {"order_id": order["_id"], "amount_usd": amount, "currency": currency.code}
        await self.audit("checkout.created", details=details)
        self.send_json(view(order))


class OrdersHandler(BillingBase):
    """The account's orders, newest first."""

    @authenticated
    async def get(self) -> None:
        orders = await self.services.payments.orders_of(self.current_user, self.query_arg(ORDERS_LIMIT))
        self.send_json([view(o) for o in orders])


class OrderHandler(BillingBase):
    """One order with the amount received and the credits applied so far."""

    @authenticated
    async def get(self, order_id: str) -> None:
        self.send_json(view(await self.owned_order(order_id)))


def _qr_svg(text: str) -> bytes:
    out = io.BytesIO()
    segno.make(text, error="m").save(out, kind="svg", scale=4, border=2, light="#fff", title="Payment QR code")
    return out.getvalue()


class OrderQRHandler(BillingBase):
    """The order's payment URI as a QR code (SVG), made here: no outside service sees the address."""

    @authenticated
    async def get(self, order_id: str) -> None:
        order = view(await self.owned_order(order_id))
        svg = await asyncio.get_running_loop().run_in_executor(self.ctx.runtime.executor, _qr_svg, order["payment_uri"])
        self.set_header("Content-Type", "image/svg+xml")
        self.set_header("Content-Security-Policy", "default-src 'none'")
        self.finish(svg)


class NotificationHandler(BillingBase):
    """The processor's signed payment notification: a trigger to re-read the payment, never trusted as is."""

    async def post(self) -> None:
        payload = verified(
            self.config.payments_ipn_secret, self.request.body, self.request.headers.get(SIGNATURE_HEADER)
        )
        if payload is None:
            log.warning("payment notification with a missing or invalid signature refused")
            raise ApiError(401, "Invalid notification signature")
        try:
            order = await self.processor().on_notification(payload)
        except ProviderError as exc:
            # Not 2xx, so the processor sends it again; the reconciler also polls the order.
            log.warning("notification could not be checked with the processor: %s", exc)
            raise ApiError(503, "Payment state unavailable; retry later", {"Retry-After": "60"}) from None
        if order is not None:
            self.log_fields["order_id"] = order["_id"]
        self.send_json({"status": "ok" if order is not None else "ignored"})


def sandbox_only(method):
    """Development only: in production, or with a real processor, the sandbox chain does not exist (404)."""

    @functools.wraps(method)
    def wrapper(self: BillingBase, *args, **kwargs):
        if self.config.production or self.services.payments.chain is None:
            raise ApiError(404, "Not found")
        return method(self, *args, **kwargs)

    return wrapper


class SandboxBase(BillingBase):
    async def sandbox_order(self, fields: list[Field]) -> tuple[dict, dict]:
        body = validate_body(self.json_body(), fields)
        return body, await self.owned_order(body["order_id"])


class SandboxPayHandler(SandboxBase):
    """Sends one simulated on-chain payment to the order's address, confirmed now or later."""

    @sandbox_only
    @authenticated
    async def post(self) -> None:
        body, order = await self.sandbox_order(SANDBOX_PAY)
        try:
            tx, order = await self.services.payments.sandbox_pay(
                order, round(body["amount_usd"], 2), body.get("confirmed", True)
            )
        except SandboxRefused as exc:
            raise ApiError(409, str(exc)) from None
        self.send_json({"tx": tx, "order": view(order)})


class SandboxConfirmHandler(SandboxBase):
    """Confirms every pending sandbox payment of the order."""

    @sandbox_only
    @authenticated
    async def post(self) -> None:
        _, order = await self.sandbox_order(SANDBOX_CONFIRM)
        try:
            confirmed, order = await self.services.payments.sandbox_confirm(order)
        except SandboxRefused as exc:
            raise ApiError(409, str(exc)) from None
        self.send_json({"confirmed_payments": confirmed, "order": view(order)})


routes = [
    (r"/billing/crypto/config", ConfigHandler),
    (r"/billing/crypto/checkout", CheckoutHandler),
    (r"/billing/crypto/orders", OrdersHandler),
    (r"/billing/crypto/orders/([^/]+)", OrderHandler),
    (r"/billing/crypto/orders/([^/]+)/qr", OrderQRHandler),
    (r"/billing/crypto/ipn", NotificationHandler),
    (r"/billing/crypto/sandbox/pay", SandboxPayHandler),
    (r"/billing/crypto/sandbox/confirm", SandboxConfirmHandler),
]
