"""Run a job in this process, without Spark: the same executor, store and driver loop.

:class:`LocalRunner` is the runtime's reference: tests compare it with Spark
runs and with brute-force oracles, and users can try a job on a list of events
before they start a cluster.  Partitions run one after the other here.
"""

from __future__ import annotations

import json
import math
import shutil
import threading
import uuid
import warnings
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from txstream.spark.runtime.base import (
    InputSpec,
    JobSpec,
    Row,
    RuntimeJobError,
    bad_event,
    check_partitions,
    initial_row,
    null_field,
)
from txstream.spark.runtime.boundaries import MID_BITS, Event, position
from txstream.spark.runtime.forward import (
    ExchangeError,
    SocketTransport,
    forwarding,
    new_exchange,
)
from txstream.spark.runtime.merge import advance, ended
from txstream.spark.runtime.partitioning import partition_of
from txstream.spark.runtime.restart import first_meta, job_shape, restarted_meta
from txstream.spark.runtime.state import RuntimeStore, usable_directory
from txstream.spark.runtime.tasks import (
    BatchContext,
    Phases,
    committed_frontier,
    committed_tokens,
    own_rows,
    phase1,
    phase1_forward,
    phase2,
    phase3,
    run_batch,
)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_DAY = _EPOCH.date().toordinal()


def order_number(value: Any) -> float:
    """The order value of a row's order column value, as Spark computes it (a double).

    A number is itself (a finite one; a ``Decimal`` the nearest float); a
    ``datetime`` (a pandas ``Timestamp`` too) is its epoch seconds to the
    microsecond, as Spark casts a timestamp to a double, a naive one read as
    UTC (the session time zone of ``local_session``, in which Spark reads
    times without a zone); a ``date`` is the epoch seconds of its midnight
    UTC, as ``unix_date(day) * 86400`` on Spark (see
    :func:`txstream.spark.runtime.inputs.order_value`).  Raises
    :class:`ValueError` saying what else to give.
    """
    if isinstance(value, datetime):  # before date: a datetime is a date too
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        # Whole microseconds, as Spark keeps them (a pandas Timestamp's nanoseconds go).
        delta: timedelta = value - _EPOCH
        micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
        return micros / 1e6  # Spark: the microseconds as a double over 1e6
    if isinstance(value, date):
        return (value.toordinal() - _EPOCH_DAY) * 86400.0
    if isinstance(value, int | float | Decimal) and not isinstance(value, bool):
        # (a Decimal as Spark casts a DecimalType to double: the nearest double)
        if value.is_finite() if isinstance(value, Decimal) else math.isfinite(value):
            return float(value)
        raise ValueError(f"must be a finite number, got {value!r}")
    kind = type(value).__name__
    hint = "convert it first"
    if isinstance(value, str):  # the hint of job.start for a string column, in Python
        hint += (
            ", e.g. datetime.fromisoformat(text) for ISO-8601 times, or float(text) for "
            "numbers written as text"
        )
    raise ValueError(
        f"is a {kind} ({value!r:.60}); an order column is a number, a timestamp or a date: {hint}"
    )


def event_copies(
    job: JobSpec, partitions: int, input_name: str, row: Row, mid: int
) -> list[tuple[int, Event]]:
    """The copies of one event: one per partition of its keys (the first is the owner).

    An input without keys is delivered to every partition (a CTI/punctuation).
    """
    spec = job.inputs[input_name]
    order = (_order_of(spec, input_name, row, mid), spec.index, mid)
    try:
        values = spec.values_of(row)
        pids = [partition_of(v, partitions) for v in values]
    except KeyError as exc:
        where = position(input_name, mid)
        raise RuntimeJobError(f"{where}: the row has no key column {exc}") from None
    except RuntimeJobError as exc:
        raise RuntimeJobError(f"{position(input_name, mid)}: {exc}") from None
    if not values:  # a keyless input's event, or a broadcast one
        return [(p, Event(order, input_name, row, [], [p])) for p in range(partitions)]
    copies = []
    for pid in dict.fromkeys(pids):
        copies.append((pid, Event(order, input_name, row, values, pids, copy=pid == pids[0])))
    return copies


def _order_of(spec: InputSpec, input_name: str, row: Row, mid: int) -> float:
    """The order value of ``row`` (0 without an order column); one line naming the row if bad."""
    if spec.order is None:
        return 0.0
    where = position(input_name, mid)
    if spec.order not in row:
        raise RuntimeJobError(f"{where}: the row has no order column {spec.order!r}")
    try:
        return order_number(row[spec.order])
    except ValueError as exc:
        raise RuntimeJobError(f"{where}: order column {spec.order!r} {exc}") from None


class SourceOrderWarning(UserWarning):
    """A ``run_local`` batch lists events in an order other than the one they run in.

    Events of an input without an ``order`` column have no place in time: within
    a micro-batch they run in the inputs' declaration order (as on Spark, where a
    micro-batch's inputs have no common order), not in the order the list gives.
    Declare ``order=...`` on the inputs to interleave them.

    >>> import warnings, txstream as tx
    >>> job = (tx.Job("shop").input("orders", None, keys="k").input("restocks", None, keys="k")
    ...        .output("log").on("orders", lambda t, e: t.emit("log", {"id": e["id"]}))
    ...        .on("restocks", lambda t, e: t.emit("log", {"id": e["id"]})))
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     _ = job.run_local([[("restocks", {"k": 1, "id": 1}), ("orders", {"k": 1, "id": 2})]],
    ...                       "ckpt/source-order")
    >>> print(caught[0].message)
    batch 0: orders#1 runs before restocks#0, listed before it: without an order column a
    micro-batch runs its inputs in declaration order (orders, restocks), not in list order;
    declare order=... on the inputs to interleave them
    >>> [r["id"] for r in tx.read_output("ckpt/source-order", "log")]
    [2, 1]
    """


def _missing_time(spec: InputSpec, row: Row) -> str | None:
    """``order value`` when ``row``'s order column holds pandas' missing time, NaT.

    Spark reads NaT as null; only rows handed to ``run_local`` can hold one.  NaT
    is a ``datetime`` that is not equal to itself.
    """
    value = row.get(spec.order) if spec.order is not None else None
    return "order value" if isinstance(value, datetime) and value != value else None


def _non_finite(spec: InputSpec, row: Row) -> Any:
    """``row``'s order value when it is a number but not finite (NaN, an infinity); else None."""
    value = row.get(spec.order) if spec.order is not None else None
    if isinstance(value, Decimal):
        return None if value.is_finite() else value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return None if math.isfinite(value) else value
    return None


class LocalRunner:
    """Runs ``job`` on lists of events with ``partitions`` partitions, batch by batch.

    ``Job.run_local`` makes one and returns it, for its ``stats`` (one dict per
    committed batch) and for more batches (:meth:`run_batch`).  Here the
    event-time merge holds an event that an input's later events may still
    precede, until the inputs end:

    >>> import txstream as tx
    >>> def note(t, e):
    ...     t.emit("seen", {"ts": e["ts"]})
    >>> job = (tx.Job().input("a", None, keys="k", order="ts")
    ...        .input("b", None, keys="k", order="ts")
    ...        .output("seen").on("a", note).on("b", note))
    >>> runner = job.run_local([[("a", {"k": 1, "ts": 1}), ("a", {"k": 1, "ts": 5}),
    ...                          ("b", {"k": 1, "ts": 3})]], "ckpt/runner", end_inputs=False)
    >>> runner.stats[-1]["committed"], runner.held(), tx.read_output("ckpt/runner", "seen")
    (2, 1, [{'ts': 1}, {'ts': 3}])
    >>> runner.end_inputs()["committed"], runner.held()
    (1, 0)
    >>> tx.read_output("ckpt/runner", "seen")
    [{'ts': 1}, {'ts': 3}, {'ts': 5}]
    """

    def __init__(
        self,
        job: JobSpec,
        store: str | Path,
        partitions: int = 2,
        snapshot_every: int = 10,
        merge: str = "batch",
        tasks: int = 1,
        watermarks: dict[str, float] | None = None,
    ) -> None:
        """Open (or create) the store for ``job``.

        ``merge`` is recorded with the store (a restart may not leave
        ``event-time`` while events are held); :meth:`Job.run_local` sets
        ``idle_batches`` for it.  ``tasks`` > 1 runs phase 1 in that many
        threads, each hosting some partitions and forwarding rows to the others
        over local sockets, as Spark's phase-1 tasks do (see :mod:`.forward`).
        ``watermarks``: the inputs' watermark delays (see :func:`.merge.advance`).
        """
        job.validate()
        self.watermarks = dict(watermarks or {})
        self.job = job
        self.partitions = check_partitions(partitions, "run_local partitions")
        self.tasks = check_partitions(tasks, "run_local tasks")
        self.store = RuntimeStore(usable_directory(Path(store), "store"))
        shape = job_shape(job, merge, watermarks=self.watermarks)
        lock = _local_store(self.store, job, self.partitions, shape)
        try:
            self.store.check_state()  # a restart never runs on a broken chain
        except BaseException:
            lock.release()
            raise
        self.snapshot_every = snapshot_every
        committed = self.store.committed()
        self.batch = committed[-1] + 1 if committed else 0
        self.prev = committed[-1] if committed else -1
        self.stats: list[dict[str, Any]] = []
        self.arrival: Callable[[Row], float | None] | None = None
        self.idle_batches: int | None = None
        """Event-time merge (see :mod:`.merge`) when set; batch order otherwise."""
        self._ending = False
        self.frontier = committed_frontier(self.store)
        self.tokens = committed_tokens(self.store)
        try:
            if not committed:
                self._load_initial()
        finally:
            lock.release()

    def _load_initial(self) -> None:
        """Place the tables' initial rows (lists of dicts) in their partitions."""
        for table in self.job.tables.values():
            if table.initial is None:
                continue
            if not isinstance(table.initial, list):
                raise RuntimeJobError(
                    f"table {table.name!r}: run_local takes initial rows as a list of dicts"
                )
            by_pid: dict[int, dict[Any, dict[Any, Any]]] = {}
            for index, row in enumerate(table.initial):
                key = table.key_of(initial_row(table, row, index))
                try:
                    value = table.value_of_key(key)
                    pid = partition_of(value, self.partitions)
                except RuntimeJobError as exc:
                    raise RuntimeJobError(
                        f"table {table.name!r}: initial row {index}: {exc}"
                    ) from None
                rows = by_pid.setdefault(pid, {}).setdefault(value, {})
                if key in rows:
                    raise RuntimeJobError(
                        f"table {table.name!r}: initial row {index} repeats the key {key!r}"
                    )
                rows[key] = dict(row)
            for pid, values in by_pid.items():
                self.store.write_init(pid, table.name, values)

    def run_batch(self, events: Iterable[tuple[str, Row]]) -> dict[str, Any]:
        """Run one micro-batch of ``(input name, row)`` pairs, in the job's order.

        That is the ``order`` columns' (ties: the inputs' declaration order, then
        list order); an input without one runs at order value 0, in list order
        within the input (:class:`SourceOrderWarning` when the list says otherwise).

        It holds the store's owner lock while it runs (a job running on the same
        store makes it fail with :class:`~txstream.spark.runtime.errors.StoreLockedError`).
        """
        lock = self.store.lock()
        try:
            committed = self.store.committed()
            if (committed[-1] if committed else -1) != self.prev:
                raise RuntimeJobError(
                    f"{self.store.root}: another job committed batches since this runner "
                    "started; run_local needs a store of its own"
                )
            return self._run_batch(events)
        finally:
            lock.release()

    def held(self) -> int:
        """The events the event-time merge holds after the last committed batch."""
        committed = self.store.committed()
        return int(self.store.commit_info(committed[-1]).get("held", 0)) if committed else 0

    def end_inputs(self) -> dict[str, Any]:
        """End every input: one more committed batch, without events, that releases all held.

        Under the event-time merge the last events wait for later ones; a bounded
        run has none to come.  The batch is committed as any other (its own
        number, state and outputs), so a crash before its commit leaves the
        events held, and calling this again runs it.
        """
        self._ending = True
        try:
            return self.run_batch([])
        finally:
            self._ending = False

    def _run_batch(self, events: Iterable[tuple[str, Row]]) -> dict[str, Any]:
        per_partition: dict[int, list[Event]] = {p: [] for p in range(self.partitions)}
        seen: dict[str, float] = {}
        bad: list[dict[str, Any]] = []
        # The latest run place ((order value, input index), input, mid) listed so far, of
        # any event and of an unordered one; the first event listed after one it runs before.
        last: tuple[tuple[float, int], str, int] | None = None
        last_unordered: tuple[tuple[float, int], str, int] | None = None
        misplaced: tuple[str, str] | None = None
        if isinstance(events, tuple | dict | str):
            raise RuntimeJobError(
                f"batch {self.batch}: a micro-batch is a list of (input, row) pairs, not a "
                f"{type(events).__name__} (run_local takes a list of such lists)"
            )
        for index, item in enumerate(events):
            mid = (self.batch << MID_BITS) + index
            if not isinstance(item, tuple | list) or len(item) != 2:
                raise RuntimeJobError(
                    f"batch {self.batch}, item {index}: not an (input, row) pair: {item!r}"
                )
            name, row = item
            if not isinstance(name, str) or name not in self.job.inputs:
                raise RuntimeJobError(
                    f"unknown input {name!r}; inputs: {', '.join(self.job.inputs)}"
                )
            if not isinstance(row, dict):
                raise RuntimeJobError(
                    f"{position(name, mid)}: a row is a dict of columns, not "
                    f"{type(row).__name__}: {row!r}"
                )
            spec = self.job.inputs[name]
            what = null_field(spec, row) or _missing_time(spec, row)
            if what is not None:  # as on Spark: reported, not run
                known = what != "order value"  # a null order value counts as 0, as on Spark
                order = [_order_of(spec, name, row, mid) if known else 0.0, spec.index, mid]
                bad.append(bad_event(self.batch, position(name, mid), mid, order, what))
                continue
            odd = _non_finite(spec, row)
            if odd is not None:  # NaN, an infinity: no place in the order (as on Spark)
                order = [0.0, spec.index, mid]  # (counts as 0 in the report, as a null)
                where = position(name, mid)
                bad.append(bad_event(self.batch, where, mid, order, "order value", odd))
                continue
            copies = event_copies(self.job, self.partitions, name, row, mid)
            for pid, event in copies:
                per_partition[pid].append(event)
            value = copies[0][1].order[0]  # (every copy has the event's order)
            seen[name] = max(seen.get(name, -math.inf), value)
            if misplaced is None:
                place = ((value, spec.index), name, mid)
                # An unordered event listed after any that runs later, or any event
                # listed after an unordered one that runs later: the list misleads.
                ahead = last if spec.order is None else last_unordered
                if ahead is not None and place[0] < ahead[0]:
                    misplaced = (position(name, mid), position(ahead[1], ahead[2]))
                if last is None or place[0] > last[0]:
                    last = place
                if spec.order is None and (last_unordered is None or place[0] > last_unordered[0]):
                    last_unordered = place
        if misplaced is not None:
            names = ", ".join(self.job.inputs)
            warnings.warn(
                SourceOrderWarning(
                    f"batch {self.batch}: {misplaced[0]} runs before {misplaced[1]}, listed "
                    "before it: without an order column a micro-batch runs its inputs in "
                    f"declaration order ({names}), not in list order; declare order=... on "
                    "the inputs to interleave them"
                ),
                stacklevel=4,
            )
        ctx = BatchContext(
            str(self.store.root),
            self.batch,
            self.prev,
            snapshot=self.batch % self.snapshot_every == 0,
            arrival=self.arrival,
            tokens=self.tokens,
            partitions=self.partitions,
        )
        if self.idle_batches is not None:
            declared = {name: spec.index for name, spec in self.job.inputs.items()}
            if self._ending:
                ctx.release_upto, self.frontier = ended(self.frontier, self.idle_batches)
            else:
                ctx.release_upto, self.frontier = advance(
                    self.frontier, seen, self.idle_batches, declared, self.watermarks
                )
            ctx.frontier = self.frontier
        stats = run_batch(
            self.job, _LocalPhases(self.job, per_partition, bad, self.tasks), ctx, self.store
        )
        self.prev = self.batch
        self.batch += 1
        self.stats.append(stats)
        return stats

    def run(self, batches: Sequence[Iterable[tuple[str, Row]]]) -> list[dict[str, Any]]:
        """Run several micro-batches."""
        return [self.run_batch(batch) for batch in batches]


class _LocalPhases(Phases):
    def __init__(
        self,
        job: JobSpec,
        events: dict[int, list[Event]],
        bad: list[dict[str, Any]],
        tasks: int = 1,
    ) -> None:
        self.job = job
        self.tasks = tasks
        self.events = events
        self.bad = bad
        self._shipped: list[dict[str, Any]] = []

    def phase1(self, ctx: BatchContext) -> tuple[list[dict[str, Any]], bool]:
        # Each partition's copy of an event gets a row of its own at every attempt, as
        # a Spark task reads its rows afresh: a function that changes its event's row
        # must not change what another fragment of the event, or the batch's re-run
        # after a failure that spans partitions, sees (nor the caller's batches).
        events = {pid: own_rows(evs) for pid, evs in self.events.items()}
        if self.job.may_cross and forwarding(self.job):
            # As on Spark, each crossing transaction's homes announce it to the other
            # partitions (forward._Partition.announce): their marker copies are
            # dropped here.  That needs every partition in the scheduler.
            announce = set(events) == set(range(ctx.partitions))
            if announce:
                events = {pid: [e for e in evs if e.copy] for pid, evs in events.items()}
            # Every partition in one scheduler: messages between them stay in memory.
            if self.tasks > 1:
                done = _threaded_phase1(self.job, ctx, events, self.tasks, announce)
            else:
                done = phase1_forward(self.job, ctx, events, announce=announce)
            results = [done[pid] for pid in self.events]
        else:
            results = [phase1(self.job, ctx, pid, evs) for pid, evs in events.items()]
        if self.bad:  # events without a place, reported as a Spark phase-1 task does
            lines = [json.dumps(f, default=str) for f in self.bad]
            files = RuntimeStore(ctx.store).write_lines("errors", "", ctx.batch, "input", lines)
            stats = results[0]["stats"]
            stats["files"].update(files)
            stats["failures"].extend(self.bad)
            stats["aborted"] += len(self.bad)
        self._shipped = results
        ctx.phase1_tokens = {pid: r["token"] for pid, r in zip(self.events, results, strict=True)}
        return [r["stats"] for r in results], any(r["events"] or r["rows"] for r in results)

    def deferred(self, ctx: BatchContext) -> tuple[dict[str, Any], dict[int, str]]:
        rows = [row for r in self._shipped for row in r["rows"]]
        events = [e for r in self._shipped for e in r["events"]]
        stats, back = phase2(self.job, ctx, rows, events)
        by_pid: dict[int, list[Any]] = {pid: [] for pid in self.events}
        for value, tables in back:
            by_pid[_owner(self.job, value, len(self.events))].append((value, tables))
        tokens = {pid: phase3(self.job, ctx, pid, items) for pid, items in by_pid.items() if items}
        return stats, tokens


def _threaded_phase1(
    job: JobSpec,
    ctx: BatchContext,
    events: dict[int, list[Event]],
    tasks: int,
    announce: bool = False,
) -> dict[int, dict[str, Any]]:
    """Phase 1 in ``tasks`` threads exchanging messages over local sockets (as on Spark)."""
    exchange = new_exchange(tasks)
    folder = Path(ctx.store) / "rendezvous" / f"local-{ctx.batch}-{uuid.uuid4().hex}"
    results: dict[int, dict[str, Any]] = {}
    errors: list[BaseException] = []

    def task(me: int) -> None:
        transport = SocketTransport(
            me, tasks, folder, exchange["secret"], "127.0.0.1", cancelled=lambda: bool(errors)
        )
        try:
            mine = {p: evs for p, evs in events.items() if p % tasks == me}
            results.update(phase1_forward(job, ctx, mine, transport, lambda p: p % tasks, announce))
        except BaseException as exc:  # (reported by the caller, after every thread ended)
            errors.append(exc)
        finally:
            transport.close()

    threads = [threading.Thread(target=task, args=(q,), daemon=True) for q in range(tasks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    shutil.rmtree(folder, ignore_errors=True)
    first = [e for e in errors if not isinstance(e, ExchangeError)] or errors
    if first:
        raise first[0]
    return results


def _owner(job: JobSpec, value: Any, partitions: int) -> int:
    return partition_of(value, partitions)


def _local_store(store: RuntimeStore, job: JobSpec, partitions: int, shape: dict[str, Any]) -> Any:
    """Take ``store``'s owner lock for a local run; refuse a Spark query's store.

    A Spark query's batches are Spark's micro-batches, numbered in its
    checkpoint: a local batch committed in its store would take the number of
    the query's next one, which the query would then skip as done.  A store
    run before must fit the job (``shape``, see :mod:`.restart`).  Returns the
    lock (the caller releases it).
    """
    root = store.root
    if (root / "txstream").is_dir() or (root / "spark").is_dir():
        raise RuntimeJobError(
            f"{root} is a Spark job's checkpoint; run_local needs a store directory of its own"
        )
    lock = store.lock()
    try:
        meta = store.job_meta("local")
        if meta is not None and meta["partitions"] != partitions:
            raise RuntimeJobError(
                f"store {root} was run with {meta['partitions']} partitions; run again "
                "with the same number or a new store"
            )
        if meta is None and store.committed():
            raise RuntimeJobError(
                f"{root} holds batches that no run_local committed (a Spark query's); "
                "run_local needs a store directory of its own"
            )
        if meta is None:
            meta = first_meta(job, partitions, "local", shape)
        else:
            meta = restarted_meta(store, meta, shape, job, f"store {root}")
        store.write_job_record(meta)
    except BaseException:
        lock.release()
        raise
    return lock
