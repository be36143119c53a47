"""What a job may change when it restarts on its checkpoint, checked before anything runs.

The store keeps rows by their table's key, in the partition of their partition
value; Spark's checkpoint resumes each input by its place in the query; and
the partitions keep order values across batches (the event-time merge's
frontier and held events, the timeslice clock).  A restart whose declarations
read that state differently would run on silently wrong state, so
``job.json`` records the job's *shape* (:func:`job_shape`) and every start
compares the job with it (:func:`restarted_meta`):

* **allowed**: other transaction functions (from the next batch that runs; a
  batch that did not commit before a crash runs again with the new ones), a
  new output, a new table without initial rows, a table left out (its rows
  stay in the store and come back if it is declared again), another boundary
  (except a timeslice of other seconds), another key column of an input with
  values of the same type, another merge (except leaving the event-time merge
  while it holds events), another watermark delay of an input (the merge keeps
  each input's largest order value, not the frontier: the new delay moves the
  frontier from there on; a larger one may hold events a little longer, a
  smaller one makes more of a late input's events late), options such as
  ``snapshotEvery``, ``onError`` and the trigger;
* **refused** in one line naming the change: another number of partitions,
  inputs added, removed, renamed or reordered, a table's ``key`` or
  ``partition_by``, a table's declared columns (a schema's column added,
  removed or of another type, a schema added or left out; type synonyms such
  as ``long``/``bigint`` are one type), a new table with initial rows once a batch committed,
  initial rows added to a table or changed once a batch committed (they would be ignored), an
  input key column of another type (long to string), another order column
  while order values are kept across batches (event-time merge, timeslice),
  a timeslice of other seconds, ``merge='batch'`` while events are held.

A store written before shapes were recorded is checked for what it records
(partitions) and records the shape of the job that restarts it; one whose
tables' records have no columns (written before they were recorded) takes
the restarting job's columns.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path, PurePath
from typing import Any

from txstream.spark.runtime.base import JobSpec, RuntimeJobError, canonical_kind
from txstream.spark.runtime.partitioning import partition_of
from txstream.spark.runtime.state import RuntimeStore

PLACEMENT = 2
"""The rule the store's rows were placed by (``job.json``'s ``placement``).

2: a bool as the int it equals (``True`` and ``1`` are one row, see
:mod:`.partitioning`).  A store without the field placed bools by the texts
``true``/``false``: its rows of boolean partition values may sit on another
partition than the one that now looks for them, so a restart checks it once
(:func:`_check_old_placement`).
"""

KEY_KINDS = {
    "IntegerType": "integer",
    "LongType": "integer",
    "ShortType": "integer",
    "ByteType": "integer",
    "StringType": "string",
    "BooleanType": "boolean",
}
"""The Python type a Spark key column's values have (every integer type gives an int)."""


def job_shape(
    spec: JobSpec,
    merge: str,
    key_types: dict[str, list[str]] | None = None,
    watermarks: dict[str, float] | None = None,
) -> dict[str, Any]:
    """What of the job the store's contents depend on (recorded in ``job.json``).

    ``key_types``: per input, the type of each key column (``integer``,
    ``string``, ``boolean``) when known (Spark knows the DataFrames' schemas).
    ``watermarks``: the inputs' watermark delays (recorded; a restart may change them).
    """
    boundary = spec.boundary
    shape: dict[str, Any] = {
        "inputs": list(spec.inputs),
        "tables": {
            name: {
                "key": list(t.key),
                "partition_by": list(t.partition_by),
                # The declared columns (None: no schema): rows were checked against them.
                "columns": _kinds(t.columns),
                # What its initial rows were (None: none), to refuse other ones later.
                "initial": initial_fingerprint(t.initial),
            }
            for name, t in spec.tables.items()
        },
        # Each output's declared columns (None: no schema): its committed rows have them.
        "output_columns": {name: _kinds(o.columns) for name, o in spec.outputs.items()},
        "orders": {name: i.order for name, i in spec.inputs.items()},
        "merge": merge,
        "timeslice": boundary.seconds if getattr(boundary, "name", "") == "timeslice" else None,
        "watermarks": dict(watermarks or {}),
    }
    if key_types is not None:
        shape["key_types"] = key_types
    return shape


def _kinds(columns: dict[str, str] | None) -> dict[str, str] | None:
    """Declared columns with each type by its canonical name (None: no schema)."""
    return None if columns is None else {c: canonical_kind(k) for c, k in columns.items()}


def first_meta(
    spec: JobSpec, partitions: int, runner: str, shape: dict[str, Any]
) -> dict[str, Any]:
    """``job.json`` for the first start of ``spec`` on a store (``runner``: spark or local).

    ``id`` is the store's own: the built-in sinks claim their target for it
    (a batch id means a batch of one store only, see ``sinks.SinkOwner``).
    """
    return {
        "id": uuid.uuid4().hex,
        "job": spec.name,
        "partitions": partitions,
        "outputs": sorted(spec.outputs),
        "runner": runner,
        "placement": PLACEMENT,
        **shape,
    }


def restarted_meta(
    store: RuntimeStore, meta: dict[str, Any], shape: dict[str, Any], spec: JobSpec, where: str
) -> dict[str, Any]:
    """``job.json`` for a restart of ``spec`` (of ``shape``) on ``store``, described by ``meta``.

    Raises :class:`RuntimeJobError` naming the first change the store cannot
    follow and what to do; ``where`` names the store (``checkpoint /x``,
    ``store /x``) in the message.  The returned meta
    adds what this start declares (new outputs and tables) to what the store
    knew: removed tables keep their declaration, which a later restart that
    declares them again must match.
    """
    fix = f"declare it as before, or start on a new {where.split()[0]}"
    if meta.get("placement") is None:
        _check_old_placement(store, meta, where)
    committed = store.committed()
    # Events the event-time merge held after the last batch (commits before the
    # count was recorded: none known).
    held = store.commit_info(committed[-1]).get("held", 0) if committed else 0
    inputs = meta.get("inputs")
    if inputs is not None and inputs != shape["inputs"]:
        raise RuntimeJobError(
            f"{where} was started with inputs {inputs}; the job declares {shape['inputs']}: "
            "a restart keeps the inputs, their names and their order (the checkpoint resumes "
            "each source by its place, and held events and the merge's frontier name "
            f"inputs); declare them as before, or start on a new {where.split()[0]}"
        )
    tables = dict(meta.get("tables", {}))
    for name, table in shape["tables"].items():
        old = tables.get(name)
        if old is not None and _placed(old) != _placed(table):
            raise RuntimeJobError(
                f"table {name!r} was declared in {where} with key {old['key']} "
                f"(partition_by {old['partition_by']}); the job declares key {table['key']} "
                f"(partition_by {table['partition_by']}): its rows are stored by that key and "
                f"placed by that partition value; {fix}"
            )
        if old is not None and "columns" in old and old["columns"] != table["columns"]:
            raise RuntimeJobError(
                f"table {name!r} was declared in {where} with {_schema(old['columns'])}; "
                f"the job declares {_schema(table['columns'])} "
                f"({_change(old['columns'], table['columns'])}): its stored rows were "
                "written and keyed under the old declaration, and a table's columns cannot "
                f"change on a store; {fix}"
            )
        if old is None and "tables" in meta and committed and spec.tables[name].initial is not None:
            raise RuntimeJobError(
                f"table {name!r} is new in {where} and declares initial rows, which load only "
                "before the first batch commits; leave initial out (and insert its rows in "
                f"transactions), or start on a new {where.split()[0]}"
            )
        if old is not None and committed and "initial" in old:
            _check_initial(name, old["initial"], table["initial"], where)
            table = {**table, "initial": old["initial"]}  # (what the store loaded stays)
        tables[name] = table
    output_columns = dict(meta.get("output_columns", {}))
    for name, columns in shape["output_columns"].items():
        if committed and name in output_columns and output_columns[name] != columns:
            old_columns = output_columns[name]
            raise RuntimeJobError(
                f"output {name!r} was declared in {where} with {_schema(old_columns)}; the "
                f"job declares {_schema(columns)} ({_change(old_columns, columns)}): its "
                "committed rows have the old columns, and its readers (tx.read_output_arrow, "
                "a Spark reader of its files) take one schema per output; declare it as "
                "before, emit the new rows to a new output, or start on a new "
                f"{where.split()[0]}"
            )
        output_columns[name] = columns
    _check_key_types(meta.get("key_types"), shape.get("key_types"), where)
    if meta.get("merge") == "event-time" and shape["merge"] != "event-time" and held:
        raise RuntimeJobError(
            f"{where} holds {held} event(s) for the event-time merge, which merge="
            f"{shape['merge']!r} would never run; restart with merge='event-time' until they "
            f"are released (lastProgress['held'] == 0), or start on a new {where.split()[0]}"
        )
    _check_order_values(meta, shape, where)
    outputs = sorted(set(meta.get("outputs", [])) | set(spec.outputs))
    timeslice = shape["timeslice"] if shape["timeslice"] is not None else meta.get("timeslice")
    return {
        "id": uuid.uuid4().hex,  # (a store from before ids: its own from now on)
        **meta,
        **shape,
        "placement": PLACEMENT,
        "tables": tables,
        "output_columns": output_columns,
        "outputs": outputs,
        "timeslice": timeslice,
    }


def _check_old_placement(store: RuntimeStore, meta: dict[str, Any], where: str) -> None:
    """Refuse a store of the old placement rule that holds a row the new rule looks for elsewhere.

    Only boolean partition values moved, so a store without any (nearly all) restarts
    as it is, once read through (its ``job.json`` then records the new rule).
    """
    chain = store.chain()
    tokens: dict[str, str] = chain[-1][1].get("tokens", {}) if chain else {}
    at = chain[-1][0] if chain else -1
    partitions = int(meta.get("partitions", len(tokens)))
    for pid in range(partitions):
        state = store.load(pid, at, tokens.get(str(pid)))
        for table, by_value in state.data.items():
            for value in by_value:
                parts = value if type(value) is tuple else (value,)
                if bool in map(type, parts) and partition_of(value, partitions) != pid:
                    raise RuntimeJobError(
                        f"{where} was written by an older txstream that placed boolean "
                        f"partition values by the texts true/false; table {table!r} holds "
                        f"value {value!r} on partition {pid}, where the current rule (a bool "
                        "as the int it equals, so True and 1 are one row) does not look for "
                        f"it; start on a new {where.split()[0]} (its committed outputs stay "
                        "readable with tx.read_output)"
                    )


def initial_fingerprint(initial: Any) -> str | None:
    """A digest of a table's declared initial rows: None without any.

    Rows given as a list (of dicts) get the SHA-256 of their contents in any
    order (a list built from a set or a dict comes in another order in another
    process: the same rows), a file named by its path that of its bytes; a
    DataFrame (or a file that cannot be read here) gets ``"unknown"``, which
    any later declaration matches, as reading it again would cost a Spark job
    at every start.
    """
    if initial is None:
        return None
    if isinstance(initial, list):
        rows = sorted(json.dumps(row, sort_keys=True, default=_canonical) for row in initial)
        text = "\n".join(rows)
        return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    if isinstance(initial, str | PurePath):
        try:
            return "sha256:" + hashlib.sha256(Path(initial).read_bytes()).hexdigest()
        except OSError:
            return UNKNOWN_INITIAL
    return UNKNOWN_INITIAL


UNKNOWN_INITIAL = "unknown"


def _canonical(value: Any) -> Any:
    """A value JSON cannot spell, as the same text in every process (a set's items sorted)."""
    if isinstance(value, set | frozenset):
        return sorted(json.dumps(v, sort_keys=True, default=_canonical) for v in value)
    return repr(value)


def _check_initial(name: str, loaded: str | None, declared: str | None, where: str) -> None:
    """Refuse initial rows that differ from those loaded before the first batch committed.

    Initial rows load only into a store where no batch committed: rows added to
    the declaration, or changed, later would be silently ignored.  Leaving
    them out is fine (the table keeps its rows).
    """
    if declared is None or UNKNOWN_INITIAL in (loaded, declared) or declared == loaded:
        return
    store = where.split()[0]
    if loaded is None:
        raise RuntimeJobError(
            f"table {name!r} declares initial rows, but had none when the first batch "
            f"committed in {where}, and initial rows load only before that: they would be "
            f"ignored; leave initial out and insert the rows in transactions, or start on a "
            f"new {store}"
        )
    raise RuntimeJobError(
        f"table {name!r} declares other initial rows than those loaded before the first "
        f"batch committed in {where}, and initial rows load only before that: the change "
        "would be ignored; declare them as before (or leave initial out) and insert or "
        f"update the rows in transactions, or start on a new {store}"
    )


def _placed(table: dict[str, Any]) -> tuple[Any, Any]:
    """What places a table's rows: its key and partition_by."""
    return table["key"], table["partition_by"]


def _schema(columns: dict[str, str] | None) -> str:
    """Declared columns as a schema's text (or "no schema")."""
    if columns is None:
        return "no schema"
    return "schema '" + ", ".join(f"{c} {k}" for c, k in columns.items()) + "'"


def _change(old: dict[str, str] | None, new: dict[str, str] | None) -> str:
    """The first difference between two declarations' columns (a table's, an output's), in words."""
    if old is None or new is None:
        return "a schema added" if old is None else "the schema left out"
    for column, kind in old.items():
        if column not in new:
            return f"column {column!r} removed"
        if new[column] != kind:
            return f"column {column!r}: {kind} -> {new[column]}"
    added = [c for c in new if c not in old]
    return f"column {added[0]!r} added"


def _check_key_types(
    old: dict[str, list[str]] | None, new: dict[str, list[str]] | None, where: str
) -> None:
    """Refuse an input whose key columns hold values of another type than before."""
    if old is None or new is None:
        return
    for name, kinds in new.items():
        before = old.get(name)
        if before is not None and len(before) == len(kinds) and before != kinds:
            raise RuntimeJobError(
                f"input {name!r}: its key columns held {', '.join(before)} values in {where}, "
                f"now {', '.join(kinds)}: rows stored under the old values would not be found "
                "(5 and '5' are different keys); cast the column back (F.col(...).cast(...)), "
                f"or start on a new {where.split()[0]}"
            )


def _check_order_values(meta: dict[str, Any], shape: dict[str, Any], where: str) -> None:
    """Refuse changes that would read order values the partitions kept in other terms."""
    kept = meta.get("timeslice")
    if kept is not None and shape["timeslice"] is not None and kept != shape["timeslice"]:
        raise RuntimeJobError(
            f"the partitions of {where} keep the timeslice clock in slices of {kept:g} s; the "
            f"job declares slices of {shape['timeslice']:g} s, against which events would be "
            f"judged late; keep seconds={kept:g}, or start on a new {where.split()[0]}"
        )
    if meta.get("merge") != "event-time" and kept is None:
        return  # no order value outlives its batch
    for name, order in meta.get("orders", {}).items():
        now = shape["orders"].get(name, order)
        if now != order:
            raise RuntimeJobError(
                f"input {name!r} was ordered by {order!r} in {where}, now by {now!r}, while "
                "the partitions keep order values across batches (the event-time merge's "
                "frontier and held events, the timeslice clock); if the values are on the "
                f"same scale, name the column {order!r} again (df.withColumn), or start on a "
                f"new {where.split()[0]}"
            )


__all__ = ["KEY_KINDS", "first_meta", "job_shape", "restarted_meta"]
