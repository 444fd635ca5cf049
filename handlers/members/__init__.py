"""Members, their roles and invitations, and accepting one (`handlers.py`), with their part of the OpenAPI document
(`openapi.py`); what they do with the stores is services/members.py's."""

from handlers.members.handlers import member_view, routes

__all__ = ["member_view", "routes"]  # member_view: the admin console shows an account's members alike
