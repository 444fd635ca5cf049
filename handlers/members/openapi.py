"""The OpenAPI operations and schemas of members, their roles and invitations (handlers/members/handlers.py), and of a
person's accounts (/auth/switch)."""

from handlers.auth import handlers as auth
from handlers.members import handlers as members
from handlers.openapi_operations import Operation
from handlers.openapi_schema import TIME, B, S, array, body_schema, nullable, obj, path_param, ref, with_properties
from security import roles

_ROLE = {"enum": list(roles.ROLES)}
_BY = nullable(obj(("member_id", "email"), member_id=S, email=nullable(S)))
_MEMBER_ID = path_param("member_id", {"type": "string", "pattern": "^[0-9a-f]{24}$"}, "The member's id")
_INVITATION_ID = path_param("invitation_id", {"type": "string", "pattern": "^inv_[0-9a-f]{16}$"}, "The invitation's id")

SCHEMAS = {
    "Member": obj(
        ("member_id", "email", "role", "two_factor", "joined_at", "last_seen_at"),
        member_id=S,
        email=S,
        role=_ROLE,
        two_factor={"type": "boolean", "description": "The person signs in with a second factor"},
        joined_at=TIME,
        last_seen_at=nullable(TIME),
    ),
    "Invite": with_properties(body_schema(members.INVITE), role=_ROLE),
    "RoleChange": with_properties(body_schema(members.ROLE_CHANGE), role=_ROLE),
    "NewInvitation": obj(
        ("invitation_id", "email", "role", "expires_at"),
        invitation_id=S,
        email=S,
        role=_ROLE,
        expires_at=TIME,
        token={"type": "string", "description": "Development only (no PRODUCTION): the link's token"},
    ),
    "Invitation": obj(
        ("invitation_id", "email", "role", "expires_at", "invited_by", "created_at"),
        invitation_id=S,
        email=S,
        role=_ROLE,
        expires_at=TIME,
        invited_by=_BY,
        created_at=TIME,
    ),
    "AcceptInvitation": body_schema(members.ACCEPT),
    "PreviewInvitation": body_schema(members.PREVIEW),
    "InvitationPreview": obj(
        ("email", "role", "account_name", "account_email", "invited_by", "expires_at"),
        email={"type": "string", "description": "Who is invited"},
        role=_ROLE,
        account_name=nullable({"type": "string", "description": "The account's name, if an owner gave it one"}),
        account_email=nullable({"type": "string", "description": "The email the account was registered with"}),
        invited_by=nullable({"type": "string", "description": "The email of the member who invited"}),
        expires_at=TIME,
    ),
    "Switch": body_schema(auth.SWITCH),
    "MemberAccount": obj(
        ("account_id", "role", "name", "email"),
        account_id=S,
        role=_ROLE,
        name=nullable({"type": "string", "description": "The account's name (PATCH /account); null: none"}),
        email=nullable({"type": "string", "description": "The email the account was registered with"}),
    ),
    "Removed": obj(("ok",), ok=B),
}

OPERATIONS = [
    Operation(
        "post",
        "/auth/switch",
        "A session token for another of your accounts (404 for one that is not yours)",
        "auth",
        ref("Session"),
        body="Switch",
        errors=(401, 404, 413, 422),
        role=roles.VIEWER,
    ),
    Operation(
        "post",
        "/auth/invitations/accept",
        "Accept an invitation (once, within 7 days, while its inviter may still grant its role): a new person's "
        "password makes their sign-in; a person who has one gives theirs or sends their session (403 for a session "
        "of another address); returns a session token for the account",
        "auth",
        ref("Session"),
        security=None,
        body="AcceptInvitation",
        errors=(401, 403, 404, 409, 413, 422, 429),
    ),
    Operation(
        "post",
        "/auth/invitations/preview",
        "An invitation as its link shows it before joining: the invited email, the role, the account and who "
        "invited; public (the token is the credential), nothing else of the account",
        "auth",
        ref("InvitationPreview"),
        security=None,
        body="PreviewInvitation",
        errors=(403, 404, 413, 422),
    ),
    Operation(
        "post",
        "/portal/invitations/accept",
        "The portal's variant of /auth/invitations/accept: the session goes to the HttpOnly cookie (needs the XSRF "
        "token)",
        "portal",
        ref("CookieSession"),
        security=None,
        body="AcceptInvitation",
        errors=(401, 403, 404, 409, 413, 422, 429),
    ),
    Operation(
        "post",
        "/portal/switch",
        "The portal's variant of /auth/switch: the cookie's session acts for another of your accounts (needs the "
        "XSRF token)",
        "portal",
        ref("CookieSession"),
        security=None,
        body="Switch",
        errors=(401, 403, 404, 413, 422),
    ),
    Operation("get", "/members", "The account's members", "members", array(ref("Member")), role=roles.VIEWER),
    Operation(
        "patch",
        "/members/{member_id}",
        "Change a member's role; only an owner makes an owner or changes one; the last owner stays one (409)",
        "members",
        ref("Member"),
        params=(_MEMBER_ID,),
        body="RoleChange",
        errors=(401, 403, 404, 409, 413, 422),
        role=roles.ADMIN,
    ),
    Operation(
        "delete",
        "/members/{member_id}",
        "Remove a member (their sessions for this account stop at once), or leave (your own member id); "
        "the last owner cannot (409)",
        "members",
        ref("Removed"),
        params=(_MEMBER_ID,),
        errors=(401, 403, 404, 409),
        role=roles.ADMIN,
        or_self="member_id",
    ),
    Operation(
        "get",
        "/members/invitations",
        "Pending invitations (not used, not expired)",
        "members",
        array(ref("Invitation")),
        role=roles.ADMIN,
    ),
    Operation(
        "post",
        "/members/invitations",
        "Invite someone by email, with a role (only an owner invites an owner); the link is emailed and works "
        "once, for 7 days, for that address only. One pending invitation per address (409); at most 3 to one "
        "address in an hour, and 100 by one account in 7 days (429)",
        "members",
        ref("NewInvitation"),
        body="Invite",
        errors=(401, 403, 409, 413, 422, 429),
        role=roles.ADMIN,
    ),
    Operation(
        "delete",
        "/members/invitations/{invitation_id}",
        "Revoke a pending invitation (only an owner revokes one to become an owner)",
        "members",
        ref("Removed"),
        params=(_INVITATION_ID,),
        errors=(401, 403, 404),
        role=roles.ADMIN,
    ),
]
