"""Feeding the continuous loader from Spark Structured Streaming.

A streaming query reads modification operations as JSON lines (one object per
line: ``{"relation": ..., "op": ..., "values": {...}}``) from files dropped
into a directory and hands every micro-batch to a
:class:`~txstream.loading.Loader` through the runtime's ``foreachBatch``
driver (:mod:`txstream.spark.batches`)::

    sink = LoadingSink(loader)
    query = load_directory(spark, "in/", sink, checkpoint="ckpt/")
    query.processAllAvailable(); query.stop()

Exactly once per batch id: foreachBatch is at-least-once (after a crash the
same batch id runs again with the same rows).  The sink skips a batch id the
target has marked complete; otherwise it loads the batch with
``batch_id``, so each load transaction records ``(batch id, sequence)`` in
the target in the same database transaction as its effects, and a re-run
skips the transactions that had committed before the crash; finally it marks
the batch complete.  Grouping is deterministic for a given batch (same rows,
same order, same seed), so the re-run forms the same transactions.

:class:`ExecutorLoadingSink` loads from the executors instead: the k sessions
are Spark tasks, each with its own database connection, and no operation
passes through the driver (see its docstring).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from txstream.errors import TxStreamError
from txstream.loading import Loader, LoadReport, Target
from txstream.loading.sessions import MAX_SESSIONS, check_method
from txstream.spark.batches import ExactlyOnce, MicroBatch, StreamHandle, foreach_batch
from txstream.spark.sources import text_files


class LoadingSink:
    """A ``foreachBatch`` function that loads each micro-batch exactly once."""

    def __init__(self, loader: Loader) -> None:
        self.loader = loader
        self.reports: dict[int, LoadReport] = {}
        # The target's record of completed batches survives a crash; an
        # in-memory set of batch ids would not.
        self.batches = ExactlyOnce(self._load, done=loader.target.batch_done)

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        """Load the text rows of ``batch_df`` (column ``value``) as batch ``batch_id``."""
        self.batches(batch_df, batch_id)

    def _load(self, batch: MicroBatch) -> None:
        plan_of = getattr(self.loader.target, "batch_plan", None)
        if plan_of is not None and plan_of(batch.id) is not None:
            raise TxStreamError(
                f"batch {batch.id} was begun as {plan_of(batch.id)}: finish it with "
                "ExecutorLoadingSink and the same settings, then switch"
            )
        values = batch.columns(["value"])["value"]
        lines = [v for v in values if v and v.strip()]
        self.reports[batch.id] = self.loader.load(lines, batch_id=batch.id)
        self.loader.target.mark_batch(batch.id)

    @property
    def skipped(self) -> list[int]:
        """The batch ids skipped because the target had them complete."""
        return self.batches.skipped

    @property
    def rejected(self) -> list[tuple[int, int, str]]:
        """(batch id, line position, reason) of every rejected operation."""
        return [(b, i, msg) for b, r in sorted(self.reports.items()) for i, msg in r.rejected]


def load_directory(
    spark: Any,
    directory: str | Path,
    sink: LoadingSink | ExecutorLoadingSink,
    *,
    checkpoint: str | Path,
    available_now: bool = True,
    processing_time: str | None = None,
    max_files_per_trigger: int | None = None,
) -> StreamHandle:
    """Start the query: JSON-lines files in ``directory`` -> ``sink``; returns it.

    ``available_now`` processes what is there and stops (tests, catch-up runs);
    otherwise it triggers every ``processing_time`` (default: as fast as it can).
    """
    stream = text_files(spark, directory, max_files_per_trigger=max_files_per_trigger)
    return foreach_batch(
        stream,
        sink.batches,
        checkpoint,
        available_now=available_now,
        processing_time=processing_time,
    )


ROUTED = "pos long, route long, dest int, session int, op binary, reason string"
"""The operations on their way to task ``dest`` (session -1: rejected, travelling with 0)."""
REPORTED = (
    "kind string, session int, pos long, reason string, operations long, transactions long, "
    "skipped long, deadlocks long, retries long, statements long, statements_attempted long, "
    "reordered long, headers long, gate_busy long, elapsed double, cpu double, pid int"
)
"""What each session's task sends back: one ``session`` row, ``rejected`` rows, or an ``error``."""
_COUNTERS = (
    "operations",
    "transactions",
    "skipped",
    "deadlocks",
    "retries",
    "statements",
    "statements_attempted",
    "reordered",
    "headers",
    "gate_busy",
)


@dataclass(frozen=True)
class _Plan:
    """Everything a task needs for one batch; shipped to the executors with the task."""

    target: Target
    method: str
    k: int
    n: int
    preaggregate: bool
    seed: int
    starvation_ts: float
    max_attempts: int
    batch: int
    routes: tuple[int, ...]


class ExecutorLoadingSink:
    """A ``foreachBatch`` function whose k loading sessions are Spark tasks.

    Per micro-batch the driver runs one Spark job and sends no statement:

    1. on the executors, each input partition's lines are parsed and checked
       and each operation gets its session from the method's assignment
       (:func:`txstream.loading.sessions.route`: a hash, the same in every
       process), and its position in the batch (Spark's row id);
    2. a shuffle by session number brings session m's operations, in arrival
       order, to task m (partition m: the shuffle key is chosen per session so
       that Spark's hash partitioning maps it to partition m);
    3. task m forms its load transactions, opens its own database connection
       and runs them (:func:`txstream.loading.sessions.run_session`): in
       queue order for ``naive`` and ``partition``; for ``reorder`` the
       array J and the header transaction are the database's locks, so
       sessions in different processes agree on what may run;
    4. the driver gets back one row of counters per session (and the rejected
       operations' reasons) and marks the batch complete.

    Exactly once per batch id, as :class:`LoadingSink`: a batch the target has
    marked is skipped, and every load transaction writes ``(batch id, m *
    2**32 + i)`` in its own database transaction, so a re-run task (or a
    re-run batch after the driver died) skips what committed.  A re-run
    forms the same transactions only with the same method, k, n and seed:
    the target records them per batch and refuses a batch begun otherwise
    (``PostgresTarget.begin_batch``).
    ``target`` must be reachable from the executors (``PostgresTarget``).
    """

    def __init__(
        self,
        target: Target,
        method: str = "reorder",
        *,
        sessions: int = 4,
        grouping: int = 8,
        preaggregate: bool = False,
        seed: int = 0,
        starvation_ts: float = 1.0,
        max_attempts: int = 10_000,
    ) -> None:
        from txstream.loading.postgres import PostgresTarget

        if not isinstance(target, PostgresTarget):
            raise TxStreamError(
                "loading from the executors needs a target the executors can reach "
                f"(PostgresTarget), not {type(target).__name__}; or load from the driver"
            )
        check_method(method)
        for name, value, top in (
            ("sessions k", sessions, MAX_SESSIONS),
            ("grouping factor n", grouping, 1 << 30),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise TxStreamError(f"the {name} must be an integer in [1, {top}], not {value!r}")
        if not starvation_ts > 0:
            raise TxStreamError("the starvation threshold TS must be a positive number of seconds")
        self.target = target
        self.method = method
        self.k = sessions
        self.n = grouping
        self.preaggregate = preaggregate
        self.seed = seed
        self.starvation_ts = float(starvation_ts)
        self.max_attempts = max_attempts
        self.reports: dict[int, LoadReport] = {}
        self.sessions: dict[int, list[dict[str, Any]]] = {}
        """Per batch id, each session's counters (as its task reported them)."""
        self._rejected: dict[int, list[tuple[int, str]]] = {}
        self._routes: tuple[int, ...] | None = None
        self.batches = ExactlyOnce(self._load, done=target.batch_done)

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        """Load the text rows of ``batch_df`` (column ``value``) as batch ``batch_id``."""
        self.batches(batch_df, batch_id)

    @property
    def skipped(self) -> list[int]:
        """The batch ids skipped because the target had them complete."""
        return self.batches.skipped

    @property
    def rejected(self) -> list[tuple[int, int, str]]:
        """(batch id, Spark row id, reason) of every rejected operation."""
        return [(b, i, msg) for b, r in sorted(self._rejected.items()) for i, msg in r]

    def routes(self, spark: Any) -> tuple[int, ...]:
        """Per session m, a shuffle key that Spark's hash partitioning sends to partition m."""
        if self._routes is None:
            k = self.k
            rows = (
                spark.range(0, 64 * k + 1024)
                .selectExpr("id", f"pmod(hash(id), {k}) AS p")
                .groupBy("p")
                .agg({"id": "min"})
                .toArrow()
                .to_pylist()
            )
            found = {int(r["p"]): int(r["min(id)"]) for r in rows}
            if sorted(found) != list(range(k)):  # (not seen: Murmur3 spreads well)
                raise TxStreamError(f"no shuffle key found for every one of {k} sessions")
            self._routes = tuple(found[m] for m in range(k))
        return self._routes

    def plan(self) -> str:
        """What decides which transactions a batch forms (see ``PostgresTarget.begin_batch``)."""
        # (pre-aggregation changes the statements, not which operations form a transaction)
        return f"sessions apart: method={self.method} k={self.k} n={self.n} seed={self.seed}"

    def _load(self, batch: MicroBatch) -> None:
        start = time.perf_counter()
        self.target.begin_batch(batch.id, self.plan())
        df = batch.frame
        plan = _Plan(
            self.target,
            self.method,
            self.k,
            self.n,
            self.preaggregate,
            self.seed,
            self.starvation_ts,
            self.max_attempts,
            batch.id,
            self.routes(df.sparkSession),
        )
        tagged = df.selectExpr(
            "CAST(value AS STRING) AS value", "monotonically_increasing_id() AS pos"
        )
        routed = tagged.mapInArrow(functools.partial(_route_task, plan), ROUTED)
        by_session = routed.repartition(self.k, "route").sortWithinPartitions("pos")
        rows = (
            by_session.mapInArrow(functools.partial(_session_task, plan), REPORTED)
            .toArrow()
            .to_pylist()
        )
        errors = [r for r in rows if r["kind"] == "error"]
        if errors:
            first = errors[0]
            raise TxStreamError(
                f"loading batch {batch.id} failed in session {first['session']}: {first['reason']}"
            )
        report = LoadReport(self.method, self.target.name, self.k, self.n, self.preaggregate)
        sessions = sorted((r for r in rows if r["kind"] == "session"), key=lambda r: r["session"])
        for r in sessions:
            for name in _COUNTERS[:7]:
                setattr(report, name, getattr(report, name) + int(r[name]))
        report.method_stats = {
            name: sum(int(r[name]) for r in sessions)
            for name in ("reordered", "headers", "gate_busy")
        }
        rejected = sorted(
            (int(r["pos"]), str(r["reason"])) for r in rows if r["kind"] == "rejected"
        )
        report.rejected = rejected
        report.elapsed = time.perf_counter() - start
        self.sessions[batch.id] = sessions
        self._rejected[batch.id] = rejected
        self.reports[batch.id] = report
        self.target.mark_batch(batch.id)


def _route_task(plan: _Plan, batches: Iterator[Any]) -> Iterator[Any]:
    """Executor, stage 1: check each line and give it its session (``mapInArrow``)."""
    import pyarrow as pa

    from txstream.loading.ops import InvalidOperation, validate
    from txstream.loading.sessions import encode, route

    schema = plan.target.schema
    for rb in batches:
        out: dict[str, list[Any]] = {
            "pos": [],
            "route": [],
            "dest": [],
            "session": [],
            "op": [],
            "reason": [],
        }
        for value, pos in zip(
            rb.column("value").to_pylist(), rb.column("pos").to_pylist(), strict=True
        ):
            if not value or not value.strip():
                continue  # as the driver's loader: blank lines are no operations
            data: bytes | None = None
            reason: str | None = None
            try:
                op = validate(schema, value)
            except InvalidOperation as exc:
                m, data, reason = -1, None, str(exc)
            else:
                m = route(schema, plan.method, op, plan.k, plan.seed, plan.batch, pos)
                data, reason = encode(op), None
            out["pos"].append(pos)
            # A rejected operation travels with session 0 back to the driver.
            out["route"].append(plan.routes[max(m, 0)])
            out["dest"].append(max(m, 0))
            out["session"].append(m)
            out["op"].append(data)
            out["reason"].append(reason)
        yield pa.RecordBatch.from_pydict(
            out,
            schema=pa.schema(
                [
                    ("pos", pa.int64()),
                    ("route", pa.int64()),
                    ("dest", pa.int32()),
                    ("session", pa.int32()),
                    ("op", pa.binary()),
                    ("reason", pa.string()),
                ]
            ),
        )


def _session_task(plan: _Plan, batches: Iterator[Any]) -> Iterator[Any]:
    """Executor, stage 2: task m is loading session m (``mapInArrow``)."""
    import os

    import pyarrow as pa

    from txstream.loading.sessions import decode, form, run_session

    m: int | None = None
    rows: list[dict[str, Any]] = []
    blank = dict.fromkeys(_COUNTERS, 0)
    base: dict[str, Any] = {"pos": None, "reason": None, "elapsed": 0.0, "cpu": 0.0}
    base["pid"] = os.getpid()
    try:
        ops = []
        for rb in batches:
            for pos, dest, session, data, reason in zip(
                *(rb.column(c).to_pylist() for c in ("pos", "dest", "session", "op", "reason")),
                strict=True,
            ):
                if m is None:
                    m = base["session"] = dest
                elif dest != m:
                    raise TxStreamError(
                        f"operations of sessions {m} and {dest} reached one task: the shuffle "
                        "did not keep the sessions apart"
                    )
                if session < 0:
                    rows.append({**base, **blank, "kind": "rejected", "pos": pos, "reason": reason})
                    continue
                ops.append((pos, decode(data)))
        if m is None:  # no operation for this task (its session got none)
            yield pa.RecordBatch.from_pylist([], schema=_reported_schema())
            return
        ops.sort(key=lambda p: p[0])  # arrival order (the shuffle sorted them already)
        txns = form((op for _, op in ops), m, plan.n, plan.batch)
        report = run_session(
            plan.target,
            plan.target.schema,
            plan.method,
            m,
            plan.k,
            txns,
            preaggregate_ops=plan.preaggregate,
            starvation_ts=plan.starvation_ts,
            max_attempts=plan.max_attempts,
        )
        done = report.as_dict()
        rows.append(
            {
                **base,
                **{c: done[c] for c in _COUNTERS},
                "kind": "session",
                "elapsed": report.elapsed,
                "cpu": report.cpu,
            }
        )
    except Exception as exc:  # sent to the driver, which fails the batch in one line
        reason = str(exc) if isinstance(exc, TxStreamError) else f"{type(exc).__name__}: {exc}"
        rows = [{**base, **blank, "kind": "error", "session": m, "reason": reason.splitlines()[0]}]
    yield pa.RecordBatch.from_pylist(rows, schema=_reported_schema())


def _reported_schema() -> Any:
    import pyarrow as pa

    types = {"string": pa.string(), "int": pa.int32(), "long": pa.int64(), "double": pa.float64()}
    return pa.schema(
        [(name, types[typ]) for name, typ in (f.split() for f in REPORTED.split(", "))]
    )


def _ticks(pid: int) -> tuple[float, float]:
    """(own CPU, reaped children's CPU) of process ``pid`` in seconds; zeros if it is gone."""
    import os

    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return 0.0, 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    hz = os.sysconf("SC_CLK_TCK")
    # fields[11:15] are utime, stime, cutime, cstime (stat(5) fields 14-17)
    utime, stime, cutime, cstime = (int(x) / hz for x in fields[11:15])
    return utime + stime, cutime + cstime


class ProcessCPU:
    """CPU seconds so far of the driver, Spark's JVM, the Python workers and a database server.

    Read from ``/proc`` (Linux): the driver is this Python process
    (``time.process_time``: all its threads); the JVM is the session's JVM
    process (in local mode it hosts the driver's scheduler and the executors);
    the workers are every process under the JVM (Spark's Python daemon and
    workers, where the tasks' Python code runs), including those that ended
    (their parent's reaped-children time); the server is a process tree such
    as PostgreSQL's postmaster and its backends.  Subtract two
    :meth:`sample` results to get a run's share.
    """

    def __init__(self, spark: Any, server_pid: int | None = None) -> None:
        gateway: Any = spark.sparkContext._jvm  # (py4j: untyped)
        self.jvm = int(gateway.ProcessHandle.current().pid())
        self.server_pid = server_pid

    @staticmethod
    def _tree(pid: int) -> tuple[float, float]:
        """(``pid``'s own CPU, the CPU of everything under it, ended processes included)."""
        from txstream.spark.jvmwatchdog import tree

        own, reaped = _ticks(pid)
        below = reaped
        for child in tree(pid)[1:]:
            mine, theirs = _ticks(child)
            below += mine + theirs
        return own, below

    def sample(self) -> dict[str, float]:
        """``driver``, ``jvm``, ``workers`` and ``server`` CPU seconds until now."""
        jvm, workers = self._tree(self.jvm)
        out = {"driver": time.process_time(), "jvm": jvm, "workers": workers, "server": 0.0}
        if self.server_pid is not None:
            own, below = self._tree(self.server_pid)
            out["server"] = own + below
        return out
