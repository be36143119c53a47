"""Reading what a job committed: outputs, failures and its history as one history.

Only committed batches count (``commits/<b>.json`` exists); within a batch the
rows come in the declared order of the transactions that emitted them.  The
history's ``arrival`` line is built from the declared order recorded with each
transaction (batch, order value, input, source position), never from the order
in which transactions committed or the files were written.
"""

from __future__ import annotations

import json
import numbers
from operator import itemgetter
from pathlib import Path
from typing import Any

from txstream.errors import TxStreamError
from txstream.model.history import History
from txstream.model.notation import parse_one
from txstream.spark.runtime.recorded import MARK, expand
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

    >>> import txstream as tx
    >>> def greet(t, e):
    ...     t.emit("greetings", {"text": "hello " + e["name"]})
    >>> job = tx.Job().input("people", None, keys="name").output("greetings").on("people", greet)
    >>> _ = job.run_local([[("people", {"name": "ada"}), ("people", {"name": "bob"})]],
    ...                   "ckpt/output")
    >>> tx.read_output("ckpt/output", "greetings")
    [{'text': 'hello ada'}, {'text': 'hello bob'}]
    >>> tx.read_output("ckpt/output", "greeting")
    Traceback (most recent call last):
    txstream.errors.TxStreamError: ckpt/output: the job declared no output 'greeting'; outputs:
    greetings
    """
    store = _store(path)
    declared = (store.job_record() or {}).get("outputs")
    if declared is not None and name not in declared:
        raise TxStreamError(
            f"{path}: the job declared no output {name!r}; outputs: {', '.join(declared) or '-'}"
        )
    rows: list[tuple[Any, dict[str, Any]]] = []
    for batch, info in store.chain():
        for part in _parts(store, batch, info, "outputs", name):
            for order, row in _output_rows(part):
                rows.append(((batch, *order), row))
    rows.sort(key=lambda item: item[0])
    if with_order:
        return [{**row, "__order": list(order)} for order, row in rows]
    return [row for _, row in rows]


def read_output_arrow(path: str | Path, name: str) -> Any:
    """:func:`read_output` as a ``pyarrow.Table`` (columns inferred from the rows).

    An output that emitted nothing gives an empty table with no columns.

    >>> import txstream as tx
    >>> job = (tx.Job().input("people", None, keys="name").output("greetings")
    ...        .on("people", lambda t, e: t.emit("greetings", {"text": "hi " + e["name"]})))
    >>> people = [("people", {"name": "ada"}), ("people", {"name": "bob"})]
    >>> _ = job.run_local([people], "ckpt/arrow")
    >>> tx.read_output_arrow("ckpt/arrow", "greetings").to_pylist()
    [{'text': 'hi ada'}, {'text': 'hi bob'}]
    """
    import pyarrow as pa

    try:
        return arrow_table(read_output(path, name))
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise TxStreamError(
            f"{path}: output {name!r} has rows no Arrow column type fits ({exc}); "
            "read it with tx.read_output"
        ) from None


def arrow_table(rows: list[dict[str, Any]]) -> Any:
    """``rows`` as a ``pyarrow.Table`` with a column for every key of any row (None elsewhere).

    ``pa.Table.from_pylist`` takes its columns from the first row alone, so a
    column that the first row lacks was dropped without a word.  Columns come
    in the order they first appear; a column whose values no one Arrow type
    holds raises as ``from_pylist`` does.
    """
    import pyarrow as pa

    names = list(dict.fromkeys(column for row in rows for column in row))
    return pa.Table.from_pydict({n: [row.get(n) for row in rows] for n in names})


def read_output_pandas(path: str | Path, name: str) -> Any:
    """:func:`read_output` as a ``pandas.DataFrame``, in commit order.

    >>> import txstream as tx
    >>> job = (tx.Job().input("people", None, keys="name").output("greetings")
    ...        .on("people", lambda t, e: t.emit("greetings", {"text": "hi " + e["name"]})))
    >>> people = [("people", {"name": "ada"}), ("people", {"name": "bob"})]
    >>> _ = job.run_local([people], "ckpt/pandas")
    >>> tx.read_output_pandas("ckpt/pandas", "greetings")["text"].tolist()
    ['hi ada', 'hi bob']
    """
    import pandas as pd  # type: ignore[import-untyped]

    return pd.DataFrame.from_records(read_output(path, name))


def _parts(
    store: RuntimeStore, batch: int, info: dict[str, Any], kind: str, name: str
) -> list[Path]:
    """The files of one kind a committed batch wrote, checked against its marker."""
    folder = store.batch_dir(kind, name, batch)
    return store.check_files(batch, info, f"{folder.relative_to(store.root)}/")


def read_batch_output(store: RuntimeStore, name: str, batch: int) -> list[dict[str, Any]]:
    """The rows of output ``name`` in one batch, in order (without their order field)."""
    rows: list[tuple[Any, dict[str, Any]]] = []
    for part in _parts(store, batch, store.commit_info(batch), "outputs", name):
        rows += _output_rows(part)
    rows.sort(key=itemgetter(0))
    return [row for _, row in rows]


def _output_rows(part: Path) -> list[tuple[Any, dict[str, Any]]]:
    """(order, row) of each line of an output part file; a damaged line is a StoreError."""
    lines = part.read_text().splitlines()
    try:
        # One parse for the whole file: a sink reads every batch's rows on the
        # driver, and a json.loads call per line cost 4-5 us a row there.
        records = json.loads(f"[{','.join(lines)}]")
    except ValueError:
        records = None  # (some line is damaged: the per-line parse below names it)
    if records is None or len(records) != len(lines):
        records = [json_record(part, "output row", line) for line in lines]
    try:
        return [(row.pop("__order"), row) for row in records]
    except (KeyError, AttributeError, TypeError):  # (a row without __order, or not an object)
        raise StoreError(f"{part}: damaged output row (no __order)") from None


def read_failures(path: str | Path) -> list[dict[str, Any]]:
    """Every transaction rolled back in a committed batch, with its input position and error.

    A path that holds no job is an error (as for :func:`read_output`).
    One entry per transaction, in the declared order; a transaction with parts on
    several partitions that failed names the event whose function failed and its error.

    >>> import txstream as tx
    >>> def open_account(t, e):
    ...     t.insert("accounts", {"acct": e["acct"], "balance": 0})
    >>> job = (tx.Job().table("accounts", key="acct").input("opens", None, keys="acct")
    ...        .on("opens", open_account))
    >>> _ = job.run_local([[("opens", {"acct": 1}), ("opens", {"acct": 1})]], "ckpt/failures")
    >>> [(f["position"], f["kind"], f["error"]) for f in tx.read_failures("ckpt/failures")]
    [('opens#1', 'error', 'DuplicateKeyError: insert into accounts: key 1 exists')]
    """
    store = _store(path)
    failures = []
    for batch, info in store.chain():
        for part in _parts(store, batch, info, "errors", ""):
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
    recorded = (store.root / "history").is_dir()  # (once a transaction has run)
    if not recorded and not any(info.get("history") for _, info in store.chain()):
        raise TxStreamError(
            f"{path}: this job recorded no history: start it with .option('recordHistory', "
            "True) (a job that records one writes it once a transaction has run)"
        )
    fates: dict[str, tuple[tuple[Any, ...], str]] = {}
    files: list[tuple[str, list[str]]] = []  # (role, operations)
    for batch, info in store.chain() if recorded else ():  # (else: an empty history)
        parts = _parts(store, batch, info, "history", "")
        # Phase-1 files before the coordinator's: a deferred value's operations
        # all come after its phase-1 operations.
        parts.sort(key=lambda p: p.stem.startswith("coord"))
        for part in parts:
            operations = []
            for line in part.read_text().splitlines():
                if line.startswith("T "):
                    _, gid, fate, ordv, index, mid = line.split()
                    _fate(fates, gid, (batch, float(ordv), int(index), int(mid)), fate)
                elif line.startswith(MARK):  # (the compact form: see recorded.py)
                    ops, commits = expand(line, batch, str(part))
                    operations.extend(ops)
                    for gid, (at, index, mid) in commits:
                        _fate(fates, gid, (batch, at, index, mid), "c")
                else:
                    operations.append(line)
            files.append((part.stem, operations))
    operations = _expand_table_reads(files)
    arrival = sorted(fates, key=lambda gid: fates[gid][0])
    lines = [f"# committed history of {store.root}"]
    if arrival:
        lines.append(f"arrival {stream}: " + " ".join(arrival))
    lines.extend(operations)
    lines.extend(("c" if fates[gid][1] == "c" else "a") + gid for gid in arrival)
    return "\n".join(lines) + "\n"


def _fate(
    fates: dict[str, tuple[tuple[Any, ...], str]], gid: str, order: tuple[Any, ...], fate: str
) -> None:
    """Record transaction ``gid``'s fate (a part aborted anywhere: aborted) and first order."""
    known = fates.get(gid)
    if known is None or known[1] == "c":
        fates[gid] = (min(order, known[0]) if known else order, fate)


def _expand_table_reads(files: list[tuple[str, list[str]]]) -> list[str]:
    """Every file's operations, a read of a whole table (``rT(t:*)``) spelled out.

    A global read records one read of ``t:*`` per partition (see
    ``executor.table_item``); it stands for a read of every row and row set of
    ``t`` on that partition, as of its place there.  It becomes a read of every
    item of ``t`` that the partition's history files (its role, over all
    batches) name: a conflict needs a write, and every write of a row there is
    named there.  A row named only in the deferred phase's files (a job that
    ran some batches with ``crossPartition="defer"``) is left out; its writes
    there come from earlier batches, whose conflicts with the read follow the
    arrival order anyway.
    """
    if not any(op.endswith(":*)") for _, ops in files for op in ops):
        return [op for _, ops in files for op in ops]
    named: dict[str, dict[str, set[str]]] = {}  # role -> table -> items
    for role, ops in files:
        tables = named.setdefault(role, {})
        for op in ops:
            item = op[op.find("(") + 1 : -1]
            if ":" in item and not item.endswith(":*"):
                tables.setdefault(item.split(":", 1)[0], set()).add(item)
    out: list[str] = []
    for role, ops in files:
        for op in ops:
            if op.endswith(":*)"):
                head = op[: op.index("(") + 1]
                table = op[len(head) : -3]
                out.extend(f"{head}{item})" for item in sorted(named[role].get(table, ())))
            else:
                out.append(op)
    return out


def read_history(path: str | Path) -> History:
    """The committed runs of a store as one :class:`History` (for the checkers).

    The job must record it (``.option("recordHistory", True)``).

    >>> import txstream as tx
    >>> from txstream.model import check
    >>> def move(t, e):
    ...     t.increment("stock", e["item"], "n", e["by"])
    >>> job = (tx.Job().table("stock", key="item", initial=[{"item": "x", "n": 0}])
    ...        .input("moves", None, keys="item", order="ts").on("moves", move)
    ...        .option("recordHistory", True))
    >>> _ = job.run_local([[("moves", {"item": "x", "by": 2, "ts": 1}),
    ...                     ("moves", {"item": "x", "by": -1, "ts": 2})]], "ckpt/history")
    >>> history = tx.read_history("ckpt/history")
    >>> len(history.operations), check(history, "csao").holds
    (4, True)
    """
    text = history_text(path)
    if "\n" not in text.rstrip("\n"):  # (recorded, and no transaction ran yet)
        return History(meta={"title": text[2:].strip()})
    return parse_one(text, source=str(path))


def read_table(path: str | Path, table: str, batch: int | None = None, as_: str = "dicts") -> Any:
    """A table's committed rows (key columns included), at the last or a given committed batch.

    ``as_``: ``"dicts"`` (a list of dicts, in key order), ``"pandas"`` (a
    DataFrame) or ``"arrow"`` (a ``pyarrow.Table``).  ``batch`` must be a
    committed batch whose state files are still kept (a job keeps its last two
    snapshots and the deltas since: see ``snapshotEvery``); otherwise a one-line
    error says which batches can be read.  A missing or damaged state file is a
    :class:`~txstream.spark.runtime.errors.StoreError` naming it.

    >>> import tempfile, txstream as tx
    >>> def deposit(t, e):
    ...     if t.read("accounts", e["acct"]) is None:
    ...         t.insert("accounts", {"acct": e["acct"], "balance": 0})
    ...     t.increment("accounts", e["acct"], "balance", e["amount"])
    >>> job = (tx.Job("bank").table("accounts", key="acct").input("deposits", None, keys="acct")
    ...        .on("deposits", deposit))
    >>> store = tempfile.mkdtemp()
    >>> _ = job.run_local([[("deposits", {"acct": 1, "amount": 5})],
    ...                    [("deposits", {"acct": 1, "amount": 7})]], store)
    >>> tx.read_table(store, "accounts")
    [{'acct': 1, 'balance': 12}]
    >>> tx.read_table(store, "accounts", batch=0)
    [{'acct': 1, 'balance': 5}]
    """
    if as_ not in ("dicts", "pandas", "arrow"):
        raise TxStreamError(f"read_table: as_ is 'dicts', 'pandas' or 'arrow', not {as_!r}")
    # (True read batch 1 and "1" was "batch 1 is not a committed batch": say what it takes)
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, numbers.Integral)):
        raise TxStreamError(f"read_table: batch is a committed batch's number, not {batch!r}")
    store = _store(path)
    meta = store.job_record() or {}
    tables = meta.get("tables")
    if tables is not None and table not in tables:
        raise TxStreamError(
            f"{path}: the job declared no table {table!r}; tables: {', '.join(tables) or '-'}"
        )
    chain = store.chain()
    if not chain:
        raise TxStreamError(f"{path}: no batch committed yet; there are no table rows to read")
    batches = [b for b, _ in chain]
    at = batches[-1] if batch is None else batch
    if at not in batches:
        raise TxStreamError(
            f"{path}: batch {at} is not a committed batch; committed: {_spans(batches)}"
        )
    info = dict(chain)[at]
    tokens: dict[str, str] = info.get("tokens", {})
    partitions = int(meta.get("partitions", len(tokens)))
    key = list(tables[table]["key"]) if tables is not None else []
    rows: list[tuple[Any, dict[str, Any]]] = []
    for pid in range(partitions):
        try:
            state = store.load(pid, at, tokens.get(str(pid)))
        except StoreError:
            first = _first_readable(store, pid, batches)
            if first is not None and at < first:
                kept = _spans([b for b in batches if b >= first])
                raise TxStreamError(
                    f"{path}: the state of batch {at} is no longer kept (trimmed after later "
                    f"snapshots); batches that can be read: {kept}"
                ) from None
            raise
        for k, row in state.all_rows(table):
            full = dict(row)
            parts = k if len(key) > 1 and isinstance(k, tuple) else (k,)
            for column, part in zip(key, parts, strict=False):
                full.setdefault(column, part)
            rows.append((k, full))
    rows.sort(key=lambda item: _sort_key(item[0]))
    found = [row for _, row in rows]
    if as_ == "dicts":
        return found

    arrow = arrow_table(found)
    return arrow if as_ == "arrow" else arrow.to_pandas()


def _sort_key(key: Any) -> Any:
    """Keys of one table in a stable order, even when their types differ."""
    parts = key if isinstance(key, tuple) else (key,)
    return tuple((type(p).__name__, p) if p is not None else ("", 0) for p in parts)


def _first_readable(store: RuntimeStore, pid: int, batches: list[int]) -> int | None:
    """The first committed batch whose state partition ``pid`` still keeps (by its files).

    None when the partition's folder is gone (damage, not trimming).
    """
    folder = store.root / "state" / f"p{pid:05d}"
    if not folder.is_dir():
        return None
    names = {p.name for p in folder.iterdir()}
    if f"delta-{batches[0]:012d}.bin" in names:  # nothing trimmed yet
        return batches[0]
    snaps = sorted(int(n[5:17]) for n in names if n.startswith("snap-") and n.endswith(".bin"))
    return snaps[0] if snaps else batches[-1] + 1


def _spans(batches: list[int]) -> str:
    """``0-4, 7, 9-12``: a list of batch ids in ranges."""
    spans: list[list[int]] = []
    for b in batches:
        if spans and spans[-1][1] == b - 1:
            spans[-1][1] = b
        else:
            spans.append([b, b])
    return ", ".join(str(a) if a == z else f"{a}-{z}" for a, z in spans) or "none"
