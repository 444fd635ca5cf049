"""Plan tiers: the highest tier whose min_paid_usd the account's payments reach."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    name: str
    qps: float


def plan_for(paid_usd: float, rules) -> Plan:
    eligible = [r for r in rules if paid_usd >= r["min_paid_usd"]] or [min(rules, key=lambda r: r["min_paid_usd"])]
    best = max(eligible, key=lambda r: r["min_paid_usd"])
    return Plan(best["name"], float(best["qps"]))
