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

A record that fails its checksum stops recovery at the last good record; the
store says so in :attr:`Store.recovery` (and logs a warning) and moves the bad
tail aside so no new record follows it.

Durable rows, keys and events must be JSON values; keys that were tuples come
back as tuples, other tuples come back as lists.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from txstream.errors import UnknownNameError
from txstream.storage.base import ABSENT, StorageError
from txstream.storage.stream import OrderBy, Stream
from txstream.storage.table import Table
from txstream.storage.wal import WriteAheadLog

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

    @property
    def clean(self) -> bool:
        """True when every byte of the log was a good record."""
        return self.problem is None

    def __str__(self) -> str:
        text = (
            f"recovered {self.transactions} committed transactions from {self.records} "
            f"records of {self.path}"
        )
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


class Store:
    """Tables, streams and source offsets, optionally durable in a directory."""

    def __init__(
        self, path: str | Path | None = None, sync: str = "commit", group_delay: float = 0.0
    ) -> None:
        self.tables: dict[str, Table] = {}
        self.streams: dict[str, Stream] = {}
        self.offsets: dict[str, Any] = {}
        self.last_ts = 0
        self.path = Path(path) if path is not None else None
        self.wal: WriteAheadLog | None = None
        self.recovery: RecoveryReport | None = None
        self._catalog = threading.Lock()
        if self.path is not None:
            self._open(self.path, sync, group_delay)

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
        payload: dict[str, Any] = {"ts": ts}
        if rows:
            payload["rows"] = [[t.name, k] if v is ABSENT else [t.name, k, v] for t, k, v in rows]
        if events:
            payload["events"] = [[s.name, i, e] for s, i, e in events]
        if offsets:
            payload["offsets"] = offsets
        try:
            lsn = wal.append(payload)
        except (TypeError, ValueError) as exc:
            raise StorageError(f"cannot log the transaction's data as JSON: {exc}") from None
        if offsets:
            self.offsets.update(offsets)
        return lsn

    def sync(self, lsn: int) -> None:
        """Make the log durable up to ``lsn`` (per the store's sync setting)."""
        if self.wal is not None and lsn:
            self.wal.sync(lsn)

    def checkpoint(self, ts: int) -> int:
        """Write the committed state as of ``ts`` to ``checkpoint.json``; empty the log.

        The caller must keep commits out while this runs (the transaction manager
        holds its commit mutex).  The file is written beside the log, flushed and
        renamed into place before the log is emptied, so a crash at any moment
        leaves either the old checkpoint plus the full log or the new checkpoint
        (records it already holds are skipped on replay).  Returns its size.
        """
        if self.wal is None or self.path is None:
            raise StorageError("an in-memory store has no log to checkpoint")
        with self._catalog:
            state: dict[str, Any] = {
                "ts": ts,
                "tables": {
                    name: [[k, v] for k, v in t.snapshot().items()]
                    for name, t in self.tables.items()
                },
                "streams": {
                    name: {**s.describe(), "events": s.committed_with_ids()}
                    for name, s in self.streams.items()
                },
                "offsets": dict(self.offsets),
            }
            try:
                data = json.dumps(state, separators=(",", ":")).encode()
            except (TypeError, ValueError) as exc:
                raise StorageError(f"cannot write a checkpoint: {exc}") from None
            tmp = self.path / "checkpoint.json.tmp"
            with tmp.open("wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path / "checkpoint.json")
            dir_fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
            self.wal.reset()
        return len(data)

    def close(self) -> None:
        """Close the log (the store stays readable in memory)."""
        if self.wal is not None:
            self.wal.close()
            self.wal = None

    def _define(self, record: dict[str, Any]) -> None:
        if self.wal is not None:
            self.wal.sync(self.wal.append(record))

    def _open(self, path: Path, sync: str, group_delay: float) -> None:
        if path.exists() and not path.is_dir():
            raise StorageError(f"{path} is not a directory")
        checkpoint_ts = self._load_checkpoint(path / "checkpoint.json")
        # A checkpoint cut short by a crash never replaced the real one.
        (path / "checkpoint.json.tmp").unlink(missing_ok=True)
        wal, scan = WriteAheadLog.open(path / "wal.log", sync, group_delay)
        report = RecoveryReport(
            str(path / "wal.log"),
            records=len(scan.records),
            problem=scan.problem,
            corrupt=scan.corrupt,
        )
        try:
            for record in scan.records:
                if "def" in record:
                    self._replay_definition(record)
                elif int(record["ts"]) > checkpoint_ts:
                    self._replay_commit(record)
                    report.transactions += 1
        except (StorageError, KeyError, TypeError, IndexError, ValueError) as exc:
            wal.close()
            raise StorageError(f"cannot recover {path}: bad log record ({exc})") from None
        report.last_ts = self.last_ts
        self.recovery = report
        self.wal = wal
        if report.problem:
            log.warning("%s", report)

    def _load_checkpoint(self, file: Path) -> int:
        """Load ``checkpoint.json`` if there is one; return its timestamp (0 if none)."""
        if not file.exists():
            return 0
        try:
            state = json.loads(file.read_bytes())
            ts = int(state["ts"])
            for name, rows in state["tables"].items():
                table = self.tables.setdefault(name, Table(name))
                for key, row in rows:
                    table.apply(_key(key), row, ts)
            for name, spec in state["streams"].items():
                events = spec.pop("events")
                self._replay_definition({"def": "stream", "name": name, **spec})
                stream = self.streams[name]
                for event_id, event in events:
                    stream.place(int(event_id), event, ts)
            self.offsets.update(state["offsets"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StorageError(f"cannot read checkpoint {file}: {exc}") from None
        self.last_ts = max(self.last_ts, ts)
        return ts

    def _replay_definition(self, record: dict[str, Any]) -> None:
        name = record["name"]
        if record["def"] == "table":
            self.tables.setdefault(name, Table(name))
        elif record["def"] == "stream":
            if name not in self.streams:
                self.streams[name] = Stream(
                    name,
                    record.get("order_by"),
                    bool(record.get("require_order")),
                    record.get("granularity", "stream"),
                    int(record.get("range_size", 64)),
                )
        else:
            raise StorageError(f"unknown definition {record['def']!r}")

    def _replay_commit(self, record: dict[str, Any]) -> None:
        ts = int(record["ts"])
        for row in record.get("rows", ()):
            table = self.get_table(row[0])
            table.apply(_key(row[1]), row[2] if len(row) > 2 else ABSENT, ts)
        for name, event_id, event in record.get("events", ()):
            self.get_stream(name).place(int(event_id), event, ts)
        self.offsets.update(record.get("offsets", {}))
        self.last_ts = max(self.last_ts, ts)
