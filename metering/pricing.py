"""Price rules: credits per call from the items returned and the page size asked for.

A rule is one of
  {"each": P}                 P credits per item returned,
  {"call": P}                 P credits per call,
  {"tiers": [[FROM, P], ...]} P per item, P chosen by the page size asked for (first FROM <= size),
optionally with its own "minimum". Every successful call costs at least the global minimum.
Defaults are the prices of the provider our users know (reference.md).
"""

import math

DEFAULT_RULES = {
    "minimum": 15,
    "tweets": {"each": 15},
    "profiles": {"each": 18},
    "batch_profiles": {"tiers": [[100, 1], [0, 10]]},
    "follows": {"tiers": [[200, 1], [100, 2], [0, 3]]},
    "follower_ids": {"tiers": [[4000, 0.45], [200, 1], [0, 2]], "minimum": 100},
    "verified_followers": {"each": 3},
    "panel": {"call": 30},
    "call": {"call": 15},
    # From the provider's current documentation (issue 27): List functions 150 a call,
    # check_follow_relationship 100 a call, an article 100.
    "list_call": {"call": 150},
    "relationship": {"call": 100},
    "article": {"each": 100},
}


class PriceError(ValueError):
    pass


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _price(value) -> bool:
    return _number(value) and value >= 0


class Prices:
    def __init__(self, overrides: dict | None = None):
        rules = {**DEFAULT_RULES, **(overrides or {})}
        self.minimum = int(rules.pop("minimum"))
        self.rules = rules
        self._memo: dict[tuple[str, int, int], int] = {}
        for name, rule in rules.items():
            if not isinstance(rule, dict) or len({"each", "call", "tiers"} & set(rule)) != 1:
                raise PriceError(f"price rule {name!r} needs exactly one of each, call, tiers")
            # Checked here, at start: a rule that cannot price some call would fail every such call.
            if "tiers" in rule:
                tiers = rule["tiers"]
                if not (
                    isinstance(tiers, (list, tuple))
                    and tiers
                    and all(
                        isinstance(t, (list, tuple)) and len(t) == 2 and _number(t[0]) and _price(t[1]) for t in tiers
                    )
                    and min(t[0] for t in tiers) <= 0
                ):
                    raise PriceError(f"price rule {name!r}: tiers must be [[FROM, PRICE], ...] with a tier FROM 0")
            elif not _price(rule.get("each", rule.get("call"))):
                raise PriceError(f"price rule {name!r}: the price must be a number >= 0")
            if "minimum" in rule and not _price(rule["minimum"]):
                raise PriceError(f"price rule {name!r}: minimum must be a number >= 0")

    def cost(self, rule_name: str, items: int, size: int) -> int:
        """Credits for a successful call that returned `items` for a page size of `size`."""
        # Every call prices the same few (rule, items, size) triples three times: remember the answers.
        memo = self._memo
        known = memo.get((rule_name, items, size))
        if known is None:
            if len(memo) >= 65_536:
                memo.clear()
            known = memo[(rule_name, items, size)] = self._cost(rule_name, items, size)
        return known

    def _cost(self, rule_name: str, items: int, size: int) -> int:
        rule = self.rules[rule_name]
        minimum = max(self.minimum, int(rule.get("minimum", 0)))
        if "call" in rule:
            return max(minimum, math.ceil(rule["call"]))
        if "each" in rule:
            each = rule["each"]
        else:
            each = next(price for start, price in rule["tiers"] if size >= start)
        # round() first: 0.45 * 4000 must be 1800, not 1800.0000000000002 -> 1801.
        return max(minimum, math.ceil(round(each * items, 6)))
