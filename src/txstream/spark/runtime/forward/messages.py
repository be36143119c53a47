"""The messages between the partitions of :mod:`.forward`: their layout, and both ends.

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

Besides building a participant's message (:func:`up_rows`), the home's run of
a crossing transaction (:func:`run_at_home`) and the participant's taking of
its answer (:func:`take_back`) are here, each one function called where
:class:`~.partition._Partition`'s method was: split into smaller helpers they
cost four more Python calls per crossing transaction, which the one-process
instruction count showed (about 3,000 instructions per event more).  For the
same reason the common crossing transaction (one participant with one value of
a flat table) takes no call of its own between admission and take-back but
these two and the transaction's run: the messages are taken per list, not per
message (:meth:`~.partition._Partition.receive_all`), the home runs as soon as
the one ``up`` it waits for is in hand (no ``ups`` dict), and the home's
answer, the rows' removal, the queueing of the answer, the participant's
commit mark and both ends' release of the value's lock run inline (session
23: 22 Python calls per crossing transaction in the scheduler's run became 10,
four of them the transaction's own ``_log``; its instructions fell by about an
eighth, valgrind).  Session 24: those four ``_log`` calls are inline in ``read``
and ``increment``, and neither end makes an item for such a transaction but a
tuple (:data:`~.base._Light`), which these functions take as well as an item.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from txstream.spark.runtime.boundaries import event_gid
from txstream.spark.runtime.executor import GroupRunner
from txstream.spark.runtime.state import ABSENT, PartitionState
from txstream.spark.runtime.totals import track

if TYPE_CHECKING:
    from txstream.spark.runtime.forward.base import _Item, _Light, _Shared

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


def run_at_home(
    part: _Shared,
    item: _Item | _Light,
    src: int = -1,
    message: tuple[Any, ...] | None = None,
) -> None:
    """At the home: run ``item``'s transaction over its own and the forwarded rows; answer.

    ``message``: the one participant's ``up`` (from ``src``), when the caller
    has it in hand (:meth:`~.partition._Partition.receive_all`, always for a
    :data:`~.base._Light`); else they are in ``item.ups``.  (Of
    :class:`~.partition._Partition`, called where its method would be: on this
    path each call costs as much as the lines it saves, so the common case,
    one participant with one value of a flat table, runs here without a call
    of its own but the transaction's: its rows put in, the answer built and
    queued, the rows taken out and the item finished inline.)
    """
    if isinstance(item, tuple):
        event, own, dest, _epoch = item
        assert message is not None
        if len(message) != 4:
            _run_many(part, part._heavy(item, True), {src: message})
            return
        sole = True  # (its one value here heads its queue)
    else:
        if message is None:
            ups = item.ups
            assert ups is not None
            if len(ups) != 1:
                _run_many(part, item, ups)
                return
            ((src, message),) = ups.items()
        if len(message) != 4 or len(item.parts) != 1:
            _run_many(part, item, {src: message})
            return
        event, own, dest = item.event, item.values[0], item.parts[0]
        sole = item.queued and len(item.values) == 1
    state, runner = part.state, part.runner
    flat, data = state.flat, state.data
    _mid, value, table, rows = message
    remote = (value,)  # (a tuple of one: cheaper to make than a dict, as fast to test)
    if table is not None:
        if table in flat:  # (a flat table's one row: state.set_rows, inlined)
            by_key = data.get(table)
            if by_key is None:
                by_key = data[table] = {}
            by_key[value] = rows  # (not counted here: see _take_rows)
        else:
            _take_rows(state, src, iter((value, table, rows)), {})
    runner.remote = remote
    outcome = part.outcome
    committed_before = outcome.committed
    abort = part.sched.abort
    try:
        if abort:
            runner.run_event(event, part.batch, abort)
        else:  # (run_event without a transaction to abort: its call, inlined)
            runner._execute_one(event, None, None, part.batch)
    finally:
        runner.remote = None
    outcome.forwarded += 1
    mid = event.order[2]
    # What changed of the forwarded rows goes back, row by row; those rows leave the
    # undo log, which makes this partition's delta, and then this state.
    if outcome.committed > committed_before:
        if part.record:  # (value, op, value, op, ...: the ops are every second one)
            ops = runner.remote_ops
            out: list[Any] = [~mid, True, len(ops) >> 1, *ops[1::2]]
        else:
            out = [~mid, True, 0]
        undo = state.undo
        for undo_key, _old in runner.changed:
            if undo_key[1] in remote:
                changed_table, _v, key = undo_key
                if changed_table in flat:
                    found = data.get(changed_table)
                else:
                    found = state.part(changed_table, value)
                out += (changed_table, value, key, (found or _NONE).get(key))
                undo.pop(undo_key, None)
        answer: tuple[Any, ...] = tuple(out)
    else:
        answer = (~mid, False, 0)
    table = part.one_flat
    if table is not None:  # (drop of one value, inlined)
        by_key = data.get(table)
        if by_key:
            by_key.pop(value, None)
    else:
        drop(state, part.tables, remote)
    box = part.out.get(dest)  # (part.send, inlined)
    if box is None:
        part.out[dest] = [answer]
    else:
        box.append(answer)
    # (part.finish, inlined for one value that nothing waits for: the same in run_at_home
    # and take_back; a change to finish changes both)
    if sole and not part.readings and part.barrier is None:
        locks = part.locks
        if len(locks[own]) == 1:
            del locks[own]
            part.inflight -= 1
            part.unfinished -= 1
            return
    part.finish(part._heavy(item, True) if isinstance(item, tuple) else item)


def _run_many(part: _Shared, item: _Item, ups: Mapping[int, tuple[Any, ...]]) -> None:
    """:func:`run_at_home` in general: any number of participants, values and tables."""
    state, runner = part.state, part.runner
    flat, data = state.flat, state.data
    owner: dict[Any, int] = {}
    for src, message in ups.items():
        if len(message) == 4:  # (one value, one table or none)
            _mid, value, table, rows = message
            owner[value] = src
            if table is None:
                continue
            if table in flat:  # (a flat table's one row: state.set_rows, inlined)
                by_key = data.get(table)
                if by_key is None:
                    by_key = data[table] = {}
                by_key[value] = rows  # (not counted here: see _take_rows)
                continue
            _take_rows(state, src, iter((value, table, rows)), owner)
        else:
            triples = iter(message)
            next(triples)  # (its mid)
            _take_rows(state, src, triples, owner)
    runner.remote = owner
    outcome = part.outcome
    committed_before = outcome.committed
    event = item.event
    try:
        runner.run_event(event, part.batch, part.sched.abort)
    finally:
        runner.remote = None
    committed = outcome.committed > committed_before
    outcome.forwarded += 1
    answers = _backs(state, runner, owner, item.parts, event.order[2], committed, part.record)
    drop(state, part.tables, owner)
    for p, answer in answers:
        part.send(p, answer)
    part.finish(item)


def _take_rows(
    state: PartitionState, src: int, triples: Iterator[Any], owner: dict[Any, int]
) -> None:
    """Put (value, table, rows) triples of ``src``'s ``up`` into ``state``, owned by ``src``.

    The rows are not counted in the totals that global reads keep here
    (``state.tracked``), nor are the transaction's changes of them (the
    runner's ``remote``), nor their removal (:func:`drop`): they leave again
    within this one run at the home, before any global read takes a total
    here, so counting them netted to zero; their lender keeps them counted and
    counts their change when the answer comes back (:func:`take_back`).
    """
    flat = state.flat
    for value, table, rows in zip(triples, triples, triples, strict=True):
        owner[value] = src
        if table is None:
            continue
        if table in flat:
            rows = {value: rows}
        state.set_rows(table, value, rows)


def _backs(
    state: PartitionState,
    runner: GroupRunner,
    owner: Mapping[Any, int],
    parts: tuple[int, ...],
    mid: int,
    committed: bool,
    record: bool,
) -> list[tuple[int, tuple[Any, ...]]]:
    """The answers of a home with several other participants, as (partition, message)."""
    if not committed:
        return [(p, (~mid, False, 0)) for p in parts]
    undo = state.undo
    ops_of: dict[int, list[Any]] = {p: [] for p in parts}
    if record:
        ops = iter(runner.remote_ops)
        for value, op in zip(ops, ops, strict=True):
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
    """Take the forwarded values' rows out of ``state`` (never counted: see _take_rows)."""
    flat, data = state.flat, state.data
    for table in tables:
        if table in flat:  # (state.pop_rows, inlined: no dict around the one row)
            by_key = data.get(table, _NONE)
            if by_key:
                for value in owner:
                    by_key.pop(value, None)
            continue
        for value in owner:
            state.pop_rows(table, value)


def take_back(part: _Shared, item: _Item | _Light, message: tuple[Any, ...]) -> None:
    """At a participant: the home's answer; the rows it changed replace these.

    (Of :class:`~.partition._Partition`, called where its method would be.)  The
    batch's pre-images are kept in the undo log, as :meth:`PartitionState.put`
    keeps them.  The runner's ``record_remote`` and the partition's ``finish``
    run inline in their common cases (a plain commit mark; one value).
    """
    n = message[2]
    if len(message) > 3 + n:
        state = part.state
        undo, tracked, flat, data = state.undo, state.tracked, state.flat, state.data
        rest = message[3 + n :]
        if len(rest) == 4:  # (one row changed, the common case: no zip to make)
            quads: Iterable[tuple[Any, ...]] = (rest,)
        else:
            changes = iter(rest)
            quads = zip(changes, changes, changes, changes, strict=True)
        for table, value, key, row in quads:
            rows = data.get(table) if table in flat else state.part(table, value)
            if rows is None or row is None:  # (a value's first row, or a row deleted)
                state.put(table, value, key, ABSENT if row is None else row)
                continue
            # (state.put of a row set, inlined: the batch's pre-image, the row, the totals)
            undo_key = (table, value, key)
            old = rows.get(key)
            if undo_key not in undo:  # (its pre-image only when kept: PartitionState.pre_images)
                undo[undo_key] = old if state.pre_images else None
            rows[key] = row
            if tracked and table in tracked:
                track(tracked, table, old, row)
    event = item[0] if isinstance(item, tuple) else item.event
    if n and message[1]:  # (committed, with its operations here; then its commit mark)
        order = event.order
        runner = part.runner
        if type(order[0]) is float:  # (runner.record_remote of the plain mark, inlined)
            outcome = part.outcome
            history = outcome.history
            history += message[3 : 3 + n]
            history.append(part.mark)
            outcome.orders.append(order)
        else:
            runner.record_remote(message[3 : 3 + n], order, event_gid(part.batch, event))
    # (part.finish, inlined for one value that nothing waits for: the same in run_at_home
    # and take_back; a change to finish changes both)
    if isinstance(item, tuple):
        if not part.readings and part.barrier is None:
            locks, v = part.locks, item[1]
            if len(locks[v]) == 1:
                del locks[v]
                part.inflight -= 1
                part.unfinished -= 1
                return
        part.finish(part._heavy(item, False))
        return
    values = item.values
    if len(values) == 1 and not part.readings and part.barrier is None and item.queued:
        locks, v = part.locks, values[0]
        if len(locks[v]) == 1:
            del locks[v]
            part.inflight -= 1
            part.unfinished -= 1
            return
    part.finish(item)
