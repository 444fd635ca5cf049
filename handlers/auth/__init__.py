"""Signing in: register, login, logout, the password, me, switch and attribution (`handlers.py`), two-factor
sign-in (`twofactor.py`), the password reset (`reset.py`), and their part of the OpenAPI document (`openapi.py`);
what they do with the stores is services/auth.py's."""

from handlers.auth import handlers, reset, twofactor

routes = handlers.routes + twofactor.routes + reset.routes
