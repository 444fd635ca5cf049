"""What a handler sees of its gateway process: a small typed view, no store in it (handlers talk to services).

The process's whole composition, with its stores, is app/context.py's Context; it builds this view from the same
objects, once, and the base handler (handlers/base.py) reads it through typed properties: `self.services.keys`,
`self.config.production`. What changes while the process runs is in one place each, so a handler sees the change
at once: the settings (a reload) and the drain's flags on `state`; the upstream client and the scrape gatherer
on their groups, which app/context.py's Context sets through (a test's other provider, a worker's seat).
"""

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from accounting.charged import Calls
from accounting.idempotency import Idempotency
from accounting.meter import Meter
from billing.receipts import Billing
from billing.statements import Statements
from metering.limiter import RateLimiter
from payments.service import Payments
from runtime.accesslog import AccessLog
from runtime.metrics import Metrics
from runtime.scrape import Scrape
from runtime.state import State
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
from social.providers.router import Router
from social.upstream import FailureBudget
from streams.hub import Hub
from streams.manage import Manager


@dataclass(frozen=True, slots=True)
class Services:
    """Each area's service (services/, and billing's and the streams' own): what the area handlers call."""

    account: AccountService  # the balance, the plan and the usage reads
    admin: AdminService  # the admin console's figures and account actions
    alerts: Alerts  # alert rules and webhook endpoints
    audit: AuditService  # the audit log: the entry of the request that acted, and the reads
    auth: Auth  # sign-in: registration, 2FA, password resets
    cursors: CursorHandles  # MCP clients' cursor handles (handlers/mcp/)
    keys: KeyService  # keys' rules over the key store and the meter
    margin: Margin  # the operator's margin per provider: charged to customers against paid to providers
    members: Members  # members, their roles and invitations
    ops: Ops  # readiness and the /metrics figures
    payments: Payments  # crypto top-ups: processor, orders, crediting
    billing: Billing  # billing details, receipts and credit notes (billing/receipts.py)
    statements: Statements  # monthly statements (billing/statements.py)
    sessions: Sessions  # session token checks, logout, password change
    streams: Manager  # adding and changing rules and monitors (streams/manage.py)
    hub: Hub  # this process's WebSockets (streams/hub.py)


@dataclass(frozen=True, slots=True)
class Throttles:
    """The 429s of the portal's sign-in and checkout (security/throttle.py)."""

    login: LoginThrottle  # failed logins per email, attempts per address
    signup: SignupThrottle  # registrations per client network
    checkout: CheckoutThrottle  # checkouts per account per minute, one at a time


@dataclass(slots=True)
class DataPath:
    """What a data call uses (handlers/data_call.py, handlers/social.py), read on every call: attributes, no
    indirection. Also the idempotent portal writes' claims and sealed answers (handlers/idempotent.py)."""

    meter: Meter  # keys, account views, the usage buffer (the one credit service of the data path)
    calls: Calls  # the charged data call and the answer cache, data calls and polls alike
    upstream: Router  # the provider; Context.upstream sets it (a test points it at another)
    limiter: RateLimiter  # per key and per account QPS buckets
    in_flight: InFlight  # per account: upstream calls under way, capped (429)
    failure_budget: FailureBudget  # per account: failed upstream calls before 429
    idempotency: Idempotency  # Idempotency-Key claims and kept answers
    vault: KeyVault  # key digests and sealed answers


@dataclass(slots=True)
class Runtime:
    """The process's runtime pieces (runtime/) and its CPU-heavy work off the event loop."""

    metrics: Metrics  # counters and latency histograms
    access_log: AccessLog  # one JSON line per request (BaseHandler.on_finish)
    scrape: Scrape  # this worker among its siblings, for /metrics; Context.scrape sets it (a worker's seat)
    executor: ThreadPoolExecutor  # password hashing, QR codes
    decoy_hash: str  # verified for unknown emails so login takes the same time


@dataclass(frozen=True, slots=True)
class HandlerContext:
    """What every handler gets (`self.ctx`): one object per process, its groups built once."""

    state: State
    services: Services
    data: DataPath
    throttles: Throttles
    runtime: Runtime
