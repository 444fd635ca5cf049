"""The one typed context every handler and background task works from, built by gateway.build_context."""
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from config.settings import Settings

if TYPE_CHECKING:
    from pymongo import AsyncMongoClient

    from metering.limiter import RateLimiter
    from metering.pricing import Prices
    from metering.throttle import LoginThrottle
    from payments.service import Payments
    from security.apikeys import KeyVault
    from social.meter import Meter
    from social.upstream import UpstreamClient
    from storage.accounts import AccountStore
    from storage.admin import AdminStore
    from storage.cache import LoadingCache
    from storage.keys import KeyStore
    from storage.usage import UsageStore
    from config.metrics import Metrics


@dataclass
class Context:
    settings: Settings
    client: "AsyncMongoClient"
    accounts: "AccountStore"
    keys: "KeyStore"
    usage: "UsageStore"
    vault: "KeyVault"
    key_cache: "LoadingCache"        # digest -> KeyEntry
    account_cache: "LoadingCache"    # account id -> AccountView
    limiter: "RateLimiter"
    prices: "Prices"
    meter: "Meter"
    upstream: "UpstreamClient"
    metrics: "Metrics"
    executor: ThreadPoolExecutor     # CPU-heavy work (password hashing) off the event loop
    decoy_hash: str                  # verified for unknown emails so login takes the same time
    payments: "Payments"             # crypto top-ups: processor, orders, crediting, reconciler
    draining: bool = False           # set on shutdown: data calls get 503 so in-flight ones can finish
    login_throttle: "LoginThrottle | None" = None  # failed logins per email, attempts per address (429)
    admin: "AdminStore | None" = None  # /admin queries and usage rollups (storage/admin.py)
