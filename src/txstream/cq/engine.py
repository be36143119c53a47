"""Running a continuous query under a CQ-processing strategy, with concurrent updaters.

:class:`CQEngine` holds the query's plan, its input and its redo queues, and
makes the reads; the rooms around it: :mod:`~txstream.cq.strategies` (how a
unit runs as a transaction, one class per strategy), :mod:`~txstream.cq.units`
(events, count-based and time-based windows), :mod:`~txstream.cq.intake` (input
checks), :mod:`~txstream.cq.entries` (what a run keeps) and
:mod:`~txstream.cq.updaters` (the experiments' load).

Strategies, by name (:data:`STRATEGIES`), each a :class:`Strategy` subclass that
maps onto a transaction-manager protocol:

* ``naive`` - today's engines: reference operators read the current rows with
  no transaction, and an overlapping window reuses the join results of the
  previous window (its synopsis);
* ``s2pl`` - two-phase lock strategy (Section 4.1): the CQ-derived transaction
  read-locks what it references until the commit operator emits (``ss2pl``);
* ``snapshot`` - snapshot strategy (Section 4.2): the transaction reads the
  table as of its start (``snapshot``);
* ``optimistic`` - Section 5: read phase, then validation of every read's
  referenced-resource timestamp at commit; on failure abort and redo
  (``optimistic``).

The unit of a CQ-derived transaction follows from the commit operator
(Definition 3.2): with a window-based operator in the tree, one transaction
per window of it (the reference operators below the window, those above it up
to the commit operator, all in that one transaction); without one, one per
input event.  Operators above the commit operator run after the commit.

Overlapping windows (Section 4.3): every input event is kept in the **redo
queue** that SETUP-REDO-QUEUES (Algorithm 1) places on its branch, as it
entered the queue's operator, with the reads its evaluation made and its
output.  The next window's transaction re-reads those rows under its own
protocol (a read lock, its snapshot, a read timestamp to validate); an event
whose rows are still at the versions it read keeps its output, an event with a
changed row is re-input from the queue and evaluated again.  After a window
commits, the events below the next window's LWM are pruned.

Versions are per row: a read records the commit timestamp of the row version
it saw, so an update to a row that a window never read neither blocks nor
invalidates its transaction, and each :class:`Result` says per (table, row)
which versions it saw and whether some instant had all of them current.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from txstream.cq.base import (
    DIRTY,
    CQError,
    Event,
    Operator,
    Project,
    Read,
    Reference,
    RefJoin,
    Result,
    Row,
    Select,
    WindowAgg,
    WindowJoin,
)
from txstream.cq.entries import Branch, Entry, Pending, RunStats
from txstream.cq.intake import tag
from txstream.cq.plan import commit_operator, setup_redo_queues, shape, validate
from txstream.cq.strategies import STRATEGIES as STRATEGIES
from txstream.cq.strategies import Naive as Naive
from txstream.cq.strategies import Optimistic as Optimistic
from txstream.cq.strategies import SnapshotStrategy as SnapshotStrategy
from txstream.cq.strategies import Strategy as Strategy
from txstream.cq.strategies import TwoPhaseLock as TwoPhaseLock
from txstream.cq.strategies import UnknownStrategyError as UnknownStrategyError
from txstream.cq.strategies import get_strategy as get_strategy
from txstream.cq.strategies import make_manager as make_manager
from txstream.cq.units import no_column, run_count, run_per_event, run_time
from txstream.cq.updaters import Updaters as Updaters
from txstream.model.history import Operation
from txstream.storage import Table
from txstream.storage.base import ABSENT as _ABSENT
from txstream.storage.base import StorageError
from txstream.txn import Transaction, TransactionManager
from txstream.txn.base import ACTIVE, SHARED
from txstream.txn.locks import RCB, solo_of

VERSION_KEY = "__version__"
"""A table-level counter row some callers keep (plain Spark's baseline reads it).

The engine itself no longer reads it: versions are per row."""

_ABSENT_ROW: Any = object()


class CQEngine:
    """Evaluates one continuous query (an operator tree) under a strategy.

    Call :meth:`run` with the raw events (one source: the rows; several: pairs
    ``(source name, row)`` in arrival order; an event's index is its
    timestamp), or :meth:`feed` them in micro-batches.  ``tables`` maps each
    referenced table to its columns (for validation); the tables live in
    ``tm``'s store.  A tree the engine cannot run is refused here.
    """

    forget_at: int = 1024
    """Feed drops the raw events no window needs once at least this many are."""

    release_every: int = 32
    """``s2pl``, ``optimistic``: windows a transaction's unneeded reads may be kept for.

    A window's transaction hands the reads of the events the next window
    shares on to it.  Sorting out the others (releasing their read locks,
    dropping them from the read set) costs about as much as the window's own
    reads, so the engine lets the successor keep every read, and sorts them out
    only every this many windows, and at once when an updater waits for a lock
    (``s2pl``).  Holding a read lock or validating a read a little longer is
    never less safe, only less concurrent: an updater of such a row waits a few
    windows more (``s2pl``), a window may be redone for a row a predecessor read
    (``optimistic``).  1: sort them out at every window.  Only without a
    recorder and without callbacks (``on_result``, ``on_commit``), which could
    update a kept row from this thread.

    (Keeping ``s2pl``'s read locks until an updater waits for one, with no bound
    in windows, was measured and is slower under the collector: the lock table's
    entries then live long enough to reach its oldest generation, whose full
    passes are the expensive ones.)
    """

    escalate_after: int = 8
    """``optimistic``: failed attempts in a row after which a unit runs on a snapshot.

    An updater that rewrites the rows a window reads faster than the window's
    transaction runs fails its validation again and again; without a bound the
    query would make no progress.  After this many failed attempts of one unit
    (a window, or an input event without a window) its next attempt is a
    read-only snapshot transaction
    (:meth:`~txstream.txn.TransactionManager.begin_snapshot`): it reads the
    rows as committed when it began, never waits and always commits; the next
    unit is optimistic again.  ``stats.escalations`` counts them.
    """

    def __init__(
        self,
        root: Operator,
        tm: TransactionManager,
        strategy: str,
        tables: Mapping[str, tuple[str, ...]],
    ) -> None:
        kind = get_strategy(strategy)
        if not isinstance(root, Operator) or not isinstance(tm, TransactionManager):
            raise CQError(
                "CQEngine(root, tm, strategy, tables) takes an operator tree and a "
                f"TransactionManager (make_manager(strategy)), got {type(root).__name__} and "
                f"{type(tm).__name__}"
            )
        if tm.protocol.name != kind.protocol:
            raise CQError(
                f"strategy {strategy!r} needs a transaction manager with protocol "
                f"{kind.protocol!r}, not {tm.protocol.name!r} (use make_manager)"
            )
        validate(root, tables)
        self.root = root
        self.tm = tm
        plan = shape(root)
        self.window: WindowAgg | WindowJoin | None = plan.window
        self.commit_op = commit_operator(root)
        self.redo_queues = setup_redo_queues(root)
        self.sources = [src for src, _ in plan.branches]
        self._need = [frozenset(src.columns) for src in self.sources]  # (see intake.tag)
        self.source = self.sources[0]
        self._names = {src.name: k for k, src in enumerate(self.sources)}
        time_column = self.window.time_column if self.window is not None else None
        self._branches: list[Branch] = []
        for k, (src, chain) in enumerate(plan.branches):
            q = len(chain)
            for i, op in enumerate(chain):
                below = chain[i - 1] if i else src
                if (op.name, below.name) in self.redo_queues:
                    q = i
                    break
            if self.window is not None and q == len(chain) and any(o.is_reference for o in chain):
                raise CQError(  # Algorithm 1 always queues these inputs: a bug, not bad input
                    f"internal: no redo queue below the reference operators of {src.name!r}"
                )
            self._branches.append(Branch(src, k, chain[:q], chain[q:], time_column))
        # the operators run inside the transaction and those after its commit
        above = plan.above if plan.window is not None else plan.branches[0][1]
        cut = 0
        for i, op in enumerate(above):
            if op is self.commit_op:
                cut = i + 1
        if plan.window is None:
            # no window: the whole chain is one event's transaction
            self._branches[0] = Branch(self.source, 0, [], above[:cut], None)
            self._after = above[cut:]
            self._inside: list[Operator] = []
        else:
            self._inside = above[:cut]
            self._after = above[cut:]
        self.stats = RunStats()
        self._tables: dict[str, Table] = {name: tm.table(name) for name in tables}
        self._quiet_now: bool = False
        # How reads are made on the direct path (no recorder, no order), which
        # _apply_direct writes out inline per strategy (the engine's hot path: one
        # read per input event); the strategy's class says which applies.
        ordered = tm.recorder is not None or tm.ordered
        # s2pl and optimistic, direct: reads call the protocol's read hook and read the
        # table (see _read)
        self._direct = (kind.locks_reads or kind.validates_reads) and not ordered
        self._lock = tm.protocol.before_read
        # s2pl, direct: the lock manager's table, for SS2PL.before_read's uncontended
        # path inline (see _apply_direct)
        self._lock_table: dict[str, RCB] | None = (
            tm.locks.table if self._direct and kind.locks_reads else None
        )
        # optimistic, direct: an item read joins the read set as read at the clock of
        # the attempt's start (see _since)
        self._late = self._direct and kind.validates_reads
        # What the protocol's read hook notes per read (the commit clock at the read,
        # see Optimistic.before_read), sampled once per attempt: after the transaction
        # began and before any of its reads, so a write committed after a read is
        # after it too and fails the validation (a write between it and the read does
        # as well: stricter, never laxer).  An item already in the read set keeps its
        # earlier clock.
        self._since = 0
        # snapshot without a recorder or order: a read-only transaction's read is
        # the row as of its snapshot, with no hook to call (see _apply_direct)
        self._snapshot = kind.snapshot_reads
        self._snap_direct = kind.snapshot_reads and not ordered
        self._direct_apply = self._direct or self._snap_direct
        # (the class's flag, read per event: an instance attribute loads faster)
        self._transactional = kind.transactional
        self._txn_per_unit = kind.transactional and self.commit_op is not None
        self._limits: tuple[int | None, float | None] = (None, None)
        self._on_result: Callable[[Result], None] | None = None
        self._on_commit: Callable[[int], None] | None = None
        self._input: list[Row] = []
        self._branch_of: list[int] = []  # several sources: the branch of each input event
        self._base: int = 0
        # "run" or "feed": an engine does one or the other (run's results are the list
        # feed would append to, and run would drop the events feed left waiting)
        self._used: str | None = None
        self._off = 0
        self._results: list[Result] = []
        self.strategy: Strategy = kind(self)
        """The strategy's instance that runs this engine's units."""
        self._reset()

    # -- reading a referenced resource ----------------------------------------------------

    def _read(
        self,
        txn: Transaction | None,
        table: str,
        key: Any,
        slots: list[Any] | None,
    ) -> tuple[Any, Read]:
        """The row of ``key`` and the read: (table, key, row version, instant it was current).

        ``snapshot`` reads its snapshot: the version is the newest one at or
        before the snapshot, current at the snapshot.  The others read the
        current row; its version is that of the newest committed version if the
        row read is that version (else the read saw an uncommitted row:
        ``DIRTY``), current at least from the clock sampled before the read.
        """
        self.stats.reads += 1
        tbl = self._tables[table]
        clock = self.tm.clock
        if self._direct and txn is not None and txn.snapshot_ts is None:
            # What txn.read does for a read-only transaction of these protocols
            # without a recorder: the protocol's read hook (the read lock; the read
            # timestamp to validate: optimistic notes the clock of the attempt's start,
            # see _since), then the current row.
            item = tbl.item(key)
            if self._late:
                txn.reads.setdefault(item, self._since)
            else:
                self._lock(txn, item)
            value = tbl.read(key, _ABSENT_ROW)
        elif txn is not None and txn.snapshot_ts is not None:
            snap = txn.snapshot_ts
            value = txn.read(tbl, key)
            version = tbl.latest(key)[0]
            if version > snap:  # changed since the snapshot: the version it shows
                version = 0
                for vts, _ in reversed(tbl.versions(key)):
                    if vts <= snap:
                        version = vts
                        break
            return value, (table, key, version, snap)
        elif txn is not None:
            value = txn.read(tbl, key, _ABSENT_ROW)
        else:
            value = tbl.read(key, _ABSENT_ROW)
            if slots is not None:
                rec = self.tm.recorder
                assert rec is not None
                slots.append(rec.slot())  # the read's place in the history, owner named later
        version, committed = tbl.latest(key)
        if value is _ABSENT_ROW:
            value = None
            if committed is not _ABSENT and committed is not None:
                version = DIRTY  # deleted by a transaction that has not committed
        elif committed is not value:
            version = DIRTY
        return value, (table, key, version, clock if clock > version else version)

    def _apply(
        self,
        ops: list[Operator],
        e: Event,
        txn: Transaction | None,
        reads: list[Read],
        slots: list[Any] | None = None,
    ) -> Event | None:
        """Push one event through ``ops`` (bottom-up); append its reads to ``reads``."""
        for op in ops:
            if isinstance(op, Select):
                if not op.predicate(e.value):
                    return None
            elif isinstance(op, Project):
                value = op.fn(e.value)
                if not isinstance(value, dict):
                    raise _not_a_dict(op, "fn", value)
                e = Event(value, e.ts, e.lwm, e.refs)
            elif isinstance(op, RefJoin):
                try:
                    key = e.value[op.key]
                except KeyError:
                    raise no_column(f"join {op.name!r}", op.key, e.value) from None
                try:
                    row, read = self._read(txn, op.table, key, slots)
                except (TypeError, StorageError):  # (the table refuses an unhashable key)
                    _check_key(op, key)
                    raise
                reads.append(read)
                if row is None:
                    return None
                try:
                    if op.prefix:
                        row = {op.prefix + k: v for k, v in row.items()}
                    e = Event({**e.value, **row}, e.ts, e.lwm, (*e.refs, read))
                except (TypeError, AttributeError):
                    raise _not_a_row(op, key, row) from None
            elif isinstance(op, Reference):
                resource, read = self._read(txn, op.table, op.key, slots)
                reads.append(read)
                applied = op.apply(e.value, resource)
                if applied is None:
                    return None
                if not isinstance(applied, dict):
                    raise _not_a_dict(op, "apply", applied)
                e = Event(applied, e.ts, e.lwm, (*e.refs, read))
        return e

    def _apply_direct(
        self,
        ops: list[Operator],
        e: Event,
        txn: Transaction,
        reads: list[Read],
    ) -> Event | None:
        """:meth:`_apply` for ``s2pl``, ``optimistic`` (``_direct``) and ``snapshot``.

        A :class:`RefJoin`'s read is :meth:`_read`'s path written out here,
        without the calls (the engine's hot path: one per input event).  ``s2pl``
        and ``optimistic``: sample the clock, name the item, the read lock
        (:meth:`SS2PL.before_read <txstream.txn.protocols.SS2PL.before_read>`'s
        uncontended path; any other case goes through the protocol's hook) or,
        optimistic, note the item as read at the attempt's start (``_since``), then the
        current row and the newest committed version.  ``snapshot`` (no recorder,
        no order; a read-only transaction has no writes of its own and its
        protocol's read hook does nothing): the newest version at or before the
        snapshot, as :meth:`Table.read_at <txstream.storage.Table.read_at>` finds
        it.  Other operators go through :meth:`_apply`.
        """
        snap = txn.snapshot_ts
        if snap is not None and (txn.state != ACTIVE or txn.doomed is not None):
            return self._apply(ops, e, txn, reads)  # txn.read raises
        # (no enumerate, no assert: per read they cost more than the rest of the loop's
        # bookkeeping; the index is looked up only when another operator comes)
        for op in ops:
            if op.__class__ is not RefJoin:
                if isinstance(op, Select):
                    if not op.predicate(e.value):
                        return None
                    continue
                k = next(i for i, o in enumerate(ops) if o is op)
                return self._apply(ops[k:], e, txn, reads)
            if TYPE_CHECKING:
                assert isinstance(op, RefJoin)
            try:
                key = e.value[op.key]
            except KeyError:
                raise no_column(f"join {op.name!r}", op.key, e.value) from None
            table = op.table
            tbl = self._tables[table]
            self.stats.reads += 1
            if snap is not None:
                value: Any
                try:
                    chain = tbl._versions.get(key)
                except TypeError:
                    _check_key(op, key)
                    raise
                if not chain:
                    value, version = None, 0
                else:
                    version, value = chain[-1]
                    if version > snap:  # changed since the snapshot: the version it shows
                        value = tbl.read_at(key, snap, _ABSENT)
                        version = 0
                        for vts, _ in reversed(chain):
                            if vts <= snap:
                                version = vts
                                break
                    if value is _ABSENT:
                        value = None
                read = (table, key, version, snap)
                reads.append(read)
                if value is None:
                    return None
                try:
                    if op.prefix:
                        value = {op.prefix + c: v for c, v in value.items()}
                    e = Event({**e.value, **value}, e.ts, e.lwm, (*e.refs, read))
                except (TypeError, AttributeError):
                    raise _not_a_row(op, key, value) from None
                continue
            clock = self.tm.clock
            try:
                item = tbl._items.get(key) or tbl.item(key)
            except (TypeError, StorageError):
                _check_key(op, key)
                raise
            if self._late:
                txn.reads.setdefault(item, self._since)
            else:
                # (no look at txn.locks first: an item txn holds through its Solo record
                # is found as new ones are, one it shares is asked for again and the
                # lock manager finds it held)
                lock_table = self._lock_table
                solo = txn.solo or solo_of(txn)
                if lock_table is not None and lock_table.setdefault(item, solo) is solo:
                    txn.locks[item] = SHARED
                else:
                    self._lock(txn, item)  # held by others (or another protocol)
            value = tbl._current.get(key, _ABSENT_ROW)
            chain = tbl._versions.get(key)
            version, committed = chain[-1] if chain else (0, _ABSENT)
            if value is _ABSENT_ROW:
                if committed is not _ABSENT and committed is not None:
                    version = DIRTY  # deleted by a transaction that has not committed
                reads.append((table, key, version, clock if clock > version else version))
                return None
            if committed is not value:
                version = DIRTY
            read = (table, key, version, clock if clock > version else version)
            reads.append(read)
            if value is None:
                return None
            row = value
            try:
                if op.prefix:
                    row = {op.prefix + c: v for c, v in row.items()}
                e = Event({**e.value, **row}, e.ts, e.lwm, (*e.refs, read))
            except (TypeError, AttributeError):
                raise _not_a_row(op, key, value) from None
        return e

    def _state(self, txn: Transaction | None, reads: list[Read]) -> tuple[int, int]:
        """The instants at which every version read was the committed one: [lo, hi].

        Under ``snapshot`` every read is of the snapshot.  Otherwise each row is
        looked at again now (inside the transaction: ``s2pl`` still holds its
        locks, ``optimistic`` has not validated yet): a version still current
        is current now; one that is not was current at least when it was read.
        Shortcut: when nothing committed since the previous unit found all its
        reads current (``_clean``), every read of this unit, made since or
        found current then, is current now.
        """
        lo = 0
        for _, _, version, _ in reads:
            if version == DIRTY:
                self._clean = -1
                return (1, 0)
            if version > lo:
                lo = version
        self._prev = self._attempt
        now = self.tm.clock
        if txn is not None and txn.snapshot_ts is not None:
            self._clean = now if now == txn.snapshot_ts else -1
            return (lo, txn.snapshot_ts)
        if now == self._clean:
            return (lo, now)
        hi = now
        tables = self._tables
        for table, key, version, seen in reads:
            if seen < hi and tables[table].latest(key)[0] != version:
                hi = seen
        self._clean = now if hi == now else -1
        return (lo, hi)

    def _quiet(self, txn: Transaction | None) -> bool:
        """Nothing committed since the previous unit found its reads current."""
        if txn is not None and txn.snapshot_ts is not None:
            return txn.snapshot_ts == self._clean
        return self.tm.clock == self._clean

    # -- the redo queues ------------------------------------------------------------------

    def _evaluate(self, ts: int, txn: Transaction | None) -> Entry:
        """Input one raw event: run its branch below the queue once, then the rest."""
        row = self._input[ts - self._off]
        branch = self._branch_of[ts - self._off] if self._branch_of else 0
        b = self._branches[branch]
        entry = Entry(ts, branch)
        event = Event(row, ts, ts)
        entry.queued = self._apply(b.before, event, None, []) if b.before else event
        self._rerun(entry, txn)
        return entry

    def _rerun(self, entry: Entry, txn: Transaction | None) -> None:
        """(Re-)input the entry's queued event above the redo queue, in ``txn``."""
        entry.checked = self._attempt
        if entry.queued is None:
            entry.out, entry.reads = None, ()
            return
        reads: list[Read] = []
        slots: list[Any] | None = [] if self._record_naive and txn is None else None
        after = self._branches[entry.branch].after
        if txn is not None and self._direct_apply:
            entry.out = self._apply_direct(after, entry.queued, txn, reads)
        else:
            entry.out = self._apply(after, entry.queued, txn, reads, slots)
        entry.reads = tuple(reads)
        entry.slots = slots or []

    def _entry(self, ts: int, txn: Transaction | None) -> Entry:
        """Event ``ts`` for the current window: from the redo queue, re-read or redone."""
        entry = self._queue.get(ts)
        if entry is None:
            entry = self._evaluate(ts, txn if self._transactional else None)
            self._queue[ts] = entry
            if len(self._queue) > self.stats.max_redo_queue:
                self.stats.max_redo_queue = len(self._queue)
            return entry
        if not self._transactional or entry.checked == self._attempt or not entry.reads:
            return entry  # naive reuses its synopsis as it is
        assert txn is not None
        if entry.checked == self.strategy.hand.kept_from and self._fast:
            # The previous window's transaction read it and handed all its reads on to
            # this one (read locks kept, or validated up to its commit and validated
            # again at this one's): they are this transaction's reads, as they were.
            entry.checked = self._attempt
            return entry
        if (
            self._quiet_now
            and entry.checked >= self._prev
            and self.strategy.current_as_read(txn, entry)
        ):
            # Its rows are at the versions it read (nothing committed since they were
            # found current): the transaction only had to make them its own reads.
            entry.checked = self._attempt
            return entry
        fresh: list[Read] = []
        for table, key, version, _ in entry.reads:
            _, read = self._read(txn, table, key, None)
            if read[2] != version:
                self.stats.reevaluated += 1
                self._rerun(entry, txn)
                return entry
            fresh.append(read)
        entry.reads = tuple(fresh)
        entry.checked = self._attempt
        return entry

    def _prune(self, below: int) -> None:
        """Drop the events below the next window's LWM from the redo queues."""
        queue = self._queue
        for ts in range(self._base, below):
            queue.pop(ts, None)
        self._base = max(self._base, below)

    # -- running ------------------------------------------------------------------------

    def run(
        self,
        events: Sequence[Any],
        *,
        max_results: int | None = None,
        until: float | None = None,
        on_result: Callable[[Result], None] | None = None,
        on_commit: Callable[[int], None] | None = None,
    ) -> list[Result]:
        """Process ``events`` (their index is their timestamp); return the results.

        Stops at the end of the input, after ``max_results`` results, or at the
        wall-clock time ``until`` (``time.monotonic()``).  ``on_result`` sees each
        result; ``on_commit`` is called with the unit's index (window, or input
        event without a window) after each CQ-derived transaction commits and
        its results are out, e.g. to interleave other work deterministically.
        Each call starts afresh; an engine that was fed micro-batches refuses it.
        """
        if max_results is not None and (
            not isinstance(max_results, int) or isinstance(max_results, bool)
        ):
            raise CQError(f"max_results must be a whole number, got {max_results!r:.40}")
        if max_results is not None and max_results < 0:
            raise CQError(f"max_results must be 0 or more, got {max_results}")
        if until is not None and (not isinstance(until, int | float) or isinstance(until, bool)):
            raise CQError(f"until must be a time.monotonic() instant (a number), got {until!r:.40}")
        if self._used == "feed":
            raise CQError(
                "this engine is fed micro-batches; run() would drop the events waiting for "
                "their window: feed the rest, or build a new CQEngine to run another input"
            )
        self._reset()
        self._input, self._branch_of = tag(self, events)
        self._used = "run"
        self._on_commit = on_commit
        return self._advance(max_results, until, on_result)

    def feed(
        self, events: Sequence[Any], on_result: Callable[[Result], None] | None = None
    ) -> list[Result]:
        """Streaming use: append raw events; run every window now complete; the new results.

        Events of a window that is not complete yet wait in the redo queue, so
        a window's CQ-derived transaction covers events of several micro-batches
        and still reads one state of the tables.  Results that a call which
        raised had committed before the error are returned by the next call.
        An engine that ran a whole input with :meth:`run` refuses it (its
        results would grow).
        """
        if self._used == "run":
            raise CQError(
                "run() processed a whole input on this engine; feed micro-batches to a new "
                "CQEngine (or call run() with the whole input)"
            )
        rows, branches = tag(self, events)
        self._used = "feed"
        self._input.extend(rows)
        self._branch_of.extend(branches)
        self._on_commit = None
        self._advance(None, None, on_result)
        # every result not returned yet: a call that raised (an error of the query's
        # own code, say) may have committed windows before it did
        out, self._results = self._results, []
        self._forget()
        return out

    def _forget(self) -> None:
        """Feed: drop the raw events no window needs any more (all below the next one's).

        The events from the redo queues' base on (per event: from the next one)
        stay, and the last one (the next batch's times go on from its time);
        amortized: a cut happens when it drops at least half of what is kept.
        """
        low = self._pos if self.window is None else self._base
        cut = min(low - self._off, len(self._input) - 1)
        if cut >= self.forget_at and 2 * cut >= len(self._input):
            del self._input[:cut]
            if self._branch_of:
                del self._branch_of[:cut]
            self._off += cut

    def _reset(self) -> None:
        self._input = []
        self._branch_of = []
        self._results = []  # feed: those not returned yet
        self._off = 0  # the index (timestamp) of the raw event _input[0]
        self._queue: dict[int, Entry] = {}
        self._base = 0  # the redo queues hold no event below this
        self._pos = 0  # per-event mode: next raw event
        self._start = 0  # count-based windows: raw index where the next window starts
        self._wstart: float | None = None  # time-based windows: the next window's start
        self._t0 = 0.0  # time-based windows: the first event's time
        self._windows = 0  # windows completed
        self._attempt = 0
        # the clock at which the previous unit's reads were all found current (-1: no),
        # and that unit's attempt
        self._clean = -1
        self._prev = 0
        self._fast = self.tm.recorder is None  # shortcuts skip reads a history must show
        self._quiet_now = False  # the current attempt may take the shortcut
        self._record_naive = not self._transactional and self.tm.recorder is not None

    def _advance(
        self,
        max_results: int | None,
        until: float | None,
        on_result: Callable[[Result], None] | None,
    ) -> list[Result]:
        every = self.release_every
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise CQError(f"release_every must be a positive number of windows, not {every!r:.40}")
        after = self.escalate_after
        if not isinstance(after, int) or isinstance(after, bool) or after < 1:
            raise CQError(
                f"escalate_after must be a positive number of attempts, not {after!r:.40}"
            )
        self._limits = (max_results, until)
        self._on_result = on_result
        # a window's transaction may keep every read for the next one (see release_every),
        # or a snapshot transaction go on, when nothing runs in this thread between
        # windows that could update a kept row
        self.strategy.start(on_result is None and self._on_commit is None)
        w = self.window
        try:
            if w is None:
                run_per_event(self)
            elif isinstance(w, WindowAgg) and w.time_column is None:
                run_count(self)
            else:
                run_time(self)
        finally:
            # no transaction stays open between calls (feed's callers may wait long)
            self.strategy.stop()
        return self._results

    def _emit(self, p: Pending, attempts: int) -> None:
        row = p.row
        if row is None:
            return
        if self._after:
            out = self._apply(self._after, Event(row, p.lwm, p.lwm), None, [])
            if out is None:
                return
            row = out.value
        value = row.get("value", row)
        versions = frozenset([(t, k, v) for t, k, v, _ in p.reads])
        result = Result(value, p.window, p.lwm, versions, attempts, p.state, row)
        self._results.append(result)
        if self._on_result is not None:
            self._on_result(result)

    def _stopped(self) -> bool:
        """Whether the run's result count or deadline is reached."""
        return _stop(self._results, *self._limits)

    def _items(self, entries: Iterable[Entry]) -> set[str]:
        """The data items the entries' reads read, as the protocols name them."""
        tables = self._tables
        return {tables[table].item(key) for e in entries for table, key, _, _ in e.reads}

    def _name_reads(self, txn: Transaction, entries: list[Entry]) -> None:
        """Naive with a recorder: the window's transaction made the reads of its events."""
        for entry in entries:
            for (table, key, _, _), slot in zip(entry.reads, entry.slots, strict=True):
                slot.append(Operation("r", txn.hid, self._tables[table].item(key)))


def _check_key(op: RefJoin, key: Any) -> None:
    """:class:`CQError` when ``key`` cannot key a table row (a list, a dict)."""
    try:
        hash(key)
    except TypeError:
        raise CQError(
            f"join {op.name!r}: the key {op.key!r} of an event is {type(key).__name__} "
            f"{key!r:.40}, which cannot key a row (give a number, a string or a tuple)"
        ) from None


def _not_a_row(op: RefJoin, key: Any, row: Any) -> CQError:
    """A row of a joined table is not a dict of its columns (another system wrote it)."""
    return CQError(
        f"join {op.name!r}: row {key!r} of table {op.table!r} is {type(row).__name__} "
        f"{row!r:.40}, not a dict of its columns"
    )


def _not_a_dict(op: Project | Reference, what: str, value: Any) -> CQError:
    """A user's function gave an event value that is not a dict."""
    none = " or None" if isinstance(op, Reference) else ""
    return CQError(
        f"operator {op.name!r}: its {what} must return a dict of the event's columns{none}, "
        f"got {type(value).__name__} {value!r:.40}"
    )


def _stop(results: list[Result], max_results: int | None, until: float | None) -> bool:
    if max_results is not None and len(results) >= max_results:
        return True
    return until is not None and time.monotonic() >= until
