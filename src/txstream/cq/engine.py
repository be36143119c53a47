"""Running a continuous query under a CQ-processing strategy, with concurrent updaters.

Strategies, by name (:data:`STRATEGIES`), each a :class:`Strategy` that maps
onto a transaction-manager protocol:

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

The transactional strategies evaluate one window per CQ-derived transaction.
Overlapping windows (slide < range) are handled as in Section 4.3: the events
entering the reference operator are kept in a **redo queue**; when a
transaction commits, the synopsis is reset and the events from the biggest LWM
of the overlap on are re-input, so the next transaction references the table
itself instead of reusing reads of the previous one; events below the LWM are
pruned from the queue.

A table's *version* is a counter row that every update transaction increments
(the resource ``x`` that becomes ``x'`` in Figure 2); each read records the
version it saw, so each :class:`Result` says which versions it mixed.
"""

from __future__ import annotations

import threading
import time
from abc import ABC
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from txstream.cq.base import (
    CQError,
    Event,
    Operator,
    Project,
    Reference,
    RefJoin,
    Result,
    Row,
    Select,
)
from txstream.cq.plan import commit_operator, pipeline, setup_redo_queues, validate
from txstream.errors import TransientError, UnknownNameError
from txstream.storage import Table
from txstream.txn import Transaction, TransactionManager

VERSION_KEY = "__version__"
"""The row of each referenced table that counts its committed update transactions."""


class Strategy(ABC):
    """A CQ-processing strategy: the protocol its transactions run under."""

    name: ClassVar[str]
    protocol: ClassVar[str]
    summary: ClassVar[str]
    transactional: ClassVar[bool] = True


class Naive(Strategy):
    """No concurrency control (today's engines)."""

    name = "naive"
    protocol = "none"
    summary = "no concurrency control: reads see whatever rows are current"
    transactional = False


class TwoPhaseLock(Strategy):
    """Read locks from the first reference until the commit operator."""

    name = "s2pl"
    protocol = "ss2pl"
    summary = "read locks held until the CQ-derived transaction commits"


class SnapshotStrategy(Strategy):
    """Reads the table version as of the transaction's start."""

    name = "snapshot"
    protocol = "snapshot"
    summary = "the transaction reads a snapshot taken at its start"


class Optimistic(Strategy):
    """Validate reads at commit; abort and redo on a conflict."""

    name = "optimistic"
    protocol = "optimistic"
    summary = "validate referenced-resource timestamps at commit, redo on failure"


STRATEGIES: dict[str, type[Strategy]] = {
    c.name: c for c in (Naive, TwoPhaseLock, SnapshotStrategy, Optimistic)
}


def get_strategy(name: str) -> type[Strategy]:
    """The strategy class called ``name``; :class:`UnknownNameError` otherwise."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise UnknownNameError("strategy", name, list(STRATEGIES)) from None


def make_manager(strategy: str, *, record: bool = False) -> TransactionManager:
    """A transaction manager with the protocol ``strategy`` needs."""
    return TransactionManager(protocol=get_strategy(strategy).protocol, record=record)


@dataclass
class RunStats:
    """What a run did besides its results."""

    redos: int = 0
    reads: int = 0
    reevaluated: int = 0  # events re-input from a redo queue
    max_redo_queue: int = 0


class CQEngine:
    """Evaluates one continuous query over a finite input under a strategy.

    Call :meth:`run` with the raw events; it returns the results in window
    order.  ``tables`` maps each referenced table to its columns (for
    validation); the tables live in ``tm``'s store.
    """

    def __init__(
        self,
        root: Operator,
        tm: TransactionManager,
        strategy: str,
        tables: Mapping[str, tuple[str, ...]],
    ) -> None:
        self.strategy = get_strategy(strategy)
        if tm.protocol.name != self.strategy.protocol:
            raise CQError(
                f"strategy {strategy!r} needs a transaction manager with protocol "
                f"{self.strategy.protocol!r}, not {tm.protocol.name!r} (use make_manager)"
            )
        validate(root, tables)
        self.root = root
        self.tm = tm
        self.source, self.pre, self.window, self.post = pipeline(root)
        self.commit_op = commit_operator(root)
        self.redo_queues = setup_redo_queues(root)
        self.stats = RunStats()
        self._versions: dict[str, int] = {}  # table -> version read by the current transaction
        self._raw: list[Row] = []
        self._limits: tuple[int | None, float | None] = (None, None)
        self._on_result: Callable[[Result], None] | None = None
        self._reset()
        self._tables: dict[str, Table] = {name: tm.table(name) for name in tables}

    # -- reading a referenced resource --------------------------------------------------

    def _read(self, txn: Transaction | None, table: str, key: Any) -> tuple[Any, int]:
        """The row and the version of its table that the read saw.

        Inside a transaction the version is read once, at the table's first
        reference (and first, so that under ``s2pl`` the lock on the version row
        is taken before any row lock: updaters lock it first too, so no cycle).
        That one version is the version of every read of the transaction:
        snapshot reads are of one state, ``s2pl`` holds the version row's read
        lock to the end, and ``optimistic`` validates it at commit.
        """
        self.stats.reads += 1
        if txn is None:
            tbl = self._tables[table]
            return tbl.read(key), int(tbl.read(VERSION_KEY, 0))
        version = self._versions.get(table)
        if version is None:
            version = self._versions[table] = int(txn.read(table, VERSION_KEY, 0))
        return txn.read(table, key), version

    def _pre(self, raw: Row, ts: int, txn: Transaction | None) -> Event | None:
        """Push one raw event through the operators below the window."""
        e = Event(raw, ts, ts)
        for op in self.pre:
            if isinstance(op, Select):
                if not op.predicate(e.value):
                    return None
            elif isinstance(op, Project):
                e = Event(op.fn(e.value), e.ts, e.lwm, e.refs)
            elif isinstance(op, RefJoin):
                key = e.value[op.key]
                row, version = self._read(txn, op.table, key)
                if row is None:
                    return None
                joined = {**e.value, **{op.prefix + k: v for k, v in row.items()}}
                e = Event(joined, e.ts, e.lwm, (*e.refs, (op.table, key, version)))
            elif isinstance(op, Reference):
                resource, version = self._read(txn, op.table, op.key)
                value = op.apply(e.value, resource)
                if value is None:
                    return None
                e = Event(value, e.ts, e.lwm, (*e.refs, (op.table, op.key, version)))
        return e

    def _post(self, value: Row) -> Row | None:
        for op in self.post:
            if isinstance(op, Select) and not op.predicate(value):
                return None
            if isinstance(op, Project):
                value = op.fn(value)
        return value

    # -- running ------------------------------------------------------------------------

    def run(
        self,
        events: Sequence[Row],
        *,
        max_results: int | None = None,
        until: float | None = None,
        on_result: Callable[[Result], None] | None = None,
    ) -> list[Result]:
        """Process ``events`` (their index is their timestamp); return the results.

        Stops at the end of the input, after ``max_results`` results, or at the
        wall-clock time ``until`` (``time.monotonic()``).
        """
        self._reset()
        self._raw = list(events)
        return self._advance(max_results, until, on_result)

    def feed(
        self, events: Sequence[Row], on_result: Callable[[Result], None] | None = None
    ) -> list[Result]:
        """Streaming use: append raw events; run every window now complete; the new results.

        Events of a window that is not complete yet wait in the redo queue, so
        a window's CQ-derived transaction covers events of several micro-batches
        and still reads one table version.
        """
        self._raw.extend(events)
        before = len(self._results)
        self._advance(None, None, on_result)
        return self._results[before:]

    def _reset(self) -> None:
        self._results: list[Result] = []
        self._pos = 0  # next raw event not yet input
        self._carried: list[Event] = []  # the synopsis: overlap of the previous window
        self._synopsis: deque[Event] = deque(maxlen=self.window.r if self.window else 1)
        self._since = 0
        self._reinput = 0
        # time-based windows: the current window's start, the raw index of its
        # first event (the redo queue's head) and the versions its reads saw
        self._wstart: float | None = None
        self._rpos = 0
        self._seen_versions: dict[str, int] = {}
        self._tsyn: list[Event] = []

    def _advance(
        self,
        max_results: int | None,
        until: float | None,
        on_result: Callable[[Result], None] | None,
    ) -> list[Result]:
        self._limits = (max_results, until)
        self._on_result = on_result
        if self.window is None:
            self._run_per_event()
        elif self.window.time_column is not None:
            if self.strategy.transactional:
                self._run_transactional_time()
            else:
                self._run_naive_time()
        elif not self.strategy.transactional:
            self._run_naive()
        else:
            self._run_transactional()
        return self._results

    def _emit(self, result: Result) -> None:
        self._results.append(result)
        if self._on_result is not None:
            self._on_result(result)

    def _stopped(self) -> bool:
        """Whether the run's result count or deadline is reached."""
        return _stop(self._results, *self._limits)

    def _run_per_event(self) -> None:
        # Without a window the reference operator is the commit operator: one
        # CQ-derived transaction per event.
        events = self._raw
        while self._pos < len(events) and not self._stopped():
            ts = self._pos
            attempts = 0
            while True:
                attempts += 1
                txn = self.tm.begin(read_only=True) if self.strategy.transactional else None
                self._versions = {}
                try:
                    e = self._pre(events[ts], ts, txn)
                    value = self._post(e.value) if e is not None else None
                    if txn is not None:
                        txn.commit()
                    break
                except TransientError:
                    self.stats.redos += 1
            self._pos += 1
            if e is not None and value is not None:
                versions = frozenset(v for _, _, v in e.refs)
                n = len(self._results)
                self._emit(Result(value, n, e.lwm, versions, attempts))

    def _run_naive(self) -> None:
        window = self.window
        assert window is not None
        events = self._raw
        while self._pos < len(events) and not self._stopped():
            ts = self._pos
            self._pos += 1
            e = self._pre(events[ts], ts, None)
            if e is None:
                continue
            self._synopsis.append(e)
            self._since += 1
            full = len(self._synopsis) == window.r
            if full and (not self._results or self._since >= window.s):
                self._since = 0
                self._window_result(list(self._synopsis), 1)

    def _window_result(self, acc: list[Event], attempts: int, lwm: int = 0) -> None:
        window = self.window
        assert window is not None
        values = [float(a.value[window.column]) for a in acc] if window.column else []
        agg = window.compute(values)
        n = len(self._results)
        out = self._post({"window": n, "value": agg})
        versions = frozenset(v for a in acc for _, _, v in a.refs)
        lwm = min((a.lwm for a in acc), default=lwm)
        if out is not None:
            self._emit(Result(out["value"], n, lwm, versions, attempts))

    def _run_transactional(self) -> None:
        window = self.window
        assert window is not None
        events = self._raw
        while self._pos <= len(events) and not self._stopped():
            pos, carried = self._pos, self._carried

            def fill(txn: Transaction, pos: int = pos, carried: list[Event] = carried) -> Any:
                acc, i = self._reuse(txn, carried, pos, window.r)
                while len(acc) < window.r and i < len(events):
                    e = self._pre(events[i], i, txn)
                    if i < self._reinput:
                        self.stats.reevaluated += 1
                    i += 1
                    self._reinput = max(self._reinput, i)
                    if e is not None:
                        acc.append(e)
                # the input ends inside the window: wait for more events
                return (acc, i) if len(acc) == window.r else None

            done, attempts = self._transact(fill)
            if done is None:
                return
            acc, i = done
            self._window_result(acc, attempts)
            if window.s < window.r:
                # The next window starts with acc[s]: its LWM is the biggest LWM of
                # the overlap, so everything below it leaves the redo queue.
                self._carried = acc[window.s :]
                self.stats.max_redo_queue = max(self.stats.max_redo_queue, i - self._carried[0].lwm)
            else:
                self._carried = []
            self._pos = i

    def _transact(self, fill: Callable[[Transaction], Any]) -> tuple[Any, int]:
        """Run ``fill`` in a CQ-derived transaction; redo it on a transient failure.

        ``fill`` returns the window's events (and where the input stands), or
        None when the window is not complete yet: then the transaction aborts
        and the events wait in the redo queue.  Returns (what ``fill`` returned,
        attempts).
        """
        attempts = 0
        while True:
            attempts += 1
            txn = self.tm.begin(read_only=True)
            self._versions = {}
            try:
                out = fill(txn)
                if out is None:
                    txn.abort()
                else:
                    txn.commit()
                return out, attempts
            except TransientError:
                # validation failed (or a deadlock victim): abort and redo the window
                self.stats.redos += 1

    # -- time-based windows ---------------------------------------------------------------

    def _time(self, k: int) -> float:
        assert self.window is not None and self.window.time_column is not None
        return float(self._raw[k][self.window.time_column])

    def _run_naive_time(self) -> None:
        window = self.window
        assert window is not None
        events = self._raw
        while self._pos < len(events) and not self._stopped():
            ts = self._pos
            now = self._time(ts)
            if self._wstart is None:
                self._wstart = now
            while now >= self._wstart + window.r:  # this event closes the window
                end = self._wstart + window.r
                inside = [e for e in self._tsyn if self._time(e.ts) < end]
                self._window_result(inside, 1, lwm=ts)
                self._wstart += window.s
                start = self._wstart
                self._tsyn = [e for e in self._tsyn if self._time(e.ts) >= start]
            self._pos += 1
            e = self._pre(events[ts], ts, None)
            if e is not None:
                self._tsyn.append(e)

    def _run_transactional_time(self) -> None:
        window = self.window
        assert window is not None
        events = self._raw
        while not self._stopped():
            if self._wstart is None:
                if not events:
                    return
                self._wstart = self._time(0)
            end = self._wstart + window.r

            def fill(txn: Transaction, end: float = end) -> Any:
                acc = self._reuse_time(txn)
                i = self._pos
                while i < len(events):
                    if self._time(i) >= end:
                        return acc, i
                    e = self._pre(events[i], i, txn)
                    i += 1
                    if e is not None:
                        acc.append(e)
                return None  # wait for an event past the window's end

            done, attempts = self._transact(fill)
            if done is None:
                return
            acc, i = done
            self._window_result(acc, attempts, lwm=self._rpos)
            start = self._wstart + window.s
            self._carried = [e for e in acc if self._time(e.ts) >= start]
            j = self._rpos
            while j < i and self._time(j) < start:
                j += 1
            self._rpos, self._pos, self._wstart = j, i, start
            self._seen_versions = dict(self._versions)

    def _reuse_time(self, txn: Transaction) -> list[Event]:
        """The overlap with the previous window: reused, or its raw events re-input."""
        if self._rpos >= self._pos:
            return []
        for table, version in self._seen_versions.items():
            now = self._versions.get(table)
            if now is None:
                self.stats.reads += 1
                now = self._versions[table] = int(txn.read(table, VERSION_KEY, 0))
            if now != version:
                out = []
                for ts in range(self._rpos, self._pos):
                    self.stats.reevaluated += 1
                    again = self._pre(self._raw[ts], ts, txn)
                    if again is not None:
                        out.append(again)
                return out
        return list(self._carried)

    def _reuse(
        self, txn: Transaction, carried: list[Event], pos: int, r: int
    ) -> tuple[list[Event], int]:
        """The overlap for the next window: reused, or re-input from the redo queue.

        Reusing the synopsis is serializable only if the tables it read are
        still at the versions it read (every update transaction changes the
        version row): then its reads are exactly what this transaction would
        read.  Otherwise the synopsis is reset and the redo queue's raw events
        from the biggest LWM of the overlap up to ``pos`` are re-input
        (Section 4.3.2): all of them, since a changed row may change what the
        selection lets through.
        """
        if not carried:
            return [], pos
        seen = {table: version for e in carried for table, _, version in e.refs}
        for table, version in seen.items():
            now = self._versions.get(table)
            if now is None:
                self.stats.reads += 1
                now = self._versions[table] = int(txn.read(table, VERSION_KEY, 0))
            if now != version:
                out: list[Event] = []
                ts = carried[0].lwm
                while ts < pos and len(out) < r:
                    self.stats.reevaluated += 1
                    again = self._pre(self._raw[ts], ts, txn)
                    ts += 1
                    if again is not None:
                        out.append(again)
                return out, ts
        return list(carried), pos


def _stop(results: list[Result], max_results: int | None, until: float | None) -> bool:
    if max_results is not None and len(results) >= max_results:
        return True
    return until is not None and time.monotonic() >= until


class Updaters:
    """Other systems updating a referenced table through the transaction manager.

    ``threads`` threads together run ``rate`` update transactions per second
    (as fast as they can when the rate is above what they reach); each
    increments the table's version row and rewrites one random row with
    ``new_row(rng)``.
    """

    def __init__(
        self,
        tm: TransactionManager,
        table: str,
        keys: Sequence[Any],
        rate: float,
        new_row: Callable[[Any], Row],
        *,
        threads: int = 2,
        seed: int = 0,
    ) -> None:
        if rate <= 0:
            raise CQError(f"update rate must be > 0 transactions per second, got {rate}")
        self.tm = tm
        self.table = table
        self.keys = list(keys)
        self.rate = rate
        self.new_row = new_row
        self.threads = threads
        self.seed = seed
        self.committed = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._workers: list[threading.Thread] = []
        self._errors: list[BaseException] = []
        self.started = 0.0
        self.stopped = 0.0

    def _work(self, k: int) -> None:
        import random

        rng = random.Random(self.seed * 1000 + k)
        period = self.threads / self.rate
        # staggered start, so that a short run at a low rate does not count a burst
        due = time.monotonic() + rng.uniform(0, period)
        if self._stop.wait(due - time.monotonic()):
            return
        done = 0
        try:
            while not self._stop.is_set():
                key = rng.choice(self.keys)
                row = self.new_row(rng)

                def update(t: Transaction, key: Any = key, row: Row = row) -> None:
                    t.increment(self.table, VERSION_KEY, 1)
                    t.put(self.table, key, row)

                self.tm.run(update, retries=1000)
                done += 1
                due += period
                delay = due - time.monotonic()
                if delay > 0.002:
                    # Sleep only when well ahead: a sleeping thread gives up the
                    # GIL and may wait a whole switch interval (5 ms) to get it
                    # back, which would cap the rate far below what it can do.
                    self._stop.wait(delay)
                elif delay < -1.0:
                    due = time.monotonic()  # far behind: do not burst to catch up
        except BaseException as exc:  # surfaced by stop()
            self._errors.append(exc)
        finally:
            with self._lock:
                self.committed += done

    def start(self) -> Updaters:
        """Start the threads."""
        self.started = time.monotonic()
        for k in range(self.threads):
            t = threading.Thread(target=self._work, args=(k,), daemon=True)
            t.start()
            self._workers.append(t)
        return self

    def stop(self) -> float:
        """Stop the threads; the committed update transactions per second."""
        self._stop.set()
        for t in self._workers:
            t.join(timeout=30)
        self.stopped = time.monotonic()
        if self._errors:
            raise self._errors[0]
        return self.committed / max(1e-9, self.stopped - self.started)
