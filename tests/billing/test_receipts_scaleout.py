"""Receipt numbers across processes and machines (docs/billing.md): 200 payments settled at once through a served
gateway with `--workers 2` and a second gateway (this test's own) on the same database are numbered 1..200, no gap,
no duplicate, one receipt per payment; re-reading every payment afterwards issues nothing."""

import asyncio
import itertools

import orjson
import pytest
from support import Gateway, make_settings

from payments.currencies import CURRENCIES

pytestmark = pytest.mark.gen_test(timeout=240)
ACCOUNTS, PAYMENTS = 4, 200
# The served gateway's secrets (gateway_testing/stack.py): both gateways accept each other's sessions and keys.
SECRETS = {"jwt_secret": "stack-jwt-secret-" + "x" * 32, "secrets_key": "stack-secrets-key-" + "y" * 32}


@pytest.fixture
def settings():
    return make_settings(**SECRETS)


@pytest.fixture
def served(io_loop, ctx, mongo, upstream_url):
    """`serve --workers 2` on the database of this test's own gateway (`ctx`, `api`)."""
    gw = Gateway(mongo.uri, upstream_url, ctx.settings.mongodb_db, workers=2)
    return io_loop.run_sync(gw.launch, timeout=180)


class Served:
    """The `api` client's call over the served gateway: (status, JSON body, headers)."""

    def __init__(self, gw: Gateway):
        self.gw = gw

    async def call(self, method: str, path: str, body=None, token: str | None = None):
        response = await self.gw.call(method, path, body, Authorization=f"Bearer {token}")
        return response.code, orjson.loads(response.body), response.headers


async def test_payments_settled_at_once_on_every_process_are_numbered_without_gap_or_duplicate(api, ctx, served):
    users = [await api.register() for _ in range(ACCOUNTS)]
    # The orders, placed by the checkout's own code (200 checkouts over HTTP are one at a time per account, by the
    # checkout throttle: 20 s on a busy machine); what is tested is their payment.
    placed = await asyncio.gather(
        *(
            ctx.payments.checkout(users[n % ACCOUNTS]["account_id"], CURRENCIES["USDTTRC20"], 10)
            for n in range(PAYMENTS)
        )
    )
    orders = [(users[n % ACCOUNTS]["token"], order["_id"]) for n, order in enumerate(placed)]
    # Every payment at once, spread over the three processes: the served pair (one port) and this one.
    places = itertools.cycle([Served(served), api])

    async def pay(token: str, order_id: str, path: str = "pay") -> None:
        body = {"order_id": order_id} | ({"amount_usd": 10} if path == "pay" else {})
        status, answer, _ = await next(places).call("POST", f"/billing/crypto/sandbox/{path}", body, token=token)
        assert status == 200, answer

    await asyncio.gather(*(pay(token, order) for token, order in orders))
    documents = await ctx.billing.store.documents.find({"series": "R"}).to_list(None)
    assert sorted(d["seq"] for d in documents) == list(range(1, PAYMENTS + 1))
    assert len({d["_id"] for d in documents}) == PAYMENTS
    assert sorted(d["payment"]["order_id"] for d in documents) == sorted(order for _, order in orders)
    # Re-reading payments (what a re-delivered notification does) issues nothing new.
    await asyncio.gather(*(pay(token, order, "confirm") for token, order in orders[:40]))
    assert await ctx.billing.store.documents.count_documents({}) == PAYMENTS
    # Each account lists its own, newest first.
    status, listed, _ = await Served(served).call("GET", "/billing/receipts", token=users[0]["token"])
    numbers = [r["number"] for r in listed]
    assert len(numbers) == PAYMENTS // ACCOUNTS and numbers == sorted(numbers, reverse=True)
