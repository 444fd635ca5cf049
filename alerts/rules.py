"""The kinds of alert rules, their thresholds and the events they make. Pure: no I/O.

| kind | fields | fires | re-arms |
|---|---|---|---|
| `balance_below` | one of `credits`, `usd`, `percent` (of the last top-up or payment) | balance < threshold | a top-up or payment after it fired, with the balance back at or over the threshold |
| `key_budget` | `levels` (subset of 50, 80, 100), `key_id` (absent: every key with a budget) | a key's budget used ≥ level % in its period | the next period |
| `daily_spend_above` | one of `credits`, `usd` | the account's spend in a UTC day > threshold | the next UTC day |
| `order_status` | `statuses` (subset of ORDER_STATUSES) | a top-up order reaches the status | never: once per order and status |
"""

KINDS = ("balance_below", "key_budget", "daily_spend_above", "order_status")
LEVELS = (50, 80, 100)
# Order statuses an alert may follow; `credited` is the moment an order's credits reach the balance.
ORDER_STATUSES = ("confirmed", "partially_paid", "finished", "credited", "expired", "failed")
# Sent by streams/ without a rule to ask for them: an account's filter rules and monitors paused because the
# balance cannot pay for their next hour of polls, and resumed after a top-up.
STREAM_PAUSED, STREAM_RESUMED = "stream.paused", "stream.resumed"
EVENT_TYPES = {
    "balance_below": "balance.low",
    "key_budget": "key_budget.reached",
    "daily_spend_above": "spend.daily_above",
    "order_status": "order.status",
}


def threshold_credits(rule: dict, account: dict, credits_per_usd: int) -> int | None:
    """A balance or spend rule's threshold in credits; None when a percentage has no reference yet (no top-up)."""
    if rule.get("credits") is not None:
        return rule["credits"]
    if rule.get("usd") is not None:
        return round(rule["usd"] * credits_per_usd)
    reference = account.get("last_funding")
    if rule.get("percent") is None or not reference:
        return None
    return reference * rule["percent"] // 100


def balance_crossing(rule: dict) -> str:
    return f"{rule['_id']}|balance|{rule['arm_seq']}"


def budget_crossing(rule: dict, budget_id: int, period: str, level: int) -> str:
    return f"{rule['_id']}|budget|{budget_id}|{period}|{level}"


def daily_crossing(rule: dict, day: str) -> str:
    return f"{rule['_id']}|day|{day}"


def order_crossing(rule: dict, order_id: str, status: str, detail: str = "") -> str:
    return f"{rule['_id']}|order|{order_id}|{status}|{detail}"


def dollars(usd: float) -> str:
    """$12.50, with as many more decimals as a smaller amount needs: $0.001 (100 credits) never reads $0.00."""
    cents = f"{usd:,.2f}"
    return "$" + (cents if round(usd, 2) == usd else f"{usd:,.8f}".rstrip("0"))


def describe(rule: dict) -> str:
    """One line for emails and the portal."""
    kind = rule["kind"]
    if kind in ("balance_below", "daily_spend_above"):
        if rule.get("credits") is not None:
            amount = f"{rule['credits']:,} credits"
        elif rule.get("usd") is not None:
            amount = dollars(rule["usd"])
        else:
            amount = f"{rule['percent']} % of the last top-up"
        return ("Balance below " if kind == "balance_below" else "Spend in a UTC day above ") + amount
    if kind == "key_budget":
        which = f"key {rule['key_id']}" if rule.get("key_id") else "any key"
        return f"Budget of {which} at " + "/".join(f"{level} %" for level in rule["levels"])
    return "Top-up orders: " + ", ".join(rule["statuses"])
