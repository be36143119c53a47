"""The query handle of a job running on Spark: :class:`TxQuery`.

The handle is what :meth:`Job.start <txstream.spark.runtime.job.Job.start>`
returns, shaped like a StreamingQuery: the start (:meth:`TxQuery.start`), the
public surface (status, progress, outputs, failures, explain) and the stop,
with the end of the inputs under the event-time merge.  Its bases hold the
rest: :class:`~txstream.spark.runtime.query_start.QueryStart` sets the stream up,
:class:`~txstream.spark.runtime.query_batches.QueryBatches` keeps the state and
runs each micro-batch.

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
import logging
import shutil
import time
import warnings
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from txstream.errors import TxStreamError
from txstream.spark import batches
from txstream.spark.connect import default_parallelism, functions, is_connect
from txstream.spark.runtime.base import RuntimeJobError
from txstream.spark.runtime.commitlog import (
    forward_spark_log,
    reconcile_commit_log,
    spark_log_ends,
)
from txstream.spark.runtime.errors import SparkJobError
from txstream.spark.runtime.inputs import check_inputs
from txstream.spark.runtime.query_batches import RECENT, QueryBatches
from txstream.spark.runtime.query_start import QueryStart
from txstream.spark.runtime.restart import first_meta, job_shape, restarted_meta
from txstream.spark.runtime.results import DRIVER_HISTORY
from txstream.spark.runtime.sinks import BackgroundDelivery, deliver, in_background
from txstream.spark.runtime.spark_errors import decode
from txstream.spark.runtime.spark_tasks import SparkPhases
from txstream.spark.runtime.state import (
    RuntimeStore,
    usable_directory,
    write_atomic,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from txstream.spark.runtime.job import Job


# Re-exported: scripts/runtime-batch-overhead.py times these through this module.
__all__ = [
    "ENGINES",
    "RECENT",
    "STOP_WAIT_S",
    "QueryBatches",
    "QueryStart",
    "RuntimeStore",
    "SparkPhases",
    "TxQuery",
]

log = logging.getLogger("txstream.runtime")
"""The runtime's logger (quiet unless the application configures logging)."""

ENGINES = ("executors", "driver")


STOP_WAIT_S = batches.STOP_WAIT_S
"""How long :meth:`TxQuery.stop` waits for the micro-batch in flight before stopping anyway."""


class TxQuery(QueryStart):
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
                self.store.write_job_record(meta)
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
