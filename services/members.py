"""Members of an account, their roles and invitations (handlers/members/): who is a member with which sign-in,
role changes and removals under the owners guard (LastOwner: the last owner stays one), invitations made, emailed,
revoked and spent once. Who may do what is security/roles.py's; the queries are storage/members.py's."""

import asyncio
import logging

from config.settings import Settings
from storage.accounts import AccountStore
from storage.members import INVITATION_DAYS, LastOwner, MemberStore
from webhooks.outbox import Outbox

__all__ = ["INVITATION_DAYS", "LastOwner", "Members"]

log = logging.getLogger("gateway.members")
_pending: set[asyncio.Task] = set()  # invitation emails under way (a task nobody holds may be collected mid-way)


class Members:
    def __init__(self, settings: Settings, members: MemberStore, accounts: AccountStore, outbox: Outbox):
        self.settings, self.members, self.accounts, self.outbox = settings, members, accounts, outbox

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

    async def set_role(self, member: dict, role: str) -> dict | None:
        """The member with the new role; None when they were removed meanwhile. LastOwner for the last owner."""
        return await self.members.set_role(member, role)

    async def remove(self, member: dict) -> bool:
        """False when they were gone already. LastOwner for the last owner."""
        return await self.members.remove(member)

    async def add(self, account_id: str, person_id: str, email: str, role: str, invited_by: dict | None) -> None:
        await self.members.add(account_id, person_id, email, role, invited_by=invited_by)

    # --- invitations ---------------------------------------------------------------------------------------------
    async def pending(self, account_id: str) -> list[dict]:
        """Invitations not used and not expired."""
        return await self.members.pending(account_id)

    async def invite(self, account_id: str, email: str, role: str, invited_by: dict | None) -> tuple[dict, str] | None:
        """A new invitation and its token (the link's); None when the email is a member's already."""
        if any(m["email"] == email for m in await self.members.of_account(account_id)):
            return None
        return await self.members.invite(account_id, email, role, invited_by)

    async def revoke(self, account_id: str, invitation_id: str) -> bool:
        return await self.members.revoke(account_id, invitation_id)

    async def find_invitation(self, token: str) -> dict | None:
        """The pending invitation of a link's token, or None (unknown, used, revoked or expired)."""
        return await self.members.find_invitation(token)

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
