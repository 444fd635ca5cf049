"""The one mutable state of a gateway process, shared (never copied): the settings and the prices a reload
(SIGHUP) replaces, and the drain's flags. The handlers, the charged call, the meter's plan tiers and the stream
poller read the prices and tiers from here at each use, never from a copy kept at their construction, so a reload
applies to the next call and the next poll."""

from dataclasses import dataclass, field

from config.settings import Settings
from metering.pricing import Prices


@dataclass(slots=True)
class State:
    settings: Settings  # replaced by a reload (SIGHUP: price rules and plan tiers), through `reload`
    stopping: bool = False  # set when a drain starts: readiness says draining (calls are still answered)
    draining: bool = False  # set once the drain answered its open connections: data calls get 503
    prices: Prices = field(init=False)  # the settings' price rules, built once per reload

    def __post_init__(self) -> None:
        self.prices = Prices(self.settings.price_rules)

    def reload(self, settings: Settings) -> None:
        """New settings and their prices together (built first: rules that do not build change nothing)."""
        prices = Prices(settings.price_rules)
        self.settings, self.prices = settings, prices
