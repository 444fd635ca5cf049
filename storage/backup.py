"""Every collection of a database with its indexes, copied as at one moment: into an archive (`backup`), from an
archive (`restore`), or straight into another database (`migrate`). app/operations.py runs them.

The moment is a snapshot read (storage/snapshot.py): every document of every collection as a crash at that
instant would have left it, while the gateway keeps serving. That is what makes the copy consistent for credits:
an account document and the usage records of its leases come from the same instant, and the start-up recovery a
crash gets (dead processes' leases reclaimed against their stored usage) gives exactly the balances the books
say (docs/operations.md, Backups). Without a snapshot (a standalone mongod) there is no such instant, and these
refuse.

The archive is a gzip-compressed tar: `manifest.json` (format, when, the schema version, per collection its
document count, SHA-256 and indexes), then one `<collection>.bson` per collection (documents back to back, as
mongodump writes them).
"""

import hashlib
import io
import json
import os
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

import bson
from bson.raw_bson import RawBSONDocument
from pymongo import IndexModel
from pymongo.database import Database

from storage import ledger, schema, snapshot

FORMAT = 1
BATCH = 1000  # documents per insert
RAW = bson.CodecOptions(document_class=RawBSONDocument)


class NoSnapshot(RuntimeError):
    """The server cannot read at one moment (no transactions)."""


class ArchiveDamaged(RuntimeError):
    """The archive does not match its manifest (or is not one)."""


@dataclass
class Copied:
    counts: dict[str, int] = field(default_factory=dict)
    schema_version: int | None = None
    books: ledger.Books | None = None  # the source's, read at the moment copied


def collections(db: Database) -> list[str]:
    return sorted(name for name in db.list_collection_names() if not name.startswith("system."))


def nonempty(db: Database) -> list[str]:
    """The collections of `db` that hold documents."""
    return [name for name in collections(db) if db[name].find_one({}, {"_id": 1}) is not None]


def indexes_of(db: Database, name: str) -> list[dict]:
    """Every index but _id's, as {key: [[field, direction]], name, options...}."""
    out = []
    for index_name, info in db[name].index_information().items():
        if index_name == "_id_":
            continue
        options = {k: v for k, v in info.items() if k not in ("key", "v", "ns")}
        out.append({"key": [list(pair) for pair in info["key"]], "name": index_name, **options})
    return out


def make_indexes(db: Database, name: str, indexes: list[dict]) -> None:
    models = [
        IndexModel([tuple(pair) for pair in spec["key"]], **{k: v for k, v in spec.items() if k != "key"})
        for spec in indexes
    ]
    if models:
        db[name].create_indexes(models)
    elif name not in db.list_collection_names():  # an empty collection without indexes is still there after
        db.create_collection(name)


def _documents(db: Database, name: str, session) -> Iterator[RawBSONDocument]:
    yield from db.get_collection(name, codec_options=RAW).find({}, session=session, batch_size=BATCH)


def _schema_of(db: Database, session) -> int | None:
    doc = db.schema.find_one(schema.RECORD, session=session)
    return doc["version"] if doc else None


# --- backup ---------------------------------------------------------------------------------------------
def dump(db: Database, out: str) -> dict:
    """Writes the archive to `out` (through a temporary file beside it, renamed once complete); its manifest."""
    names = collections(db)
    indexes = {name: indexes_of(db, name) for name in names}
    folder = os.path.dirname(os.path.abspath(out))
    manifest = {
        "format": FORMAT,
        "created_at": datetime.now(UTC).isoformat(),
        "database": db.name,
        "read": "snapshot",
        "collections": {},
    }
    with tempfile.TemporaryDirectory(dir=folder, prefix=".backup-") as work:
        with snapshot.snapshot(db.client) as session:
            if session is None:
                raise NoSnapshot("the server has no transactions, so no read at one moment (a standalone mongod)")
            manifest["schema_version"] = _schema_of(db, session)
            for name in names:
                digest, count, size = hashlib.sha256(), 0, 0
                with open(os.path.join(work, f"{name}.bson"), "wb") as fh:
                    for doc in _documents(db, name, session):
                        fh.write(doc.raw)
                        digest.update(doc.raw)
                        count += 1
                        size += len(doc.raw)
                manifest["collections"][name] = {
                    "count": count,
                    "bytes": size,
                    "sha256": digest.hexdigest(),
                    "indexes": indexes[name],
                }
        partial = out + ".partial"
        try:
            with tarfile.open(partial, "w:gz") as tar:
                _add_bytes(tar, "manifest.json", json.dumps(manifest, indent=2, default=str).encode())
                for name in names:
                    tar.add(os.path.join(work, f"{name}.bson"), arcname=f"{name}.bson")
            with open(partial, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(partial, out)
        finally:
            if os.path.exists(partial):  # a failed pack (a full disk) leaves nothing half-written behind
                os.unlink(partial)
    return manifest


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(datetime.now(UTC).timestamp())
    tar.addfile(info, io.BytesIO(data))


# --- restore ----------------------------------------------------------------------------------------------
def _members(path: str) -> Iterator[tuple[str, Iterator[RawBSONDocument]]]:
    """(collection, its documents) in archive order, read as a stream."""
    with tarfile.open(path, "r:gz") as tar:
        for member in tar:
            if member.name == "manifest.json":
                continue
            if not member.name.endswith(".bson"):
                raise ArchiveDamaged(f"unexpected member {member.name}")
            yield member.name[: -len(".bson")], _decode(tar.extractfile(member))


def _decode(fh) -> Iterator[RawBSONDocument]:
    while header := fh.read(4):
        size = int.from_bytes(header, "little")
        body = fh.read(size - 4)
        if len(header) < 4 or size < 5 or len(body) != size - 4:
            raise ArchiveDamaged("a document is cut short")
        yield RawBSONDocument(header + body)


def manifest_of(path: str) -> dict:
    if not os.path.isfile(path):
        raise ArchiveDamaged(f"no such file: {path}")
    try:
        with tarfile.open(path, "r:gz") as tar:
            member = tar.next()
            if member is None or member.name != "manifest.json":
                raise ArchiveDamaged("no manifest.json at its start")
            manifest = json.loads(tar.extractfile(member).read())
    except (tarfile.TarError, OSError, EOFError, ValueError) as exc:
        raise ArchiveDamaged(f"not a backup archive ({type(exc).__name__})") from None
    if manifest.get("format") != FORMAT:
        raise ArchiveDamaged(f"archive format {manifest.get('format')}, this gateway reads {FORMAT}")
    return manifest


def verify(path: str) -> dict:
    """The manifest, once every collection's documents match its count and SHA-256; ArchiveDamaged otherwise."""
    manifest = manifest_of(path)
    seen = set()
    try:
        for name, docs in _members(path):
            digest, count = hashlib.sha256(), 0
            for doc in docs:
                digest.update(doc.raw)
                count += 1
            expected = manifest["collections"].get(name)
            if expected is None or (count, digest.hexdigest()) != (expected["count"], expected["sha256"]):
                raise ArchiveDamaged(f"{name}: its documents do not match the manifest")
            seen.add(name)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ArchiveDamaged(f"unreadable ({type(exc).__name__})") from None
    missing = set(manifest["collections"]) - seen
    if missing:
        raise ArchiveDamaged(f"collections missing from the archive: {', '.join(sorted(missing))}")
    return manifest


def load(db: Database, path: str, manifest: dict) -> dict[str, int]:
    """Writes a verified archive into `db` (whose collections of the same names were emptied): counts written."""
    written = {}
    for name, docs in _members(path):
        written[name] = _insert(db, name, docs)
        make_indexes(db, name, manifest["collections"][name]["indexes"])
    return written


def _insert(db: Database, name: str, docs) -> int:
    collection, batch, count = db[name], [], 0
    for doc in docs:
        batch.append(doc)
        if len(batch) == BATCH:
            collection.insert_many(batch, ordered=False)
            count += len(batch)
            batch = []
    if batch:
        collection.insert_many(batch, ordered=False)
        count += len(batch)
    return count


def drop(db: Database, names) -> None:
    for name in names:
        db.drop_collection(name)


# --- migrate ----------------------------------------------------------------------------------------------
def copy(source: Database, target: Database) -> Copied:
    """Every collection and its indexes from `source`, read at one moment, into `target`."""
    names = collections(source)
    copied = Copied()
    with snapshot.snapshot(source.client) as session:
        if session is None:
            raise NoSnapshot("the source server has no transactions, so no read at one moment (a standalone mongod)")
        copied.schema_version = _schema_of(source, session)
        copied.books = ledger.read_books(source, session)
        for name in names:
            copied.counts[name] = _insert(target, name, _documents(source, name, session))
    for name in names:
        make_indexes(target, name, indexes_of(source, name))
    return copied
