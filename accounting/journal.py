"""The usage journal: each gateway process's local write-ahead log of its usage records, so that no answered call
goes unbilled whatever kills the process (docs/architecture.md, *Durability*).

A data call's record is appended here and its answer leaves only once the group holding it is on disk: one
write and one fdatasync, made by a thread of the journal's own, serve every record appended meanwhile (group
commit: a group closes after JOURNAL_GROUP_MS or at JOURNAL_GROUP_RECORDS; while the thread writes one group
the next one gathers). The event loop never blocks on the disk: it awaits one future per group.

Layout, per process: DATA_DIR/journal/<database>.<process id>/
- `owner.lock`, locked (flock) by the process for its life: the kernel drops the lock when the process dies,
  however it dies, which is how a reader knows the journal's writer is gone.
- `replay.lock`, locked by whoever replays the journal, so that two starts racing for it take turns.
- `<segment>.log`, append-only: a sequence of chunks, one per group: `GWJ1`, the payload's length, the payload's
  CRC-32 and the CRC-32 of those twelve bytes, then the payload: one JSON entry a line, a record
  (`{"r": {...}}`: every field of the record, whatever fields it has), a batch taken by a flush
  (`{"b": batch id, "f": first record id, "l": last record id, "n": count}`, made durable before the batch is
  written) or a batch the database confirmed (`{"c": batch id}`).

The directory is made as `<name>.new` and renamed once its owner holds the lock: a reader never sees a journal
whose owner has not locked it yet. Segments past SEGMENT_BYTES are closed and a new one begun; a closed segment
whose records and batches are all confirmed is deleted (the trim). A clean stop deletes the directory.

Replay (`leftovers`, `claim`, `Claim.batches`): a journal whose owner lock is free is read whole and turned into
the batches to write: a batch taken and not confirmed keeps its id (the database may hold part of it: bucket
ids derive from batch ids, storage/usage.py, so what it holds is skipped), the records of no batch are cut into
batches with ids derived from their place in the journal. The same journal thus always gives the same batches,
and writing them twice writes each record once. A chunk cut short or failing its checksum at the end of the last
segment is a write the crash interrupted (it was never acknowledged): reading stops there. A bad chunk followed
by a good one was once durable: the journal is corrupt, nothing of it is replayed, and it is renamed
`<name>.corrupt` for the operator (JournalCorrupt).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import fcntl
import logging
import os
import queue
import struct
import threading
import time
import zlib
from collections.abc import Callable
from datetime import datetime

import orjson

log = logging.getLogger("gateway.journal")

FOLDER = "journal"
MAGIC = b"GWJ1"
HEADER = struct.Struct("<4sIII")  # magic, payload length, payload CRC-32, CRC-32 of the first twelve bytes
SEGMENT_BYTES = 4 << 20  # a segment is closed past this size, so that confirmed records can be deleted
REPLAY_BATCH = 500  # records per replayed batch of records no flush had taken (fixed: ids derive from it)
CLAIM_WAIT = 10.0  # seconds a reader waits for another reader replaying the same journal
OWNER, REPLAYER = "owner.lock", "replay.lock"
SHUT = object()  # the writer thread's last job


class JournalCorrupt(Exception):
    """A journal that cannot be replayed as it is: a bad chunk with good ones after it."""


def folder(data_dir: str) -> str:
    return os.path.join(data_dir, FOLDER)


def chunk(payload: bytes) -> bytes:
    head = struct.pack("<4sII", MAGIC, len(payload), zlib.crc32(payload))
    return head + struct.pack("<I", zlib.crc32(head)) + payload


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # a segment made or deleted survives a power loss
    finally:
        os.close(fd)


class Journal:
    """The journal of this process. `append` and the batch marks return a future done once the entry is on disk;
    `observe` is told (fsync seconds, records in the group) of each group written.

    The event loop only serializes an entry and hands it to the writer thread with a number; the thread gathers a
    group (for JOURNAL_GROUP_MS from the oldest entry waiting, at most JOURNAL_GROUP_RECORDS entries), writes and
    fdatasyncs it, and tells the loop the number of the last entry on disk (one call_soon_threadsafe per group).
    Segments and the trim are the thread's alone."""

    def __init__(
        self,
        data_dir: str,
        database: str,
        process_id: str,
        group_ms: float,
        group_records: int,
        observe: Callable[[float, int], None] = lambda seconds, size: None,
    ):
        self.path = os.path.join(folder(data_dir), f"{database}.{process_id}")
        self.group_seconds, self.group_records, self.observe = group_ms / 1000, group_records, observe
        self.failures = 0
        self._lock_fd = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        # The loop's side: entries handed over, and the futures of those not yet on disk, oldest first.
        self._seq = 0
        self._waiting: collections.deque[tuple[int, asyncio.Future]] = collections.deque()
        # Appended so far: records, batches taken; confirmed: records and batches the database holds. Each entry
        # carries these four as of itself: the thread trims by those of the last entry on disk.
        self._records = self._batches = self._confirmed_records = self._confirmed_batches = 0
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._writer = threading.Thread(target=self._work, name="journal", daemon=True)
        # The writer thread's side.
        self._fd = -1
        self._segment = 0  # the open segment's number
        self._end = 0  # its size: where a failed write is cut back to
        self._closed: list[tuple[int, tuple[int, int]]] = []  # closed segments: (number, (records, batches) to its end)
        self._upto = (0, 0)  # (records, batches) as of the last entry written to the open segment

    # --- opening and closing ---------------------------------------------------------------------------------
    def open(self) -> None:
        """Makes the directory as `<name>.new`, locks it, renames it into place (blocking: at start)."""
        fresh = self.path + ".new"
        os.makedirs(fresh)
        # Both lock files made here, once: a reader opens them without creating them, so none can make one in a
        # journal another reader is deleting.
        os.close(os.open(os.path.join(fresh, REPLAYER), os.O_RDWR | os.O_CREAT, 0o600))
        self._lock_fd = os.open(os.path.join(fresh, OWNER), os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(fresh, self.path)
        _fsync_dir(os.path.dirname(self.path))
        self._writer.start()

    async def close(self, remove: bool) -> None:
        """Waits for every entry to be on disk; then `remove` (everything confirmed) deletes the journal, or it is
        left for the next start to replay (a stop with the database away); the lock is let go either way."""
        if self._waiting:
            await asyncio.wait([self._waiting[-1][1]])
        shut = asyncio.get_running_loop().create_future()
        self._jobs.put((SHUT, remove, shut, asyncio.get_running_loop()))
        await shut

    # --- appending (the loop) --------------------------------------------------------------------------------
    def append(self, record: dict) -> asyncio.Future:
        """A usage record (any fields: the whole dict is kept); done once it is on disk."""
        self._records += 1
        return self._add(orjson.dumps({"r": record}), 1)

    def taken(self, batch_id: str, records: list[dict]) -> asyncio.Future:
        """A flush took these records as one batch; the batch is written only once this is durable."""
        self._batches += 1
        entry = {"b": batch_id, "f": records[0]["_id"], "l": records[-1]["_id"], "n": len(records)}
        return self._add(orjson.dumps(entry), 0)

    def confirmed(self, batch_id: str, count: int) -> None:
        """The database confirmed a batch (taken before every later one): its records may be trimmed once this
        is on disk."""
        self._confirmed_records += count
        self._confirmed_batches += 1
        self._add(orjson.dumps({"c": batch_id}), 0)

    def _add(self, line: bytes, records: int) -> asyncio.Future:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        self._seq += 1
        future = self._loop.create_future()
        self._waiting.append((self._seq, future))
        counts = (self._records, self._batches, self._confirmed_records, self._confirmed_batches)
        self._jobs.put((self._seq, line, records, counts, time.monotonic()))
        return future

    def _durable(self, seq: int, seconds: float | None, records: int, exc: Exception | None) -> None:
        """From the writer: every entry up to `seq` is on disk (or, with `exc`, failed to get there)."""
        if exc is None:
            self.observe(seconds, records)
        else:
            # The records stay in memory and are flushed as ever; what is lost is only their protection against
            # a crash. Logged and counted (gateway_journal_failures).
            self.failures += 1
            log.error("usage journal write failed (%s): %d records not protected against a crash", exc, records)
        waiting = self._waiting
        while waiting and waiting[0][0] <= seq:
            _, future = waiting.popleft()
            if exc is None:
                future.set_result(None)
            else:
                future.set_exception(exc)
                future.exception()  # retrieved: waiters that give up on it need not

    # --- the writer thread -----------------------------------------------------------------------------------
    def _work(self) -> None:
        jobs, held = self._jobs, None
        while True:
            first = held or jobs.get()
            held = None
            if first[0] is SHUT:
                self._shut(*first[1:])
                return
            group, records = [first], first[2]
            deadline = first[4] + self.group_seconds  # from when the oldest entry was appended
            while len(group) < self.group_records:
                try:
                    wait = deadline - time.monotonic()
                    job = jobs.get(timeout=wait) if wait > 0 else jobs.get_nowait()
                except queue.Empty:
                    break
                if job[0] is SHUT:
                    held = job  # after this group
                    break
                group.append(job)
                records += job[2]
            seconds, exc = None, None
            try:
                seconds = self._write(group)
            except Exception as error:
                exc = error
            try:
                self._loop.call_soon_threadsafe(self._durable, group[-1][0], seconds, records, exc)
            except RuntimeError:  # the loop is closed: no one waits any more
                return

    def _write(self, group: list[tuple]) -> float:
        """One chunk, one write, one fdatasync; the seconds the fdatasync took. Then the trim."""
        data = chunk(b"\n".join(job[1] for job in group))
        if self._fd < 0 or (self._end and self._end + len(data) > SEGMENT_BYTES):
            self._roll()
        try:
            if os.write(self._fd, data) != len(data):  # a full disk takes what fits
                raise OSError(errno.ENOSPC, "short write to the usage journal")
            started = time.perf_counter()
            os.fdatasync(self._fd)
        except OSError:
            # Cut back to the last whole group: a broken chunk with whole ones after it would read as corruption.
            # The next group goes to a new segment.
            try:
                os.ftruncate(self._fd, self._end)
                os.fdatasync(self._fd)
            finally:
                self._closed.append((self._segment, self._upto))
                os.close(self._fd)
                self._fd = -1
            raise
        seconds = time.perf_counter() - started
        self._end += len(data)
        counts = group[-1][3]
        self._upto = counts[:2]
        self._trim(counts[2], counts[3])
        return seconds

    def _roll(self) -> None:
        if self._fd >= 0:
            self._closed.append((self._segment, self._upto))
            os.close(self._fd)
        self._segment += 1
        self._fd = os.open(
            os.path.join(self.path, f"{self._segment:08d}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
        )
        self._end = 0
        _fsync_dir(self.path)

    def _trim(self, records: int, batches: int) -> None:
        """Closed segments whose records and batches the database holds (as of what is on disk) are deleted."""
        gone = [n for n, (in_records, in_batches) in self._closed if in_records <= records and in_batches <= batches]
        if not gone:
            return
        self._closed = [(n, upto) for n, upto in self._closed if n not in gone]
        for number in gone:
            with contextlib.suppress(FileNotFoundError):  # a segment whose first write failed may not exist
                os.remove(os.path.join(self.path, f"{number:08d}.log"))
        _fsync_dir(self.path)

    def _shut(self, remove: bool, done: asyncio.Future, loop: asyncio.AbstractEventLoop) -> None:
        try:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            if remove:
                for name in os.listdir(self.path):
                    os.remove(os.path.join(self.path, name))
                os.rmdir(self.path)
            os.close(self._lock_fd)  # the lock goes with it
            self._lock_fd = -1
        except Exception as exc:
            loop.call_soon_threadsafe(done.set_exception, exc)
        else:
            loop.call_soon_threadsafe(done.set_result, None)


# --- reading what a process left -------------------------------------------------------------------------------
def leftovers(data_dir: str, database: str, own: str | None) -> list[str]:
    """Journal directories of `database` other than `own` (a `.new` one holds no record: its owner died before
    its first, or is starting; a `.corrupt` one waits for the operator)."""
    try:
        names = os.listdir(folder(data_dir))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(
        os.path.join(folder(data_dir), n)
        for n in names
        if n.startswith(database + ".") and not n.endswith((".corrupt", ".new")) and n != own
    )


class Claim:
    """A dead process's journal, held by this reader: no other reader, and no owner, until `release`."""

    def __init__(self, path: str, fds: list[int]):
        self.path, self.fds = path, fds
        self.process_id = os.path.basename(path).split(".", 1)[1]

    def batches(self) -> list[tuple[str, list[dict]]]:
        """The batches to write for every record of the journal (module docstring); JournalCorrupt."""
        segments = sorted(n for n in os.listdir(self.path) if n.endswith(".log"))
        entries: list[dict] = []
        for i, name in enumerate(segments):
            with open(os.path.join(self.path, name), "rb") as fh:
                entries.extend(_entries(fh.read(), last=i == len(segments) - 1, name=name))
        return _batches(self.process_id, entries)

    def remove(self) -> None:
        for name in os.listdir(self.path):
            if name not in (OWNER, REPLAYER):
                os.remove(os.path.join(self.path, name))
        os.remove(os.path.join(self.path, OWNER))
        os.remove(os.path.join(self.path, REPLAYER))  # last: a reader waiting on it then finds it gone
        os.rmdir(self.path)

    def keep_corrupt(self) -> str:
        kept = self.path + ".corrupt"
        os.rename(self.path, kept)
        return kept

    def release(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def claim(path: str) -> Claim | None:
    """The journal at `path` if its owner is gone and no other reader replays it (waiting up to CLAIM_WAIT for
    one that does); None otherwise, or when it is gone (replayed meanwhile). Blocking: run it in a thread."""
    try:
        replay_fd = os.open(os.path.join(path, REPLAYER), os.O_RDWR)
    except (FileNotFoundError, NotADirectoryError):
        return None  # replayed and removed meanwhile
    fds = [replay_fd]
    try:
        deadline = time.monotonic() + CLAIM_WAIT
        while True:
            try:
                fcntl.flock(replay_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    log.warning("another process has been replaying %s for %.0f s; left to it", path, CLAIM_WAIT)
                    raise
                time.sleep(0.02)
        # The reader before us may have removed it while we waited: the lock we hold is on a file gone.
        if not _same(replay_fd, os.path.join(path, REPLAYER)):
            raise BlockingIOError
        owner_fd = os.open(os.path.join(path, OWNER), os.O_RDWR)
        fds.append(owner_fd)
        fcntl.flock(owner_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: its owner lives
        return Claim(path, fds)
    except (BlockingIOError, FileNotFoundError):
        for fd in fds:
            os.close(fd)
        return None


def _same(fd: int, path: str) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _entries(data: bytes, last: bool, name: str) -> list[dict]:
    entries, at = [], 0
    while at < len(data):
        payload = _chunk_at(data, at)
        if payload is None:
            # A good chunk after this one means this one was durable once: corruption, not a torn write.
            if not last or _good_chunk_after(data, at + 1):
                raise JournalCorrupt(f"{name}: bad chunk at byte {at} with whole chunks after it")
            log.warning(
                "journal %s ends in a torn write at byte %d (%d bytes): read up to it", name, at, len(data) - at
            )
            break
        entries.extend(orjson.loads(line) for line in payload.split(b"\n"))
        at += HEADER.size + len(payload)
    return entries


def _chunk_at(data: bytes, at: int) -> bytes | None:
    if len(data) - at < HEADER.size:
        return None
    magic, length, crc, head_crc = HEADER.unpack_from(data, at)
    if magic != MAGIC or zlib.crc32(data[at : at + 12]) != head_crc:
        return None
    payload = data[at + HEADER.size : at + HEADER.size + length]
    return payload if len(payload) == length and zlib.crc32(payload) == crc else None


def _good_chunk_after(data: bytes, start: int) -> bool:
    at = data.find(MAGIC, start)
    while at >= 0:
        if _chunk_at(data, at) is not None:
            return True
        at = data.find(MAGIC, at + 1)
    return False


def _batches(process_id: str, entries: list[dict]) -> list[tuple[str, list[dict]]]:
    records: list[dict] = []
    place: dict[str, int] = {}
    taken: dict[str, dict] = {}
    confirmed: set[str] = set()
    for entry in entries:
        if "r" in entry:
            record = entry["r"]
            record["ts"] = datetime.fromisoformat(record["ts"])
            place[record["_id"]] = len(records)
            records.append(record)
        elif "b" in entry:
            taken[entry["b"]] = entry
        elif "c" in entry:
            confirmed.add(entry["c"])
    out, assigned = [], set()
    for batch_id, mark in taken.items():
        # Records are trimmed only once confirmed: a batch whose first record is gone was confirmed (its own
        # confirmation may have been in a group whose write failed).
        if batch_id in confirmed or mark["f"] not in place:
            assigned.update(range(place.get(mark["f"], 0), place.get(mark["l"], -1) + 1))
            continue
        if mark["l"] not in place or place[mark["l"]] - place[mark["f"]] + 1 != mark["n"]:
            raise JournalCorrupt(f"batch {batch_id}: its {mark['n']} records are not in the journal")
        span = range(place[mark["f"]], place[mark["l"]] + 1)
        assigned.update(span)
        out.append((batch_id, [records[i] for i in span]))
    rest = [r for i, r in enumerate(records) if i not in assigned]
    for start in range(0, len(rest), REPLAY_BATCH):
        out.append((f"{process_id}-j{start // REPLAY_BATCH}", rest[start : start + REPLAY_BATCH]))
    return out
