"""Members of an account, their roles and invitations (handlers/members/): who is a member with which sign-in,
role changes and removals under the owners guard (LastOwner: the last owner stays one; OwnersOnly: an admin's
change found an owner), invitations made within their limits, emailed, revoked and spent once, each worth what its
inviter may still grant. Who may do what is security/roles.py's; the queries are storage/members.py's."""

import asyncio
import hashlib
import hmac
import logging

from config.settings import Settings
from security import roles
from storage.accounts import AccountStore
from storage.limits import Limits
from storage.members import INVITATION_DAYS, LastOwner, MemberStore, OwnersOnly
from webhooks.outbox import Outbox

__all__ = [
    "INVITATION_DAYS",
    "INVITATIONS_PER_ACCOUNT",
    "INVITATIONS_PER_EMAIL",
    "AlreadyInvited",
    "LastOwner",
    "Members",
    "OwnersOnly",
    "TooManyInvitations",
]

# An invitation lives INVITATION_DAYS: at most this many made in any such window is at most this many pending.
INVITATIONS_PER_ACCOUNT = 100
# Invitation emails to one address per hour, whichever accounts invite it (as password resets: the inbox is
# someone else's), across processes.
INVITATIONS_PER_EMAIL, INVITATION_EMAIL_WINDOW = 3, 3600.0


class TooManyInvitations(Exception):
    """Past a limit on invitations; `wait`: whole seconds until one more is allowed."""

    def __init__(self, wait: int, reason: str):
        super().__init__(reason)
        self.wait, self.reason = wait, reason


class AlreadyInvited(Exception):
    """The address has a pending invitation to the account already."""


log = logging.getLogger("gateway.members")
_pending: set[asyncio.Task] = set()  # invitation emails under way (a task nobody holds may be collected mid-way)


class Members:
    def __init__(
        self, settings: Settings, members: MemberStore, accounts: AccountStore, outbox: Outbox, limits: Limits
    ):
        self.settings, self.members, self.accounts, self.outbox = settings, members, accounts, outbox
        self.limits = limits

    async def of_account(self, account_id: str) -> list[tuple[dict, dict | None]]:
        """The account's members, each with their person's sign-in (email, 2FA), if it still exists."""
        members = await self.members.of_account(account_id)
        sign_ins = await self.accounts.sign_ins([m["person_id"] for m in members])
        return [(m, sign_ins.get(m["person_id"])) for m in members]

    async def sign_in(self, member: dict) -> dict | None:
        return (await self.accounts.sign_ins([member["person_id"]])).get(member["person_id"])

    async def get(self, account_id: str, member_id: str) -> dict | None:
        return await self.members.get(account_id, member_id)

    async def role(self, account_id: str, person_id: str) -> dict | None:
        """The person's membership of the account, or None."""
        return await self.members.role(account_id, person_id)

    async def set_role(self, member: dict, role: str, by_owner: bool) -> dict | None:
        """The member with the new role; None when they were removed meanwhile. LastOwner for the last owner;
        OwnersOnly when they are an owner (perhaps since a moment ago) and the change is not an owner's. Their
        pending invitations of a role the new one cannot grant are revoked."""
        changed = await self.members.set_role(member, role, by_owner)
        if changed is not None:
            await self._revoke_beyond(member, changed["role"])
        return changed

    async def remove(self, member: dict, by_owner: bool) -> bool:
        """False when they were gone already. LastOwner for the last owner; OwnersOnly as for set_role. Their
        pending invitations are revoked."""
        removed = await self.members.remove(member, by_owner)
        await self._revoke_beyond(member, None)
        return removed

    async def _revoke_beyond(self, member: dict, role: str | None) -> None:
        """An invitation grants what its inviter may still grant: those of a member who is one no more, or whose
        role cannot make them now, go (and acceptance checks again, for a change racing it)."""
        beyond = [r for r in roles.ROLES if role is None or not roles.may_assign(role, r)]
        if beyond:
            await self.members.revoke_invited_by(member["account_id"], member["_id"], beyond)

    async def add(self, account_id: str, person_id: str, email: str, role: str, invited_by: dict | None) -> None:
        await self.members.add(account_id, person_id, email, role, invited_by=invited_by)

    # --- invitations ---------------------------------------------------------------------------------------------
    async def pending(self, account_id: str) -> list[dict]:
        """Invitations not used and not expired."""
        return await self.members.pending(account_id)

    async def invite(self, account_id: str, email: str, role: str, invited_by: dict | None) -> tuple[dict, str] | None:
        """A new invitation and its token (the link's); None when the email is a member's already. AlreadyInvited
        when the address has a pending one to this account; TooManyInvitations past INVITATIONS_PER_EMAIL to the
        address in the hour, or INVITATIONS_PER_ACCOUNT made by the account in INVITATION_DAYS."""
        if any(m["email"] == email for m in await self.members.of_account(account_id)):
            return None
        if await self.members.pending_for(account_id, email):
            raise AlreadyInvited(email)
        # The address's key: a keyed digest (addresses nobody registered are not stored), as the resets' limit
        digest = hmac.new(self.settings.jwt_secret.encode(), email.encode(), hashlib.sha256).hexdigest()[:32]
        if wait := await self.limits.take(f"invitation:{digest}", INVITATIONS_PER_EMAIL, INVITATION_EMAIL_WINDOW):
            raise TooManyInvitations(wait, f"This address was invited {INVITATIONS_PER_EMAIL} times in the last hour")
        days = INVITATION_DAYS * 86400.0
        if wait := await self.limits.take(f"invitations:{account_id}", INVITATIONS_PER_ACCOUNT, days):
            raise TooManyInvitations(
                wait, f"This account made {INVITATIONS_PER_ACCOUNT} invitations in the last {INVITATION_DAYS} days"
            )
        invited = await self.members.invite(account_id, email, role, invited_by)
        if invited is None:
            raise AlreadyInvited(email)  # another invitation of the address made at the same moment came first
        return invited

    async def revoke(self, account_id: str, invitation_id: str, actor: str) -> bool | None:
        """True when revoked; False when there is no such pending invitation; None when `actor`'s role may not
        revoke it (an admin and an owner's invitation)."""
        invitation = await self.members.pending_invitation(account_id, invitation_id)
        if invitation is None:
            return False
        if not roles.may_assign(actor, invitation["role"]):
            return None
        # Of that role only: its role is never changed, but a check and a delete are two steps.
        return await self.members.revoke(account_id, invitation_id, invitation["role"])

    async def find_invitation(self, token: str) -> dict | None:
        """The pending invitation of a link's token, or None (unknown, used, revoked or expired)."""
        return await self.members.find_invitation(token)

    async def inviter_may(self, invitation: dict) -> bool:
        """Whether the invitation's inviter is still a member whose role may grant its role; when not, it is
        revoked (their removal or demotion revokes it too: this is for one racing that)."""
        inviter_id = (invitation.get("invited_by") or {}).get("member_id")
        inviter = await self.members.get(invitation["account_id"], inviter_id) if inviter_id else None
        if inviter is not None and roles.may_assign(inviter["role"], invitation["role"]):
            return True
        await self.members.revoke(invitation["account_id"], invitation["_id"], invitation["role"])
        return False

    async def preview(self, token: str) -> dict | None:
        """What the holder of a link may know of its invitation before joining: who is invited with which role, to
        which account (its name, else its email) and by whom, and until when; None as find_invitation."""
        invitation = await self.members.find_invitation(token)
        if invitation is None:
            return None
        account = await self.accounts.get(invitation["account_id"]) or {}
        return {
            "email": invitation["email"],
            "role": invitation["role"],
            "account_name": account.get("name") or None,
            "account_email": account.get("email"),
            "invited_by": (invitation.get("invited_by") or {}).get("email"),
            "expires_at": invitation["expires_at"],
        }

    async def spend(self, invitation_id: str) -> dict | None:
        """Uses the invitation up; None when it was used at the same moment by another request."""
        return await self.members.spend(invitation_id)

    def send_invitation(self, invitation: dict, token: str, base: str, inviter: str | None) -> None:
        """The link, by the alert emails' SMTP sender, after the answer (a slow SMTP server delays nobody)."""
        mailer = self.outbox.mailer
        if mailer is None or not base:
            log.info("invitation %s made; no SMTP_URL or PUBLIC_URL, so no email sent", invitation["_id"])
            return
        text = (
            f"{inviter or 'A member'} invites you to their account on social-gateway, "
            f"as {invitation['role']}.\n\nAccept here (the link works once, for {INVITATION_DAYS} days):\n\n"
            f"{base}/#invitation={token}\n\nIf you did not expect it, ignore this email.\n"
        )

        async def send() -> None:
            try:
                await mailer.send(invitation["email"], "[social-gateway] You are invited to an account", text)
            except Exception as exc:  # after the answer: nobody to tell but the log (never the link)
                log.warning("invitation email not sent: %s", type(exc).__name__)

        task = asyncio.create_task(send())
        _pending.add(task)
        task.add_done_callback(_pending.discard)
