"""What `serve` checks before it starts anything that needs the database: one clear line, not a
traceback from inside the first worker. And where development keeps its generated secrets (DATA_DIR/secrets.json),
which `serve` and the operations commands read."""

from __future__ import annotations

import json
import logging
import os

import pymongo
from cryptography.exceptions import InvalidTag
from pymongo.database import Database
from pymongo.errors import PyMongoError
from pymongo.uri_parser import parse_uri

from config.settings import Settings
from security import seals
from security.apikeys import KeyVault
from storage import markers, schema, snapshot

log = logging.getLogger("gateway.preflight")
SECRETS_FILE = "secrets.json"  # under DATA_DIR: JWT_SECRET and SECRETS_KEY generated once in development

DATABASE_TIMEOUT = 10.0  # seconds the database gets to answer a ping at start-up


def database_problem(uri: str, timeout: float = DATABASE_TIMEOUT) -> str | None:
    """Why the MongoDB at `uri` cannot serve (unreachable, a bad URI, refused credentials), or None."""
    try:
        hosts = ", ".join(f"{host}:{port}" for host, port in parse_uri(uri, connect_timeout=timeout)["nodelist"])
    except PyMongoError as exc:  # never echoes the URI: it may hold a password
        return f"MONGODB_URI is not a usable MongoDB URI: {type(exc).__name__}"
    except ValueError:
        return "MONGODB_URI is not a usable MongoDB URI"
    client = pymongo.MongoClient(
        uri, serverSelectionTimeoutMS=int(timeout * 1000), connectTimeoutMS=int(timeout * 1000)
    )
    try:
        client.admin.command("ping")
    except PyMongoError as exc:
        reason = str(exc).split(", Timeout:")[0].split(" (configured timeouts")[0][:200]
        return f"cannot reach MongoDB at {hosts} within {timeout:g} s (MONGODB_URI): {reason}"
    finally:
        client.close()
    return None


def stored_secrets(data_dir: str) -> dict:
    """The development secrets generated into DATA_DIR/secrets.json ({} when there are none)."""
    try:
        with open(os.path.join(data_dir, SECRETS_FILE)) as fh:
            return json.load(fh)
    except FileNotFoundError:
        return {}


def start_problem(settings: Settings, label: str) -> str | None:
    """What `serve` checks on its database before any process uses it: the one line that refuses it, or None.
    In order: a database of a newer schema than this gateway's is refused; one `migrate` copied away is refused
    unless ALLOW_MIGRATED_DB; one whose secrets were sealed with another SECRETS_KEY is refused (its keys would
    answer 401, reveals fail); then its schema is brought up to this gateway's version (storage/schema.py, logged
    step by step). A restored database whose outbound is held is said in a WARNING line (storage/markers.py).
    `label`: which database, as the start message names it."""
    client = snapshot.connect(settings.mongodb_uri)
    db = client[settings.mongodb_db]
    try:
        schema.refuse_newer(db)
        problem = _migrated_problem(db, settings, label) or _secrets_problem(db, settings.secrets_key)
        if problem:
            return problem
        schema.bring_forward(db)
        hold = markers.outbound_hold_now(db)
    except schema.SchemaTooNew as exc:
        return str(exc)
    except PyMongoError as exc:  # the database went away between the ping and here
        return f"could not check the database before serving: {type(exc).__name__}"
    finally:
        client.close()
    if hold is not None:
        log.warning(
            "outbound held since %s (%s): no webhook, email or stream poll leaves until "
            "`social-gateway release-outbound` (docs/operations.md, Restores)",
            hold["since"].isoformat(timespec="seconds"),
            hold["reason"],
        )
    return None


def _migrated_problem(db: Database, settings: Settings, label: str) -> str | None:
    moved = markers.migrated(db)
    if moved is None:
        return None
    said = (
        f"the database {db.name} of {label} was migrated to {moved['to']} (database {moved['database']}) at "
        f"{moved['at'].isoformat(timespec='seconds')}: what it holds is stale from then on"
    )
    if not settings.allow_migrated_db:
        return f"{said}; serve with MONGODB_URI set to the target, or set ALLOW_MIGRATED_DB=true to serve it anyway"
    log.warning("%s; serving it anyway (ALLOW_MIGRATED_DB)", said)
    return None


def _secrets_problem(db: Database, secrets_key: str) -> str | None:
    """The fingerprint of SECRETS_KEY against the one the database keeps (the first start keeps it). A database from
    before fingerprints is asked directly: one of its sealed API-key secrets must open with this SECRETS_KEY."""
    mine = seals.fingerprint(secrets_key)
    kept = markers.secrets_fingerprint(db)
    if kept is None:
        sealed = db.keys.find_one({"sealed": {"$exists": True}}, {"sealed": 1, "key_id": 1})
        try:
            if sealed is not None:
                KeyVault(secrets_key).decrypt(sealed["sealed"], sealed["key_id"])
        except (InvalidTag, ValueError):
            kept = "(none kept; its API keys do not open with this one)"
        else:
            kept = markers.keep_fingerprint(db, mine)
    if kept == mine:
        return None
    return (
        f"SECRETS_KEY is not the one the database {db.name} was written with (its fingerprint {kept}, this one "
        f"{mine}): its API keys would answer 401 and their secrets and webhook secrets would not open; start with "
        "that SECRETS_KEY (in development, DATA_DIR/secrets.json of the gateway that wrote it)"
    )
