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

Every ``.bin`` file is ``MAGIC | crc32 | length | tagged JSON`` (:mod:`.store_files`,
:mod:`.codec`, never pickle) and is written to a temporary name, fsynced and renamed, so a
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

Python workers keep the state of the partitions they ran
(:class:`~.partition_state.PartitionState`) in memory (:data:`_CACHE`), tagged
with the batch it reflects, so the next batch on the same worker reads nothing
from disk; a worker that has not seen the partition loads the latest snapshot
and the deltas after it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import socket
import uuid
import zlib
from pathlib import Path
from typing import Any

from txstream.spark.runtime.errors import StoreError, StoreLockedError
from txstream.spark.runtime.partition_state import (
    ABSENT,
    Data,
    PartitionState,
    columns,
    flat_columns,
    nested,
)
from txstream.spark.runtime.store_files import (
    MAGIC,
    OLD_MAGIC,
    dump_blob,
    json_record,
    load_blob,
    usable_directory,
    write_atomic,
)

# The file format and the partition state moved to modules of their own; their
# names are still imported from here.
__all__ = [
    "ABSENT",
    "MAGIC",
    "OLD_MAGIC",
    "TRANSIENT",
    "Data",
    "PartitionState",
    "RuntimeStore",
    "StoreError",
    "StoreLock",
    "StoreLockedError",
    "columns",
    "dump_blob",
    "flat_columns",
    "json_record",
    "load_blob",
    "nested",
    "usable_directory",
    "write_atomic",
]


def _meta_crc(meta: dict[str, Any]) -> int:
    # (of the record as read back: a tuple is a list there, an int key a string)
    return zlib.crc32(json.dumps(json.loads(json.dumps(meta)), sort_keys=True).encode())


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

    def state_for(
        self, pid: int, batch: int, prev: int, token: str | None, pre_images: bool = True
    ) -> PartitionState:
        """The partition's state after batch ``prev`` (the last that ran), ready for ``batch``.

        ``token`` names the version the driver committed for this partition; a
        worker's cached state is used only when it is that version (another
        worker may have run the partition since, or rewritten it in phase 3).
        ``pre_images``: keep the batch's pre-images, so that a re-run of it on
        this worker rolls back in memory; without, a re-run loads the state
        again (see :attr:`PartitionState.pre_images`).
        """
        key = (str(self.root), pid)
        state = _CACHE.pop(key, None)
        if state is not None and state.pending is not None:
            if state.pending == batch:
                if not state.rollback():  # (its pre-images were not kept)
                    state = None
            else:
                state.settle()
        if state is None or token is None or state.token != token:
            state = self._catch_up(pid, state, prev, token) or self.load(pid, prev, token)
        state.version = prev
        _CACHE[key] = state
        state.begin(batch, pre_images)
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
        meta = self.job_record()
        if meta is None:
            committed = self.committed()
            # (the driver engine writes markers and no job.json: its start refuses them)
            if committed and self.commit_info(committed[-1]).get("engine") != "driver":
                raise StoreError(
                    f"{path} is missing, and the store holds committed batches: restore it "
                    "from a backup, or start on a new store (a restart cannot check the job "
                    "against the store without it)"
                )
            return None
        found = meta.get("runner", "spark")  # stores from before the key were Spark's
        if found != runner:
            names = {"spark": "a Spark query", "local": "run_local"}
            raise StoreError(
                f"{self.root} is the store of {names.get(found, found)}; "
                f"{names.get(runner, runner)} needs a store of its own"
            )
        return meta

    def job_record(self) -> dict[str, Any] | None:
        """The store's ``job.json`` as written (None when there is none), checked.

        The record carries a CRC-32 of its other keys (``crc``; a record written
        before it carries none): a change to it would otherwise go unnoticed or
        be read as a change of the job.  Damaged, a :class:`StoreError` naming it.
        """
        path = self.root / "job.json"
        if not path.exists():
            return None
        meta = json_record(path, "job record")
        crc = meta.pop("crc", None)
        # (a record that names its placement rule was written with a checksum: one
        # without is a damaged "crc" key, not an older record)
        if (crc is None and "placement" in meta) or (crc is not None and crc != _meta_crc(meta)):
            raise StoreError(
                f"{path}: damaged job record (checksum mismatch); restore it from a backup"
            )
        return meta

    def write_job_record(self, meta: dict[str, Any]) -> None:
        """Write ``job.json`` (``meta`` and its checksum, see :meth:`job_record`)."""
        body = {**meta, "crc": _meta_crc(meta)}
        write_atomic(self.root / "job.json", json.dumps(body).encode())

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
                if missing.exists():  # (then it is this marker that is out of place)
                    marker = self.root / "commits" / f"{batch:012d}.json"
                    after = f"batch {before}" if before >= 0 else "no batch"
                    raise StoreError(
                        f"{marker}: the commit marker names batch {prev} as the batch before "
                        f"it, but {after} is (a marker copied over another's); restore it from "
                        "a backup"
                    )
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
        # A batch that is not committed was delivered to no sink: a delivery record
        # left from elsewhere (a lost marker, a copied store) would skip its delivery.
        sinks = self.root / "sinks"
        if sinks.is_dir():
            for folder in sinks.iterdir():
                with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                    os.unlink(folder / f"{batch:012d}.done")

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
