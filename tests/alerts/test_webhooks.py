"""Alerts and webhooks in one process (README, "Alerts and webhooks"): each crossing makes one event, delivered
signed (the receiver verifies with the `standardwebhooks` verifier), retried until a 2xx, logged per endpoint;
a top-up re-arms a low-balance rule; tampered and replayed deliveries fail verification; production refuses
private receivers at registration and at connection time; an endpoint failing too long is disabled with a
notice. The same across processes: tests/alerts/test_alerts_scaleout.py."""

import asyncio
import email
from datetime import UTC, datetime, timedelta

import pytest
from standardwebhooks import Webhook, WebhookVerificationError
from support import FAST, Receiver, make_settings

from webhooks.guard import GuardedResolver, Refused, refused_address
from webhooks.signing import signed_headers

pytestmark = pytest.mark.gen_test(timeout=60)
FAST_ALERTS = dict(
    alert_check_seconds=0.1, webhook_poll_seconds=0.2, webhook_retry_schedule=(0.2, 0.4), plan_rules=FAST
)
PRICE = 18  # user/info


def info(catalog) -> str:
    return f"/social/user/info?userName={catalog['users'][0]['userName']}"


async def hooked(api, credits: int, receiver: Receiver) -> tuple[dict, dict, dict]:
    """An account with `credits`, a key and a webhook endpoint pointing at `receiver` (its secret set there)."""
    user, key = await api.funded_key(credits)
    status, endpoint, _ = await api.call("POST", "/webhooks", {"url": receiver.url}, token=user["token"])
    assert status == 200 and endpoint["secret"].startswith("whsec_"), endpoint
    receiver.secret = endpoint["secret"]
    return user, key, endpoint


async def spend(api, key: dict, catalog, calls: int) -> None:
    for _ in range(calls):
        status, _, _ = await api.call("GET", info(catalog), key=key["key"])
        assert status in (200, 402)


async def call(api, method: str, path: str, token: str):
    return await api.call(method, path, {"enabled": True}, token=token)


async def settle(seconds: float = 1.0) -> None:
    """Lets the detector and the dispatcher run several rounds (the invariant is a count, not a delay)."""
    await asyncio.sleep(seconds)


@pytest.mark.settings(**FAST_ALERTS)
async def test_a_balance_crossing_sends_one_signed_event_and_a_top_up_re_arms_it(api, catalog):
    receiver = Receiver()
    user, key, endpoint = await hooked(api, 100 * PRICE, receiver)
    status, rule, _ = await api.call(
        "POST", "/alerts", {"kind": "balance_below", "credits": 50 * PRICE}, token=user["token"]
    )
    assert status == 200 and rule["armed"] and rule["kind"] == "balance_below", rule
    await spend(api, key, catalog, 60)  # crosses 50 calls' worth once, then goes on below it
    events = await receiver.until(1)
    await settle()
    # Invariant: one crossing, one event, whatever the number of checks that saw the balance below.
    assert [e["type"] for e in receiver.verified] == ["balance.low"] and receiver.rejected == 0
    data = events[0]["data"]
    assert data["rule_id"] == rule["rule_id"] and data["threshold_credits"] == 50 * PRICE
    assert data["balance_credits"] < 50 * PRICE and data["crossing"] == 1
    _, rows, _ = await api.call("GET", "/alerts", token=user["token"])
    assert rows[0]["armed"] is False and rows[0]["fired_at"]
    # A top-up back over the threshold re-arms; the next crossing is a second event.
    status, _, _ = await api.call("POST", f"/keys/{key['key_id']}/topup", {"credits": 40 * PRICE}, token=user["token"])
    assert status == 200
    await settle(0.5)
    _, rows, _ = await api.call("GET", "/alerts", token=user["token"])
    assert rows[0]["armed"] is True
    await spend(api, key, catalog, 45)
    await receiver.until(2)
    await settle()
    assert [e["data"]["crossing"] for e in receiver.verified] == [1, 2]
    # The portal's list of what fired, and the endpoint's delivery log.
    _, fired, _ = await api.call("GET", "/alerts/events", token=user["token"])
    assert [e["type"] for e in fired] == ["balance.low", "balance.low"]
    _, log, _ = await api.call("GET", f"/webhooks/{endpoint['endpoint_id']}/deliveries", token=user["token"])
    assert [(d["state"], d["attempts"], d["last_status"]) for d in log] == [("delivered", 1, 200)] * 2
    receiver.stop()


@pytest.mark.settings(**FAST_ALERTS)
async def test_a_receiver_that_fails_gets_retries_then_one_delivery_and_a_redelivery_on_request(api):
    receiver = Receiver()
    receiver.status = 503
    user, _, endpoint = await hooked(api, 1000, receiver)
    base = f"/webhooks/{endpoint['endpoint_id']}"
    assert (await api.call("POST", base + "/test", {}, token=user["token"]))[0] == 200
    for _ in range(100):  # until two attempts failed
        _, log, _ = await api.call("GET", base + "/deliveries", token=user["token"])
        if log and log[0]["attempts"] >= 2:
            break
        await asyncio.sleep(0.05)
    assert log[0]["state"] == "pending" and log[0]["last_status"] == 503 and log[0]["next_attempt_at"]
    receiver.status = 200
    events = await receiver.until(1)
    await settle(0.6)
    # Invariant: every attempt carried the same webhook-id (receivers dedupe on it); one was acknowledged.
    assert len(events) == 1 and events[0]["type"] == "webhook.test"
    assert {h["webhook-id"] for _, h in receiver.raw} == {events[0]["webhook-id"]}
    _, log, _ = await api.call("GET", base + "/deliveries", token=user["token"])
    assert log[0]["state"] == "delivered" and log[0]["attempts"] >= 3
    assert [a["status"] for a in log[0]["log"]][-1] == 200 and log[0]["next_attempt_at"] is None
    # Metrics: deliveries by outcome, queue depth, oldest undelivered age.
    text = (await api.http.fetch(api.base + "/metrics")).body.decode()
    assert 'gateway_webhook_deliveries_total{outcome="delivered",worker="0"} 1.0' in text
    assert 'gateway_webhook_deliveries_total{outcome="retried",worker="0"}' in text
    assert "gateway_webhook_queue_depth" in text and "gateway_webhook_oldest_pending_age_seconds" in text
    # Redeliver: once more, same id, on request.
    status, row, _ = await api.call(
        "POST", f"{base}/deliveries/{log[0]['delivery_id']}/redeliver", {}, token=user["token"]
    )
    assert status == 200 and row["state"] == "pending"
    await receiver.until(2)
    assert [e["webhook-id"] for e in receiver.verified] == [events[0]["webhook-id"]] * 2
    receiver.stop()


async def test_tampered_replayed_and_foreign_deliveries_fail_verification(api):
    receiver = Receiver()
    user, _, endpoint = await hooked(api, 1000, receiver)
    assert (await api.call("POST", f"/webhooks/{endpoint['endpoint_id']}/test", {}, token=user["token"]))[0] == 200
    (event,) = await receiver.until(1)
    body, headers = receiver.raw[0]
    verifier = Webhook(endpoint["secret"])
    assert verifier.verify(body, headers)["type"] == "webhook.test"
    with pytest.raises(WebhookVerificationError):
        verifier.verify(body.replace(b"webhook.test", b"balance.low"), headers)  # tampered body
    with pytest.raises(WebhookVerificationError):
        verifier.verify(body, {**headers, "webhook-id": "evt_other"})  # the signature binds the id
    # Replayed later: a signature made 10 minutes ago (as a replayer would hold) is refused for its age.
    old = datetime.now(UTC) - timedelta(minutes=10)
    with pytest.raises(WebhookVerificationError):
        verifier.verify(body, signed_headers([endpoint["secret"]], headers["webhook-id"], old, body))
    # Another endpoint's secret does not verify this one's deliveries; a rolled secret replaces it.
    _, other, _ = await api.call("POST", "/webhooks", {"url": receiver.url}, token=user["token"])
    with pytest.raises(WebhookVerificationError):
        Webhook(other["secret"]).verify(body, headers)
    status, rolled, _ = await api.call("POST", f"/webhooks/{endpoint['endpoint_id']}/roll", {}, token=user["token"])
    assert status == 200 and rolled["secret"] != endpoint["secret"] and "secret" not in rolled["url"]
    _, listed, _ = await api.call("GET", "/webhooks", token=user["token"])
    assert all("secret" not in row for row in listed)  # shown once: at creation and at a roll
    receiver.stop()


@pytest.mark.settings(env="production")
async def test_production_refuses_private_and_plain_http_receivers_at_registration(api):
    user = await api.register()
    for url in (
        "http://example.com/hook",  # not https
        "https://127.0.0.1/hook",
        "https://localhost/hook",
        "https://10.1.2.3/hook",
        "https://169.254.169.254/latest/meta-data",
        "https://[::1]/hook",
        "https://[::ffff:127.0.0.1]/hook",
        "https://user:pw@example.com/hook",
    ):
        status, body, _ = await api.call("POST", "/webhooks", {"url": url}, token=user["token"])
        assert status == 422 and body["detail"][0]["loc"] == ["body", "url"], (url, body)


@pytest.mark.settings(env="production", **FAST_ALERTS)
async def test_production_checks_addresses_again_at_connection_time(api, ctx):
    """DNS rebinding: an endpoint accepted earlier whose name now resolves to loopback is refused when the
    delivery connects (the guard sits in the HTTP client's resolver), and the receiver hears nothing."""
    receiver = Receiver()
    user = await api.register()
    endpoint_id = "we_rebound"
    await ctx.webhook_store.add_endpoint(
        {
            "_id": endpoint_id,
            "account_id": user["account_id"],
            "url": f"https://localhost:{receiver.port}/hook",
            "secret": ctx.vault.encrypt("whsec_" + "A" * 32, f"webhook:{endpoint_id}"),
            "enabled": True,
            "failing_since": None,
            "created_at": datetime.now(UTC),
        },
        10,
    )
    assert (await api.call("POST", f"/webhooks/{endpoint_id}/test", {}, token=user["token"]))[0] == 200
    for _ in range(100):
        _, log, _ = await api.call("GET", f"/webhooks/{endpoint_id}/deliveries", token=user["token"])
        if log and log[0]["attempts"]:
            break
        await asyncio.sleep(0.05)
    assert log[0]["last_error"].startswith("refused: localhost resolves to a loopback address"), log[0]
    assert receiver.raw == []
    receiver.stop()


@pytest.mark.parametrize(
    "address,reason",
    [
        ("127.0.0.1", "a loopback address"),
        ("10.0.0.1", "a private address"),
        ("172.16.5.4", "a private address"),
        ("192.168.1.1", "a private address"),
        ("169.254.169.254", "a link-local address (cloud metadata included)"),
        ("100.64.0.1", "a private address"),
        ("0.0.0.0", "not a unicast address"),
        ("224.0.0.1", "not a unicast address"),
        ("::1", "a loopback address"),
        ("::", "not a unicast address"),
        ("fd00::1", "a private address"),
        ("fe80::1%eth0", "a link-local address (cloud metadata included)"),
        ("fec0::1", "a site-local address"),
        ("2001:db8::1", "a documentation address"),
        # IPv6 forms that lead to an IPv4 address are judged by it, whatever Python's version calls them.
        ("::ffff:10.0.0.1", "a private address in IPv4-mapped form"),
        ("::ffff:127.0.0.1", "a loopback address in IPv4-mapped form"),
        ("64:ff9b::7f00:1", "a loopback address in NAT64 form"),
        ("64:ff9b::a9fe:a9fe", "a link-local address (cloud metadata included) in NAT64 form"),
        ("2002:7f00:1::1", "a loopback address in 6to4 form"),
        ("2002:a00:1::1", "a private address in 6to4 form"),
        ("2002:c0a8:101::1", "a private address in 6to4 form"),
        ("2002:a9fe:a9fe::", "a link-local address (cloud metadata included) in 6to4 form"),
        ("2002:6440:1::1", "a private address in 6to4 form"),
        ("2002::1", "not a unicast address in 6to4 form"),
        # Forms whose IPv4 end cannot be checked here (tunnelled, translated, deprecated): refused whole.
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "a Teredo tunnel address"),
        ("2001::1", "a Teredo tunnel address"),
        ("64:ff9b:1::a00:1", "a local-use NAT64 address"),
        ("::a00:1", "an IPv4-compatible address (deprecated)"),
        ("::5db8:d822", "an IPv4-compatible address (deprecated)"),
        ("::ffff:0:7f00:1", "an IPv4-translated address"),
        # Public, in every form.
        ("93.184.216.34", None),
        ("2606:2800:220:1:248:1893:25c8:1946", None),
        ("::ffff:93.184.216.34", None),
        ("64:ff9b::5db8:d822", None),
        ("2002:5db8:d822::1", None),
    ],
)
def test_the_address_rules(address, reason):
    assert refused_address(address) == reason


async def test_the_guarded_resolver_refuses_a_name_with_any_private_address():
    with pytest.raises(Refused):
        await GuardedResolver(allow_private=False).resolve("localhost", 443)
    assert await GuardedResolver(allow_private=True).resolve("localhost", 443)  # WEBHOOK_ALLOW_PRIVATE


async def test_rule_and_endpoint_validation_is_422_in_the_spec_shape_and_other_accounts_get_404(api):
    user, other = await api.register(), await api.register()
    for body, loc in (
        ({"kind": "balance_below"}, ["body", "credits"]),
        ({"kind": "balance_below", "credits": 5, "percent": 20}, ["body"]),
        ({"kind": "balance_below", "percent": 100}, ["body", "percent"]),
        ({"kind": "key_budget", "levels": [70]}, ["body", "levels"]),
        ({"kind": "order_status", "statuses": ["paid"]}, ["body", "statuses"]),
        ({"kind": "order_status", "credits": 5}, ["body", "credits"]),
        ({"kind": "nope"}, ["body", "kind"]),
        ({"kind": "daily_spend_above", "usd": 1, "extra": 1}, ["body", "extra"]),
    ):
        status, answer, _ = await api.call("POST", "/alerts", body, token=user["token"])
        assert status == 422 and answer["detail"][0]["loc"] == loc, (body, answer)
    status, answer, _ = await api.call("POST", "/webhooks", {"url": "ftp://example.com/x"}, token=user["token"])
    assert status == 422 and answer["detail"][0]["loc"] == ["body", "url"]
    _, rule, _ = await api.call("POST", "/alerts", {"kind": "balance_below", "percent": 20}, token=user["token"])
    _, endpoint, _ = await api.call("POST", "/webhooks", {"url": "http://127.0.0.1:9/h"}, token=user["token"])
    eid = endpoint["endpoint_id"]
    for limit, expected in ((1, 200), (500, 200), (0, 422), (501, 422)):
        status, _, _ = await api.call("GET", f"/webhooks/{eid}/deliveries?limit={limit}", token=user["token"])
        assert status == expected, limit
    for method, path in (
        ("DELETE", f"/alerts/{rule['rule_id']}"),
        ("DELETE", f"/webhooks/{eid}"),
        ("PATCH", f"/webhooks/{eid}"),
        ("POST", f"/webhooks/{eid}/roll"),
        ("POST", f"/webhooks/{eid}/test"),
        ("GET", f"/webhooks/{eid}/deliveries"),
        ("POST", f"/webhooks/{eid}/deliveries/x.y/redeliver"),
    ):
        status, _, _ = await call(api, method, path, other["token"])
        assert status == 404, (method, path)
    assert (await api.call("GET", "/alerts", token=other["token"]))[1] == []
    assert (await call(api, "DELETE", f"/alerts/{rule['rule_id']}", user["token"]))[0] == 200
    assert (await api.call("GET", "/alerts", token=user["token"]))[1] == []


@pytest.fixture
def settings(request, inbox):
    """SMTP_URL at the in-process SMTP server (with each test's own settings)."""
    marker = request.node.get_closest_marker("settings")
    return make_settings(smtp_url=f"smtp://127.0.0.1:{inbox.port}", **(marker.kwargs if marker else {}))


def subjects(inbox) -> list[str]:
    return [" ".join(email.message_from_string(m["data"])["Subject"].split()) for m in inbox.messages]


@pytest.mark.settings(**FAST_ALERTS)
async def test_smtp_sends_the_same_alert_once_to_the_account_address(api, catalog, inbox):
    """With SMTP_URL, an alert goes by email too: one message per crossing, to the account's address."""
    receiver = Receiver()
    user, key, _ = await hooked(api, 40 * PRICE, receiver)
    await api.call("POST", "/alerts", {"kind": "balance_below", "usd": 20 * PRICE / 100_000}, token=user["token"])
    await spend(api, key, catalog, 25)
    (message,) = (await inbox.until(1))[:1]
    await receiver.until(1)
    await settle()
    assert len(inbox.messages) == 1 and message["to"] == [user["email"]]
    assert "Balance" in subjects(inbox)[0] and "balance_credits" in message["data"]
    assert [e["type"] for e in receiver.verified] == ["balance.low"]
    receiver.stop()


@pytest.mark.settings(**FAST_ALERTS, webhook_disable_after=0.5)
async def test_an_endpoint_failing_past_the_limit_is_disabled_with_a_notice(api, inbox):
    """WEBHOOK_DISABLE_AFTER (days in production, half a second here): disabled once, a notice in the
    endpoint list and one email; further events are not sent to it; re-enabling clears the notice."""
    receiver = Receiver()
    receiver.status = 500
    user, _, endpoint = await hooked(api, 1000, receiver)
    base = f"/webhooks/{endpoint['endpoint_id']}"
    await api.call("POST", base + "/test", {}, token=user["token"])
    for _ in range(200):
        _, rows, _ = await api.call("GET", "/webhooks", token=user["token"])
        if not rows[0]["enabled"]:
            break
        await asyncio.sleep(0.05)
    assert rows[0]["enabled"] is False and rows[0]["disabled_reason"].startswith("failing since")
    await inbox.until(1)
    await settle(0.5)
    assert len(inbox.messages) == 1 and "disabled" in subjects(inbox)[0]
    sent = len(receiver.raw)
    await api.call("POST", base + "/test", {}, token=user["token"])
    await settle(0.8)
    assert len(receiver.raw) == sent  # a disabled endpoint receives nothing
    status, row, _ = await api.call("PATCH", base, {"enabled": True}, token=user["token"])
    assert status == 200 and row["enabled"] and row["disabled_reason"] is None and row["failing_since"] is None
    receiver.stop()


@pytest.mark.settings(**FAST_ALERTS)
async def test_key_budget_daily_spend_and_order_status_rules_each_fire_once_per_crossing(api, catalog):
    """A key's budget at 50 % and 100 % of its day, the account's spend in the UTC day, and a top-up order's
    statuses: each crossing one event, however many checks see it."""
    receiver = Receiver()
    user, key, _ = await hooked(api, 1000 * PRICE, receiver)
    token = user["token"]
    status, _, _ = await api.call(
        "PATCH", f"/keys/{key['key_id']}", {"credit_limit": 20 * PRICE, "credit_limit_period": "day"}, token=token
    )
    assert status == 200
    for rule in (
        {"kind": "key_budget", "levels": [50, 100]},
        {"kind": "daily_spend_above", "credits": 5 * PRICE},
        {"kind": "order_status", "statuses": ["partially_paid", "finished", "credited"]},
    ):
        assert (await api.call("POST", "/alerts", rule, token=token))[0] == 200
    await spend(api, key, catalog, 25)  # 20 calls fit the budget, then 402
    await receiver.until(3)
    _, order, _ = await api.call(
        "POST", "/billing/crypto/checkout", {"currency": "USDTTRC20", "amount_usd": 10}, token=token
    )
    paid = {"order_id": order["order_id"], "amount_usd": 4}
    assert (await api.call("POST", "/billing/crypto/sandbox/pay", paid, token=token))[0] == 200
    paid["amount_usd"] = 6
    assert (await api.call("POST", "/billing/crypto/sandbox/pay", paid, token=token))[0] == 200
    await receiver.until(7)
    await settle()
    types = sorted((e["type"], e["data"].get("level") or e["data"].get("status") or "") for e in receiver.verified)
    assert types == [
        ("key_budget.reached", 50),
        ("key_budget.reached", 100),
        ("order.status", "credited"),
        ("order.status", "credited"),  # one per credit: the partial payment's and the rest's
        ("order.status", "finished"),
        ("order.status", "partially_paid"),
        ("spend.daily_above", ""),
    ], types
    assert receiver.rejected == 0
    receiver.stop()


@pytest.mark.settings(**FAST_ALERTS)
async def test_a_redirect_is_a_failure_and_is_not_followed(api):
    receiver, target = Receiver(), Receiver()
    receiver.status = 307  # with a Location to another receiver: a followed redirect would reach it
    user, _, endpoint = await hooked(api, 1000, receiver)
    receiver.location = target.url
    base = f"/webhooks/{endpoint['endpoint_id']}"
    await api.call("POST", base + "/test", {}, token=user["token"])
    for _ in range(100):
        _, log, _ = await api.call("GET", base + "/deliveries", token=user["token"])
        if log and log[0]["attempts"] >= 2:
            break
        await asyncio.sleep(0.05)
    assert log[0]["state"] == "pending" and log[0]["last_status"] == 307 and log[0]["last_error"] == "HTTP 307"
    assert target.raw == [] and len(receiver.raw) >= 2
    receiver.stop()
    target.stop()


async def rules_until(api, token: str, ready) -> list[dict]:
    """GET /alerts until `ready(rows)` (the detector records a crossing right after writing its event)."""
    for _ in range(200):
        status, rows, _ = await api.call("GET", "/alerts", token=token)
        assert status == 200, rows
        if ready(rows):
            return rows
        await asyncio.sleep(0.1)
    raise AssertionError(f"GET /alerts never showed it: {rows}")


@pytest.mark.settings(**FAST_ALERTS)
async def test_a_daily_spend_rule_that_fired_says_when_and_waits_for_the_next_day(api, catalog):
    """The receiver has the event: GET /alerts says so too (fired_at, and not armed until the next UTC day)."""
    receiver = Receiver()
    user, key, _ = await hooked(api, 1000 * PRICE, receiver)
    token = user["token"]
    status, rule, _ = await api.call("POST", "/alerts", {"kind": "daily_spend_above", "credits": 100}, token=token)
    assert status == 200 and rule["armed"] and rule["fired_at"] is None, rule
    await spend(api, key, catalog, 10)  # 180 credits, above 100
    (event,) = await receiver.until(1)
    assert event["type"] == "spend.daily_above", event
    (row,) = await rules_until(api, token, lambda rows: rows[0]["fired_at"] is not None)
    assert row["armed"] is False, row
    fired = datetime.fromisoformat(row["fired_at"].replace("Z", "+00:00"))
    assert fired.date() == datetime.now(UTC).date(), row
    receiver.stop()


async def test_a_threshold_under_a_cent_reads_as_its_amount(api):
    """$0.001 (100 credits) is not "$0.00"; whole cents keep two decimals."""
    user = await api.register()
    for usd, text in ((0.001, "$0.001"), (0.0125, "$0.0125"), (12.5, "$12.50"), (1234, "$1,234.00")):
        status, rule, _ = await api.call(
            "POST", "/alerts", {"kind": "daily_spend_above", "usd": usd}, token=user["token"]
        )
        assert status == 200 and rule["description"] == f"Spend in a UTC day above {text}", rule
