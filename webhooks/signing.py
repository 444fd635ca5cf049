"""Standard Webhooks signatures (standardwebhooks.com, the `standardwebhooks` package): secrets `whsec_<base64>`,
headers `webhook-id`, `webhook-timestamp`, `webhook-signature` (`v1,<base64 HMAC-SHA256 of id.timestamp.body>`,
one per valid secret, space-separated: during a roll both the new and the previous secret sign)."""

import base64
import secrets
from datetime import datetime

from standardwebhooks import Webhook

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 24


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def signed_headers(secrets_: list[str], msg_id: str, moment: datetime, body: bytes) -> dict[str, str]:
    text = body.decode()
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(moment.timestamp())),
        "webhook-signature": " ".join(Webhook(secret).sign(msg_id, moment, text) for secret in secrets_),
    }
