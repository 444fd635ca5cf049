"""The keys area's part of the OpenAPI document: its operations (each with its least role) and schemas, the
request bodies and query parameters being the very `Field` declarations handlers/keys/handlers.py validates with."""

from handlers.keys import handlers as keys
from handlers.openapi_operations import Operation
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
    path_param,
    query_param,
    ref,
    with_properties,
)
from security import roles
from social.endpoints import BY_PATH, GROUPS

KEY_ID = path_param("key_id", I, "The key's integer id")

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

OPERATIONS: list[Operation] = [
    Operation(
        "get",
        "/keys",
        "The account's keys, newest first, with QPS limit, revocation state, properties and credits_used "
        "(no secrets); "
        "a further page is announced in the X-Next-Cursor and Link headers",
        "keys",
        array(ref("Key")),
        params=(
            query_param(keys.PAGE),
            query_param(keys.CURSOR),
        ),
        errors=(401, 422),
        extra={
            "200": {
                "description": "Success: still a plain list; when more keys follow, the next page is announced",
                "headers": {
                    "X-Next-Cursor": {"schema": I, "description": "Pass as `cursor` for the next page"},
                    "Link": {"schema": S, "description": '</keys?limit=N&cursor=C>; rel="next"'},
                },
                "content": {"application/json": {"schema": array(ref("Key"))}},
            }
        },
        role=roles.VIEWER,
    ),
    Operation(
        "post",
        "/keys",
        "Issue a key; the secret is returned once (409 past MAX_KEYS_PER_ACCOUNT active keys)",
        "keys",
        ref("NewKey"),
        body="KeyCreate",
        body_required=False,
        errors=(401, 409, 413, 422),
        idempotent=True,
        role=roles.DEVELOPER,
        links={
            "RevealKey": ("get_keys_key_id_reveal", "key_id"),
            "RevokeKey": ("post_keys_key_id_revoke", "key_id"),
            "TopUpKey": ("post_keys_key_id_topup", "key_id"),
            "ChangeKey": ("patch_keys_key_id", "key_id"),
            "RollKey": ("post_keys_key_id_roll", "key_id"),
        },
    ),
    Operation(
        "patch",
        "/keys/{key_id}",
        "Change a key's name and properties (never its secret); null removes a restriction",
        "keys",
        ref("Key"),
        params=(KEY_ID,),
        body="KeyPatch",
        errors=(401, 404, 409, 413, 422),
        role=roles.DEVELOPER,
    ),
    Operation(
        "post",
        "/keys/{key_id}/roll",
        "Issue a new secret with the same properties and budget; the old key expires after grace_seconds",
        "keys",
        ref("RolledKey"),
        params=(KEY_ID,),
        body="Roll",
        errors=(401, 404, 409, 413, 422),
        idempotent=True,
        role=roles.DEVELOPER,
    ),
    Operation(
        "get",
        "/keys/{key_id}/reveal",
        "The full key string, to its owner; 410 once the key is revoked (its secret is never shown again)",
        "keys",
        ref("RevealedKey"),
        params=(KEY_ID,),
        errors=(401, 404, 410, 422),
        role=roles.DEVELOPER,
        links={"RevokeKey": ("post_keys_key_id_revoke", "key_id")},
    ),
    Operation(
        "post",
        "/keys/{key_id}/revoke",
        "Revoke the key permanently",
        "keys",
        ref("Key"),
        params=(KEY_ID,),
        errors=(401, 404, 422),
        role=roles.DEVELOPER,
        links={"RevealRevokedKey": ("get_keys_key_id_reveal", "key_id")},
    ),
    Operation(
        "post",
        "/keys/{key_id}/topup",
        "Add credits to the key's account (development only)",
        "keys",
        ref("TopUpResult"),
        params=(KEY_ID,),
        body="TopUp",
        errors=(401, 403, 404, 413, 422),
        idempotent=True,
        role=roles.BILLING,
    ),
]

SCHEMAS: dict = {
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
}
