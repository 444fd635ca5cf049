"""The usage journal: each gateway process's local write-ahead log of its usage records, so that no answered call
goes unbilled whatever kills the process (docs/architecture.md, *Durability*).

A data call's record is appended here and its answer leaves only once the group holding it is on disk: one
synchronous write (O_DSYNC), made by a thread of the journal's own, serves every record appended meanwhile (group
commit). A group begun while the writer is idle closes JOURNAL_GROUP_MS after its first entry, one begun while it
writes closes as soon as it is free, and any closes at JOURNAL_GROUP_RECORDS entries. The event loop never blocks on
the disk: it hands a closed group to the thread and awaits one future per group, which the thread's one wake-up
per group resolves.

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


class _Group:
    __slots__ = ("lines", "future", "records", "counts")

    def __init__(self, future: asyncio.Future):
        self.lines: list[bytes] = []
        self.future = future
        self.records = 0
        self.counts = (0, 0, 0, 0)  # records, batches taken, records and batches confirmed: as of its closing


class Journal:
    """The journal of this process. `append` and the batch marks return the future of their group; `observe`
    is told (fsync seconds, records in the group) of each group written."""

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
        # The writer: a thread of its own taking (loop, callback, function, arguments) jobs, each answered with
        # call_soon_threadsafe (half the CPU of run_in_executor's futures per group).
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._writer = threading.Thread(target=self._work, name="journal", daemon=True)
        self._lock_fd = -1
        self._fd = -1  # the open segment (writer thread only)
        self._open_segment = 0  # its number (writer thread only)
        self._end = 0  # its size: where a failed write is cut back to (writer thread only)
        self._segment = 1  # the segment the next group goes to (loop)
        self._segment_bytes = 0
        self._closed: list[tuple[int, tuple[int, int]]] = []  # closed segments: (number, (records, batches) to its end)
        self._upto = (0, 0)  # (records, batches) appended up to the last group given to the open segment
        self._group: _Group | None = None  # gathering
        self._queue: list[_Group] = []  # closed, waiting for the writer
        self._busy = False
        self._timer: asyncio.TimerHandle | None = None
        # Appended so far: records, batches taken; confirmed: records and batches the database holds.
        self._records = self._batches = self._confirmed_records = self._confirmed_batches = 0
        self._durable = (0, 0, 0, 0)  # the same four counts as of the last group on disk
        self._drained: asyncio.Future | None = None  # close() waits on it for the last group
        self.failures = 0

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
        """Waits for every group; then `remove` (everything confirmed) deletes the journal, or it is left for the
        next start to replay (a stop with the database away); the lock is let go either way."""
        loop = asyncio.get_running_loop()
        self._close_group()
        while self._busy or self._queue:
            self._drained = loop.create_future()
            await self._drained
        shut = loop.create_future()
        self._jobs.put(
            (loop, lambda _, exc: shut.set_exception(exc) if exc else shut.set_result(None), self._shut, (remove,))
        )
        self._jobs.put(None)
        await shut

    def _work(self) -> None:
        """The writer thread."""
        while (job := self._jobs.get()) is not None:
            loop, answer, function, arguments = job
            try:
                result, exc = function(*arguments), None
            except Exception as error:
                result, exc = None, error
            try:
                loop.call_soon_threadsafe(answer, result, exc)
            except RuntimeError:  # the loop is closed: no one waits any more
                return

    def _shut(self, remove: bool) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if remove:
            for name in os.listdir(self.path):
                os.remove(os.path.join(self.path, name))
            os.rmdir(self.path)
        os.close(self._lock_fd)  # the lock goes with it
        self._lock_fd = -1

    # --- appending -------------------------------------------------------------------------------------------
    def append(self, record: dict) -> asyncio.Future:
        """A usage record (any fields: the whole dict is kept); the future of the group holding it."""
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
        group = self._group
        if group is None:
            group = self._group = _Group(asyncio.get_running_loop().create_future())
            if not self._busy:  # the writer is idle: this group goes after JOURNAL_GROUP_MS
                self._timer = asyncio.get_running_loop().call_later(self.group_seconds, self._close_group)
        group.lines.append(line)
        group.records += records
        if group.records >= self.group_records:
            self._close_group()
        return group.future

    def _close_group(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        group, self._group = self._group, None
        if group is not None:
            group.counts = (self._records, self._batches, self._confirmed_records, self._confirmed_batches)
            self._queue.append(group)
        self._next()

    def _next(self) -> None:
        if self._busy or not self._queue:
            return
        group = self._queue.pop(0)
        data = chunk(b"\n".join(group.lines))
        if self._segment_bytes and self._segment_bytes + len(data) > SEGMENT_BYTES:
            self._closed.append((self._segment, self._upto))
            self._segment += 1
            self._segment_bytes = 0
        self._segment_bytes += len(data)
        self._upto = group.counts[:2]
        deletable = self._deletable()
        self._busy = True
        answer = lambda seconds, exc: self._written(group, seconds, exc)  # noqa: E731
        self._jobs.put((asyncio.get_running_loop(), answer, self._write, (self._segment, data, deletable)))

    def _deletable(self) -> list[int]:
        """Closed segments whose records and batches the database holds, as of what is on disk."""
        _, _, records, batches = self._durable
        gone = [n for n, (in_records, in_batches) in self._closed if in_records <= records and in_batches <= batches]
        self._closed = [(n, upto) for n, upto in self._closed if n not in gone]
        return gone

    def _write(self, segment: int, data: bytes, deletable: list[int]) -> float:
        """In the writer thread: one synchronous write (O_DSYNC: the write and its fdatasync in one system call, so
        one release of the GIL instead of two); the seconds it took."""
        if segment != self._open_segment:
            if self._fd >= 0:
                os.close(self._fd)
            name = os.path.join(self.path, f"{segment:08d}.log")
            self._fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_DSYNC, 0o600)
            self._open_segment, self._end = segment, 0
            _fsync_dir(self.path)
        started = time.perf_counter()
        try:
            if os.write(self._fd, data) != len(data):  # a full disk takes what fits
                raise OSError(errno.ENOSPC, "short write to the usage journal")
        except OSError:
            # Cut back to the last whole group: a broken chunk with whole ones after it would read as corruption.
            # The next group goes to a new segment (_written).
            try:
                os.ftruncate(self._fd, self._end)
                os.fdatasync(self._fd)
            finally:
                os.close(self._fd)
                self._fd, self._open_segment = -1, 0
            raise
        seconds = time.perf_counter() - started
        self._end += len(data)
        for number in deletable:
            with contextlib.suppress(FileNotFoundError):  # a segment whose first write failed may not exist
                os.remove(os.path.join(self.path, f"{number:08d}.log"))
        if deletable:
            _fsync_dir(self.path)
        return seconds

    def _written(self, group: _Group, seconds: float | None, exc: Exception | None) -> None:
        self._busy = False
        if exc is None:
            self._durable = group.counts
            self.observe(seconds, group.records)
            group.future.set_result(None)
        else:
            # The records stay in memory and are flushed as ever; what is lost is only their protection
            # against a crash. Logged and counted (gateway_journal_failures).
            self.failures += 1
            self._closed.append((self._segment, self._upto))
            self._segment, self._segment_bytes = self._segment + 1, 0
            log.error("usage journal write failed (%s): %d records not protected against a crash", exc, group.records)
            group.future.set_exception(exc)
            group.future.exception()  # retrieved: waiters that give up on it need not
        if self._group is not None and not self._queue:
            self._close_group()  # gathered while the writer was busy: written at once
        else:
            self._next()
        if not self._busy and self._drained is not None and not self._drained.done():
            self._drained.set_result(None)


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
        return _batches(self.process_id, read(self.path))

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


def read(path: str) -> list[dict]:
    """Every entry of the journal at `path`, in order, up to a torn write at its end; JournalCorrupt."""
    segments = sorted(n for n in os.listdir(path) if n.endswith(".log"))
    entries: list[dict] = []
    for i, name in enumerate(segments):
        with open(os.path.join(path, name), "rb") as fh:
            entries.extend(_entries(fh.read(), last=i == len(segments) - 1, name=name))
    return entries


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
