"""The messages between the partitions of :mod:`.forward`: their layout, built and read.

A message is one flat tuple of plain values and rows, with no list, dict or
tuple around each part: every level of nesting is an object to build, to
pickle and unpickle between tasks, and to walk, and on two tasks at uniform
transfers the messages' pickling and unpickling was about a tenth of each
task's CPU (``scripts/runtime-mp-tasks.py``).  A transaction is named by its
event's place in the batch (``mid``, an int, ``>= 0``):

- ``up`` with rows, from a participant to the home:
  ``(mid, value, table, rows, value, table, rows, ...)``, one triple per table
  in which one of the participant's values has rows, ``(value, None, None)``
  for a value with none (the home must still know that the value is the
  participant's).  ``rows`` is the value's rows by key, or for a flat table
  (:attr:`PartitionState.flat`) its one row, bare.
- ``up`` with totals (a global read's part, to partition 0): ``(mid, totals)``.
- ``back``, from the home to a participant: ``(~mid, committed, n, op_1, ...,
  op_n, table, value, key, row, ...)``: whether the transaction committed; its
  ``n`` operations on the participant's values when the history is recorded;
  then one quadruple per row of the participant's that it changed (``row`` None:
  deleted).  ``~mid < 0`` tells a back from an up.

The rows stay dicts, not columns: on these messages (a row or two each, a
hundred messages a frame) rebuilding the dicts from columns on the receiving
side cost more than pickle's own building of them saved (measured in
benchmarks-history.md, "wire (session 20)").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import islice
from typing import Any

from txstream.spark.runtime.executor import GroupRunner
from txstream.spark.runtime.state import ABSENT, PartitionState
from txstream.spark.runtime.totals import track

_NONE: dict[Any, Any] = {}
"""An empty dict to look up in (never changed)."""


def up_rows(
    state: PartitionState, tables: list[str], mid: int, values: list[Any], copy: bool
) -> tuple[Any, ...]:
    """What a participant sends the home: its ``values``' rows (see the module docstring).

    ``copy``: the home is in this process and changes the dict of a value's rows
    that it is given, so it gets a copy (a message to another task is a copy
    already; a flat table's row goes bare, and a write replaces a row, never
    changes it in place).
    """
    flat = state.flat
    if len(values) == 1 and len(tables) == 1:  # (the common case: one value, one table)
        v, table = values[0], tables[0]
        if table in flat:  # (its row looked up, not wrapped in a dict as rows_of does)
            row = state.data.get(table, _NONE).get(v)
            return (mid, v, None, None) if row is None else (mid, v, table, row)
        found = state.rows_of(table, v)
        if not found:
            return (mid, v, None, None)
        return (mid, v, table, dict(found) if copy else found)
    out: list[Any] = [mid]
    for v in values:
        had = False
        for table in tables:
            found = state.rows_of(table, v)
            if found:
                rows = found[v] if table in flat else dict(found) if copy else found
                out += (v, table, rows)
                had = True
        if not had:
            out += (v, None, None)
    return tuple(out)


def take_up(state: PartitionState, ups: Mapping[int, tuple[Any, ...]]) -> dict[Any, int]:
    """At the home: put the participants' forwarded rows into ``state``; value -> its partition."""
    tracked, flat, data = state.tracked, state.flat, state.data
    owner: dict[Any, int] = {}
    for src, message in ups.items():
        parts = iter(message)
        next(parts)  # (its mid)
        for value, table, rows in zip(parts, parts, parts, strict=True):
            owner[value] = src
            if table is None:
                continue
            if table in flat:  # (a flat table's one row: state.set_rows, inlined)
                by_key = data.get(table)
                if by_key is None:
                    by_key = data[table] = {}
                by_key[value] = rows
                if tracked and table in tracked:  # (counted while they are here)
                    track(tracked, table, None, rows)
                continue
            state.set_rows(table, value, rows)
            if tracked and table in tracked:
                for row in rows.values():
                    track(tracked, table, None, row)
    return owner


def backs(
    state: PartitionState,
    runner: GroupRunner,
    owner: Mapping[Any, int],
    parts: tuple[int, ...],
    mid: int,
    committed: bool,
    record: bool,
) -> Iterable[tuple[int, tuple[Any, ...]]]:
    """At the home, after the run: each participant's answer, as (partition, message).

    What changed of the forwarded rows goes back, row by row; those rows leave
    the undo log, which makes this partition's delta (and, after this, its state:
    see :func:`drop`).
    """
    if not committed:
        message = (~mid, False, 0)
        return [(p, message) for p in parts]
    undo = state.undo
    if len(parts) == 1:  # (the common case: one other participant, all rows its)
        out: list[Any] = [~mid, True, 0]
        if record:
            ops = [op for _value, op in runner.remote_ops]
            out[2] = len(ops)
            out += ops
        for undo_key, _old in runner.changed:
            table, value, key = undo_key
            if value in owner:
                out += (table, value, key, (state.part(table, value) or _NONE).get(key))
                undo.pop(undo_key, None)
        return [(parts[0], tuple(out))]
    ops_of: dict[int, list[Any]] = {p: [] for p in parts}
    if record:
        for value, op in runner.remote_ops:
            ops_of[owner[value]].append(op)
    changes: dict[int, list[Any]] = {p: [] for p in parts}
    for undo_key, _old in runner.changed:
        table, value, key = undo_key
        to = owner.get(value)
        if to is not None:
            row = (state.part(table, value) or _NONE).get(key)
            changes[to] += (table, value, key, row)
            undo.pop(undo_key, None)
    return [(p, (~mid, True, len(ops_of[p]), *ops_of[p], *changes[p])) for p in parts]


def drop(state: PartitionState, tables: list[str], owner: Iterable[Any]) -> None:
    """Take the forwarded values' rows out of ``state`` (and out of its totals)."""
    tracked, flat, data = state.tracked, state.flat, state.data
    for table in tables:
        counted = tracked and table in tracked
        if table in flat:  # (state.pop_rows, inlined: no dict around the one row)
            by_key = data.get(table, _NONE)
            for value in owner:
                row = by_key.pop(value, None) if by_key else None
                if row is not None and counted:
                    track(tracked, table, row, None)
            continue
        for value in owner:
            rows = state.pop_rows(table, value)
            if rows and counted:
                for row in rows.values():
                    track(tracked, table, row, None)


def take_back(state: PartitionState, message: tuple[Any, ...]) -> tuple[bool, tuple[Any, ...]]:
    """At a participant: apply the home's answer to ``state``; (committed, its operations here).

    The rows the home changed replace these (the batch's pre-images kept in the
    undo log, as :meth:`PartitionState.put` keeps them).
    """
    _mid, committed, n = message[0], message[1], message[2]
    if len(message) > 3 + n:
        undo, tracked = state.undo, state.tracked
        changes = islice(message, 3 + n, None)
        for table, value, key, row in zip(changes, changes, changes, changes, strict=True):
            rows = state.part(table, value)
            if rows is None or row is None or (tracked and table in tracked):
                # (a row made or deleted, or a table whose totals are kept)
                state.put(table, value, key, ABSENT if row is None else row)
                continue
            # (state.put of a changed row, inlined: the batch's pre-image, the row)
            undo_key = (table, value, key)
            if undo_key not in undo:
                undo[undo_key] = rows.get(key, ABSENT)
            rows[key] = row
    return committed, (message[3 : 3 + n] if n else ())
