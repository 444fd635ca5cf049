"""Counters the service keeps about itself (exposed by the ops endpoints)."""
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Metrics:
    requests: Counter = field(default_factory=Counter)      # (route, status) -> count
    credits_charged: int = 0
    upstream_errors: int = 0
    flushes: int = 0
    flushed_records: int = 0
    flush_failures: int = 0
    db_round_trips: int = 0                                 # counted by a PyMongo command listener
