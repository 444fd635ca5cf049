"""Members of an account and their invitations (services/members.py; roles: security/roles.py).

Who may call what is each route's least role (handlers/members/openapi.py, checked by BaseHandler.prepare);
what the role check of a route cannot see is checked here: only an owner makes, changes or removes an owner, or
revokes an invitation to become one, and the last owner stays one (409), also against a change racing it (the
store's conditional updates decide, not what this request read first). An invitation is accepted only by the
person it was sent to, and only while its inviter may still grant its role. A removed or demoted member's
sessions lose the old rights at once, on every process: the session check reads the membership on every request
(services/sessions.py).
"""

from handlers.auth import handlers as auth
from handlers.auth.handlers import AuthHandler, verified_password
from handlers.base import BaseHandler, authenticated
from handlers.errors import ApiError, ValidationError, error
from handlers.validation import Field, validate_body
from security import passwords, roles
from services.auth import DuplicateEmail
from services.members import AlreadyInvited, LastOwner, OwnersOnly, TooManyInvitations


def _a_role(value: str, loc: list) -> None:
    if value not in roles.ROLES:
        raise ValidationError([error(loc, f"Input should be one of {', '.join(roles.ROLES)}", "enum")])


ROLE = Field("role", str, max_length=16, check=_a_role, description="owner, admin, developer, billing or viewer")
INVITE = [Field("email", str, format="email", max_length=254, description="Who is invited"), ROLE]
ROLE_CHANGE = [ROLE]
ACCEPT = [
    Field("token", str, min_length=1, max_length=256, description="The invitation's token (from its link)"),
    Field(
        "password",
        str,
        required=False,
        min_length=8,
        max_length=128,
        check=auth._varied,
        description="A new person: the password of their sign-in; a person with a sign-in: theirs. Not needed "
        "with a session of the invited person",
    ),
]
MEMBER_ID, INVITATION_ID = r"([0-9a-f]{24})", r"(inv_[0-9a-f]{16})"
_LAST_OWNER = "The account's last owner cannot be removed or demoted: make another member an owner first"
_OWNERS_ONLY = "Only an owner can make an owner, or change or remove one"
_ELSEWHERE = "This invitation was sent to another email address: sign in as that person to accept it"
_GONE = "This invitation is unknown, already used, revoked or expired: ask for a new one"


def member_view(doc: dict, sign_in: dict | None) -> dict:
    return {
        "member_id": doc["_id"],
        "email": doc["email"],
        "role": doc["role"],
        "two_factor": bool(((sign_in or {}).get("totp") or {}).get("enabled")),
        "joined_at": doc["joined_at"],
        "last_seen_at": doc.get("last_seen_at"),
    }


def invitation_view(doc: dict) -> dict:
    return {
        "invitation_id": doc["_id"],
        "email": doc["email"],
        "role": doc["role"],
        "expires_at": doc["expires_at"],
        "invited_by": doc.get("invited_by"),
        "created_at": doc["created_at"],
    }


class MembersHandler(BaseHandler):
    @authenticated
    async def get(self) -> None:
        members = await self.services.members.of_account(self.current_user)
        self.send_json([member_view(m, sign_in) for m, sign_in in members])


class MemberHandler(BaseHandler):
    async def target(self, member_id: str) -> dict:
        member = await self.services.members.get(self.current_user, member_id)
        if member is None:
            raise ApiError(404, "Not found")
        return member

    @authenticated
    async def patch(self, member_id: str) -> None:
        role = validate_body(self.json_body(), ROLE_CHANGE)["role"]
        member = await self.target(member_id)
        if not roles.may_assign(self.session.role, role, member["role"]):
            raise ApiError(403, _OWNERS_ONLY)
        try:
            changed = await self.services.members.set_role(member, role, self.session.role == roles.OWNER)
        except LastOwner:
            raise ApiError(409, _LAST_OWNER) from None
        except OwnersOnly:  # made an owner since this request read them
            raise ApiError(403, _OWNERS_ONLY) from None
        if changed is None:
            raise ApiError(404, "Not found")
        details = {"member_id": member_id, "email": member["email"], "from": member["role"], "to": role}
        await self.audit("member.role_changed", details=details)
        self.send_json(member_view(changed, await self.services.members.sign_in(member)))

    @authenticated
    async def delete(self, member_id: str) -> None:
        member = await self.target(member_id)
        leaving = member_id == self.session.member_id
        if not leaving and not roles.may_assign(self.session.role, member["role"], member["role"]):
            raise ApiError(403, _OWNERS_ONLY)
        try:  # anyone may leave, an owner too while another stays
            removed = await self.services.members.remove(member, leaving or self.session.role == roles.OWNER)
        except LastOwner:
            raise ApiError(409, _LAST_OWNER) from None
        except OwnersOnly:
            raise ApiError(403, _OWNERS_ONLY) from None
        if removed:
            details = {"member_id": member_id, "email": member["email"], "role": member["role"]}
            await self.audit("member.left" if leaving else "member.removed", details=details)
        self.send_json({"ok": True})


class InvitationsHandler(BaseHandler):
    @authenticated
    async def get(self) -> None:
        self.send_json([invitation_view(i) for i in await self.services.members.pending(self.current_user)])

    @authenticated
    async def post(self) -> None:
        body = validate_body(self.json_body(), INVITE)
        email, role = body["email"].strip().lower(), body["role"]
        if not roles.may_assign(self.session.role, role):
            raise ApiError(403, _OWNERS_ONLY)
        try:
            invited = await self.services.members.invite(self.current_user, email, role, self.member())
        except AlreadyInvited:
            raise ApiError(
                409, "This address has a pending invitation to the account: revoke it to invite again"
            ) from None
        except TooManyInvitations as refused:
            raise ApiError(429, f"{refused.reason}; retry later", {"Retry-After": str(refused.wait)}) from None
        if invited is None:
            raise ApiError(409, "This person is already a member of the account")
        invitation, token = invited
        await self.audit("member.invited", details={"invitation_id": invitation["_id"], "email": email, "role": role})
        self.send_email(invitation, token)
        answer = {k: invitation_view(invitation)[k] for k in ("invitation_id", "email", "role", "expires_at")}
        if not self.config.production:
            answer["token"] = token  # development: no inbox needed to try it
        self.send_json(answer)

    def send_email(self, invitation: dict, token: str) -> None:
        """The link, emailed after the answer; without PUBLIC_URL, development links point at the host the request
        named, and production sends none."""
        s = self.config
        base = s.public_url.rstrip("/") or ("" if s.production else f"{self.request.protocol}://{self.request.host}")
        self.services.members.send_invitation(invitation, token, base, (self.member() or {}).get("email"))


class InvitationHandler(BaseHandler):
    @authenticated
    async def delete(self, invitation_id: str) -> None:
        revoked = await self.services.members.revoke(self.current_user, invitation_id, self.session.role)
        if revoked is None:
            raise ApiError(403, _OWNERS_ONLY)
        if not revoked:
            raise ApiError(404, "Not found")
        await self.audit("member.invitation_revoked", details={"invitation_id": invitation_id})
        self.send_json({"ok": True})


PREVIEW = [ACCEPT[0]]


class PreviewHandler(BaseHandler):
    """An invitation as its link's holder sees it before joining (public: the token is the credential). A POST, so
    that the token stays out of URLs and access logs, as the link keeps it in the fragment."""

    async def post(self) -> None:
        token = validate_body(self.json_body(), PREVIEW)["token"]
        preview = await self.services.members.preview(token)
        if preview is None:
            raise ApiError(404, _GONE)
        self.send_json(preview)


class AcceptHandler(AuthHandler):
    """Joins the invitation's account: as a new person (a password makes their sign-in), as a person who has one
    (their password, or their session: theirs only if they are the invited address), and answers a session for
    that account. Works once."""

    async def post(self) -> None:
        body = validate_body(self.json_body(), ACCEPT)
        self.throttle()  # per address: hashing is expensive, as at registration
        invitation = await self.services.members.find_invitation(body["token"])
        if invitation is None:
            raise ApiError(404, _GONE)
        person = await self.person(invitation, body.get("password"))
        account_id = invitation["account_id"]
        if await self.services.members.role(account_id, person["_id"]) is not None:
            raise ApiError(409, "You are already a member of this account")
        if not await self.services.members.inviter_may(invitation):
            raise ApiError(404, _GONE)  # its inviter was removed, or may no longer grant its role
        if await self.services.members.spend(invitation["_id"]) is None:
            raise ApiError(404, _GONE)  # used at the same moment by another request
        await self.services.members.add(
            account_id, person["_id"], person["email"], invitation["role"], invitation.get("invited_by")
        )
        await self.home_account(person["_id"], account_id)
        await self.audit("member.joined", details={"role": invitation["role"], "invitation_id": invitation["_id"]})
        self.issue_session(person["_id"], person.get("session_version", 0), account_id)

    async def person(self, invitation: dict, password: str | None) -> dict:
        """Who accepts: the signed-in person, else the invited email's sign-in (its password), else a new one."""
        if self.session is not None:
            person = await self.current_person()
            if person["email"] != invitation["email"]:  # the link alone is not the invited person
                raise ApiError(403, _ELSEWHERE)
            return person
        if password is None:
            raise ApiError(401, "Sign in, or give a password", {"WWW-Authenticate": "Bearer"})
        email = invitation["email"]
        existing = await self.services.auth.by_email(email)
        if existing is not None:
            await verified_password(self, email, password)
            return existing
        digest = await self.hash(passwords.hash_password, password, self.config.password_scrypt_n)
        try:
            return await self.services.auth.create_person(email, digest)
        except DuplicateEmail:
            raise ApiError(409, "A sign-in with this email was made meanwhile; accept again") from None


routes = [
    (r"/members", MembersHandler),
    (r"/members/invitations", InvitationsHandler),
    (rf"/members/invitations/{INVITATION_ID}", InvitationHandler),
    (rf"/members/{MEMBER_ID}", MemberHandler),
    (r"/auth/invitations/accept", AcceptHandler),
    (r"/auth/invitations/preview", PreviewHandler),
    (r"/portal/invitations/accept", AcceptHandler, {"cookie": True}),  # the web portal's: the session in its cookie
    (r"/portal/switch", auth.SwitchHandler, {"cookie": True}),
]
