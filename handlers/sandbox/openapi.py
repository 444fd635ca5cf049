"""The OpenAPI operation and schema of the development catalog (handlers/sandbox/handlers.py)."""

from handlers.openapi_operations import Operation
from handlers.openapi_schema import S, array, obj, ref

SCHEMAS = {
    "Catalog": obj(
        ("users",),
        users=array(obj(("userName", "id"), userName=S, id=S)),
        tweets=array(S),
        lists=array(S),
        empty_lists=array(S),
        communities=array(S),
        spaces=array(S),
        big_accounts=array(S),
        live_users=array(S),
        articles=array(S),
    ),
}

OPERATIONS = [
    Operation(
        "get",
        "/sandbox/catalog",
        "Development only: valid ids of the sandbox upstream's world (404 in production)",
        "operations",
        ref("Catalog"),
        security=None,
        errors=(404, 502),
    ),
]
