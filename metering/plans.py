"""Plan tiers: the highest tier whose min_paid_usd the account's payments reach."""

from dataclasses import dataclass

ACCOUNT_QPS_FACTOR = 5  # a tier without account_qps allows 5 keys' worth of calls per account


@dataclass(frozen=True)
class Plan:
    name: str
    qps: float  # per key
    account_qps: float | None = None  # all the account's keys together; None: ACCOUNT_QPS_FACTOR x qps

    def __post_init__(self) -> None:
        if self.account_qps is None:
            object.__setattr__(self, "account_qps", ACCOUNT_QPS_FACTOR * self.qps)


def plan_for(paid_usd: float, rules) -> Plan:
    eligible = [r for r in rules if paid_usd >= r["min_paid_usd"]] or [min(rules, key=lambda r: r["min_paid_usd"])]
    best = max(eligible, key=lambda r: r["min_paid_usd"])
    account_qps = best.get("account_qps")
    return Plan(best["name"], float(best["qps"]), None if account_qps is None else float(account_qps))
