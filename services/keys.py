"""API keys' rules over the key store and the meter: a key issued with a sealed secret, changes and revocations
known to this process's caches at once and in force on every process before the answer (`Meter.in_force`), a
budget's run opened before any key carries it, and the key rows with what each key's budget spent."""

from datetime import UTC, datetime, timedelta

from accounting.meter import Meter
from security.apikeys import KeyVault
from storage.keys import BUDGET_FIELDS, PROPERTIES, KeyStore

__all__ = ["BUDGET_FIELDS", "PROPERTIES", "KeyService", "Refused", "row"]

_TOO_MANY = "This account already has {} active API keys (MAX_KEYS_PER_ACCOUNT); revoke one to create another"
_ROLL_AT_CAP = (
    "This account already has {} active API keys (MAX_KEYS_PER_ACCOUNT): during a grace the old and the new key"
    " both count; roll with grace_seconds 0 or revoke a key first"
)


class Refused(Exception):
    """What the key's state or the account's key cap does not allow, in words for the caller (a 409)."""


def row(key: dict, qps: float, credits_used: int, seen: datetime | None = None) -> dict:
    """A key as the API shows it (never its secret). `seen`: this process's newest use of the key, which may be
    newer than the stored last_used_at (stored as the minute of the newest use, at most once a minute:
    accounting/keys.py)."""
    stored = key.get("last_used_at")
    return {
        "key_id": key["key_id"],
        "name": key["name"],
        "prefix": key["prefix"],
        "qps_limit": qps,
        "revoked": key["revoked"],
        "created_at": key["created_at"],
        "last_used_at": max(stored, seen) if stored and seen else stored or seen,
        **{name: key.get(name) for name in PROPERTIES},
        "rolled_to": key.get("rolled_to"),  # set: this key's expires_at is the end of its roll's grace
        "credits_used": credits_used,
        # The member who made it (or rolled it): keys belong to the account and outlive their maker's membership.
        "created_by": key.get("created_by"),
    }


class KeyService:
    """`most`: MAX_KEYS_PER_ACCOUNT, the active keys an account may hold; created keys and rolls count against it,
    across processes: created first, then the newest past the cap give way."""

    def __init__(self, store: KeyStore, meter: Meter, vault: KeyVault, most: int):
        self.store, self.meter, self.vault, self.most = store, meter, vault, most

    def one_at_a_time(self, name: tuple):
        """One holder of `name` at a time in this process (creates of an account; changes of its keys)."""
        return self.store.one_at_a_time(name)

    async def get(self, account_id: str, key_id: int) -> dict | None:
        return await self.store.get(account_id, key_id)

    async def qps(self, account_id: str) -> float:
        return (await self.meter.account_view(account_id)).plan.qps

    async def rows(
        self, account_id: str, only: int | None = None, limit: int = 0, before: int | None = None
    ) -> list[dict]:
        """The account's key rows, newest first (or the one key `only`; or `limit` of them with ids below
        `before`) with credits_used in each key's period."""
        keys = await self.store.list(account_id, limit, before)
        used = await self.meter.reads.credits_used(account_id, keys)
        qps = await self.qps(account_id)
        seen = self.meter.last_used.at
        return [row(k, qps, used[k["key_id"]], seen(k["key_id"])) for k in keys if only is None or k["key_id"] == only]

    async def _issue(self, account_id: str, name: str, properties: dict, created_by: dict | None) -> tuple[str, dict]:
        """A new key with a fresh secret; the secret is returned, never stored in clear."""
        vault = self.vault
        properties = {**properties, "created_by": created_by}
        secret = vault.generate()
        key = await self.store.create(
            account_id,
            name,
            vault.digest(secret),
            KeyVault.display_prefix(secret),
            lambda key_id: vault.encrypt(secret, key_id),
            properties,
        )
        return secret, key

    async def create(self, account_id: str, name: str, properties: dict, created_by: dict | None) -> tuple[str, dict]:
        """A new key under the account's key cap (Refused past it); the secret is returned once."""
        most = self.most
        async with self.store.one_at_a_time(("create", account_id)):
            if await self.store.count_active(account_id) >= most:
                raise Refused(_TOO_MANY.format(most))
            secret, key = await self._issue(account_id, name, properties, created_by)
            # Other processes may create at the same moment: the highest ids past the cap give way.
            if await self.store.count_active(account_id, up_to=key["key_id"]) > most:
                await self.store.delete(key["key_id"])
                raise Refused(_TOO_MANY.format(most))
        return secret, key

    async def roll(self, old: dict, grace: int, created_by: dict | None) -> tuple[str, dict]:
        """A new secret with the old key's properties and budget; the old key ends after `grace` seconds. The
        caller holds the account's ("key changes") turn, so that the new key copies the budget as the last change
        left it; the old key's end is in force here, and everywhere once the caller's `in_force` returns."""
        now = datetime.now(UTC)
        if old["revoked"]:
            raise Refused("A revoked key cannot be rolled")
        if old.get("expires_at") is not None and old["expires_at"] <= now:
            raise Refused("An expired key cannot be rolled")
        if old.get("rolled_to") is not None:
            raise Refused(f"This key was rolled already; roll key {old['rolled_to']} instead")
        async with self.store.one_at_a_time(("create", old["account_id"])):
            return await self._roll(old, now, grace, await self.meter.others(), created_by)

    async def _roll(
        self, old: dict, now: datetime, grace: int, others: list[str], created_by: dict | None
    ) -> tuple[str, dict]:
        """The new key, counted against the key cap with the old one while its grace lasts."""
        account_id, most = old["account_id"], self.most
        if grace and await self.store.count_active(account_id) >= most:
            raise Refused(_ROLL_AT_CAP.format(most))
        ends = now + timedelta(seconds=grace)
        if old.get("expires_at") is not None and old["expires_at"] < ends:
            ends = old["expires_at"]
        if not grace:
            await self._ends(old, {"expires_at": ends}, others)  # before the new key exists: never both at once
        properties = {name: old.get(name) for name in PROPERTIES}
        # The new key spends from the same budget: rolling does not grant a fresh one.
        properties["budget_id"] = old.get("budget_id", old["key_id"])
        properties["budget_epoch"] = old.get("budget_epoch")
        secret, new = await self._issue(account_id, old["name"], properties, created_by)
        # rolled_to: a rolled key is never revived (PATCH) nor rolled again.
        ended = await self._ends(old, {"expires_at": ends, "rolled_to": new["key_id"]}, others)
        if await self.store.count_active(account_id, up_to=new["key_id"]) > most:
            # Another process created or rolled at the same moment: the highest ids past the cap give way.
            await self.store.delete(new["key_id"])
            await self._ends(old, {"expires_at": old.get("expires_at"), "rolled_to": None}, others)
            raise Refused(_ROLL_AT_CAP.format(most))
        # A PATCH through another process may have changed the budget between the read and the insert: the
        # new key takes the budget as it is now (a later PATCH finds it among the budget's keys).
        current = {name: ended.get(name) for name in BUDGET_FIELDS} if ended else {}
        if current and any(properties.get(name) != value for name, value in current.items()):
            await self.update(account_id, new["key_id"], current, [])  # known nowhere else yet
        return secret, new

    async def _ends(self, old: dict, changes: dict, others: list[str]) -> dict | None:
        """Changes the old key's end (and roll mark), in force here before the answer; the key as it is now."""
        return await self.update(old["account_id"], old["key_id"], changes, others)

    async def others(self) -> list[str]:
        """The other live processes, whose caches a change must reach."""
        return await self.meter.others()

    async def open_budget_run(
        self, account_id: str, budget_id: int, limit: int, period: str, epoch: int, others: list[str]
    ) -> None:
        """A budget's new run, its document counting what the keys spent (calls in flight included)."""
        await self.meter.key_budgets.open_run(account_id, budget_id, limit, period, epoch, others)

    async def change_budget(self, account_id: str, budget_id: int, budget: dict, others: list[str]) -> list[int]:
        """A change to a budget is a change for all its keys, in one statement: the ids of the keys changed."""
        changed = []
        for member in await self.store.update_budget(account_id, budget_id, budget, others):
            self.meter.key_changed(member)
            changed.append(member["key_id"])
        return changed

    async def update(self, account_id: str, key_id: int, changes: dict, others: list[str]) -> dict | None:
        """The key changed, in force here at once; the key as it is now (None: not found)."""
        doc = await self.store.update(account_id, key_id, changes, others)
        if doc is not None:
            self.meter.key_changed(doc)
        return doc

    async def in_force(self, key_ids: list[int]) -> None:
        """Applied by every process before the answer (bounded: Meter.in_force)."""
        await self.meter.in_force(key_ids)

    async def revoke(self, key: dict) -> None:
        """Revoked for good, here at once and in every other process before this returns (bounded)."""
        await self.store.revoke(key["account_id"], key["key_id"], await self.meter.others())
        self.meter.key_revoked(key["digest"])
        await self.meter.in_force([key["key_id"]])

    def secret(self, key: dict) -> str:
        return self.vault.decrypt(key["sealed"], key["key_id"])

    async def top_up(self, account_id: str, credits: int):
        """Development credits added to the account; its view (plan) after."""
        return await self.meter.add_credits(account_id, credits, topup_credits=credits)

    async def balance(self, account_id: str) -> int:
        return await self.meter.balance(account_id)
