"""What operations read of a gateway process: readiness (the database, the upstream breaker, the usage buffer, a
drain; and whether outbound sending is held, which does not make it unready) and the gateway's own /metrics
figures, gathered at scrape time from the counters the service keeps anyway.

`ctx` is the gateway's whole composition (app/context.py's Context): these read every part of the process, and
nothing else. The handlers, which do not see the process's parts, ask through `Ops`."""

import time

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.process_collector import ProcessCollector

from config import VERSION

READY_TIMEOUT = 1.0  # seconds: a load balancer must learn quickly that the database is gone
BREAKER_STATES = {"closed": 0, "half-open": 1, "open": 2}


async def readiness(ctx) -> tuple[bool, dict]:
    """Ready for traffic: database answers, upstream breaker closed, usage buffer under its bound, not draining;
    and each check's state."""
    database = await ctx.admin.ping(READY_TIMEOUT)
    breaker = ctx.upstream.breaker.state
    depth, bound = len(ctx.meter.buffer), ctx.meter.buffer.max_records
    draining = ctx.stopping or ctx.draining
    ready = database and breaker == "closed" and depth < bound and not draining
    checks = {
        "database": "ok" if database else "unreachable",
        "upstream_breaker": breaker,
        "usage_buffer": {"depth": depth, "max": bound},
        "draining": draining,
        # A restored database (runtime/outbound.py): no webhook, email or poll leaves until the operator releases it.
        "outbound": ctx.outbound.state,
    }
    return ready, checks


class Ops:
    """Readiness and the /metrics figures, as the handlers ask for them (handlers/ops/). `process` is bound by
    app/context.py once the composition is built: read at each call, it has the parts a test or a worker's seat
    set since."""

    process = None

    async def readiness(self) -> tuple[bool, dict]:
        return await readiness(self.process)

    def registry(self) -> CollectorRegistry:
        return registry(self.process)


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


class GatewayCollector:
    """Reads, at scrape time, the counters the service keeps anyway: no work is added to the request path
    except the one latency observation in BaseHandler.on_finish."""

    def __init__(self, ctx):
        self.ctx = ctx

    def collect(self):
        ctx, m, meter = self.ctx, self.ctx.metrics, self.ctx.meter
        build = GaugeMetricFamily("gateway_build_info", "The version running (always 1).", labels=["version"])
        build.add_metric([VERSION], 1)
        yield build
        requests = CounterMetricFamily(
            "gateway_requests", "Requests answered, by route and status.", labels=["route", "status"]
        )
        for (route, status), count in sorted(m.requests.items()):
            requests.add_metric([route, str(status)], count)
        yield requests
        yield from m.latency.collect()
        by_status = lambda code: sum(n for (_, status), n in m.requests.items() if status == code)
        yield _counter(
            "gateway_payment_required", "402 answers: the account could not pay for the call.", by_status(402)
        )
        yield _counter("gateway_rate_limited", "429 answers: over a key's QPS or the login throttle.", by_status(429))
        yield _counter("gateway_credits_charged", "Credits charged for data calls.", m.credits_charged)
        yield _counter(
            "gateway_idempotent_claims", "Requests run under an Idempotency-Key of their own.", m.idempotent_claims
        )
        yield _counter(
            "gateway_idempotent_replays",
            "Repeats of an Idempotency-Key answered with the first answer (charged 0).",
            m.idempotent_replays,
        )
        yield from self._answer_cache()
        yield from m.upstream_latency.collect()
        yield from m.poll_late.collect()
        yield from m.fanout.collect()
        yield _counter("gateway_upstream_errors", "Data calls the provider failed (502/503/504).", m.upstream_errors)
        yield _gauge(
            "gateway_upstream_breaker_state",
            "Upstream circuit breaker: 0 closed, 1 half-open, 2 open.",
            BREAKER_STATES[ctx.upstream.breaker.state],
        )
        yield from self._provider_keys()
        yield from self._providers()
        for name, doc in (("hits", "Cache lookups answered from memory."), ("misses", "Cache lookups that loaded.")):
            family = CounterMetricFamily(f"gateway_cache_{name}", doc, labels=["cache"])
            for cache_name, cache in (("key", meter.key_cache), ("account", meter.account_cache)):
                family.add_metric([cache_name], getattr(cache.stats, name))
            yield family
        ratio = GaugeMetricFamily("gateway_cache_hit_ratio", "Hits / lookups since start.", labels=["cache"])
        for cache_name, cache in (("key", meter.key_cache), ("account", meter.account_cache)):
            lookups = cache.stats.hits + cache.stats.misses
            ratio.add_metric([cache_name], cache.stats.hits / lookups if lookups else 0.0)
        yield ratio
        yield _counter("gateway_usage_flushes", "Usage batches written.", m.flushes)
        yield _counter(
            "gateway_usage_flushed_records",
            "Usage records written (records / flushes = batch size).",
            m.flushed_records,
        )
        yield _counter(
            "gateway_usage_flush_failures", "Usage batches that failed and were kept for retry.", m.flush_failures
        )
        yield _counter(
            "gateway_lease_reclaims",
            "Leases of dead processes returned to their accounts by this one (a gateway died without closing).",
            m.lease_reclaims,
        )
        yield from m.journal_fsync.collect()
        yield from m.journal_group.collect()
        yield _counter(
            "gateway_journal_failures",
            "Usage journal writes that failed (their records not protected against a crash; JOURNAL).",
            meter.journal.failures if meter.journal is not None else 0,
        )
        yield _counter(
            "gateway_journal_replayed_records",
            "Usage records replayed from the journals of processes gone.",
            m.journal_replayed,
        )
        yield _counter(
            "gateway_journals_corrupt",
            "Usage journals found corrupt, not replayed and kept for the operator.",
            m.journals_corrupt,
        )
        if ctx.embedded_db_restarts is not None:
            yield _counter(
                "gateway_embedded_db_restarts",
                "Times the embedded database exited and was started again (serve --workers: worker 0 only).",
                ctx.embedded_db_restarts(),
            )
        yield _gauge(
            "gateway_usage_flush_batch_size_mean",
            "Mean usage records per flush since start.",
            m.flushed_records / m.flushes if m.flushes else 0.0,
        )
        depth = len(meter.buffer)
        yield _gauge(
            "gateway_usage_flush_lag_seconds",
            "Seconds since the last successful flush while records wait.",
            time.time() - meter.last_flush_ok if depth else 0.0,
        )
        yield _gauge("gateway_usage_buffer_records", "Usage records waiting to be written.", depth)
        yield _gauge(
            "gateway_usage_buffer_capacity",
            "Records past which data calls fail closed (BUFFER_MAX).",
            meter.buffer.max_records,
        )
        yield _gauge(
            "gateway_event_loop_lag_seconds",
            "How late the last periodic callback ran: how long the event loop was held (probe every 50 ms).",
            m.loop_lag_seconds,
        )
        yield _gauge(
            "gateway_event_loop_lag_max_seconds", "Largest event-loop lag since start.", m.loop_lag_max_seconds
        )
        yield _counter("gateway_event_loop_stalls", "Event-loop lags past 100 ms (each also logged).", m.loop_stalls)
        yield _counter("gateway_db_round_trips", "Commands sent to MongoDB.", m.db_round_trips)
        commands = CounterMetricFamily(
            "gateway_db_commands", "Commands sent to MongoDB, by command.", labels=["command"]
        )
        for name, count in sorted(m.db_commands.items()):
            commands.add_metric([name], count)
        yield commands
        yield from self._webhooks()

    def _answer_cache(self):
        """The shared answer cache (accounting/charged.py): data calls by how it answered them, its memory, and
        what it saved (provider calls not made; credits not charged at CACHE_HIT_PRICE below a full price)."""
        m = self.ctx.metrics
        results = CounterMetricFamily(
            "gateway_cache_requests",
            "Data calls by how the answer cache answered them (hit, miss, coalesced, stale).",
            labels=["result"],
        )
        for result in ("hit", "miss", "coalesced", "stale"):
            results.add_metric([result], m.cache_requests[result])
        yield results
        yield _gauge(
            "gateway_cache_bytes", "Bytes of answers the cache holds in this process.", self.ctx.calls.cache.bytes
        )
        yield _gauge(
            "gateway_crawl_guard_bytes",
            "Bytes of the crawl guard's memory in this process (within CRAWL_GUARD_MAX_BYTES).",
            self.ctx.calls.crawls.bytes,
        )
        yield _counter(
            "gateway_cache_provider_calls_saved",
            "Provider calls the cache and coalescing did not make (hits, stale and coalesced calls).",
            m.provider_calls_saved,
        )
        yield _counter(
            "gateway_cache_credits_saved", "Credits customers were not charged for cached answers.", m.credits_saved
        )
        yield _counter(
            "gateway_cache_claims_skipped",
            "Misses that asked the provider without waiting for a slow shared tier (its fill claim).",
            m.cache_claims_skipped,
        )
        yield _counter(
            "gateway_cache_writes_dropped",
            "Answers not written to the shared tier: its writes were backed up (an overloaded database).",
            m.cache_writes_dropped,
        )

    def _webhooks(self):
        """Webhook and alert-email deliveries (webhooks/outbox.py): outcomes of this process's attempts, and
        the outbox as its dispatcher last saw it (every WEBHOOK_POLL_SECONDS, shared by all processes)."""
        outbox = self.ctx.outbox
        outcomes = CounterMetricFamily(
            "gateway_webhook_deliveries",
            "Delivery attempts by outcome (delivered, retried, failed).",
            labels=["outcome"],
        )
        for outcome in ("delivered", "retried", "failed"):
            outcomes.add_metric([outcome], outbox.outcomes[outcome])
        yield outcomes
        yield _gauge("gateway_webhook_queue_depth", "Deliveries pending (due or waiting for a retry).", outbox.depth)
        yield _gauge(
            "gateway_webhook_oldest_pending_age_seconds", "Age of the oldest undelivered delivery.", outbox.oldest_age
        )

    def _providers(self):
        """Per provider named in PROVIDERS (accounting/costs.py, each request the router put to one): requests,
        those with no usable answer, those after which another provider was asked, their latency and their cost."""
        m = self.ctx.metrics
        for name, figures, doc in (
            ("gateway_provider_calls", m.provider_calls, "Requests put to each provider."),
            (
                "gateway_provider_failures",
                m.provider_failures,
                "Provider requests with no usable answer (no answer, a 5xx, a 429).",
            ),
            (
                "gateway_provider_failovers",
                m.provider_failovers,
                "Provider requests after which the router asked the next provider.",
            ),
            ("gateway_provider_cost_usd", m.provider_cost_usd, "What the operator owes each provider, by its costs."),
        ):
            family = CounterMetricFamily(name, doc, labels=["provider"])
            for provider, value in sorted(figures.items()):
                family.add_metric([provider], value)
            yield family
        yield from m.provider_latency.collect()
        yield _counter(
            "gateway_provider_ledger_dropped",
            "Provider requests counted here but not stored in the cost ledger (its buffer was full).",
            m.provider_ledger_dropped,
        )

    def _provider_keys(self):
        """Per provider key (labelled key1, key2... in UPSTREAM_API_KEYS order, never the key itself)."""
        upstream = self.ctx.upstream
        keys, now = upstream.keys, time.monotonic()
        calls = CounterMetricFamily("gateway_provider_key_calls", "Calls sent with each provider key.", labels=["key"])
        refusals = CounterMetricFamily(
            "gateway_provider_key_refusals",
            "Provider refusals of each key (the key was rested, the call sent with another).",
            labels=["key", "status"],
        )
        rested = GaugeMetricFamily("gateway_provider_key_rested", "1 while a key is rested.", labels=["key"])
        for key in keys.keys:
            calls.add_metric([key.label], key.calls)
            for status, count in sorted(key.refusals.items()):
                refusals.add_metric([key.label, str(status)], count)
            rested.add_metric([key.label], 1 if key.rested_until > now else 0)
        yield from (calls, refusals, rested)
        yield _counter(
            "gateway_provider_saturated",
            "Calls answered 429 because every provider key was at its rate (the account over its fair share).",
            keys.saturated,
        )
        yield _gauge("gateway_upstream_connections_busy", "Connections to the provider in use.", upstream.slots.busy)
        yield _gauge(
            "gateway_upstream_connections_waiting",
            "Calls waiting for a connection to the provider (the pool is full).",
            sum(len(queue) for queue in upstream.slots.waiting.values()),
        )


def registry(ctx) -> CollectorRegistry:
    """This process's collectors: the gateway's figures and the process's own (CPU, memory, files)."""
    collectors = CollectorRegistry(auto_describe=False)
    collectors.register(GatewayCollector(ctx))
    ProcessCollector(registry=collectors)
    return collectors
