"""The one typed context every handler and background task works from (built by app/context.py)."""

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from pymongo import AsyncMongoClient

from accounting.charged import Calls
from accounting.idempotency import Idempotency
from accounting.meter import Meter
from alerts.detector import Detector
from config.settings import Settings
from metering.limiter import RateLimiter
from metering.pricing import Prices
from payments.service import Payments
from runtime.accesslog import AccessLog
from runtime.cache import LoadingCache
from runtime.metrics import Metrics
from runtime.scrape import Scrape
from security.apikeys import KeyVault
from security.throttle import CheckoutThrottle, LoginThrottle, SignupThrottle
from services.account import AccountService
from services.admin import AdminService
from services.alerts import Alerts
from services.audit import AuditService
from services.auth import Auth
from services.keys import KeyService
from services.members import Members
from services.sessions import Sessions
from social.pool import InFlight
from social.upstream import FailureBudget, UpstreamClient
from storage.accounts import AccountStore
from storage.admin import AdminStore
from storage.audit import AuditStore
from storage.expiry import Expiry
from storage.keys import KeyStore
from storage.members import MemberStore
from storage.streams import StreamStore
from storage.usage import UsageStore
from storage.webhooks import WebhookStore
from streams.hub import Hub
from streams.manage import Manager
from streams.poller import Poller
from webhooks.outbox import Outbox


@dataclass
class Context:
    settings: Settings
    client: AsyncMongoClient
    accounts: AccountStore
    keys: KeyStore
    usage: UsageStore
    vault: KeyVault
    key_cache: LoadingCache  # digest -> KeyEntry
    account_cache: LoadingCache  # account id -> AccountView
    limiter: RateLimiter
    prices: Prices
    meter: Meter
    upstream: UpstreamClient
    metrics: Metrics
    executor: ThreadPoolExecutor  # CPU-heavy work (password hashing) off the event loop
    decoy_hash: str  # verified for unknown emails so login takes the same time
    payments: Payments  # crypto top-ups: processor, orders, crediting
    login_throttle: LoginThrottle  # failed logins per email, attempts per address (429)
    signup_throttle: SignupThrottle  # registrations per client network (429)
    checkout_throttle: CheckoutThrottle  # checkouts per account per minute, one at a time (429)
    admin: AdminStore  # /admin queries and usage rollups (storage/admin.py)
    sessions: Sessions  # session token checks, logout, password change (services/sessions.py)
    members: MemberStore  # members, their roles, invitations (storage/members.py)
    failure_budget: FailureBudget  # per account: failed upstream calls before 429 (social/upstream.py)
    in_flight: InFlight  # per account: upstream calls under way, capped (429) so none holds the shared pool
    idempotency: Idempotency  # Idempotency-Key claims and kept answers (accounting/idempotency.py)
    webhook_store: WebhookStore  # endpoints, events, deliveries (storage/webhooks.py)
    outbox: Outbox  # events in, signed deliveries out (webhooks/outbox.py)
    alerts: Detector  # the crossing detector (alerts/detector.py)
    audit: AuditStore  # the append-only audit log (storage/audit.py; handlers write through BaseHandler.audit)
    stream_store: StreamStore  # filter rules, monitors and their events (storage/streams.py)
    streams: Manager  # adding and changing rules and monitors (streams/manage.py)
    hub: Hub  # this process's WebSockets (streams/hub.py)
    poller: Poller  # the poll scheduler (streams/poller.py)
    calls: Calls  # the charged data call and the answer cache (accounting/charged.py), data calls and polls alike
    expiry: Expiry  # TTL indexes, and on SecantusDB the passes in their place (storage/expiry.py)
    key_service: KeyService  # keys' rules over the key store and the meter (services/keys.py)
    account_service: AccountService  # the balance, the plan and the usage reads (services/account.py)
    audit_service: AuditService  # the audit log's reads (services/audit.py)
    admin_service: AdminService  # the admin console's figures and account actions (services/admin.py)
    alert_service: Alerts  # alert rules and webhook endpoints (services/alerts.py)
    auth_service: Auth  # sign-in: registration, 2FA, password resets (services/auth.py)
    member_service: Members  # members, their roles and invitations (services/members.py)
    stopping: bool = False  # set when a drain starts: readiness says draining (calls are still answered)
    draining: bool = False  # set once the drain answered its open connections: data calls get 503
    scrape: Scrape = field(default_factory=Scrape)  # this worker among its siblings, for /metrics
    access_log: AccessLog = field(default_factory=AccessLog)  # one JSON line per request (BaseHandler.on_finish)
    # The embedded database's restarts by its supervisor (app/embedded.py), where this process reports them.
    embedded_db_restarts: Callable[[], int] | None = None
