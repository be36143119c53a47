"""Serial execution of one partition's transactions, and of the deferred ones.

This is the hot path: no locks, no threads, one Python loop over the events of
a partition in the declared order (the H-Store/S-Store execution model).  It
imports no pyspark, so the same code runs inside Spark tasks and in the
in-process runner that tests use as an oracle.

Phase 1 (:meth:`PartitionExecutor.run`) executes every transaction whose events
all live here, in order, except that a transaction touching a partition value
that an earlier *multi-partition* transaction of the batch touched is
*deferred*: from that point on, that value's chain of transactions waits.
Phase 2 (:func:`.deferred.run_deferred`) executes deferred transactions in order
over the rows of their values shipped there: all of them in one place, or whole
chains per task (:func:`.deferred.deferred_chains`); phase 3 hands the rows
back.  Per partition value, transactions therefore execute in the declared
order, and since a transaction touches only rows of its declared values, every
conflict goes from an earlier to a later transaction: the history is
conflict-serializable in arrival order.

The verbs a transaction function is given (:class:`ExecutorTx`) are in
:mod:`.executor_tx`; here, the runner that sets them up for each transaction
and keeps its outcome (:class:`GroupRunner`, :class:`.outcome.Outcome`).

Ownership: a :class:`GroupRunner` and its one :class:`ExecutorTx` run on their
task's thread and own their partition's state for the batch (exclusive
access, not preempted); transactions run one after the other.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from itertools import islice, repeat
from typing import Any

from txstream.spark.runtime.base import (
    JobSpec,
    Row,
    TransactionAborted,
)
from txstream.spark.runtime.boundaries import Event, Group, PerEvent, Run, event_gid, track_runs
from txstream.spark.runtime.executor_tx import ExecutorTx as ExecutorTx  # (re-exported)
from txstream.spark.runtime.executor_tx import Tx as Tx  # (re-exported)
from txstream.spark.runtime.executor_tx import check_fragment as check_fragment  # (re-exported)
from txstream.spark.runtime.executor_tx import flat_tables as flat_tables  # (re-exported)
from txstream.spark.runtime.executor_tx import item_name as item_name  # (re-exported)
from txstream.spark.runtime.executor_tx import record_reads as record_reads  # (re-exported)
from txstream.spark.runtime.executor_tx import undeclared as undeclared  # (re-exported)
from txstream.spark.runtime.outcome import Outcome, _json_line, _order_head, _order_text
from txstream.spark.runtime.recorded import commit_mark as _commit_mark
from txstream.spark.runtime.state import PartitionState

_BLOCK = 256
"""Events per block of :meth:`PartitionExecutor._run_events` with ``consume`` (a few
hundred KiB of objects: they stay in the CPU's second-level cache)."""


def table_item(table: str) -> str:
    """The history item of a read of every row of ``table`` on one partition (a global read).

    One operation instead of one per row: the store's history reader
    (``results.history_text``) expands it into reads of every item of the table
    that the partition's history names, which are the only ones a conflict can
    involve.
    """
    return f"{table}:*"


class GroupRunner:
    """Runs groups (transactions) on a state, recording outputs, history and failures."""

    def __init__(
        self,
        job: JobSpec,
        state: PartitionState,
        outcome: Outcome,
        arrival: Callable[[Row], float | None] | None = None,
        partitions: int = 0,
    ) -> None:
        self.job = job
        self.state = state
        self.outcome = outcome
        self.arrival = arrival
        self.partitions = partitions
        self.record = job.record_history
        self.remote: Container[Any] | None = None
        """Values whose rows were forwarded for the next :meth:`run` (see :mod:`.forward`)."""
        self.aggregates: dict[tuple[str, str | None], list[Any]] | None = None
        """The gathered totals for the next :meth:`run` of a global read (see :class:`Tx`)."""
        self.remote_ops: list[Any] = []
        """After a committed :meth:`run` with ``remote``: the operations on those values, as
        value, operation, value, operation, ... (flat: see ``Tx._remote_ops``)."""
        self.changed: list[tuple[tuple[str, Any, Any], Any]] = []
        """After a committed :meth:`run` with ``remote``: its undo log, ((table, value, key),
        old row), whose keys are the rows it changed; the Tx's own list, so it is valid
        until the next run only."""
        self.global_reads = {n: i.global_reads for n, i in job.inputs.items() if i.global_reads}
        self.arrival_column: str | None = getattr(arrival, "column", None)
        """The arrival column when ``arrival`` reads one (floats are then read inline)."""
        self.handlers = job.handlers
        self.tx = ExecutorTx(job, state, None, None)
        """The one Tx of every transaction this runner runs, reset for each (one
        object less per event; transactions run one after the other)."""
        self.tx._partitions = partitions

    def record_remote(self, ops: Sequence[Any], order: tuple[float, int, int], gid: str) -> None:
        """Record what a transaction did here through its home (see :mod:`.forward`).

        ``ops``: its operations on this partition's rows forwarded to its home,
        where it committed; ``gid``: its id, its event's (``b<batch>_<mid>``, this
        batch's; unused, and may be empty, when its order value is a float).  Then
        its commit mark, which names it for the compact ones (see
        :mod:`.recorded`); the fate it repeats is its home's.
        """
        history = self.outcome.history
        history.extend(ops)
        if type(order[0]) is float:  # (the mark of one event's transaction: _execute_one's)
            history.append(self.tx._stride - 1)
            self.outcome.orders.append(order)
        else:
            history.append(_commit_mark(order, gid))

    def run(self, group: Group, abort: Mapping[str, Mapping[str, Any]]) -> None:
        """Execute ``group`` as one transaction (or record it aborted).

        ``abort``: the transactions to abort without running them, each with the
        failure that made it abort in an earlier attempt of the batch.
        """
        if group.late:
            self._aborted(group, group.late, kind="late")
            return
        failed = abort.get(group.gid)
        if failed is not None:
            self._aborted(
                group, failed["error"], failed["kind"], failed["position"], failed.get("at")
            )
            return
        events = group.events
        if len(events) == 1 and events[0].values:
            self._execute_one(events[0], group.gid, group, 0)
        else:
            self._execute(events, group.gid, group, 0)

    def run_event(self, event: Event, batch: int, abort: Mapping[str, Mapping[str, Any]]) -> None:
        """Execute one event with keys as its own transaction: the ``event`` boundary's group.

        The same as :meth:`run` of ``Group(event_gid(batch, event), [event])``,
        without building the group (nor its id, unless the history or an abort
        needs it): this is the path of nearly every event of such a job.
        """
        gid = None
        if abort:  # (the history names it only when an operation needs it: see Tx._txn)
            gid = f"b{batch}_{event.order[2]}"  # (event_gid, inlined: a call per event)
            if gid in abort:
                self.run(Group(gid, [event]), abort)
                return
        self._execute_one(event, gid, None, batch)

    def _execute_one(self, event: Event, gid: str | None, group: Group | None, batch: int) -> None:
        """:meth:`_execute` of one event with values: the common case.

        The same steps, without the loops and the cases that cannot arise here
        (a keyless fragment, a global read): this runs for nearly every event,
        and for a multi-partition transaction at its home (rows forwarded).
        """
        outcome = self.outcome
        history = outcome.history if self.record else None
        recorded = len(history) if history is not None else 0
        tx = self.tx
        tx._gid = gid
        tx._batch = batch
        tx._event = event
        tx._history = history
        remote = self.remote
        tx._remote = remote
        if remote is not None:
            tx._remote_ops = []  # (handed over after the run: a new list each time)
        tx._home = None
        if tx._undo:
            tx._undo.clear()
        emits = tx._emits
        if emits:
            emits.clear()
        if tx._global:
            tx._global, tx._aggregates = (), None
        tx._allowed = event.values
        row = event.row
        try:
            self.handlers[event.input](tx, row)
        except Exception as exc:
            tx._rollback()
            if history is not None:
                del history[recorded:]
            if group is None:
                group = Group(gid or event_gid(batch, event), [event])
            kind = "abort" if isinstance(exc, TransactionAborted) else "error"
            self._aborted(group, f"{type(exc).__name__}: {exc}", kind, event.position, event.order)
            return
        order = event.order
        outcome.committed += 1  # (Outcome.committed_txn of one event)
        index = order[1]
        outcome.inputs[index] += 1  # (a defaultdict: no get call)
        if remote is not None:  # (see _execute)
            if history is not None:
                self.remote_ops = tx._remote_ops
            self.changed = tx._undo
        if history is not None:  # its commit mark (see recorded.py)
            if group is None and type(order[0]) is float:
                history.append(tx._stride - 1)  # (its id is the event's: b<batch>_<mid>)
                outcome.orders.append(order)
            else:
                history.append(_commit_mark(order, tx._txn()))
        if emits:
            output, emitted = emits[0]
            at, mid = order[0], order[2]
            if (
                len(emits) == 1
                and isinstance(emitted, str)
                and type(at) is float
                and at - at == 0.0
                and type(index) is int
                and type(mid) is int
            ):  # (_emit_lines of one plain row: its line has seq 0)
                head = f'"__order": [{at!r}, {index}, {mid}, 0]}}'
                line = f"{{{emitted}, {head}" if emitted else f"{{{head}"
                lines = outcome.outputs.get(output)
                if lines is None:
                    lines = outcome.outputs[output] = []
                lines.append(line)
            else:
                self._emit_lines(emits, order)
        column = self.arrival_column
        if column is not None:
            value = row.get(column)
            if type(value) is float and value - value == 0.0:  # finite, the common case
                outcome.sent.append(value)
                return
        if self.arrival is not None:
            seconds = self.arrival(row)
            if seconds is not None:
                outcome.sent.append(seconds)

    def run_plain(
        self,
        events: list[Event],
        start: int,
        batch: int,
        pid: int,
        blocked: set[Any],
    ) -> int:
        """Run ``events[start:]`` while each is plain; returns where the first other one is.

        Plain: the common event of the ``event`` boundary, a copy whose values all
        live on ``pid`` and none in ``blocked`` (what :meth:`PartitionExecutor.
        _run_block` tests), with no transaction to abort and no rows forwarded here.
        Each is :meth:`_execute_one` of it; one loop for all of them, so that what
        is the same for every event is set once (a call and some twenty attribute
        accesses per event less), and each event is unpacked once.  The stop's event
        is the caller's (it may be deferred, which changes ``blocked``).
        """
        outcome = self.outcome
        history = outcome.history if self.record else None
        orders = outcome.orders
        inputs = outcome.inputs
        tx = self.tx
        tx._batch = batch
        tx._history = history
        tx._remote = None
        tx._home = None
        if tx._global:
            tx._global, tx._aggregates = (), None
        undo, emits = tx._undo, tx._emits
        undo.clear()
        emits.clear()
        handlers = self.handlers
        plain_mark = tx._stride - 1
        column = self.arrival_column
        arrival = self.arrival
        sent = outcome.sent
        outputs = outcome.outputs
        committed = 0
        stop = start
        for event in islice(events, start, None):
            order, name, row, values, pids, copy = event
            if not (
                copy
                and values
                and pids.count(pid) == len(pids)
                and (not blocked or blocked.isdisjoint(values))
            ):
                break
            stop += 1
            tx._gid = None
            tx._event = event
            tx._allowed = values
            recorded = len(history) if history is not None else 0
            try:
                handlers[name](tx, row)
            except Exception as exc:
                self._failed_one(event, exc, history, recorded, batch)  # (clears undo, emits)
                continue
            if undo:  # (the rows it replaced: freed now, while cached)
                undo.clear()
            committed += 1
            index = order[1]
            inputs[index] += 1  # (a defaultdict: no get call)
            if history is not None:  # its commit mark (see recorded.py)
                if type(order[0]) is float:
                    history.append(plain_mark)  # (its id is the event's: b<batch>_<mid>)
                    orders.append(order)
                else:
                    history.append(_commit_mark(order, tx._txn()))
            if emits:
                output, emitted = emits[0]
                at, mid = order[0], order[2]
                if (
                    len(emits) == 1
                    and isinstance(emitted, str)
                    and type(at) is float
                    and at - at == 0.0
                    and type(index) is int
                    and type(mid) is int
                ):  # (_emit_lines of one plain row, as _execute_one writes it: change both)
                    lines = outputs.get(output)
                    if lines is None:
                        lines = outputs[output] = []
                    if emitted:
                        lines.append(f'{{{emitted}, "__order": [{at!r}, {index}, {mid}, 0]}}')
                    else:
                        lines.append(f'{{"__order": [{at!r}, {index}, {mid}, 0]}}')
                else:
                    self._emit_lines(emits, order)
                emits.clear()
            if column is not None:
                value = row.get(column)
                if type(value) is float and value - value == 0.0:  # finite, the common case
                    sent.append(value)
                    continue
            if arrival is not None:
                seconds = arrival(row)
                if seconds is not None:
                    sent.append(seconds)
        outcome.committed += committed
        return stop

    def _failed_one(
        self, event: Event, exc: Exception, history: list[Any] | None, recorded: int, batch: int
    ) -> None:
        """:meth:`_execute_one`'s failure: roll back, cut its history, report it."""
        tx = self.tx
        tx._rollback()
        if history is not None:
            del history[recorded:]
        group = Group(event_gid(batch, event), [event])
        kind = "abort" if isinstance(exc, TransactionAborted) else "error"
        self._aborted(group, f"{type(exc).__name__}: {exc}", kind, event.position, event.order)

    def _execute(
        self, events: list[Event], gid: str | None, group: Group | None, batch: int
    ) -> None:
        """Run ``events`` as one transaction ``gid`` (``group``: theirs; None: one event's).

        ``gid`` may be None only without history; ``batch`` names the group of a
        single event that fails (see :meth:`run_event`).
        """
        # The transaction records into the task's history, which an abort cuts back.
        history = self.outcome.history if self.record else None
        recorded = len(history) if history is not None else 0
        tx = self.tx
        tx._gid = gid
        tx._history = history
        tx._undo.clear()
        tx._emits.clear()
        tx._allowed = {v for event in events for v in event.values}
        # (a fresh Tx's defaults: see forward/ for remote and global reads)
        remote = self.remote
        tx._remote = remote
        if remote is not None:
            tx._remote_ops = []  # (handed over after the run: a new list each time)
        if tx._global:
            tx._global, tx._aggregates = (), None
        handlers = self.handlers
        global_reads = self.global_reads
        current: Event | None = None
        try:
            for current in events:
                reads = global_reads.get(current.input) if global_reads else None
                if reads is not None:
                    # One run over every partition's totals: it touches no rows.
                    tx._home, tx._global, tx._aggregates = None, reads, self.aggregates
                    handlers[current.input](tx, current.row)
                    continue
                if tx._global:
                    # (after a global read of its group: its totals are not this
                    # event's, and its home 0 made `t.home == 0` true on every fragment)
                    tx._global, tx._aggregates = (), None
                if not current.values and self.partitions:
                    # A keyless event is one fragment per partition: each copy may touch
                    # the rows of the partition it was delivered to, and no others.
                    tx._home = current.pids[0]
                else:
                    tx._home = None
                handlers[current.input](tx, current.row)
        except Exception as exc:
            tx._rollback()
            if history is not None:
                del history[recorded:]
            if group is None:
                group = Group(gid or event_gid(batch, events[0]), events)
            where = current.position if current is not None else group.gid
            at = current.order if current is not None else None
            kind = "abort" if isinstance(exc, TransactionAborted) else "error"
            self._aborted(group, f"{type(exc).__name__}: {exc}", kind, where, at)
            return
        outcome = self.outcome
        order = events[0].order
        if len(events) == 1:  # (Outcome.committed_txn, inlined for the common case)
            outcome.committed += 1
            counts = outcome.inputs
            counts[order[1]] = counts.get(order[1], 0) + 1
        else:
            outcome.committed_txn(events)
        if history is not None:
            assert gid is not None
            history.append(_commit_mark(order, gid))
            if remote is not None:
                self.remote_ops = tx._remote_ops
        if remote is not None:  # (the runner's one Tx reuses its undo list: see changed)
            self.changed = tx._undo
        if tx._emits:
            self._emit_lines(tx._emits, order)
        if self.arrival_column is not None:
            column, sent = self.arrival_column, outcome.sent
            for event in events:
                value = event.row.get(column)
                if type(value) is float and value - value == 0.0:  # finite, the common case
                    sent.append(value)
                else:
                    seconds = self.arrival(event.row) if self.arrival is not None else None
                    if seconds is not None:
                        sent.append(seconds)
        elif self.arrival is not None:
            for event in events:
                seconds = self.arrival(event.row)
                if seconds is not None:
                    outcome.sent.append(seconds)

    def _emit_lines(
        self, emits: list[tuple[str, Row | str]], order: tuple[float, int, int]
    ) -> None:
        """A committed transaction's emitted rows, as the lines of its outputs."""
        outputs = self.outcome.outputs
        head = _order_head(order)
        # Numbered within the transaction: the same whatever ran before it here.
        for seq, (output, emitted) in enumerate(emits):
            if isinstance(emitted, str) and head is not None:  # _json_line's text, faster
                line = f"{{{emitted}{head}{seq}]}}" if emitted else f"{{{head[2:]}{seq}]}}"
            else:
                # (an order that is not plain, not on Spark's path: plain values read
                # back exactly)
                row = json.loads(f"{{{emitted}}}") if isinstance(emitted, str) else emitted
                row["__order"] = [*order, seq]
                line = _json_line(row)
            lines = outputs.get(output)
            if lines is None:
                lines = outputs[output] = []
            lines.append(line)

    def _aborted(
        self,
        group: Group,
        reason: str,
        kind: str,
        where: str | None = None,
        at: Sequence[Any] | None = None,
    ) -> None:
        if self.record:
            self.outcome.txns.append(f"T {group.gid} a {_order_text(group.order)}")
        self.outcome.failed(group, kind, reason, where, at)


class PartitionExecutor:
    """Phase 1 on partition ``pid``: run its transactions in order, defer what it must."""

    def __init__(
        self,
        job: JobSpec,
        pid: int,
        state: PartitionState,
        arrival: Callable[[Row], float | None] | None = None,
        partitions: int = 0,
    ) -> None:
        self.job = job
        self.pid = pid
        self.state = state
        self.outcome = Outcome()
        self.runner = GroupRunner(job, state, self.outcome, arrival, partitions)
        self.blocked: set[Any] = set()
        self.blocked_all = False
        """A keyless fragment met deferred values: everything here waits for phase 2."""
        self.shipped_events: list[tuple[str, Event]] = []
        self.runs: dict[str, Run] | None = None
        """For a boundary whose groups the driver checks (``by``): see :func:`track_runs`."""
        self.consume = False
        """Whether :meth:`run`'s events are the caller's to give away (made afresh for
        the run): under the ``event`` boundary, each event is then dropped from the
        list soon after it ran, so that it is freed while still in the CPU's cache
        (see :meth:`_run_events`)."""

    def run(self, batch: int, events: list[Any], abort: Mapping[str, Mapping[str, Any]]) -> None:
        """Run the batch's events of this partition (sorted by declared order).

        With :attr:`consume`, ``events`` ends up holding only ``None``.
        """
        boundary = self.job.boundary
        if type(boundary) is PerEvent:
            self._run_events(batch, events, abort, self.consume)
            return
        self.outcome.events = sum(1 for e in events if e.counted)
        pid, run = self.pid, self.runner.run
        groups: Iterable[Group] = boundary.groups(batch, events, self.state.meta)
        if boundary.checks_runs:
            self.runs = {}
            groups = track_runs(groups, self.runs)
        for group in groups:
            if len(group.events) == 1 and not self.blocked_all:
                # The common case, decided without the general bookkeeping below: one
                # event whose values all live here and none of them is deferred.
                e = group.events[0]
                pids = e.pids
                if (
                    e.copy
                    and e.values
                    and pids.count(pid) == len(pids)
                    and (not self.blocked or self.blocked.isdisjoint(e.values))
                ):
                    run(group, abort)
                    continue
            self._general(group, abort)

    def _general(self, group: Group, abort: Mapping[str, Mapping[str, Any]]) -> None:
        """Run ``group`` here, or defer it to phase 2 (with its values' chains from now on)."""
        global_inputs = self.runner.global_reads
        local = [
            v
            for e in group.events
            if e.values  # a keyless event has no values (and its one pid)
            for v, p in zip(e.values, e.pids, strict=True)
            if p == self.pid
        ]
        multi = any(
            not e.copy or e.input in global_inputs or any(p != self.pid for p in e.pids)
            for e in group.events
        )
        if not self.blocked_all and self.blocked and any(not e.values for e in group.events):
            # A fragment may touch any row here, deferred values' rows included:
            # it and everything after it wait for them (per-value order).
            self.blocked_all = True
        if self.blocked_all or multi or (self.blocked and any(v in self.blocked for v in local)):
            # The value's chain waits for phase 2, from here on (per-value order).
            self.blocked.update(local)
            if not self.blocked_all and any(not e.values for e in group.events):
                # A fragment deferred with it may touch any row here: they all go
                # to phase 2 (shipped_rows), and everything after it waits too.
                self.blocked_all = True
            self.outcome.deferred += 1
            self.shipped_events.extend(
                (group.gid, e)
                for e in group.events
                # a global read runs once: partition 0's copy
                if e.copy and (e.input not in global_inputs or e.counted)
            )
            return
        self.runner.run(group, abort)

    def _run_events(
        self,
        batch: int,
        events: list[Any],
        abort: Mapping[str, Mapping[str, Any]],
        consume: bool = False,
    ) -> None:
        """:meth:`run` for the ``event`` boundary: one transaction per event.

        The common event (a copy whose values all live here, none deferred)
        runs without a :class:`Group`; any other takes the general path, one
        group at a time, so the two decide alike.

        With ``consume``, the events run in blocks of :data:`_BLOCK`, each taken
        out of ``events`` before it runs: a block's events (its rows, values,
        orders: some ten objects each) are freed when the next block starts,
        while the cache still holds them.  Kept to the end of the task, they
        were freed then, one cache miss after another (a batch's events are
        tens of MiB; a tenth of phase 1's cache misses).
        """
        if not consume:
            self._run_block(batch, events, abort)
            return
        for start in range(0, len(events), _BLOCK):
            block = events[start : start + _BLOCK]
            events[start : start + len(block)] = repeat(None, len(block))
            self._run_block(batch, block, abort)
            del block  # (freed here, not after the next block is made)

    def _run_block(
        self, batch: int, events: list[Event], abort: Mapping[str, Mapping[str, Any]]
    ) -> None:
        """:meth:`_run_events` of ``events`` (some of the batch's, in order)."""
        pid, runner = self.pid, self.runner
        if not abort and runner.remote is None:
            # Runs of plain events in one loop (GroupRunner.run_plain); each other
            # event takes the general path, which may defer it (and block values).
            start, end, counted = 0, len(events), 0
            while start < end:
                stop = (
                    start
                    if self.blocked_all
                    else runner.run_plain(events, start, batch, pid, self.blocked)
                )
                counted += stop - start  # (Event.counted: a copy with values)
                if stop < end:
                    e = events[stop]
                    counted += e.counted
                    self._general(Group(event_gid(batch, e), [e]), abort)
                    stop += 1
                start = stop
            self.outcome.events += counted
            return
        run_event, counted = runner.run_event, 0
        # Without transactions to abort, run_event only calls this (a call per event less).
        execute_one = None if abort else runner._execute_one
        for e in events:
            pids = e.pids
            if (
                e.copy
                and e.values
                and not self.blocked_all
                and pids.count(pid) == len(pids)
                and (not self.blocked or self.blocked.isdisjoint(e.values))
            ):
                counted += 1  # (Event.counted: a copy with values)
                if execute_one is not None:
                    execute_one(e, None, None, batch)
                else:
                    run_event(e, batch, abort)
            else:
                counted += e.counted
                self._general(Group(event_gid(batch, e), [e]), abort)
        self.outcome.events += counted

    def shipped_rows(self) -> list[tuple[Any, dict[str, dict[Any, Row]]]]:
        """The rows of every deferred value, for the coordinator: (value, table -> rows)."""
        state = self.state
        values = set(self.blocked)
        if self.blocked_all:  # (a value is a key of its table's dict, in either layout)
            values.update(v for t in self.job.tables for v in state.data.get(t, {}))
        tables = self.job.tables
        return [(v, {t: dict(state.rows_of(t, v)) for t in tables}) for v in values]
