"""The one path by which a payment becomes credits: `Crediting.apply_payment_state`.

Used by the notification endpoint, the sandbox chain and the reconciler alike.
Guarantees (each with the write that gives it):
- only confirmed amounts count, valued at the order's quote; each change adds only
  the delta between what they are worth and `credits_applied` (never negative);
- the order changes by compare-and-set on its revision, refused once final: of
  concurrent or replayed notifications exactly one records a given delta;
- that write also records the credit as pending, with a deterministic id. The
  account is then credited by a write guarded by that id (a retry is a no-op),
  and only then is the credit taken off `pending`. A crash in between leaves a
  pending credit that the next notification or the reconciler finishes.
"""

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from decimal import ROUND_FLOOR, Decimal

from payments.currencies import cents, usd_worth
from payments.provider import PaymentState
from storage.clock import now_utc
from storage.orders import FINAL, OrderStore

log = logging.getLogger("gateway.payments")

# credit(account_id, credit_id, credits, paid_usd): adds the credits once per credit id.
CreditAccount = Callable[[str, str, int, float], Awaitable[object]]
# order_changed(order, status): an order reached a new status, or "credited" (alerts/ listens).
OrderListener = Callable[[dict, str], Awaitable[object]]


@dataclass(frozen=True)
class Change:
    fields: dict
    credit: dict | None


def plan_change(order: dict, state: PaymentState, credits_per_usd: int) -> Change | None:
    """What `state` changes on `order`; None when nothing (final order, stale read, or nothing new)."""
    if order["status"] in FINAL:
        return None
    seen = order.get("provider_updated_at")
    if seen is not None and state.updated_at < seen:
        return None  # an older read than the one already applied: it must not move the status back
    fields = {
        "status": state.status,
        "actually_paid": state.actually_paid,
        "confirmed_paid": state.confirmed_paid,
        "provider_updated_at": state.updated_at,
    }
    # Over-payments count in full: the account gets what was paid, not what was asked.
    worth = usd_worth(state.confirmed_paid, order["price_usd"], order["pay_amount"])
    target = int((worth * credits_per_usd).to_integral_value(ROUND_FLOOR))
    delta = target - order["credits_applied"]
    if delta <= 0 and all(order.get(name) == value for name, value in fields.items()):
        return None
    credit = None
    if delta > 0:
        # Named after the total it brings the order to, so the same step always has the same id.
        # `paid`: the coins confirmed since the last credit, what this step's receipt says was paid (billing/).
        paid = max(Decimal(str(state.confirmed_paid)) - Decimal(str(order.get("confirmed_paid", 0))), Decimal(0))
        credit = {
            "credit_id": f"{order['_id']}:{target}",
            "credits": delta,
            "usd": delta / credits_per_usd,
            "paid": float(paid),
        }
    return Change({**fields, "confirmed_usd": cents(worth), "updated_at": now_utc()}, credit)


class Crediting:
    def __init__(self, orders: OrderStore, credit_account: CreditAccount, credits_per_usd: int):
        self.orders, self.credit_account, self.credits_per_usd = orders, credit_account, credits_per_usd
        self.listeners: list[OrderListener] = []

    async def _tell(self, order: dict, status: str) -> None:
        for listener in self.listeners:
            try:
                await listener(order, status)
            except Exception as exc:  # an alert must never fail a payment; the next change tells again
                log.warning("order %s: alert listener failed (%s)", order["_id"], type(exc).__name__)

    async def apply_payment_state(self, order_id: str, state: PaymentState) -> dict | None:
        """Brings the order and its account up to `state`; returns the order as it now stands."""
        order = await self.orders.get(order_id)
        for _ in range(10):
            if order is None:
                return None
            change = plan_change(order, state, self.credits_per_usd)
            if change is None:
                break
            updated = await self.orders.update_state(order_id, order["rev"], change.fields, change.credit)
            if updated is not None:
                if updated["status"] != order["status"]:
                    await self._tell(updated, updated["status"])
                order = updated
                if change.credit:
                    log.info(
                        "order %s: %d credits for %s confirmed (%s)",
                        order_id,
                        change.credit["credits"],
                        state.confirmed_paid,
                        state.status,
                    )
                break
            order = await self.orders.get(order_id)  # lost a race: recompute against what won
        else:
            log.warning("order %s kept changing under us; the reconciler will retry", order_id)
        return await self.settle(order)

    async def settle(self, order: dict) -> dict:
        """Moves the order's pending credits onto its account; safe to repeat and to run concurrently."""
        if not order.get("pending"):
            return order
        for credit in order["pending"]:
            await self.credit_account(order["account_id"], credit["credit_id"], credit["credits"], credit["usd"])
            await self.orders.credit_settled(order["_id"], credit["credit_id"])
        settled = await self.orders.get(order["_id"])
        await self._tell(settled, "credited")
        return settled
