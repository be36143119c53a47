"""Reading what a job committed: outputs, failures and its history as one history.

Only committed batches count (``commits/<b>.json`` exists); within a batch the
rows come in the declared order of the transactions that emitted them.  The
history's ``arrival`` line is built from the declared order recorded with each
transaction (batch, order value, input, source position), never from the order
in which transactions committed or the files were written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from txstream.errors import TxStreamError
from txstream.model.history import History
from txstream.model.notation import parse_one
from txstream.spark.runtime.state import RuntimeStore, StoreError, json_record

DRIVER_HISTORY = "driver-history.txt"
"""The history the driver engine's transaction manager recorded, written when its query stops."""


def is_runtime_store(path: str | Path, with_history: bool = False) -> bool:
    """Whether ``path`` is a runtime store (or a job checkpoint holding one).

    ``with_history``: only one that recorded a history (``recordHistory``).
    """
    root = Path(path)
    for store in (root, root / "txstream"):
        if (store / "commits").is_dir():
            return not with_history or (store / "history").is_dir()
    return False


def _holds_store(folder: Path) -> bool:
    """Whether ``folder`` is a store: it committed a batch, or a job started on it."""
    return (
        (folder / "commits").is_dir()
        or (folder / "job.json").is_file()
        or (folder / DRIVER_HISTORY).is_file()
    )


def _store(path: str | Path) -> RuntimeStore:
    """The store at ``path`` (a store, or a checkpoint holding one in ``txstream/``).

    A path that holds neither is a one-line error: the readers never answer
    "nothing" for a path that a typo made up.
    """
    root = Path(path)
    if not _holds_store(root) and _holds_store(root / "txstream"):
        root = root / "txstream"
    if not _holds_store(root):
        raise TxStreamError(f"{path}: not a txstream checkpoint or store (nothing committed there)")
    return RuntimeStore(root)


def read_output(path: str | Path, name: str, with_order: bool = False) -> list[dict[str, Any]]:
    """The rows emitted to output ``name`` by committed transactions, in order.

    A path that holds no job, or a name the job did not declare, is an error
    (not an empty list: a typo would read as "nothing was emitted").
    """
    store = _store(path)
    job = store.root / "job.json"
    declared = json_record(job, "job record").get("outputs") if job.exists() else None
    if declared is not None and name not in declared:
        raise TxStreamError(
            f"{path}: the job declared no output {name!r}; outputs: {', '.join(declared) or '-'}"
        )
    rows: list[tuple[Any, dict[str, Any]]] = []
    for batch in store.committed():
        folder = store.batch_dir("outputs", name, batch)
        if not folder.is_dir():
            continue
        for part in sorted(folder.glob("*.jsonl")):
            for order, row in _output_rows(part):
                rows.append(((batch, *order), row))
    rows.sort(key=lambda item: item[0])
    if with_order:
        return [{**row, "__order": list(order)} for order, row in rows]
    return [row for _, row in rows]


def read_batch_output(store: RuntimeStore, name: str, batch: int) -> list[dict[str, Any]]:
    """The rows of output ``name`` in one batch, in order (without their order field)."""
    folder = store.batch_dir("outputs", name, batch)
    rows: list[tuple[Any, dict[str, Any]]] = []
    for part in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
        rows += _output_rows(part)
    rows.sort(key=lambda item: item[0])
    return [row for _, row in rows]


def _output_rows(part: Path) -> list[tuple[Any, dict[str, Any]]]:
    """(order, row) of each line of an output part file; a damaged line is a StoreError."""
    rows = []
    for line in part.read_text().splitlines():
        row = json_record(part, "output row", line)
        if "__order" not in row:
            raise StoreError(f"{part}: damaged output row (no __order)")
        rows.append((row.pop("__order"), row))
    return rows


def read_failures(path: str | Path) -> list[dict[str, Any]]:
    """Every transaction rolled back in a committed batch, with its input position and error.

    A path that holds no job is an error (as for :func:`read_output`).
    One entry per transaction, in the declared order; a transaction with parts on
    several partitions that failed names the event whose function failed and its error.
    """
    store = _store(path)
    failures = []
    for batch in store.committed():
        folder = store.batch_dir("errors", "", batch)
        for part in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
            for line in part.read_text().splitlines():
                failure = json_record(part, "failure record", line)
                failure["batch"] = batch
                failures.append(failure)
    by_batch: dict[int, list[dict[str, Any]]] = {}
    for failure in failures:
        by_batch.setdefault(failure["batch"], []).append(failure)
    return [f for batch in sorted(by_batch) for f in one_per_transaction(by_batch[batch])]


def one_per_transaction(failures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One batch's ``failures``, one per transaction, in the declared order.

    A transaction with parts on several partitions is rolled back on each of them
    and each part reports it; it failed once, at the part whose failing event
    comes first (``at``): since the parts touch disjoint values, that event fails
    in serial execution too, so the report does not depend on ``partitions``.
    Its ``order`` is its first event's on any partition (a part's own ``order``
    is that of its first event there).
    """
    chosen: dict[str, dict[str, Any]] = {}
    first: dict[str, list[Any]] = {}
    for failure in failures:
        txn, at = failure["txn"], failure.get("at", failure["order"])
        best = chosen.get(txn)
        if best is None or at < best.get("at", best["order"]):
            chosen[txn] = failure
        if txn not in first or failure["order"] < first[txn]:
            first[txn] = failure["order"]
    unique = [{**f, "order": first[txn]} for txn, f in chosen.items()]
    unique.sort(key=lambda f: f["order"])
    return unique


def history_text(path: str | Path, stream: str = "IN") -> str:
    """The committed runs of a store as one history in the notation.

    A path that holds no job, or a job that recorded no history, is an error.
    """
    store = _store(path)
    driver = store.root / DRIVER_HISTORY
    if driver.is_file() and not (store.root / "history").is_dir():
        return driver.read_text()
    if not (store.root / "history").is_dir():
        raise TxStreamError(
            f"{path}: this job recorded no history; start it with .option('recordHistory', True)"
        )
    fates: dict[str, tuple[tuple[Any, ...], str]] = {}
    operations: list[str] = []
    for batch in store.committed():
        folder = store.batch_dir("history", "", batch)
        parts = sorted(folder.glob("*.txt")) if folder.is_dir() else []
        # Phase-1 files before the coordinator's: a deferred value's operations
        # all come after its phase-1 operations.
        parts.sort(key=lambda p: p.stem.startswith("coord"))
        for part in parts:
            for line in part.read_text().splitlines():
                if line.startswith("T "):
                    _, gid, fate, ordv, index, mid = line.split()
                    order = (batch, float(ordv), int(index), int(mid))
                    known = fates.get(gid)
                    if known is None or known[1] == "c":
                        fates[gid] = (min(order, known[0]) if known else order, fate)
                else:
                    operations.append(line)
    arrival = sorted(fates, key=lambda gid: fates[gid][0])
    lines = [f"# committed history of {store.root}"]
    if arrival:
        lines.append(f"arrival {stream}: " + " ".join(arrival))
    lines.extend(operations)
    lines.extend(("c" if fates[gid][1] == "c" else "a") + gid for gid in arrival)
    return "\n".join(lines) + "\n"


def read_history(path: str | Path) -> History:
    """The committed runs of a store as one :class:`History` (for the checkers)."""
    return parse_one(history_text(path), source=str(path))
