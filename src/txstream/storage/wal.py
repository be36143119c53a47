"""The write-ahead log: append-only records, a checksum each, fsync settings.

File layout: an 8-byte magic ``TXWAL01`` and a newline, then records, each

    length (4 bytes, little endian) | CRC-32 of the payload (4 bytes) | payload

The payload is UTF-8 JSON.  Records are appended with one ``os.write`` call on
an unbuffered descriptor, so a record handed to :meth:`WriteAheadLog.append` is
in the operating system's hands when the call returns and survives the death of
the process; :meth:`WriteAheadLog.sync` additionally makes it survive a crash of
the machine, according to the ``sync`` setting:

* ``"commit"`` - every commit calls ``fsync`` itself;
* ``"group"`` - group commit: one committer (the leader) calls ``fsync`` for
  everything written so far while the others wait for it, so concurrent commits
  share one ``fsync``; ``group_delay`` seconds of waiting before the ``fsync``
  let more commits join a group;
* ``"off"`` - no ``fsync`` (safe against process crashes, not power loss).

:func:`read_log` scans a log, stopping at the first record that is torn (the
file ends inside it) or corrupt (checksum mismatch, bad JSON, impossible
length).  It then looks ahead for a good record further on: a bad record with
good ones after it is *damage* (a flipped bit, say in a length field), not a
torn tail, and :meth:`WriteAheadLog.open` refuses to cut it off unless asked to
(``on_damage="truncate"``); a bad record at the very end is a tail that a crash
cut short and is cut off.  Either way the bytes from the bad record on are
first copied beside the log as ``<log>.corrupt-<UTC time>-from-<offset>``, so
no good record is ever deleted without a copy, and new records are never
written after a bad one.

Faults while running (see ``docs/txn.md``, "Faults and recovery"):

* a failed write (a full disk, say) cuts the file back to the end of the last
  good record and raises :class:`LogWriteError`; the log stays usable;
* a failed ``fsync`` puts the log in a *failed* state, as PostgreSQL's PANIC
  does: records that no successful ``fsync`` covered are cut off, every
  committer waiting for them (group-commit followers too) gets
  :class:`StoreFailedError`, and so does every later append, until the store
  is reopened.  An ``fsync`` that succeeds after one failed is not trusted.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from txstream.storage.base import LogCorruptError, LogWriteError, StorageError, StoreFailedError

MAGIC: Final = b"TXWAL01\n"
HEADER: Final = struct.Struct("<II")
SYNC_MODES: Final = ("commit", "group", "off")
MAX_RECORD: Final = 1 << 30
DAMAGE_POLICIES: Final = ("stop", "truncate")

# The log calls the operating system through these names so that tests can
# inject faults (a full disk, an fsync that fails) into the log alone.
_write = os.write
_fsync = os.fsync


@dataclass
class LogScan:
    """What a scan of a log found.

    ``records`` are the decoded payloads of the good records in order; ``end``
    is the offset just after the last good one.  ``problem`` is ``None`` when
    the whole file was good, else a sentence saying where the scan stopped and
    why; ``corrupt`` tells a checksum or format failure from a torn tail.
    ``resume`` is the offset of the first good record found *after* the bad
    one (``None`` when none follows: the bad record is the tail) and
    ``following`` counts the good records from there on.
    """

    records: list[dict[str, Any]] = field(default_factory=list)
    end: int = len(MAGIC)
    size: int = 0
    problem: str | None = None
    corrupt: bool = False
    resume: int | None = None
    following: int = 0

    @property
    def damaged(self) -> bool:
        """True when good records follow a bad one (damage, not a torn tail)."""
        return self.resume is not None


def encode(payload: dict[str, Any]) -> bytes:
    """One record's bytes: header plus JSON payload."""
    body = json.dumps(payload, separators=(",", ":")).encode()
    return HEADER.pack(len(body), zlib.crc32(body)) + body


def record_at(data: bytes, pos: int) -> tuple[int, dict[str, Any] | None, str | None]:
    """Decode the record at ``pos``: (end offset, payload, problem).

    ``payload`` is ``None`` when there is no good record at ``pos``; ``problem``
    then says why, with ``end`` = -1 for a record the file ends inside.
    """
    n = len(data)
    if pos + HEADER.size > n:
        return -1, None, f"torn record header at byte {pos} (file ends at {n})"
    length, crc = HEADER.unpack_from(data, pos)
    start = pos + HEADER.size
    if length > MAX_RECORD:
        return pos, None, f"corrupt record at byte {pos}: impossible length {length}"
    if start + length > n:
        return (
            -1,
            None,
            (f"torn record at byte {pos}: needs {length} bytes, file ends after {n - start}"),
        )
    body = data[start : start + length]
    if zlib.crc32(body) != crc:
        return pos, None, f"corrupt record at byte {pos}: checksum mismatch"
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        return pos, None, f"corrupt record at byte {pos}: payload is not JSON"
    if not isinstance(payload, dict):
        return pos, None, f"corrupt record at byte {pos}: payload is not an object"
    return start + length, payload, None


def find_next_record(data: bytes, pos: int) -> int | None:
    """The offset of the first good record that starts after ``pos`` (``None`` if none).

    Payloads are JSON objects, so a record's body starts with ``{``: only
    offsets 8 bytes before a ``{`` can start one, and each candidate must pass
    its length and checksum.  A false match inside a payload would need a
    header there: ``json.dumps`` writes no byte below 32, and the length of a
    record under 16 MiB has a zero byte, so only a larger record could hold
    one, and its checksum would still have to match.
    """
    q = data.find(b"{", pos + 1 + HEADER.size)
    while q != -1:
        candidate = q - HEADER.size
        if record_at(data, candidate)[1] is not None:
            return candidate
        q = data.find(b"{", q + 1)
    return None


def iter_records(data: bytes, scan: LogScan) -> Iterator[dict[str, Any]]:
    """Decode records from ``data`` (the whole file), filling in ``scan`` as it goes."""
    pos = len(MAGIC)
    n = len(data)
    while pos < n:
        end, payload, problem = record_at(data, pos)
        if payload is None:
            scan.problem = problem
            scan.corrupt = end != -1
            resume = find_next_record(data, pos)
            if resume is not None:
                # Good records after the bad one: damage, not a torn tail.
                scan.corrupt = True
                scan.resume = resume
                at = resume
                while at < n:
                    at, good, _ = record_at(data, at)
                    if good is None:
                        break
                    scan.following += 1
                scan.problem = (
                    f"{problem}, yet {scan.following} good records follow from byte {resume}"
                )
            return
        pos = end
        scan.end = pos
        yield payload


def read_log(path: Path, data: bytes | None = None) -> LogScan:
    """Scan the log at ``path`` (whose bytes are ``data`` if given) without changing it."""
    scan = LogScan()
    if data is None:
        data = path.read_bytes()
    scan.size = len(data)
    if len(data) < len(MAGIC):
        if data and not MAGIC.startswith(data):
            raise LogCorruptError(f"{path} is not a txstream log (bad magic)")
        scan.end = len(data)
        return scan
    if not data.startswith(MAGIC):
        raise LogCorruptError(f"{path} is not a txstream log (bad magic)")
    scan.records = list(iter_records(data, scan))
    return scan


def sync_dir(path: Path) -> None:
    """``fsync`` a directory, so that renames and new files in it are durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        _fsync(fd)
    finally:
        os.close(fd)


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def save_tail(path: Path, data: bytes, offset: int) -> Path:
    """Copy ``data[offset:]`` beside ``path`` (once: an identical copy is reused)."""
    tail = data[offset:]
    for old in sorted(path.parent.glob(f"{path.name}.corrupt-*-from-{offset}")):
        if old.stat().st_size == len(tail) and old.read_bytes() == tail:
            return old
    side = path.with_name(f"{path.name}.corrupt-{_stamp()}-from-{offset}")
    tmp = side.with_name(side.name + ".tmp")
    with tmp.open("wb") as fh:
        fh.write(tail)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, side)
    return side


class WriteAheadLog:
    """An open log file that records are appended to.

    LSNs (the positions :meth:`append` returns) keep growing across
    :meth:`rotate`; ``_base`` maps them to file offsets (offset = LSN - base).
    """

    def __init__(self, path: Path, sync: str = "commit", group_delay: float = 0.0) -> None:
        if sync not in SYNC_MODES:
            raise StorageError(f"unknown sync setting {sync!r}; choose one of: commit, group, off")
        self.path = path
        self.sync_mode = sync
        self.group_delay = group_delay
        self._fd = -1
        self._lock = threading.Lock()
        self._cv = threading.Condition(threading.Lock())
        self._written = 0
        self._synced = 0
        self._base = 0
        self._syncing = False
        self.fsyncs = 0
        # Set once an fsync failed: why, and the LSN up to which records were
        # covered by fsyncs that succeeded before it (the rest is cut off).
        self.failed: str | None = None
        self._cut = 0
        self._cut_done = False

    @classmethod
    def open(
        cls,
        path: Path,
        sync: str = "commit",
        group_delay: float = 0.0,
        on_damage: str = "stop",
    ) -> tuple[WriteAheadLog, LogScan]:
        """Open (or create) the log, scan it, deal with a bad tail; return log and scan.

        A torn or corrupt *tail* is copied aside (see :func:`save_tail`) and cut
        off.  A bad record with good records after it is damage: with
        ``on_damage="stop"`` (the default) the log is left as it is and
        :class:`LogCorruptError` names the offset and the copy; with
        ``"truncate"`` the log is cut at the bad record after the copy is made,
        and the scan's ``problem`` says so.
        """
        if on_damage not in DAMAGE_POLICIES:
            raise StorageError(
                f"unknown on_damage {on_damage!r}; choose one of: {', '.join(DAMAGE_POLICIES)}"
            )
        log = cls(path, sync, group_delay)
        path.parent.mkdir(parents=True, exist_ok=True)
        # A rotation cut short by a crash (see rotate) may leave its new file.
        path.with_name(path.name + ".new").unlink(missing_ok=True)
        scan = LogScan()
        data = b""
        if path.exists():
            data = path.read_bytes()
            scan = read_log(path, data)
        if scan.problem is not None:
            side = save_tail(path, data, scan.end)
            if scan.damaged and on_damage == "stop":
                raise LogCorruptError(
                    f"{path} is damaged: {scan.problem}; recovery stopped and changed nothing "
                    f"(a copy of the bytes from {scan.end} on is in {side.name}); restore the "
                    "store from a backup, or open it with on_damage='truncate' to keep only the "
                    f"records before byte {scan.end} and lose the {scan.following} after it"
                )
            scan.problem += f"; the bytes from {scan.end} on were copied to {side.name} and cut off"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if scan.size < len(MAGIC):
                os.ftruncate(fd, 0)
                os.write(fd, MAGIC)
                os.fsync(fd)
                scan.end = len(MAGIC)
            elif scan.problem is not None:
                os.ftruncate(fd, scan.end)
                os.fsync(fd)
            os.lseek(fd, scan.end, os.SEEK_SET)
        except BaseException:
            os.close(fd)
            raise
        log._fd = fd
        log._written = log._synced = scan.end
        return log, scan

    def _refused(self) -> StoreFailedError:
        return StoreFailedError(
            f"the store refuses commits: {self.failed}; close it and open it again "
            "(recovery keeps exactly the acknowledged commits)"
        )

    def _not_committed(self) -> StoreFailedError:
        return StoreFailedError(
            f"commit failed and was not made durable: {self.failed}; every later commit is "
            "refused until the store is closed and opened again"
        )

    def append(self, payload: dict[str, Any]) -> int:
        """Write one record; return the log position after it (its LSN).

        If the write fails the file is cut back to where the record began and
        :class:`LogWriteError` is raised (:class:`StoreFailedError` if even the
        cut fails, or the log had already failed).
        """
        data = encode(payload)
        with self._lock:
            if self._fd < 0:
                raise StorageError(f"log {self.path} is closed")
            if self.failed is not None:
                raise self._refused()
            start = self._written
            view = memoryview(data)
            try:
                while view:
                    written = _write(self._fd, view)
                    if written <= 0:
                        raise OSError(f"write returned {written}")
                    view = view[written:]
            except OSError as exc:
                self._cut_back(start, exc)
            self._written += len(data)
            return self._written

    def _cut_back(self, lsn: int, exc: OSError) -> None:
        """After a failed write: truncate the file to ``lsn`` and raise (``_lock`` held)."""
        offset = lsn - self._base
        reason = exc.strerror or str(exc)
        try:
            os.ftruncate(self._fd, offset)
            os.lseek(self._fd, offset, os.SEEK_SET)
        except OSError as cut:
            with self._cv:
                if self.failed is None:
                    self.failed = (
                        f"writing to {self.path} failed ({reason}) and cutting the partial "
                        f"record off at byte {offset} failed too ({cut.strerror or cut})"
                    )
                    self._cut = self._synced
                    self._cut_done = True
                self._cv.notify_all()
            raise self._refused() from None
        raise LogWriteError(
            f"cannot write to {self.path}: {reason}; nothing of this commit was logged (the log "
            f"was cut back to its last good record, byte {offset}) and it was rolled back; "
            "free space and commit again"
        ) from None

    def _fsync_failed(self, exc: OSError) -> None:
        """Enter the failed state (``_cv`` held); the cut itself is :meth:`_cut_unsynced`."""
        if self.failed is None:
            self.failed = f"fsync of {self.path} failed ({exc.strerror or exc})"
            self._cut = self._synced
        self._cv.notify_all()

    def _cut_unsynced(self) -> None:
        """Cut off the records no successful fsync covered (no lock held on entry)."""
        with self._lock:
            if self._cut_done or self._fd < 0:
                return
            self._cut_done = True
            offset = self._cut - self._base
            try:
                os.ftruncate(self._fd, offset)
            except OSError as again:
                note = (
                    f"cutting off the records after byte {offset} failed too "
                    f"({again.strerror or again}): commits that raised may reappear on reopen"
                )
            else:
                note = f"the records after byte {offset}, which no fsync covered, were cut off"
                try:
                    _fsync(self._fd)
                except OSError as again:
                    note += (
                        f" (but flushing the cut failed too, {again.strerror or again}: after "
                        "a machine crash, commits that raised may reappear)"
                    )
            self.failed = f"{self.failed}; {note}"

    def sync(self, lsn: int) -> None:
        """Make everything up to ``lsn`` durable as the ``sync`` setting asks.

        Raises :class:`StoreFailedError` if an ``fsync`` failed before ``lsn``
        was covered by one that succeeded; the log has then failed.
        """
        mode = self.sync_mode
        if mode == "off":
            return
        cv = self._cv
        if mode == "commit":
            if self.failed is None:
                target = self._written
                try:
                    _fsync(self._fd)
                except OSError as exc:
                    with cv:
                        self._fsync_failed(exc)
                    self._cut_unsynced()
                with cv:
                    # An fsync that returns after another one failed is not
                    # trusted: the kernel may have dropped the failed pages.
                    if self.failed is None:
                        self.fsyncs += 1
                        if target > self._synced:
                            self._synced = target
                        return
            if lsn <= self._cut:
                return
            raise self._not_committed()
        with cv:
            while self._synced < lsn:
                if self.failed is not None:
                    if lsn <= self._cut:
                        return
                    break
                if self._syncing:
                    cv.wait()
                    continue
                self._syncing = True
                cv.release()
                error: OSError | None = None
                try:
                    if self.group_delay:
                        time.sleep(self.group_delay)
                    target = self._written
                    try:
                        _fsync(self._fd)
                    except OSError as exc:
                        error = exc
                finally:
                    cv.acquire()
                    self._syncing = False
                if error is not None:
                    self._fsync_failed(error)
                    break
                if self.failed is None:
                    self.fsyncs += 1
                    self._synced = max(self._synced, target)
                cv.notify_all()
            else:
                return
        self._cut_unsynced()
        raise self._not_committed()

    def rotate(self, prev: Path) -> None:
        """Start an empty log, keeping the current one as ``prev`` (after a checkpoint).

        The new file is written aside (magic, ``fsync``) and renamed into
        place after the current one was renamed to ``prev``; a crash in between
        leaves no ``wal.log``, which reads as an empty log (the checkpoint holds
        everything).  ``dup2`` moves the new file onto the same descriptor, so
        a group-commit leader in ``fsync`` at this moment is not disturbed.
        LSNs keep growing, so committers still waiting in :meth:`sync` for a
        record written before the rotation return at once: the checkpoint made
        it durable.  Any error fails the log (commits are refused until reopen).
        """
        with self._lock:
            if self._fd < 0:
                raise StorageError(f"log {self.path} is closed")
            if self.failed is not None:
                raise self._refused()
            new = self.path.with_name(self.path.name + ".new")
            try:
                fd = os.open(new, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    os.write(fd, MAGIC)
                    _fsync(fd)
                    os.replace(self.path, prev)
                    os.replace(new, self.path)
                    sync_dir(self.path.parent)
                    os.dup2(fd, self._fd, inheritable=False)
                finally:
                    os.close(fd)
                os.lseek(self._fd, len(MAGIC), os.SEEK_SET)
            except OSError as exc:
                with self._cv:
                    # The checkpoint holds every record, so nothing needs cutting.
                    self._synced = max(self._synced, self._written)
                    self._fsync_failed(exc)
                    self._cut_done = True
                raise self._refused() from None
            self._base = self._written - len(MAGIC)
        with self._cv:
            self._synced = max(self._synced, self._written)
            self._cv.notify_all()

    def close(self) -> None:
        """Flush to disk and close the file (a failed log is closed without a flush)."""
        with self._lock:
            if self._fd < 0:
                return
            fd = self._fd
            self._fd = -1
            try:
                if self.sync_mode != "off" and self.failed is None:
                    _fsync(fd)
            except OSError as exc:
                with self._cv:
                    self._fsync_failed(exc)
                raise StoreFailedError(
                    f"closing {self.path}: {self.failed}; records since the last commit "
                    "acknowledged with sync='commit' or 'group' may be lost"
                ) from None
            finally:
                os.close(fd)
