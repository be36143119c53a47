"""The storage manager: a catalog of tables and streams, source offsets, durability.

A :class:`Store` owns the tables and streams of one database.  Without a
``path`` it lives in memory only.  With one, it keeps a write-ahead log
(``<path>/wal.log``, see :mod:`txstream.storage.wal`) and *recovers on open*:

* definitions of tables and streams are logged when they are created, so a
  reopened store knows them again;
* each committed transaction is one *redo* record - the final rows it wrote,
  the events it appended (with their ids) and the stream-source offsets it
  consumed up to - written before the transaction's effects become visible.
  Replaying the records in order rebuilds exactly the committed state;
  transactions that had not committed never reached the log and vanish;
* because a source's offset is in the same record as the effects of the events
  it consumed, after a crash a consumer resumes from :meth:`Store.offset` and
  no event is processed twice or lost.

A store directory has **one owner**: opening takes an exclusive ``flock`` on
``<path>/LOCK`` (which holds the owner's pid and host) before anything is read
or written, and a second opener - another process or another :class:`Store`
in this one - gets :class:`StoreLockedError` naming the owner.  :meth:`close`
releases it (so does the death of the process).

A bad record at the end of the log (torn by a crash, or failing its checksum)
stops recovery at the last good record; the store says so in
:attr:`Store.recovery` (and logs a warning), copies the bad tail aside and cuts
it off so no new record follows it.  A bad record with good records after it
is damage, not a crash: recovery stops with :class:`LogCorruptError` and
changes nothing, unless the store is opened with ``on_damage="truncate"``.

Checkpoints carry a format version, their length and a CRC-32 of their
contents.  One generation is kept (``checkpoint.prev.json`` and the log since
it, ``wal.prev.log``): a damaged or malformed newest checkpoint is replaced by
the older one plus both logs, if those hold every commit in between; otherwise
recovery stops with :class:`CheckpointCorruptError` and loads nothing.

Durable rows, keys and events must be JSON values; keys that were tuples come
back as tuples, other tuples come back as lists.  A value JSON would change
(a mapping key that is not a string: ``{3: "x"}`` would come back as
``{"3": "x"}``) or nest deeper than :data:`MAX_NESTING` is refused at commit
with :class:`StorageError`, instead of coming back different after a restart.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import socket
import threading
import weakref
import zlib
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from txstream.errors import UnknownNameError
from txstream.storage.base import (
    ABSENT,
    CheckpointCorruptError,
    StorageError,
    StoreFailedError,
    StoreLockedError,
)
from txstream.storage.stream import GRANULARITIES, OrderBy, Stream
from txstream.storage.table import Table
from txstream.storage.wal import (
    DAMAGE_POLICIES,
    SYNC_MODES,
    LogScan,
    WriteAheadLog,
    read_log,
    save_tail,
    sync_dir,
)

CHECKPOINT_VERSION: Final = 2
_CHECKPOINT_HEAD: Final = re.compile(
    rb'\{"format":"txstream-checkpoint","version":(\d{1,9}),"length":(\d{1,15}),'
    rb'"crc32":(\d{1,10}),"state":'
)
# Replaying event ids with gaps creates holes (aborted appends); a damaged or
# crafted id far beyond the stream's end would allocate a hole per missing id.
# Recovery allows this many holes plus 8 per event it places.
HOLE_ALLOWANCE: Final = 1 << 20

MAX_NESTING: Final = 200
"""Deepest nesting of lists, tuples and mappings in a durable row, key, event or offset.

JSON encoders and decoders recurse once per level: a commit of a value near
the interpreter's recursion limit could be logged and checkpointed, and then
not be read back at recovery.  Far below that limit, it leaves room for the
levels the log record and the checkpoint add around a value.
"""

log = logging.getLogger("txstream.storage")

RowChange = tuple[Table, Hashable, Any]
EventChange = tuple[Stream, int, Any]


@dataclass
class RecoveryReport:
    """What recovery found in the log when a durable store was opened."""

    path: str
    records: int = 0
    transactions: int = 0
    last_ts: int = 0
    problem: str | None = None
    corrupt: bool = False
    checkpoint: str | None = None
    checkpoint_problem: str | None = None

    @property
    def clean(self) -> bool:
        """True when every byte of the log was a good record and the checkpoint was good."""
        return self.problem is None and self.checkpoint_problem is None

    def __str__(self) -> str:
        text = (
            f"recovered {self.transactions} committed transactions from {self.records} "
            f"records of {self.path}"
        )
        if self.checkpoint:
            text += f" after {self.checkpoint}"
        if self.checkpoint_problem:
            text += f"; {self.checkpoint_problem}"
        if self.problem:
            text += f"; stopped at the last good record: {self.problem}"
        return text


def _key(value: Any) -> Hashable:
    """Turn a key read back from JSON into a hashable key (lists become tuples)."""
    if isinstance(value, list):
        return tuple(_key(v) for v in value)
    if isinstance(value, dict):
        raise StorageError(f"log holds an unhashable key {value!r}")
    result: Hashable = value
    return result


_SCALARS: Final = frozenset({str, int, float, bool, type(None)})


def check_loggable(value: Any, what: str, *args: Any) -> None:
    """Raise :class:`StorageError` unless ``value`` reads back from JSON as it is.

    Mapping keys must be strings (JSON turns 3, 1.5, True and None into
    "3", "1.5", "true" and "null") and the nesting is at most
    :data:`MAX_NESTING` levels.  Tuples are allowed (they come back as lists;
    table keys as tuples).  Types JSON cannot encode at all are left to the
    encoder, which names them.  One pass, level by level.  The error names
    ``what.format(*args)``, formatted only then: this runs for every row of
    every durable commit.
    """
    scalars = _SCALARS
    if type(value) in scalars:
        return
    if type(value) is dict:  # the common row: flat, string keys
        for key, child in value.items():
            if type(key) is not str or type(child) not in scalars:
                break
        else:
            return
    level = [value]
    depth = 0
    while level:
        below: list[Any] = []
        for item in level:
            if isinstance(item, dict):
                for key in item:
                    if type(key) is not str and not isinstance(key, str):
                        _bad_key(key, what.format(*args))
                children: Any = item.values()
            elif isinstance(item, list | tuple):
                children = item
            else:
                continue
            if depth >= MAX_NESTING:
                raise StorageError(
                    f"cannot log {what.format(*args)}: it is nested more than "
                    f"{MAX_NESTING} levels deep"
                )
            for child in children:
                if type(child) not in scalars:
                    below.append(child)
        level = below
        depth += 1


def _bad_key(key: Any, what: str) -> None:
    back = (
        f"JSON would bring it back as {json.dumps(key)!r}"
        if type(key) in _SCALARS
        else "JSON cannot write it"
    )
    raise StorageError(
        f"cannot log {what}: mapping key {key!r} ({type(key).__name__}) is not a string; "
        f"{back} (use string keys)"
    )


def _directory(path: Any) -> Path | None:
    """The store directory named by ``path`` (``None``: in memory); one line if it names none."""
    if path is None:
        return None
    if not isinstance(path, str | os.PathLike) or isinstance(path, bytes):
        raise StorageError(
            f"a store path is a folder name (str or path), not {type(path).__name__} {path!r}"
        )
    text = os.fspath(path)
    if not isinstance(text, str) or not text.strip():
        # Path("") is the current folder: a durable store would appear there unasked.
        raise StorageError(
            f"an empty store path {text!r}; name a folder, or give path=None for a store in memory"
        )
    return Path(text)


def _unlock(fd: int) -> None:
    """Release the directory lock and close its descriptor.

    The explicit ``LOCK_UN`` matters: a child forked while the store was open
    shares the descriptor, and closing ours alone would leave the lock held.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class Store:
    """Tables, streams and source offsets, optionally durable in a directory.

    ``on_damage``: what recovery does with a bad log record that has good
    records after it - ``"stop"`` (raise :class:`LogCorruptError`, change
    nothing) or ``"truncate"`` (cut the log there after copying the rest aside).
    """

    def __init__(
        self,
        path: str | Path | None = None,
        sync: str = "commit",
        group_delay: float = 0.0,
        on_damage: str = "stop",
    ) -> None:
        self.tables: dict[str, Table] = {}
        self.streams: dict[str, Stream] = {}
        self.offsets: dict[str, Any] = {}
        self.last_ts = 0
        self.path = _directory(path)
        self.wal: WriteAheadLog | None = None
        self.closed = False  # a durable store after close(): changes are refused
        self.recovery: RecoveryReport | None = None
        self._catalog = threading.Lock()
        self._lock_fd = -1
        self._unlock: weakref.finalize[Any, Store] | None = None
        self._holes = HOLE_ALLOWANCE
        self._checkpoint_damaged = False
        self._fallback_reason = ""
        if sync not in SYNC_MODES:
            raise StorageError(f"unknown sync setting {sync!r}; choose one of: commit, group, off")
        if on_damage not in DAMAGE_POLICIES:
            raise StorageError(
                f"unknown on_damage {on_damage!r}; choose one of: {', '.join(DAMAGE_POLICIES)}"
            )
        if self.path is not None:
            self._take_ownership(self.path)
            try:
                self._open(self.path, sync, group_delay, on_damage)
            except BaseException:
                self._release_ownership()
                raise

    # -- catalog ---------------------------------------------------------------------

    def table(self, name: str) -> Table:
        """The table called ``name``, created (and logged) if new."""
        table = self.tables.get(name)
        if table is None:
            with self._catalog:
                if name in self.tables:
                    return self.tables[name]
                table = Table(name)
                if name in self.streams:
                    raise StorageError(f"{name} is already a stream")
                self._define({"def": "table", "name": name})
                self.tables[name] = table
        return table

    def stream(
        self,
        name: str,
        order_by: OrderBy = None,
        require_order: bool = False,
        granularity: str = "stream",
        range_size: int = 64,
    ) -> Stream:
        """The stream called ``name``, created (and logged) if new.

        Settings given for an existing stream must match its own.
        """
        stream = self.streams.get(name)
        if stream is not None:
            wanted = Stream(name, order_by, require_order, granularity, range_size)
            if order_by is not None and stream.order_by is None:
                stream.order_by = order_by  # a function cannot be logged; re-attached here
            if wanted.describe() != stream.describe() and (
                order_by is not None or granularity != "stream" or require_order
            ):
                raise StorageError(
                    f"stream {name} exists with settings {stream.describe()}, not "
                    f"{wanted.describe()}"
                )
            return stream
        if name in self.tables:
            raise StorageError(f"{name} is already a table")
        stream = Stream(name, order_by, require_order, granularity, range_size)
        if (
            self.wal is not None
            and stream.order_by is not None
            and stream.describe()["order_by"] is None
        ):
            log.info(
                "stream %s orders by a function; it is not logged, pass it again on open", name
            )
        with self._catalog:
            if name in self.streams:
                return self.streams[name]
            self._define({"def": "stream", "name": name, **stream.describe()})
            self.streams[name] = stream
        return stream

    def get_table(self, name: str) -> Table:
        """An existing table; :class:`UnknownNameError` if there is none."""
        try:
            return self.tables[name]
        except KeyError:
            raise UnknownNameError("table", str(name), list(self.tables)) from None

    def get_stream(self, name: str) -> Stream:
        """An existing stream; :class:`UnknownNameError` if there is none."""
        try:
            return self.streams[name]
        except KeyError:
            raise UnknownNameError("stream", str(name), list(self.streams)) from None

    def offset(self, source: str, default: Any = None) -> Any:
        """The committed offset of stream source ``source`` (``default`` if none yet)."""
        return self.offsets.get(source, default)

    # -- durability ---------------------------------------------------------------

    @property
    def durable(self) -> bool:
        """True when the store writes a log."""
        return self.wal is not None

    def log_commit(
        self,
        ts: int,
        rows: list[RowChange],
        events: list[EventChange],
        offsets: dict[str, Any] | None,
    ) -> int:
        """Write the redo record of a commit at ``ts``; return its LSN (0 when in memory).

        ``rows`` holds final rows (or :data:`ABSENT` for deleted ones).  Raises
        :class:`StorageError` if a value cannot be logged; nothing is written then.
        """
        wal = self.wal
        if wal is None:
            if offsets:
                self.offsets.update(offsets)
            return 0
        if self.closed:
            if not (rows or events or offsets):
                return 0  # a reader: nothing to make durable
            raise self._closed_error("commit")
        payload: dict[str, Any] = {"ts": ts}
        for table, key, value in rows:
            check_loggable(key, "a key of table {}", table.name)
            if value is not ABSENT:
                check_loggable(value, "row {!r} of table {}", key, table.name)
        for stream, _, event in events:
            check_loggable(event, "an event of stream {}", stream.name)
        if offsets:
            check_loggable(offsets, "the source offsets")
        if rows:
            payload["rows"] = [[t.name, k] if v is ABSENT else [t.name, k, v] for t, k, v in rows]
        if events:
            payload["events"] = [[s.name, i, e] for s, i, e in events]
        if offsets:
            payload["offsets"] = offsets
        try:
            lsn = wal.append(payload)
        except (TypeError, ValueError, RecursionError) as exc:
            raise StorageError(f"cannot log the transaction's data as JSON: {exc}") from None
        if offsets:
            self.offsets.update(offsets)
        return lsn

    def sync(self, lsn: int) -> None:
        """Make the log durable up to ``lsn`` (per the store's sync setting)."""
        if self.wal is not None and lsn:
            self.wal.sync(lsn)

    def checkpoint(self, ts: int) -> int:
        """Write the committed state as of ``ts`` to ``checkpoint.json``; start a new log.

        The caller must keep commits out while this runs (the transaction manager
        holds its commit mutex).  The file is written beside the log and flushed;
        the current checkpoint becomes ``checkpoint.prev.json``, the new one is
        renamed into place, and only then does the log become ``wal.prev.log``
        and a new empty ``wal.log`` start.  A crash at any moment leaves a
        checkpoint plus the logs that follow it (records a checkpoint already
        holds are skipped on replay).  Returns its size.
        """
        if self.wal is None or self.path is None:
            raise StorageError("an in-memory store has no log to checkpoint")
        if self.closed:
            raise self._closed_error("checkpoint")
        if self.wal.failed is not None:
            raise StoreFailedError(
                f"cannot checkpoint: {self.wal.failed}; close the store and open it again"
            )
        with self._catalog:
            state: dict[str, Any] = {
                "ts": ts,
                "tables": {
                    name: [[k, v] for k, v in t.snapshot().items()]
                    for name, t in self.tables.items()
                },
                "streams": {
                    name: {**s.describe(), "first": s.first, "events": s.committed_with_ids()}
                    for name, s in self.streams.items()
                },
                "offsets": dict(self.offsets),
            }
            try:
                body = json.dumps(state, separators=(",", ":")).encode()
            except (TypeError, ValueError) as exc:
                raise StorageError(f"cannot write a checkpoint: {exc}") from None
            data = b"".join(
                (
                    b'{"format":"txstream-checkpoint","version":%d,"length":%d,"crc32":%d,'
                    b'"state":' % (CHECKPOINT_VERSION, len(body), zlib.crc32(body)),
                    body,
                    b"}\n",
                )
            )
            path = self.path
            tmp = path / "checkpoint.json.tmp"
            current, prev = path / "checkpoint.json", path / "checkpoint.prev.json"
            try:
                with tmp.open("wb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
                # Keep one generation back: the newest checkpoint becomes the
                # older one, and the log since it becomes wal.prev.log, so a
                # damaged new checkpoint can be replaced by the older one plus
                # both logs.  Without a trustworthy current checkpoint the old
                # pair would leave a gap, so it is dropped.
                if current.exists() and not self._checkpoint_damaged:
                    os.replace(current, prev)
                else:
                    prev.unlink(missing_ok=True)
                    current.unlink(missing_ok=True)
                os.replace(tmp, current)
                sync_dir(path)
            except OSError as exc:
                tmp.unlink(missing_ok=True)
                raise StorageError(
                    f"cannot write checkpoint {current}: {exc.strerror or exc}; the log is "
                    "unchanged, so recovery still finds every commit"
                ) from None
            self._checkpoint_damaged = False
            self.wal.rotate(path / "wal.prev.log")
        return len(data)

    def close(self) -> None:
        """Close the log and give up ownership.

        The store stays readable in memory, but a durable store refuses every
        later change (commits that write, offsets, new tables and streams,
        checkpoints) with :class:`StorageError`: they could not be made durable,
        and another process may own the directory by then.  Closing twice is
        harmless.
        """
        try:
            if self.wal is not None:
                self.closed = True
                self.wal.close()
        finally:
            self._release_ownership()

    def _closed_error(self, what: str) -> StorageError:
        return StorageError(
            f"cannot {what}: store {self.path} is closed; open it again (a new Store or "
            "TransactionManager on the folder) to change it"
        )

    @property
    def failed(self) -> str | None:
        """Why the store refuses commits (after an fsync error), else ``None``."""
        return self.wal.failed if self.wal is not None else None

    def _take_ownership(self, path: Path) -> None:
        """Lock ``path/LOCK`` for this store, or raise :class:`StoreLockedError`."""
        if path.exists() and not path.is_dir():
            raise StorageError(f"{path} is not a directory")
        path.mkdir(parents=True, exist_ok=True)
        lock = path / "LOCK"
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StorageError(f"cannot open {lock}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            try:
                owner = os.pread(fd, 256, 0).decode("utf-8", "replace").split()
            finally:
                os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StorageError(f"cannot lock {lock}: {exc.strerror or exc}") from None
            if len(owner) < 2:
                who = "another process (it has not written its pid yet)"
            elif owner[0] == str(os.getpid()) and owner[1] == socket.gethostname():
                who = f"another open store of this process (pid {owner[0]})"
            else:
                who = f"process {owner[0]} on host {owner[1]}"
            raise StoreLockedError(
                f"store {path} is in use by {who} (it holds {lock}); a store has one owner: "
                "close it there (or stop that process) first, or send your updates through it"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        self._lock_fd = fd
        # A store dropped without close() still releases its directory.
        self._unlock = weakref.finalize(self, _unlock, fd)

    def _release_ownership(self) -> None:
        if self._unlock is not None and self._unlock.alive:
            # Emptying the owner line is a courtesy; closing releases the lock.
            with contextlib.suppress(OSError):
                os.ftruncate(self._lock_fd, 0)
            self._unlock()
        self._unlock = None
        self._lock_fd = -1

    def _define(self, record: dict[str, Any]) -> None:
        if self.wal is not None:
            if self.closed:
                raise self._closed_error(f"define {record['def']} {record['name']}")
            self.wal.sync(self.wal.append(record))

    def _open(self, path: Path, sync: str, group_delay: float, on_damage: str) -> None:
        checkpoint_ts, note, older = self._recover_checkpoint(path)
        # A checkpoint cut short by a crash never replaced the real one.
        (path / "checkpoint.json.tmp").unlink(missing_ok=True)
        wal, scan = WriteAheadLog.open(path / "wal.log", sync, group_delay, on_damage)
        report = RecoveryReport(
            str(path / "wal.log"),
            records=len(scan.records),
            problem=scan.problem,
            corrupt=scan.corrupt,
            checkpoint=note,
        )
        if self._checkpoint_damaged:
            report.corrupt = True
            report.checkpoint = "checkpoint.prev.json and wal.prev.log"
            report.checkpoint_problem = note
        records = scan.records
        if older is not None:
            records = older.records + records
            report.records += len(older.records)
            try:
                self._check_contiguous(records, checkpoint_ts)
            except CheckpointCorruptError as exc:
                wal.close()
                raise CheckpointCorruptError(f"{self._fallback_reason}, and {exc}") from None
        try:
            for record in records:
                if "def" in record:
                    self._replay_definition(record)
                elif int(record["ts"]) > checkpoint_ts:
                    self._replay_commit(record)
                    report.transactions += 1
        except (
            StorageError,
            KeyError,
            TypeError,
            IndexError,
            ValueError,
            AttributeError,
            RecursionError,
        ) as exc:
            wal.close()
            raise StorageError(f"cannot recover {path}: bad log record ({exc})") from None
        report.last_ts = self.last_ts
        self.recovery = report
        self.wal = wal
        if not report.clean:
            log.warning("%s", report)

    def _recover_checkpoint(self, path: Path) -> tuple[int, str | None, LogScan | None]:
        """Load the newest good checkpoint: (its ts, a note, the older log to replay too).

        Normally that is ``checkpoint.json``, and only ``wal.log`` follows it.
        If it is damaged - or missing while ``checkpoint.prev.json`` exists (a
        crash inside :meth:`checkpoint`) - the older checkpoint is loaded and
        ``wal.prev.log`` is replayed before ``wal.log``; a copy of the damaged
        file is kept and the report says so.  With no good checkpoint to use,
        :class:`CheckpointCorruptError`.
        """
        current, prev = path / "checkpoint.json", path / "checkpoint.prev.json"
        try:
            ts, note = self._load_checkpoint(current)
        except CheckpointCorruptError as exc:
            if not prev.exists():
                raise CheckpointCorruptError(
                    f"{exc}: recovery stopped and loaded nothing (there is no older "
                    "checkpoint, and the log no longer holds what it covered); restore the "
                    "store directory from a backup"
                ) from None
            damage: str | None = str(exc)
        else:
            if note is not None or not prev.exists():
                return ts, note, None
            damage = None
        self._fallback_reason = damage or f"{current} is missing"
        self.tables, self.streams, self.offsets = {}, {}, {}
        self.last_ts, self._holes = 0, HOLE_ALLOWANCE
        try:
            ts, _ = self._load_checkpoint(prev)
        except CheckpointCorruptError as exc:
            raise CheckpointCorruptError(
                f"{damage or f'{current} is missing'}, and the older one is no better ({exc}); "
                "recovery stopped and loaded nothing: restore the store directory from a backup"
            ) from None
        older_log = path / "wal.prev.log"
        older = read_log(older_log) if older_log.exists() else LogScan()
        if older.problem is not None:
            raise CheckpointCorruptError(
                f"{damage or f'{current} is missing'}, and {older_log} needed to replace it "
                f"is damaged too ({older.problem}); recovery stopped and loaded nothing"
            )
        if damage is None:
            return ts, f"{prev.name} and {older_log.name} ({current.name} was never written)", older
        self._checkpoint_damaged = True
        copy = save_tail(current, current.read_bytes(), 0)
        note = (
            f"{damage}; recovered from the older {prev.name} and {older_log.name} instead "
            f"(a copy of the damaged file is in {copy.name})"
        )
        return ts, note, older

    @staticmethod
    def _check_contiguous(records: list[dict[str, Any]], since: int) -> None:
        """Refuse a fallback whose logs miss a commit (timestamps go up by one per commit)."""
        expected = since + 1
        for record in records:
            if "def" in record:
                continue
            ts = record.get("ts")
            if type(ts) is not int or ts <= since:
                continue
            if ts != expected:
                raise CheckpointCorruptError(
                    f"the older checkpoint plus the logs miss the commits {expected}..{ts - 1}; "
                    "recovery stopped and loaded nothing: restore the store directory from a "
                    "backup"
                )
            expected += 1

    def _load_checkpoint(self, file: Path) -> tuple[int, str | None]:
        """Load ``checkpoint.json`` if there is one: (its timestamp, a note for the report).

        The checksum is verified and the structure validated before anything is
        loaded; any damage raises :class:`CheckpointCorruptError`.
        """
        if not file.exists():
            return 0, None
        data = file.read_bytes()
        head = _CHECKPOINT_HEAD.match(data)
        try:
            if head is not None:
                version, length, crc = (int(g) for g in head.groups())
                if version != CHECKPOINT_VERSION:
                    raise CheckpointCorruptError(f"unknown checkpoint version {version}")
                body = data[head.end() : head.end() + length]
                if len(body) != length or data[head.end() + length :] != b"}\n":
                    raise CheckpointCorruptError(
                        f"its length says {length} bytes of state, the file disagrees"
                    )
                if zlib.crc32(body) != crc:
                    raise CheckpointCorruptError("checksum mismatch")
                note = f"checkpoint {file.name} (checksum verified)"
            elif data.startswith(b'{"ts":'):
                # Written before checkpoints had a checksum: nothing to verify.
                body = data
                note = f"checkpoint {file.name} (old format without a checksum, not verified)"
            else:
                raise CheckpointCorruptError("not a txstream checkpoint (bad header)")
            try:
                state = json.loads(body)
            except ValueError as exc:
                raise CheckpointCorruptError(f"contents are not JSON ({exc})") from None
            ts = self._load_state(state)
        except RecursionError:
            error = "nested too deeply"
        except CheckpointCorruptError as exc:
            error = str(exc)
        except (StorageError, ValueError, KeyError, TypeError, IndexError) as exc:
            error = f"impossible contents ({exc})"
        else:
            self.last_ts = max(self.last_ts, ts)
            return ts, note
        raise CheckpointCorruptError(f"checkpoint {file} is damaged: {error}")

    def _load_state(self, state: Any) -> int:
        """Validate a checkpoint's decoded state, then load it; return its timestamp."""
        bad = CheckpointCorruptError
        if not isinstance(state, dict) or set(state) != {"ts", "tables", "streams", "offsets"}:
            raise bad("its state is not an object with ts, tables, streams and offsets")
        ts = state["ts"]
        if type(ts) is not int or ts < 0:
            raise bad(f"timestamp {ts!r} is not a non-negative integer")
        tables, streams, offsets = state["tables"], state["streams"], state["offsets"]
        if not isinstance(tables, dict) or not isinstance(streams, dict):
            raise bad("tables and streams must be objects")
        if not isinstance(offsets, dict):
            raise bad("offsets must be an object")
        for name, rows in tables.items():
            if not isinstance(rows, list) or not all(
                isinstance(r, list) and len(r) == 2 for r in rows
            ):
                raise bad(f"table {name}: rows must be [key, row] pairs")
        for name, spec in streams.items():
            if not isinstance(spec, dict) or not isinstance(spec.get("events"), list):
                raise bad(f"stream {name}: settings without an event list")
            if spec.get("granularity", "stream") not in GRANULARITIES:
                raise bad(f"stream {name}: unknown granularity")
            last = -1
            for pair in spec["events"]:
                if not isinstance(pair, list) or len(pair) != 2 or type(pair[0]) is not int:
                    raise bad(f"stream {name}: events must be [id, event] pairs")
                if pair[0] <= last:
                    raise bad(f"stream {name}: event ids are not increasing")
                last = pair[0]
            first = spec.get("first", 0)
            events = spec["events"]
            if type(first) is not int or first < 0 or (events and events[0][0] < first):
                raise bad(f"stream {name}: bad first id {first!r}")
        for name, rows in tables.items():
            table = self.tables.setdefault(name, Table(name))
            for key, row in rows:
                table.apply(_key(key), row, ts)
        for name, spec in streams.items():
            settings = {k: v for k, v in spec.items() if k not in ("events", "first")}
            self._replay_definition({"def": "stream", "name": name, **settings})
            stream = self.streams[name]
            # A trimmed stream starts at its first kept id (optional: older
            # checkpoints have none), so its trimmed ids are no holes to allocate.
            stream.start_at(spec.get("first", 0))
            for event_id, event in spec["events"]:
                self._place(stream, event_id, event, ts)
        self.offsets.update(offsets)
        return ts

    def _place(self, stream: Stream, event_id: Any, event: Any, ts: int) -> None:
        """Replay one committed event, refusing ids that would allocate absurd gaps."""
        if type(event_id) is not int or event_id < 0:
            raise StorageError(f"stream {stream.name}: bad event id {event_id!r}")
        first, end = stream.first, len(stream)
        # Replay follows commit order: an id below the first one leaves holes before it.
        gap = first - event_id if event_id < first and end > first else event_id - end
        if gap > 0:
            self._holes -= gap
            if self._holes < 0:
                raise StorageError(
                    f"stream {stream.name}: event id {event_id} leaves more holes than recovery "
                    "allows (a damaged record?)"
                )
        self._holes += 8
        stream.place(event_id, event, ts)

    def _replay_definition(self, record: dict[str, Any]) -> None:
        name = record["name"]
        if record["def"] == "table":
            self.tables.setdefault(name, Table(name))
        elif record["def"] == "stream":
            if name not in self.streams:
                order_by = record.get("order_by")
                if order_by is not None and type(order_by) not in (str, int):
                    raise StorageError(f"stream {name}: bad ordering attribute {order_by!r}")
                self.streams[name] = Stream(
                    name,
                    order_by,
                    bool(record.get("require_order")),
                    record.get("granularity", "stream"),
                    record.get("range_size", 64),
                )
        else:
            raise StorageError(f"unknown definition {record['def']!r}")

    def _replay_commit(self, record: dict[str, Any]) -> None:
        ts = int(record["ts"])
        for row in record.get("rows", ()):
            table = self.get_table(row[0])
            table.apply(_key(row[1]), row[2] if len(row) > 2 else ABSENT, ts)
        for name, event_id, event in record.get("events", ()):
            self._place(self.get_stream(name), event_id, event, ts)
        self.offsets.update(record.get("offsets", {}))
        self.last_ts = max(self.last_ts, ts)
