"""The OpenAPI operations and schemas of the audit log (handlers/audit.py). Two-factor sign-in's and the password
reset's are the sign-in area's (handlers/auth/openapi.py)."""

from handlers import audit
from handlers.openapi_operations import Operation
from handlers.openapi_schema import (
    TIME,
    S,
    array,
    nullable,
    obj,
    query,
    query_param,
    ref,
)
from security import roles
from storage.audit import ACTIONS, ACTOR_KINDS

_ENTRY = obj(
    ("id", "at", "action", "account_id", "actor", "address", "details"),
    id={"type": "string", "description": "Time-ordered; also the page cursor"},
    at=TIME,
    action={"enum": list(ACTIONS)},
    account_id=nullable(S),
    actor=obj(
        ("kind", "id"),
        kind={"enum": list(ACTOR_KINDS)},
        id=nullable(S),
        member_id={"type": "string", "description": "For an account: the member who acted for it"},
        email={"type": "string", "description": "Who: the member who acted for an account, or the admin"},
    ),
    address=nullable({"type": "string", "description": "The client's IP address (none for the system)"}),
    details={"type": "object", "description": "What changed: ids, names, amounts; never a secret"},
)
SECURITY_SCHEMAS = {
    "AuditEntry": _ENTRY,
    "AuditPage": obj(
        ("entries", "next_cursor", "retention_days"),
        entries=array(ref("AuditEntry")),
        next_cursor=nullable(S),
        retention_days={"type": "integer", "description": "AUDIT_RETENTION_DAYS: entries older are gone"},
    ),
}

_LIST = tuple(query_param(f) for f in audit.LIST_QUERY)
_EXPORT = (
    *(query_param(f) for f in (audit.ACTION, audit.SINCE, audit.UNTIL, audit.MEMBER)),
    query("format", {"enum": list(audit.EXPORT_TYPES), "default": "csv"}, audit.EXPORT_FORMAT.description),
)
_ADMIN = (
    query_param(audit.ACCOUNT),
    query("actor", {"enum": list(ACTOR_KINDS)}, audit.ACTOR.description),
)
_EXPORT_MEDIA = {
    "media": "text/csv",
    "also": ("application/json",),
    "headers": {"Content-Disposition": {"schema": S, "description": 'attachment; filename="audit-<date>.<format>"'}},
}

SECURITY_OPERATIONS = [
    Operation(
        "get",
        "/audit",
        "The account's audit log, newest first: who did what, when, from where",
        "audit",
        ref("AuditPage"),
        params=_LIST,
        errors=(401, 422),
        role=roles.VIEWER,
    ),
    Operation(
        "get",
        "/audit/export",
        "The account's audit log, every entry matching the filters, as CSV (with a header line) or a JSON array",
        "audit",
        array(ref("AuditEntry")),
        params=_EXPORT,
        errors=(401, 422),
        **_EXPORT_MEDIA,
        role=roles.VIEWER,
    ),
    Operation(
        "get",
        "/admin/audit",
        "Every account's audit log (admins), with account and actor filters",
        "admin",
        ref("AuditPage"),
        params=(*_LIST, *_ADMIN),
        errors=(401, 403, 422),
        role=roles.VIEWER,
    ),
    Operation(
        "get",
        "/admin/audit/export",
        "Every account's audit log (admins) as CSV or a JSON array",
        "admin",
        array(ref("AuditEntry")),
        params=(*_EXPORT, *_ADMIN),
        errors=(401, 403, 422),
        **_EXPORT_MEDIA,
        role=roles.VIEWER,
    ),
]
