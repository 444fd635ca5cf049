"""API-key secrets: generated with 192 random bits, looked up by keyed digest, kept AES-GCM encrypted for reveal."""
import base64
import hashlib
import hmac
import os
import secrets

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

PREFIX = "sgw_"


class KeyVault:
    """Derives two independent keys from SECRETS_KEY: one to digest secrets, one to encrypt them."""

    def __init__(self, secrets_key: str):
        root = secrets_key.encode()
        self._digest_key = hmac.new(root, b"api-key-digest", hashlib.sha256).digest()
        self._aead = AESGCM(hmac.new(root, b"api-key-encryption", hashlib.sha256).digest())

    @staticmethod
    def generate() -> str:
        return PREFIX + secrets.token_urlsafe(24)

    @staticmethod
    def display_prefix(secret: str) -> str:
        return secret[: len(PREFIX) + 6]

    def digest(self, secret: str) -> str:
        return hmac.new(self._digest_key, secret.encode(), hashlib.sha256).hexdigest()

    def encrypt(self, secret: str, key_id: int) -> str:
        nonce = os.urandom(12)
        # key_id is bound as associated data so a ciphertext cannot be moved to another key row.
        sealed = self._aead.encrypt(nonce, secret.encode(), str(key_id).encode())
        return base64.b64encode(nonce + sealed).decode()

    def decrypt(self, sealed: str, key_id: int) -> str:
        raw = base64.b64decode(sealed)
        return self._aead.decrypt(raw[:12], raw[12:], str(key_id).encode()).decode()
