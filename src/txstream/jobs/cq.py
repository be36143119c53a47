"""Consistent continuous queries on Spark: the join and the window on executors.

Spark users' most common complaint about stream-static joins: a window that
spans micro-batches mixes the versions of a reference table that another
system updates in between.  :class:`SparkCQ` runs the query shape users write
(a stream, equi-joins with txstream tables, a selection, a count- or
time-based window aggregate) as a Structured Streaming query whose joins and windows run on the
executors (``txstream.spark.reference``), while txstream decides, per
micro-batch, which table version the executors see and whether the windows
they produce commit (Oyamada et al., SAC 2013):

* the windows a micro-batch completes form one **CQ-derived transaction**; its
  commit operator is the window: the transaction commits when they leave it;
* the strategy **pins** the rows that transaction reads and ships them to the
  executors as a broadcast relation: ``snapshot`` the tables as of the
  transaction's start, ``s2pl`` the tables under a shared lock per table
  held until the commit (writers of the table wait for it), ``optimistic``
  the current rows, each window validated at commit (one whose rows changed
  since the pin commits as a read of the pin's snapshot, which it is: no
  window is redone);
* the **redo queue** is the carry: the raw events of windows not complete yet;
  they are joined again, under the next transaction's pinned rows, with the
  next micro-batch, so a window never mixes versions;
* ``plain`` is Spark alone, the baseline: each micro-batch joined with the
  table as it is when the batch runs, carried events keep the rows they were
  joined with.

Each result says the instants at which all the row versions it read were the
committed ones (``Result.state``), judged per row when it leaves the commit
operator, so an inconsistent window is seen as such whatever the strategy:
the executors reduce each window's reads to the newest version read and the
last instant all were known current when pinned, and the driver cuts that at
the first commit since the pin of a key the window read (matched in Arrow).
With ``start(read_sets=True)`` each result also names those (table, key,
version) rows, which brings every read to the driver.  The tables live in a
transaction manager this process owns; updates come through it (other
threads, or the owner applying another input), and the driver keeps its copy
of each table current from the table's change watcher.  With ``output=``
every batch's results are written once, to ``<output>/batch-<id>.jsonl``;
then the carry, the window count (and a time window's ``t0``) are saved next
to Spark's checkpoint, so a restarted query goes on where it stopped and a
replayed batch id is skipped.
"""

from __future__ import annotations

import json
import operator
import os
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txstream.cq.base import CQError, Result
from txstream.cq.engine import STRATEGIES, make_manager
from txstream.errors import TransientError, TxStreamError
from txstream.jobs.cq_versions import _Versions
from txstream.spark.batches import MicroBatch, StreamHandle, foreach_batch
from txstream.spark.reference import (
    AGGREGATES,
    NEVER,
    CountWindow,
    Evaluated,
    Join,
    TimeWindow,
    check_plan,
    ddl_names,
    evaluate,
    key_values,
    numeric,
    orderable,
    touched,
)
from txstream.spark.runtime.state import usable_directory
from txstream.txn import Transaction, TransactionManager

EVENT_SCHEMA = "id LONG, part LONG, qty LONG"
"""The schema of the experiment's event files (CSV ``id,part,qty``)."""

ESCALATE_AFTER = 4
"""Attempts of one micro-batch that failed transiently before it runs on a snapshot.

A :class:`~txstream.errors.TransientError` (an ``s2pl`` deadlock victim, say)
aborts the attempt, which is then made again; after this many, the next
attempt pins the tables as of a snapshot
(:meth:`~txstream.txn.TransactionManager.begin_snapshot`), which later updates
neither change nor fail, so the batch commits (``stats.escalations`` counts
them) and the next batch uses its strategy again.  ``optimistic`` no longer
redoes a batch whose validation fails (see :meth:`_Runner._handle`)."""

MODES = ("plain", "s2pl", "snapshot", "optimistic")
"""``plain`` (Spark's stream-static join alone) and the transactional strategies."""


@dataclass
class CQStats:
    """What a run did: micro-batches handled, windows emitted, redos, consistent windows."""

    batches: int = 0
    windows: int = 0
    consistent: int = 0
    redos: int = 0
    escalations: int = 0  # attempts run on a snapshot after ESCALATE_AFTER transient failures
    # optimistic: windows that failed validation (read a row committed since the
    # pin) and committed as reads of the pin's snapshot instead of being redone
    stale: int = 0
    skipped: list[int] = field(default_factory=list)


class _Windows:
    """One attempt's committed windows by column; :class:`Result` objects made on demand.

    The driver's work per window stays a few list operations in C (the bench
    and a query with neither ``on_result`` nor a reader of ``results`` never
    make an object per window); :meth:`made` builds the results when asked.
    """

    __slots__ = ("attempts", "his", "los", "lwms", "numbers", "values", "versions")

    def __init__(
        self,
        numbers: list[int],
        values: list[Any],
        lwms: list[Any],
        los: list[int],
        his: list[int],
        attempts: int,
        versions: list[frozenset[Any]] | None,
    ) -> None:
        self.numbers, self.values, self.lwms = numbers, values, lwms
        self.los, self.his, self.attempts, self.versions = los, his, attempts, versions

    def __len__(self) -> int:
        return len(self.numbers)

    def consistent(self) -> int:
        """How many windows read one state of the tables (``lo <= hi``)."""
        return sum(map(operator.le, self.los, self.his))

    def made(self) -> list[Result]:
        """The windows as :class:`Result` objects."""
        none: frozenset[Any] = frozenset()
        vs = self.versions if self.versions is not None else [none] * len(self.numbers)
        a = self.attempts
        return [
            Result(value, n, lwm, v, a, (lo, hi), {"window": n, "value": value})
            for n, value, lwm, lo, hi, v in zip(
                self.numbers, self.values, self.lwms, self.los, self.his, vs, strict=True
            )
        ]


class SparkCQ:
    """A consistent continuous query on Spark, built like a PySpark query.

    ::

        query = (SparkCQ("mean_price", tm, strategy="snapshot")
                 .stream(events, order="id")
                 .join("parts", on="part", schema="price long")
                 .where("price <= 50")
                 .window("avg", "price", r=5, s=2)
                 .start(checkpoint="ckpt/cq"))

    ``.window("avg", "price", r=60, s=20, time="ts")`` makes the windows
    time-based (60 units of the stream's ``ts`` column, sliding by 20).

    ``tm`` owns the tables (``make_manager(strategy)`` gives one with the
    protocol the strategy needs); ``strategy`` is one of :data:`MODES`.

    The query is declared without Spark; ``.stream`` takes a streaming DataFrame,
    so the last steps need a live Spark session:

    >>> import txstream as tx
    >>> from txstream.cq import make_manager
    >>> tm = make_manager("s2pl")
    >>> tx.SparkCQ("mean_price", tm, strategy="s2pl").strategy
    's2pl'
    >>> tx.SparkCQ("mean_price", tm, strategy="snapshot")
    Traceback (most recent call last):
    txstream.cq.base.CQError: strategy 'snapshot' needs a transaction manager with protocol
    'snapshot', not 'ss2pl' (use txstream.cq.make_manager('snapshot'))
    >>> query = (tx.SparkCQ("mean_price", tm, strategy="s2pl")     # doctest: +SKIP
    ...          .stream(spark.readStream.csv("events/", schema="id long, part long"), order="id")
    ...          .join("parts", on="part", schema="price long")
    ...          .window("avg", "price", r=5, s=2)
    ...          .start(checkpoint="ckpt/cq"))
    """

    def __init__(self, name: str, tm: TransactionManager, strategy: str = "snapshot") -> None:
        if strategy not in MODES:
            raise CQError(f"unknown strategy {strategy!r}; choose one of {', '.join(MODES)}")
        if strategy != "plain":
            want = STRATEGIES[strategy].protocol
            if tm.protocol.name != want:
                raise CQError(
                    f"strategy {strategy!r} needs a transaction manager with protocol {want!r}, "
                    f"not {tm.protocol.name!r} (use txstream.cq.make_manager({strategy!r}))"
                )
        self.name = name
        self.tm = tm
        self.strategy = strategy
        self._stream: Any = None
        self._order = ""
        self._joins: list[Join] = []
        self._condition: str | None = None
        self._window: CountWindow | TimeWindow | None = None

    def stream(self, df: Any, order: str) -> SparkCQ:
        """The input: a streaming DataFrame and its arrival-order column (unique, increasing)."""
        if order not in df.columns:
            raise CQError(f"order column {order!r} is not in the stream ({', '.join(df.columns)})")
        kind = orderable(df, order)
        if kind is not None:  # e.g. strings: "10" would come before "9"
            raise CQError(
                f"order column {order!r} is {kind}, which does not sort in arrival order; "
                "give a number, a timestamp or a date (cast it in the stream's select)"
            )
        self._stream, self._order = df, order
        return self

    def join(self, table: str, on: str, schema: str) -> SparkCQ:
        """Equi-join with txstream table ``table``: ``on`` equals the row's key.

        ``on`` is a stream column or a column of an earlier join; ``schema``
        (DDL, e.g. ``"price long, cat long"``) names the row's columns the query uses.
        """
        if self._stream is None:
            raise CQError("call .stream(df, order=...) before .join(...)")
        known = self._columns()
        if on not in known:
            raise CQError(
                f"join key {on!r} of table {table!r} is not a column ({', '.join(known)})"
            )
        names = ddl_names(schema)
        clash = [n for n in names if n in known or n.startswith("__")]
        if clash:
            raise CQError(f"table {table!r}: column {clash[0]!r} is already a column of the query")
        if table not in self.tm.store.tables:
            raise CQError(f"unknown table {table!r}: create it in the transaction manager first")
        self._joins.append(Join(table, on, schema, names))
        return self

    def where(self, condition: str) -> SparkCQ:
        """The selection after the joins: a Spark SQL condition over the joined columns."""
        self._condition = condition
        return self

    def window(
        self,
        aggregate: str,
        column: str | None = None,
        *,
        r: float,
        s: float | None = None,
        time: str | None = None,
    ) -> SparkCQ:
        """The commit operator: ``aggregate`` of ``column`` over windows of range r, slide s.

        Count-based (r and s count selected events) by default; with ``time`` (a
        numeric stream column, non-decreasing in the order column) time-based:
        window k holds the events whose ``time`` lies in ``[t0 + k*s, t0 + k*s + r)``,
        ``t0`` being the first event's time, and every window is emitted, empty
        ones included (count 0, the other aggregates None).
        """
        if aggregate not in AGGREGATES:
            raise CQError(f"unknown aggregate {aggregate!r}; choose one of {', '.join(AGGREGATES)}")
        s = r if s is None else s
        if aggregate != "count" and column not in self._columns():
            raise CQError(
                f"window column {column!r} is not a column ({', '.join(self._columns())})"
            )
        if time is None:
            if not (isinstance(r, int) and isinstance(s, int) and 1 <= s <= r):
                raise CQError(
                    f"window needs whole numbers 1 <= slide <= range; got range {r}, slide {s}"
                )
            self._window = CountWindow(r, s, aggregate, column)
            return self
        stream = list(self._stream.columns) if self._stream is not None else []
        if time not in stream:
            raise CQError(
                f"window time column {time!r} is not a column of the stream ({', '.join(stream)})"
            )
        if not numeric(self._stream, time):
            kind = self._stream.schema[time].dataType.simpleString()
            raise CQError(f"window time column {time!r} is {kind}, not a number")
        if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in (r, s)) or not (
            0 < s <= r
        ):
            raise CQError(f"time window needs numbers 0 < slide <= range; got range {r}, slide {s}")
        self._window = TimeWindow(r, s, aggregate, column, time)
        return self

    def _check_rows(self) -> None:
        """Each joined table's rows have the columns its ``schema`` names (one pass at start).

        A column missing from the rows would join as null in every window, silently.
        """
        for join in self._joins:
            for key, row in self.tm.table(join.table).rows().items():
                if isinstance(row, dict):
                    missing = [n for n in join.names if n not in row]
                    if missing:
                        raise CQError(
                            f"table {join.table!r}: row {key!r} has no column {missing[0]!r} "
                            f"that the join's schema names (it has {', '.join(map(str, row))})"
                        )

    def _columns(self) -> list[str]:
        cols = list(self._stream.columns) if self._stream is not None else []
        for j in self._joins:
            cols += list(j.names)
        return cols

    def start(
        self,
        checkpoint: str | os.PathLike[str],
        *,
        output: str | os.PathLike[str] | None = None,
        on_result: Callable[[Result], None] | None = None,
        after_batch: Callable[[int], None] | None = None,
        available_now: bool = True,
        processing_time: str | None = None,
        read_sets: bool = False,
    ) -> CQQuery:
        """Start the query; results go to ``on_result``, the handle's ``results`` and ``output``.

        ``after_batch(batch_id)`` runs after each handled micro-batch (tests use it
        to update the tables deterministically between batches).  With
        ``read_sets`` each result's ``versions`` names every row version its
        window read, which brings every read to the driver; without it (the
        default) the executors send back a few numbers per window and
        ``versions`` is empty (``state`` and ``consistent`` are the same).
        """
        if self._stream is None or not self._joins or self._window is None:
            raise CQError("a query needs .stream(...), at least one .join(...) and .window(...)")
        if not self._stream.isStreaming:
            raise CQError(
                "SparkCQ reads a streaming DataFrame (spark.readStream...); for rows at hand "
                "run txstream.cq.CQEngine over them"
            )
        usable_directory(Path(checkpoint), "checkpoint")
        self._check_rows()
        column = self._window.column if self._window.aggregate != "count" else None
        problem = check_plan(self._stream, self._joins, self._condition, column)
        if problem is not None:  # else it failed in the first micro-batch, in Spark's words
            raise CQError(problem)
        out = None if output is None else Path(output)
        runner = _Runner(self, Path(checkpoint), out, on_result, after_batch, read_sets)
        handle = foreach_batch(
            self._stream,
            runner.handle,
            Path(checkpoint) / "spark",
            done=runner.done,
            available_now=available_now,
            processing_time=processing_time,
        )
        return CQQuery(handle, runner)


class CQQuery:
    """A started :class:`SparkCQ`: ``StreamingQuery``'s names, the results and the stats."""

    def __init__(self, handle: StreamHandle, runner: _Runner) -> None:
        self._handle = handle
        self._runner = runner

    @property
    def results(self) -> list[Result]:
        """The results this process emitted, in window order."""
        return self._runner.results

    @property
    def stats(self) -> CQStats:
        """Batches, windows, consistent windows, redos."""
        return self._runner.stats

    @property
    def failure(self) -> str | None:
        """Why the query failed, as one line, or None."""
        if self._runner.failure is not None:
            return str(self._runner.failure)
        return self._handle.failure()

    @property
    def lastProgress(self) -> dict[str, Any] | None:
        """Spark's progress of the last micro-batch."""
        return self._handle.lastProgress

    def processAllAvailable(self) -> None:
        """Block until everything available now is processed; raise what failed a batch."""
        try:
            self._handle.processAllAvailable()
        except Exception as exc:
            raise self._runner.failure or CQError(self._handle.failure() or str(exc)) from None

    def awaitTermination(self, timeout: float | None = None) -> bool | None:
        """Wait for the query to end."""
        return self._handle.awaitTermination(timeout)

    def stop(self) -> None:
        """Stop the query (a micro-batch being redone stops at its next attempt)."""
        self._runner.stopping = True
        try:
            self._handle.stop()
        finally:
            self._runner.close()


class _Runner:
    """The driver's per-batch work: pin, evaluate on executors, decide, save, deliver.

    Nothing here walks events, reads or table rows per batch: the pins are kept
    up to date from the tables' change watchers (:class:`_Versions`), the
    executors send back a few numbers per window (its value, LWM and the
    instants its reads span), and the changes committed while a batch ran are
    matched against the windows' keys in Arrow (:func:`touched`); ``s2pl``
    takes one shared lock per joined table.  The committed windows are kept
    by column (:class:`_Windows`); their :class:`Result` objects are made
    when ``results`` is read or ``on_result`` is set.  What stays per key: with a
    recorder, ``s2pl``'s reads (one per distinct key a batch joins on, each
    named in the history), and with ``read_sets`` every read.
    """

    def __init__(
        self,
        cq: SparkCQ,
        checkpoint: Path,
        output: Path | None,
        on_result: Callable[[Result], None] | None,
        after_batch: Callable[[int], None] | None = None,
        read_sets: bool = False,
    ) -> None:
        self.cq = cq
        self.after_batch = after_batch
        self.read_sets = read_sets
        self.tm = cq.tm
        assert cq._window is not None
        self.window = cq._window
        self.joins = cq._joins
        self.tables = [self.tm.table(j.table) for j in self.joins]
        self.state_dir = checkpoint / "txstream-cq"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.output = output
        if output is not None:
            output.mkdir(parents=True, exist_ok=True)
        self.on_result = on_result
        self._made: list[Result] = []  # the results made so far, in window order
        self._unmade: list[_Windows] = []  # the windows after them, not made yet
        self._making = threading.Lock()
        self.stats = CQStats()
        self.failure: TxStreamError | None = None
        self.stopping = False
        self.plain = cq.strategy == "plain"
        # plain and optimistic judge (validate) reads against commits made while a batch ran
        self.watch = cq.strategy in ("plain", "optimistic")
        self.versions: list[_Versions] = []  # made at the first batch (it may fail there)
        self.view = f"__txstream_cq_{uuid.uuid4().hex}"  # its temporary view, per batch
        self._pinned_at: list[int] = [0] * len(self.joins)  # this attempt's read instant per join
        self.t0: float | None = None  # time-based windows: the first event's time
        self.last_batch, self.next_window, self.carry = self._recover()

    @property
    def results(self) -> list[Result]:
        """The results emitted so far, in window order (made now for the windows not made yet)."""
        with self._making:
            unmade, self._unmade = self._unmade, []
            for chunk in unmade:
                self._made += chunk.made()
            return self._made

    def close(self) -> None:
        """Stop recording the tables' changes (the query has stopped)."""
        for v in self.versions:
            v.close()

    # -- durable progress -----------------------------------------------------------------

    def _recover(self) -> tuple[int, int, dict[str, list[Any]]]:
        """The last batch saved, the next window's number and the carry (after a restart)."""
        saved = sorted((int(p.stem.split("-")[1]), p) for p in self.state_dir.glob("state-*.json"))
        if not saved:
            return -1, 0, {}
        batch, path = saved[-1]
        try:
            state = json.loads(path.read_text())
            self.t0 = state.get("t0")
            return batch, int(state["next_window"]), dict(state["carry"])
        except (OSError, ValueError, KeyError) as exc:
            raise CQError(
                f"{path}: damaged query state ({exc}); restore it or start afresh"
            ) from None

    def _save(self, batch: int, carry: dict[str, list[Any]]) -> None:
        path = self.state_dir / f"state-{batch}.json"
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump({"next_window": self.next_window, "t0": self.t0, "carry": carry}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        for old in self.state_dir.glob("state-*.json"):
            if int(old.stem.split("-")[1]) < batch - 1:
                old.unlink(missing_ok=True)

    def done(self, batch: int) -> bool:
        """A batch id at or before the last saved one was handled (a replay)."""
        if batch <= self.last_batch:
            self.stats.skipped.append(batch)
            return True
        return False

    # -- one micro-batch ------------------------------------------------------------------

    def handle(self, b: MicroBatch) -> None:
        try:
            self._handle(b)
        except TxStreamError as exc:
            self.failure = exc
            raise

    def _handle(self, b: MicroBatch) -> None:
        order = self.cq._order
        events, carry = b.frame, self.carry
        if not self.versions:
            self.versions = [_Versions(self, i) for i in range(len(self.joins))]
        results: list[_Windows] = []  # the windows the batch committed
        attempts = 0
        while True:
            if self.stopping:  # stop() while a batch is retried: leave it to the restart
                raise CQError(f"stopped during batch {b.id}; a restart redoes it")
            attempts += 1
            escalated = attempts > ESCALATE_AFTER
            if escalated:
                # attempts keep failing transiently: this one reads a snapshot,
                # which no later update can fail
                txn: Transaction | None = self.tm.begin_snapshot()
                self.stats.escalations += 1
            else:
                txn = None if self.plain else self.tm.begin(read_only=True)
            try:
                pinned = self._pin(txn, events, carry)
                out = evaluate(
                    events,
                    carry,
                    pinned,
                    self.joins,
                    order,
                    self.cq._condition,
                    self.window,
                    rejoin=not self.plain,
                    first=self.next_window,
                    t0=self.t0,
                    read_sets=self.read_sets,
                    watch=self.watch,
                    view=self.view,
                )
                self.t0 = out.t0 if isinstance(self.window, TimeWindow) else None
                now, changed = self._drain()
                if self.plain:
                    self._refresh(out.carry, changed)
                # the windows that read a row changed since the pin: the earliest change
                fresh = txn is None or txn.snapshot_ts is None  # a snapshot's reads stay valid
                hit = self._touched(out, changed) if self.watch and fresh else {}
                got = self._results(out, txn, attempts, self.next_window, now, hit)
                if txn is not None:
                    if hit:
                        # Optimistic (Section 5), validated per window: a window whose
                        # rows are all still current at ``now`` commits as a read at
                        # ``now``; one that read a row committed since the pin commits
                        # as a read of the pin's snapshot.  Every read of the attempt
                        # was made at the pin, one instant under the commit mutex (the
                        # rows a snapshot begun then reads, Section 4.2), so such a
                        # window read one state, as its ``state`` says (``hi`` cut
                        # before the change, ``lo <= hi``).  Redoing it instead cost the
                        # rest of the batch: a changed row may move an event out of or
                        # into the selection, and with it the count-based position of
                        # every later window, so the redo re-evaluated all of them.
                        self.stats.stale += sum(1 for at in out.columns["at"] if at in hit)
                    txn.commit()
                results.append(got)
                break
            except TransientError:
                if txn is not None and txn.status == "active":
                    txn.abort()
                self.stats.redos += 1
        if self.plain:  # carried rows keep the instant their absent reads were made
            for i, at in enumerate(self._pinned_at):
                col = out.carry.get(f"__seen{i}", [])
                col[:] = [at if x is None else x for x in col]
        count = sum(len(chunk) for chunk in results)
        self.next_window += count
        # the output before the state: a crash between them redoes the batch, whose
        # file is then replaced; the other order would lose its results
        if self.output is not None:
            self._write(b.id, results)
        self._save(b.id, out.carry)
        self.carry = out.carry
        self.last_batch = b.id
        self.stats.batches += 1
        self.stats.windows += count
        self.stats.consistent += sum(chunk.consistent() for chunk in results)
        with self._making:
            self._unmade += results
        if self.on_result is not None and count:
            made = self.results
            for r in made[len(made) - count :]:
                self.on_result(r)
        if self.after_batch is not None:
            self.after_batch(b.id)

    def _drain(self) -> tuple[int, list[dict[Any, int]]]:
        """The clock and, per join, the keys committed since the last drain (first commit each)."""
        with self.tm.commit_mutex:
            return self.tm.clock, [v.drain() for v in self.versions]

    def _refresh(self, carry: dict[str, list[Any]], changed: list[dict[Any, int]]) -> None:
        """plain: carried joined rows learn when the versions they read stopped being current.

        A carried read still current at the previous drain, whose key changed
        since, was current until just before that change.
        """
        for i, (join, changes) in enumerate(zip(self.joins, changed, strict=True)):
            keys, until = carry.get(join.on), carry.get(f"__until{i}")
            if not changes or not keys or until is None:
                continue
            for n, key in enumerate(keys):
                if key in changes and (until[n] is None or until[n] >= NEVER):
                    until[n] = changes[key] - 1

    def _touched(self, out: Evaluated, changed: list[dict[Any, int]]) -> dict[int, int]:
        """Per grouped row of ``out``: the earliest commit since the pin of a row it read."""
        hit: dict[int, int] = {}
        if not out.keys:  # no event yet (time windows): no window
            return hit
        for keys, changes in zip(out.keys, changed, strict=True):
            for row, ts in touched(keys, changes).items():
                if ts < hit.get(row, NEVER):
                    hit[row] = ts
        return hit

    def _pin(self, txn: Transaction | None, events: Any, carry: dict[str, list[Any]]) -> list[Any]:
        """Each join's rows as the strategy lets this transaction see them, on executors."""
        if self.cq.strategy == "s2pl" and txn is not None and txn.snapshot_ts is None:
            return self._pin_locked(txn, events, carry)
        snap = txn.snapshot_ts if txn is not None else None
        with self.tm.commit_mutex:
            # snapshot (or optimistic escalated to one, see ESCALATE_AFTER): the tables as
            # of the snapshot; plain and optimistic: the rows current now
            at = self.tm.clock if snap is None else snap
            changed = [v.drain() for v in self.versions]
            for v in self.versions:
                v.update(at)
        if self.plain:
            self._refresh(carry, changed)
        self._pinned_at = [at] * len(self.joins)
        return [v.frame(at) for v in self.versions]

    def _pin_locked(self, txn: Transaction, events: Any, carry: dict[str, list[Any]]) -> list[Any]:
        """s2pl: read-lock what the batch reads, then ship the rows.

        Without a recorder, one shared lock per joined table
        (``LockManager.lock_table``): the batch reads most of a table's rows,
        and the driver's work is then per batch, not per key (writers of the
        table wait for the batch's commit, as a writer of a row it read did).
        With a recorder, a read lock per key the batch joins on, each read
        named in the history (:meth:`_pin_keys`).  The rows shipped are the
        whole pinned table either way.
        """
        if self.tm.recorder is not None:
            return self._pin_keys(txn, events, carry)
        lock = self.tm.protocol.lock_table  # type: ignore[attr-defined]
        for tbl in self.tables:
            lock(txn, tbl.name)
        with self.tm.commit_mutex:
            # the locks keep what is read current: the clock at or after the last of them
            at = self.tm.clock
            for v in self.versions:
                v.drain()
                v.update(at)
        self._pinned_at = [at] * len(self.joins)
        return [v.frame(at) for v in self.versions]

    def _pin_keys(self, txn: Transaction, events: Any, carry: dict[str, list[Any]]) -> list[Any]:
        """s2pl with a recorder: read-lock (and read) the rows of every key the batch joins on.

        A recorded history names every read, so each key the batch joins on
        is read in ``txn``, under its read lock.
        """
        import pyarrow as pa
        import pyarrow.compute as pc

        stream_cols = set(events.columns)
        wanted = key_values(events, sorted({j.on for j in self.joins if j.on in stream_cols}))
        columns_of: dict[str, list[Any]] = {c: v + carry.get(c, []) for c, v in wanted.items()}
        frames = []
        for i, (join, tbl, v) in enumerate(
            zip(self.joins, self.tables, self.versions, strict=True)
        ):
            keys = list(dict.fromkeys(k for k in columns_of.get(join.on, []) if k is not None))
            # the read locks, held until the commit (the rows themselves come from the pin)
            for key in keys:
                txn.read(tbl, key)
            with self.tm.commit_mutex:
                at = self.tm.clock
                v.drain()
                v.update(at)
            if len(self.joins) > i + 1 and join.names:  # a later join's keys: these rows' columns
                rel = v.rel
                kind = rel.schema.field("__k").type
                try:
                    mine = rel.filter(pc.is_in(rel.column("__k"), pa.array(keys, type=kind)))
                except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                    mine = rel.slice(0, 0)  # keys of another type than the table's: none match
                for n in join.names:
                    columns_of[n] = mine.column(n).to_pylist()
            self._pinned_at[i] = at  # the locks keep what was read current
            frames.append(v.frame(at))
        return frames

    # -- results --------------------------------------------------------------------------

    def _results(
        self,
        out: Evaluated,
        txn: Transaction | None,
        attempts: int,
        first: int,
        now: int,
        hit: dict[int, int],
    ) -> _Windows:
        """The complete windows, each with the instants its reads were all current.

        ``lo`` and ``hi`` come from the executors (the newest version a window
        read; the last instant all its reads were known current when pinned);
        ``hit`` cuts ``hi`` at the first commit since the pin of a row it read.
        By column, in list operations: no object per window (see :class:`_Windows`).
        """
        snap = txn.snapshot_ts if txn is not None else None
        cols = out.columns
        if not cols:  # no event yet (time windows)
            return _Windows([], [], [], [], [], attempts, None)
        if snap is not None:
            his = [snap] * len(out)
        else:
            his = [hi if hi <= now else now for hi in cols["hi"]]
            if hit:  # the few windows that read a row committed since the pin
                for n, at in enumerate(cols["at"]):
                    if at in hit and hit[at] <= his[n]:
                        his[n] = hit[at] - 1
        numbers = [first + number for number in cols["window"]]
        versions = [self._read_versions(rs) for rs in cols["reads"]] if self.read_sets else None
        return _Windows(numbers, cols["value"], cols["lwm"], cols["lo"], his, attempts, versions)

    def _read_versions(self, reads: list[Any]) -> frozenset[tuple[str, Any, int]]:
        """``read_sets``: every (table, key, version) the window read (an absent key: 0)."""
        return frozenset(
            (join.table, key, version)
            for join, rs in zip(self.joins, reads, strict=True)
            for key, version, _seen in rs
        )

    def _write(self, batch: int, results: Iterable[_Windows]) -> None:
        assert self.output is not None
        path = self.output / f"batch-{batch}.jsonl"
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            for chunk in results:
                for n, value, lwm, lo, hi in zip(
                    chunk.numbers, chunk.values, chunk.lwms, chunk.los, chunk.his, strict=True
                ):
                    row = {"window": n, "value": value, "lwm": lwm, "consistent": lo <= hi}
                    f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


def read_results(output: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every result a query wrote to ``output``, in window order (each exactly once)."""
    rows = []
    for path in sorted(Path(output).glob("batch-*.jsonl"), key=lambda p: int(p.stem.split("-")[1])):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line]
    return sorted(rows, key=lambda r: int(r["window"]))


__all__ = ["EVENT_SCHEMA", "MODES", "CQQuery", "CQStats", "SparkCQ", "make_manager", "read_results"]
