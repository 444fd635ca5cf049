"""Crypto top-ups: checkout, the sandbox chain, signed notifications, crediting rules, reconciliation.

The real-protocol client runs against tests/billing/fake_processor.py served in the test loop;
notifications are signed exactly as the processor signs them.
"""

import asyncio
import hashlib
import hmac
import os
import subprocess
import sys
from datetime import timedelta

import pytest
import tornado.httpserver
from fake_processor import FakeProcessor
from hypothesis import given
from hypothesis import settings as settings_
from hypothesis import strategies as st
from support import make_settings
from tornado.testing import bind_unused_port

from payments.crediting import plan_change
from payments.provider import SIGNATURE_HEADER, PaymentState, ms, sign
from storage.clock import now_utc
from storage.orders import CONFIRMED, FINAL, STATUSES

pytestmark = pytest.mark.gen_test(timeout=30)

API_KEY, IPN_SECRET = "fake-processor-api-key", "fake-processor-ipn-secret"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/<area>/ -> the project


@pytest.fixture
def upstream_url():
    """Billing never calls the data upstream, so these tests do not start it."""
    return "http://127.0.0.1:9"


@pytest.fixture
def processor(io_loop):
    fake = FakeProcessor(API_KEY, IPN_SECRET)
    sock, port = bind_unused_port()

    async def start():
        server = tornado.httpserver.HTTPServer(fake.app())
        server.add_sockets([sock])
        return server

    server = io_loop.run_sync(start)
    fake.url = f"http://127.0.0.1:{port}"
    yield fake
    server.stop()


@pytest.fixture
def settings(request, processor, http_port):
    """As in conftest; payments_provider="nowpayments" also points the client at the fake processor."""
    marker = request.node.get_closest_marker("settings")
    overrides = dict(marker.kwargs if marker else {})
    if overrides.get("payments_provider") == "nowpayments":
        overrides = {
            "payments_api_url": processor.url,
            "payments_api_key": API_KEY,
            "payments_ipn_secret": IPN_SECRET,
            "public_url": f"http://localhost:{http_port}",
            **overrides,
        }
    return make_settings(**overrides)


NOWPAYMENTS = pytest.mark.settings(payments_provider="nowpayments")


# --- helpers -------------------------------------------------------------------------------------
async def checkout(api, token, currency="USDTTRC20", amount=100):
    status, body, _ = await api.call(
        "POST", "/billing/crypto/checkout", {"currency": currency, "amount_usd": amount}, token=token
    )
    assert status == 200, body
    return body


async def pay(api, token, order_id, usd, confirmed=True, expect=200):
    status, body, _ = await api.call(
        "POST",
        "/billing/crypto/sandbox/pay",
        {"order_id": order_id, "amount_usd": usd, "confirmed": confirmed},
        token=token,
    )
    assert status == expect, body
    return body


async def account(api, token):
    return (await api.call("GET", "/account", token=token))[1]


async def order_of(api, token, order_id):
    status, body, _ = await api.call("GET", f"/billing/crypto/orders/{order_id}", token=token)
    assert status == 200, body
    return body


async def ipn(api, payload, secret=IPN_SECRET, headers=None):
    body, signed = FakeProcessor(API_KEY, secret).ipn(payload)
    return await api.call("POST", "/billing/crypto/ipn", raw=body, headers=headers if headers is not None else signed)


# --- config and checkout -------------------------------------------------------------------------
async def test_config_is_public(api):
    status, body, _ = await api.call("GET", "/billing/crypto/config")
    assert status == 200 and body["credits_per_usd"] == 100_000
    by_code = {c["code"]: c for c in body["currencies"]}
    assert set(by_code) == {"BTC", "ETH", "USDTTRC20", "USDCSOL", "LTC"}
    assert by_code["BTC"] == {"code": "BTC", "name": "Bitcoin", "network": "bitcoin", "min_usd": 10.0}
    assert all(set(c) == {"code", "name", "network", "min_usd"} for c in body["currencies"])


async def test_checkout_returns_an_order(api):
    user = await api.register()
    order = await checkout(api, user["token"], "btc", 120.456)
    assert order["order_id"].startswith("ord_") and order["status"] == "waiting"
    assert order["pay_currency"] == "BTC" and order["price_usd"] == 120.46  # rounded to cents
    assert order["pay_amount"] == 0.00200767  # 120.46 / 60,000 (the sandbox rate), rounded up to 8 places
    assert order["pay_address"].startswith("bc1q") and order["credits_expected"] == 12_046_000
    assert order["credits_applied"] == 0 and order["amount_received"] == {"amount": 0.0, "usd": 0.0}
    assert order["expires_at"] > order["created_at"]
    again = await checkout(api, user["token"], "BTC", 120.46)
    assert again["pay_address"] != order["pay_address"]  # one address per order
    status, listed, _ = await api.call("GET", "/billing/crypto/orders", token=user["token"])
    assert status == 200 and [o["order_id"] for o in listed] == [again["order_id"], order["order_id"]]
    assert await order_of(api, user["token"], order["order_id"]) == order


@pytest.mark.parametrize(
    "payload,loc,type_",
    [
        ({"currency": "BTC", "amount_usd": 9.99}, "amount_usd", "greater_than_equal"),
        ({"currency": "ETH", "amount_usd": 4.99}, "amount_usd", "greater_than_equal"),
        ({"currency": "LTC", "amount_usd": 1.5}, "amount_usd", "greater_than_equal"),
        ({"currency": "USDTTRC20", "amount_usd": 0.994}, "amount_usd", "greater_than_equal"),  # 0.99 after rounding
        ({"currency": "DOGE", "amount_usd": 50}, "currency", "enum"),
        ({"currency": "BTC", "amount_usd": -20}, "amount_usd", "greater_than"),
        ({"currency": "BTC", "amount_usd": 0}, "amount_usd", "greater_than"),
        ({"currency": "BTC", "amount_usd": 1_000_000.01}, "amount_usd", "less_than_equal"),
        ({"currency": "BTC", "amount_usd": 1e300}, "amount_usd", "less_than_equal"),
        ({"currency": "BTC", "amount_usd": "50"}, "amount_usd", "float_type"),
        ({"currency": "BTC", "amount_usd": True}, "amount_usd", "float_type"),
        ({"currency": "BTC"}, "amount_usd", "missing"),
        ({"currency": 5, "amount_usd": 50}, "currency", "string_type"),
        ({"currency": "BTC", "amount_usd": 50, "credits": 10**9}, "credits", "extra_forbidden"),
    ],
)
async def test_checkout_validation(api, payload, loc, type_):
    user = await api.register()
    status, body, _ = await api.call("POST", "/billing/crypto/checkout", payload, token=user["token"])
    assert status == 422
    assert {"loc": ["body", loc], "type": type_} in [{"loc": e["loc"], "type": e["type"]} for e in body["detail"]]
    assert (await api.call("GET", "/billing/crypto/orders", token=user["token"]))[1] == []


async def test_minimum_and_maximum_are_accepted(api):
    user = await api.register()
    assert (await checkout(api, user["token"], "BTC", 10))["price_usd"] == 10
    assert (await checkout(api, user["token"], "USDCSOL", 1_000_000))["credits_expected"] == 100_000_000_000


async def test_orders_need_a_session_and_are_private(api):
    owner, other = await api.register(), await api.register()
    order = await checkout(api, owner["token"])
    for method, path in [
        ("POST", "/billing/crypto/checkout"),
        ("GET", "/billing/crypto/orders"),
        ("GET", f"/billing/crypto/orders/{order['order_id']}"),
        ("POST", "/billing/crypto/sandbox/pay"),
    ]:
        assert (await api.call(method, path, body={}))[0] == 401, path
    for order_id in [order["order_id"], "ord_" + "0" * 20, "nonsense", "ord_%24where"]:
        status, body, _ = await api.call("GET", f"/billing/crypto/orders/{order_id}", token=other["token"])
        assert status == 404 and body == {"detail": "Order not found"}
    assert (await api.call("GET", "/billing/crypto/orders", token=other["token"]))[1] == []
    # Paying into someone else's order is refused the same way, and changes nothing.
    status, body, _ = await api.call(
        "POST", "/billing/crypto/sandbox/pay", {"order_id": order["order_id"], "amount_usd": 100}, token=other["token"]
    )
    assert status == 404
    assert (await order_of(api, owner["token"], order["order_id"]))["amount_received"]["amount"] == 0


# --- the sandbox chain and the crediting rules ---------------------------------------------------
async def test_confirmed_payment_credits_and_raises_the_plan_at_once(api):
    user = await api.register()
    await api.new_key(user["token"])
    before = await account(api, user["token"])
    assert before["plan"] == "free" and before["qps_limit"] == 0.2 and before["credits"] == 0
    order = await checkout(api, user["token"], "USDTTRC20", 25)
    paid = await pay(api, user["token"], order["order_id"], 25)
    assert paid["tx"]["amount"] == 25.0 and paid["tx"]["confirmed"] is True
    assert paid["order"]["status"] == "finished" and paid["order"]["credits_applied"] == 2_500_000
    after = await account(api, user["token"])
    assert after["credits"] == 2_500_000 and after["total_paid_usd"] == 25
    assert after["plan"] == "paid" and after["qps_limit"] == 20
    assert (await api.call("GET", "/keys", token=user["token"]))[1][0]["qps_limit"] == 20
    shown = await order_of(api, user["token"], order["order_id"])
    assert shown["amount_received"] == {"amount": 25.0, "usd": 25.0} and shown["credits_applied"] == 2_500_000
    # A paid-in-full order takes no more money (the simulated wallet refuses to send).
    await pay(api, user["token"], order["order_id"], 5, expect=409)


async def test_larger_payments_reach_higher_tiers(api):
    user = await api.register()
    order = await checkout(api, user["token"], "LTC", 600)
    assert order["pay_amount"] == 7.5
    await pay(api, user["token"], order["order_id"], 600)
    me = await account(api, user["token"])
    assert me["plan"] == "pro" and me["qps_limit"] == 50 and me["total_paid_usd"] == 600


async def test_nothing_is_credited_before_confirmation(api):
    user = await api.register()
    order = await checkout(api, user["token"], "ETH", 30)
    paid = await pay(api, user["token"], order["order_id"], 30, confirmed=False)
    assert paid["order"]["status"] == "confirming" and paid["order"]["credits_applied"] == 0
    assert paid["order"]["amount_received"]["amount"] == 0.01
    assert (await account(api, user["token"]))["credits"] == 0
    status, body, _ = await api.call(
        "POST", "/billing/crypto/sandbox/confirm", {"order_id": order["order_id"]}, token=user["token"]
    )
    assert status == 200 and body["confirmed_payments"] == 1 and body["order"]["status"] == "finished"
    assert (await account(api, user["token"]))["credits"] == 3_000_000
    # Confirming again finds nothing pending and credits nothing.
    status, body, _ = await api.call(
        "POST", "/billing/crypto/sandbox/confirm", {"order_id": order["order_id"]}, token=user["token"]
    )
    assert status == 200 and body["confirmed_payments"] == 0
    assert (await account(api, user["token"]))["credits"] == 3_000_000


async def test_partial_then_full_payment(api):
    user = await api.register()
    order = await checkout(api, user["token"], "USDCSOL", 80)
    first = await pay(api, user["token"], order["order_id"], 20)
    assert first["order"]["status"] == "partially_paid" and first["order"]["credits_applied"] == 2_000_000
    assert (await account(api, user["token"]))["credits"] == 2_000_000
    second = await pay(api, user["token"], order["order_id"], 60, confirmed=False)
    assert second["order"]["status"] == "confirming" and second["order"]["credits_applied"] == 2_000_000
    assert second["order"]["amount_received"] == {"amount": 80.0, "usd": 80.0}
    assert second["order"]["amount_confirmed"] == {"amount": 20.0, "usd": 20.0}
    status, body, _ = await api.call(
        "POST", "/billing/crypto/sandbox/confirm", {"order_id": order["order_id"]}, token=user["token"]
    )
    assert body["order"]["status"] == "finished" and body["order"]["credits_applied"] == 8_000_000
    me = await account(api, user["token"])
    assert me["credits"] == 8_000_000 and me["total_paid_usd"] == 80


async def test_over_payment_credits_what_was_paid(api):
    user = await api.register()
    order = await checkout(api, user["token"], "BTC", 60)
    paid = await pay(api, user["token"], order["order_id"], 90)
    assert paid["order"]["status"] == "finished" and paid["order"]["credits_applied"] == 9_000_000
    assert paid["order"]["amount_received"] == {"amount": 0.0015, "usd": 90.0}
    assert (await account(api, user["token"]))["credits"] == 9_000_000


@pytest.mark.settings(order_ttl_seconds=1)
async def test_expired_order_stays_uncredited(api, ctx):
    user = await api.register()
    order = await checkout(api, user["token"], "USDTTRC20", 10)
    await asyncio.sleep(1.1)
    await ctx.payments.orders.schedule(order["order_id"], now_utc(), 0)  # due now, instead of in RECONCILE_INTERVAL
    assert await ctx.payments.reconcile_once() == 1
    shown = await order_of(api, user["token"], order["order_id"])
    assert shown["status"] == "expired" and shown["credits_applied"] == 0
    await pay(api, user["token"], order["order_id"], 10, expect=409)
    assert (await account(api, user["token"]))["credits"] == 0
    assert await ctx.payments.reconcile_once() == 0  # final orders are not polled again


async def test_a_crash_between_the_two_writes_is_finished_once(api, ctx):
    """The order records a pending credit before the account is credited; whatever fails in between,
    the reconciler completes it exactly once."""
    user = await api.register()
    order = await checkout(api, user["token"], "USDTTRC20", 40)
    crediting = ctx.payments.crediting
    real = crediting.credit_account

    async def crash(*args):
        raise ConnectionError("database went away")

    crediting.credit_account = crash
    with pytest.raises(ConnectionError):
        await ctx.payments.sandbox_pay(await ctx.payments.orders.get(order["order_id"]), 40, True)
    stored = await ctx.payments.orders.get(order["order_id"])
    assert stored["credits_applied"] == 4_000_000 and len(stored["pending"]) == 1
    assert (await account(api, user["token"]))["credits"] == 0
    # Crash after the account write but before the order forgets the pending credit.
    await real(user["account_id"], stored["pending"][0]["credit_id"], 4_000_000, 40.0)
    crediting.credit_account = real
    assert await ctx.payments.reconcile_once() == 1
    assert await ctx.payments.reconcile_once() == 0
    assert (await ctx.payments.orders.get(order["order_id"]))["pending"] == []
    me = await account(api, user["token"])
    assert me["credits"] == 4_000_000 and me["total_paid_usd"] == 40 and me["plan"] == "paid"


async def test_out_of_order_states_never_move_an_order_back(api, ctx):
    user = await api.register()
    order = await checkout(api, user["token"], "USDTTRC20", 50)
    payment_id, now = (await ctx.payments.orders.get(order["order_id"]))["payment_id"], ms(now_utc())

    def state(status, paid, confirmed, age):
        return PaymentState(payment_id, order["order_id"], status, paid, confirmed, now - timedelta(seconds=age))

    apply = ctx.payments.crediting.apply_payment_state
    await apply(order["order_id"], state("partially_paid", 20, 20, 5))
    stale = await apply(order["order_id"], state("waiting", 0, 0, 10))  # an older read arriving late
    assert stale["status"] == "partially_paid" and stale["credits_applied"] == 2_000_000
    await apply(order["order_id"], state("finished", 50, 50, 0))
    late = await apply(order["order_id"], state("confirming", 20, 0, 3))
    newer = await apply(order["order_id"], state("refunded", 50, 0, -5))  # final: nothing moves it again
    assert late["status"] == newer["status"] == "finished" and newer["credits_applied"] == 5_000_000
    assert (await account(api, user["token"]))["credits"] == 5_000_000


async def test_concurrent_applies_credit_once(api, ctx):
    user = await api.register()
    order = await checkout(api, user["token"], "USDTTRC20", 70)
    finished = PaymentState(
        (await ctx.payments.orders.get(order["order_id"]))["payment_id"],
        order["order_id"],
        "finished",
        70,
        70,
        ms(now_utc()),
    )
    store, lost, everyone_read = ctx.payments.orders, [], asyncio.Event()
    update_state = store.update_state

    async def after_all_read(*args):
        # Hold every write until all 25 have read the order: the worst interleaving, every time.
        lost.append(None)
        if len(lost) == 25:
            everyone_read.set()
        await everyone_read.wait()
        result = await update_state(*args)
        lost.append(result is None)
        return result

    store.update_state = after_all_read
    results = await asyncio.gather(
        *[ctx.payments.crediting.apply_payment_state(order["order_id"], finished) for _ in range(25)]
    )
    assert lost.count(False) == 1 and lost.count(True) == 24  # one write won, 24 lost and re-read
    assert {r["credits_applied"] for r in results} == {7_000_000}
    assert (await account(api, user["token"]))["credits"] == 7_000_000


@settings_(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(STATUSES), st.integers(0, 300), st.integers(-60, 60)), max_size=15))
def test_credits_only_grow_and_never_exceed_the_confirmed_worth(steps):
    """Any sequence of processor reads, in any order: credits never shrink, never exceed what the most
    confirmed read is worth, each credit has a new id, and a final order never changes."""
    start = ms(now_utc())
    order = {
        "_id": "ord_x",
        "status": "waiting",
        "price_usd": 100.0,
        "pay_amount": 200.0,
        "credits_applied": 0,
        "provider_updated_at": None,
    }
    ids, most_confirmed = set(), 0
    for status, paid, age in steps:
        confirmed = paid if status in CONFIRMED or status == "partially_paid" else 0
        most_confirmed = max(most_confirmed, confirmed)
        read = PaymentState("p", "ord_x", status, paid, confirmed, start + timedelta(seconds=age))
        change = plan_change(order, read, 1000)
        if order["status"] in FINAL:
            assert change is None
        if change is None:
            continue
        order.update(change.fields)
        if change.credit:
            assert change.credit["credits"] > 0 and change.credit["credit_id"] not in ids
            ids.add(change.credit["credit_id"])
            order["credits_applied"] += change.credit["credits"]
        assert order["credits_applied"] <= most_confirmed * 500  # 200 coins for 100 USD at 1,000 credits per USD


async def test_cli_pays_through_the_same_path(api, ctx, mongo):
    user = await api.register()
    order = await checkout(api, user["token"], "USDTTRC20", 30)
    env = {**os.environ, "MONGODB_URI": mongo.uri, "MONGODB_DB": ctx.settings.mongodb_db, "GATEWAY_ENV": "development"}
    env.pop("PAYMENTS_PROVIDER", None)

    async def cli(*args):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            os.path.join(ROOT, "gateway.py"),
            *args,
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = await proc.communicate()
        return proc.returncode, out.decode(), err.decode()

    code, out, err = await cli("sandbox-pay", order["order_id"], "30", "--unconfirmed")
    assert code == 0, err
    assert '"status": "confirming"' in out and (await account(api, user["token"]))["credits"] == 0
    code, out, err = await cli("sandbox-confirm", order["order_id"])
    assert code == 0, err
    assert (await order_of(api, user["token"], order["order_id"]))["status"] == "finished"
    assert (await account(api, user["token"]))["credits"] == 3_000_000
    code, _, err = await cli("sandbox-pay", "ord_" + "0" * 20, "5")
    assert code == 1 and "No sandbox order" in err


# --- signed notifications ------------------------------------------------------------------------
def test_signature_is_hmac_sha512_over_sorted_compact_json():
    payload = {"payment_id": 5, "b": {"z": 1, "a": [2.0, {"y": "é", "x": None}]}, "actually_paid": 0.5}
    canonical = '{"actually_paid":0.5,"b":{"a":[2,{"x":null,"y":"é"}],"z":1},"payment_id":5}'
    assert sign("secret", payload) == hmac.new(b"secret", canonical.encode(), hashlib.sha512).hexdigest()


@pytest.mark.settings(payments_ipn_secret=IPN_SECRET)
async def test_bad_signatures_are_401_and_change_nothing(api, ctx):
    user = await api.register()
    order = await checkout(api, user["token"], "USDTTRC20", 20)
    await pay(api, user["token"], order["order_id"], 20, confirmed=False)
    payment_id = (await ctx.payments.orders.get(order["order_id"]))["payment_id"]
    payload = {
        "payment_id": payment_id,
        "order_id": order["order_id"],
        "payment_status": "finished",
        "actually_paid": 20,
    }
    body, headers = FakeProcessor(API_KEY, IPN_SECRET).ipn(payload)
    for raw, sent in [
        (body, {}),  # no signature
        (body, {SIGNATURE_HEADER: "0" * 128}),  # wrong signature
        (body, {SIGNATURE_HEADER: sign("another secret", payload)}),  # another key
        (body.replace(b"20", b"99"), headers),  # body changed after signing
        (b"not json", {SIGNATURE_HEADER: "ab"}),
        (body, {SIGNATURE_HEADER: "é" * 128}),
    ]:
        status, answer, _ = await api.call("POST", "/billing/crypto/ipn", raw=raw, headers=sent)
        assert status == 401 and answer == {"detail": "Invalid notification signature"}
    assert (await order_of(api, user["token"], order["order_id"]))["status"] == "confirming"
    # A valid signature is only a trigger: the chain says "confirming", so nothing is credited.
    status, answer, _ = await ipn(api, payload)
    assert status == 200 and answer == {"status": "ok"}
    assert (await account(api, user["token"]))["credits"] == 0


async def test_without_a_secret_every_notification_is_refused(api):
    payload = {"payment_id": "1", "order_id": "ord_" + "0" * 20, "payment_status": "finished"}
    assert (await ipn(api, payload, secret=""))[0] == 401
    assert (await ipn(api, payload))[0] == 401


# --- the real-protocol provider against the fake processor ---------------------------------------
async def nowpayments_order(api, processor, amount=100, currency="USDTTRC20"):
    user = await api.register()
    order = await checkout(api, user["token"], currency, amount)
    payment_id = next(p for p, v in processor.payments.items() if v["order_id"] == order["order_id"])
    return user, order, payment_id


@NOWPAYMENTS
async def test_processor_checkout_and_notification(api, processor, http_port):
    status, config, _ = await api.call("GET", "/billing/crypto/config")
    assert {c["code"]: c["min_usd"] for c in config["currencies"]}["USDTTRC20"] == 2.5  # the processor's minimum wins
    user, order, payment_id = await nowpayments_order(api, processor, 100)
    sent = processor.payments[payment_id]
    assert order["pay_address"] == sent["pay_address"] and order["pay_amount"] == 100.0
    assert sent["ipn_callback_url"] == f"http://localhost:{http_port}/billing/crypto/ipn"
    assert sent["price_amount"] == 100 and sent["pay_currency"] == "usdttrc20"
    processor.settle(payment_id, "confirming", 100)
    assert await processor.notify(payment_id) == 200
    assert (await account(api, user["token"]))["credits"] == 0
    processor.settle(payment_id, "finished", 100)
    assert await processor.notify(payment_id) == 200
    me = await account(api, user["token"])
    assert me["credits"] == 10_000_000 and me["plan"] == "paid" and me["total_paid_usd"] == 100
    assert (await order_of(api, user["token"], order["order_id"]))["status"] == "finished"


@NOWPAYMENTS
async def test_processor_minimum_and_outage(api, processor):
    user = await api.register()
    status, body, _ = await api.call(
        "POST", "/billing/crypto/checkout", {"currency": "USDTTRC20", "amount_usd": 2}, token=user["token"]
    )
    assert status == 422 and "2.5" in body["detail"][0]["msg"]
    processor.down = True
    status, body, _ = await api.call(
        "POST", "/billing/crypto/checkout", {"currency": "ETH", "amount_usd": 50}, token=user["token"]
    )
    assert status == 502 and body == {"detail": "The payment processor is unavailable; try again shortly"}
    assert (await api.call("GET", "/billing/crypto/orders", token=user["token"]))[1] == []


@NOWPAYMENTS
async def test_duplicate_and_reordered_notifications_add_nothing(api, processor):
    user, order, payment_id = await nowpayments_order(api, processor, 50)
    early = processor.settle(payment_id, "confirming", 50)
    final = processor.settle(payment_id, "finished", 50)
    for payload in [final, final, early, final, early]:  # replayed, and the older one arriving last
        assert (await ipn(api, payload))[0] == 200
    assert (await account(api, user["token"]))["credits"] == 5_000_000
    shown = await order_of(api, user["token"], order["order_id"])
    assert shown["status"] == "finished" and shown["credits_applied"] == 5_000_000
    # The notification's own claims are never trusted: a forged "finished" for another order re-reads that order.
    _, other, other_payment = await nowpayments_order(api, processor, 50)
    assert (await ipn(api, {**final, "order_id": other["order_id"], "payment_id": other_payment}))[0] == 200
    assert (await order_of(api, user["token"], order["order_id"]))["credits_applied"] == 5_000_000
    assert (await ipn(api, {**final, "order_id": other["order_id"]}))[1] == {"status": "ignored"}  # payment mismatch
    # One receipt for the one payment, however often it was notified (docs/billing.md).
    for payload in [final, final]:
        assert (await ipn(api, payload))[0] == 200
    status, receipts, _ = await api.call("GET", "/billing/receipts", token=user["token"])
    assert status == 200 and [(r["order_id"], r["amount_usd"], r["payment_reference"]) for r in receipts] == [
        (order["order_id"], 50, payment_id)
    ]


@NOWPAYMENTS
async def test_concurrent_notifications_credit_exactly_once(api, processor):
    user, order, payment_id = await nowpayments_order(api, processor, 75)
    payload = processor.settle(payment_id, "finished", 75)
    results = await asyncio.gather(*[ipn(api, payload) for _ in range(20)])
    assert [r[0] for r in results] == [200] * 20
    me = await account(api, user["token"])
    assert me["credits"] == 7_500_000 and me["total_paid_usd"] == 75


@NOWPAYMENTS
async def test_processor_partial_then_full_and_over_payment(api, processor):
    user, order, payment_id = await nowpayments_order(api, processor, 40, "LTC")
    assert order["pay_amount"] == 0.5
    await ipn(api, processor.settle(payment_id, "partially_paid", 0.1))
    shown = await order_of(api, user["token"], order["order_id"])
    assert shown["status"] == "partially_paid" and shown["credits_applied"] == 800_000  # 0.1 of 0.5 LTC: 8 USD
    await ipn(api, processor.settle(payment_id, "finished", 0.6))  # 0.6 LTC in all: 48 USD
    assert (await account(api, user["token"]))["credits"] == 4_800_000


@NOWPAYMENTS
async def test_processor_expiry_and_failure_credit_nothing(api, processor):
    user, order, payment_id = await nowpayments_order(api, processor, 50)
    await ipn(api, processor.settle(payment_id, "expired", 0))
    await ipn(api, processor.settle(payment_id, "finished", 50))  # a final order never moves again
    shown = await order_of(api, user["token"], order["order_id"])
    assert shown["status"] == "expired" and shown["credits_applied"] == 0
    _, failed, failed_payment = await nowpayments_order(api, processor, 50)
    await ipn(api, processor.settle(failed_payment, "failed", 50))
    assert (await account(api, user["token"]))["credits"] == 0


@NOWPAYMENTS
async def test_unreachable_processor_on_notification_is_503(api, processor):
    user, order, payment_id = await nowpayments_order(api, processor, 50)
    payload = processor.settle(payment_id, "finished", 50)
    processor.down = True
    status, body, _ = await ipn(api, payload)
    assert status == 503 and (await account(api, user["token"]))["credits"] == 0
    processor.down = False
    assert (await ipn(api, payload))[0] == 200
    assert (await account(api, user["token"]))["credits"] == 5_000_000


@pytest.mark.settings(payments_provider="nowpayments", reconcile_interval=0.2)
async def test_reconciler_credits_after_a_lost_notification(api, processor):
    user, order, payment_id = await nowpayments_order(api, processor, 30)
    processor.settle(payment_id, "finished", 30)  # the processor's notification never arrives
    for _ in range(100):
        if (await account(api, user["token"]))["credits"]:
            break
        await asyncio.sleep(0.05)
    me = await account(api, user["token"])
    assert me["credits"] == 3_000_000 and me["plan"] == "paid"
    assert (await order_of(api, user["token"], order["order_id"]))["status"] == "finished"
    polls = processor.calls.count(f"GET /v1/payment/{payment_id}")
    await asyncio.sleep(0.5)
    assert processor.calls.count(f"GET /v1/payment/{payment_id}") == polls  # final orders are not polled again


# --- production ----------------------------------------------------------------------------------
@pytest.mark.settings(env="production")
async def test_production_refusals(api):
    user = await api.register()
    key = await api.new_key(user["token"])
    status, body, _ = await api.call("POST", f"/keys/{key['key_id']}/topup", {"credits": 100}, token=user["token"])
    assert status == 403
    status, body, headers = await api.call(
        "POST", "/billing/crypto/checkout", {"currency": "BTC", "amount_usd": 50}, token=user["token"]
    )
    assert status == 503 and body == {"detail": "Crypto payments are not configured on this server"}
    assert headers["Retry-After"] == "3600"  # every 503 says when to look again: a configuration, not a blip
    assert (await api.call("GET", "/billing/crypto/config"))[1]["currencies"] == []
    for path, payload in [
        ("/billing/crypto/sandbox/pay", {"order_id": "ord_" + "0" * 20, "amount_usd": 5}),
        ("/billing/crypto/sandbox/confirm", {"order_id": "ord_" + "0" * 20}),
    ]:
        status, body, _ = await api.call("POST", path, payload, token=user["token"])
        assert status == 404 and body == {"detail": "Not found"}
    assert (await account(api, user["token"]))["credits"] == 0


@pytest.mark.settings(env="production", payments_provider="nowpayments")
async def test_production_with_a_processor_has_no_sandbox(api, processor):
    user, order, payment_id = await nowpayments_order(api, processor, 50)
    status, _, _ = await api.call(
        "POST", "/billing/crypto/sandbox/pay", {"order_id": order["order_id"], "amount_usd": 50}, token=user["token"]
    )
    assert status == 404
    await ipn(api, processor.settle(payment_id, "finished", 50))
    assert (await account(api, user["token"]))["credits"] == 5_000_000


def test_settings_validation():
    import config

    with pytest.raises(config.SettingsError, match="PAYMENTS_API_KEY"):
        make_settings(payments_provider="nowpayments")
    with pytest.raises(config.SettingsError, match="PAYMENTS_PROVIDER"):
        make_settings(payments_provider="coinbase")
    masked = make_settings(
        payments_provider="nowpayments",
        payments_api_key="k" * 10,
        payments_ipn_secret="s" * 10,
        public_url="https://gw.example.com",
    ).safe_items()
    assert masked["payments_api_key"] == masked["payments_ipn_secret"] == "***"
