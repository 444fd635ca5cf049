"""Counters the service keeps about itself (exposed by the ops endpoints)."""

from collections import Counter
from dataclasses import dataclass, field

from prometheus_client import Histogram

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def _latency() -> Histogram:
    # registry=None: one histogram per context, exposed by handlers/ops.py rather than a global registry.
    return Histogram(
        "gateway_request_duration_seconds",
        "Time from request start to the last byte, by route.",
        ["route"],
        buckets=LATENCY_BUCKETS,
        registry=None,
    )


@dataclass
class Metrics:
    requests: Counter = field(default_factory=Counter)  # (route, status) -> count
    credits_charged: int = 0
    upstream_errors: int = 0
    flushes: int = 0
    flushed_records: int = 0
    flush_failures: int = 0
    db_round_trips: int = 0  # counted by a PyMongo command listener
    db_commands: Counter = field(default_factory=Counter)  # command name -> count, to see what the trips are
    loop_lag_seconds: float = 0.0  # how late the last periodic wake-up ran (app/tasks.py)
    loop_lag_max_seconds: float = 0.0
    loop_stalls: int = 0  # wake-ups later than the alarm threshold
    latency: Histogram = field(default_factory=_latency)  # observed in BaseHandler.on_finish
