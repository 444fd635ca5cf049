"""API-key secrets: generated with 192 random bits, looked up by keyed digest, kept AES-GCM encrypted for reveal.

A key is `sgw_` + 32 characters (192 random bits) + an 8-character tag (48 bits of HMAC over the
random part, keyed from SECRETS_KEY). The tag is checked in memory before any lookup, so a flood
of made-up keys never reaches the database: forging one that passes costs 2^48 tries.
The answers kept for Idempotency-Key repeats of portal writes are sealed with a key of their own (`seal`):
a new key's answer holds its secret.
"""

import base64
import hashlib
import hmac
import os
import secrets

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

PREFIX = "sgw_"
_BODY, _TAG = 32, 8  # characters of the random part and of its tag


class KeyVault:
    """Derives two independent keys from SECRETS_KEY: one to digest secrets, one to encrypt them."""

    def __init__(self, secrets_key: str):
        root = secrets_key.encode()
        self._digest_key = hmac.new(root, b"api-key-digest", hashlib.sha256).digest()
        self._aead = AESGCM(hmac.new(root, b"api-key-encryption", hashlib.sha256).digest())
        self._tag_key = hmac.new(root, b"api-key-tag", hashlib.sha256).digest()
        self._answers = AESGCM(hmac.new(root, b"kept-answers", hashlib.sha256).digest())

    def generate(self) -> str:
        body = secrets.token_urlsafe(24)
        return PREFIX + body + self._tag(body)

    def _tag(self, body: str) -> str:
        # hmac.digest: OpenSSL's one-shot HMAC, the same value as hmac.new(...).digest() at half the cost.
        return base64.urlsafe_b64encode(hmac.digest(self._tag_key, body.encode(), "sha256")[:6]).decode()

    def plausible(self, secret: str) -> bool:
        """False for a string this vault cannot have issued, decided without I/O (constant-time tag check)."""
        if not secret.startswith(PREFIX) or not secret.isascii():  # compare_digest takes ASCII only
            return False
        body = secret[len(PREFIX) :]
        return len(body) == _BODY + _TAG and hmac.compare_digest(self._tag(body[:_BODY]), body[_BODY:])

    @staticmethod
    def display_prefix(secret: str) -> str:
        return secret[: len(PREFIX) + 6]

    def digest(self, secret: str) -> str:
        return hmac.digest(self._digest_key, secret.encode(), "sha256").hex()

    def encrypt(self, secret: str, key_id: int) -> str:
        nonce = os.urandom(12)
        # key_id is bound as associated data so a ciphertext cannot be moved to another key row.
        sealed = self._aead.encrypt(nonce, secret.encode(), str(key_id).encode())
        return base64.b64encode(nonce + sealed).decode()

    def decrypt(self, sealed: str, key_id: int) -> str:
        raw = base64.b64decode(sealed)
        return self._aead.decrypt(raw[:12], raw[12:], str(key_id).encode()).decode()

    def seal(self, data: bytes, bound_to: str) -> bytes:
        """Encrypts an answer kept for a retry (a new key's answer holds its secret), bound to `bound_to`."""
        nonce = os.urandom(12)
        return nonce + self._answers.encrypt(nonce, data, bound_to.encode())

    def unseal(self, sealed: bytes, bound_to: str) -> bytes:
        return self._answers.decrypt(sealed[:12], sealed[12:], bound_to.encode())
