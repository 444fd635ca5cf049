"""API keys: list, create (secret shown once), reveal to the owner, revoke, development top-up."""

import re

from handlers.base import ApiError, BaseHandler, authenticated
from handlers.validation import Field, parse_int, validate_body
from security.apikeys import KeyVault

KEY_CREATE = [Field("name", str, required=False, min_length=1, max_length=100, description='Absent or null: "default"')]
CREDITS = Field("credits", int, minimum=1, maximum=10**12)  # also the bound of `social-gateway admin credit`
TOP_UP = [CREDITS]
PAGE = Field("limit", int, required=False, default=100, minimum=1, maximum=1000, description="Keys per page")
CURSOR = Field(
    "cursor",
    int,
    required=False,
    minimum=1,
    maximum=10**17,  # far past any key id the counter will reach
    description="X-Next-Cursor of the previous page: the keys after it",
)
_TOO_MANY = "This account already has {} active API keys (MAX_KEYS_PER_ACCOUNT); revoke one to create another"


class KeysBase(BaseHandler):
    async def owned_key(self, key_id: str) -> dict:
        """The caller's key; another account's key or a missing one is 404 (no existence oracle)."""
        account_id = self.current_user
        if re.fullmatch(r"[+-]?\d+", key_id) and not (len(key_id) <= 19 and 0 < int(key_id) < 10**18):
            raise ApiError(404, "Key not found")  # an integer no key can have is unknown, like any other
        key = await self.ctx.keys.get(account_id, parse_int(key_id, ["path", "key_id"], 1))
        if key is None:
            raise ApiError(404, "Key not found")
        return key

    async def qps_of(self, account_id: str) -> float:
        view = await self.ctx.meter.account_view(account_id)
        return view.plan.qps


def _row(key: dict, qps: float) -> dict:
    return {
        "key_id": key["key_id"],
        "name": key["name"],
        "prefix": key["prefix"],
        "qps_limit": qps,
        "revoked": key["revoked"],
        "created_at": key["created_at"],
        "last_used_at": key.get("last_used_at"),
    }


class KeysHandler(KeysBase):
    """Lists the account's keys (never secrets) and issues new ones."""

    @authenticated
    async def get(self) -> None:
        """Still a JSON list; a further page is announced in `X-Next-Cursor` and a `Link: rel="next"` header."""
        account_id = self.current_user
        limit, before = self.query_arg(PAGE), self.query_arg(CURSOR)
        qps = await self.qps_of(account_id)
        rows = await self.ctx.keys.list(account_id, limit + 1, before)
        if len(rows) > limit:
            rows = rows[:limit]
            after = rows[-1]["key_id"]
            self.set_header("X-Next-Cursor", str(after))
            self.set_header("Link", f'</keys?limit={limit}&cursor={after}>; rel="next"')
        self.send_json([_row(k, qps) for k in rows])

    @authenticated
    async def post(self) -> None:
        account_id = self.current_user
        body = validate_body(self.json_body() if self.request.body.strip() else {}, KEY_CREATE)
        most = self.ctx.settings.max_keys_per_account
        if await self.ctx.keys.count_active(account_id) >= most:
            raise ApiError(409, _TOO_MANY.format(most))
        vault = self.ctx.vault
        secret = vault.generate()
        key = await self.ctx.keys.create(
            account_id,
            body.get("name", "default"),
            vault.digest(secret),
            KeyVault.display_prefix(secret),
            lambda key_id: vault.encrypt(secret, key_id),
        )
        # Concurrent creations may all pass the count above: the ones with the highest ids give way.
        if await self.ctx.keys.count_active(account_id, up_to=key["key_id"]) > most:
            await self.ctx.keys.delete(key["key_id"])
            raise ApiError(409, _TOO_MANY.format(most))
        self.log_fields["key_id"] = key["key_id"]
        # 200, not 201: the spec says every success is HTTP 200.
        self.send_json({**_row(key, await self.qps_of(account_id)), "key": secret})


class RevealHandler(KeysBase):
    """Returns the full key string to its owner."""

    @authenticated
    async def get(self, key_id: str) -> None:
        key = await self.owned_key(key_id)
        self.send_json({"key_id": key["key_id"], "key": self.ctx.vault.decrypt(key["sealed"], key["key_id"])})


class RevokeHandler(KeysBase):
    """Revokes the key permanently; idempotent; effective before the answer is sent."""

    @authenticated
    async def post(self, key_id: str) -> None:
        key = await self.owned_key(key_id)
        row = await self.ctx.keys.revoke(key["account_id"], key["key_id"])
        self.ctx.meter.key_revoked(key["digest"])
        self.send_json(_row(row, await self.qps_of(key["account_id"])))


class TopUpHandler(KeysBase):
    """Adds credits to the key's account; development only."""

    @authenticated
    async def post(self, key_id: str) -> None:
        if self.ctx.settings.production:
            raise ApiError(403, "Direct top-ups are disabled in production; buy credits with a crypto payment")
        key = await self.owned_key(key_id)
        body = validate_body(self.json_body(), TOP_UP)
        view = await self.ctx.meter.add_credits(key["account_id"], body["credits"], topup_credits=body["credits"])
        self.send_json(
            {
                "account_id": key["account_id"],
                "credits_added": body["credits"],
                "credits": await self.ctx.meter.balance(key["account_id"]),
                "plan": view.plan.name,
                "qps_limit": view.plan.qps,
            }
        )


routes = [
    (r"/keys", KeysHandler),
    (r"/keys/([^/]+)/reveal", RevealHandler),
    (r"/keys/([^/]+)/revoke", RevokeHandler),
    (r"/keys/([^/]+)/topup", TopUpHandler),
]
