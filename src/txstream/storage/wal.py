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
file ends inside it) or corrupt (checksum mismatch, bad JSON); it reports where
and why, and :meth:`WriteAheadLog.open` cuts such a tail off - saving it beside
the log as ``<log>.corrupt-<offset>`` - so that new records are never written
after a bad one.
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

from txstream.storage.base import LogCorruptError, StorageError

MAGIC: Final = b"TXWAL01\n"
HEADER: Final = struct.Struct("<II")
SYNC_MODES: Final = ("commit", "group", "off")
MAX_RECORD: Final = 1 << 30


@dataclass
class LogScan:
    """What a scan of a log found.

    ``records`` are the decoded payloads of the good records in order; ``end``
    is the offset just after the last good one.  ``problem`` is ``None`` when
    the whole file was good, else a sentence saying where the scan stopped and
    why; ``corrupt`` tells a checksum or format failure from a torn tail.
    """

    records: list[dict[str, Any]] = field(default_factory=list)
    end: int = len(MAGIC)
    size: int = 0
    problem: str | None = None
    corrupt: bool = False


def encode(payload: dict[str, Any]) -> bytes:
    """One record's bytes: header plus JSON payload."""
    body = json.dumps(payload, separators=(",", ":")).encode()
    return HEADER.pack(len(body), zlib.crc32(body)) + body


def iter_records(data: bytes, scan: LogScan) -> Iterator[dict[str, Any]]:
    """Decode records from ``data`` (the whole file), filling in ``scan`` as it goes."""
    pos = len(MAGIC)
    n = len(data)
    while pos < n:
        if pos + HEADER.size > n:
            scan.problem = f"torn record header at byte {pos} (file ends at {n})"
            return
        length, crc = HEADER.unpack_from(data, pos)
        start = pos + HEADER.size
        if length > MAX_RECORD:
            scan.problem = f"corrupt record at byte {pos}: impossible length {length}"
            scan.corrupt = True
            return
        if start + length > n:
            scan.problem = (
                f"torn record at byte {pos}: needs {length} bytes, file ends after {n - start}"
            )
            return
        body = data[start : start + length]
        if zlib.crc32(body) != crc:
            scan.problem = f"corrupt record at byte {pos}: checksum mismatch"
            scan.corrupt = True
            return
        try:
            payload = json.loads(body)
        except ValueError:
            scan.problem = f"corrupt record at byte {pos}: payload is not JSON"
            scan.corrupt = True
            return
        if not isinstance(payload, dict):
            scan.problem = f"corrupt record at byte {pos}: payload is not an object"
            scan.corrupt = True
            return
        pos = start + length
        scan.end = pos
        yield payload


def read_log(path: Path) -> LogScan:
    """Scan the log at ``path`` without changing it."""
    scan = LogScan()
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


class WriteAheadLog:
    """An open log file that records are appended to."""

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
        self._syncing = False
        self.fsyncs = 0

    @classmethod
    def open(
        cls, path: Path, sync: str = "commit", group_delay: float = 0.0
    ) -> tuple[WriteAheadLog, LogScan]:
        """Open (or create) the log, scan it, cut off a bad tail; return log and scan."""
        log = cls(path, sync, group_delay)
        path.parent.mkdir(parents=True, exist_ok=True)
        scan = read_log(path) if path.exists() else LogScan()
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if scan.size < len(MAGIC):
                os.ftruncate(fd, 0)
                os.write(fd, MAGIC)
                os.fsync(fd)
                scan.end = len(MAGIC)
            elif scan.problem is not None:
                if scan.corrupt:
                    with path.open("rb") as fh:
                        fh.seek(scan.end)
                        tail = fh.read()
                    side = path.with_name(f"{path.name}.corrupt-{scan.end}")
                    side.write_bytes(tail)
                    scan.problem += f"; the bytes from {scan.end} on were moved to {side.name}"
                os.ftruncate(fd, scan.end)
                os.fsync(fd)
            os.lseek(fd, scan.end, os.SEEK_SET)
        except BaseException:
            os.close(fd)
            raise
        log._fd = fd
        log._written = log._synced = scan.end
        return log, scan

    def append(self, payload: dict[str, Any]) -> int:
        """Write one record; return the log position after it (its LSN)."""
        data = encode(payload)
        with self._lock:
            if self._fd < 0:
                raise StorageError(f"log {self.path} is closed")
            view = memoryview(data)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
            self._written += len(data)
            return self._written

    def sync(self, lsn: int) -> None:
        """Make everything up to ``lsn`` durable as the ``sync`` setting asks."""
        mode = self.sync_mode
        if mode == "off":
            return
        if mode == "commit":
            os.fsync(self._fd)
            self.fsyncs += 1
            return
        cv = self._cv
        with cv:
            while self._synced < lsn:
                if self._syncing:
                    cv.wait()
                    continue
                self._syncing = True
                cv.release()
                try:
                    if self.group_delay:
                        time.sleep(self.group_delay)
                    target = self._written
                    os.fsync(self._fd)
                    self.fsyncs += 1
                finally:
                    cv.acquire()
                    self._syncing = False
                self._synced = max(self._synced, target)
                cv.notify_all()

    def reset(self) -> None:
        """Empty the log (after a checkpoint holds everything in it).

        LSNs keep growing, so committers still waiting in :meth:`sync` for a
        record written before the reset return at once: the checkpoint made it
        durable.
        """
        with self._lock:
            if self._fd < 0:
                raise StorageError(f"log {self.path} is closed")
            os.ftruncate(self._fd, len(MAGIC))
            os.lseek(self._fd, len(MAGIC), os.SEEK_SET)
            os.fsync(self._fd)
        with self._cv:
            self._synced = max(self._synced, self._written)
            self._cv.notify_all()

    def close(self) -> None:
        """Flush to disk and close the file."""
        with self._lock:
            if self._fd >= 0:
                if self.sync_mode != "off":
                    os.fsync(self._fd)
                os.close(self._fd)
                self._fd = -1
