"""Every setting of the service, declared once: name, type, default, help.

Values come from (lowest to highest precedence) the defaults below, an optional
TOML file named by CONFIG_FILE, and the environment. The result is a frozen
``Settings`` validated at start-up; ``describe()`` renders the table for --help.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import ipaddress
import os
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

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


def _setting(default: Any, help: str, env: str | None = None) -> Any:
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata={"help": help, "env": env})
    return field(default=default, metadata={"help": help, "env": env})


def _default_plans() -> tuple:
    # Defaults of the provider our users know (reference.md): never paid 1 call / 5 s, paid 20/s.
    return (
        {"name": "free", "min_paid_usd": 0, "qps": 0.2},
        {"name": "paid", "min_paid_usd": 0.01, "qps": 20},
        {"name": "pro", "min_paid_usd": 500, "qps": 50},
        {"name": "scale", "min_paid_usd": 5000, "qps": 500},
    )


@dataclass(frozen=True)
class Settings:
    # Service
    host: str = _setting(
        "",
        "Address to listen on. Empty: 127.0.0.1 in development (the dev top-up and /metrics stay off the "
        "network); production needs it set (e.g. 0.0.0.0 behind a proxy).",
        "GATEWAY_HOST",
    )
    port: int = _setting(8000, "Port to listen on.", "GATEWAY_PORT")
    env: str = _setting("development", "development or production.", "GATEWAY_ENV")
    data_dir: str = _setting("./var", "Folder for the embedded database and generated development secrets.", "DATA_DIR")
    # Database
    mongodb_uri: str = _setting(
        "", "MongoDB URI. Empty: start the embedded SecantusDB under DATA_DIR/db.", "MONGODB_URI"
    )
    mongodb_db: str = _setting("social_gateway", "Database name.", "MONGODB_DB")
    allow_embedded_db: bool = _setting(
        False,
        "Production only: run on the embedded database when MONGODB_URI is empty (otherwise refused).",
        "ALLOW_EMBEDDED_DB",
    )
    embedded_db_nice: int = _setting(
        10,
        "Niceness of the embedded database process (0-19): its write bursts yield the cores to the request path.",
        "EMBEDDED_DB_NICE",
    )
    db_expiry_seconds: float = _setting(
        60.0,
        "On SecantusDB (the embedded default): seconds between this process's passes deleting documents past "
        "their TTL index's expiry, made without one there (storage/expiry.py); 0 leaves expiry to the server's "
        "own sweeper, which stalls it under load. MongoDB expires documents itself either way.",
        "DB_EXPIRY_SECONDS",
    )
    # Secrets
    jwt_secret: str = _setting(
        "", "HS256 key for session tokens. Required in production; generated in development.", "JWT_SECRET"
    )
    secrets_key: str = _setting(
        "",
        "Key for API-key digests and at-rest encryption. Required in production; generated in development.",
        "SECRETS_KEY",
    )
    token_ttl_seconds: int = _setting(7 * 86400, "Session token lifetime in seconds.", "TOKEN_TTL_SECONDS")
    password_scrypt_n: int = _setting(
        2**17, "scrypt cost N for new password hashes (OWASP: 2^17).", "PASSWORD_SCRYPT_N"
    )
    # Account security (security/totp.py, handlers/twofactor.py, handlers/reset.py, storage/audit.py)
    admin_require_2fa: bool = _setting(
        False,
        "Admin endpoints answer 403 to an admin whose account has no two-factor sign-in enrolled.",
        "ADMIN_REQUIRE_2FA",
    )
    password_reset_ttl_seconds: int = _setting(
        1800, "Lifetime of an emailed password-reset link, in seconds (single use).", "PASSWORD_RESET_TTL_SECONDS"
    )
    audit_retention_days: int = _setting(
        400,
        "Days an audit-log entry is kept (MongoDB TTL); a change applies to entries written after it.",
        "AUDIT_RETENTION_DAYS",
    )
    # Accounts
    admin_emails: tuple = _setting(
        (),
        "Comma-separated emails of the operator's own accounts, left out of /admin figures. Grants no rights: "
        "admin is granted only with `social-gateway admin grant EMAIL`.",
        "ADMIN_EMAILS",
    )
    signup_credits: int = _setting(0, "Credits granted to a new account.", "SIGNUP_CREDITS")
    plan_rules: tuple = _setting(
        _default_plans(),
        "JSON list of plan tiers {name, min_paid_usd, qps (per key), account_qps (all keys; default 5 x qps)}.",
        "PLAN_RULES",
    )
    max_keys_per_account: int = _setting(
        20, "Active (unrevoked) API keys one account may hold; creating one more answers 409.", "MAX_KEYS_PER_ACCOUNT"
    )
    credits_per_usd: int = _setting(100_000, "Credits one US dollar buys.", "CREDITS_PER_USD")
    max_body_bytes: int = _setting(64 * 1024, "Largest request body accepted (413 above).", "MAX_BODY_BYTES")
    max_header_bytes: int = _setting(
        16 * 1024,
        "Largest request line + headers accepted (431 above; the connection is closed past 4x).",
        "MAX_HEADER_BYTES",
    )
    http_idle_timeout: float = _setting(
        75.0,
        "Seconds an idle keep-alive connection, or a client still sending its request headers, is kept open.",
        "HTTP_IDLE_TIMEOUT",
    )
    http_body_timeout: float = _setting(
        30.0, "Seconds a client may take to send a request body before it is disconnected.", "HTTP_BODY_TIMEOUT"
    )
    login_max_failures_per_email: int = _setting(
        5,
        "Failed logins per email from one client network within LOGIN_WINDOW_SECONDS before that network gets 429 "
        "for that email (unknown emails too); other networks are not affected.",
        "LOGIN_MAX_FAILURES_PER_EMAIL",
    )
    login_window_seconds: float = _setting(
        900.0, "Window of the login failure counts, seconds.", "LOGIN_WINDOW_SECONDS"
    )
    login_slowdown_after: int = _setting(
        10,
        "Failed logins per email from all networks within LOGIN_WINDOW_SECONDS past which each further failure is "
        "answered after a delay doubling from 1 s (never a lock: the right password is answered at once).",
        "LOGIN_SLOWDOWN_AFTER",
    )
    login_max_delay_seconds: float = _setting(
        30.0, "Longest delay of a failed login answer (LOGIN_SLOWDOWN_AFTER).", "LOGIN_MAX_DELAY_SECONDS"
    )
    client_network_v4_prefix: int = _setting(
        24,
        "Prefix length of the IPv4 client network that login and sign-up limits count by.",
        "CLIENT_NETWORK_V4_PREFIX",
    )
    client_network_v6_prefix: int = _setting(
        64,
        "Prefix length of the IPv6 client network that login and sign-up limits count by.",
        "CLIENT_NETWORK_V6_PREFIX",
    )
    signup_max_per_network: int = _setting(
        10, "Registrations per client network within SIGNUP_WINDOW_SECONDS before 429.", "SIGNUP_MAX_PER_NETWORK"
    )
    signup_window_seconds: float = _setting(
        3600.0, "Window of the per-network registration limit, seconds.", "SIGNUP_WINDOW_SECONDS"
    )
    signup_credited_per_network: int = _setting(
        3,
        "Registrations per client network per UTC day that get SIGNUP_CREDITS; later ones start with 0 credits.",
        "SIGNUP_CREDITED_PER_NETWORK",
    )
    max_open_orders: int = _setting(
        5, "Unpaid checkout orders one account may have open before checkout answers 429.", "MAX_OPEN_ORDERS"
    )
    checkouts_per_minute: int = _setting(10, "Checkouts per account per minute before 429.", "CHECKOUTS_PER_MINUTE")
    max_connections_per_address: int = _setting(
        4096,
        "Open connections one client address may hold (peers in TRUSTED_PROXIES are exempt); further ones are "
        "closed. A customer at R calls/s holds about R x the provider's latency (700 for 1,000/s at 0.7 s).",
        "MAX_CONNECTIONS_PER_ADDRESS",
    )
    login_max_attempts_per_address: int = _setting(
        20,
        "Login and registration attempts per client address per minute before 429.",
        "LOGIN_MAX_ATTEMPTS_PER_ADDRESS",
    )
    # Upstream
    upstream_url: str = _setting(
        "",
        "Base URL of the social-data provider. Empty: start the sandbox upstream in its own process.",
        "UPSTREAM_URL",
    )
    upstream_api_key: str = _setting(SANDBOX_UPSTREAM_KEY, "Credential sent upstream as X-API-Key.", "UPSTREAM_API_KEY")
    upstream_api_keys: tuple = _setting(
        (),
        "Several provider keys instead of UPSTREAM_API_KEY: KEY:QPS,KEY:QPS,... (a key without :QPS has no rate "
        "of its own). Calls spread over the keys within their rates; a key the provider refuses (429/402/401/403) "
        "is rested and the call sent with another, never charged; past the keys' total rate the accounts over "
        "their fair share get 429.",
        "UPSTREAM_API_KEYS",
    )
    upstream_path_prefix: str = _setting("/twitter", "Path prefix of the provider's endpoints.", "UPSTREAM_PATH_PREFIX")
    upstream_connect_timeout: float = _setting(2.0, "Upstream connect timeout, seconds.", "UPSTREAM_CONNECT_TIMEOUT")
    upstream_timeout: float = _setting(15.0, "Upstream request timeout, seconds (504 past it).", "UPSTREAM_TIMEOUT")
    upstream_max_connections: int = _setting(
        4096,
        "Connections to the provider at once (kept alive): a 0.7 s provider needs 0.7 per call/s in flight. "
        "When all are busy, calls wait (up to UPSTREAM_CONNECT_TIMEOUT) and freed ones go to the account "
        "holding the fewest per unit of plan rate. Mind the process's open-file limit (serve raises it).",
        "UPSTREAM_MAX_CONNECTIONS",
    )
    upstream_max_body_bytes: int = _setting(
        8 * 1024 * 1024, "Largest upstream body accepted (502 above).", "UPSTREAM_MAX_BODY_BYTES"
    )
    breaker_failures: int = _setting(
        20, "Consecutive upstream failures that open the circuit breaker.", "BREAKER_FAILURES"
    )
    breaker_min_accounts: int = _setting(
        3,
        "Accounts whose calls must share in the failures that open the breaker (connection errors need none).",
        "BREAKER_MIN_ACCOUNTS",
    )
    account_failure_budget: int = _setting(
        10,
        "Failed upstream calls (5xx, timeouts) one account may cause per ACCOUNT_FAILURE_WINDOW before its calls get 429.",
        "ACCOUNT_FAILURE_BUDGET",
    )
    account_max_in_flight: int = _setting(
        0,
        "Upstream calls one account may have in flight at once; further calls get 429. 0: what its plan needs, "
        "the account's rate x twice the provider's recent p99 latency (between 1 s and UPSTREAM_TIMEOUT), so a "
        "customer within its plan never meets it. Always at most half of UPSTREAM_MAX_CONNECTIONS.",
        "ACCOUNT_MAX_IN_FLIGHT",
    )
    account_failure_window: float = _setting(
        60.0, "Window of the per-account failure budget, seconds.", "ACCOUNT_FAILURE_WINDOW"
    )
    breaker_reset_seconds: float = _setting(
        5.0, "Seconds an open breaker waits before a trial call.", "BREAKER_RESET_SECONDS"
    )
    twitter_alias: bool = _setting(True, "Also serve every data endpoint under /twitter/.", "TWITTER_ALIAS")
    # Metering
    price_rules: Mapping = _setting({}, "JSON object overriding price rules (see metering/pricing.py).", "PRICE_RULES")
    flush_interval: float = _setting(0.25, "Seconds between usage flushes.", "FLUSH_INTERVAL")
    flush_batch: int = _setting(500, "Usage records per flush batch.", "FLUSH_BATCH")
    buffer_max: int = _setting(
        100_000, "Unflushed usage records past which data calls fail closed (503).", "BUFFER_MAX"
    )
    lease_seconds: float = _setting(30.0, "Seconds of an account's spend one credit lease covers.", "LEASE_SECONDS")
    lease_timeout: float = _setting(
        30.0, "Seconds without heartbeat after which a process's leases are reclaimed.", "LEASE_TIMEOUT"
    )
    key_cache_size: int = _setting(200_000, "API keys kept in memory.", "KEY_CACHE_SIZE")
    key_cache_ttl: float = _setting(300.0, "Seconds a cached key is trusted before it is re-read.", "KEY_CACHE_TTL")
    negative_cache_ttl: float = _setting(5.0, "Seconds an unknown key is remembered as unknown.", "NEGATIVE_CACHE_TTL")
    drain_seconds: float = _setting(10.0, "Seconds in-flight calls get to finish on shutdown.", "DRAIN_SECONDS")
    # Retries (Idempotency-Key: accounting/idempotency.py)
    idempotency_ttl: int = _setting(
        86400,
        "Seconds the first answer to an Idempotency-Key is kept: a repeat of the same request within them gets "
        "that answer again, charged 0.",
        "IDEMPOTENCY_TTL",
    )
    idempotency_max_body_bytes: int = _setting(
        1024 * 1024,
        "Largest answer body kept for an Idempotency-Key. A larger answer is served and charged once; only its "
        "charge is kept, and a repeat gets 409 (nothing charged; send a new key to call again).",
        "IDEMPOTENCY_MAX_BODY_BYTES",
    )
    idempotency_max_account_bytes: int = _setting(
        256 * 1024 * 1024,
        "Answer bodies one account may have kept at once (within IDEMPOTENCY_TTL, counted per process); past it "
        "answers are kept without their body, as if too large.",
        "IDEMPOTENCY_MAX_ACCOUNT_BYTES",
    )
    # The shared answer cache (social/answer_cache.py, storage/answers.py, accounting/charged.py)
    cache_max_bytes: int = _setting(
        256 * 1024 * 1024,
        "Bytes of provider answers each process keeps in memory, the least recently used evicted first; 0 turns "
        "the cache off (identical calls in flight at once still make one provider call).",
        "CACHE_MAX_BYTES",
    )
    cache_ttl: Mapping = _setting(
        {},
        'JSON object: endpoint path as under /social/ (e.g. "user/info") to the seconds its answers stay fresh, '
        "over the defaults (docs/api.md); 0 turns caching off for it.",
        "CACHE_TTL",
    )
    cache_hit_price: float = _setting(
        0.0, "Fraction (0 to 1) of a call's price charged for an answer served from the cache.", "CACHE_HIT_PRICE"
    )
    cache_stale_if_error: int = _setting(
        3600,
        "Seconds past which a cached answer is no longer served (X-Cache: STALE, charged as a hit) while the "
        "provider fails; 0: never.",
        "CACHE_STALE_IF_ERROR",
    )
    cache_shared: bool = _setting(
        False,
        "Share answers between machines through MongoDB (a second tier behind each machine's workers), with one "
        "provider call per key at a time across them; the workers of one machine share through each key's owner "
        "worker without it.",
        "CACHE_SHARED",
    )
    # Scale-out
    qps_divisor: float = _setting(
        1.0,
        "Each process enforces a key's QPS divided by this: 1 behind nginx hashing on X-API-Key, N for N processes without it.",
        "QPS_DIVISOR",
    )
    coherence: str = _setting(
        "changestream",
        "How revocations, plan changes and top-ups made by other processes reach this one: changestream, poll or off.",
        "COHERENCE",
    )
    coherence_poll_seconds: float = _setting(
        1.0,
        "Polling interval when change streams are unavailable (COHERENCE=poll, or the fallback).",
        "COHERENCE_POLL_SECONDS",
    )
    # Payments
    payments_provider: str = _setting(
        "",
        "Crypto payment processor: nowpayments, or empty for the sandbox chain (development only; production answers 503 at checkout).",
        "PAYMENTS_PROVIDER",
    )
    payments_api_url: str = _setting(
        "https://api.nowpayments.io", "Base URL of the payment processor's API.", "PAYMENTS_API_URL"
    )
    payments_api_key: str = _setting("", "Payment processor API key (sent as x-api-key).", "PAYMENTS_API_KEY")
    payments_ipn_secret: str = _setting(
        "",
        "Key of the processor's signed notifications (x-nowpayments-sig). Empty: every notification is refused.",
        "PAYMENTS_IPN_SECRET",
    )
    public_url: str = _setting(
        "", "Public base URL of this service; the processor calls PUBLIC_URL/billing/crypto/ipn.", "PUBLIC_URL"
    )
    order_ttl_seconds: int = _setting(
        3600, "Seconds a checkout's quoted pay amount is valid (sandbox orders expire after it).", "ORDER_TTL_SECONDS"
    )
    reconcile_interval: float = _setting(
        30.0,
        "Seconds between polls of unsettled orders (first delay; doubles per order up to an hour).",
        "RECONCILE_INTERVAL",
    )
    # Alerts and webhooks
    alert_check_seconds: float = _setting(
        2.0,
        "Seconds between alert checks of the accounts with rules that spent in this process (off the request path).",
        "ALERT_CHECK_SECONDS",
    )
    webhook_retry_schedule: tuple = _setting(
        (5, 30, 120, 600, 1800, 3600, 10800),
        "JSON list of seconds between a webhook's attempts; the last one repeats until WEBHOOK_RETRY_FOR.",
        "WEBHOOK_RETRY_SCHEDULE",
    )
    webhook_retry_for: float = _setting(
        3 * 86400.0,
        "Seconds a webhook delivery is retried before it is given up (at least a day).",
        "WEBHOOK_RETRY_FOR",
    )
    webhook_timeout: float = _setting(
        10.0, "Seconds one webhook attempt may take (connect and answer).", "WEBHOOK_TIMEOUT"
    )
    webhook_disable_after: float = _setting(
        5 * 86400.0, "Seconds an endpoint may fail without one success before it is disabled.", "WEBHOOK_DISABLE_AFTER"
    )
    webhook_poll_seconds: float = _setting(
        5.0,
        "Seconds between looks at the outbox for work another process left (retries due, crashed claims).",
        "WEBHOOK_POLL_SECONDS",
    )
    webhook_concurrency: int = _setting(100, "Webhook attempts under way at once per process.", "WEBHOOK_CONCURRENCY")
    webhook_account_concurrency: int = _setting(
        10,
        "Of those, at most this many of one account's (a receiver that hangs holds only its account's share).",
        "WEBHOOK_ACCOUNT_CONCURRENCY",
    )
    webhook_allow_private: bool = _setting(
        False,
        "Production: allow webhook endpoints on loopback, private and link-local addresses (on-premise receivers).",
        "WEBHOOK_ALLOW_PRIVATE",
    )
    # Real-time: filter rules and account monitors (streams/)
    stream_max_rules: int = _setting(
        50, "Filter rules an account may have (deleted ones do not count).", "STREAM_MAX_RULES"
    )
    stream_max_monitors: int = _setting(100, "Account monitors an account may have.", "STREAM_MAX_MONITORS")
    stream_min_interval: float = _setting(
        10.0, "Shortest polling interval of a rule or monitor, in seconds.", "STREAM_MIN_INTERVAL"
    )
    stream_monitor_interval: float = _setting(
        60.0,
        "Polling interval of an account monitor added through the provider's API, in seconds.",
        "STREAM_MONITOR_INTERVAL",
    )
    stream_event_retention: float = _setting(
        86400.0,
        "Seconds delivered events are kept for a reconnecting socket to ask for (at least an hour).",
        "STREAM_EVENT_RETENTION",
    )
    stream_ping_seconds: float = _setting(20.0, "Seconds between pings on an idle WebSocket.", "STREAM_PING_SECONDS")
    stream_tick_seconds: float = _setting(
        0.1, "Seconds between the poll scheduler's and the event tail's looks at the database.", "STREAM_TICK_SECONDS"
    )
    stream_balance_check_seconds: float = _setting(
        10.0,
        "Seconds between checks that accounts can pay for the next hour of their rules' polls.",
        "STREAM_BALANCE_CHECK_SECONDS",
    )
    smtp_url: str = _setting(
        "",
        "smtp://user:pass@host:587 (STARTTLS when offered; ?starttls=require to insist), smtps://... (TLS); "
        "empty: alerts go to webhooks and the portal only.",
        "SMTP_URL",
    )
    smtp_from: str = _setting("alerts@localhost", "From address of alert emails.", "SMTP_FROM")
    # Operations
    trusted_proxies: tuple = _setting(
        (),
        "Comma-separated IPs/CIDRs of reverse proxies whose X-Forwarded-For / X-Real-IP are believed.",
        "TRUSTED_PROXIES",
    )
    metrics_token: str = _setting("", "If set, GET /metrics requires Authorization: Bearer <token>.", "METRICS_TOKEN")
    metrics_port: int = _setting(
        0, "If set, /metrics is served only on this port (0: on the main port).", "METRICS_PORT"
    )
    access_log: bool = _setting(True, "One JSON line per request on the gateway.access logger.", "ACCESS_LOG")
    log_level: str = _setting(
        "INFO", "Least severe log level written: DEBUG, INFO, WARNING, ERROR or CRITICAL.", "LOG_LEVEL"
    )
    log_format: str = _setting(
        "",
        "json (one JSON object per line: time, level, logger, message, request_id) or text. "
        "Empty: json in production, text in development.",
        "LOG_FORMAT",
    )
    event_loop: str = _setting(
        "uvloop", "uvloop, or asyncio: the event loop of serve (uvloop spends less CPU per call).", "EVENT_LOOP"
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
                return _provider_keys(raw)
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
        raise SettingsError(f"{f.metadata['env']}: cannot read {raw!r} as {kind}") from exc


def _provider_keys(raw: Any) -> tuple[tuple[str, float], ...]:
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
    if settings.production and not settings.upstream_url:
        # The sandbox upstream (and its default credential) must never serve production traffic.
        found.append("UPSTREAM_URL is required in production (the sandbox upstream is for development only)")
    if settings.production and not settings.upstream_api_keys and settings.upstream_api_key == SANDBOX_UPSTREAM_KEY:
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
    """Everything wrong with `settings`, each a line an operator can act on (empty: they are usable)."""
    found = []
    if settings.env not in ("development", "production"):
        found.append("GATEWAY_ENV must be development or production")
    if settings.log_level.upper() not in LOG_LEVELS:
        found.append("LOG_LEVEL must be DEBUG, INFO, WARNING, ERROR or CRITICAL")
    if settings.log_format not in ("", "json", "text"):
        found.append("LOG_FORMAT must be json or text")
    try:
        Prices(settings.price_rules)
    except (PriceError, KeyError, TypeError, ValueError) as exc:
        found.append(f"PRICE_RULES: {exc}")
    if settings.production and not (settings.jwt_secret and settings.secrets_key):
        found.append("JWT_SECRET and SECRETS_KEY are required in production")
    for secret, name in ((settings.jwt_secret, "JWT_SECRET"), (settings.secrets_key, "SECRETS_KEY")):
        if secret and len(secret) < 32:
            found.append(f"{name} must be at least 32 characters")
    if not 1 <= settings.port <= 65535 and settings.port != 0:
        found.append("GATEWAY_PORT must be a TCP port")
    if not 0 <= settings.embedded_db_nice <= 19:
        found.append("EMBEDDED_DB_NICE must be between 0 and 19")
    if settings.db_expiry_seconds < 0:
        found.append("DB_EXPIRY_SECONDS must be 0 (no passes) or a positive number of seconds")
    if not 0 <= settings.metrics_port <= 65535 or (settings.metrics_port and settings.metrics_port == settings.port):
        found.append("METRICS_PORT must be 0 or a TCP port other than GATEWAY_PORT")
    if not settings.upstream_path_prefix.startswith("/"):
        found.append("UPSTREAM_PATH_PREFIX must start with /")
    provider_keys = [settings.upstream_api_key, *(secret for secret, _ in settings.upstream_api_keys)]
    if any(not secret.isprintable() or not secret.isascii() for secret in provider_keys):
        found.append("UPSTREAM_API_KEY and UPSTREAM_API_KEYS: a key is printable ASCII (it is sent as a header)")
    plans = settings.plan_rules
    if not plans or any(not {"name", "min_paid_usd", "qps"} <= set(p) for p in plans):
        found.append("PLAN_RULES must be a non-empty list of {name, min_paid_usd, qps}")
    elif any(p["qps"] <= 0 or p.get("account_qps", 1) <= 0 for p in plans):
        found.append("PLAN_RULES: qps and account_qps must be positive")
    if settings.payments_provider not in ("", "nowpayments"):
        found.append("PAYMENTS_PROVIDER must be nowpayments or empty (the development sandbox chain)")
    if settings.payments_provider == "nowpayments" and not (
        settings.payments_api_key and settings.payments_ipn_secret and settings.public_url
    ):
        found.append("PAYMENTS_PROVIDER=nowpayments requires PAYMENTS_API_KEY, PAYMENTS_IPN_SECRET and PUBLIC_URL")
    if settings.max_header_bytes < 1024:
        found.append("MAX_HEADER_BYTES must be at least 1024")
    for name in (
        "login_max_failures_per_email",
        "login_max_attempts_per_address",
        "login_slowdown_after",
        "signup_max_per_network",
        "max_open_orders",
        "checkouts_per_minute",
        "max_connections_per_address",
        "idempotency_ttl",
        "idempotency_max_body_bytes",
        "idempotency_max_account_bytes",
    ):
        if getattr(settings, name) < 1:
            found.append(f"{by_env(name)} must be at least 1")
    if not (8 <= settings.client_network_v4_prefix <= 32 and 16 <= settings.client_network_v6_prefix <= 128):
        found.append("CLIENT_NETWORK_V4_PREFIX must be 8..32 and CLIENT_NETWORK_V6_PREFIX 16..128")
    if settings.signup_credited_per_network < 0 or settings.login_max_delay_seconds < 0:
        found.append("SIGNUP_CREDITED_PER_NETWORK and LOGIN_MAX_DELAY_SECONDS must not be negative")
    if settings.audit_retention_days < 1 or settings.password_reset_ttl_seconds < 60:
        found.append("AUDIT_RETENTION_DAYS must be at least 1 and PASSWORD_RESET_TTL_SECONDS at least 60")
    if settings.max_keys_per_account < 1:
        found.append("MAX_KEYS_PER_ACCOUNT must be at least 1")
    if (
        settings.breaker_min_accounts < 1
        or settings.account_failure_budget < 1
        or settings.upstream_max_connections < 1
    ):
        found.append("BREAKER_MIN_ACCOUNTS, ACCOUNT_FAILURE_BUDGET and UPSTREAM_MAX_CONNECTIONS must be at least 1")
    if settings.account_max_in_flight < 0:
        found.append("ACCOUNT_MAX_IN_FLIGHT must be 0 (follow the plan) or a positive number")
    if settings.coherence not in ("changestream", "poll", "off"):
        found.append("COHERENCE must be changestream, poll or off")
    if settings.event_loop not in ("asyncio", "uvloop"):
        found.append("EVENT_LOOP must be asyncio or uvloop")
    if settings.event_loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
        found.append("EVENT_LOOP=uvloop needs uvloop (pip install uvloop), or set EVENT_LOOP=asyncio")
    if not settings.webhook_retry_schedule or any(
        not isinstance(s, (int, float)) or isinstance(s, bool) or s <= 0 for s in settings.webhook_retry_schedule
    ):
        found.append("WEBHOOK_RETRY_SCHEDULE must be a non-empty JSON list of positive seconds")
    if not 1 <= settings.webhook_account_concurrency <= settings.webhook_concurrency:
        found.append("WEBHOOK_ACCOUNT_CONCURRENCY must be at least 1 and at most WEBHOOK_CONCURRENCY")
    if settings.smtp_url and not settings.smtp_url.startswith(("smtp://", "smtps://")):
        found.append("SMTP_URL must start with smtp:// or smtps://")
    if settings.qps_divisor < 1:
        found.append("QPS_DIVISOR must be at least 1")
    if settings.order_ttl_seconds < 1:
        found.append("ORDER_TTL_SECONDS must be at least 1")
    for name in (
        "flush_interval",
        "lease_seconds",
        "lease_timeout",
        "upstream_timeout",
        "upstream_connect_timeout",
        "reconcile_interval",
        "login_window_seconds",
        "http_idle_timeout",
        "http_body_timeout",
        "coherence_poll_seconds",
        "account_failure_window",
        "signup_window_seconds",
        "alert_check_seconds",
        "webhook_timeout",
        "webhook_poll_seconds",
        "webhook_retry_for",
        "webhook_disable_after",
        "stream_min_interval",
        "stream_monitor_interval",
        "stream_ping_seconds",
        "stream_tick_seconds",
        "stream_balance_check_seconds",
    ):
        if getattr(settings, name) <= 0:
            found.append(f"{by_env(name)} must be positive")
    if settings.cache_max_bytes < 0 or settings.cache_stale_if_error < 0:
        found.append("CACHE_MAX_BYTES and CACHE_STALE_IF_ERROR must not be negative")
    if not 0 <= settings.cache_hit_price <= 1:
        found.append("CACHE_HIT_PRICE must be between 0 and 1")
    if any(not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= 86400 for v in settings.cache_ttl.values()):
        found.append("CACHE_TTL must map endpoint paths to whole seconds from 0 to 86400")
    if settings.stream_event_retention < 3600:
        found.append("STREAM_EVENT_RETENTION must be at least 3600 (a reconnecting socket may ask for an hour)")
    if settings.stream_monitor_interval < settings.stream_min_interval:
        found.append("STREAM_MONITOR_INTERVAL must be at least STREAM_MIN_INTERVAL")
    return found


def by_env(name: str) -> str:
    return next(f.metadata["env"] for f in fields() if f.name == name)


def describe() -> str:
    """The settings table printed by --help."""
    rows = []
    for f in fields():
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if isinstance(default, tuple) and default and isinstance(default[0], dict):
            default = orjson.dumps(list(default)).decode()
        rows.append(f"  {f.metadata['env']:<26} {f.metadata['help']} (default: {default!r})")
    return (
        "settings (environment variables; CONFIG_FILE may name a TOML file with the same names in lower case):\n"
        + "\n".join(rows)
    )
