"""What `serve` checks before it starts anything that needs the database: one clear line, not a
traceback from inside the first worker."""

from __future__ import annotations

import pymongo
from pymongo.errors import PyMongoError
from pymongo.uri_parser import parse_uri

from storage import schema, snapshot

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


def schema_problem(uri: str, db_name: str) -> str | None:
    """Brings the database's schema up to this gateway's version (storage/schema.py, logged step by step); the
    one line that refuses a database newer than this gateway, or None."""
    client = snapshot.connect(uri)
    try:
        schema.bring_forward(client[db_name])
    except schema.SchemaTooNew as exc:
        return str(exc)
    except PyMongoError as exc:  # the database went away between the ping and here
        return f"could not check the database's schema version: {type(exc).__name__}"
    finally:
        client.close()
    return None
