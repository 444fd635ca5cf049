"""The one error vocabulary: ApiError (a status and a message safe for the client), its 422 form
ValidationError (the detail list), and the portal's error body, which the 431 answer shares.
"""

import tornado.web

REASONS = {
    400: "Bad request",
    401: "Not authenticated",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    409: "Conflict",
    413: "Request body too large",
    422: "Invalid input",
    500: "Internal server error",
    501: "Not implemented",
    502: "Bad gateway",
    503: "Service unavailable",
    504: "Gateway timeout",
}


class ApiError(tornado.web.HTTPError):
    """An error whose `message` is safe to show to the client."""

    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(status, reason=REASONS.get(status))
        self.message = message
        self.extra_headers = headers or {}


class ValidationError(ApiError):
    """Bad input: 422 with {"detail": [{"loc", "msg", "type"}, ...]}."""

    def __init__(self, errors: list[dict]):
        super().__init__(422, REASONS[422])
        self.errors = errors


def error(loc: list, msg: str, type_: str) -> dict:
    return {"loc": loc, "msg": msg, "type": type_}


def missing(loc: list) -> dict:
    return error(loc, "Field required", "missing")


def portal_error(message: str) -> dict:
    """The portal's error body; the data plane has its own (handlers/social.py)."""
    return {"detail": message}
