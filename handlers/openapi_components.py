"""The document's component schemas: request bodies from the handlers' `Field` declarations, answers by hand."""

from handlers import admin_accounts, billing, keys
from handlers.openapi_schema import (
    TIME,
    B,
    I,
    N,
    S,
    array,
    body_schema,
    field_schema,
    nullable,
    obj,
    ref,
    with_properties,
)
from social.endpoints import BY_PATH, GROUPS

# A repeat answered with the first answer to its Idempotency-Key: a record of its own, 0 credits.
REPLAY_OF = nullable({"type": "string", "description": "The first call's request_id, for a replay (Idempotency-Key)"})
KEY_PROPERTIES = {
    "expires_at": nullable(
        {
            "type": "string",
            "format": "date-time",
            "description": "ISO 8601, in the future; from then on the key gets 401 'This API key has expired'",
        }
    ),
    "allowed_endpoints": nullable(
        {
            "type": "array",
            "minItems": 1,
            "maxItems": keys.MAX_ENDPOINTS,
            "items": {"enum": sorted(BY_PATH) + list(GROUPS)},
            "description": "Data paths as written after /social (they cover the /twitter aliases too) or groups: "
            + "; ".join(f"{name} = {', '.join(sorted(paths))}" for name, paths in GROUPS.items())
            + ". Other endpoints get 403 'This API key may not call this endpoint'",
        }
    ),
    "allowed_ips": nullable(
        {
            "type": "array",
            "minItems": 1,
            "maxItems": keys.MAX_IPS,
            "items": {"type": "string", "maxLength": keys.MAX_IP_TEXT},
            "description": "IPv4/IPv6 addresses or CIDR networks (stored normalised); calls from elsewhere get "
            "403 'This API key is not allowed from this address'. The address honours TRUSTED_PROXIES",
        }
    ),
    "credit_limit": nullable(
        {
            "type": "integer",
            "minimum": 1,
            "maximum": keys.MAX_CREDIT_LIMIT,
            "description": "Credits the key may spend per credit_limit_period (needs it); then 402",
        }
    ),
    "credit_limit_period": nullable({"enum": list(keys.PERIODS), "description": "UTC day, UTC month, or ever"}),
}

SCHEMAS: dict = {
    # --- errors --------------------------------------------------------------------------------------
    "PortalError": obj(("detail",), detail=S),
    "DataError": obj(("status", "msg"), status={"const": "error"}, msg=S),
    "ValidationError": obj(
        ("detail",),
        detail=array(obj(("loc", "msg", "type"), loc=array({"type": ["string", "integer"]}), msg=S, type=S)),
    ),
    "CookieSession": obj(("account_id", "expires_in"), account_id=S, expires_in=I),
    # The declared fields, with the properties' richer schemas (lists, groups, formats) and null that
    # removes a restriction; PATCH cannot null the name.
    "KeyCreate": with_properties(body_schema(keys.KEY_CREATE), **KEY_PROPERTIES),
    "KeyPatch": with_properties(body_schema(keys.KEY_PATCH), name=field_schema(keys.NAME), **KEY_PROPERTIES),
    "Key": obj(
        (
            "key_id",
            "name",
            "prefix",
            "qps_limit",
            "revoked",
            "created_at",
            *KEY_PROPERTIES,
            "credits_used",
        ),
        key_id=I,
        name=S,
        prefix=S,
        qps_limit=N,
        revoked=B,
        created_at=TIME,
        last_used_at=nullable(TIME),
        **KEY_PROPERTIES,
        rolled_to=nullable(
            {"type": "integer", "description": "The key this one was rolled to: its expires_at ends the grace"}
        ),
        credits_used={
            "type": "integer",
            "description": "Credits the key's budget (the key and keys rolled from it) spent in its "
            "credit_limit_period so far; the current UTC month for a key without a budget",
        },
        created_by=nullable(
            obj(("member_id", "email"), member_id=S, email=nullable(S))
            | {"description": "The member who made the key (none for keys from before members)"}
        ),
    ),
    "NewKey": {
        "allOf": [
            ref("Key"),
            obj(
                ("key",),
                key={
                    "type": "string",
                    "description": "The secret; GET /keys/{key_id}/reveal shows it again while the key is not revoked",
                },
            ),
        ]
    },
    "Roll": obj(
        ("grace_seconds",),
        True,
        grace_seconds={
            "type": "integer",
            "minimum": 0,
            "maximum": keys.MAX_GRACE,
            "description": "How long the old key keeps working (0: it stops at once; at most 7 days)",
        },
    ),
    "RolledKey": {
        "allOf": [
            ref("NewKey"),
            obj(("rolled_from",), rolled_from={"type": "integer", "description": "The key_id of the old key"}),
        ]
    },
    "RevealedKey": obj(("key_id", "key"), key_id=I, key=S),
    "TopUp": body_schema(keys.TOP_UP),
    "TopUpResult": obj(
        ("account_id", "credits_added", "credits", "plan", "qps_limit"),
        account_id=S,
        credits_added=I,
        credits=I,
        plan=S,
        qps_limit=N,
    ),
    "Account": obj(
        ("account_id", "credits", "plan", "qps_limit", "account_qps_limit", "max_keys"),
        account_id=S,
        email=S,
        credits=I,
        plan=S,
        qps_limit=N,
        account_qps_limit={"type": "number", "description": "Calls per second of all the account's keys together"},
        max_keys={"type": "integer", "description": "Active keys the account may hold"},
        total_paid_usd=N,
        credits_per_usd=I,
        created_at=TIME,
    ),
    "UsageRecord": obj(
        ("endpoint", "timestamp", "credits", "status"),
        endpoint=S,
        timestamp=TIME,
        credits=I,
        status=I,
        key_id=I,
        request_id=S,
        replay_of=REPLAY_OF,
        cache=nullable(
            {
                "type": "string",
                "enum": ["hit", "miss", "coalesced", "stale"],
                "description": "How the answer cache answered the data call (X-Cache); null: not a data call's answer",
            }
        ),
        credits_saved={"type": "integer", "description": "Credits a cached answer (hit, stale) was not charged"},
    ),
    "UsageSummaryRow": obj(
        ("calls", "credits", "errors"),
        day={"type": "string", "format": "date", "description": "UTC day (when grouped by day)"},
        endpoint={"type": "string", "description": "Data route, e.g. /social/user/info (when grouped by endpoint)"},
        key_id={"type": "integer", "description": "When grouped by key"},
        calls=I,
        credits=I,
        errors={"type": "integer", "description": "Calls answered with a status other than 2xx"},
        p50_ms=nullable({"type": "number", "description": "group_by=endpoint alone: median provider answer time"}),
        p95_ms=nullable({"type": "number", "description": "group_by=endpoint alone: 95th percentile, ms"}),
        samples={"type": "integer", "description": "group_by=endpoint alone: forwarded calls timed"},
    ),
    "UsageLogPage": obj(
        ("records", "has_next_page", "next_cursor"),
        records=array(
            {
                "allOf": [
                    ref("UsageRecord"),
                    obj((), upstream_ms=nullable({"type": "number", "description": "Provider answer ms; null: none"})),
                ]
            }
        ),
        has_next_page=B,
        next_cursor={"type": "string", "description": "Pass as cursor for the next page; empty on the last"},
    ),
    "UsageExportRow": obj(
        ("timestamp", "key_id", "endpoint", "status", "credits", "request_id", "replay_of"),
        timestamp=TIME,
        key_id=I,
        endpoint=S,
        status=I,
        credits=I,
        request_id=S,
        replay_of=REPLAY_OF,
    ),
    # --- billing -------------------------------------------------------------------------------------
    "Currency": obj(("code", "min_usd"), code=S, name=S, network=S, min_usd=N),
    "BillingConfig": obj(("currencies",), currencies=array(ref("Currency")), credits_per_usd=I),
    "Checkout": body_schema(billing.CHECKOUT),
    "Amount": obj(("amount", "usd"), amount=N, usd=N),
    "Order": obj(
        ("order_id", "status", "credits_applied"),
        order_id=S,
        status=S,
        pay_address=S,
        pay_currency=S,
        pay_amount=N,
        payment_uri={"type": "string", "description": "network:address?amount=coins, what a wallet scans"},
        price_usd=N,
        credits_expected=I,
        created_at=TIME,
        expires_at=TIME,
        updated_at=TIME,
        amount_received=ref("Amount"),
        amount_confirmed=ref("Amount"),
        credits_applied=I,
    ),
    "SandboxPay": body_schema(billing.SANDBOX_PAY),
    "SandboxConfirm": body_schema(billing.SANDBOX_CONFIRM),
    # --- admin ---------------------------------------------------------------------------------------
    "StatusClasses": obj((), **{name: I for name in ("2xx", "3xx", "4xx", "5xx")}),
    "EndpointTotal": obj(("endpoint", "calls", "credits"), endpoint=S, calls=I, credits=I),
    "MetricsDay": obj(
        ("date", "calls"),
        date={"type": "string", "format": "date"},
        signups=I,
        active_accounts=I,
        calls=I,
        calls_by_status=ref("StatusClasses"),
        credits_spent=I,
        revenue_usd=N,
    ),
    "AdminMetrics": obj(
        ("window", "totals", "series", "top_endpoints", "upstream"),
        window=obj(
            (),
            days=I,
            include_internal=B,
            **{"from": {"type": "string", "format": "date"}, "to": {"type": "string", "format": "date"}},
        ),
        totals=obj(
            (),
            signups=I,
            active_accounts=I,
            calls=I,
            calls_by_status=ref("StatusClasses"),
            credits_spent=I,
            revenue_usd=N,
        ),
        series=array(ref("MetricsDay")),
        top_endpoints=obj((), by_calls=array(ref("EndpointTotal")), by_credits=array(ref("EndpointTotal"))),
        upstream=obj(
            (),
            calls=I,
            errors=I,
            error_rate=N,
            latency_ms=obj((), p50=nullable(N), p90=nullable(N), p99=nullable(N), samples=I, scope=S),
        ),
        rolled_up_until=nullable(TIME),
        generated_at=TIME,
    ),
    "AdminUser": obj(
        ("account_id", "email", "created_at"),
        account_id=S,
        email=S,
        created_at=TIME,
        keys=obj((), active=I, revoked=I),
        calls=I,
        credits_spent=I,
        total_paid_usd=N,
        balance=I,
        first_touch_source=nullable(S),
        last_activity=nullable(TIME),
        is_admin=B,
        internal=B,
        suspended=B,
    ),
    "AdminUsersPage": obj(
        ("users", "has_next_page", "next_cursor"),
        users=array(ref("AdminUser")),
        has_next_page=B,
        next_cursor=S,
        internal_hidden={
            "type": "integer",
            "description": "Admin and internal accounts left out (include_internal=false): what an empty page hides",
        },
    ),
    "AdminAccount": obj(
        ("account_id", "email", "credits", "plan", "suspended"),
        account_id=S,
        email=S,
        created_at=TIME,
        credits={"type": "integer", "description": "The balance, leases included"},
        plan=S,
        total_paid_usd=N,
        is_admin=B,
        internal=B,
        suspended={"type": "boolean", "description": "Its keys answer 403 on every process"},
        suspended_reason=nullable(S),
        credited={"type": "integer", "description": "After a credit: the credits added"},
        debited={"type": "integer", "description": "After a debit: the credits taken"},
    ),
    "AdminAccountDetail": {
        "allOf": [
            ref("AdminAccount"),
            obj(
                ("keys", "orders", "recent_calls", "audit", "members"),
                keys=array(ref("Key")),
                orders=array(ref("Order")),
                recent_calls=array(ref("UsageRecord")),
                audit=array({"type": "object", "description": "Audit-log entries, newest first"}),
                members=array(ref("Member")),
            ),
        ]
    },
    "AdminAdjust": body_schema(admin_accounts.ADJUST),
    "AdminSuspend": body_schema(admin_accounts.SUSPEND),
    "AdminResume": body_schema(admin_accounts.RESUME),
    # --- operations ----------------------------------------------------------------------------------
    "Health": obj(("status",), status={"const": "ok"}),
    "Ready": obj(
        ("status", "checks"),
        status={"enum": ["ready", "not ready"]},
        checks=obj((), database=S, upstream_breaker=S, draining=B, usage_buffer=obj((), depth=I, max=I)),
    ),
    # --- data ----------------------------------------------------------------------------------------
    "User": obj(
        ("type", "id", "userName"),
        type={"const": "user"},
        userName=S,
        url=S,
        id=S,
        name=S,
        isBlueVerified=B,
        description=S,
        location=nullable(S),
        followers=I,
        following=I,
        statusesCount=nullable(I),
        createdAt=S,
        profilePicture=S,
        coverPicture=nullable(S),
        canDm=B,
        pinnedTweetIds=array(S),
        profile_bio=nullable({"type": "object"}),
        # The provider's current documentation, beyond the spec's table (issue 27).
        verifiedType=nullable(S),
        favouritesCount=I,
        hasCustomTimelines=B,
        isTranslator=B,
        mediaCount=I,
        withheldInCountries=array(S),
        affiliatesHighlightedLabel={"type": "object"},
        possiblySensitive=B,
        isAutomated=B,
        automatedBy=nullable(S),
        unavailable=B,
        message=S,
        unavailableReason=S,
    ),
    "Tweet": obj(
        ("type", "id"),
        type={"const": "tweet"},
        id=S,
        url=S,
        text=S,
        retweetCount=I,
        replyCount=I,
        likeCount=I,
        quoteCount=I,
        bookmarkCount=I,
        viewCount={
            "anyOf": [S, I, {"type": "null"}],
            "description": "A string in the spec (the sandbox's); the provider's current documentation shows an "
            "integer, and the provider's answer is passed through as it is",
        },
        createdAt={"type": "string", "description": "Www Mmm dd HH:MM:SS +0000 yyyy"},
        lang=S,
        isReply=B,
        inReplyToId=nullable(S),
        conversationId=nullable(S),
        displayTextRange=nullable({"type": "array", "items": I, "minItems": 2, "maxItems": 2}),
        entities=nullable({"type": "object"}),
        quoted_tweet=nullable(ref("Tweet")),
        author=ref("User"),
        source=S,
        inReplyToUserId=nullable(S),
        inReplyToUsername=nullable(S),
        retweeted_tweet=nullable(ref("Tweet")),
        isLimitedReply=B,
    ),
    "Article": obj(
        ("title",),
        author=ref("User"),
        replyCount=I,
        likeCount=I,
        quoteCount=I,
        viewCount={"type": "integer", "description": "An integer here, as the provider documents it"},
        createdAt=S,
        title=S,
        preview_text=S,
        cover_media_img_url=S,
        contents=array(obj(("text",), text=S)),
    ),
    "FollowRelationship": obj(
        ("following", "followed_by"),
        following={"type": "boolean", "description": "The source user follows the target user"},
        followed_by={"type": "boolean", "description": "The target user follows the source user"},
    ),
    "Trend": obj(("name",), name=S, url=S, query=S, tweet_volume=nullable(I)),
}
