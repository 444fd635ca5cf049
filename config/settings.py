"""Every setting of the service, declared once: name, type, default, help, group and bounds (config/declare.py).

Values come from (lowest to highest precedence) the defaults below, an optional TOML file named by CONFIG_FILE,
and the environment. The result is a frozen ``Settings`` checked at start-up against each declaration's bounds
and the few rules that relate two settings (``relations``); config/reference.py renders the declarations for
--help and docs/configuration.md.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import ipaddress
import os
import re
import sys
import tomllib
from collections.abc import Mapping
from typing import Any

import orjson

from config.declare import setting
from metering.pricing import PriceError, Prices

DEV_HOST = "127.0.0.1"  # development listens on loopback unless GATEWAY_HOST says otherwise
SANDBOX_UPSTREAM_KEY = "sandbox-upstream-key"  # the sandbox's credential: refused in production
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class SettingsError(ValueError):
    """Settings the service cannot run with: every problem found, one line each."""

    def __init__(self, *problems: str):
        super().__init__("\n".join(problems))
        self.problems = problems

    def report(self) -> str:
        """The message for the command line: one problem on its line, several as a list."""
        if len(self.problems) == 1:
            return f"social-gateway: {self.problems[0]}"
        return f"social-gateway: {len(self.problems)} problems with the settings:\n" + "\n".join(
            f"  - {problem}" for problem in self.problems
        )


def _default_plans() -> tuple:
    # Defaults of the provider our users know (reference.md): never paid 1 call / 5 s, paid 20/s.
    return (
        {"name": "free", "min_paid_usd": 0, "qps": 0.2},
        {"name": "paid", "min_paid_usd": 0.01, "qps": 20},
        {"name": "pro", "min_paid_usd": 500, "qps": 50},
        {"name": "scale", "min_paid_usd": 5000, "qps": 500},
    )


# --- checks the bounds of one setting cannot say with numbers or choices: each returns what is wrong, or "" ------
SECRET_MUST = "at least 32 characters"
HEADER_SAFE = "printable ASCII (a key is sent as a header)"
METRICS_PORT_MUST = "0 or a TCP port other than GATEWAY_PORT"


def _log_level(value: str) -> str:
    return "" if value.upper() in LOG_LEVELS else "must be DEBUG, INFO, WARNING, ERROR or CRITICAL"


def _price_rules(value: Mapping) -> str:
    try:
        Prices(value)
    except (PriceError, KeyError, TypeError, ValueError) as exc:
        return f"is refused: {exc}"
    return ""


def _secret(value: str) -> str:
    return "must be at least 32 characters" if value and len(value) < 32 else ""


def _path_prefix(value: str) -> str:
    return "" if value.startswith("/") else "must start with /"


def _header_safe(value: str) -> str:  # the key itself is never echoed
    return "" if value.isprintable() and value.isascii() else f"must be {HEADER_SAFE}"


def _header_safe_keys(value: tuple) -> str:
    return next((_header_safe(secret) for secret, _ in value if _header_safe(secret)), "")


def _plans(value: tuple) -> str:
    if not value or any(not {"name", "min_paid_usd", "qps"} <= set(p) for p in value):
        return "must be a non-empty list of {name, min_paid_usd, qps}"
    if any(p["qps"] <= 0 or p.get("account_qps", 1) <= 0 for p in value):
        return "needs positive qps and account_qps"
    return ""


def _text(most: int, required: bool = False):
    def check(value: str) -> str:
        if required and not value.strip():
            return "must not be empty"
        return f"must be at most {most:,} characters" if len(value) > most else ""

    return check


def _retry_schedule(value: tuple) -> str:
    bad = any(not isinstance(s, (int, float)) or isinstance(s, bool) or s <= 0 for s in value)
    return "must be a non-empty JSON list of positive seconds" if not value or bad else ""


def _smtp_url(value: str) -> str:
    return "must start with smtp:// or smtps://" if value and not value.startswith(("smtp://", "smtps://")) else ""


def _cache_ttl(value: Mapping) -> str:
    bad = any(not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= 86400 for v in value.values())
    return "must map endpoint paths to whole seconds from 0 to 86400" if bad else ""


PROVIDER_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
PROVIDER_FIELDS = {"name", "kind", "url", "keys", "costs", "prefix"}
COST_FIELDS = {"item", "call", "failed", "by"}


def _providers(value: tuple) -> str:
    """PROVIDERS' shape (the kinds themselves are checked against the adapters when the router is built:
    social/providers/). Never echoes a key."""
    names = set()
    for entry in value:
        if not isinstance(entry, dict) or not {"name", "kind", "url", "keys"} <= set(entry):
            return "needs name, kind, url and keys in each provider"
        if set(entry) - PROVIDER_FIELDS:
            return f"has unknown fields: {', '.join(sorted(set(entry) - PROVIDER_FIELDS))}"
        name = entry["name"]
        if not isinstance(name, str) or not PROVIDER_NAME.fullmatch(name) or name in names:
            return "needs unique names of 1-32 characters a-z, 0-9, _ and - (starting with a letter or digit)"
        names.add(name)
        if not isinstance(entry["kind"], str) or not entry["kind"]:
            return f"provider {name}: kind must be a kind's name (twitterapi, socialdata)"
        url = entry["url"]
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            return f"provider {name}: url must start with http:// or https://"
        prefix = entry.get("prefix", "")
        if not isinstance(prefix, str) or (prefix and not prefix.startswith("/")):
            return f"provider {name}: prefix must be a path starting with /"
        keys = entry["keys"]
        try:
            if not isinstance(keys, list) or not keys or _header_safe_keys(provider_keys(keys)):
                raise ValueError
        except (ValueError, TypeError):
            return f"provider {name}: keys must be a non-empty list of KEY or KEY:QPS, {HEADER_SAFE}"
        wrong = _costs(entry.get("costs", {}))
        if wrong:
            return f"provider {name}: costs {wrong}"
    return ""


def _costs(costs) -> str:
    if not isinstance(costs, dict) or set(costs) - COST_FIELDS:
        return "must be an object of item, call, failed and by"
    if not isinstance(costs.get("failed", False), bool):
        return "failed must be true or false"
    by = costs.get("by", {})
    if not isinstance(by, dict):
        return "by must map endpoint paths or price rules to {item, call}"
    for table in (costs, *by.values()):
        if not isinstance(table, dict) or (table is not costs and set(table) - {"item", "call"}):
            return "by must map endpoint paths or price rules to {item, call}"
        for field in ("item", "call"):
            price = table.get(field, 0)
            if isinstance(price, bool) or not isinstance(price, (int, float)) or not 0 <= price < float("inf"):
                return f"{field} must be USD, a number from 0"
    return ""


@dataclasses.dataclass(frozen=True)
class Settings:
    host: str = setting(
        "",
        "Address to listen on. Empty: 127.0.0.1 in development (the dev top-up and /metrics stay off the "
        "network); production needs it set (e.g. 0.0.0.0 behind a proxy).",
        "GATEWAY_HOST",
        group="Service",
    )
    port: int = setting(8000, "Port to listen on.", "GATEWAY_PORT", group="Service", at_least=0, at_most=65535)
    env: str = setting(
        "development",
        "development or production. Production requires JWT_SECRET, SECRETS_KEY, GATEWAY_HOST, UPSTREAM_URL, "
        "UPSTREAM_API_KEY and MONGODB_URI, and turns off direct top-ups and the sandbox payment chain.",
        "GATEWAY_ENV",
        group="Service",
        choices=("development", "production"),
    )
    data_dir: str = setting(
        "./var",
        "Folder for the embedded database and generated development secrets; one gateway per folder (a lock file, "
        "gateway.lock). The usage journals (journal/, JOURNAL) and the records a stop could not write wait there for "
        "the next start.",
        "DATA_DIR",
        group="Service",
    )
    event_loop: str = setting(
        "uvloop",
        "uvloop, or asyncio: the event loop of serve and its workers (uvloop spends less CPU per call).",
        "EVENT_LOOP",
        group="Service",
        choices=("asyncio", "uvloop"),
    )
    data_connections: str = setting(
        "own",
        "own, or tornado: who serves a connection while it carries data calls. own: the gateway's protocol (less "
        "CPU per call), handing a connection to Tornado at its first other request; tornado: Tornado for all.",
        "DATA_CONNECTIONS",
        group="Service",
        choices=("own", "tornado"),
    )
    drain_seconds: float = setting(
        10.0, "Seconds in-flight calls get to finish on shutdown.", "DRAIN_SECONDS", group="Service"
    )
    mongodb_uri: str = setting(
        "",
        "MongoDB URI. Empty: start the embedded SecantusDB under DATA_DIR/db. serve pings it at start (10 s): "
        "unreachable is one line naming the hosts, exit 1.",
        "MONGODB_URI",
        group="Database",
    )
    mongodb_db: str = setting("social_gateway", "Database name.", "MONGODB_DB", group="Database")
    allow_embedded_db: bool = setting(
        False,
        "Production only: run on the embedded database when MONGODB_URI is empty (otherwise refused).",
        "ALLOW_EMBEDDED_DB",
        group="Database",
    )
    allow_migrated_db: bool = setting(
        False,
        "serve on a database that `migrate` copied to another server (what it holds is stale from then on): "
        "refused otherwise, with one line naming the target; allowed, a WARNING line says so at every start.",
        "ALLOW_MIGRATED_DB",
        group="Database",
    )
    embedded_db_nice: int = setting(
        10,
        "Niceness of the embedded database process: its write bursts yield the cores to the request path (the "
        "sandbox keeps the gateway's priority, since calls wait for it).",
        "EMBEDDED_DB_NICE",
        group="Database",
        at_least=0,
        at_most=19,
    )
    db_expiry_seconds: float = setting(
        60.0,
        "On SecantusDB (the embedded default): seconds between this process's passes deleting documents past "
        "their TTL index's expiry, made without one there (storage/expiry.py); 0 leaves expiry to the server's "
        "own sweeper, which stalls it under load. MongoDB expires documents itself either way.",
        "DB_EXPIRY_SECONDS",
        group="Database",
        at_least=0,
        must="0 (no passes) or a positive number of seconds",
    )
    jwt_secret: str = setting(
        "",
        "HS256 key for session tokens. Required in production; generated in development.",
        "JWT_SECRET",
        group="Secrets and sessions",
        check=_secret,
        must=SECRET_MUST,
    )
    secrets_key: str = setting(
        "",
        "Key for API-key digests and at-rest encryption. Required in production; generated in development.",
        "SECRETS_KEY",
        group="Secrets and sessions",
        check=_secret,
        must=SECRET_MUST,
    )
    token_ttl_seconds: int = setting(
        7 * 86400, "Session token lifetime in seconds.", "TOKEN_TTL_SECONDS", group="Secrets and sessions"
    )
    password_scrypt_n: int = setting(
        2**17, "scrypt cost N for new password hashes (OWASP: 2^17).", "PASSWORD_SCRYPT_N", group="Secrets and sessions"
    )
    admin_require_2fa: bool = setting(
        False,
        "Admin endpoints answer 403 to an admin whose account has no two-factor sign-in enrolled.",
        "ADMIN_REQUIRE_2FA",
        group="Account security",
    )
    password_reset_ttl_seconds: int = setting(
        1800,
        "Lifetime of an emailed password-reset link, in seconds (single use). The email goes out only with "
        "SMTP_URL; the link starts with PUBLIC_URL (in development without it: the host the request named; "
        "production without it sends none).",
        "PASSWORD_RESET_TTL_SECONDS",
        group="Account security",
        at_least=60,
    )
    audit_retention_days: int = setting(
        400,
        "Days an audit-log entry is kept (MongoDB TTL); a change applies to entries written after it.",
        "AUDIT_RETENTION_DAYS",
        group="Account security",
        at_least=1,
    )
    admin_emails: tuple = setting(
        (),
        "Comma-separated emails of the operator's own accounts, left out of /admin figures. Grants no rights: "
        "admin is granted only with `social-gateway admin grant EMAIL`.",
        "ADMIN_EMAILS",
        group="Accounts",
    )
    signup_credits: int = setting(
        0,
        "Credits granted to a new account (to at most SIGNUP_CREDITED_PER_NETWORK accounts per client network a day).",
        "SIGNUP_CREDITS",
        group="Accounts",
    )
    plan_rules: tuple = setting(
        _default_plans(),
        "JSON list of plan tiers {name, min_paid_usd, qps (per key), account_qps (all keys; default 5 x qps)}.",
        "PLAN_RULES",
        group="Accounts",
        check=_plans,
        must="a non-empty list of {name, min_paid_usd, qps} with positive qps and account_qps",
    )
    max_keys_per_account: int = setting(
        20,
        "Active (unrevoked) API keys one account may hold; creating one more answers 409.",
        "MAX_KEYS_PER_ACCOUNT",
        group="Accounts",
        at_least=1,
    )
    credits_per_usd: int = setting(100_000, "Credits one US dollar buys.", "CREDITS_PER_USD", group="Accounts")
    max_body_bytes: int = setting(
        64 * 1024, "Largest request body accepted (413 above).", "MAX_BODY_BYTES", group="Requests and connections"
    )
    max_header_bytes: int = setting(
        16 * 1024,
        "Largest request line + headers accepted (431 above; the connection is closed past 4x).",
        "MAX_HEADER_BYTES",
        group="Requests and connections",
        at_least=1024,
    )
    http_idle_timeout: float = setting(
        75.0,
        "Seconds an idle keep-alive connection, or a client still sending its request headers, is kept open.",
        "HTTP_IDLE_TIMEOUT",
        group="Requests and connections",
        above=0,
    )
    http_body_timeout: float = setting(
        30.0,
        "Seconds a client may take to send a request body before it is disconnected.",
        "HTTP_BODY_TIMEOUT",
        group="Requests and connections",
        above=0,
    )
    max_connections_per_address: int = setting(
        4096,
        "Open connections one client address may hold (peers in TRUSTED_PROXIES are exempt); further ones are "
        "closed. A customer at R calls/s holds about R x the provider's latency (700 for 1,000/s at 0.7 s).",
        "MAX_CONNECTIONS_PER_ADDRESS",
        group="Requests and connections",
        at_least=1,
    )
    login_max_failures_per_email: int = setting(
        5,
        "Failed logins per email from one client network within LOGIN_WINDOW_SECONDS before that network gets 429 "
        "for that email (unknown emails too); other networks are not affected.",
        "LOGIN_MAX_FAILURES_PER_EMAIL",
        group="Sign-in and sign-up limits",
        at_least=1,
    )
    login_window_seconds: float = setting(
        900.0,
        "Window of the login failure counts, seconds.",
        "LOGIN_WINDOW_SECONDS",
        group="Sign-in and sign-up limits",
        above=0,
    )
    login_slowdown_after: int = setting(
        10,
        "Failed logins per email from all networks within LOGIN_WINDOW_SECONDS past which each further failure is "
        "answered after a delay doubling from 1 s (never a lock: the right password is answered at once).",
        "LOGIN_SLOWDOWN_AFTER",
        group="Sign-in and sign-up limits",
        at_least=1,
    )
    login_max_delay_seconds: float = setting(
        30.0,
        "Longest delay of a failed login answer (LOGIN_SLOWDOWN_AFTER).",
        "LOGIN_MAX_DELAY_SECONDS",
        group="Sign-in and sign-up limits",
        at_least=0,
    )
    client_network_v4_prefix: int = setting(
        24,
        "Prefix length of the IPv4 client network that login and sign-up limits count by.",
        "CLIENT_NETWORK_V4_PREFIX",
        group="Sign-in and sign-up limits",
        at_least=8,
        at_most=32,
    )
    client_network_v6_prefix: int = setting(
        64,
        "Prefix length of the IPv6 client network that login and sign-up limits count by.",
        "CLIENT_NETWORK_V6_PREFIX",
        group="Sign-in and sign-up limits",
        at_least=16,
        at_most=128,
    )
    signup_max_per_network: int = setting(
        10,
        "Registrations per client network within SIGNUP_WINDOW_SECONDS before 429.",
        "SIGNUP_MAX_PER_NETWORK",
        group="Sign-in and sign-up limits",
        at_least=1,
    )
    signup_window_seconds: float = setting(
        3600.0,
        "Window of the per-network registration limit, seconds.",
        "SIGNUP_WINDOW_SECONDS",
        group="Sign-in and sign-up limits",
        above=0,
    )
    signup_credited_per_network: int = setting(
        3,
        "Registrations per client network per UTC day that get SIGNUP_CREDITS; later ones start with 0 credits.",
        "SIGNUP_CREDITED_PER_NETWORK",
        group="Sign-in and sign-up limits",
        at_least=0,
    )
    login_max_attempts_per_address: int = setting(
        20,
        "Login and registration attempts per client address per minute before 429.",
        "LOGIN_MAX_ATTEMPTS_PER_ADDRESS",
        group="Sign-in and sign-up limits",
        at_least=1,
    )
    upstream_url: str = setting(
        "",
        "Base URL of the social-data provider. Empty: start the sandbox upstream in its own process.",
        "UPSTREAM_URL",
        group="Upstream",
    )
    upstream_api_key: str = setting(
        SANDBOX_UPSTREAM_KEY,
        "Credential sent upstream as X-API-Key.",
        "UPSTREAM_API_KEY",
        group="Upstream",
        check=_header_safe,
        must=HEADER_SAFE,
    )
    upstream_api_keys: tuple = setting(
        (),
        "Several provider keys instead of UPSTREAM_API_KEY: KEY:QPS,KEY:QPS,... (a key without :QPS has no rate "
        "of its own). Calls spread over the keys within their rates; a key the provider refuses (429/402/401/403) "
        "is rested and the call sent with another, never charged; past the keys' total rate the accounts over "
        "their fair share get 429.",
        "UPSTREAM_API_KEYS",
        group="Upstream",
        check=_header_safe_keys,
        must=HEADER_SAFE,
    )
    upstream_path_prefix: str = setting(
        "/twitter",
        "Path prefix of the provider's endpoints.",
        "UPSTREAM_PATH_PREFIX",
        group="Upstream",
        check=_path_prefix,
        must="a path starting with /",
    )
    upstream_connect_timeout: float = setting(
        2.0, "Upstream connect timeout, seconds.", "UPSTREAM_CONNECT_TIMEOUT", group="Upstream", above=0
    )
    upstream_timeout: float = setting(
        15.0, "Upstream request timeout, seconds (504 past it).", "UPSTREAM_TIMEOUT", group="Upstream", above=0
    )
    upstream_max_connections: int = setting(
        4096,
        "Connections to the provider at once (kept alive): a 0.7 s provider needs 0.7 per call/s in flight. "
        "When all are busy, calls wait (up to UPSTREAM_CONNECT_TIMEOUT) and freed ones go to the account "
        "holding the fewest per unit of plan rate. Mind the process's open-file limit (serve raises it).",
        "UPSTREAM_MAX_CONNECTIONS",
        group="Upstream",
        at_least=1,
    )
    upstream_max_body_bytes: int = setting(
        8 * 1024 * 1024, "Largest upstream body accepted (502 above).", "UPSTREAM_MAX_BODY_BYTES", group="Upstream"
    )
    breaker_failures: int = setting(
        20, "Consecutive upstream failures that open the circuit breaker.", "BREAKER_FAILURES", group="Upstream"
    )
    breaker_min_accounts: int = setting(
        3,
        "Accounts whose calls must share in the failures that open the breaker (connection errors need none).",
        "BREAKER_MIN_ACCOUNTS",
        group="Upstream",
        at_least=1,
    )
    account_failure_budget: int = setting(
        10,
        "Failed upstream calls (5xx, timeouts) one account may cause per ACCOUNT_FAILURE_WINDOW before its calls get 429.",
        "ACCOUNT_FAILURE_BUDGET",
        group="Upstream",
        at_least=1,
    )
    account_max_in_flight: int = setting(
        0,
        "Upstream calls one account may have in flight at once; further calls get 429. 0: what its plan needs, "
        "the account's rate x twice the provider's recent p99 latency (between 1 s and UPSTREAM_TIMEOUT), so a "
        "customer within its plan never meets it. Always at most half of UPSTREAM_MAX_CONNECTIONS.",
        "ACCOUNT_MAX_IN_FLIGHT",
        group="Upstream",
        at_least=0,
        must="0 (follow the plan) or a positive number",
    )
    account_failure_window: float = setting(
        60.0, "Window of the per-account failure budget, seconds.", "ACCOUNT_FAILURE_WINDOW", group="Upstream", above=0
    )
    breaker_reset_seconds: float = setting(
        5.0, "Seconds an open breaker waits before a trial call.", "BREAKER_RESET_SECONDS", group="Upstream"
    )
    providers: tuple = setting(
        (),
        "The providers behind the data API, a JSON list in order of preference: "
        '{"name", "kind" (twitterapi or socialdata), "url", "keys": [KEY or KEY:QPS, ...], "costs"?, "prefix"?} '
        "(costs: what the operator pays, docs/providers.md). Empty: one twitterapi provider named "
        '"twitterapi" from UPSTREAM_URL, UPSTREAM_API_KEY(S) and UPSTREAM_PATH_PREFIX.',
        "PROVIDERS",
        group="Upstream",
        check=_providers,
        must="a JSON list of {name, kind, url, keys} with unique names (docs/providers.md)",
    )
    provider_routing: str = setting(
        "order",
        "Which healthy provider a call goes to first: order (the first in PROVIDERS that serves the endpoint) or "
        "cost (the cheapest by the costs tables for a full page; unpriced ones last, in order).",
        "PROVIDER_ROUTING",
        group="Upstream",
        choices=("order", "cost"),
    )
    twitter_alias: bool = setting(
        True, "Also serve every data endpoint under /twitter/.", "TWITTER_ALIAS", group="Upstream"
    )
    price_rules: Mapping = setting(
        {},
        "JSON object overriding price rules (see metering/pricing.py).",
        "PRICE_RULES",
        group="Metering",
        check=_price_rules,
        must="price rules metering/pricing.py accepts",
    )
    flush_interval: float = setting(0.25, "Seconds between usage flushes.", "FLUSH_INTERVAL", group="Metering", above=0)
    flush_batch: int = setting(500, "Usage records per flush batch.", "FLUSH_BATCH", group="Metering")
    buffer_max: int = setting(
        100_000, "Unflushed usage records past which data calls fail closed (503).", "BUFFER_MAX", group="Metering"
    )
    provider_ledger_retention_days: int = setting(
        400,
        "Days the operator's cost ledger keeps each provider request (MongoDB TTL; docs/providers.md): the margin "
        "view's paid side reaches this far back. A change applies to requests written after it.",
        "PROVIDER_LEDGER_RETENTION_DAYS",
        group="Metering",
        at_least=1,
    )
    journal: bool = setting(
        True,
        "on: each usage record is written to this process's journal under DATA_DIR/journal and fsynced before its "
        "call is answered, so a crash or a power loss loses no answered call's record (accounting/journal.py). "
        "off: records wait in memory until their flush; a hard crash loses those of the last FLUSH_INTERVAL or "
        "more, calls served and never charged.",
        "JOURNAL",
        group="Metering",
    )
    journal_group_ms: float = setting(
        1.0,
        "Milliseconds a group of usage journal records gathers before its one write and fsync, when the journal's "
        "writer is idle (while it writes, the next group gathers and goes as soon as it is free).",
        "JOURNAL_GROUP_MS",
        group="Metering",
        at_least=0,
        at_most=100,
    )
    journal_group_records: int = setting(
        256,
        "Journal entries (records, and a flush's two marks per batch) past which a group is written at once.",
        "JOURNAL_GROUP_RECORDS",
        group="Metering",
        at_least=1,
        at_most=100_000,
    )
    lease_seconds: float = setting(
        30.0, "Seconds of an account's spend one credit lease covers.", "LEASE_SECONDS", group="Metering", above=0
    )
    lease_timeout: float = setting(
        30.0,
        "Seconds without heartbeat after which a process's leases are reclaimed.",
        "LEASE_TIMEOUT",
        group="Metering",
        above=0,
    )
    key_cache_size: int = setting(200_000, "API keys kept in memory.", "KEY_CACHE_SIZE", group="Metering")
    key_cache_ttl: float = setting(
        300.0, "Seconds a cached key is trusted before it is re-read.", "KEY_CACHE_TTL", group="Metering"
    )
    negative_cache_ttl: float = setting(
        5.0, "Seconds an unknown key is remembered as unknown.", "NEGATIVE_CACHE_TTL", group="Metering"
    )
    idempotency_ttl: int = setting(
        86400,
        "Seconds the first answer to an Idempotency-Key is kept: a repeat of the same request within them gets "
        "that answer again, charged 0.",
        "IDEMPOTENCY_TTL",
        group="Retries",
        at_least=1,
    )
    idempotency_max_body_bytes: int = setting(
        1024 * 1024,
        "Largest answer body kept for an Idempotency-Key. A larger answer is served and charged once; only its "
        "charge is kept, and a repeat gets 409 (nothing charged; send a new key to call again).",
        "IDEMPOTENCY_MAX_BODY_BYTES",
        group="Retries",
        at_least=1,
    )
    idempotency_max_account_bytes: int = setting(
        256 * 1024 * 1024,
        "Answer bodies one account may have kept at once (within IDEMPOTENCY_TTL, counted per process); past it "
        "answers are kept without their body, as if too large.",
        "IDEMPOTENCY_MAX_ACCOUNT_BYTES",
        group="Retries",
        at_least=1,
    )
    cache_max_bytes: int = setting(
        256 * 1024 * 1024,
        "Bytes of provider answers each process keeps in memory, the least recently used evicted first; 0 turns "
        "the cache off (identical calls in flight at once still make one provider call).",
        "CACHE_MAX_BYTES",
        group="Answer cache",
        at_least=0,
    )
    cache_ttl: Mapping = setting(
        {},
        'JSON object: endpoint path as under /social/ (e.g. "user/info") to the seconds its answers stay fresh, '
        'over the defaults (docs/api.md); 0 turns caching off for it. E.g. {"user/info": 1800, "trends": 0}.',
        "CACHE_TTL",
        group="Answer cache",
        check=_cache_ttl,
        must="endpoint paths mapped to whole seconds from 0 to 86400",
    )
    cache_hit_price: float = setting(
        0.0,
        "Fraction (0 to 1) of a call's price charged for an answer served from the cache.",
        "CACHE_HIT_PRICE",
        group="Answer cache",
        at_least=0,
        at_most=1,
    )
    mcp_max_result_bytes: int = setting(
        40_000,
        "Bytes at most of one MCP tool result (both its structured and its text copy): a page is cut at whole items "
        "to fit, with the cursor to continue. 40,000 bytes is about 10,000 tokens, well under what agents accept.",
        "MCP_MAX_RESULT_BYTES",
        group="MCP (AI agents)",
        at_least=4_000,
        at_most=1_000_000,
    )
    mcp_allowed_origins: str = setting(
        "",
        "Comma-separated browser origins (https://app.example) allowed to call /mcp besides the gateway's own "
        "(PUBLIC_URL's; without it, the request's when it names localhost or an address) and, outside production, "
        "loopback ones; any other Origin header is refused 403 (DNS rebinding). Requests without Origin (programs, "
        "agents) are allowed.",
        "MCP_ALLOWED_ORIGINS",
        group="MCP (AI agents)",
    )
    cache_stale_if_error: int = setting(
        3600,
        "Seconds past which a cached answer is no longer served (X-Cache: STALE, charged as a hit) while the "
        "provider fails; 0: never.",
        "CACHE_STALE_IF_ERROR",
        group="Answer cache",
        at_least=0,
    )
    cache_shared: bool = setting(
        False,
        "Share answers between machines through MongoDB (a second tier behind each machine's workers), with one "
        "provider call per key at a time across them; the workers of one machine share through each key's owner "
        "worker without it.",
        "CACHE_SHARED",
        group="Answer cache",
    )
    crawl_guard_max_bytes: int = setting(
        32 * 1024 * 1024,
        "Bytes of the crawl guard's memory each process keeps (the pages each crawl was served, by cursor and next "
        "cursor: docs/api.md), the least recently paged crawls forgotten first.",
        "CRAWL_GUARD_MAX_BYTES",
        group="Answer cache",
        at_least=64 * 1024,
    )
    qps_divisor: float = setting(
        1.0,
        "Each process enforces a key's QPS divided by this: 1 behind nginx hashing on X-API-Key, N for N processes without it.",
        "QPS_DIVISOR",
        group="Scale-out",
        at_least=1,
    )
    coherence: str = setting(
        "changestream",
        "How revocations, plan changes and top-ups made by other processes reach this one: changestream, poll or off.",
        "COHERENCE",
        group="Scale-out",
        choices=("changestream", "poll", "off"),
    )
    coherence_poll_seconds: float = setting(
        1.0,
        "Polling interval when change streams are unavailable (COHERENCE=poll, or the fallback).",
        "COHERENCE_POLL_SECONDS",
        group="Scale-out",
        above=0,
    )
    payments_provider: str = setting(
        "",
        "Crypto payment processor: nowpayments, or empty for the sandbox chain (development only; production answers 503 at checkout).",
        "PAYMENTS_PROVIDER",
        group="Payments",
        choices=("", "nowpayments"),
        must="nowpayments or empty (the development sandbox chain)",
    )
    payments_api_url: str = setting(
        "https://api.nowpayments.io", "Base URL of the payment processor's API.", "PAYMENTS_API_URL", group="Payments"
    )
    payments_api_key: str = setting(
        "", "Payment processor API key (sent as x-api-key).", "PAYMENTS_API_KEY", group="Payments"
    )
    payments_ipn_secret: str = setting(
        "",
        "Key of the processor's signed notifications (x-nowpayments-sig). Empty: every notification is refused.",
        "PAYMENTS_IPN_SECRET",
        group="Payments",
    )
    public_url: str = setting(
        "",
        "Public base URL of this service; the processor calls PUBLIC_URL/billing/crypto/ipn.",
        "PUBLIC_URL",
        group="Payments",
    )
    order_ttl_seconds: int = setting(
        3600,
        "Seconds a checkout's quoted pay amount is valid (sandbox orders expire after it).",
        "ORDER_TTL_SECONDS",
        group="Payments",
        at_least=1,
    )
    reconcile_interval: float = setting(
        30.0,
        "Seconds between polls of unsettled orders (first delay; doubles per order up to an hour).",
        "RECONCILE_INTERVAL",
        group="Payments",
        above=0,
    )
    max_open_orders: int = setting(
        5,
        "Unpaid checkout orders one account may have open before checkout answers 429.",
        "MAX_OPEN_ORDERS",
        group="Payments",
        at_least=1,
    )
    checkouts_per_minute: int = setting(
        10, "Checkouts per account per minute before 429.", "CHECKOUTS_PER_MINUTE", group="Payments", at_least=1
    )
    billing_issuer_name: str = setting(
        "Social Data Gateway",
        "The operator's name at the top of every receipt, credit note and statement (docs/billing.md).",
        "BILLING_ISSUER_NAME",
        group="Billing documents",
        check=_text(200, required=True),
        must="1 to 200 characters",
    )
    billing_issuer_address: str = setting(
        "",
        "The operator's address on every billing document; lines separated by newlines or a literal \\n.",
        "BILLING_ISSUER_ADDRESS",
        group="Billing documents",
        check=_text(1000),
        must="at most 1,000 characters",
    )
    billing_issuer_tax_id: str = setting(
        "",
        "The operator's VAT, GST or other tax number on every billing document (empty: none shown).",
        "BILLING_ISSUER_TAX_ID",
        group="Billing documents",
        check=_text(100),
        must="at most 100 characters",
    )
    billing_footer: str = setting(
        "",
        "A line at the foot of every page of every billing document: registration, bank, contact (wrapped).",
        "BILLING_FOOTER",
        group="Billing documents",
        check=_text(1000),
        must="at most 1,000 characters",
    )
    billing_paper: str = setting(
        "A4",
        "The paper billing PDFs are set on unless the request asks (?paper=A4 or Letter).",
        "BILLING_PAPER",
        group="Billing documents",
        choices=("A4", "Letter"),
    )
    alert_check_seconds: float = setting(
        2.0,
        "Seconds between alert checks of the accounts with rules that spent in this process (off the request path).",
        "ALERT_CHECK_SECONDS",
        group="Alerts and webhooks",
        above=0,
    )
    webhook_retry_schedule: tuple = setting(
        (5, 30, 120, 600, 1800, 3600, 10800),
        "JSON list of seconds between a webhook's attempts; the last one repeats until WEBHOOK_RETRY_FOR.",
        "WEBHOOK_RETRY_SCHEDULE",
        group="Alerts and webhooks",
        check=_retry_schedule,
        must="a non-empty JSON list of positive seconds",
    )
    webhook_retry_for: float = setting(
        3 * 86400.0,
        "Seconds a webhook delivery is retried before it is given up (at least a day).",
        "WEBHOOK_RETRY_FOR",
        group="Alerts and webhooks",
        above=0,
    )
    webhook_timeout: float = setting(
        10.0,
        "Seconds one webhook attempt may take (connect and answer).",
        "WEBHOOK_TIMEOUT",
        group="Alerts and webhooks",
        above=0,
    )
    webhook_disable_after: float = setting(
        5 * 86400.0,
        "Seconds an endpoint may fail without one success before it is disabled.",
        "WEBHOOK_DISABLE_AFTER",
        group="Alerts and webhooks",
        above=0,
    )
    webhook_poll_seconds: float = setting(
        5.0,
        "Seconds between looks at the outbox for work another process left (retries due, crashed claims).",
        "WEBHOOK_POLL_SECONDS",
        group="Alerts and webhooks",
        above=0,
    )
    webhook_concurrency: int = setting(
        100, "Webhook attempts under way at once per process.", "WEBHOOK_CONCURRENCY", group="Alerts and webhooks"
    )
    webhook_account_concurrency: int = setting(
        10,
        "Of those, at most this many of one account's (a receiver that hangs holds only its account's share); a "
        "free place goes first to an account with none under way.",
        "WEBHOOK_ACCOUNT_CONCURRENCY",
        group="Alerts and webhooks",
        at_least=1,
    )
    webhook_allow_private: bool = setting(
        False,
        "Production: allow webhook endpoints on loopback, private and link-local addresses (on-premise receivers).",
        "WEBHOOK_ALLOW_PRIVATE",
        group="Alerts and webhooks",
    )
    smtp_url: str = setting(
        "",
        "smtp://user:pass@host:587 (STARTTLS when offered; ?starttls=require to insist), smtps://... (TLS); "
        "empty: alerts go to webhooks and the portal only.",
        "SMTP_URL",
        group="Alerts and webhooks",
        check=_smtp_url,
        must="empty, smtp://... or smtps://...",
    )
    smtp_from: str = setting(
        "alerts@localhost", "From address of alert emails.", "SMTP_FROM", group="Alerts and webhooks"
    )
    stream_max_rules: int = setting(
        50,
        "Filter rules an account may have (deleted ones do not count; 409 past it).",
        "STREAM_MAX_RULES",
        group="Real time",
    )
    stream_max_monitors: int = setting(
        100, "Account monitors an account may have.", "STREAM_MAX_MONITORS", group="Real time"
    )
    stream_min_interval: float = setting(
        10.0,
        "Shortest polling interval of a rule or monitor, in seconds (422 under it).",
        "STREAM_MIN_INTERVAL",
        group="Real time",
        above=0,
    )
    stream_monitor_interval: float = setting(
        60.0,
        "Polling interval of an account monitor added through the provider's API (add_user_to_monitor_tweet), "
        "in seconds.",
        "STREAM_MONITOR_INTERVAL",
        group="Real time",
        above=0,
    )
    stream_event_retention: float = setting(
        86400.0,
        "Seconds delivered events are kept for a reconnecting socket to ask for (at least an hour).",
        "STREAM_EVENT_RETENTION",
        group="Real time",
        at_least=3600,
        must="at least 3600 (a reconnecting socket may ask for an hour)",
    )
    stream_ping_seconds: float = setting(
        20.0, "Seconds between pings on an idle WebSocket.", "STREAM_PING_SECONDS", group="Real time", above=0
    )
    stream_tick_seconds: float = setting(
        0.1,
        "Seconds between the poll scheduler's and the event tail's looks at the database (an idle process: at "
        "most once a second).",
        "STREAM_TICK_SECONDS",
        group="Real time",
        above=0,
    )
    stream_balance_check_seconds: float = setting(
        10.0,
        "Seconds between checks that accounts can pay for the next hour of their rules' polls.",
        "STREAM_BALANCE_CHECK_SECONDS",
        group="Real time",
        above=0,
    )
    trusted_proxies: tuple = setting(
        (),
        "Comma-separated IPs/CIDRs of reverse proxies whose X-Forwarded-For / X-Real-IP are believed.",
        "TRUSTED_PROXIES",
        group="Operations",
    )
    metrics_token: str = setting(
        "", "If set, GET /metrics requires Authorization: Bearer <token>.", "METRICS_TOKEN", group="Operations"
    )
    metrics_port: int = setting(
        0,
        "If set, /metrics is served only on this port (0: on the main port).",
        "METRICS_PORT",
        group="Operations",
        at_least=0,
        at_most=65535,
        must=METRICS_PORT_MUST,
    )
    access_log: bool = setting(
        True, "One JSON line per request on the gateway.access logger.", "ACCESS_LOG", group="Operations"
    )
    log_level: str = setting(
        "INFO",
        "Least severe log level written: DEBUG, INFO, WARNING, ERROR or CRITICAL.",
        "LOG_LEVEL",
        group="Operations",
        check=_log_level,
        must="DEBUG, INFO, WARNING, ERROR or CRITICAL",
    )
    log_format: str = setting(
        "",
        "json (one JSON object per line: time, level, logger, message, request_id) or text. "
        "Empty: json in production, text in development.",
        "LOG_FORMAT",
        group="Operations",
        choices=("", "json", "text"),
    )

    @property
    def production(self) -> bool:
        return self.env == "production"

    def safe_items(self) -> dict:
        """Settings with secrets masked, for logs."""
        items = dataclasses.asdict(self)
        for name in (
            "jwt_secret",
            "secrets_key",
            "upstream_api_key",
            "upstream_api_keys",
            "providers",
            "payments_api_key",
            "payments_ipn_secret",
            "metrics_token",
            "smtp_url",
        ):
            items[name] = "***" if items[name] else ""
        return items


def fields() -> tuple[dataclasses.Field, ...]:
    return dataclasses.fields(Settings)


def _convert(f: dataclasses.Field, raw: Any) -> Any:
    kind = f.type
    try:
        if kind == "bool":
            if isinstance(raw, bool):
                return raw
            value = str(raw).strip().lower()
            if value not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError(raw)
            return value in ("1", "true", "yes", "on")
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "tuple":
            if f.name == "admin_emails":
                items = raw if isinstance(raw, (list, tuple)) else str(raw).split(",")
                return tuple(e.strip().lower() for e in items if e.strip())
            if f.name == "upstream_api_keys":
                return provider_keys(raw)
            if f.name == "trusted_proxies":
                items = raw if isinstance(raw, (list, tuple)) else str(raw).split(",")
                return tuple(str(ipaddress.ip_network(e.strip(), strict=False)) for e in items if e.strip())
            return tuple(orjson.loads(raw) if isinstance(raw, (str, bytes)) else raw)
        if kind == "Mapping":
            return dict(orjson.loads(raw) if isinstance(raw, (str, bytes)) else raw)
        return str(raw)
    except (ValueError, TypeError, orjson.JSONDecodeError) as exc:
        if f.name == "upstream_api_keys":  # never echo provider keys
            raise SettingsError(f"UPSTREAM_API_KEYS: {exc}") from None
        if f.name == "providers":  # nor the keys PROVIDERS holds
            raise SettingsError("PROVIDERS: cannot read it as a JSON list") from None
        raise SettingsError(f"{f.metadata['env']}: cannot read {raw!r} as {kind}") from exc


def provider_keys(raw: Any) -> tuple[tuple[str, float], ...]:
    """`KEY:QPS,KEY:QPS,KEY` -> ((key, qps), ...); qps 0 for a key without a rate of its own."""
    items = raw if isinstance(raw, (list, tuple)) else [p for p in str(raw).split(",") if p.strip()]
    keys = []
    for item in items:
        secret, qps = (item[0], item[1]) if isinstance(item, (list, tuple)) else (str(item).strip(), 0.0)
        if isinstance(item, str) and ":" in secret:
            secret, qps = secret.rsplit(":", 1)
        qps = float(qps)
        if not secret or not 0 <= qps < float("inf"):
            raise ValueError("each key is KEY or KEY:QPS (QPS >= 0)")
        keys.append((secret, qps))
    if len({secret for secret, _ in keys}) != len(keys):
        raise ValueError("a key is listed twice")
    return tuple(keys)


def load(environ: Mapping[str, str] | None = None, serving: bool = False, **overrides: Any) -> Settings:
    """Defaults < CONFIG_FILE (TOML, keys are setting names) < environment < overrides. Every problem is
    reported at once (SettingsError.problems); `serving` adds what running the service needs besides."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    config_file = environ.get("CONFIG_FILE")
    if config_file:
        with open(config_file, "rb") as fh:
            try:
                values.update(tomllib.load(fh))
            except tomllib.TOMLDecodeError as exc:
                raise SettingsError(f"CONFIG_FILE {config_file}: {exc}") from None
    by_name = {f.name: f for f in fields()}
    unknown = set(values) - set(by_name)
    if unknown:
        raise SettingsError(f"unknown settings in {config_file}: {', '.join(sorted(unknown))}")
    for f in fields():
        if f.metadata["env"] in environ:
            values[f.name] = environ[f.metadata["env"]]
    values.update({k: v for k, v in overrides.items() if v is not None})
    found, converted = [], {}
    for name, raw in values.items():
        try:
            converted[name] = _convert(by_name[name], raw)
        except SettingsError as exc:  # reported with every other problem; the default stands in meanwhile
            found += exc.problems
    settings = Settings(**converted)
    found += problems(settings) + (serving_problems(settings) if serving else [])
    if found:
        raise SettingsError(*found)
    if not settings.host and not settings.production:
        settings = dataclasses.replace(settings, host=DEV_HOST)
    return settings


def load_for_command(serving: bool = False, **overrides: Any) -> Settings | None:
    """load() for a command-line entry point: None (and every reason on stderr) when the settings are unusable."""
    try:
        return load(serving=serving, **overrides)
    except SettingsError as exc:
        print(exc.report(), file=sys.stderr)
    except OSError as exc:
        print(f"social-gateway: {exc}", file=sys.stderr)
    return None


def serving_problems(settings: Settings) -> list[str]:
    """What `serve` needs beyond usable values: in production, nothing left to a development default."""
    found = []
    if settings.production and not settings.host:
        found.append("GATEWAY_HOST (or --host) is required in production, e.g. 0.0.0.0")
    if settings.production and not (settings.upstream_url or settings.providers):
        # The sandbox upstream (and its default credential) must never serve production traffic.
        found.append("UPSTREAM_URL is required in production (the sandbox upstream is for development only)")
    if (
        settings.production
        and not (settings.upstream_api_keys or settings.providers)
        and settings.upstream_api_key == SANDBOX_UPSTREAM_KEY
    ):
        found.append("UPSTREAM_API_KEY is required in production (not the sandbox's key)")
    if settings.production and not settings.mongodb_uri and not settings.allow_embedded_db:
        found.append(
            "MONGODB_URI is required in production (the embedded database is one process on one disk); "
            "set ALLOW_EMBEDDED_DB=true to run on it anyway"
        )
    if not settings.mongodb_uri and importlib.util.find_spec("secantus") is None:
        found.append(
            "the embedded database needs the `embedded` extra: pip install 'social-gateway[embedded]', "
            "or set MONGODB_URI"
        )
    return found


def problems(settings: Settings) -> list[str]:
    """Everything wrong with `settings`, each a line an operator can act on (empty: they are usable): each setting
    against its declared bounds, then the rules that relate settings to each other."""
    found = [f.metadata["bounds"].problem(f.metadata["env"], getattr(settings, f.name)) for f in fields()]
    return [problem for problem in found if problem] + relations(settings)


def relations(settings: Settings) -> list[str]:
    """What no one setting's bounds can say: settings that must agree, production's needs, installed packages."""
    found = []
    if settings.production and not (settings.jwt_secret and settings.secrets_key):
        found.append("JWT_SECRET and SECRETS_KEY are required in production")
    if settings.metrics_port and settings.metrics_port == settings.port:
        found.append(f"METRICS_PORT must be {METRICS_PORT_MUST}")
    if settings.payments_provider == "nowpayments" and not (
        settings.payments_api_key and settings.payments_ipn_secret and settings.public_url
    ):
        found.append("PAYMENTS_PROVIDER=nowpayments requires PAYMENTS_API_KEY, PAYMENTS_IPN_SECRET and PUBLIC_URL")
    if settings.event_loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
        found.append("EVENT_LOOP=uvloop needs uvloop (pip install uvloop), or set EVENT_LOOP=asyncio")
    if settings.webhook_account_concurrency > settings.webhook_concurrency:
        found.append("WEBHOOK_ACCOUNT_CONCURRENCY must be at most WEBHOOK_CONCURRENCY")
    if settings.stream_monitor_interval < settings.stream_min_interval:
        found.append("STREAM_MONITOR_INTERVAL must be at least STREAM_MIN_INTERVAL")
    return found


def by_env(name: str) -> str:
    return next(f.metadata["env"] for f in fields() if f.name == name)
