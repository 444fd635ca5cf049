"""Members' roles and what each may do: the one table the server's check, the OpenAPI document and the
permission table of docs/security.md are read from.

An operation declares its least role (handlers/openapi_operations.py, `Operation.role`); a member may call it
when their role is among that role's GRANTS. `developer` and `billing` are side by side, neither above the
other: an operation for developers is not one for billing, and the reverse."""

OWNER, ADMIN, DEVELOPER, BILLING, VIEWER = "owner", "admin", "developer", "billing", "viewer"
ROLES = (OWNER, ADMIN, DEVELOPER, BILLING, VIEWER)
# Alert rules: developers write them all, billing members those about money (BILLING_ALERTS, checked in
# handlers/alerts/handlers.py); the route's least role admits both.
DEVELOPER_OR_BILLING = "developer or billing"
BILLING_ALERTS = frozenset(("balance_below", "daily_spend_above", "order_status"))

# least role -> the roles that may call an operation declaring it
GRANTS: dict[str, frozenset[str]] = {
    VIEWER: frozenset(ROLES),
    DEVELOPER: frozenset((OWNER, ADMIN, DEVELOPER)),
    BILLING: frozenset((OWNER, ADMIN, BILLING)),
    DEVELOPER_OR_BILLING: frozenset((OWNER, ADMIN, DEVELOPER, BILLING)),
    ADMIN: frozenset((OWNER, ADMIN)),
    OWNER: frozenset((OWNER,)),
}

# What each role is for, in the words of the docs and the portal.
DESCRIPTIONS = {
    OWNER: "everything, including members who are owners",
    ADMIN: "members other than owners, keys, alerts, webhooks, streams, billing",
    DEVELOPER: "keys (create, reveal, roll, revoke), streams, alerts, webhooks, usage",
    BILLING: "checkout, orders, receipts, billing details, balance, usage, alert rules about the balance, spend and orders",
    VIEWER: "read only: no reveal, no writes",
}


def allows(role: str | None, least: str) -> bool:
    """Whether a member with `role` may call an operation whose least role is `least`."""
    return role is not None and role in GRANTS[least]


def refusal(least: str) -> str:
    """The 403's words: which roles the operation needs."""
    names = [r for r in ROLES if r in GRANTS[least]]
    return f"Your role in this account cannot do this: it needs the role {' or '.join(names)}"


def may_assign(actor: str, role: str, current: str | None = None) -> bool:
    """Only an owner makes an owner, or changes or removes one; an admin manages every other member."""
    if actor == OWNER:
        return True
    return actor == ADMIN and role != OWNER and current != OWNER
