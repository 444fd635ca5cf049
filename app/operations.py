"""The operator's commands on the database (docs/operations.md): `backup`, `restore`, `migrate`, `reconcile` and
`release-outbound`.

Each works on MONGODB_URI (and MONGODB_DB), or, when MONGODB_URI is unset, on the embedded database in
DATA_DIR/db: the one a running gateway serves (its URI is in DATA_DIR, app/embedded.py `running_uri`) for the
commands that do not replace data (backup, reconcile, release-outbound), or one started here while the gateway is
stopped. `restore` and `migrate` want every gateway on the database they write stopped: restore replaces what it
would serve, and what it writes after a migration's moment would not reach the target. A database a gateway
serves is one with a process whose heartbeat is younger than LEASE_TIMEOUT (storage/markers.py): they refuse it.

Every failure is one line on stderr and exit 1 (2: unusable settings), and leaves the target as it was.
"""

import argparse
import os
import sys
from datetime import UTC, datetime

from pymongo.errors import PyMongoError
from pymongo.uri_parser import parse_uri

import config
from accounting import reconcile
from app.embedded import DataDirBusy, Helpers, running_uri, start_helpers
from app.preflight import SECRETS_FILE, database_problem, stored_secrets
from storage import backup, ledger, markers, schema, snapshot

DESCRIPTION = """\
With MONGODB_URI set, these work on that database (MONGODB_DB); without it, on the embedded database in
DATA_DIR/db: backup, reconcile and release-outbound reach the one a running gateway serves, restore and
migrate want every gateway on what they write stopped. See docs/operations.md for the runbook.
"""


class Refused(RuntimeError):
    pass


def add_commands(commands: argparse._SubParsersAction) -> None:
    def add(name: str, help: str) -> argparse.ArgumentParser:
        return commands.add_parser(
            name,
            help=help,
            description=f"{help}.\n\n{DESCRIPTION}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    add("backup", "write a consistent, compressed archive of the database while the gateway serves").add_argument(
        "--out", required=True, metavar="FILE", help="the archive to write (a .tar.gz; replaced if it exists)"
    )
    restore = add(
        "restore",
        "restore a backup archive into an empty database, after checking it whole against its signed manifest; "
        "the restored database holds outbound (webhooks, emails, stream polls) until release-outbound",
    )
    restore.add_argument("file", metavar="FILE")
    restore.add_argument("--force", action="store_true", help="replace what the target database holds")
    migrate = add("migrate", "copy every collection and index to another MongoDB, then verify the copy")
    migrate.add_argument("--to", required=True, metavar="MONGODB_URI", help="the target (a replica set's URI)")
    migrate.add_argument("--force", action="store_true", help="replace what the target database holds")
    add("reconcile", "check every account's credits, every order and every key budget against the usage")
    add("release-outbound", "let a restored database's gateways send again: webhooks, emails and stream polls")


COMMANDS = ("backup", "restore", "migrate", "reconcile", "release-outbound")


class Database:
    """The database a command works on, and whatever was started here to reach it."""

    def __init__(self, settings: config.Settings, writes: bool):
        self.settings, self.helpers = settings, None
        if settings.mongodb_uri:
            self.uri, self.label = settings.mongodb_uri, f"MongoDB from MONGODB_URI (database {settings.mongodb_db})"
            return
        try:
            self.helpers: Helpers | None = start_helpers(settings, sandbox=False)
        except DataDirBusy:
            uri = running_uri(settings.data_dir)
            if writes:
                raise Refused("the gateway runs on DATA_DIR's embedded database: stop it first") from None
            if uri is None:
                raise Refused("another process holds DATA_DIR and did not say where its database is") from None
            self.uri, self.label = uri, f"the running gateway's embedded database ({settings.data_dir}/db)"
            return
        except RuntimeError as exc:
            raise Refused(f"cannot start the embedded database in {settings.data_dir}/db: {exc}") from None
        self.uri, self.label = self.helpers.settings.mongodb_uri, f"the embedded database in {settings.data_dir}/db"

    def __enter__(self):
        self.client = snapshot.connect(self.uri)
        return self.client[self.settings.mongodb_db]

    def __exit__(self, *exc) -> None:
        self.client.close()
        if self.helpers is not None:
            self.helpers.stop()


def run(args: argparse.Namespace) -> int:
    settings = config.load_for_command()
    if settings is None:
        return 2
    problem = settings.mongodb_uri and database_problem(settings.mongodb_uri)
    if args.command == "migrate":
        problem = problem or _target_problem(args.to)
    if problem:
        print(f"social-gateway: {problem}", file=sys.stderr)
        return 1
    args.settings = settings
    steps = {
        "backup": _backup,
        "restore": _restore,
        "migrate": _migrate,
        "reconcile": _reconcile,
        "release-outbound": _release_outbound,
    }
    try:
        # Before any database is started or written: a command that cannot sign or check the archive stops here.
        if args.command == "backup":
            args.secrets_key = _secrets_key(settings, "sign the manifest with")
        elif args.command == "restore":
            args.secrets_key = _secrets_key(settings, "check the archive's signature with")
        with Database(settings, writes=args.command in ("restore", "migrate")) as source:
            return steps[args.command](source, args)
    except (Refused, backup.NoSnapshot, backup.ArchiveDamaged) as exc:
        print(f"social-gateway: {args.command}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # the archive's folder: missing, not writable, full
        print(f"social-gateway: {args.command}: {exc.strerror or exc}: {exc.filename or ''}", file=sys.stderr)
        return 1
    except PyMongoError as exc:  # the database failed under the command: one line, never a traceback
        reason = str(exc).splitlines()[0][:200] if str(exc) else ""
        print(f"social-gateway: {args.command}: the database failed ({type(exc).__name__}: {reason})", file=sys.stderr)
        return 1


def _secrets_key(settings: config.Settings, doing: str) -> str:
    """SECRETS_KEY, or in development the one generated into DATA_DIR/secrets.json (never generated here: a new one
    would sign nothing a gateway could check, and open none of the database's secrets)."""
    key = settings.secrets_key or stored_secrets(settings.data_dir).get("secrets_key")
    if not key:
        raise Refused(
            f"no SECRETS_KEY to {doing}: set the gateway's SECRETS_KEY, or in development copy its "
            f"DATA_DIR/{SECRETS_FILE} into {os.path.join(settings.data_dir, SECRETS_FILE)}"
        )
    return key


def _not_served(db, settings: config.Settings, what: str) -> None:
    """Refused while a gateway process serves `db` (a heartbeat younger than LEASE_TIMEOUT)."""
    live = markers.live_processes(db, settings.lease_timeout)
    if live:
        age = live[0][1]  # the most recent heartbeat
        raise Refused(
            f"a gateway serves {what} {db.name} ({len(live)} process{'es' if len(live) > 1 else ''}, the last "
            f"heartbeat {max(age, 0):.0f} s ago): "
            f"stop it first (a process killed without stopping counts for LEASE_TIMEOUT, {settings.lease_timeout:g} s)"
        )


def _target_problem(uri: str) -> str | None:
    problem = database_problem(uri)
    return problem and problem.replace("(MONGODB_URI)", "(--to)").replace("MONGODB_URI", "--to")


def _backup(db, args) -> int:
    manifest = backup.dump(db, args.out, args.secrets_key)
    counts = {name: c["count"] for name, c in manifest["collections"].items()}
    print(
        f"backup of {db.name} written to {args.out}: {len(counts)} collections, {sum(counts.values())} documents, "
        f"schema version {manifest['schema_version']}, read at one moment ({manifest['created_at']})"
    )
    return 0


def _restore(db, args) -> int:
    """All or nothing: the archive checked whole (signature, checksums, schema version), the target checked (empty,
    or --force and no gateway on it), the archive written into staging collections with its indexes, and only then
    put in place of the target's (storage/backup.py). The restored copy holds outbound until release-outbound."""
    manifest = backup.verify(args.file, args.secrets_key)
    newer = manifest.get("schema_version") or 0
    if newer > schema.VERSION:
        raise Refused(f"the archive is at schema version {newer}, newer than this gateway's {schema.VERSION}")
    held = backup.nonempty(db)
    if held and not args.force:
        raise Refused(
            f"the target database {db.name} is not empty ({', '.join(held[:5])}{'...' if len(held) > 5 else ''}): "
            "restore into an empty one, or add --force to replace what it holds"
        )
    _not_served(db, args.settings, "the target database")
    written = backup.stage(db, args.file, manifest)
    try:
        # A restored copy sends nothing outward until the operator says so (a drill must not reach customers),
        # and is no database migrated away, whatever the one backed up was.
        staged = backup.staged(db, markers.COLLECTION)
        staged.replace_one(
            {"_id": markers.OUTBOUND},
            {"reason": f"restored from the backup of {manifest['created_at']}", "since": datetime.now(UTC)},
            upsert=True,
        )
        staged.delete_one({"_id": markers.MIGRATED})
        # The processes that ran at the backup run on its source, not here: silent since long ago, so that this
        # database counts as served by none of them, and its first start reclaims their leases at once.
        backup.staged(db, "processes").update_many({}, {"$set": {"heartbeat_at": datetime.fromtimestamp(0, UTC)}})
        _not_served(db, args.settings, "the target database")  # one may have started while the archive was staged
    except BaseException:
        backup.drop_staged(db)
        raise
    backup.put_in_place(
        db,
        sorted(written) + ([] if markers.COLLECTION in written else [markers.COLLECTION]),
        set(held) - set(written) - {markers.COLLECTION},
    )
    for name, count in sorted(written.items()):
        print(f"  {name}: {count}")
    print(
        f"restored {sum(written.values())} documents in {len(written)} collections into {db.name} "
        f"(backup of {manifest['created_at']}, schema version {manifest.get('schema_version')}); the manifest's "
        "signature, counts and checksums matched. The gateway's first start reclaims at once the leases of the processes "
        "that were running when the backup was taken. Outbound is held: no webhook, email or stream poll leaves "
        "until `social-gateway release-outbound`."
    )
    return 0


def _migrate(db, args) -> int:
    target_client = snapshot.connect(args.to)
    try:
        target = target_client[db.name]
        target.command("ping")
        if target_client.address == db.client.address:  # with --force it would drop what it copies from
            raise Refused(f"the target is the source ({db.name} on the same server)")
        _not_served(db, args.settings, "the source database")  # what it wrote after the copy would be lost
        held = backup.nonempty(target)
        if held and not args.force:
            raise Refused(
                f"the target database {db.name} is not empty ({', '.join(held[:5])}): add --force to replace it"
            )
        _not_served(target, args.settings, "the target database")
        backup.drop(target, set(held) | set(backup.collections(db)))
        copied = backup.copy(db, target)
        differences = _verify(target, copied)
        markers.forget_migrated(target)  # the copy is the one to serve (a source migrated before: a migrate again)
    finally:
        target_client.close()
    documents = sum(copied.counts.values())
    print(f"copied {len(copied.counts)} collections ({documents} documents) with their indexes to the target")
    for line in differences:
        print(f"  {line}")
    if differences:
        print(f"migrate: the target differs from the source in {len(differences)} ways", file=sys.stderr)
        return 1
    accounts = len(copied.books.accounts)
    # The source is stale from this moment: a `serve` on it is refused from now on (app/preflight.py).
    markers.mark_migrated(db, _hosts(args.to), db.name)
    print(
        f"verified: every collection's count, and the balance and usage totals of all {accounts} accounts, are the "
        f"same on the target; reconcile on the target: OK. Serve with MONGODB_URI set to the target and "
        f"MONGODB_DB={db.name}; `serve` on the source is refused from now on (ALLOW_MIGRATED_DB=true overrides)."
    )
    return 0


def _hosts(uri: str) -> str:
    """The target's hosts, never its credentials."""
    return ",".join(f"{host}:{port}" for host, port in parse_uri(uri)["nodelist"])


def _verify(target, copied: backup.Copied) -> list[str]:
    found = []
    for name, count in copied.counts.items():
        there = target[name].count_documents({})
        if there != count:
            found.append(f"{name}: {count} documents copied, {there} on the target")
    with snapshot.snapshot(target.client) as session:
        books = ledger.read_books(target, session)
    theirs = {doc["_id"]: reconcile.figures(doc, books.usage.get(doc["_id"], {})) for doc in books.accounts}
    for doc in copied.books.accounts:
        mine = reconcile.figures(doc, copied.books.usage.get(doc["_id"], {}))
        other = theirs.get(doc["_id"])
        if other is None or (other["balance"], other["charged"]) != (mine["balance"], mine["charged"]):
            found.append(f"account {doc['_id']}: balance and usage {mine} at the source, {other} on the target")
    return found + reconcile.check(books, datetime.now(UTC)).differences


def _reconcile(db, args) -> int:
    with snapshot.snapshot(db.client) as session:
        books = ledger.read_books(db, session)
    report = reconcile.check(books, datetime.now(UTC))
    if report.differences:
        for line in report.differences:
            print(line)
        print(report.summary(), file=sys.stderr)
        return 1
    print(report.summary())
    return 0


def _release_outbound(db, args) -> int:
    hold = markers.release_outbound(db)
    if hold is None:
        print(f"outbound of {db.name} was not held: webhooks, emails and stream polls already go out")
        return 0
    print(
        f"outbound of {db.name} released (held since {hold['since'].isoformat(timespec='seconds')}, {hold['reason']}): "
        "its gateways send webhooks and emails and poll stream rules within seconds"
    )
    return 0
