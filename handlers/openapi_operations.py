"""`Operation`, the one declaration of a portal path (validation's fields, the least role, the document), and the
operations of the web portal's page and cookie variants; each area declares its own in handlers/<area>/openapi.py.

A new route needs its Operation here, or in its area's part (handlers/<area>/openapi.py, assembled by
handlers/openapi.py): tests/operations/test_ops.py compares the document with the application's route table in both
directions.
"""

from dataclasses import dataclass, field

from handlers.openapi_schema import B, obj, ref


@dataclass(frozen=True)
class Operation:
    method: str  # get | post
    path: str  # OpenAPI template: /keys/{key_id}/reveal
    summary: str
    tag: str
    response: dict  # schema of the success body
    status: int = 200
    security: str | None = "bearer"  # bearer | metrics | None (public)
    params: tuple = ()
    body: str | None = None  # a components schema name
    body_required: bool = True
    errors: tuple = (401,)
    media: str = "application/json"
    also: tuple = ()  # further media types of the success body: the same schema, or (media type, its schema)
    headers: dict = field(default_factory=dict)  # headers of the success answer
    extra: dict = field(default_factory=dict)  # further responses: status -> response object
    idempotent: bool = (
        False  # takes an Idempotency-Key (the handler's method is @idempotent: tests/data/test_idempotency.py)
    )
    # The least role of a member that may call it (security/roles.py): every bearer operation names one. The
    # server enforces it for the route (BaseHandler.prepare), the document shows it, and tests/auth/test_members.py
    # walks every operation against every role from here.
    role: str | None = None
    or_self: str | None = None  # a path parameter: any member may call it on their own member id (leaving)
    # OpenAPI links: how this answer's ids feed the next call (stateful fuzzing follows them):
    # name -> (the next operation's operationId, the answer's field that is its parameter)
    links: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.security == "bearer") != (self.role is not None):
            raise ValueError(f"{self.method} {self.path}: a bearer operation, and only one, names its least role")


OPERATIONS: list[Operation] = [
    # the web portal (cookie sessions; portal/pages.py)
    Operation(
        "get",
        "/",
        "The web portal for account holders",
        "portal",
        {"type": "string"},
        security=None,
        errors=(),
        media="text/html",
    ),
    Operation(
        "post",
        "/portal/register",
        "Create an account; the session goes to an HttpOnly cookie (needs the page's XSRF token)",
        "portal",
        ref("CookieSession"),
        security=None,
        body="Credentials",
        errors=(403, 409, 413, 422, 429),
    ),
    Operation(
        "post",
        "/portal/login",
        "Log in; the session goes to an HttpOnly cookie (needs the page's XSRF token), or a 2FA challenge",
        "portal",
        {"oneOf": [ref("CookieSession"), ref("TwoFactorChallenge")]},
        security=None,
        body="Login",
        errors=(401, 403, 413, 422, 429),
    ),
    Operation(
        "post",
        "/portal/password",
        "Change the password; earlier sessions end and the new one goes to the cookie (needs the XSRF token)",
        "portal",
        ref("CookieSession"),
        security=None,  # the portal's cookie, which is no bearer scheme; 401 without it
        body="PasswordChange",
        errors=(401, 403, 413, 422, 429),
    ),
    Operation(
        "post",
        "/portal/logout",
        "Clear the session cookie (needs the page's XSRF token)",
        "portal",
        obj(("ok",), ok=B),
        security=None,
        errors=(403,),
    ),
]
