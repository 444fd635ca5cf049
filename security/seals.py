"""What the operations derive from SECRETS_KEY to tell a database's custody: the signature of a backup's manifest
(`backup` signs it, `restore` checks it: storage/backup.py) and the fingerprint of SECRETS_KEY a database keeps
(app/preflight.py compares it at start). Each is an HMAC under a key of its own derived from SECRETS_KEY, like the
keys of security/apikeys.py: neither tells anything about SECRETS_KEY or the other keys."""

import hashlib
import hmac


def _derived(secrets_key: str, purpose: bytes) -> bytes:
    return hmac.new(secrets_key.encode(), purpose, hashlib.sha256).digest()


def sign_manifest(secrets_key: str, body: bytes) -> str:
    """HMAC-SHA256 of a manifest's canonical bytes: whoever edits an archive (a balance and its credits_added
    together, the manifest's checksums recomputed) cannot sign it again without SECRETS_KEY."""
    return hmac.new(_derived(secrets_key, b"backup-manifest"), body, hashlib.sha256).hexdigest()


def manifest_signed_by(secrets_key: str, body: bytes, signature: str) -> bool:
    return hmac.compare_digest(sign_manifest(secrets_key, body), signature)


def fingerprint(secrets_key: str) -> str:
    """16 hex characters that tell two SECRETS_KEYs apart (a database keeps the one its secrets were sealed with)."""
    return hmac.new(_derived(secrets_key, b"secrets-fingerprint"), b"", hashlib.sha256).hexdigest()[:16]
