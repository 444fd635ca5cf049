"""The operator's margin per provider and endpoint over a period (GET /admin/margin): what customers were charged
(their usage records, each naming the provider that produced its answer) against what the providers are owed (the
cost ledger, storage/provider_costs.py: every request put to one, answered, failed or failed over).

Both sides count every account (internal ones too: their calls cost the operator all the same) and only what is
stored (a process's last flush interval is not in yet). USD charged is credits at CREDITS_PER_USD. A call answered
from the answer cache is charged with its provider's name and costs nothing; a failed-over call is charged once, to
the provider that answered, and costs each provider asked what that provider bills for its answer."""

from datetime import datetime

from runtime.state import State
from storage.provider_costs import ProviderCostStore
from storage.usage import UsageStore

PREFIX = "/social"  # usage records name the route (/social/user/info); the ledger our path after it
USD_DIGITS = 6  # costs are fractions of a cent per item


def _figures() -> dict:
    return {
        "calls": 0,
        "charged_credits": 0,
        "charged_usd": 0.0,
        "provider_calls": 0,
        "failures": 0,
        "failovers": 0,
        "paid_usd": 0.0,
        "margin_usd": 0.0,
    }


def _add(into: dict, row: dict) -> None:
    for name in ("calls", "charged_credits", "provider_calls", "failures", "failovers"):
        into[name] += row[name]
    for name in ("charged_usd", "paid_usd"):
        into[name] = round(into[name] + row[name], USD_DIGITS)
    into["margin_usd"] = round(into["charged_usd"] - into["paid_usd"], USD_DIGITS)


class Margin:
    def __init__(self, usage: UsageStore, costs: ProviderCostStore, state: State):
        self.usage, self.costs, self.state = usage, costs, state

    async def period(self, since: datetime, until: datetime) -> dict:
        """{rows: one per (provider, endpoint), providers: one per provider, totals} over [since, until]; a row's
        `provider` is None for charged calls that name none (no provider answered them)."""
        per_usd = self.state.settings.credits_per_usd
        charged = await self.usage.charged(since, until)
        paid = {(p, PREFIX + e): figures for (p, e), figures in (await self.costs.totals(since, until)).items()}
        rows = []
        for provider, endpoint in sorted(set(charged) | set(paid), key=lambda k: (k[0] or "", k[1])):
            calls, credits = charged.get((provider, endpoint), (0, 0))
            cost = paid.get((provider, endpoint), {})
            row = {"provider": provider, "endpoint": endpoint, **_figures()}
            _add(
                row,
                {
                    "calls": calls,
                    "charged_credits": credits,
                    "charged_usd": credits / per_usd,
                    "provider_calls": cost.get("n", 0),
                    "failures": cost.get("failures", 0),
                    "failovers": cost.get("failovers", 0),
                    "paid_usd": cost.get("cost_usd", 0.0),
                },
            )
            rows.append(row)
        providers: dict[str | None, dict] = {}
        totals = _figures()
        for row in rows:
            _add(providers.setdefault(row["provider"], {"provider": row["provider"], **_figures()}), row)
            _add(totals, row)
        return {"rows": rows, "providers": list(providers.values()), "totals": totals, "credits_per_usd": per_usd}
