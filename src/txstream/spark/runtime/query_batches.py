"""One micro-batch of a job on Spark: the state a query keeps between batches, and its run.

:class:`QueryBatches` is the base of :class:`~txstream.spark.runtime.query.TxQuery`
(the handle), holding what a batch needs: the store, the committed position,
the Connect copy that runs the batches in a Spark Connect server, and the
batch itself.  Each micro-batch (``foreachBatch``) goes through Spark jobs that
:mod:`~txstream.spark.runtime.spark_tasks` runs; the driver touches only
per-task counters, never an event:

1. the batch's events get their declared order (order value, input, source
   position), their partitions (:mod:`~txstream.spark.runtime.partitioning`, in
   SQL) and one copy per partition of their keys; a shuffle by route number
   sends partition ``q``'s copies to Spark partition ``q``; phase 1 runs there
   (``mapInArrow``) and returns its counters;
2. when anything was deferred, the deferred transactions and their rows go to
   phase 2 (P tasks, each on whole chains of them) and the rows go back to their
   partitions (phase 3), both handed over through files of the store (one-stage
   jobs, no shuffle);
3. the driver writes the batch's commit marker and hands the batch's outputs
   to the job's sinks.

Called on the driver, in Spark's ``foreachBatch`` thread (over Spark Connect, in
the server's Python process, on a copy of the handle).
"""

from __future__ import annotations

import copy as copying
import json
import logging
import pickle
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from txstream.errors import TxStreamError
from txstream.spark import batches
from txstream.spark.connect import conf_get, default_parallelism, functions, is_connect
from txstream.spark.runtime.base import (
    JobSpec,
    bad_event,
    finite,
    null_field,
)
from txstream.spark.runtime.boundaries import MID_BITS, Event, position
from txstream.spark.runtime.failures import log_failures, log_late
from txstream.spark.runtime.forward import new_exchange
from txstream.spark.runtime.merge import Bound, advance, ended
from txstream.spark.runtime.outcome import latencies
from txstream.spark.runtime.sinks import BackgroundDelivery, deliver
from txstream.spark.runtime.spark_errors import decode
from txstream.spark.runtime.spark_tasks import (
    MID_EXPR,
    SparkPhases,
    rendezvous_folder,
)
from txstream.spark.runtime.state import (
    PartitionState,
    RuntimeStore,
    write_atomic,
)
from txstream.spark.runtime.tasks import (
    BatchContext,
    committed_frontier,
    committed_tokens,
    release,
    run_batch,
    stop_on_error,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from txstream.spark.runtime.job import Job


log = logging.getLogger("txstream.runtime")
"""The runtime's logger (quiet unless the application configures logging)."""

RECENT = 100
"""How many batches' progress ``TxQuery.recentProgress`` keeps (as Spark's default)."""


class QueryBatches:
    """A query's state between micro-batches, and one micro-batch's run on the driver.

    Its methods run in Spark's ``foreachBatch`` thread, one batch at a time;
    the handle's methods (:class:`~txstream.spark.runtime.query.TxQuery`) read
    what they leave (progress, failure) from the user's thread.
    """

    def __init__(
        self, job: Job, root: Path, spark: SparkSession, partitions: int, engine: str
    ) -> None:
        self.job = job
        self.engine = engine
        self.driver: Any = None
        self.spec: JobSpec = job.spec
        self.root = root
        self.store = RuntimeStore(root / "txstream")
        self.spark = spark
        self.partitions = partitions
        self.routes: list[int] = []
        self.query: StreamingQuery | None = None
        """Spark's streaming query running the job (None before it started)."""
        self.recentProgress: list[dict[str, Any]] = []
        """The last :data:`RECENT` batches' progress (a long run keeps no more)."""
        self._committed = 0
        """Batches this query committed (``recentProgress`` keeps only the last ones)."""
        self._lock = self.store.lock()
        self._status = "starting"
        self._failure: str | None = None
        self._error: TxStreamError | None = None
        """What failed the last batch (re-raised, as its class, from the handle's methods)."""
        self._thread = batches.BatchThread()
        """The thread running a micro-batch (Spark's foreachBatch call): sinks (and the
        driver engine's transaction functions) run in it, and a :meth:`stop` from
        there must not wait for it; two stops at once (one from a sink) stop once."""
        committed = self.store.committed()
        self._prev = committed[-1] if committed else -1
        self._tokens = committed_tokens(self.store)
        self._frontier = committed_frontier(self.store)
        self._barrier: bool | None = None
        """Whether phase 1 runs as a barrier stage (see :meth:`_gathers`); None: not known yet."""
        self.tasks = partitions
        """Phase-1 tasks per batch (see :meth:`_phase1_tasks`)."""
        self.task_routes: list[int] = []
        self.forward = False
        """Whether multi-partition transactions are forwarded between phase-1 tasks."""
        self._held = PartitionState()
        """The driver engine's events held by the event-time merge (it cannot resume)."""
        self._watch = job.failure_watch(f"tx.read_failures({str(root)!r}) or query.failures()")
        """Failed transactions since the start: warnings, the all-fail stop (:mod:`.failures`)."""
        self._merge = job.merge_for("start")
        """The merge this query runs (:meth:`Job.merge_for`)."""
        self._batches = 0
        """``foreachBatch`` calls so far (a stop right after a drain ends the inputs)."""
        self._drained: int | None = None
        """``_batches`` when :meth:`processAllAvailable` last returned (None: never)."""
        self._ending = False
        """Whether the batch being run ends the inputs (see :meth:`_end_inputs`)."""
        self._end_lock = threading.Lock()
        """One end at a time (a sink's stop() and the caller's awaitTermination() may meet)."""
        self._stopping = False
        """Whether :meth:`stop` has begun: a query it stops has not finished by itself."""
        self._stopped = threading.Event()
        """Set when :meth:`stop` has done all it does (the end of the inputs included)."""
        self._schema: Any = None
        """The schema of the micro-batches' rows (an ending batch has none of them)."""
        self.connect = is_connect(spark)
        """Whether ``spark`` is a Spark Connect session: the batches then run in the
        server's Python process, on a copy of this object (see :meth:`__getstate__`)."""
        self._slots: int | None = None
        """A Connect session's ``defaultParallelism``, asked once (it costs a Spark job)."""
        self._shared: str | None = None
        """Over Connect: the folder where the server's copy leaves each batch's progress
        and its failure for this handle (see :meth:`_pull`)."""
        self._server_copy = False
        """Whether this object is the copy a Connect server's ``foreachBatch`` runs."""
        self._delivery: BackgroundDelivery | None = None
        """Delivers committed batches to the sinks off the batch's thread, when every sink
        may run there (:func:`~.sinks.in_background`); None: in the batch's thread."""

    # -- Spark Connect ------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """What a Connect server's ``foreachBatch`` process gets of this query.

        Over Spark Connect, ``foreachBatch(self._on_batch)`` pickles this object
        into a Python process that the server starts: the batches run there,
        on that copy, against the server-side session that Spark hands each
        batch's DataFrame in.  The copy takes the job without its input
        DataFrames and initial rows (client objects), and none of the client's
        session, query handle, locks and threads; it reads its position from
        the store (:meth:`__setstate__`), which both processes share.
        """
        state = dict(self.__dict__)
        job = copying.copy(self.job)
        job.spec = self.spec.for_tasks()
        state["job"], state["spec"] = job, job.spec
        names = ("spark", "query", "_lock", "_thread", "_end_lock", "_stopped", "_watch")
        for name in (*names, "_delivery"):  # (the server's copy delivers in its batch thread)
            state[name] = None
        state["_schema"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """The server-side copy (see :meth:`__getstate__`): its position from the store."""
        self.__dict__.update(state)
        self._thread = batches.BatchThread()
        self._end_lock = threading.Lock()
        self._stopped = threading.Event()
        self._watch = self.job.failure_watch(f"tx.read_failures({str(self.root)!r})")
        self._server_copy = True
        self._resync()

    def _share(self, name: str, payload: Any) -> None:
        """(The server's copy) leave ``payload`` for the client's handle (see :meth:`_pull`)."""
        if not self._server_copy or self._shared is None:
            return
        folder = Path(self._shared)
        folder.mkdir(parents=True, exist_ok=True)
        try:
            data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # (an error whose class does not pickle: its message)
            data = pickle.dumps(TxStreamError(str(payload)))
        write_atomic(folder / name, data)

    def _pull(self) -> None:
        """Take what the Connect server's copy left: batches' progress, the failure.

        The batches of a Connect session run in the server's Python process
        (see :meth:`__getstate__`); this handle learns of them from the store,
        when its methods are called (``status``, ``lastProgress``,
        ``processAllAvailable`` ...).
        """
        if self._shared is None or self._server_copy:
            return
        folder = Path(self._shared)
        for path in sorted(folder.glob("p*.pkl")):  # (batch order: the names are padded)
            progress = pickle.loads(path.read_bytes())
            # (the copy was pickled before Spark's query started: it knew no ids)
            progress.update(id=self.id, runId=self.runId)
            self._progressed(progress, listeners=False)
            path.unlink()
        failure = folder / "failure.pkl"
        if self._failure is None and failure.exists():
            self._error = pickle.loads(failure.read_bytes())
            self._failure = str(self._error)
            self._status = "failed"

    def _resync(self) -> None:
        """Take the last committed batch's position from the store (another process ran it)."""
        committed = self.store.committed()
        self._prev = committed[-1] if committed else -1
        self._tokens = committed_tokens(self.store)
        self._frontier = committed_frontier(self.store)

    def _parallelism(self) -> int:
        """The session's ``defaultParallelism`` (a Connect session's: asked once)."""
        if not self.connect:
            return int(self.spark.sparkContext.defaultParallelism)
        if self._slots is None:
            self._slots = default_parallelism(self.spark)
        return self._slots

    # -- StreamingQuery-like surface -----------------------------------------------
    @property
    def id(self) -> str:
        """The Spark query id."""
        return str(self.query.id) if self.query is not None else ""

    @property
    def runId(self) -> str:
        """The Spark query's run id: new at every start (``id`` stays across restarts)."""
        return str(self.query.runId) if self.query is not None else ""

    @property
    def name(self) -> str:
        """The job name."""
        return self.spec.name

    def _route_expr(self, pid_column: str, routes: list[int] | None = None) -> str:
        array = ", ".join(f"cast({r} as bigint)" for r in (routes or self.routes))
        return f"element_at(array({array}), greatest({pid_column}, 0) + 1)"

    # -- one micro-batch ------------------------------------------------------------
    def _on_batch(self, df: DataFrame, batch_id: int) -> None:
        if self.spark is None and df is not None:  # a Connect server's copy: the batch's session
            self.spark = df.sparkSession
        with self._thread.running():
            self._batches += 1
            try:
                self._run(df, int(batch_id))
            except TxStreamError as exc:
                self._failure = str(exc)
                self._error = exc
                self._status = "failed"
                self._share("failure.pkl", exc)
                # INFO: the caller gets this error as the query's one line (awaitTermination,
                # processAllAvailable, exception()); a WARNING would print it twice.
                log.info("job %r failed in batch %s: %s", self.spec.name, batch_id, exc)
                raise
            except Exception as exc:  # Spark's (the caller gets it as a SparkJobError)
                log.info(
                    "job %r failed in batch %s: %s", self.spec.name, batch_id, decode(exc).line
                )
                raise

    def _run_driver(self, df: DataFrame, batch_id: int, started: float) -> dict[str, Any]:
        names = {spec.index: spec.name for spec in self.spec.inputs.values()}
        cols = df.selectExpr("*", f"{MID_EXPR} as __mid").toArrow().to_pydict()
        events = []
        bad: list[dict[str, Any]] = []
        base = batch_id << MID_BITS
        for k, (inp, ordv, place) in enumerate(
            zip(cols["__input"], cols["__ordv"], cols["__mid"], strict=True)
        ):
            mid = base + place
            row = cols[f"__in{inp}"][k]
            name = names[inp]
            spec = self.spec.inputs[name]
            what = null_field(spec, row)
            odd = None
            if what is None and spec.order is not None and not finite(ordv):
                what, odd = "order value", ordv  # NaN, an infinity (as on executors)
            if what is not None:  # as on executors: reported, not run
                order = [ordv if finite(ordv) else 0.0, inp, mid]
                bad.append(bad_event(batch_id, position(name, mid), mid, order, what, odd))
                continue
            events.append(
                Event((float(ordv or 0.0), inp, mid), name, row, spec.values_of(row), [0])
            )
        upto, self._frontier = self._advance(df)
        counts: dict[str, int] = {}
        if upto is not None:  # the event-time merge, as on executors (held in memory here)
            events = release(self._held, events, upto, self.spec.boundary, self.driver.meta, counts)
        outcome = self.driver.run_batch(batch_id, events, self.job.arrival_fn())
        outcome.failures.extend(bad)
        outcome.aborted += len(bad)
        files: dict[str, list[int]] = {}  # (checksummed as written, never read back)
        for name, lines in outcome.outputs.items():
            files.update(self.store.write_lines("outputs", name, batch_id, "driver", lines))
        if outcome.failures:
            lines = [json.dumps(f, default=str) for f in outcome.failures]
            files.update(self.store.write_lines("errors", "", batch_id, "driver", lines))
        info = {"prev": self._prev, "events": outcome.events, "engine": "driver"}
        self.store.commit(batch_id, info, files)
        log_failures(self.spec.name, batch_id, outcome.failures)
        log_late(self.spec.name, batch_id, counts.get("late", 0))
        stats: dict[str, Any] = outcome.stats()
        stats["held"] = len(self._held.meta.get("held", ()))
        stats["late"] = counts.get("late", 0)
        stats["latency"] = latencies(stats["latency"], time.time())
        return stats

    def _run(self, df: DataFrame, batch_id: int) -> None:
        if self.store.is_committed(batch_id):
            # A replayed batch (or the one that ended the inputs): already committed.
            log.info("job %r batch %d: already committed, skipped", self.spec.name, batch_id)
            return
        started = time.time()
        if self.engine == "driver":
            self.store.clear_uncommitted(batch_id)
            stats = self._run_driver(df, batch_id, started)
            self._prev = batch_id
            self._progressed(self._progress(batch_id, stats, time.time() - started, 1))
            self._watch.after_batch(stats)  # (before a sink can fail)
            self._deliver(batch_id)
            stop_on_error(stats, self.job._on_error)  # (as on executors)
            self._watch.check()
            return
        P = self.partitions
        # An event with keys goes to the partitions of its values, one a copy (its
        # home's), the others markers; forwarding needs the home's row only: the
        # home announces the transaction to the others (forward._Partition.announce),
        # without a row per participant through the shuffle.  A keyless event goes
        # to every partition.
        keyed = "slice(__pids, 1, 1)" if self.forward else "array_distinct(__pids)"
        prepared = (
            df.selectExpr("*", f"{MID_EXPR} as __mid")
            .selectExpr(
                "__input",
                "__ordv",
                *[f"__in{spec.index}" for spec in self.spec.inputs.values()],
                "__pids",
                "__mid",
                f"explode(if(size(__pids) = 0, sequence(0, {P - 1}), {keyed})) as __pid",
            )
            .selectExpr(
                "*",
                "(size(__pids) = 0 or __pid = __pids[0]) as __copy",
                f"{self._route_expr('__pid', self.task_routes)} as __route",
            )
            .repartition(self.tasks, "__route")
        )
        if self._ending:  # its rows: none, one Spark partition per task (all of them run)
            prepared = df
        snapshot_every = self.job._snapshot_every
        gather = self._gathers()
        upto, frontier = (None, self._frontier) if gather else self._advance(df)
        ctx = BatchContext(
            str(self.store.root),
            batch_id,
            self._prev,
            snapshot=batch_id % snapshot_every == 0,
            arrival=self.job.arrival_fn(),
            # Each partition's committed version: a worker whose cached state is
            # that version (or an older one it can catch up from) reuses it.
            tokens=dict(self._tokens),
            partitions=P,
        )
        ctx.release_upto, ctx.frontier = upto, frontier
        if gather:
            ctx.gather = {
                "frontier": self._frontier,
                "idle": self.job._idle_batches,
                "watermarks": self.job._watermarks,
                "nonce": f"{batch_id}-{uuid.uuid4().hex}",  # a folder no earlier run used
            }
        spec = self.spec.for_tasks()
        if self.forward:
            ctx.exchange = {**new_exchange(self.tasks), "nonce": f"x{batch_id}-{uuid.uuid4().hex}"}
        elif spec.may_cross:
            spec.cross_partition = "defer"  # (no barrier stage possible: see _phase1_tasks)
        phases = SparkPhases(spec, prepared, P)
        try:
            stats = run_batch(phases.job, phases, ctx, self.store)
            self.store.drop_transient(batch_id)
        finally:
            for exchange in (ctx.gather, ctx.exchange):
                if exchange is not None:
                    shutil.rmtree(rendezvous_folder(self.store.root, exchange), ignore_errors=True)
        self._prev = batch_id
        self._frontier = ctx.frontier
        self._tokens = dict(ctx.tokens)
        if ctx.snapshot:
            self._trim(batch_id)
        # The batch committed: its progress counts even if a sink then fails.
        self._progressed(self._progress(batch_id, stats, time.time() - started, P))
        self._watch.after_batch(stats)  # (before a sink can fail: they count all the same)
        self._deliver(batch_id)
        stop_on_error(stats, self.job._on_error)
        self._watch.check()

    def _deliver(self, batch_id: int) -> None:
        """Hand committed batch ``batch_id`` to the sinks (queued, when they run in the background).

        The batches before were delivered when they committed, or at start: a
        query whose sink failed stops, and its restart delivers the rest.
        """
        if self._delivery is None:
            deliver(self.store, self.job._sinks, [batch_id])
            return
        try:
            self._delivery.submit(batch_id)
        except TxStreamError as exc:
            self._sink_failed(exc)
            raise

    def _flush(self) -> None:
        """Wait for the sinks to have every committed batch; a sink's failure fails the query."""
        if self._delivery is None:
            return
        try:
            self._delivery.flush()
        except TxStreamError as exc:
            self._sink_failed(exc)  # (the next micro-batch fails with it too)
            raise

    def _sink_failed(self, exc: TxStreamError) -> None:
        """A background sink failed: the query has failed (``exception()``, ``status``)."""
        self._failure, self._error, self._status = str(exc), exc, "failed"

    def _progress(
        self, batch_id: int, stats: dict[str, Any], seconds: float, partitions: int
    ) -> dict[str, Any]:
        """A committed batch's progress entry: the query's ids, then :func:`_progress`'s."""
        ids = {"id": self.id, "runId": self.runId, "name": self.name}
        return {**ids, **_progress(batch_id, stats, seconds, partitions)}

    def _progressed(self, progress: dict[str, Any], listeners: bool = True) -> None:
        """Record a committed batch's progress and tell the job's progress listeners.

        ``recentProgress`` keeps the last ones.  A listener that raises is
        logged and the others still run: the batch has committed whatever it
        does (as Spark's ``StreamingQueryListener`` failures are logged).
        """
        self._committed += 1
        self.recentProgress.append(progress)
        del self.recentProgress[:-RECENT]
        log.info(
            "job %r batch %d committed: %d events, %d committed, %d aborted, %d deferred, "
            "%d held, %d ms",
            self.name,
            progress.get("batchId", -1),
            progress.get("numInputRows", 0),
            progress.get("committed", 0),
            progress.get("aborted", 0),
            progress.get("deferred", 0),
            progress.get("held", 0),
            progress.get("durationMs", 0),
        )
        if progress.get("held"):
            log.debug(
                "job %r batch %d: %d event(s) held by the event-time merge for later batches",
                self.name,
                progress.get("batchId", -1),
                progress["held"],
            )
        # Over Connect the server's copy runs the listeners, and leaves the progress here.
        self._share(f"p{progress.get('batchId', 0):012d}.pkl", progress)
        for listener in self.job._progress_listeners if listeners else ():
            try:
                listener(copying.deepcopy(progress))
            except Exception as exc:
                log.warning(
                    "job %r batch %d: progress listener %s raised %s: %s",
                    self.name,
                    progress.get("batchId", -1),
                    getattr(listener, "__qualname__", listener),
                    type(exc).__name__,
                    exc,
                )

    def _gathers(self) -> bool:
        """Whether the phase-1 tasks find the event-time merge's frontier themselves.

        They do in a barrier stage, where Spark starts every task at once so that
        they can wait for each other (see :func:`_gathered_release`): one Spark
        job and one read of the batch less than :meth:`_advance`.  That needs a
        task slot for every partition, and no dynamic allocation.
        """
        if self._merge != "event-time" or self._ending:
            return False
        if self._barrier is None:
            dynamic = conf_get(self.spark, "spark.dynamicAllocation.enabled", "false") == "true"
            self._barrier = not dynamic and self.tasks <= self._parallelism()
        return self._barrier

    def _advance(self, df: DataFrame) -> tuple[Bound | None, dict[str, Any]]:
        """The batch's release frontier under the event-time merge (None: batch order)."""
        if self._merge != "event-time":
            return None, {}
        if self._ending:  # (no rows: every input ends)
            return ended(self._frontier, self.job._idle_batches)
        F = functions(self.spark)

        names = {spec.index: spec.name for spec in self.spec.inputs.values()}
        # Spark's max takes NaN as the largest double: NaN and the infinities are
        # reported, not run (see _phase1_outputs), and must not move the frontier.
        ordv = F.col("__ordv")
        usable = F.when(~F.isnan(ordv) & (F.abs(ordv) != float("inf")), ordv)
        rows = df.groupBy("__input").agg(F.max(usable)).collect()
        seen = {names[int(r[0])]: float(r[1]) for r in rows if r[1] is not None}
        index = {spec.name: spec.index for spec in self.spec.inputs.values()}
        return advance(self._frontier, seen, self.job._idle_batches, index, self.job._watermarks)

    def _trim(self, batch_id: int) -> None:
        snaps = []
        state_dir = self.store.root / "state"
        for pdir in state_dir.glob("p*"):
            snaps = sorted(
                int(p.stem.split("-")[1])
                for p in pdir.glob("snap-*.bin")
                if int(p.stem.split("-")[1]) <= batch_id
            )
            if len(snaps) >= 2:
                self.store.trim(int(pdir.name[1:]), snaps[-2])


def _progress(
    batch_id: int, stats: dict[str, Any], seconds: float, partitions: int
) -> dict[str, Any]:
    latency = {int(k): v for k, v in stats["latency"].items()}
    total = sum(latency.values())

    def pct(q: float) -> float | None:
        if not total:
            return None
        need, seen = q * total, 0
        for ms in sorted(latency):
            seen += latency[ms]
            if seen >= need:
                return (ms + 1) / 1000
        return None

    return {
        "batchId": batch_id,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "numInputRows": stats["events"],
        "committed": stats["committed"],
        "aborted": stats["aborted"],
        "deferred": stats["deferred"],
        # Transactions run at their home with rows forwarded (see forward/), the
        # messages between partitions, and the bytes of those between tasks.
        "multiPartition": {
            "transactions": stats.get("forwarded", 0),
            "messages": stats.get("messages", 0),
            "bytes": stats.get("message_bytes", 0),
            "waitMs": stats.get("wait_ms", 0),
        },
        "held": stats.get("held", 0),
        # Events that ran after later ones had run (see tasks.release): out of order.
        "late": stats.get("late", 0),
        "failed": len(stats["failures"]),
        "durationMs": round(seconds * 1000),
        "partitions": partitions,
        "phase1Ms": round(stats.get("phase1_s", 0.0) * 1000),
        "deferredPhasesMs": round(stats.get("deferred_s", 0.0) * 1000),
        "latency": {"p50": pct(0.5), "p99": pct(0.99), "max": pct(1.0)},
        "latencyHistogramMs": stats["latency"],
    }
