"""Counters the service keeps about itself (exposed by the ops endpoints)."""

from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field

from prometheus_client.core import HistogramMetricFamily

FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
GROUP_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class LatencyHistogram:
    """A latency by route, as a Prometheus histogram built at scrape time. An observation is one
    bisect and two additions (prometheus_client's Histogram takes a lock and walks every bucket)."""

    def __init__(
        self, name: str, documentation: str, buckets: tuple[float, ...] = LATENCY_BUCKETS, label: str = "route"
    ):
        self.name, self.documentation, self.label = name, documentation, label
        self.buckets = buckets
        self.routes: dict[str, list] = {}  # route (the label's value) -> [count per bucket (+Inf last)..., sum]

    def observe(self, route: str, seconds: float) -> None:
        counts = self.routes.get(route)
        if counts is None:
            counts = self.routes[route] = [0] * (len(self.buckets) + 1) + [0.0]
        counts[bisect_left(self.buckets, seconds)] += 1
        counts[-1] += seconds

    def collect(self):
        family = HistogramMetricFamily(self.name, self.documentation, labels=[self.label])
        bounds = [str(b) for b in self.buckets] + ["+Inf"]
        for route, counts in sorted(self.routes.items()):
            cumulative, running = [], 0
            for bound, count in zip(bounds, counts):
                running += count
                cumulative.append((bound, running))
            family.add_metric([route], cumulative, counts[-1])
        yield family


@dataclass
class Metrics:
    requests: Counter = field(default_factory=Counter)  # (route, status) -> count
    credits_charged: int = 0
    upstream_errors: int = 0
    idempotent_claims: int = 0  # requests run under an Idempotency-Key claim (accounting/idempotency.py)
    idempotent_replays: int = 0  # repeats answered with a kept answer
    # The answer cache (accounting/charged.py): data calls by how it answered them (hit, miss, coalesced,
    # stale), the provider calls they did not make and the credits they were not charged.
    cache_requests: Counter = field(default_factory=Counter)
    provider_calls_saved: int = 0
    cache_claims_skipped: int = 0  # misses that did not wait for a slow shared tier (accounting/charged.py)
    cache_writes_dropped: int = 0  # shared-tier writes dropped past its backlog (accounting/charged.py)
    credits_saved: int = 0
    # Per provider (accounting/costs.py, each request the router puts to one): requests, those with no usable
    # answer, those after which the router asked another provider, and what the operator owes for them.
    provider_calls: Counter = field(default_factory=Counter)
    provider_failures: Counter = field(default_factory=Counter)
    provider_failovers: Counter = field(default_factory=Counter)
    provider_cost_usd: Counter = field(default_factory=Counter)
    provider_ledger_dropped: int = 0  # cost-ledger entries dropped past its bound (the database away for long)
    flushes: int = 0
    flushed_records: int = 0
    flush_failures: int = 0
    lease_reclaims: int = 0  # leases of dead processes this one returned to their accounts
    journal_replayed: int = 0  # usage records this process replayed from journals of processes gone
    journals_corrupt: int = 0  # journals it found corrupt and kept for the operator (accounting/journal.py)
    db_round_trips: int = 0  # counted by a PyMongo command listener
    db_commands: Counter = field(default_factory=Counter)  # command name -> count, to see what the trips are
    loop_lag_seconds: float = 0.0  # how late the last periodic wake-up ran (app/tasks.py)
    loop_lag_max_seconds: float = 0.0
    loop_stalls: int = 0  # wake-ups later than the alarm threshold
    latency: LatencyHistogram = field(  # observed in BaseHandler.on_finish
        default_factory=lambda: LatencyHistogram(
            "gateway_request_duration_seconds", "Time from request start to the last byte, by route."
        )
    )
    upstream_latency: LatencyHistogram = field(  # observed in handlers/social.py for each provider answer
        default_factory=lambda: LatencyHistogram(
            "gateway_upstream_latency_seconds", "Time the provider took to answer a data call, by route."
        )
    )
    provider_latency: LatencyHistogram = field(  # observed in accounting/costs.py for each provider request
        default_factory=lambda: LatencyHistogram(
            "gateway_provider_latency_seconds", "Time each provider request took, answered or not.", label="provider"
        )
    )
    poll_late: LatencyHistogram = field(  # observed in streams/poller.py as each poll starts
        default_factory=lambda: LatencyHistogram(
            "gateway_stream_poll_late_seconds", "How late each poll of a rule or monitor started.", label="kind"
        )
    )
    journal_fsync: LatencyHistogram = field(  # observed by accounting/journal.py for each group written
        default_factory=lambda: LatencyHistogram(
            "gateway_journal_fsync_seconds",
            "How long each synchronous write of the usage journal took (its write and fdatasync: one per group of records).",
            FSYNC_BUCKETS,
            label="journal",
        )
    )
    journal_group: LatencyHistogram = field(
        default_factory=lambda: LatencyHistogram(
            "gateway_journal_group_records",
            "Usage records per journal group (the calls one fsync served).",
            GROUP_BUCKETS,
            label="journal",
        )
    )
    fanout: LatencyHistogram = field(  # observed in streams/hub.py for each event published to sockets here
        default_factory=lambda: LatencyHistogram(
            "gateway_stream_fanout_seconds",
            "From an event's write to its frame handed to every socket of its account in this process.",
            label="kind",
        )
    )
