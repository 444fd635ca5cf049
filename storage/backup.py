"""Every collection of a database with its indexes, copied as at one moment: into an archive (`backup`), from an
archive (`restore`), or straight into another database (`migrate`). app/operations.py runs them.

The moment is a snapshot read (storage/snapshot.py): every document of every collection as a crash at that
instant would have left it, while the gateway keeps serving. That is what makes the copy consistent for credits:
an account document and the usage records of its leases come from the same instant, and the start-up recovery a
crash gets (dead processes' leases reclaimed against their stored usage) gives exactly the balances the books
say (docs/operations.md, Backups). Without a snapshot (a standalone mongod) there is no such instant, and these
refuse.

The archive is a gzip-compressed tar, mode 0600 (it holds password hashes and sealed secrets): `manifest.json`
(format, when, the schema version, per collection its document count, SHA-256 and indexes, and its signature:
an HMAC under a key derived from SECRETS_KEY, security/seals.py), then one `<collection>.bson` per collection
(documents back to back, as mongodump writes them). Checksums find a changed byte; the signature finds an archive
edited with its manifest recomputed (a balance and its credits_added changed together).

A restore is all or nothing: the whole archive is checked against its signed manifest, then written into staging
collections beside the target's (`restoring.<name>`) with their indexes, so that a document held twice or one that
breaks a unique index fails there; only then are the staged collections renamed over the target's. A failure
before that leaves the target as it was (the staging collections dropped).
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
from pymongo.errors import BulkWriteError, OperationFailure

from security import seals
from storage import ledger, schema, snapshot

FORMAT = 2  # 2: the manifest is signed (format 1 was not)
STAGING = "restoring."  # the prefix of a restore's staging collections
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
    return sorted(name for name in db.list_collection_names() if not name.startswith(("system.", STAGING)))


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
def dump(db: Database, out: str, secrets_key: str) -> dict:
    """Writes the archive to `out` (through a temporary file beside it, renamed once complete), its manifest signed
    with `secrets_key`; its manifest."""
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
        manifest = json.loads(json.dumps(manifest, default=str))  # as restore will read it back
        manifest["signature"] = seals.sign_manifest(secrets_key, signed_part(manifest))
        partial = out + ".partial"
        try:
            if os.path.exists(partial):  # left by a backup that died: created anew below, with our mode
                os.unlink(partial)
            # 0600 from its creation: password hashes and sealed secrets are readable by the operator alone.
            with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as raw:
                with tarfile.open(fileobj=raw, mode="w:gz") as tar:
                    _add_bytes(tar, "manifest.json", json.dumps(manifest, indent=2).encode())
                    for name in names:
                        tar.add(os.path.join(work, f"{name}.bson"), arcname=f"{name}.bson")
                raw.flush()
                os.fsync(raw.fileno())
            os.replace(partial, out)
        finally:
            if os.path.exists(partial):  # a failed pack (a full disk) leaves nothing half-written behind
                os.unlink(partial)
    return manifest


def signed_part(manifest: dict) -> bytes:
    """The manifest's canonical bytes, its signature left out."""
    body = {k: v for k, v in manifest.items() if k != "signature"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


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


def manifest_of(path: str, secrets_key: str) -> dict:
    """The archive's manifest once its signature is checked with `secrets_key`; ArchiveDamaged otherwise."""
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
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise ArchiveDamaged(f"archive format {found}, this gateway reads {FORMAT} (signed manifests)")
    signature = manifest.get("signature")
    if not isinstance(signature, str) or not seals.manifest_signed_by(secrets_key, signed_part(manifest), signature):
        raise ArchiveDamaged(
            "the manifest's signature does not match: the archive was changed after it was written, or written by "
            "a gateway with another SECRETS_KEY (restore with that one: in development, its DATA_DIR/secrets.json)"
        )
    if not isinstance(manifest.get("collections"), dict):
        raise ArchiveDamaged("the manifest lists no collections")
    return manifest


def verify(path: str, secrets_key: str) -> dict:
    """The manifest, once its signature holds, every collection's documents match its count and SHA-256 and the
    schema version its database records is the one it states; ArchiveDamaged otherwise."""
    manifest = manifest_of(path, secrets_key)
    seen, recorded = set(), None
    try:
        for name, docs in _members(path):
            digest, count = hashlib.sha256(), 0
            for doc in docs:
                digest.update(doc.raw)
                count += 1
                if name == "schema" and doc.get("_id") == schema.RECORD["_id"]:
                    recorded = doc.get("version")
            expected = manifest["collections"].get(name)
            if expected is None or (count, digest.hexdigest()) != (expected.get("count"), expected.get("sha256")):
                raise ArchiveDamaged(f"{name}: its documents do not match the manifest")
            if name in seen:
                raise ArchiveDamaged(f"{name}: in the archive twice")
            seen.add(name)
    except (tarfile.TarError, OSError, EOFError, bson.errors.BSONError) as exc:
        raise ArchiveDamaged(f"unreadable ({type(exc).__name__})") from None
    missing = set(manifest["collections"]) - seen
    if missing:
        raise ArchiveDamaged(f"collections missing from the archive: {', '.join(sorted(missing))}")
    if recorded != manifest.get("schema_version"):
        raise ArchiveDamaged(
            f"its database records schema version {recorded}, its manifest {manifest.get('schema_version')}"
        )
    return manifest


def stage(db: Database, path: str, manifest: dict) -> dict[str, int]:
    """Writes a verified archive into staging collections of `db` (`restoring.<name>`), each with its indexes:
    counts written. A document the archive holds twice, or documents that break a unique index, are
    ArchiveDamaged here, and nothing staged is left behind; the collections `db` serves are not touched."""
    drop_staged(db)  # a restore that died midway left its own
    written = {}
    try:
        for name, docs in _members(path):
            try:
                written[name] = _insert(db, STAGING + name, docs)
                make_indexes(db, STAGING + name, manifest["collections"][name]["indexes"])
            except BulkWriteError as exc:
                errors = exc.details.get("writeErrors") or [{}]
                if any(error.get("code") != DUPLICATE_KEY for error in errors):
                    raise
                raise ArchiveDamaged(
                    f"{name}: {len(errors)} documents repeat a unique key (first {errors[0].get('keyValue')}): "
                    "the archive cannot be restored as it is"
                ) from None
            except OperationFailure as exc:
                if exc.code != DUPLICATE_KEY:
                    raise
                raise ArchiveDamaged(
                    f"{name}: its documents break a unique index ({_index_named(exc)}): "
                    "the archive cannot be restored as it is"
                ) from None
    except BaseException:
        drop_staged(db)
        raise
    return written


DUPLICATE_KEY = 11000


def _index_named(exc: OperationFailure) -> str:
    message = str(exc.details.get("errmsg") if exc.details else exc)
    return message.split(" index: ", 1)[1].split(" ", 1)[0] if " index: " in message else "a unique index"


def staged(db: Database, name: str):
    """The staging collection of `name`."""
    return db[STAGING + name]


def drop_staged(db: Database) -> None:
    for name in db.list_collection_names():
        if name.startswith(STAGING):
            db.drop_collection(name)


def put_in_place(db: Database, names, others) -> None:
    """The staged collections `names` renamed over the target's (each dropping the one it replaces), then the
    target's collections `others`, which the archive does not hold, dropped."""
    for name in names:
        db.client.admin.command(
            "renameCollection", f"{db.name}.{STAGING}{name}", to=f"{db.name}.{name}", dropTarget=True
        )
    drop(db, others)


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
