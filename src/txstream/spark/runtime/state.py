"""Durable partition state, outputs and histories of the runtime, under one directory.

Layout of a job's store directory (on a file system every executor reaches)::

    LOCK                        the driver's lock: one running job per store
    job.json                    partitions, the job's shape (checked on restart, see restart.py)
    commits/<batch>.json        the batch's commit marker (written last, by the driver)
    state/p<pid>/snap-<b>.bin   a partition's whole state after batch b
    state/p<pid>/delta-<b>.bin  the rows batch b changed (written by the task)
    state/p<pid>/patch-<b>.bin  the values phase 3 of batch b rewrote after phase 1
    outputs/<name>/batch-<b>/<role>.jsonl   emitted rows of batch b
    history/batch-<b>/<role>.txt            the committed history of batch b
    errors/batch-<b>/<role>.jsonl           transactions rolled back, with positions

Every ``.bin`` file is ``MAGIC | crc32 | length | tagged JSON`` (:mod:`.codec`,
never pickle) and is written to a temporary name, fsynced and renamed, so a
reader sees a whole file or none; a damaged file is reported with its path and
never loaded.  Everything a batch writes counts only once ``commits/<b>.json``
exists: a batch that is re-run after a crash overwrites its own files with the
same contents (transactions are deterministic), and the driver removes a
batch's uncommitted outputs before it runs it again.

The commit markers form a chain (each names the batch before it) and each
names the files of its batch: outputs, histories and failure records with
their CRC-32 and size (computed by the tasks as they write them, checked by
the readers; the driver reads none of them), state files with their size,
and each partition's committed version (checked at a restart by
:meth:`RuntimeStore.check_state`, and by every load: the deltas must lead from
a snapshot to that version).  A missing or changed file is a one-line
:class:`StoreError` naming it, or a recovery from an older snapshot.

Python workers keep the state of the partitions they ran in memory
(:data:`_CACHE`), tagged with the batch it reflects, so the next batch on the
same worker reads nothing from disk; a worker that has not seen the partition
loads the latest snapshot and the deltas after it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import socket
import struct
import uuid
import zlib
from dataclasses import dataclass, field
from itertools import chain, repeat
from operator import itemgetter
from pathlib import Path
from typing import Any

from txstream.spark.runtime import codec
from txstream.spark.runtime.errors import (  # (re-exported: imported from here before)
    StoreError as StoreError,
)
from txstream.spark.runtime.errors import (
    StoreLockedError as StoreLockedError,
)
from txstream.spark.runtime.totals import Tracked, track

MAGIC = b"TXRT2\n"
OLD_MAGIC = b"TXRT1\n"
"""The pickle files of versions before the data format (refused, never loaded)."""
_HEADER = struct.Struct(">IQ")
ABSENT: Any = None  # a deleted row in a delta
Data = dict[str, dict[Any, Any]]
"""table -> partition value -> key -> row; a table in :attr:`PartitionState.flat`:
table -> key -> row (its key is its own partition value, see :meth:`PartitionState.use_flat`)"""


def json_record(path: Path, what: str, line: str | None = None) -> dict[str, Any]:
    """The JSON object in ``path`` (or its ``line``); damaged, a :class:`StoreError` naming it."""
    try:
        record = json.loads(path.read_text() if line is None else line)
    except ValueError as exc:
        raise StoreError(f"{path}: damaged {what} ({exc})") from None
    if not isinstance(record, dict):
        raise StoreError(f"{path}: damaged {what} (not a JSON object)")
    return record


def usable_directory(path: Path, what: str) -> Path:
    """Create directory ``path`` (and its parents) unless it exists.

    A path that is a file, lies under a file, cannot be created or is not
    writable is a :class:`StoreError` naming it (``what``: "checkpoint", "store").
    """
    for folder in (path, *path.parents):
        if folder.exists() and not folder.is_dir():
            where = "is a file" if folder == path else f"is under {folder}, which is a file"
            raise StoreError(f"{what} {path} {where}; give a directory (a new one or the job's)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(
            f"{what} {path} cannot be created ({exc.strerror or exc}); "
            "give a directory you can write to"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise StoreError(f"{what} {path} is not writable; give a directory you can write to")
    return path


def write_atomic(path: Path, payload: bytes, durable: bool = True) -> None:
    """Write ``payload`` to ``path`` via a temporary file, fsync and rename.

    ``durable=False`` skips the fsyncs, for files that only live until the batch
    commits (a crash before the commit re-runs the batch, which rewrites them).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        handle.write(payload)
        if durable:
            handle.flush()
            os.fsync(handle.fileno())
    os.replace(tmp, path)
    if not durable:
        return
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def dump_blob(obj: Any) -> bytes:
    """``obj`` in the store's data format (:mod:`.codec`), behind a magic, a CRC-32, the length.

    A value the format does not hold is a :class:`StoreError`.
    """
    try:
        body = codec.dumps(obj)
    except codec.UnstorableValueError as exc:
        raise StoreError(str(exc)) from None
    return MAGIC + _HEADER.pack(zlib.crc32(body), len(body)) + body


def load_blob(path: Path) -> Any:
    """The object in ``path``; :class:`StoreError` when the file is damaged.

    A file of the pickle format of earlier versions is refused, never unpickled
    (unpickling runs whatever code the file names).
    """
    raw = path.read_bytes()
    head = len(MAGIC) + _HEADER.size
    if raw.startswith(OLD_MAGIC):
        raise StoreError(
            f"{path}: written by an older version of txstream (a pickle file, which this "
            "version never loads); start the job on a new checkpoint (or finish it with the "
            "older version first)"
        )
    if len(raw) < head or not raw.startswith(MAGIC):
        raise StoreError(f"{path}: not a txstream runtime file (damaged header)")
    crc, length = _HEADER.unpack_from(raw, len(MAGIC))
    body = raw[head:]
    if len(body) != length or zlib.crc32(body) != crc:
        raise StoreError(
            f"{path}: checksum mismatch (damaged file); restore it from a backup or "
            "remove the store to start over"
        )
    try:
        return codec.loads(body)
    except (ValueError, TypeError, KeyError) as exc:  # (a checksummed body: a writer's bug)
        raise StoreError(f"{path}: damaged file ({exc})") from None


@dataclass
class PartitionState:
    """One partition's rows and boundary state, as of ``version`` (a committed batch).

    While a batch ``pending`` runs, ``undo`` keeps the first pre-image of every
    row it changed (``changed`` the same keys), so a re-run of the batch rolls
    back in memory.

    A table whose key is one column (``TableSpec.simple``) is its own partition
    value: its rows are kept flat, key -> row (:attr:`flat`), not in a dict of
    one-row dicts per value, which costs a lookup and a cache miss more per row
    access.  Every value's rows are reached through :meth:`part`,
    :meth:`rows_of` and :meth:`set_rows`, whichever the layout; the files on
    disk keep the nested layout's columns (:func:`columns`).
    """

    data: Data = field(default_factory=dict)
    flat: frozenset[str] = frozenset()
    """The tables kept flat (key -> row; their key is their partition value)."""
    meta: dict[str, Any] = field(default_factory=dict)
    version: int = -1
    pending: int | None = None
    undo: dict[tuple[str, Any, Any], Any] = field(default_factory=dict)
    meta_before: dict[str, Any] | None = None
    token: str | None = None
    """Names the saved version this state is (a fresh one per save): a worker's cached
    state is used only when its token is the one the driver committed."""
    token_before: str | None = None
    tracked: Tracked = field(default_factory=dict)
    """Per table, the totals that the batch's global reads keep (see :mod:`.totals`):
    every write changes them; they last one batch (cleared, never replaced: a
    transaction holds the dict)."""

    def use_flat(self, tables: frozenset[str]) -> None:
        """Keep ``tables`` flat and every other table nested, converting what is not yet.

        A state read from disk (or made empty) is nested; the executors call this
        with their job's one-column-keyed tables before touching the rows.
        """
        if tables == self.flat:
            return
        data = self.data
        for table in self.flat - tables:  # (flat -> nested: a job of another shape)
            if table in data:
                data[table] = {key: {key: row} for key, row in data[table].items()}
        for table in tables - self.flat:
            if table in data:
                data[table] = dict(chain.from_iterable(map(dict.items, data[table].values())))
        self.flat = tables

    def part(self, table: str, value: Any) -> dict[Any, Any] | None:
        """The dict that holds ``value``'s rows by key (None: none of the table here).

        For a flat table it is the whole table (a key of a flat table is its value):
        look keys of ``value`` up in it, never iterate it (:meth:`rows_of` does).
        """
        rows = self.data.get(table)
        if rows is None or table in self.flat:
            return rows
        found: dict[Any, Any] | None = rows.get(value)
        return found

    def rows_of(self, table: str, value: Any) -> dict[Any, Any]:
        """``value``'s rows of ``table``, key -> row (never change it: it may be a copy)."""
        rows = self.data.get(table, _NONE)
        if table in self.flat:
            row = rows.get(value)
            return _NONE if row is None else {value: row}
        found: dict[Any, Any] = rows.get(value, _NONE)
        return found

    def set_rows(self, table: str, value: Any, rows: dict[Any, Any]) -> None:
        """Replace ``value``'s rows of ``table`` by ``rows`` (empty: none; no undo, no totals)."""
        if table in self.flat:
            by_key = self.data.setdefault(table, {})
            row = rows.get(value)
            if row is None:
                by_key.pop(value, None)
            else:
                by_key[value] = row
        elif rows:
            self.data.setdefault(table, {})[value] = dict(rows)
        else:
            self.data.get(table, {}).pop(value, None)

    def pop_rows(self, table: str, value: Any) -> dict[Any, Any]:
        """Take ``value``'s rows of ``table`` out (no undo, no totals); returns them."""
        rows = self.data.get(table)
        if rows is None:
            return _NONE
        if table in self.flat:
            row = rows.pop(value, None)
            return _NONE if row is None else {value: row}
        found: dict[Any, Any] = rows.pop(value, _NONE)
        return found

    def all_rows(self, table: str) -> list[tuple[Any, Any]]:
        """Every ``(key, row)`` of ``table`` here, whichever the layout."""
        rows = self.data.get(table, _NONE)
        if table in self.flat:
            return list(rows.items())
        return list(chain.from_iterable(map(dict.items, rows.values())))

    def begin(self, batch: int) -> None:
        """Start batch ``batch`` (its changes are kept undoable until :meth:`settle`)."""
        self.tracked.clear()
        self.pending = batch
        self.undo = {}
        self.meta_before = dict(self.meta)
        self.token_before = self.token

    def rollback(self) -> None:
        """Undo the pending batch."""
        for (table, value, key), old in self.undo.items():
            self._set(table, value, key, old)
        self.tracked.clear()
        if self.meta_before is not None:
            self.meta = self.meta_before
        self.token = self.token_before
        self.pending = None
        self.undo = {}
        self.meta_before = None

    def settle(self) -> None:
        """The pending batch committed: it becomes this state's version."""
        if self.pending is not None:
            self.version = self.pending
        self.tracked.clear()
        self.pending = None
        self.undo = {}
        self.meta_before = None

    def put(self, table: str, value: Any, key: Any, row: Any) -> None:
        """Set (or delete, with ABSENT) one row, keeping its pre-image for the batch."""
        undo_key = (table, value, key)
        if undo_key not in self.undo:
            self.undo[undo_key] = (self.part(table, value) or _NONE).get(key, ABSENT)
        self._set(table, value, key, row)

    def _set(self, table: str, value: Any, key: Any, row: Any) -> None:
        flat = table in self.flat
        if flat:
            rows = self.data.setdefault(table, {})
        else:
            rows = self.data.setdefault(table, {}).setdefault(value, {})
        tracked = self.tracked
        if tracked and table in tracked:
            old = rows.get(key)
            track(tracked, table, old, None if row is ABSENT else row)
        if row is ABSENT:
            rows.pop(key, None)
            if not rows and not flat:
                self.data[table].pop(value, None)
        else:
            rows[key] = row

    def delta(self) -> dict[str, Any]:
        """The rows the pending batch changed, as they are now (ABSENT when deleted).

        ``changes``: per table, three columns (partition values, keys, rows), the
        layout the store's format writes fastest (see :mod:`.codec`).
        """
        entries = list(self.undo)
        changes: dict[str, list[list[Any]]] = {}
        tables = set(map(itemgetter(0), entries))
        for table in sorted(tables):
            mine = entries if len(tables) == 1 else [e for e in entries if e[0] == table]
            by_value = self.data.get(table, _NONE)
            values, keys = list(map(itemgetter(1), mine)), list(map(itemgetter(2), mine))
            # Each changed row as it is now, looked up in C (no Python code per row).
            if table in self.flat:
                rows = list(map(by_value.get, keys, repeat(ABSENT)))
            else:
                parts = map(by_value.get, values, repeat(_NONE))
                rows = list(map(dict.get, parts, keys, repeat(ABSENT)))
            changes[table] = [values, keys, rows]
        # "parent" names the version the batch started from: a worker catching up
        # checks that each delta continues the version it holds (see _catch_up).
        return {
            "changes": changes,
            "meta": self.meta,
            "token": self.token,
            "parent": self.token_before,
        }

    def apply(self, delta: dict[str, Any]) -> None:
        """Apply a delta read from disk (no undo kept)."""
        if "changes" in delta:
            for table, (values, keys, rows) in delta["changes"].items():
                for value, key, row in zip(values, keys, rows, strict=True):
                    self._set(table, value, key, row)
        else:  # (the layout of earlier versions: one [table, value, key, row] per row)
            for table, value, key, row in delta["rows"]:
                self._set(table, value, key, row)
        self.meta = dict(delta["meta"])
        self.token = delta.get("token")

    def apply_patch(self, patch: dict[str, Any]) -> bool:
        """Apply phase 3's patch if it continues this version (see :meth:`RuntimeStore.patch`)."""
        if patch["parent"] != self.token:
            return False
        for value, tables in patch["values"]:
            for table, rows in tables.items():
                self.set_rows(table, value, rows)
        self.token = patch["token"]
        return True


_NONE: dict[Any, Any] = {}
"""An empty dict to look up in (never changed)."""


def columns(by_value: dict[Any, dict[Any, Any]]) -> list[list[Any]]:
    """A table's rows (partition value -> key -> row) as three columns: values, keys, rows.

    The store's layout of a table (snapshots, initial rows): lists of plain
    values and rows that the format writes without a Python step per row
    (see :mod:`.codec`); built in C (``chain``, ``repeat``) from the dicts.  A
    value without rows is left out (a lookup finds none either way).
    """
    groups = by_value.values()
    if set(map(len, groups)) <= {1}:  # one row per value (a key that is the value)
        values = list(by_value)
    else:
        values = list(chain.from_iterable(map(repeat, by_value, map(len, groups))))
    keys = list(chain.from_iterable(groups))
    rows = list(chain.from_iterable(map(dict.values, groups)))
    return [values, keys, rows]


def flat_columns(by_key: dict[Any, Any]) -> list[list[Any]]:
    """A flat table's rows (key -> row) as :func:`columns` writes them (each key its value)."""
    keys = list(by_key)
    return [keys, list(keys), list(by_key.values())]


def nested(values: list[Any], keys: list[Any], rows: list[Any]) -> dict[Any, dict[Any, Any]]:
    """The table that :func:`columns` wrote (partition value -> key -> row)."""
    if len(set(values)) == len(values) == len(keys) == len(rows):  # one row per value
        return {value: {key: row} for value, key, row in zip(values, keys, rows, strict=True)}
    table: dict[Any, dict[Any, Any]] = {}
    for value, key, row in zip(values, keys, rows, strict=True):
        by_key = table.get(value)
        if by_key is None:
            table[value] = by_key = {}
        by_key[key] = row
    return table


def _table_of(blob: Any) -> dict[Any, dict[Any, Any]]:
    """An initial-rows file's table (columns; a dict in the layout of earlier versions)."""
    if isinstance(blob, list):
        return nested(*blob)
    table: dict[Any, dict[Any, Any]] = blob
    return table


_CACHE: dict[tuple[str, int], PartitionState] = {}
_NAME = re.compile(r"(snap|delta|patch)-(\d+)\.bin")
TRANSIENT = ("shipped", "back")
"""Folders of files that one phase of a batch hands to the next (see ``write_transient``)."""


class RuntimeStore:
    """The files of one job's store directory (see the module docstring)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    # -- partition state (executors) ---------------------------------------------------
    def _pdir(self, pid: int) -> Path:
        return self.root / "state" / f"p{pid:05d}"

    def state_for(self, pid: int, batch: int, prev: int, token: str | None) -> PartitionState:
        """The partition's state after batch ``prev`` (the last that ran), ready for ``batch``.

        ``token`` names the version the driver committed for this partition; a
        worker's cached state is used only when it is that version (another
        worker may have run the partition since, or rewritten it in phase 3).
        """
        key = (str(self.root), pid)
        state = _CACHE.pop(key, None)
        if state is not None and state.pending is not None:
            if state.pending == batch:
                state.rollback()
            else:
                state.settle()
        if state is None or token is None or state.token != token:
            state = self._catch_up(pid, state, prev, token) or self.load(pid, prev, token)
        state.version = prev
        _CACHE[key] = state
        state.begin(batch)
        return state

    def _catch_up(
        self, pid: int, state: PartitionState | None, prev: int, token: str | None
    ) -> PartitionState | None:
        """Bring a worker's older cached state up to the committed version, or None.

        Spark runs a partition's task on whichever Python worker is free, so a
        worker often holds the partition as of a few batches ago; reloading the
        snapshot then costs more than the batch (a third of Linear Road's task
        time).  The deltas written since form a chain: each names the version it
        started from (``parent``).  The cached state is used only when the chain
        starts at its own version (so it is the version the later batches ran on,
        not an attempt that was run again elsewhere) and ends at ``token``, the
        version the driver committed.
        """
        if state is None or token is None or state.token is None:
            return None
        pdir = self._pdir(pid)
        try:
            later = sorted(
                int(m.group(2))
                for m in map(_NAME.fullmatch, os.listdir(pdir))
                if m and m.group(1) == "delta" and state.version <= int(m.group(2)) <= prev
            )
            for batch in later:
                if batch > state.version:
                    delta = load_blob(pdir / f"delta-{batch:012d}.bin")
                    if delta.get("parent") != state.token:
                        return None
                    state.apply(delta)
                # The batch's phase 1 is this version (this worker may have run
                # it); phase 3 may have changed some of its values since.
                patch = self.patch(pid, batch)
                if patch is not None:
                    state.apply_patch(patch)
        except (OSError, StoreError):
            return None
        return state if state.token == token else None

    def patch(self, pid: int, batch: int) -> dict[str, Any] | None:
        """Phase 3's patch of batch ``batch`` (see :meth:`write_patch`), or None."""
        path = self._pdir(pid) / f"patch-{batch:012d}.bin"
        return load_blob(path) if path.exists() else None

    def write_patch(
        self, pid: int, batch: int, parent: str, values: list[tuple[Any, dict[str, Any]]]
    ) -> str:
        """Phase 3: record the values it rewrote over phase 1's version ``parent``.

        ``values``: each partition value with its new rows per table (every table;
        an empty dict removes the value's rows).  A patch counts only on the
        version it names as ``parent``: an attempt of the batch that did not
        commit wrote another phase-1 version, which no committed batch continues.
        Returns the new version's token.
        """
        token = uuid.uuid4().hex
        body = {"values": values, "parent": parent, "token": token}
        write_atomic(self._pdir(pid) / f"patch-{batch:012d}.bin", dump_blob(body))
        return token

    def load(self, pid: int, upto: int, token: str | None = None) -> PartitionState:
        """Read the partition's state as of batch ``upto`` from its snapshot and deltas.

        ``token``: the version the driver committed for the partition (None before
        the first commit).  The deltas must form a chain from the snapshot (each
        names the version it continues) to that version; a snapshot that is
        damaged or does not lead there is passed over for an older one and the
        deltas after it.  When none leads there, a :class:`StoreError` names
        the first file that is missing or damaged: a broken chain is never
        loaded.
        """
        files: dict[str, list[int]] = {"snap": [], "delta": [], "patch": []}
        pdir = self._pdir(pid)
        if pdir.exists():
            for entry in os.listdir(pdir):
                match = _NAME.fullmatch(entry)
                if match and int(match.group(2)) <= upto:
                    files[match.group(1)].append(int(match.group(2)))
        first: StoreError | None = None
        starts: list[int | None] = [*sorted(files["snap"], reverse=True), None]
        for start in starts:
            if start is None and token is not None and self._snapshot_committed(pid):
                # The initial rows count only until a snapshot holds them: they may
                # be gone since, which a chain from them could not tell.
                continue
            try:
                state = self._load_from(pid, files, start)
            except StoreError as exc:
                first = first or exc
                continue
            if token is None or state.token == token:
                state.version = upto
                return state
            first = first or StoreError(self._broken(pid, state.version, upto))
        raise first or StoreError(self._broken(pid, -1, upto))

    def _snapshot_committed(self, pid: int) -> bool:
        """Whether a committed batch wrote a snapshot of partition ``pid``."""
        prefix = f"{self._pdir(pid).relative_to(self.root)}/snap-"
        for batch in self.committed():
            with contextlib.suppress(StoreError):
                if any(rel.startswith(prefix) for rel in self.commit_info(batch).get("state", {})):
                    return True
        return False

    def _load_from(
        self, pid: int, files: dict[str, list[int]], start: int | None
    ) -> PartitionState:
        """The state from snapshot ``start`` (None: the initial rows) and the deltas after it."""
        pdir = self._pdir(pid)
        state = PartitionState()
        if start is None and pdir.exists():
            for init in sorted(pdir.glob("init-*.bin")):
                state.data[init.stem[len("init-") :]] = _table_of(load_blob(init))
        if start is not None:
            snap = load_blob(pdir / f"snap-{start:012d}.bin")
            if "tables" in snap:
                state.data = {t: nested(*cols) for t, cols in snap["tables"].items()}
            else:  # (the layout of earlier versions)
                state.data = snap["data"]
            state.meta, state.token = snap["meta"], snap.get("token")
            state.version = start
            if start in files["patch"]:  # phase 1 wrote the snapshot, phase 3 patched it
                state.apply_patch(load_blob(pdir / f"patch-{start:012d}.bin"))
        for batch in sorted(b for b in files["delta"] if start is None or b > start):
            delta = load_blob(pdir / f"delta-{batch:012d}.bin")
            if delta.get("parent") != state.token:  # a gap in the chain
                raise StoreError(self._broken(pid, state.version, batch - 1))
            state.apply(delta)
            if batch in files["patch"]:
                state.apply_patch(load_blob(pdir / f"patch-{batch:012d}.bin"))
            state.version = batch
        return state

    def _broken(self, pid: int, after: int, upto: int) -> str:
        """One line naming what is missing from partition ``pid``'s chain after batch ``after``."""
        pdir = self._pdir(pid)
        tail = "; restore it from a backup or start on a new checkpoint"
        if not pdir.is_dir():
            return f"{pdir} is missing: partition {pid} has committed state{tail}"
        prefix = f"{pdir.relative_to(self.root)}/"
        for batch in self.committed():
            if not after < batch <= upto:
                continue
            with contextlib.suppress(StoreError):
                for rel in sorted(self.commit_info(batch).get("state", {})):
                    if rel.startswith(prefix) and not (self.root / rel).exists():
                        return (
                            f"{self.root / rel} is missing: partition {pid}'s state after batch "
                            f"{batch} cannot be rebuilt without it{tail}"
                        )
        return (
            f"{pdir}: partition {pid}'s state after batch {after} does not lead to the "
            f"version committed by batch {upto} (a state file is missing or was replaced){tail}"
        )

    def save(self, pid: int, state: PartitionState, batch: int, snapshot: bool) -> str:
        """Write the pending batch's delta (and a snapshot when asked); keep it in the cache.

        Returns the new version's token.
        """
        state.token = uuid.uuid4().hex
        pdir = self._pdir(pid)
        write_atomic(pdir / f"delta-{batch:012d}.bin", dump_blob(state.delta()))
        if snapshot:
            write_atomic(
                pdir / f"snap-{batch:012d}.bin",
                dump_blob(
                    {
                        "tables": {
                            t: flat_columns(rows) if t in state.flat else columns(rows)
                            for t, rows in state.data.items()
                        },
                        "meta": state.meta,
                        "token": state.token,
                    }
                ),
            )
        _CACHE[(str(self.root), pid)] = state
        return state.token

    def job_meta(self, runner: str) -> dict[str, Any] | None:
        """The store's ``job.json`` (None before a first start), checked to be ``runner``'s.

        ``runner``: ``spark`` (a query's store: its batches are Spark's
        micro-batches, numbered in its checkpoint) or ``local`` (``run_local``'s,
        numbered by itself).  A batch of one in the other's store would take the
        number of the other's next batch, which would then be skipped as done.
        """
        path = self.root / "job.json"
        if not path.exists():
            return None
        meta = json_record(path, "job record")
        found = meta.get("runner", "spark")  # stores from before the key were Spark's
        if found != runner:
            names = {"spark": "a Spark query", "local": "run_local"}
            raise StoreError(
                f"{self.root} is the store of {names.get(found, found)}; "
                f"{names.get(runner, runner)} needs a store of its own"
            )
        return meta

    def write_init(self, pid: int, table: str, values: dict[Any, dict[Any, Any]]) -> None:
        """Write a partition's initial rows of ``table`` (partition value -> key -> row)."""
        write_atomic(self._pdir(pid) / f"init-{table}.bin", dump_blob(columns(values)))

    def trim(self, pid: int, keep_from: int) -> None:
        """Delete snapshots and deltas that no restart can need (before ``keep_from``)."""
        pdir = self._pdir(pid)
        if not pdir.exists():
            return
        for entry in os.listdir(pdir):
            match = _NAME.fullmatch(entry)
            if match and int(match.group(2)) < keep_from:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(pdir / entry)

    # -- per-batch files written by tasks --------------------------------------------
    def write_lines(
        self, kind: str, name: str, batch: int, role: str, lines: list[str]
    ) -> dict[str, list[int]]:
        """Write a task's lines for batch ``batch`` (outputs, history or errors).

        Returns the file's entry for the batch's commit marker, ``{path under the
        store: [crc32, size]}``: the task hands it to the driver with its counters
        (:meth:`commit`), so the driver never reads the file back.
        """
        folder = self.batch_dir(kind, name, batch)
        path = folder / f"{role}.{'txt' if kind == 'history' else 'jsonl'}"
        payload = ("\n".join(lines) + "\n" if lines else "").encode()
        write_atomic(path, payload)
        return {str(path.relative_to(self.root)): [zlib.crc32(payload), len(payload)]}

    def write_transient(self, kind: str, batch: int, name: str, obj: Any) -> None:
        """Hand ``obj`` from a task of batch ``batch`` to a later phase (``shipped``, ``back``).

        Checksummed like the state, not fsynced: these files live until the batch
        commits (:meth:`drop_transient`), and a batch that did not commit runs again.
        """
        write_atomic(self.batch_dir(kind, "", batch) / f"{name}.bin", dump_blob(obj), durable=False)

    def read_transient(self, kind: str, batch: int, prefix: str = "") -> list[tuple[str, Any]]:
        """The ``(name, obj)`` handed over in batch ``batch`` whose names start with ``prefix``."""
        folder = self.batch_dir(kind, "", batch)
        if not folder.is_dir():
            return []
        return [(p.stem, load_blob(p)) for p in sorted(folder.glob(f"{prefix}*.bin"))]

    def drop_transient(self, batch: int) -> None:
        """Remove batch ``batch``'s hand-over files (it committed, or it runs again)."""
        import shutil

        for kind in TRANSIENT:
            folder = self.batch_dir(kind, "", batch)
            if folder.is_dir():
                shutil.rmtree(folder)

    def batch_dir(self, kind: str, name: str, batch: int) -> Path:
        """The folder of batch ``batch``'s files of one kind (and output name)."""
        base = self.root / kind / name if name else self.root / kind
        return base / f"batch-{batch:012d}"

    # -- driver side ------------------------------------------------------------------
    def committed(self) -> list[int]:
        """The committed batch ids, in order."""
        folder = self.root / "commits"
        if not folder.exists():
            return []
        return sorted(int(p.stem) for p in folder.glob("*.json") if p.stem.isdigit())

    def is_committed(self, batch: int) -> bool:
        """Whether batch ``batch`` has its commit marker."""
        return (self.root / "commits" / f"{batch:012d}.json").exists()

    def commit(self, batch: int, info: dict[str, Any], files: dict[str, list[int]]) -> None:
        """Write batch ``batch``'s commit marker: from now on its files count.

        ``files``: the outputs, histories and failure records the batch's tasks
        wrote, each with the ``[crc32, size]`` its task computed as it wrote it
        (:meth:`write_lines`); the driver checks only that each is there with that
        size.  The marker names them and the batch's state files
        (:meth:`state_files`) and, in ``info["prev"]``, the batch committed before
        it: the readers and a restart check that the markers form a chain and that
        the files they name are there and unchanged (:meth:`chain`,
        :meth:`check_files`).
        """
        for rel, (_crc, size) in sorted(files.items()):
            path = self.root / rel
            try:
                found = path.stat().st_size
            except FileNotFoundError:
                found = -1
            if found != size:
                what = "is missing" if found < 0 else f"has {found} bytes, not {size}"
                raise StoreError(
                    f"{path} {what} (its task wrote it in batch {batch}); the batch is not "
                    "committed and runs again"
                )
        info = {**info, "files": dict(sorted(files.items())), "state": self.state_files(batch)}
        body = json.dumps(info, sort_keys=True)
        payload = json.dumps({"crc": zlib.crc32(body.encode()), "info": info}, sort_keys=True)
        write_atomic(self.root / "commits" / f"{batch:012d}.json", payload.encode())

    def state_files(self, batch: int) -> dict[str, int]:
        """The partitions' state files of batch ``batch``, by path under the store, with sizes.

        They carry their own checksum, checked when they are loaded; the sizes
        let a restart find one that is missing or cut short (:meth:`check_state`).
        """
        state: dict[str, int] = {}
        names = {f"{kind}-{batch:012d}.bin" for kind in ("snap", "delta", "patch")}
        state_dir = self.root / "state"
        if state_dir.is_dir():
            for pdir in sorted(state_dir.iterdir()):
                for name in sorted(names.intersection(os.listdir(pdir))):
                    path = pdir / name
                    state[str(path.relative_to(self.root))] = path.stat().st_size
        return state

    def commit_info(self, batch: int) -> dict[str, Any]:
        """The information stored with batch ``batch``'s commit (checked)."""
        path = self.root / "commits" / f"{batch:012d}.json"
        try:
            record = json.loads(path.read_text())
            body = json.dumps(record["info"], sort_keys=True)
            if zlib.crc32(body.encode()) != record["crc"]:
                raise ValueError("checksum mismatch")
        except FileNotFoundError:
            raise StoreError(
                f"{path} is missing (the commit marker of batch {batch}); restore it from a "
                "backup or start on a new checkpoint"
            ) from None
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"{path}: damaged commit marker ({exc})") from None
        info: dict[str, Any] = record["info"]
        return info

    def chain(self) -> list[tuple[int, dict[str, Any]]]:
        """The committed batches with their markers, checked to form a chain.

        Each marker names the batch committed before it (``prev``): a marker
        deleted in the middle (or the first one) is a :class:`StoreError`
        naming it, never a batch left out without a word.
        """
        chain: list[tuple[int, dict[str, Any]]] = []
        before = -1
        for batch in self.committed():
            info = self.commit_info(batch)
            prev = info.get("prev")
            if isinstance(prev, int) and prev != before and prev >= 0:
                missing = self.root / "commits" / f"{prev:012d}.json"
                raise StoreError(
                    f"{missing} is missing: the commit marker of batch {prev}, which batch "
                    f"{batch}'s marker names as the batch before it; restore it from a backup "
                    "(reading on would leave that batch out)"
                )
            chain.append((batch, info))
            before = batch
        return chain

    def check_files(self, batch: int, info: dict[str, Any], prefix: str) -> list[Path]:
        """The files under ``prefix`` that batch ``batch``'s marker names, checked to be there.

        A missing file, or one of another size or checksum, is a :class:`StoreError`
        naming it.  A marker written before markers named their files (an older
        store) gives the files found in the batch's folder.
        """
        if "files" not in info:
            folder = self.root / prefix
            return sorted(folder.glob("*")) if folder.is_dir() else []
        found = []
        for rel, (crc, size) in sorted(info["files"].items()):
            if not rel.startswith(prefix):
                continue
            path = self.root / rel
            try:
                raw = path.read_bytes()
            except FileNotFoundError:
                raise StoreError(
                    f"{path} is missing (batch {batch} committed it); restore it from a backup"
                ) from None
            if len(raw) != size or zlib.crc32(raw) != crc:
                raise StoreError(
                    f"{path}: checksum mismatch (changed or damaged since batch {batch} "
                    "committed it); restore it from a backup"
                )
            found.append(path)
        return found

    def check_state(self) -> None:
        """Check at a start that every partition's committed state can be rebuilt.

        The last marker names each partition's committed version (``tokens``);
        the markers name the state files each batch wrote.  A partition whose
        folder is gone, or a file after its newest snapshot that is gone or cut
        short, is a :class:`StoreError` naming it (a start would otherwise run the
        partition on empty or older state).
        """
        chain = self.chain()
        if not chain:
            return
        last = chain[-1][1]
        for pid_text in sorted(last.get("tokens", {}), key=int):
            pid = int(pid_text)
            pdir = self._pdir(pid)
            if not pdir.is_dir():
                raise StoreError(
                    f"{pdir} is missing: batch {chain[-1][0]} committed state of partition "
                    f"{pid} there; restore it from a backup or start on a new checkpoint"
                )
            names = sorted(os.listdir(pdir))
            for name in names[-1:]:  # a store of the pickle format: refused before it runs
                with open(pdir / name, "rb") as handle:
                    if handle.read(len(OLD_MAGIC)) == OLD_MAGIC:
                        load_blob(pdir / name)  # (raises, naming the file and what to do)
            snaps = [
                int(m.group(2))
                for m in map(_NAME.fullmatch, names)
                if m and m.group(1) == "snap" and int(m.group(2)) <= chain[-1][0]
            ]
            start = max(snaps, default=-1)
            prefix = f"{pdir.relative_to(self.root)}/"
            for batch, info in chain:
                if batch < start:
                    continue
                for rel, size in info.get("state", {}).items():
                    if not rel.startswith(prefix) or (batch == start and "/patch-" not in rel):
                        continue
                    path = self.root / rel
                    if not path.exists() or path.stat().st_size != size:
                        what = "is missing" if not path.exists() else "was cut short or changed"
                        raise StoreError(
                            f"{path} {what}: partition {pid}'s state after batch {batch} needs "
                            "it; restore it from a backup or start on a new checkpoint"
                        )

    def clear_uncommitted(self, batch: int) -> None:
        """Remove the files an earlier, uncommitted attempt of ``batch`` left."""
        import shutil

        self.drop_transient(batch)
        for kind in ("outputs", "history", "errors"):
            base = self.root / kind
            if not base.exists():
                continue
            folders = [base / f"batch-{batch:012d}"]
            folders += [d / f"batch-{batch:012d}" for d in base.iterdir() if d.is_dir()]
            for folder in folders:
                if folder.is_dir():
                    shutil.rmtree(folder)

    def lock(self) -> StoreLock:
        """Take the store's owner lock (one running job per store directory)."""
        return StoreLock(self.root)


class StoreLock:
    """An exclusive ``flock`` on ``ROOT/LOCK`` naming its owner; released by :meth:`release`."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.path = root / "LOCK"
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(self._fd, 200, 0).decode(errors="replace").strip() or "unknown"
            os.close(self._fd)
            raise StoreLockedError(
                f"store {root} is in use by {owner}; stop that job first (one job per store)"
            ) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)

    def release(self) -> None:
        """Give the store up."""
        if self._fd >= 0:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1
