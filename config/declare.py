"""How a setting is declared: its default, help, environment name, group and bounds in one place (thumbor's
`Config.define`). The bounds are checked at start (`Bounds.problem`), shown by --help and written into
docs/configuration.md (`Bounds.words`), so neither can drift from what is enforced."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Bounds:
    """What a setting's value may be. `check` is for what numbers and choices cannot say: it returns what is wrong
    ("must start with /") or "" and `must` describes it; `must` alone rewords a numeric bound in the setting's own
    terms ("0 (no passes) or a positive number of seconds")."""

    at_least: float | None = None
    above: float | None = None
    at_most: float | None = None
    choices: tuple[str, ...] = ()
    check: Callable[[Any], str] | None = None
    must: str = ""

    def problem(self, env: str, value: Any) -> str:
        """The line an operator reads when `value` is out of bounds ("" when it is within them)."""
        if self.check is not None:
            wrong = self.check(value)
            return f"{env} {wrong}" if wrong else ""
        if self.choices:
            return "" if value in self.choices else f"{env} must be {self._choices()}"
        low = self.at_least is not None and value < self.at_least
        high = self.at_most is not None and value > self.at_most
        if low or high or (self.above is not None and value <= self.above):
            return f"{env} must be {self.must}" if self.must else f"{env} {self._range()}"
        return ""

    def words(self) -> str:
        """The bounds for people (--help, docs/configuration.md); "" when any value of the type goes."""
        if self.must:
            return self.must
        if self.choices:
            return self._choices()
        low, high = _number(self.at_least), _number(self.at_most)
        if self.at_least is not None and self.at_most is not None:
            return f"{low} to {high}"
        if self.above is not None:
            return f"more than {_number(self.above)}"
        if self.at_least is not None:
            return f"at least {low}"
        return f"at most {high}" if self.at_most is not None else ""

    def _choices(self) -> str:
        named = [c for c in self.choices if c]
        listed = named[0] if len(named) == 1 else ", ".join(named[:-1]) + " or " + named[-1]
        return listed + (", or empty" if "" in self.choices else "")

    def _range(self) -> str:
        low, high = _number(self.at_least), _number(self.at_most)
        if self.at_least is not None and self.at_most is not None:
            return f"must be between {low} and {high}"
        if self.above == 0:
            return "must be positive"
        if self.above is not None:
            return f"must be more than {_number(self.above)}"
        if self.at_least == 0:
            return "must not be negative"
        if self.at_least is not None:
            return f"must be at least {low}"
        if self.at_most is not None:
            return f"must be at most {high}"
        return ""


def _number(value: float | None) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def setting(default: Any, help: str, env: str, group: str, **bounds: Any) -> Any:
    """One setting: a dataclass field of `Settings` whose metadata holds the rest of its declaration."""
    metadata = {"help": help, "env": env, "group": group, "bounds": Bounds(**bounds)}
    if isinstance(default, dict):
        return dataclasses.field(default_factory=lambda: dict(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def default_of(field: dataclasses.Field) -> Any:
    return field.default if field.default is not dataclasses.MISSING else field.default_factory()
