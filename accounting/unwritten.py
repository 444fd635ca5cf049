"""Usage records the database could not take before this process stopped, with JOURNAL=off (the journal keeps them
otherwise: accounting/journal.py), kept on local disk and written exactly once at the next start: a database away
at shutdown must not leave served calls unbilled.

One file per stopped process, DATA_DIR/unwritten-usage/<database>.<process id>.jsonl, one line per batch:
{"batch": "<process id>-<seq>", "records": [...]}. A batch keeps the id the flush gave it (the unconfirmed
one, which the database may have written in part or whole) or would have given it (the rest), and bucket ids
derive from batch ids (storage/usage.py): writing a batch again writes each of its records once. The file
appears whole or not at all (a temporary file, fsync, rename, fsync of the folder); Meter.write_unwritten
deletes it once every batch is written and the leases they spent from are put right (accounting/recovery.py).
"""

import os
from datetime import datetime

import orjson

FOLDER = "unwritten-usage"


def save(data_dir: str, database: str, process_id: str, batches: list[tuple[str, list[dict]]]) -> str:
    """Writes the batches durably; the file's path."""
    folder = os.path.join(data_dir, FOLDER)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{database}.{process_id}.jsonl")
    with open(path + ".tmp", "wb") as fh:
        for batch_id, records in batches:
            fh.write(orjson.dumps({"batch": batch_id, "records": records}) + b"\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(path + ".tmp", path)
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself survives a power loss
    finally:
        os.close(directory)
    return path


def found(data_dir: str, database: str) -> list[str]:
    """The files left for `database` (other databases' files, say of tests sharing DATA_DIR, are not ours)."""
    folder = os.path.join(data_dir, FOLDER)
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(os.path.join(folder, n) for n in names if n.startswith(database + ".") and n.endswith(".jsonl"))


def load(path: str) -> list[tuple[str, list[dict]]]:
    batches = []
    with open(path, "rb") as fh:
        for line in fh:
            batch = orjson.loads(line)
            for record in batch["records"]:
                record["ts"] = datetime.fromisoformat(record["ts"])
            batches.append((batch["batch"], batch["records"]))
    return batches
