"""The whole composition of one gateway process (`Context`, with its stores: what app/, the background tasks and the
tests work from), and the small view of it the handlers get (handlers/context.py `HandlerContext`), built once."""

import asyncio
import socket
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pymongo import AsyncMongoClient, monitoring

from accounting.charged import Calls
from accounting.costs import CostLedger
from accounting.idempotency import Idempotency
from accounting.meter import Meter
from alerts.detector import Detector
from billing.receipts import Billing
from billing.statements import Statements
from config.settings import Settings
from handlers.context import DataPath, HandlerContext, Runtime, Services, Throttles
from metering.limiter import RateLimiter
from metering.pricing import Prices
from payments.service import Payments, build_payments
from runtime.accesslog import AccessLog
from runtime.cache import LoadingCache
from runtime.metrics import Metrics
from runtime.outbound import Outbound
from runtime.scrape import Scrape
from runtime.state import State
from security import passwords
from security.apikeys import KeyVault
from security.throttle import CheckoutThrottle, LoginThrottle, SignupThrottle
from services.account import AccountService
from services.admin import AdminService
from services.alerts import Alerts
from services.audit import AuditService
from services.auth import Auth
from services.cursors import CursorHandles
from services.keys import KeyService
from services.margin import Margin
from services.members import Members
from services.ops import Ops
from services.sessions import Sessions
from social.pool import InFlight
from social.providers import router as routing
from social.providers.ledger import Ledger
from social.providers.router import Router
from social.upstream import FailureBudget
from storage import db as database
from storage.accounts import AccountStore
from storage.admin import AdminStore
from storage.alerts import AlertStore
from storage.answers import AnswerStore
from storage.audit import SYSTEM, AuditStore
from storage.billing import BillingStore
from storage.budgets import BudgetStore
from storage.cursor_handles import CursorHandleStore
from storage.expiry import Expiry
from storage.idempotency import IdempotencyStore
from storage.keys import KeyStore
from storage.leases import LeaseStore
from storage.limits import Limits
from storage.markers import outbound_hold
from storage.members import MemberStore
from storage.provider_costs import ProviderCostStore
from storage.sessions import SessionStore
from storage.signin import SignInStore
from storage.streams import StreamStore
from storage.usage import UsageStore
from storage.webhooks import WebhookStore
from streams.hub import Hub
from streams.manage import Manager
from streams.poller import Poller
from webhooks.outbox import Outbox


class RoundTrips(monitoring.CommandListener):
    """Counts database round trips, for /metrics and the benchmark's round-trips-per-call figure."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def started(self, event) -> None:
        self.metrics.db_round_trips += 1
        self.metrics.db_commands[event.command_name] += 1

    def succeeded(self, event) -> None:
        pass

    def failed(self, event) -> None:
        pass


@dataclass
class Context:
    """Every part of one gateway process: the stores, the services over them, the runtime pieces. app/, the
    background tasks (app/tasks.py) and the tests work from it; the handlers get `view` only, whose parts are
    the same objects as here (the throttles and the failure budget are theirs only). What changes while the process runs is held once, on the view, and set through
    the properties below: the settings, their prices and the drain's flags (its `state`), the upstream client,
    the scrape gatherer."""

    view: HandlerContext
    client: AsyncMongoClient
    accounts: AccountStore
    keys: KeyStore
    usage: UsageStore
    vault: KeyVault
    key_cache: LoadingCache  # digest -> KeyEntry
    account_cache: LoadingCache  # account id -> AccountView
    limiter: RateLimiter
    meter: Meter
    costs: CostLedger  # the operator's cost ledger: every provider request, for /metrics and the margin view
    metrics: Metrics
    executor: ThreadPoolExecutor  # CPU-heavy work (password hashing) off the event loop
    payments: Payments  # crypto top-ups: processor, orders, crediting
    admin: AdminStore  # /admin queries and usage rollups (storage/admin.py)
    sessions: Sessions  # session token checks, logout, password change (services/sessions.py)
    members: MemberStore  # members, their roles, invitations (storage/members.py)
    in_flight: InFlight  # per account: upstream calls under way, capped (429) so none holds the shared pool
    idempotency: Idempotency  # Idempotency-Key claims and kept answers (accounting/idempotency.py)
    webhook_store: WebhookStore  # endpoints, events, deliveries (storage/webhooks.py)
    outbox: Outbox  # events in, signed deliveries out (webhooks/outbox.py)
    alerts: Detector  # the crossing detector (alerts/detector.py)
    audit: AuditStore  # the append-only audit log (storage/audit.py; handlers write through BaseHandler.audit)
    stream_store: StreamStore  # filter rules, monitors and their events (storage/streams.py)
    hub: Hub  # this process's WebSockets (streams/hub.py)
    poller: Poller  # the poll scheduler (streams/poller.py)
    calls: Calls  # the charged data call and the answer cache (accounting/charged.py), data calls and polls alike
    expiry: Expiry  # TTL indexes, and on SecantusDB the passes in their place (storage/expiry.py)
    access_log: AccessLog  # one JSON line per request (BaseHandler.on_finish)
    outbound: Outbound  # held on a restored database: no webhook, email or poll leaves (runtime/outbound.py)
    billing: Billing  # billing details, receipts and credit notes (billing/receipts.py)
    # The embedded database's restarts by its supervisor (app/embedded.py), where this process reports them.
    embedded_db_restarts: Callable[[], int] | None = None

    @property
    def settings(self) -> Settings:
        return self.view.state.settings

    @settings.setter
    def settings(self, value: Settings) -> None:
        self.view.state.reload(value)  # with their prices

    @property
    def prices(self) -> Prices:
        return self.view.state.prices

    @property
    def stopping(self) -> bool:
        return self.view.state.stopping

    @stopping.setter
    def stopping(self, value: bool) -> None:
        self.view.state.stopping = value

    @property
    def draining(self) -> bool:
        return self.view.state.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.view.state.draining = value

    @property
    def upstream(self) -> Router:
        return self.view.data.upstream

    @upstream.setter
    def upstream(self, value: Router) -> None:
        self.view.data.upstream = value

    @property
    def ledger(self) -> Ledger:
        """The operator's cost ledger, where the router reports every provider attempt (social/providers/ledger.py):
        in memory unless a stored one is set here."""
        return self.view.data.upstream.ledger

    @ledger.setter
    def ledger(self, value: Ledger) -> None:
        self.view.data.upstream.ledger = value

    @property
    def scrape(self) -> Scrape:
        return self.view.runtime.scrape

    @scrape.setter
    def scrape(self, value: Scrape) -> None:
        self.view.runtime.scrape = value


async def build_context(settings: Settings, worker: int | None = None, generation: int = 1) -> Context:
    """Connects to settings.mongodb_uri, prepares every store and service; the upstream is settings.upstream_url.
    `worker` and `generation`: its place under `serve --workers N` (app/workers.py)."""
    metrics = Metrics()
    client = database.connect(settings.mongodb_uri, event_listeners=[RoundTrips(metrics)])
    db = client[settings.mongodb_db]
    expiry = Expiry(db, settings.db_expiry_seconds)
    await expiry.start()
    await database.ensure_indexes(db, expiry)
    accounts, keys_, usage = AccountStore(db), KeyStore(db), UsageStore(db)
    # A process restarted on the same node reclaims its predecessor's leases at once (Meter.start). Generations
    # of workers alternate between two names: a replacement must not take the leases of the worker it
    # replaces, which returns them itself as it drains.
    node = f"{socket.gethostname()}:{settings.port}"
    if worker is not None:
        node += f":{worker}" + ("" if generation % 2 else "b")
    leases = LeaseStore(db, usage, process_id=uuid.uuid4().hex, node=node)
    vault = KeyVault(settings.secrets_key)
    state = State(settings)  # what a reload changes: every part below that prices or plans reads it from here
    meter = Meter(state, accounts, keys_, usage, leases, vault, metrics, BudgetStore(db))
    await meter.start()
    cost_store = ProviderCostStore(db, settings.provider_ledger_retention_days)
    await cost_store.ensure_indexes(expiry)
    costs = CostLedger(state, cost_store, metrics, leases.process_id)
    upstream = routing.build(settings, costs)  # one client per provider (PROVIDERS, or today's UPSTREAM_*)
    executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="hash")
    decoy = await asyncio.get_running_loop().run_in_executor(executor, passwords.decoy_hash, settings.password_scrypt_n)
    audit = AuditStore(db, settings.audit_retention_days)
    await audit.ensure_indexes(expiry)

    async def credit(account_id: str, credit_id: str, credits: int, usd: float):
        # A payment's credits, then its audit entry by the system: once per credit id, however often settled.
        account = await meter.apply_credit(account_id, credit_id, credits, usd)
        details = {"credit_id": credit_id, "credits": credits, "usd": usd}
        await audit.record("credit.applied", account_id, SYSTEM, None, details, once=f"credit:{credit_id}")
        # Its receipt before the credit leaves the order's pending list: a crash here is finished by a retry.
        await billing.payment_credited(account_id, credit_id, credits, usd)
        return account

    payments = await build_payments(settings, db, credit)
    members = MemberStore(db)
    await members.ensure_indexes()
    await members.migrate()  # accounts from before members: each one's sign-in becomes its owner
    await members.repair_owners()  # owners lists from before issue 46: a name of a member gone goes
    admin_store = AdminStore(db)
    await admin_store.ensure_indexes()
    alert_store, webhook_store = AlertStore(db), WebhookStore(db)
    await alert_store.ensure_indexes()
    await webhook_store.ensure_indexes()
    # Read before any loop starts: on a restored database, not one delivery, email or poll leaves until released.
    outbound = Outbound(await outbound_hold(db))
    outbox = Outbox(settings, webhook_store, accounts, vault, owner=leases.process_id, outbound=outbound)
    detector = Detector(settings, alert_store, outbox, meter, accounts, keys_)
    billing_store = BillingStore(db)
    await billing_store.ensure_indexes()
    billing = Billing(state, billing_store, payments, outbox.mailer)
    payments.crediting.listeners.append(detector.order_changed)
    stream_store = StreamStore(db, settings.stream_event_retention)
    await stream_store.ensure_indexes(expiry)
    answers = AnswerStore(db, owner=leases.process_id) if settings.cache_shared else None
    if answers is not None:
        await answers.ensure_indexes(expiry)
    calls = Calls(settings, meter, state, metrics, answers)
    hub = Hub(
        stream_store, meter.key_cache, meter.account_cache, metrics, settings.stream_ping_seconds, leases.process_id
    )
    poller = Poller(settings, stream_store, meter, upstream, state, outbox, hub, calls, owner=leases.process_id)
    limits, signin = Limits(db), SignInStore(db)
    cursor_handles = CursorHandleStore(db)
    await cursor_handles.ensure_indexes(expiry)
    audit_service = AuditService(audit)  # the one the handlers write through, and the admin console's reads
    throttles = Throttles(
        login=LoginThrottle(
            settings.login_max_failures_per_email,
            settings.login_window_seconds,
            settings.login_max_attempts_per_address,
            slowdown_after=settings.login_slowdown_after,
            max_delay=settings.login_max_delay_seconds,
            v4_prefix=settings.client_network_v4_prefix,
            v6_prefix=settings.client_network_v6_prefix,
        ),
        signup=SignupThrottle(
            settings.signup_max_per_network,
            settings.signup_window_seconds,
            settings.client_network_v4_prefix,
            settings.client_network_v6_prefix,
        ),
        checkout=CheckoutThrottle(settings.checkouts_per_minute),
    )
    ops = Ops()
    services = Services(
        account=AccountService(meter, accounts),
        admin=AdminService(
            admin_store, accounts, meter, payments, audit_service, members, stream_store, poller, upstream
        ),
        alerts=Alerts(settings, alert_store, webhook_store, limits, outbox, detector, vault),
        audit=audit_service,
        auth=Auth(settings, accounts, members, signin, limits, audit, meter.account_cache, vault, outbox),
        cursors=CursorHandles(cursor_handles),
        keys=KeyService(keys_, meter, vault, settings.max_keys_per_account),
        margin=Margin(usage, cost_store, state),
        members=Members(settings, members, accounts, outbox, limits),
        ops=ops,
        payments=payments,
        billing=billing,
        statements=Statements(accounts, usage.months, meter, billing),
        sessions=Sessions(settings, accounts, SessionStore(db), meter, members),
        streams=Manager(settings, stream_store, state, poller.nudge),
        hub=hub,
    )
    data = DataPath(
        meter=meter,
        calls=calls,
        upstream=upstream,
        limiter=RateLimiter(),
        in_flight=InFlight(settings.account_max_in_flight, settings.upstream_max_connections // 2),
        failure_budget=FailureBudget(settings.account_failure_budget, settings.account_failure_window),
        idempotency=Idempotency(settings, IdempotencyStore(db), metrics),
        vault=vault,
    )
    runtime = Runtime(metrics=metrics, access_log=AccessLog(), scrape=Scrape(), executor=executor, decoy_hash=decoy)
    ctx = Context(
        view=HandlerContext(state, services, data, throttles, runtime),
        client=client,
        accounts=accounts,
        keys=keys_,
        usage=usage,
        vault=vault,
        key_cache=meter.key_cache,
        account_cache=meter.account_cache,
        limiter=data.limiter,
        meter=meter,
        costs=costs,
        metrics=metrics,
        executor=executor,
        payments=payments,
        admin=admin_store,
        sessions=services.sessions,
        members=members,
        in_flight=data.in_flight,
        idempotency=data.idempotency,
        webhook_store=webhook_store,
        outbox=outbox,
        alerts=detector,
        audit=audit,
        stream_store=stream_store,
        hub=hub,
        poller=poller,
        calls=calls,
        expiry=expiry,
        access_log=runtime.access_log,
        outbound=outbound,
        billing=billing,
    )
    ops.process = ctx  # readiness and /metrics read the whole process
    return ctx
