"""The query handle of a job running on Spark: :class:`TxQuery`.

Each micro-batch (``foreachBatch``) goes through Spark jobs that
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

Beside it: the inputs' checks before Spark starts
(:mod:`~txstream.spark.runtime.inputs`), Spark's checkpoint logs reconciled with
txstream's markers (:mod:`~txstream.spark.runtime.commitlog`), and Spark's own
failures as one line (:mod:`~txstream.spark.runtime.spark_errors`).  Called on
the driver: the user's thread for the public methods, Spark's ``foreachBatch``
thread for the batches.
"""

from __future__ import annotations

import contextlib
import copy as copying
import io
import json
import logging
import pickle
import shutil
import threading
import time
import uuid
import warnings
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from txstream.errors import TxStreamError
from txstream.spark import batches
from txstream.spark.connect import conf_get, default_parallelism, functions, is_connect
from txstream.spark.runtime.base import (
    JobSpec,
    RuntimeJobError,
    bad_event,
    finite,
    initial_row,
    null_field,
)
from txstream.spark.runtime.boundaries import MID_BITS, Event, position
from txstream.spark.runtime.commitlog import (
    forward_spark_log,
    reconcile_commit_log,
    spark_log_ends,
)
from txstream.spark.runtime.errors import SparkJobError
from txstream.spark.runtime.executor import latencies
from txstream.spark.runtime.failures import log_failures, log_late
from txstream.spark.runtime.forward import forwarding, new_exchange
from txstream.spark.runtime.inputs import check_inputs, order_value
from txstream.spark.runtime.merge import Bound, advance, ended
from txstream.spark.runtime.partitioning import partition_of, spark_routes, sql_partition
from txstream.spark.runtime.restart import first_meta, job_shape, restarted_meta
from txstream.spark.runtime.results import DRIVER_HISTORY
from txstream.spark.runtime.sinks import BackgroundDelivery, deliver, in_background
from txstream.spark.runtime.spark_errors import decode
from txstream.spark.runtime.spark_tasks import (
    MID_EXPR,
    SparkPhases,
    add_initial,
    as_dataframe,
    init_writer,
    plain_rows,
    rendezvous_folder,
)
from txstream.spark.runtime.state import (
    PartitionState,
    RuntimeStore,
    usable_directory,
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
ENGINES = ("executors", "driver")


STOP_WAIT_S = batches.STOP_WAIT_S
"""How long :meth:`TxQuery.stop` waits for the micro-batch in flight before stopping anyway."""


class TxQuery:
    """A running job: the handle :meth:`Job.start` returns, shaped like a StreamingQuery.

    Every method works on a running Spark query, so the examples need a live
    Spark session (they are not run by the test suite; ``Job.run_local`` runs
    the same job without one):

    >>> import txstream as tx
    >>> from txstream.spark.session import local_session
    >>> spark = local_session("bank", cores=2)                          # doctest: +SKIP
    >>> deposits = spark.readStream.schema("acct long, amount long").json("in/")  # doctest: +SKIP
    >>> query = (tx.Job("bank").table("accounts", key="acct")           # doctest: +SKIP
    ...          .input("deposits", deposits, keys="acct")
    ...          .on("deposits", lambda t, e: t.upsert("accounts", e))
    ...          .trigger(availableNow=True)
    ...          .start(checkpoint="ckpt/bank"))
    >>> query.processAllAvailable()                                     # doctest: +SKIP
    >>> query.status["committedBatches"] > 0, query.isActive            # doctest: +SKIP
    (True, False)
    >>> query.stop()                                                    # doctest: +SKIP
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

    def exception(self) -> TxStreamError | None:
        """The error that stopped the query, as it would be raised (None: none).

        As ``StreamingQuery.exception()``: a batch's own error keeps its class
        (``GroupOrderError``, ``InputFailingError`` ...); a failure of Spark's is
        a :class:`~txstream.SparkJobError` whose ``__cause__`` is PySpark's
        exception.

        >>> query.exception()                                    # doctest: +SKIP
        InputFailingError("input 'readings': all 20 of its transactions ...")
        """
        spark_error = self.query.exception() if self.query is not None else None
        self._pull()
        if self._failure:
            error = self._failed()
        elif spark_error is None:
            return None
        else:
            error = self._spark_error("failed", spark_error)
        error.__cause__ = spark_error  # (as raise ... from: PySpark's exception, if any)
        return error

    def explain(self, extended: bool = False) -> None:
        """Print what the job is and, once it ran a batch, Spark's plan of its stream.

        The job: engine, partitions and phase-1 tasks, merge and boundary,
        cross-partition mode, each input (keys, order column, Spark's
        streaming source), table (key, partitioning, columns), output (columns,
        sinks).  Then Spark's ``StreamingQuery.explain(extended)``: the plan
        of the last micro-batch's read of the inputs (Spark has none before
        the first batch); each batch's own Spark jobs are in the Spark UI.

        >>> query.explain()                                      # doctest: +SKIP
        txstream job 'bank' (id 6c1f..., runId 0a9e...)
          engine executors, 2 partitions, 2 phase-1 tasks, merge batch, ...
        """
        print(self._describe(extended))

    def _describe(self, extended: bool) -> str:
        spec = self.spec
        boundary = getattr(spec.boundary, "name", type(spec.boundary).__name__)
        lines = [
            f"txstream job {spec.name!r} (id {self.id or '-'}, runId {self.runId or '-'})",
            f"  engine {self.engine}, {self.partitions} partitions, {self.tasks} phase-1 tasks, "
            f"merge {self._merge}, boundary {boundary}, cross-partition "
            f"{'forward' if self.forward else spec.cross_partition}, "
            f"trigger {self.job._trigger}",
        ]
        for inp in spec.inputs.values():
            keys = " | ".join(",".join(group) for group in inp.keys) or "-"
            order = f", order {inp.order}" if inp.order else ""
            wm = self.job._watermarks.get(inp.name)
            watermark = f", watermark {wm:g}" if wm is not None else ""
            source = "streaming DataFrame" if getattr(inp.source, "isStreaming", False) else "-"
            lines.append(f"  input {inp.name}: keys {keys}{order}{watermark} ({source})")
        for table in spec.tables.values():
            columns = ", ".join(f"{c} {t}" for c, t in (table.columns or {}).items())
            lines.append(
                f"  table {table.name}: key {','.join(table.key)}, partitioned by "
                f"{','.join(table.partition_by)}" + (f" ({columns})" if columns else "")
            )
        for out in spec.outputs.values():
            columns = ", ".join(f"{c} {t}" for c, t in (out.columns or {}).items())
            sinks = [
                getattr(sink, "__qualname__", type(sink).__name__)
                for sink in self.job._sinks.get(out.name, [])
            ]
            lines.append(
                f"  output {out.name}"
                + (f" ({columns})" if columns else "")
                + (f", sinks {', '.join(sinks)}" if sinks else "")
            )
        lines.append(f"  checkpoint {self.root}")
        plan = ""
        if self.query is not None:
            buffer = io.StringIO()
            with contextlib.redirect_stdout(buffer):  # (Spark's explain prints)
                self.query.explain(extended)
            plan = buffer.getvalue().strip()
        lines.append("Spark's plan of the stream's last micro-batch:")
        lines.append(plan if plan and "No physical plan" not in plan else "  (no batch yet)")
        return "\n".join(lines)

    @property
    def isActive(self) -> bool:
        """Whether the job runs."""
        return self.query is not None and bool(self.query.isActive)

    @property
    def status(self) -> dict[str, Any]:
        """What the job is doing now."""
        self._pull()
        return {
            "message": self._status,
            "isActive": self.isActive,
            "committedBatches": self._committed,
            "failure": self._failure,
        }

    @property
    def lastProgress(self) -> dict[str, Any] | None:
        """The last committed batch: ids, counts, latency percentiles, duration.

        >>> query.lastProgress["batchId"], query.lastProgress["committed"]  # doctest: +SKIP
        (0, 2)
        """
        self._pull()
        return self.recentProgress[-1] if self.recentProgress else None

    def processAllAvailable(self) -> None:
        """Block until every available input has been processed and committed.

        A bounded run (``trigger(availableNow=True)`` or ``once``) then waits
        for the query to finish and ends the inputs (see :meth:`stop`); a
        continuously running query goes on, and a :meth:`stop` right after
        this call ends them.

        Warns (:class:`~txstream.spark.runtime.failures.TransactionFailuresWarning`)
        with the number of transactions that failed since the last warning, if any;
        as do :meth:`awaitTermination` and :meth:`stop`.

        >>> query = job.start(checkpoint="ckpt/job")    # doctest: +SKIP
        >>> query.processAllAvailable()                  # doctest: +SKIP
        >>> query.output("alerts")                       # doctest: +SKIP
        [{'device': 'd1', 'celsius': 31.5}]
        """
        try:
            query = self._spark_query()
            self._wrap(query.processAllAvailable)
            if self._bounded():
                self._wrap(query.awaitTermination)
                self._flush()  # (a sink's failure fails the run before its inputs end)
                self._end_if_finished()
            else:
                self._drained = self._batches
            self._flush()
        finally:
            self._pull()
            self._watch.warn(stacklevel=3)

    def awaitTermination(self, timeout: float | None = None) -> bool | None:
        """Wait for the job to end (as ``StreamingQuery.awaitTermination``); warns as above.

        When a bounded run (``availableNow``, ``once``) has finished, its inputs
        end first (see :meth:`stop`).

        >>> query = job.trigger(availableNow=True).start(checkpoint="ckpt/job")  # doctest: +SKIP
        >>> query.awaitTermination(timeout=60)                                   # doctest: +SKIP
        True
        """
        try:
            query = self._spark_query()
            if timeout is None:
                done = self._wrap(query.awaitTermination)
            else:
                # (typed int by PySpark, which takes seconds as a float all the same)
                done = self._wrap(lambda: query.awaitTermination(timeout))  # type: ignore[arg-type]
            if self._stopping and not self._thread.inside():
                # A stop (a sink's, in a thread of its own) stopped Spark's query
                # and may still be ending the inputs: the caller reads the outputs next.
                self._stopped.wait(timeout)
            elif self._bounded():
                self._flush()  # (as in processAllAvailable)
                self._end_if_finished()
            if done is not False:  # (ended, not timed out)
                self._flush()
            return done  # type: ignore[no-any-return]
        finally:
            self._pull()
            self._watch.warn(stacklevel=3)

    def _spark_query(self) -> StreamingQuery:
        """Spark's query running the job (a one-line error before the job started)."""
        if self.query is None:
            raise RuntimeJobError(f"job {self.name!r} has not started: call job.start(...) first")
        return self.query

    def _bounded(self) -> bool:
        """Whether the trigger runs over what the inputs hold at the start, then stops."""
        trigger = self.job._trigger
        return bool(trigger.get("availableNow") or trigger.get("once"))

    def _finished(self) -> bool:
        """Whether Spark's query ended by itself (a bounded run's end), without a failure."""
        return (
            self.query is not None
            and not self.query.isActive
            and self._failure is None
            and self.query.exception() is None
        )

    def _end_if_finished(self) -> None:
        """End the inputs of a bounded run that has finished by itself (not by :meth:`stop`)."""
        if not self._stopping and self._finished():
            self._end_inputs()

    def stop(self, settle_s: float = 0.0, end_inputs: bool | None = None) -> None:
        """Stop the job and give the store up (the driver engine writes its history first).

        The micro-batch in flight finishes first (for at most :data:`STOP_WAIT_S`):
        stopped under it, Spark cancels the jobs it started, and its check of
        the long error that comes back overflows the JVM's stack (a thousand
        lines on stderr after Ctrl-C).  ``settle_s``: wait up to that long for
        the job to read what its input holds, when that input has stopped
        growing (a batch could otherwise start just before the stop).  Either
        way an unfinished batch re-runs on restart; this spares the noise.

        Called from the batch itself (a sink, which runs in the batch's thread),
        it cannot wait for that batch, nor stop Spark's query from the query's
        own thread (Spark would wait for the thread to end, which is waiting for
        it): it returns at once, and the job stops in a thread of its own as soon
        as the batch has finished (``awaitTermination()`` returns then).

        Under the event-time merge, ``end_inputs`` says whether the inputs end
        (:meth:`_end_inputs`: the events held for later ones run in one more
        committed batch).  By default (None) they end when the run read all its
        input: a bounded run (``availableNow``, ``once``) that finished, or a
        query stopped right after :meth:`processAllAvailable` returned (no
        micro-batch since).  A continuously running query stopped otherwise is
        paused, not ended: its held events stay in the checkpoint and run after
        a restart once the inputs move past them (events below the frontier of an
        ended input would be late), and a warning counts them.  ``True``: read
        what the inputs hold now (``processAllAvailable``), stop, and end them;
        ``False``: never end them.

        >>> query.processAllAvailable()            # doctest: +SKIP
        >>> query.stop()                           # doctest: +SKIP
        >>> query.isActive                         # doctest: +SKIP
        False
        """
        try:
            stop = partial(self._stop, settle_s, end_inputs)
            self._thread.stop(stop, name=f"stop {self.name}")
        finally:
            self._pull()
            self._watch.warn(stacklevel=3)

    def _stop(self, settle_s: float, end_inputs: bool | None = None) -> None:
        end = False
        try:
            if self.query is not None:
                if end_inputs and self.query.isActive and self._status != "stopped":
                    self._wrap(self.query.processAllAvailable)
                    self._drained = self._batches
                finished = self._bounded() and self._finished() and not self._stopping
                self._stopping = True
                deadline = time.time() + settle_s
                while time.time() < deadline and self._busy():
                    time.sleep(0.05)
                self._thread.wait_idle(STOP_WAIT_S)
                self.query.stop()
                drained = self._drained == self._batches  # no micro-batch since the drain
                end = end_inputs if end_inputs is not None else finished or drained
            if end:
                self._end_inputs()
            self._flush()
            if self.driver is not None and self.spec.record_history:
                from txstream.model import format_history

                # Recorded in the transaction manager's memory (the engine cannot
                # resume, so one file per run): `txstream check` reads it.
                text = format_history(self.driver.tm.history()) + "\n"
                write_atomic(self.store.root / DRIVER_HISTORY, text.encode())
        finally:
            if self._delivery is not None:
                self._delivery.close()  # (before the store is given up: it writes there)
            if self._shared is not None:
                self._pull()
                shutil.rmtree(self._shared, ignore_errors=True)
            self._lock.release()
            self._status = "stopped"
            self._stopped.set()
        held = (self.lastProgress or {}).get("held", 0)
        log.info(
            "job %r stopped after %d committed batch(es) of this run%s",
            self.spec.name,
            self._committed,
            f"; {held} event(s) held by the event-time merge stay in the checkpoint"
            if held
            else "",
        )
        if held:
            warnings.warn(
                f"job {self.spec.name!r} stopped with {held} event(s) held by the event-time "
                "merge: they stay in the checkpoint and run when a later event arrives on "
                "every input still delivering; stop(end_inputs=True) ends the inputs "
                "(see docs/spark.md, merge)",
                stacklevel=4,  # (the caller of stop(), through BatchThread.stop)
            )

    def _end_inputs(self) -> None:
        """End every input: one more committed batch, without events, that releases all held.

        It runs once Spark's query has stopped, as batch ``n + 1`` after Spark's
        last batch ``n``, and only when Spark's checkpoint has committed every
        batch it planned (a batch planned and not run holds input that has
        not ended).  Its commit marker says so (``frontier["ended"]``); Spark's
        checkpoint then records it as a batch without input (offsets and
        commit of ``n`` copied to ``n + 1``, :func:`forward_spark_log`), so
        that a restart goes on with batch ``n + 2``.  A crash before the marker
        leaves the events held (a later end runs the batch); a crash after it,
        before Spark's checkpoint records the batch, is completed at the next
        start (:func:`reconcile_commit_log`).
        """
        with self._end_lock:
            if self._status != "stopped":  # (a stopped query gave the store up)
                self._end_locked()

    def _end_locked(self) -> None:
        if self._merge != "event-time" or self._failure is not None:
            return
        committed = self.store.committed()
        if not committed:
            return
        last = committed[-1]
        if self.engine == "driver":
            held = len(self._held.meta.get("held", ()))
        else:
            held = int(self.store.commit_info(last).get("held", 0))
        spark_dir = self.root / "spark"
        if not held or spark_log_ends(spark_dir) != (last, last):
            return
        batch = last + 1
        # One Spark partition per phase-1 task, without a row: under the event-time
        # merge each task runs the partitions it hosts (see _phase1_outputs).
        if self.connect:  # (no RDDs; the batches before ran in the server's process)
            F = functions(self.spark)
            self._pull()
            self._resync()
            # (measured on 4.3: behind a filter on rand() the task function was not
            # called at all, behind this one it runs once per partition)
            empty = self.spark.range(self.tasks, numPartitions=self.tasks).where(F.col("id") < 0)
        else:
            sc = self.spark.sparkContext
            empty = self.spark.createDataFrame(sc.parallelize([], self.tasks), self._schema)
        self._ending = True
        try:
            self._run(empty, batch)
        except TxStreamError:
            raise
        except Exception as exc:
            raise self._spark_error("could not end its inputs", exc) from exc
        finally:
            self._ending = False
            if self.store.is_committed(batch):  # (also when a sink or onError=stop raised)
                forward_spark_log(spark_dir, batch)

    def _busy(self) -> bool:
        """Whether Spark runs a batch of the job or has input for one."""
        query = self._spark_query()
        if not query.isActive:
            return False
        status = query.status
        return bool(status["isTriggerActive"] or status["isDataAvailable"])

    def output(self, name: str) -> list[dict[str, Any]]:
        """Committed rows of output ``name``, in order (as ``tx.read_output`` on the checkpoint).

        >>> query.output("alerts") == tx.read_output("ckpt/job", "alerts")   # doctest: +SKIP
        True
        """
        from txstream.spark.runtime.results import read_output

        if name not in self.spec.outputs:
            raise RuntimeJobError(
                f"job {self.name!r} declared no output {name!r}; "
                f"outputs: {', '.join(self.spec.outputs) or '-'}"
            )
        if not self.store.committed():  # (the driver engine writes no job.json)
            return []
        return read_output(self.store.root, name)

    def output_stream(self, name: str) -> DataFrame:
        """Output ``name``'s committed rows as a streaming DataFrame, for any Spark sink.

        The output needs a declared schema (the stream's) and a
        :class:`~txstream.spark.runtime.sinks.FolderSink`; the DataFrame is a
        file source on its folder, which holds only committed batches, each
        once: a downstream query with Spark's exactly-once file sink writes
        every committed row once.  Call it on the session the query runs on.

        >>> import txstream as tx
        >>> job = tx.Job().input("ev", None, keys="k").output("seen", schema="k long")
        >>> job.sink("seen", tx.FolderSink("out/seen"))._plan_output_stream("seen")
        (PosixPath('out/seen'), '`k` long')
        """
        folder, ddl = self.job._plan_output_stream(name)
        spark = self.spark
        if spark is None:
            raise RuntimeJobError(f"output_stream({name!r}): the query has no Spark session")
        return spark.readStream.schema(ddl).json(str(folder))

    def failures(self) -> list[dict[str, Any]]:
        """Transactions rolled back so far, with their input positions (as ``tx.read_failures``).

        >>> [(f["position"], f["error"]) for f in query.failures()]   # doctest: +SKIP
        [('signups#1', "DuplicateKeyError: insert into users: key 'ada' exists")]
        """
        from txstream.spark.runtime.results import read_failures

        if not self.store.committed():
            return []
        return read_failures(self.store.root)

    def _wrap(self, call: Any) -> Any:
        try:
            return call()
        except Exception as exc:
            # One line, and PySpark's exception as the cause (raise ... from exc).
            self._pull()
            if self._failure:
                raise self._failed() from exc
            raise self._spark_error("failed", exc) from exc

    def _spark_error(self, what: str, exc: BaseException) -> SparkJobError:
        """Spark's failure ``exc`` as one line (PySpark's condition kept, see :func:`decode`)."""
        failure = decode(exc)
        return SparkJobError(f"job {self.name!r} {what}: {failure.line}", failure.condition)

    def _failed(self) -> TxStreamError:
        """The error that failed a batch, as its own class (``GroupOrderError`` ...), one line."""
        message = self._failure or ""
        if self._error is not None:
            try:
                error = copying.copy(self._error)  # a fresh one: no traceback of Spark's thread
            except Exception:  # an exception class that cannot be copied: its message
                return TxStreamError(message)
            if str(error) == message:
                return error
        return TxStreamError(message)

    # -- start --------------------------------------------------------------------------
    @classmethod
    def start(
        cls,
        job: Job,
        root: Path,
        spark: SparkSession | None,
        partitions: int | None,
        engine: str = "executors",
    ) -> TxQuery:
        """Check the inputs, load initial tables on first start, start the stream."""
        if engine not in ENGINES:
            raise RuntimeJobError(f"unknown engine {engine!r}; choose one of: {', '.join(ENGINES)}")
        meta_path = root / "txstream" / "job.json"
        if (root / "commits").is_dir() or (root / "job.json").exists():
            raise RuntimeJobError(
                f"{root} is a store of run_local, not a Spark checkpoint; start the job on "
                "a checkpoint of its own"
            )
        store = RuntimeStore(root / "txstream")
        meta = store.job_meta("spark")
        if meta is not None:
            if partitions is not None and partitions != meta["partitions"]:
                raise RuntimeJobError(
                    f"checkpoint {root} was started with {meta['partitions']} partitions; "
                    "restart with the same number or a new checkpoint"
                )
            partitions = int(meta["partitions"])
        key_types = check_inputs(job)
        shape = job_shape(job.spec, job.merge_for("start"), key_types, job._watermarks)
        if meta is not None and engine != "driver":  # (the driver engine does not resume)
            meta = restarted_meta(store, meta, shape, job.spec, f"checkpoint {root}")
        usable_directory(root, "checkpoint")
        if spark is None:
            from txstream.spark.session import local_session

            spark = local_session()
        root.mkdir(parents=True, exist_ok=True)
        if engine == "driver" and is_connect(spark):
            raise RuntimeJobError(
                "the driver engine keeps its tables in the client's memory, which a Spark "
                "Connect session's batches cannot reach; use engine='executors' (the default)"
            )
        # (a Connect session's may cost a Spark job: asked once, kept for the server's copy)
        slots = default_parallelism(spark) if partitions is None or is_connect(spark) else None
        partitions = partitions or slots
        assert partitions is not None
        self = cls(job, root, spark, partitions, engine)
        if self.connect:
            self._slots = slots
        try:
            if any(q.name == job.spec.name for q in spark.streams.active):
                # Spark would refuse it only after the routes and initial rows, and
                # the refused start left the running query's thread to die of a
                # StackOverflowError when it stopped.
                raise RuntimeJobError(
                    f"job {job.spec.name!r} is already running in this Spark session (a "
                    "query of that name is active): stop it first, or give this job "
                    "another name, tx.Job(name)"
                )
            self._routes()
            if engine == "driver":
                self._start_driver()
            else:
                if meta is not None:  # a restart: the store and Spark's log must agree
                    self.store.check_state()
                    reconcile_commit_log(self.store, root / "spark")
                if not self.store.committed():  # (again after a start that committed nothing)
                    self._load_initial()
                if meta is None:
                    meta = first_meta(self.spec, partitions, "spark", shape)
                # Rewritten on every start: read_output knows the outputs added since.
                write_atomic(meta_path, json.dumps(meta).encode())
            redelivered = deliver(self.store, job._sinks)  # batches committed before a crash
            if redelivered:
                log.info(
                    "job %r recovery: %d committed batch(es) delivered to sinks at start "
                    "(not delivered before the last stop)",
                    job.spec.name,
                    redelivered,
                )
            if in_background(job._sinks) and not self.connect:
                self._delivery = BackgroundDelivery(self.store, job._sinks, job.spec.name)
            self._start_stream()
        except TxStreamError:
            self._lock.release()
            raise
        except Exception as exc:
            self._lock.release()
            raise self._spark_error("could not start", exc) from exc
        return self

    def _routes(self) -> None:
        # Computed in Python: a Spark job here cost 2-3 s of the start (the
        # session's first job warms up the JVM).
        self.routes = spark_routes(self.partitions)
        self.tasks = self._phase1_tasks()
        if self.tasks < self.partitions:
            # Phase-1 task q hosts partitions q, q + tasks, ... (see forward.py).
            mine = spark_routes(self.tasks)
            self.task_routes = [mine[p % self.tasks] for p in range(self.partitions)]
        else:
            self.task_routes = list(self.routes)

    def _phase1_tasks(self) -> int:
        """How many phase-1 tasks a batch has: one per partition, or one per task slot.

        A job whose transactions can span partitions forwards rows between the
        phase-1 tasks (see :mod:`.forward`), which must then all run at once: a
        barrier stage of at most one task per slot, each hosting whole
        partitions.  Without slots for that (dynamic allocation), such
        transactions are deferred to phases 2 and 3 instead.
        """
        self.forward = False
        if not (self.spec.may_cross and forwarding(self.spec)):
            return self.partitions
        if conf_get(self.spark, "spark.dynamicAllocation.enabled", "false") == "true":
            return self.partitions
        self.forward = True
        return max(1, min(self.partitions, self._parallelism()))

    def _route_expr(self, pid_column: str, routes: list[int] | None = None) -> str:
        array = ", ".join(f"cast({r} as bigint)" for r in (routes or self.routes))
        return f"element_at(array({array}), greatest({pid_column}, 0) + 1)"

    def _load_initial(self) -> None:
        for table in self.spec.tables.values():
            if table.initial is None:
                continue
            if plain_rows(table.initial):
                # A list of plain rows goes to the store from here: through Spark
                # (a DataFrame, a shuffle, Python workers) it took 8 s of the start.
                by_pid: dict[int, dict[Any, dict[Any, Any]]] = {}
                for row in table.initial:
                    if table.columns is not None:  # as below: missing columns are null
                        row = {**dict.fromkeys(table.columns), **row}
                    key = table.key_of(initial_row(table, row))
                    value = table.value_of_key(key)
                    add_initial(by_pid, partition_of(value, self.partitions), table, key, row)
                for pid, values in by_pid.items():
                    self.store.write_init(pid, table.name, values)
                continue
            df = as_dataframe(self.spark, table.initial, table.name)
            missing = [c for c in table.key if c not in df.columns]
            if missing:
                raise RuntimeJobError(
                    f"table {table.name!r}: initial rows lack key columns {missing}"
                )
            df = df.selectExpr(
                "to_json(struct(*)) as payload",
                f"{sql_partition(table.partition_by, self.partitions)} as pid",
            ).selectExpr("payload", "pid", f"{self._route_expr('pid')} as route")
            write = init_writer(str(self.store.root), replace(table, initial=None))
            df.repartition(self.partitions, "route").mapInArrow(write, "n long").collect()

    def _start_stream(self) -> None:
        F = functions(self.spark)

        # One schema for all inputs (a union needs it): each input's rows travel
        # as a struct column of their own (__in<i>), null in the other inputs'
        # rows, so they reach Python as dicts through Arrow, with their types.
        specs = list(self.spec.inputs.values())
        structs = {s.index: F.struct(*[F.col(f"`{c}`") for c in s.source.columns]) for s in specs}
        types = {
            s.index: s.source.select(structs[s.index].alias("x")).schema["x"].dataType
            for s in specs
        }
        parts = []
        for spec in specs:
            df = spec.source
            pids = [sql_partition(group, self.partitions) for group in spec.keys]
            order = (
                order_value(spec.order, df.schema[spec.order].dataType)
                if spec.order
                else "cast(0 as double)"
            )
            payloads = [
                (structs[j] if j == spec.index else F.lit(None).cast(types[j])).alias(f"__in{j}")
                for j in sorted(types)
            ]
            placed = f"array({', '.join(pids)})" if pids else "array()"
            if spec.broadcast is not None:  # an empty array: every partition gets a copy
                placed = f"if(coalesce(`{spec.broadcast}`, false), array(), {placed})"
            parts.append(
                df.select(
                    F.lit(spec.index).alias("__input"),
                    F.expr(order).alias("__ordv"),
                    *payloads,
                    F.expr(placed).cast("array<int>").alias("__pids"),
                )
            )
        union = parts[0]
        for part in parts[1:]:
            union = union.unionByName(part)
        self._schema = union.schema
        if self.connect:  # (before foreachBatch pickles this object: see __getstate__)
            # An earlier run's folder (a crash) is nobody's now: this run holds the store.
            shutil.rmtree(self.store.root / "connect", ignore_errors=True)
            self._shared = str(self.store.root / "connect" / uuid.uuid4().hex)
        writer = (
            union.writeStream.queryName(self.spec.name)
            .option("checkpointLocation", str(self.root / "spark"))
            .foreachBatch(self._on_batch)
            .trigger(**self.job._trigger)
        )
        self._status = "running"
        self.query = writer.start()
        committed = self.store.committed()
        log.info(
            "job %r started (id %s, runId %s): engine %s, %d partitions, %s",
            self.spec.name,
            self.id,
            self.runId,
            self.engine,
            self.partitions,
            f"resuming after committed batch {committed[-1]}" if committed else "a new checkpoint",
        )

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

    def _start_driver(self) -> None:
        from txstream.spark.runtime.driver import DriverEngine

        if self.store.committed():
            raise RuntimeJobError(
                "the driver engine keeps its tables in memory and cannot resume a checkpoint; "
                "use a new checkpoint (or the executors engine)"
            )
        self.driver = DriverEngine(self.spec)
        for table in self.spec.tables.values():
            if table.initial is not None:
                df = as_dataframe(self.spark, table.initial, table.name)
                self.driver.load(
                    table.name,
                    [json.loads(r[0]) for r in df.selectExpr("to_json(struct(*))").collect()],
                )

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
        prepared = (
            df.selectExpr("*", f"{MID_EXPR} as __mid")
            .selectExpr(
                "__input",
                "__ordv",
                *[f"__in{spec.index}" for spec in self.spec.inputs.values()],
                "__pids",
                "__mid",
                f"explode(if(size(__pids) = 0, sequence(0, {P - 1}), array_distinct(__pids))) "
                "as __pid",
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
        # Transactions run at their home with rows forwarded (see forward.py), the
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
