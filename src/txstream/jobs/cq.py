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
  transaction's start, ``s2pl`` the rows of the keys the batch joins on, under
  read locks held until the commit, ``optimistic`` the current rows, validated
  at commit (a failed validation aborts and redoes the batch's windows);
* the **redo queue** is the carry: the raw events of windows not complete yet;
  they are joined again, under the next transaction's pinned rows, with the
  next micro-batch, so a window never mixes versions;
* ``plain`` is Spark alone, the baseline: each micro-batch joined with the
  table as it is when the batch runs, carried events keep the rows they were
  joined with.

Each result says which (table, key, version) rows it read and the instants at
which all of them were the committed versions (``Result.state``), judged per
row when it leaves the commit operator, so an inconsistent window is seen as
such whatever the strategy.  The tables live in a transaction manager this
process owns; updates come through it (other threads, or the owner applying
another input).  The carry, the window count (and a time window's ``t0``) are saved next to Spark's
checkpoint after every batch, so a restarted query goes on where it stopped and
a replayed batch id is skipped; with ``output=`` every batch's results are
also written once, to ``<output>/batch-<id>.jsonl``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txstream.cq.base import CQError, Result
from txstream.cq.engine import STRATEGIES, make_manager
from txstream.errors import TransientError, TxStreamError
from txstream.spark.batches import MicroBatch, StreamHandle, foreach_batch
from txstream.spark.reference import (
    AGGREGATES,
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
    pin,
)
from txstream.spark.runtime.state import usable_directory
from txstream.spark.sql import literal, where
from txstream.storage.base import StorageError
from txstream.txn import Transaction, TransactionManager

EVENT_SCHEMA = "id LONG, part LONG, qty LONG"
"""The schema of the experiment's event files (CSV ``id,part,qty``)."""

ESCALATE_AFTER = 4
"""``optimistic``: redos of one micro-batch before it runs on a snapshot.

Every redo counts, including one after an attempt that committed some windows:
under an updater that invalidates a few windows of every attempt, a batch of
thousands of windows would otherwise be redone once per window.

Its next attempt pins the tables as of a snapshot
(:meth:`~txstream.txn.TransactionManager.begin_snapshot`), which later updates
neither change nor fail: every window of the batch then commits, and the next
batch is optimistic again (``stats.escalations`` counts them)."""

MODES = ("plain", "s2pl", "snapshot", "optimistic")
"""``plain`` (Spark's stream-static join alone) and the transactional strategies."""


@dataclass
class CQStats:
    """What a run did: micro-batches handled, windows emitted, redos, consistent windows."""

    batches: int = 0
    windows: int = 0
    consistent: int = 0
    redos: int = 0
    escalations: int = 0  # optimistic: batches run on a snapshot after ESCALATE_AFTER redos
    skipped: list[int] = field(default_factory=list)


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
    ) -> CQQuery:
        """Start the query; results go to ``on_result``, the handle's ``results`` and ``output``.

        ``after_batch(batch_id)`` runs after each handled micro-batch (tests use it
        to update the tables deterministically between batches).
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
        runner = _Runner(self, Path(checkpoint), out, on_result, after_batch)
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
        self._handle.stop()


class _Runner:
    """The driver's per-batch work: pin, evaluate on executors, decide, save, deliver."""

    def __init__(
        self,
        cq: SparkCQ,
        checkpoint: Path,
        output: Path | None,
        on_result: Callable[[Result], None] | None,
        after_batch: Callable[[int], None] | None = None,
    ) -> None:
        self.cq = cq
        self.after_batch = after_batch
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
        self.results: list[Result] = []
        self.stats = CQStats()
        self.failure: TxStreamError | None = None
        self.stopping = False
        self.plain = cq.strategy == "plain"
        self._cache: list[tuple[int, Any] | None] = [None] * len(self.joins)
        self._pinned_at: list[int] = [0] * len(self.joins)  # this attempt's read instant per join
        self.t0: float | None = None  # time-based windows: the first event's time
        self.last_batch, self.next_window, self.carry = self._recover()

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
        results: list[Result] = []
        attempts = 0
        while True:
            if self.stopping:  # stop() while a batch is redone: leave it to the restart
                raise CQError(f"stopped during batch {b.id}; a restart redoes it")
            attempts += 1
            escalated = attempts > ESCALATE_AFTER
            if escalated:
                # no progress under validation: this attempt reads a snapshot, which
                # always commits (updates come faster than a micro-batch runs)
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
                    first=self.next_window + len(results),
                    t0=self.t0,
                )
                self.t0 = out.t0 if isinstance(self.window, TimeWindow) else None
                got = self._results(out, txn, attempts, self.next_window + len(results))
                if txn is None:
                    results += got
                    break
                if self.cq.strategy != "optimistic" or escalated:
                    txn.commit()
                    results += got
                    break
                # Optimistic (Section 5): each window is validated; the windows before
                # the first whose reads changed since the pin commit, that one and
                # those after it are redone from its LWM under newer rows.
                valid = self._valid_prefix(out)
                self._read_set(txn, out.windows[:valid])
                txn.commit()  # the protocol validates them again (TransientError: redo all)
                results += got[:valid]
                if valid == len(out.windows):
                    break
                low = out.windows[valid]["lwm"]
                events = where(events, f"`{order}` >= {literal(low)}")
                keep = [i for i, v in enumerate(carry.get(order, [])) if v >= low]
                carry = {c: [vals[i] for i in keep] for c, vals in carry.items()}
                self.stats.redos += 1
            except TransientError:
                if txn is not None and txn.status == "active":
                    txn.abort()
                self.stats.redos += 1
        if self.plain:  # carried rows keep the instant their absent reads were made
            for i, at in enumerate(self._pinned_at):
                col = out.carry.get(f"__seen{i}", [])
                col[:] = [at if x is None else x for x in col]
        self.next_window += len(results)
        self._save(b.id, out.carry)
        self.carry = out.carry
        self.last_batch = b.id
        if self.output is not None:
            self._write(b.id, results)
        self.stats.batches += 1
        self.stats.windows += len(results)
        self.stats.consistent += sum(1 for r in results if r.consistent)
        self.results.extend(results)
        if self.on_result is not None:
            for r in results:
                self.on_result(r)
        if self.after_batch is not None:
            self.after_batch(b.id)

    def _pin(self, txn: Transaction | None, events: Any, carry: dict[str, list[Any]]) -> list[Any]:
        """Each join's rows as the strategy lets this transaction see them, on executors."""
        mode = self.cq.strategy
        if mode == "s2pl":
            assert txn is not None
            return self._pin_locked(txn, events, carry)
        pinned = []
        for i, (join, tbl) in enumerate(zip(self.joins, self.tables, strict=True)):
            if mode == "snapshot" or (txn is not None and txn.snapshot_ts is not None):
                # (optimistic escalated to a snapshot, see ESCALATE_AFTER)
                assert txn is not None and txn.snapshot_ts is not None
                at: int | None = txn.snapshot_ts
                seen = txn.snapshot_ts
            else:
                at, seen = None, self.tm.clock  # plain and optimistic read the current rows
            self._pinned_at[i] = seen
            cached = self._cache[i]
            if cached is not None and cached[0] == seen:  # nothing committed since
                pinned.append(cached[1])
                continue
            cols = _pin_columns(join)
            for key, version, row in tbl.committed(at):
                _add_row(cols, join, key, version, max(seen, version), row)
            df = pin(events, self.joins, i, cols)
            self._cache[i] = (seen, df)
            pinned.append(df)
        return pinned

    def _pin_locked(self, txn: Transaction, events: Any, carry: dict[str, list[Any]]) -> list[Any]:
        """s2pl: read-lock the rows of every key the batch joins on, then ship them."""
        stream_cols = set(events.columns)
        wanted = key_values(events, sorted({j.on for j in self.joins if j.on in stream_cols}))
        pinned = []
        columns_of: dict[str, list[Any]] = {c: v + carry.get(c, []) for c, v in wanted.items()}
        for i, (join, tbl) in enumerate(zip(self.joins, self.tables, strict=True)):
            cols = _pin_columns(join)
            for key in dict.fromkeys(k for k in columns_of.get(join.on, []) if k is not None):
                row = txn.read(tbl, key)  # the read lock, held until the commit
                _add_row(cols, join, key, tbl.latest(key)[0], self.tm.clock, row)
            for n in join.names:
                columns_of[n] = cols[n]
            self._pinned_at[i] = self.tm.clock  # the locks keep what was read current
            pinned.append(pin(events, self.joins, i, cols))
        return pinned

    def _valid_prefix(self, out: Evaluated) -> int:
        """Optimistic: how many windows, from the first, read only rows still current."""
        for n, w in enumerate(out.windows):
            for i, (tbl, rs) in enumerate(zip(self.tables, w["reads"], strict=True)):
                for key, version, seen in rs:
                    if seen is None:  # absent when pinned: still the same version?
                        version = tbl.version_at(key, self._pinned_at[i])
                    if tbl.latest(key)[0] != version:
                        return n
        return len(out.windows)

    def _read_set(self, txn: Transaction, windows: list[dict[str, Any]]) -> None:
        """Optimistic: the windows' reads join the transaction's read set, validated at commit."""
        reads = txn.reads
        for w in windows:
            for i, (tbl, rs) in enumerate(zip(self.tables, w["reads"], strict=True)):
                for key, _version, seen in rs:
                    if seen is None:
                        seen = self._pinned_at[i]
                    item = tbl.item(key)
                    if item not in reads or reads[item] > seen:
                        reads[item] = seen

    # -- results --------------------------------------------------------------------------

    def _results(
        self, out: Evaluated, txn: Transaction | None, attempts: int, first: int
    ) -> list[Result]:
        """The complete windows as results, each with the instants its reads were all current."""
        snap = txn.snapshot_ts if txn is not None else None
        now = self.tm.clock
        names = [j.table for j in self.joins]
        results = []
        for w in out.windows:
            lo, hi = 0, now
            versions = set()
            for j, (name, tbl, rs) in enumerate(zip(names, self.tables, w["reads"], strict=True)):
                for key, version, seen in rs:
                    if seen is None:  # an absent row, read when the join was pinned
                        seen = self._pinned_at[j]
                        version = tbl.version_at(key, seen)  # its deletion, if any
                    versions.add((name, key, version))
                    if version > lo:
                        lo = version
                    if snap is None:
                        hi = min(hi, _valid_until(tbl, key, version, seen))
            if snap is not None:
                hi = snap
            n = first + w["window"]
            value = w["value"]
            results.append(
                Result(
                    value,
                    n,
                    w["lwm"],
                    frozenset(versions),
                    attempts,
                    (lo, hi),
                    {"window": n, "value": value},
                )
            )
        return results

    def _write(self, batch: int, results: Iterable[Result]) -> None:
        assert self.output is not None
        path = self.output / f"batch-{batch}.jsonl"
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            for r in results:
                f.write(
                    json.dumps(
                        {
                            "window": r.window,
                            "value": r.value,
                            "lwm": r.lwm,
                            "consistent": r.consistent,
                        }
                    )
                    + "\n"
                )
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


def _pin_columns(join: Join) -> dict[str, list[Any]]:
    """Empty columns of a join's pinned rows (see :func:`txstream.spark.reference.pin`)."""
    return {"__k": [], "__v": [], "__seen": [], **{n: [] for n in join.names}}


def _add_row(
    cols: dict[str, list[Any]], join: Join, key: Any, version: int, seen: int, row: Any
) -> None:
    """Add one row read for the pin.

    A value that is not a row of columns (a counter row, or None for an absent
    key) joins nothing and is left out.
    """
    if not isinstance(row, dict):
        return
    cols["__k"].append(key)
    cols["__v"].append(version)
    cols["__seen"].append(seen)
    for n in join.names:
        cols[n].append(row.get(n))


def _valid_until(tbl: Any, key: Any, version: int, seen: int) -> int:
    """The last instant at which the row version read was current (a large number if it is)."""
    current = 1 << 62
    try:
        # version 0: no row was read; it stays absent until the first version after
        nxt = tbl.changed_after(key, seen) if version == 0 else tbl.superseded_at(key, version)
    except StorageError:  # the version is no longer kept: current at least when it was read
        return seen if tbl.latest(key)[0] != version else current
    return current if nxt is None else nxt - 1


def read_results(output: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every result a query wrote to ``output``, in window order (each exactly once)."""
    rows = []
    for path in sorted(Path(output).glob("batch-*.jsonl"), key=lambda p: int(p.stem.split("-")[1])):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line]
    return sorted(rows, key=lambda r: int(r["window"]))


__all__ = ["EVENT_SCHEMA", "MODES", "CQQuery", "CQStats", "SparkCQ", "make_manager", "read_results"]
