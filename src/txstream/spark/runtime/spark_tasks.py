"""What Spark runs for a micro-batch: the phases as Spark jobs and their task bodies.

:class:`SparkPhases` runs :mod:`~txstream.spark.runtime.tasks`' phases as
Spark jobs (phase 1 in ``mapInArrow`` over the batch's routed events, a barrier
stage when its tasks exchange messages or meet at a global read; phases 2 and 3
as one-stage jobs); the ``_phase*_task`` functions are the bodies Spark ships
to the executors: each turns its Arrow rows into events, runs them against its
partitions' state in the store and returns its counters.  :func:`init_writer`
writes a table's initial rows from a Spark job.  Called on executors except
:class:`SparkPhases`' methods (the driver's batch thread).
"""

from __future__ import annotations

import json
import pickle
import shutil
import time
from collections.abc import Iterator
from dataclasses import replace
from itertools import chain, compress, islice, repeat
from math import isfinite
from operator import add, getitem, itemgetter, le
from pathlib import Path
from typing import Any

from txstream.errors import TxStreamError
from txstream.spark.connect import is_connect
from txstream.spark.runtime.base import (
    JobSpec,
    RuntimeJobError,
    bad_event,
    finite,
    initial_row,
)
from txstream.spark.runtime.boundaries import MID_BITS, Event, position
from txstream.spark.runtime.deferred import deferred_chains
from txstream.spark.runtime.forward import SocketTransport, new_exchange
from txstream.spark.runtime.merge import Bound, advance
from txstream.spark.runtime.partitioning import partition_of
from txstream.spark.runtime.results import one_per_transaction
from txstream.spark.runtime.state import (
    RuntimeStore,
)
from txstream.spark.runtime.tasks import (
    BatchContext,
    Phases,
    collector_paused,
    merge_stats,
    phase1,
    phase1_forward,
    phase2,
    phase3,
)

OUT_SCHEMA = "kind string, pid int, payload binary"
BARRIER_ATTEMPTS = 4
"""Runs of a batch's barrier phase-1 stage that a failed task (a lost executor) may take
(as ``spark.stage.maxConsecutiveAttempts``)."""

MID_EXPR = "monotonically_increasing_id()"
"""An event's place in its micro-batch; Python adds ``batch << MID_BITS`` (see
``boundaries.MID_BITS``) to make it unique across batches.  The batch id stays out of
the SQL on purpose: Spark inlines literals into the Java it generates, so a
per-batch literal made every micro-batch compile new classes and JIT them again
(measured: 13 s of compiler threads in 30 s of Linear Road at speedup 20)."""


def init_writer(store_root: str, spec: Any) -> Any:
    """A task that writes its partitions' initial rows of table ``spec``."""

    def write_init(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        by_pid: dict[int, dict[Any, dict[Any, Any]]] = {}
        for batch in batches:
            cols = batch.to_pydict()
            for payload, pid in zip(cols["payload"], cols["pid"], strict=True):
                row = json.loads(payload)
                if spec.columns is not None:  # to_json leaves null columns out
                    row = {**dict.fromkeys(spec.columns), **row}
                key = spec.key_of(initial_row(spec, row))
                add_initial(by_pid, pid, spec, key, row)
        store = RuntimeStore(store_root)
        for pid, values in by_pid.items():
            store.write_init(pid, spec.name, values)
        yield pa.RecordBatch.from_pylist(
            [{"n": len(by_pid)}], schema=pa.schema([("n", pa.int64())])
        )

    return write_init


def add_initial(
    by_pid: dict[int, dict[Any, dict[Any, Any]]], pid: int, spec: Any, key: Any, row: Any
) -> None:
    """File initial ``row`` (key ``key``) of table ``spec`` under partition ``pid``."""
    rows = by_pid.setdefault(pid, {}).setdefault(spec.value_of_key(key), {})
    if key in rows:  # as run_local refuses it (one key's rows meet in one task)
        raise RuntimeJobError(f"table {spec.name!r}: initial rows repeat the key {key!r}")
    rows[key] = row


def plain_rows(initial: Any) -> bool:
    """Whether ``initial`` is a list of dicts that Spark would hand back unchanged.

    Such rows (ints, strings, booleans, one type per column, no nulls) come
    back from ``createDataFrame`` and ``to_json`` as they went in; others (a
    column of ints and floats becomes doubles, a date becomes text, a null
    column is left out) take the Spark path, which gives what it always gave.
    """
    if not isinstance(initial, list) or not initial:
        return False
    kinds: dict[str, type] = {}
    columns = None
    for row in initial:
        if not isinstance(row, dict) or not all(isinstance(c, str) for c in row):
            return False
        if columns is None:
            columns = set(row)
        elif set(row) != columns:
            return False
        for column, value in row.items():
            kind = type(value)
            if kind not in (int, str, bool) or kinds.setdefault(column, kind) is not kind:
                return False
            if kind is int and not -(2**63) <= value < 2**63:  # (Spark: no bigint)
                return False
    return True


def as_dataframe(spark: Any, initial: Any, table: str) -> Any:
    """Table ``table``'s initial rows as a DataFrame (a DataFrame, a list of dicts or a file)."""
    if hasattr(initial, "schema") and hasattr(initial, "columns"):
        return initial
    if isinstance(initial, list):
        if not initial:
            raise RuntimeJobError(f"table {table!r}: initial rows are an empty list; leave it None")
        return spark.createDataFrame(initial)
    path = Path(initial)
    if not path.exists():
        raise RuntimeJobError(f"table {table!r}: initial file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix in (".json", ".jsonl"):
        return spark.read.json(str(path))
    if suffix == ".csv":
        return spark.read.csv(str(path), header=True, inferSchema=True)
    if suffix == ".parquet" or path.is_dir():
        return spark.read.parquet(str(path))
    raise RuntimeJobError(
        f"table {table!r}: initial file {path} is not .json, .jsonl, .csv or .parquet"
    )


class SparkPhases(Phases):
    """The batch's phases as Spark jobs (see the module docstring)."""

    def __init__(self, job: JobSpec, prepared: Any, partitions: int) -> None:
        self.job = job
        self.prepared = prepared
        self.partitions = partitions

    def phase1(self, ctx: BatchContext) -> tuple[list[dict[str, Any]], bool]:
        """Phase 1 in ``mapInArrow`` over the prepared batch; its tasks' counters."""
        job, partitions = self.job, self.partitions
        names = {spec.index: spec.name for spec in job.inputs.values()}

        def run(batches: Iterator[Any]) -> Iterator[Any]:
            return _phase1_task(job, ctx, partitions, names, batches)

        barrier = ctx.gather is not None or ctx.exchange is not None
        for attempt in range(1, BARRIER_ATTEMPTS + 1):
            # (the function is pickled into the plan: a new attempt needs a new plan)
            rows = self.prepared.mapInArrow(run, OUT_SCHEMA, barrier=barrier).select("payload")
            try:
                stats = [pickle.loads(r[0]) for r in rows.collect()]
                break
            except Exception as exc:
                if not barrier or "barrier" not in str(exc) or attempt == BARRIER_ATTEMPTS:
                    raise
                # Spark does not retry a failed barrier stage whose results go to the
                # driver (an executor died): run it again, with rendezvous of its own.
                for exchange in (ctx.gather, ctx.exchange):
                    if exchange is not None:
                        shutil.rmtree(rendezvous_folder(ctx.store, exchange), ignore_errors=True)
                        exchange.update(new_exchange(int(exchange.get("tasks", 0))))
                        exchange["nonce"] = f"{exchange['nonce'].split('~')[0]}~{attempt}"
                RuntimeStore(ctx.store).clear_uncommitted(ctx.batch)
        ctx.phase1_tokens = {s["pid"]: s["token"] for s in stats if s["pid"] >= 0}
        if ctx.gather is not None:  # every task found the same frontier; the commit stores it
            ctx.release_upto, ctx.frontier = stats[0]["release"]
        return [s["stats"] for s in stats], any(s["shipped"] for s in stats)

    def deferred(self, ctx: BatchContext) -> tuple[dict[str, Any], dict[int, str]]:
        """Phases 2 and 3 as two one-stage jobs; their counters and partitions' tokens."""
        # Phase 1 left each partition's shipped rows and events in the store, and
        # phase 2 leaves each partition's rows to take back there: two one-stage
        # jobs, no shuffle and no cached DataFrame between the phases.  Phase 2
        # runs in P tasks, each on whole chains of deferred transactions.
        job, spark = self.job, self.prepared.sparkSession
        P = self.partitions
        if is_connect(spark):
            return self._deferred_frames(ctx)
        sc = spark.sparkContext

        def coordinate(shares: Iterator[int]) -> Iterator[Any]:
            return (_phase2_task(job, ctx, share, P) for share in shares)

        def take(pids: Iterator[int]) -> Iterator[Any]:
            return _phase3_task(job, ctx, pids)

        stats = merge_stats(sc.parallelize(range(P), P).mapPartitions(coordinate).collect())
        tokens = dict(sc.parallelize(range(P), P).mapPartitions(take).collect())
        return stats, tokens

    def _deferred_frames(self, ctx: BatchContext) -> tuple[dict[str, Any], dict[int, str]]:
        """:meth:`deferred` with DataFrames only (Spark Connect has no RDDs).

        The same two one-stage jobs: ``spark.range(P)`` in P partitions, one
        share (or partition id) per row, through ``mapInArrow``; the tasks'
        results come back pickled, as phase 1's do.
        """
        job, P = self.job, self.partitions
        ids = self.prepared.sparkSession.range(P, numPartitions=P)

        def coordinate(batches: Iterator[Any]) -> Iterator[Any]:
            shares = [s for b in batches for s in b.column(0).to_pylist()]
            out = [_out("stats", s, _phase2_task(job, ctx, s, P)) for s in shares]
            if out:
                yield _record_batch(out)

        def take(batches: Iterator[Any]) -> Iterator[Any]:
            pids = [p for b in batches for p in b.column(0).to_pylist()]
            out = [_out("token", pid, token) for pid, token in _phase3_task(job, ctx, iter(pids))]
            if out:
                yield _record_batch(out)

        rows = ids.mapInArrow(coordinate, OUT_SCHEMA).select("payload").collect()
        stats = merge_stats([pickle.loads(r[0]) for r in rows])
        rows = ids.mapInArrow(take, OUT_SCHEMA).select("pid", "payload").collect()
        return stats, {int(r[0]): pickle.loads(r[1]) for r in rows}


def _out(kind: str, pid: int, payload: Any) -> dict[str, Any]:
    return {
        "kind": kind,
        "pid": pid,
        "payload": pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL),
    }


def _record_batch(rows: list[dict[str, Any]]) -> Any:
    import pyarrow as pa

    schema = pa.schema(
        [
            ("kind", pa.string()),
            ("pid", pa.int32()),
            ("payload", pa.binary()),
        ]
    )
    return pa.RecordBatch.from_pylist(rows, schema=schema)


def _phase1_task(
    job: JobSpec, ctx: BatchContext, partitions: int, names: dict[int, str], batches: Iterator[Any]
) -> Iterator[Any]:
    with collector_paused():  # the Arrow rows become events: millions of small objects
        out = _phase1_outputs(job, ctx, partitions, names, batches)
    if out:
        yield _record_batch(out)


def _phase1_outputs(
    job: JobSpec, ctx: BatchContext, partitions: int, names: dict[int, str], batches: Iterator[Any]
) -> list[dict[str, Any]]:
    events: dict[int, list[Event]] = {}
    high: dict[int, float] = {}  # input -> largest order value (for the event-time merge)
    bad: list[dict[str, Any]] = []
    placed: dict[Any, int] = {}  # partition_of per value (an event's check, memoised)
    base = ctx.batch << MID_BITS  # see MID_EXPR
    values_of = {inp: job.inputs[name].values_of for inp, name in names.items()}
    ordered = {inp for inp, name in names.items() if job.inputs[name].order is not None}
    # Partitions whose events all came in their declared order: phase 1 need not
    # sort them (a pass over every event, from memory long out of the cache).
    in_order: set[int] = set()
    for batch in _slices(batches):
        cols = batch.to_pydict()
        payloads = {inp: cols[f"__in{inp}"] for inp in names}
        if ctx.gather is not None:
            _highest(high, cols["__input"], cols["__ordv"])
        made = _column_events(job, names, batch, cols, base, partitions)
        if made is not None:  # (the common case: a batch without a bad event)
            parts, sorted_here = made
            for pid, part in parts.items():
                evs = events.get(pid)
                if evs is None:
                    events[pid] = evs = []
                    if sorted_here:
                        in_order.add(pid)
                elif not sorted_here or evs[-1].order > part[0].order:
                    in_order.discard(pid)  # (its last event is cached: just made)
                evs.extend(part)
            continue
        in_order.clear()  # (the loop below appends to any partition's events)
        for k, (inp, ordv, pids, place, pid, copy) in enumerate(
            zip(
                cols["__input"],
                cols["__ordv"],
                cols["__pids"],
                cols["__mid"],
                cols["__pid"],
                cols["__copy"],
                strict=True,
            )
        ):
            mid = base + place
            name = names[inp]
            row = payloads[inp][k]
            values = values_of[inp](row)
            # (x - x is 0.0 for a finite float only: NaN and infinities have no place)
            unplaced = inp in ordered and (ordv is None or ordv - ordv != 0.0)
            if pid < 0 or (pids and min(pids) < 0) or unplaced:
                what = "key" if pid < 0 or (pids and min(pids) < 0) else "order value"
                odd = ordv if what != "key" else None  # NaN, an infinity (None: null)
                where, at = position(name, mid), [ordv if finite(ordv) else 0.0, inp, mid]
                bad.append(bad_event(ctx.batch, where, mid, at, what, odd))
                continue
            if values:
                first = values[0]
                if placed.get(first, -1) != pids[0]:
                    placed[first] = partition_of(first, partitions)
                    if placed[first] != pids[0]:
                        raise RuntimeJobError(
                            f"{name}#{mid}: Spark and Python place key {first!r} differently; "
                            "use integer or string key columns"
                        )
            order = (float(ordv) if ordv is not None else 0.0, inp, mid)
            event = Event(order, name, row, values, pids or [pid], copy)
            evs = events.get(pid)
            if evs is None:
                events[pid] = [event]
            else:
                evs.append(event)
    # The events alone hold their rows from here on: phase 1 frees each soon after
    # it ran, while it is still in the CPU's cache (see PartitionExecutor.run).
    cols, payloads, made, parts = {}, {}, None, {}
    release = None
    if ctx.gather is not None:
        release = _gathered_release(ctx, high, names)
        ctx = replace(ctx, release_upto=release[0], frontier=release[1])
    if ctx.release_upto is not None:
        # Under the event-time merge a partition may hold events of earlier batches:
        # it runs even when this batch brought it nothing, or they would wait for
        # the next event of one of its keys (forever, at the end of a stream).
        own = _task_partition()  # Spark partition q holds partition q (see _routes)
        if own is not None and own < partitions and own not in events:
            events[own] = []
    out: list[dict[str, Any]] = []
    files: dict[str, list[int]] = {}
    if bad:  # reported with the batch's failures (read_failures reads these files)
        lines = [json.dumps(f, default=str) for f in one_per_transaction(bad)]
        role = f"input-t{_task_partition()}"
        files = RuntimeStore(ctx.store).write_lines("errors", "", ctx.batch, role, lines)
    if ctx.exchange is not None:
        results = _forwarded_phase1(job, ctx, partitions, events)
    else:
        results = {
            pid: phase1(job, ctx, pid, evs, ordered=pid in in_order)
            for pid, evs in sorted(events.items())
        }
    for pid, result in sorted(results.items()):
        stats = result["stats"]
        if bad and pid == min(results):
            stats["failures"].extend(bad)
            stats["aborted"] += len(bad)
            stats["files"].update(files)
        shipped = bool(result["rows"] or result["events"])
        if shipped:  # for phase 2 (see SparkPhases.deferred)
            shipment = {"rows": result["rows"], "events": result["events"]}
            RuntimeStore(ctx.store).write_transient("shipped", ctx.batch, f"p{pid:05d}", shipment)
        summary = {
            "stats": stats,
            "pid": pid,
            "token": result["token"],
            "shipped": shipped,
            "release": release,
        }
        out.append(_out("stats", pid, summary))
    if bad and not results:
        stats = {
            "events": 0,
            "committed": 0,
            "aborted": len(bad),
            "deferred": 0,
            "failures": bad,
            "latency": {},
            "files": files,
        }
        summary = {"stats": stats, "pid": -1, "shipped": False, "release": release}
        out.append(_out("stats", -1, summary))
    return out


def _forwarded_phase1(
    job: JobSpec, ctx: BatchContext, partitions: int, events: dict[int, list[Event]]
) -> dict[int, dict[str, Any]]:
    """Phase 1 of the partitions this barrier task hosts, forwarding rows to the others.

    Task ``q`` of ``tasks`` hosts partitions ``q, q + tasks, ...``: every one of
    them runs, with or without events of its own (a global read needs every
    partition's totals; a partition may hold events of earlier batches).
    """
    from pyspark import BarrierTaskContext

    exchange = ctx.exchange
    assert exchange is not None
    task = BarrierTaskContext.get()
    me, tasks = task.partitionId(), int(exchange["tasks"])
    hosted = {p: events.get(p, []) for p in range(me, partitions, tasks)}
    folder = rendezvous_folder(ctx.store, exchange)
    host = task.getTaskInfos()[me].address.rsplit(":", 1)[0]
    transport = SocketTransport(me, tasks, folder, exchange["secret"], host)
    try:
        # (the plan routed each keyed row to its home only: see TxQuery._run)
        return phase1_forward(job, ctx, hosted, transport, lambda pid: pid % tasks, True)
    finally:
        transport.close()


_SLICE = 1024
"""Rows of an Arrow batch made into events at a time (see :func:`_slices`)."""


def _slices(batches: Iterator[Any]) -> Iterator[Any]:
    """The Arrow batches in slices of at most :data:`_SLICE` rows (zero-copy).

    Each slice's Python objects (its columns as lists, then its events) are made
    together, and the columns' lists freed as soon as its events are made, while
    the CPU's cache still holds them; a whole batch's (tens of MiB for 30,000
    rows) were freed after everything, each object from cold memory again.
    """
    for batch in batches:
        rows = batch.num_rows
        if rows <= _SLICE:
            yield batch
            continue
        for start in range(0, rows, _SLICE):
            yield batch.slice(start, _SLICE)


def _column_events(
    job: JobSpec,
    names: dict[int, str],
    batch: Any,
    cols: dict[str, list[Any]],
    base: int,
    partitions: int,
) -> tuple[dict[int, list[Event]], bool] | None:
    """The events of one Arrow batch per partition, made column by column; None: use the loop.

    And whether they came in their declared order (each partition's then are).

    What the row loop of :func:`_phase1_outputs` makes, with no Python code
    per event in the common case (``map``, ``zip``, ``chain`` run in C; the
    events are named tuples): ~3 us per event less on the ledger.  The key
    values come from the Arrow struct's key columns, from which the rows were
    made.  Any batch with something to report (a null key, an order value
    that is null or not finite) or a key that Spark and Python place
    differently is left to the loop, which reports it exactly as before.
    """
    inputs, ordvs, pids, pid_of = cols["__input"], cols["__ordv"], cols["__pids"], cols["__pid"]
    n = len(inputs)
    if n == 0 or None in ordvs or not all(map(isfinite, ordvs)):
        return None
    if min(pid_of) < 0 or min(chain.from_iterable(pids), default=0) < 0:
        return None
    by_input: dict[int, tuple[list[Any], list[Any]]] = {}
    for inp, name in names.items():
        spec = job.inputs[name]
        struct = batch.column(f"__in{inp}")
        keys = [
            struct.field(k[0]).to_pylist()
            if len(k) == 1
            else list(zip(*(struct.field(c).to_pylist() for c in k), strict=True))
            for k in spec.keys
        ]
        values = list(map(list, zip(*keys, strict=True))) if keys else [[] for _ in range(n)]
        if spec.broadcast is not None:  # (InputSpec.values_of: no values where it is true)
            for i, on in enumerate(struct.field(spec.broadcast).to_pylist()):
                if on:
                    values[i] = []
        by_input[inp] = (cols[f"__in{inp}"], values)
    if len(by_input) == 1:
        ((rows, values),) = by_input.values()
    else:  # each row's own input's row and values
        pick = [by_input.get(i, ([], []))[0] for i in range(max(by_input) + 1)]
        rows = list(map(getitem, map(pick.__getitem__, inputs), range(n)))
        pick = [by_input.get(i, ([], []))[1] for i in range(max(by_input) + 1)]
        values = list(map(getitem, map(pick.__getitem__, inputs), range(n)))
    # The loop's check (Spark and Python place each first value alike), once per
    # distinct value: partition_of costs about 1 us.  Integer and string values
    # (the recommended key types, which no other type equals) are remembered by
    # the worker across batches and compared in C; others (tuples, floats: 1,
    # 1.0 and True are one dict key) per batch, with their types.
    firsts = list(map(itemgetter(0), compress(values, values)))
    spark = list(map(itemgetter(0), compress(pids, values)))
    if set(map(type, firsts)) <= _PLAIN_KEYS:
        placed = _PLACED.setdefault(partitions, {})
        if len(placed) > _PLACED_MAX:
            placed.clear()
        known = list(map(placed.get, firsts))
        if known != spark:
            for first, pid, was in zip(firsts, spark, known, strict=True):
                if was != pid:
                    if was is not None or partition_of(first, partitions) != pid:
                        return None  # (the loop names the event)
                    placed[first] = pid
    else:
        seen: dict[tuple[type, Any], int] = {}
        for kind, first, pid in set(zip(map(type, firsts), firsts, spark, strict=True)):
            was = seen.get((kind, first))
            if was is None:
                was = seen[kind, first] = partition_of(first, partitions)
            if was != pid:
                return None
    if not all(pids):  # (an event without values reaches its partition: [pid])
        pids = [p or [q] for p, q in zip(pids, pid_of, strict=True)]
    mids = map(add, repeat(base), cols["__mid"])
    orders = list(zip(ordvs, inputs, mids, strict=True))
    sorted_here = all(map(le, orders, islice(orders, 1, None)))  # (in C, while they are cached)
    named = map(names.__getitem__, inputs)
    fields = zip(orders, named, rows, values, pids, cols["__copy"], strict=True)
    made = list(map(tuple.__new__, repeat(Event), fields))
    if len(set(pid_of)) == 1:
        return {pid_of[0]: made}, sorted_here
    out: dict[int, list[Event]] = {}
    for pid, event in zip(pid_of, made, strict=True):
        out.setdefault(pid, []).append(event)
    return out, sorted_here


_PLACED: dict[int, dict[Any, int]] = {}
"""Per partition count, the partition of each int or str key value checked (see above)."""
_PLAIN_KEYS = frozenset({int, str})
_PLACED_MAX = 1_000_000


def _highest(high: dict[int, float], inputs: list[int], orders: list[float | None]) -> None:
    """Raise ``high[input]`` to the largest order value of these rows.

    Nulls, NaN and infinities are skipped: reported, not run, they must not
    move the frontier.
    """
    for inp, ordv in zip(inputs, orders, strict=True):
        if ordv is not None and ordv - ordv == 0.0 and (inp not in high or ordv > high[inp]):
            high[inp] = ordv


RENDEZVOUS_TIMEOUT_S = 600.0
"""How long a phase-1 task of a barrier stage waits for the others' order values."""


def _gathered_release(
    ctx: BatchContext, high: dict[int, float], names: dict[int, str]
) -> tuple[Bound, dict[str, Any]]:
    """The batch's release frontier, found together with the stage's other phase-1 tasks.

    Each task has seen only its partition's rows.  In a barrier stage Spark
    starts all of them at once; each writes its largest order value per input
    to the store and reads everyone's, so all find the frontier that the
    driver's :meth:`TxQuery._advance` finds with a Spark job of its own (same
    rows, same :func:`~txstream.spark.runtime.merge.advance`).  The exchange
    goes through files rather than ``BarrierTaskContext.allGather``, which
    polls once a second (measured: 1 s per batch).  A retried stage or a re-run
    of the batch may find a failed attempt's file of a partition: it holds the
    same values, read from the same rows.
    """
    from pyspark import BarrierTaskContext

    gather = ctx.gather
    assert gather is not None
    task = BarrierTaskContext.get()
    folder = rendezvous_folder(ctx.store, gather)
    folder.mkdir(parents=True, exist_ok=True)
    mine = json.dumps({names[inp]: value for inp, value in high.items()})
    tmp = folder / f".{task.partitionId()}.tmp"
    tmp.write_text(mine)
    tmp.replace(folder / f"{task.partitionId()}.json")  # others see all of it or nothing
    seen: dict[str, float] = {}
    deadline = time.time() + RENDEZVOUS_TIMEOUT_S
    for peer in range(len(task.getTaskInfos())):
        path = folder / f"{peer}.json"
        while not path.exists():
            if time.time() > deadline:
                raise TxStreamError(
                    f"batch {ctx.batch}: phase-1 task {peer} did not report its order values "
                    f"in {RENDEZVOUS_TIMEOUT_S:.0f} s"
                )
            time.sleep(0.001)
        for name, value in json.loads(path.read_text()).items():
            seen[name] = max(value, seen.get(name, value))
    index = {name: inp for inp, name in names.items()}
    return advance(gather["frontier"], seen, gather["idle"], index, gather.get("watermarks"))


def rendezvous_folder(store: str | Path, gather: dict[str, Any]) -> Path:
    """Where the phase-1 tasks of one batch exchange their order values (see above)."""
    return Path(store) / "rendezvous" / str(gather["nonce"])


def _task_partition() -> int | None:
    """The Spark partition this task runs (None outside a Spark task)."""
    from pyspark import TaskContext

    task = TaskContext.get()
    return None if task is None else int(task.partitionId())


def _phase2_task(job: JobSpec, ctx: BatchContext, share: int, shares: int) -> dict[str, Any]:
    """Phase 2, share ``share`` of ``shares``: whole chains of deferred transactions.

    Every share reads all that phase 1 shipped and cuts it the same way
    (:func:`~txstream.spark.runtime.deferred.deferred_chains`); it runs its own
    chains and leaves their rows for phase 3, per partition.
    """
    store = RuntimeStore(ctx.store)
    rows, events, owner = [], [], {}
    for name, shipment in store.read_transient("shipped", ctx.batch):
        for item in shipment["rows"]:
            rows.append(item)
            owner[item[0]] = int(name[1:])
        events.extend(shipment["events"])
    mine_rows, mine_events = deferred_chains(rows, events, shares)[share]
    stats, back = phase2(job, ctx, mine_rows, mine_events, role=f"coord{share}")
    by_pid: dict[int, list[Any]] = {}
    for value, tables in back:
        pid = owner.get(value, partition_of(value, ctx.partitions))
        by_pid.setdefault(pid, []).append((value, tables))
    for pid, items in by_pid.items():
        store.write_transient("back", ctx.batch, f"p{pid:05d}-{share}", items)
    return stats


def _phase3_task(job: JobSpec, ctx: BatchContext, pids: Iterator[int]) -> Iterator[Any]:
    """Phase 3 for the partitions ``pids``: (pid, token) for each that had rows to take back."""
    store = RuntimeStore(ctx.store)
    for pid in pids:
        items = [
            i for _, part in store.read_transient("back", ctx.batch, f"p{pid:05d}-") for i in part
        ]
        if items:
            yield pid, phase3(job, ctx, pid, items)
