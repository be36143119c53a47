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
Recovery itself (checkpoint, fallback, replay) is :mod:`txstream.storage.recovery`.

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
import socket
import threading
import weakref
import zlib
from collections.abc import Hashable
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
from txstream.storage.recovery import (
    CHECKPOINT_VERSION,
    HOLE_ALLOWANCE,
    RecoveryReport,
    recover,
)
from txstream.storage.stream import OrderBy, Stream
from txstream.storage.table import Table
from txstream.storage.wal import (
    DAMAGE_POLICIES,
    SYNC_MODES,
    WriteAheadLog,
    sync_dir,
)

# Recovery moved to txstream.storage.recovery; these names are still imported from here.
__all__ = [
    "CHECKPOINT_VERSION",
    "HOLE_ALLOWANCE",
    "MAX_NESTING",
    "CheckpointCorruptError",
    "EventChange",
    "RecoveryReport",
    "RowChange",
    "Store",
    "check_loggable",
]

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
        self._hole_allowance = HOLE_ALLOWANCE
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
                recover(self, self.path, sync, group_delay, on_damage)
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
