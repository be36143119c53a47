"""The Spark side of the runtime: a job's micro-batches become tasks on executors.

Each micro-batch (``foreachBatch``) goes through these Spark jobs; the driver
touches only per-task counters, never an event:

1. the batch's events get their declared order (order value, input, source
   position), their partitions (:mod:`~txstream.spark.runtime.partitioning`, in
   SQL) and one copy per partition of their keys; a shuffle by route number
   sends partition ``q``'s copies to Spark partition ``q``; phase 1 runs there
   (``mapInArrow``) and returns its counters;
2. when anything was deferred, the deferred transactions and their rows go to
   phase 2 (P tasks, each on whole chains of them) and the rows go back to their
   partitions (phase 3), both handed over through files of the store (one-stage
   jobs, no shuffle);
3. the driver writes the batch's commit marker.

Spark's own failures reach the user as one line (:func:`one_line`).
"""

from __future__ import annotations

import contextlib
import copy as copying
import json
import pickle
import re
import shutil
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from itertools import chain, compress, repeat
from math import isfinite
from operator import add, getitem, itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from txstream.errors import TxStreamError
from txstream.spark import batches
from txstream.spark.runtime.base import (
    JobSpec,
    RuntimeJobError,
    bad_event,
    finite,
    initial_row,
    null_field,
)
from txstream.spark.runtime.boundaries import MID_BITS, Event, position
from txstream.spark.runtime.executor import deferred_chains, latencies
from txstream.spark.runtime.failures import log_failures, log_late
from txstream.spark.runtime.forward import SocketTransport, forwarding, new_exchange
from txstream.spark.runtime.merge import Bound, advance, ended
from txstream.spark.runtime.partitioning import partition_of, spark_routes, sql_partition
from txstream.spark.runtime.restart import KEY_KINDS, first_meta, job_shape, restarted_meta
from txstream.spark.runtime.results import DRIVER_HISTORY, one_per_transaction
from txstream.spark.runtime.sinks import deliver
from txstream.spark.runtime.state import (
    PartitionState,
    RuntimeStore,
    StoreError,
    usable_directory,
    write_atomic,
)
from txstream.spark.runtime.tasks import (
    BatchContext,
    Phases,
    collector_paused,
    committed_frontier,
    committed_tokens,
    merge_stats,
    phase1,
    phase1_forward,
    phase2,
    phase3,
    release,
    run_batch,
    stop_on_error,
)

if TYPE_CHECKING:
    from txstream.spark.runtime.job import Job

OUT_SCHEMA = "kind string, pid int, payload binary"
BARRIER_ATTEMPTS = 4
"""Runs of a batch's barrier phase-1 stage that a failed task (a lost executor) may take
(as ``spark.stage.maxConsecutiveAttempts``)."""
RECENT = 100
"""How many batches' progress ``TxQuery.recentProgress`` keeps (as Spark's default)."""
ENGINES = ("executors", "driver")


_PYTHON_EXCEPTION = re.compile(
    r"(?!pyspark\.|py4j\.)([A-Za-z_]\w*\.)*[A-Za-z_]\w*(Error|Exception|Exit|Interrupt)(: |$)"
)
"""A Python traceback's last line (``ModuleNotFoundError: No module named 'x'``)."""

_SPARK_ERROR = re.compile(
    r"(?:pyspark\.errors\.exceptions\.[\w.]+: |py4j\.[\w.]+: |[\w.]*(?:Error|Exception): )?"
    r"(\[[A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*\] .+)"
)
"""A line naming a Spark error class (``...NumberFormatException: [CAST_INVALID_INPUT] ...``)."""

_JVM_EXCEPTION = re.compile(r"(?::\s*)?((?:java|javax|scala|org)\.[\w.$]+(?:Error|Exception): .+)")
"""A JVM exception's line in a Py4J error (``: java.lang.OutOfMemoryError: Java heap space``)."""

_TRACEBACK = "Traceback (most recent call last):"

STOP_WAIT_S = batches.STOP_WAIT_S
"""How long :meth:`TxQuery.stop` waits for the micro-batch in flight before stopping anyway."""


def one_line(exc: BaseException) -> str:
    """A Spark or Python failure as one readable line (the innermost useful message)."""
    text = str(exc)
    for marker in ("TxStreamError: ", "RuntimeJobError: ", "SchemaError: ", "StoreError: "):
        if marker in text:
            return text.split(marker, 1)[1].splitlines()[0].strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # A Python worker's or the foreachBatch function's failure: Spark's first line
    # ends with "Traceback (most recent call last):"; the cause is the innermost
    # Python exception line of the traceback that follows or, when Spark itself
    # failed under the function (a bad cast in a Spark job it started), the last
    # line of the traceback that names a Spark error class (else a JVM exception).
    if any(line.endswith(_TRACEBACK) for line in lines):
        end = next((i for i, line in enumerate(lines) if line.startswith("===")), None)
        body = [line for line in lines[:end] if not line.endswith(_TRACEBACK)]
        causes = [line for line in body if _PYTHON_EXCEPTION.match(line)]
        for pattern in (_SPARK_ERROR, _JVM_EXCEPTION):
            if not causes:
                causes = [m[1] for m in map(pattern.fullmatch, body) if m]
        if causes:
            cause = _without_sqlstate(causes[-1])[:500]
            if cause.startswith("ModuleNotFoundError: "):
                cause += _MODULE_HINT
            return cause
    for line in lines:
        if line.startswith(("pyspark.", "py4j.", "at ", "File ", "Traceback", "JVM stacktrace")):
            continue
        return line[:500]
    return type(exc).__name__


_MODULE_HINT = (
    " (Spark's Python workers unpickle the job's functions and import the modules "
    "they name: define them in the driver's script, ship their module with "
    "spark.sparkContext.addPyFile(path), or install it where the workers run)"
)


def _without_sqlstate(line: str) -> str:
    return re.sub(r"(\s+SQLSTATE: \w+)+$", "", line)


_ORDER_TYPES = (
    "ByteType",
    "ShortType",
    "IntegerType",
    "LongType",
    "FloatType",
    "DoubleType",
    "DecimalType",
    "TimestampType",
    "DateType",
)
"""Types of an order column: numbers, timestamps and dates (see :func:`order_value`)."""

_ARRIVAL_TYPES = ("ByteType", "ShortType", "IntegerType", "LongType", "FloatType", "DoubleType")
"""Types of the ``arrivalTime`` column: numbers of epoch seconds (read as Python numbers)."""


def order_value(column: str, data_type: Any) -> str:
    """The SQL of an event's order value (a double) from its order column of ``data_type``.

    A timestamp is its epoch seconds (what a cast to double gives); a date is the
    epoch seconds of its midnight UTC (Spark does not cast dates to double).
    """
    if type(data_type).__name__ == "DateType":
        return f"cast(unix_date(`{column}`) as double) * 86400"
    return f"cast(`{column}` as double)"


def check_inputs(job: Job) -> dict[str, list[str]]:
    """Refuse, in one line, inputs whose DataFrames do not fit their declarations.

    Reads only the DataFrames' schemas: it runs before Spark starts anything.
    Returns the type of each input's key columns (see :func:`restart.job_shape`).
    """
    columns: dict[str, dict[str, str]] = {}
    key_types: dict[str, list[str]] = {}
    for spec in job.spec.inputs.values():
        df = spec.source
        if not hasattr(df, "isStreaming"):
            raise RuntimeJobError(f"input {spec.name!r} must be a Spark DataFrame")
        if not df.isStreaming:
            raise RuntimeJobError(
                f"input {spec.name!r} is a batch DataFrame; give a streaming one "
                "(spark.readStream...), or try the job on lists of rows with run_local"
            )
        fields = {f.name: type(f.dataType).__name__ for f in df.schema.fields}
        columns[spec.name] = fields
        for group in spec.keys:
            for column in group:
                if column not in fields:
                    raise RuntimeJobError(
                        f"input {spec.name!r}: key column {column!r} is not in its schema "
                        f"({', '.join(fields)})"
                    )
                if fields[column] not in KEY_KINDS:
                    raise RuntimeJobError(
                        f"input {spec.name!r}: key column {column!r} is {fields[column]}; "
                        "a key is an integer, string or boolean column"
                    )
                key_types.setdefault(spec.name, []).append(KEY_KINDS[fields[column]])
        if spec.broadcast is not None and fields.get(spec.broadcast) != "BooleanType":
            raise RuntimeJobError(
                f"input {spec.name!r}: broadcast column {spec.broadcast!r} must be a boolean "
                f"column of its schema ({', '.join(fields)})"
            )
        if spec.order is not None:
            if spec.order not in fields:
                raise RuntimeJobError(
                    f"input {spec.name!r}: order column {spec.order!r} is not in its schema "
                    f"({', '.join(fields)})"
                )
            if fields[spec.order] not in _ORDER_TYPES:
                raise RuntimeJobError(
                    f"input {spec.name!r}: order column {spec.order!r} is "
                    f"{fields[spec.order]}; an order column is a number, a timestamp or a "
                    f"date: {_order_hint(spec.order, fields[spec.order])}"
                )
    arrival = job._arrival
    if arrival is not None:
        having = {name: fields[arrival] for name, fields in columns.items() if arrival in fields}
        if not having:
            listed = "; ".join(f"{name}: {', '.join(fields)}" for name, fields in columns.items())
            raise RuntimeJobError(
                f"option arrivalTime names column {arrival!r}, which no input has ({listed})"
            )
        for name, kind in having.items():
            if kind not in _ARRIVAL_TYPES:
                raise RuntimeJobError(
                    f"option arrivalTime: column {arrival!r} of input {name!r} is {kind}; "
                    "it must hold epoch seconds as a number (for a timestamp column, "
                    f"add one: F.unix_micros({arrival!r}) / 1e6)"
                )
    return key_types


def _order_hint(column: str, kind: str) -> str:
    """What to do about an order column of type ``kind``."""
    if kind == "StringType":
        return (
            f"convert it first, e.g. df.withColumn({column!r}, F.to_timestamp({column!r})) "
            f"for ISO-8601 times, or F.col({column!r}).cast('double') for numbers written as text"
        )
    if kind == "TimestampNTZType":
        return f"convert it first, e.g. F.col({column!r}).cast('timestamp')"
    return f"convert it first with df.withColumn({column!r}, ...)"


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

    def __init__(self, job: Job, root: Path, spark: Any, partitions: int, engine: str) -> None:
        self.job = job
        self.engine = engine
        self.driver: Any = None
        self.spec: JobSpec = job.spec
        self.root = root
        self.store = RuntimeStore(root / "txstream")
        self.spark = spark
        self.partitions = partitions
        self.routes: list[int] = []
        self.query: Any = None
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

    # -- StreamingQuery-like surface -----------------------------------------------
    @property
    def id(self) -> str:
        """The Spark query id."""
        return str(self.query.id) if self.query is not None else ""

    @property
    def name(self) -> str:
        """The job name."""
        return self.spec.name

    @property
    def isActive(self) -> bool:
        """Whether the job runs."""
        return self.query is not None and bool(self.query.isActive)

    @property
    def status(self) -> dict[str, Any]:
        """What the job is doing now."""
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
            self._wrap(self.query.processAllAvailable)
            if self._bounded():
                self._wrap(self.query.awaitTermination)
                self._end_if_finished()
            else:
                self._drained = self._batches
        finally:
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
            if timeout is None:
                done = self._wrap(self.query.awaitTermination)
            else:
                done = self._wrap(lambda: self.query.awaitTermination(timeout))
            if self._stopping and not self._thread.inside():
                # A stop (a sink's, in a thread of its own) stopped Spark's query
                # and may still be ending the inputs: the caller reads the outputs next.
                self._stopped.wait(timeout)
            elif self._bounded():
                self._end_if_finished()
            return done  # type: ignore[no-any-return]
        finally:
            self._watch.warn(stacklevel=3)

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
            if self.driver is not None and self.spec.record_history:
                from txstream.model import format_history

                # Recorded in the transaction manager's memory (the engine cannot
                # resume, so one file per run): `txstream check` reads it.
                text = format_history(self.driver.tm.history()) + "\n"
                write_atomic(self.store.root / DRIVER_HISTORY, text.encode())
        finally:
            self._lock.release()
            self._status = "stopped"
            self._stopped.set()
        held = (self.lastProgress or {}).get("held", 0)
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
        sc = self.spark.sparkContext
        # One Spark partition per phase-1 task, without a row: under the event-time
        # merge each task runs the partitions it hosts (see _phase1_outputs).
        empty = self.spark.createDataFrame(sc.parallelize([], self.tasks), self._schema)
        self._ending = True
        try:
            self._run(empty, batch)
        except TxStreamError:
            raise
        except Exception as exc:
            raise TxStreamError(
                f"job {self.name!r} could not end its inputs: {one_line(exc)}"
            ) from None
        finally:
            self._ending = False
            if self.store.is_committed(batch):  # (also when a sink or onError=stop raised)
                forward_spark_log(spark_dir, batch)

    def _busy(self) -> bool:
        """Whether Spark runs a batch of the job or has input for one."""
        if not self.query.isActive:
            return False
        status = self.query.status
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
            if self._failure:
                raise self._failed() from None
            raise TxStreamError(f"job {self.name!r} failed: {one_line(exc)}") from None

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
        cls, job: Job, root: Path, spark: Any, partitions: int | None, engine: str = "executors"
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
        partitions = partitions or int(spark.sparkContext.defaultParallelism)
        self = cls(job, root, spark, partitions, engine)
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
            deliver(self.store, job._sinks)  # batches committed before a crash
            self._start_stream()
        except TxStreamError:
            self._lock.release()
            raise
        except Exception as exc:
            self._lock.release()
            raise TxStreamError(f"job {job.spec.name!r} could not start: {one_line(exc)}") from None
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
        sc = self.spark.sparkContext
        if sc.getConf().get("spark.dynamicAllocation.enabled", "false") == "true":
            return self.partitions
        self.forward = True
        return max(1, min(self.partitions, int(sc.defaultParallelism)))

    def _route_expr(self, pid_column: str, routes: list[int] | None = None) -> str:
        array = ", ".join(f"cast({r} as bigint)" for r in (routes or self.routes))
        return f"element_at(array({array}), greatest({pid_column}, 0) + 1)"

    def _load_initial(self) -> None:
        for table in self.spec.tables.values():
            if table.initial is None:
                continue
            if _plain_rows(table.initial):
                # A list of plain rows goes to the store from here: through Spark
                # (a DataFrame, a shuffle, Python workers) it took 8 s of the start.
                by_pid: dict[int, dict[Any, dict[Any, Any]]] = {}
                for row in table.initial:
                    if table.columns is not None:  # as below: missing columns are null
                        row = {**dict.fromkeys(table.columns), **row}
                    key = table.key_of(initial_row(table, row))
                    value = table.value_of_key(key)
                    _add_initial(by_pid, partition_of(value, self.partitions), table, key, row)
                for pid, values in by_pid.items():
                    self.store.write_init(pid, table.name, values)
                continue
            df = _as_dataframe(self.spark, table.initial, table.name)
            missing = [c for c in table.key if c not in df.columns]
            if missing:
                raise RuntimeJobError(
                    f"table {table.name!r}: initial rows lack key columns {missing}"
                )
            df = df.selectExpr(
                "to_json(struct(*)) as payload",
                f"{sql_partition(table.partition_by, self.partitions)} as pid",
            ).selectExpr("payload", "pid", f"{self._route_expr('pid')} as route")
            write = _init_writer(str(self.store.root), replace(table, initial=None))
            df.repartition(self.partitions, "route").mapInArrow(write, "n long").collect()

    def _start_stream(self) -> None:
        from pyspark.sql import functions as F

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
        writer = (
            union.writeStream.queryName(self.spec.name)
            .option("checkpointLocation", str(self.root / "spark"))
            .foreachBatch(self._on_batch)
            .trigger(**self.job._trigger)
        )
        self._status = "running"
        self.query = writer.start()

    # -- one micro-batch ------------------------------------------------------------
    def _on_batch(self, df: Any, batch_id: int) -> None:
        with self._thread.running():
            self._batches += 1
            try:
                self._run(df, int(batch_id))
            except TxStreamError as exc:
                self._failure = str(exc)
                self._error = exc
                self._status = "failed"
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
                df = _as_dataframe(self.spark, table.initial, table.name)
                self.driver.load(
                    table.name,
                    [json.loads(r[0]) for r in df.selectExpr("to_json(struct(*))").collect()],
                )

    def _run_driver(self, df: Any, batch_id: int, started: float) -> dict[str, Any]:
        names = {spec.index: spec.name for spec in self.spec.inputs.values()}
        cols = df.selectExpr("*", f"{_MID_EXPR} as __mid").toArrow().to_pydict()
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

    def _run(self, df: Any, batch_id: int) -> None:
        if self.store.is_committed(batch_id):
            return  # a replayed batch (or the one that ended the inputs): already committed
        started = time.time()
        if self.engine == "driver":
            self.store.clear_uncommitted(batch_id)
            stats = self._run_driver(df, batch_id, started)
            self._prev = batch_id
            self._progressed(_progress(batch_id, stats, time.time() - started, 1))
            self._watch.after_batch(stats)  # (before a sink can fail)
            deliver(self.store, self.job._sinks, [batch_id])
            stop_on_error(stats, self.job._on_error)  # (as on executors)
            self._watch.check()
            return
        P = self.partitions
        prepared = (
            df.selectExpr("*", f"{_MID_EXPR} as __mid")
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
        phases = _SparkPhases(spec, prepared, P)
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
        self._progressed(_progress(batch_id, stats, time.time() - started, P))
        self._watch.after_batch(stats)  # (before a sink can fail: they count all the same)
        # The batches before were delivered when they committed, or at start:
        # a query whose sink failed stops, and its restart delivers the rest.
        deliver(self.store, self.job._sinks, [batch_id])
        stop_on_error(stats, self.job._on_error)
        self._watch.check()

    def _progressed(self, progress: dict[str, Any]) -> None:
        """Record a committed batch's progress (``recentProgress`` keeps the last ones)."""
        self._committed += 1
        self.recentProgress.append(progress)
        del self.recentProgress[:-RECENT]

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
            sc = self.spark.sparkContext
            dynamic = sc.getConf().get("spark.dynamicAllocation.enabled", "false") == "true"
            self._barrier = not dynamic and self.tasks <= sc.defaultParallelism
        return self._barrier

    def _advance(self, df: Any) -> tuple[Bound | None, dict[str, Any]]:
        """The batch's release frontier under the event-time merge (None: batch order)."""
        if self._merge != "event-time":
            return None, {}
        if self._ending:  # (no rows: every input ends)
            return ended(self._frontier, self.job._idle_batches)
        from pyspark.sql import functions as F

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


def _log_ids(folder: Path) -> list[int]:
    """The batch ids of one of Spark's checkpoint logs (``offsets``, ``commits``), in order."""
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def spark_log_ends(spark_dir: Path) -> tuple[int, int]:
    """The last batch of Spark's commit log and of its offset log (-1: none)."""
    commits, offsets = _log_ids(spark_dir / "commits"), _log_ids(spark_dir / "offsets")
    return (commits[-1] if commits else -1), (offsets[-1] if offsets else -1)


def forward_spark_log(spark_dir: Path, batch: int) -> None:
    """Record in Spark's checkpoint that batch ``batch`` ran without input (the inputs' end).

    The batch that ends the inputs is txstream's alone (Spark's query has
    stopped): its offsets are those of batch ``batch - 1`` (no input read) and
    it is committed.  Copying both files of ``batch - 1`` (each after its
    ``.crc``, which Hadoop checks when it is there) makes Spark count it done
    and resume with ``batch + 1``; otherwise a restart would run new input as
    ``batch``, whose marker already exists.  The offsets go first: a crash
    between the two leaves a batch that Spark runs again without input, which
    txstream skips as committed.  Files already there are kept.
    """
    for log in ("offsets", "commits"):
        folder = spark_dir / log
        if (folder / str(batch)).exists():
            continue
        for name in (".{}.crc", "{}"):
            source = folder / name.format(batch - 1)
            if source.exists():
                write_atomic(folder / name.format(batch), source.read_bytes())


def reconcile_commit_log(store: RuntimeStore, spark_dir: Path) -> None:
    """Make Spark's checkpoint agree with txstream's commit markers before Spark starts.

    A batch that ended the inputs (:meth:`TxQuery._end_inputs`) and committed
    before Spark's checkpoint recorded it (a crash between the two) is recorded
    now (:func:`forward_spark_log`): Spark would otherwise run new input as that
    batch, which txstream would skip as committed.

    Spark runs again a batch it counts as done whose txstream marker is missing.

    Spark's checkpoint records a batch's offsets (``offsets/<n>``) before it
    runs and counts it done in ``commits/<n>`` after ``foreachBatch`` returned.
    A batch counts for txstream only with its own marker (``commits/<n>.json``
    of the store): a marker lost after Spark's commit would leave the batch's
    outputs and effects out for good.  Spark runs the last batch of its offset
    log again when its commit log ends one short, so the last batch's Spark
    commit is removed when its marker is missing (the re-run clears the files
    the batch left and writes them again).  Earlier batches cannot be run again:
    a one-line :class:`StoreError`.
    """
    commits, offsets = spark_dir / "commits", spark_dir / "offsets"
    if not commits.is_dir():
        return
    chain = store.chain()
    last = chain[-1][0] if chain else -1
    spark_done, spark_planned = spark_log_ends(spark_dir)
    if chain and chain[-1][1].get("frontier", {}).get("ended") and last > spark_done:
        if spark_done != last - 1 or spark_planned not in (last - 1, last):
            raise StoreError(
                f"{store.root / 'commits' / f'{last:012d}.json'} ended the inputs after "
                f"batch {last - 1}, but Spark's checkpoint {spark_dir} has offsets up to "
                f"batch {spark_planned} and commits up to batch {spark_done}; start on a new "
                "checkpoint or restore both from one backup"
            )
        forward_spark_log(spark_dir, last)
    done = sorted(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    lost = [n for n in done if n > last]
    if not lost:
        return
    names = list(offsets.iterdir()) if offsets.is_dir() else []
    logged = [int(p.name) for p in names if p.name.isdigit()]
    if lost == [max(logged, default=-1)] and (not chain or lost[0] - 1 in done):
        for name in (str(lost[0]), f".{lost[0]}.crc"):
            with contextlib.suppress(FileNotFoundError):
                (commits / name).unlink()
        return
    markers = ", ".join(str(store.root / "commits" / f"{n:012d}.json") for n in lost)
    raise StoreError(
        f"Spark's commit log in {spark_dir} counts batches {lost} as done but their "
        f"txstream commit markers are missing ({markers}); only the last batch can be run "
        "again: restore the markers from a backup or start on a new checkpoint"
    )


_MID_EXPR = "monotonically_increasing_id()"
"""An event's place in its micro-batch; Python adds ``batch << MID_BITS`` (see
``boundaries.MID_BITS``) to make it unique across batches.  The batch id stays out of
the SQL on purpose: Spark inlines literals into the Java it generates, so a
per-batch literal made every micro-batch compile new classes and JIT them again
(measured: 13 s of compiler threads in 30 s of Linear Road at speedup 20)."""


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


def _init_writer(store_root: str, spec: Any) -> Any:
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
                _add_initial(by_pid, pid, spec, key, row)
        store = RuntimeStore(store_root)
        for pid, values in by_pid.items():
            store.write_init(pid, spec.name, values)
        yield pa.RecordBatch.from_pylist(
            [{"n": len(by_pid)}], schema=pa.schema([("n", pa.int64())])
        )

    return write_init


def _add_initial(
    by_pid: dict[int, dict[Any, dict[Any, Any]]], pid: int, spec: Any, key: Any, row: Any
) -> None:
    """File initial ``row`` (key ``key``) of table ``spec`` under partition ``pid``."""
    rows = by_pid.setdefault(pid, {}).setdefault(spec.value_of_key(key), {})
    if key in rows:  # as run_local refuses it (one key's rows meet in one task)
        raise RuntimeJobError(f"table {spec.name!r}: initial rows repeat the key {key!r}")
    rows[key] = row


def _plain_rows(initial: Any) -> bool:
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


def _as_dataframe(spark: Any, initial: Any, table: str) -> Any:
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


class _SparkPhases(Phases):
    """The batch's phases as Spark jobs (see the module docstring)."""

    def __init__(self, job: JobSpec, prepared: Any, partitions: int) -> None:
        self.job = job
        self.prepared = prepared
        self.partitions = partitions

    def phase1(self, ctx: BatchContext) -> tuple[list[dict[str, Any]], bool]:
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
        # Phase 1 left each partition's shipped rows and events in the store, and
        # phase 2 leaves each partition's rows to take back there: two one-stage
        # jobs, no shuffle and no cached DataFrame between the phases.  Phase 2
        # runs in P tasks, each on whole chains of deferred transactions.
        job, sc = self.job, self.prepared.sparkSession.sparkContext

        P = self.partitions

        def coordinate(shares: Iterator[int]) -> Iterator[Any]:
            return (_phase2_task(job, ctx, share, P) for share in shares)

        def take(pids: Iterator[int]) -> Iterator[Any]:
            return _phase3_task(job, ctx, pids)

        stats = merge_stats(sc.parallelize(range(P), P).mapPartitions(coordinate).collect())
        tokens = dict(sc.parallelize(range(P), P).mapPartitions(take).collect())
        return stats, tokens


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
    base = ctx.batch << MID_BITS  # see _MID_EXPR
    values_of = {inp: job.inputs[name].values_of for inp, name in names.items()}
    ordered = {inp for inp, name in names.items() if job.inputs[name].order is not None}
    for batch in batches:
        cols = batch.to_pydict()
        payloads = {inp: cols[f"__in{inp}"] for inp in names}
        if ctx.gather is not None:
            _highest(high, cols["__input"], cols["__ordv"])
        made = _column_events(job, names, batch, cols, base, partitions)
        if made is not None:  # (the common case: a batch without a bad event)
            for pid, part in made.items():
                events.setdefault(pid, []).extend(part)
            continue
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
    release = None
    if ctx.gather is not None:
        release = _gathered_release(ctx, high, names)
        ctx = replace(ctx, release_upto=release[0])
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
        results = {pid: phase1(job, ctx, pid, evs) for pid, evs in sorted(events.items())}
    for pid, result in sorted(results.items()):
        stats = result["stats"]
        if bad and pid == min(results):
            stats["failures"].extend(bad)
            stats["aborted"] += len(bad)
            stats["files"].update(files)
        shipped = bool(result["rows"] or result["events"])
        if shipped:  # for phase 2 (see _SparkPhases.deferred)
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
        return phase1_forward(job, ctx, hosted, transport, lambda pid: pid % tasks)
    finally:
        transport.close()


def _column_events(
    job: JobSpec,
    names: dict[int, str],
    batch: Any,
    cols: dict[str, list[Any]],
    base: int,
    partitions: int,
) -> dict[int, list[Event]] | None:
    """The events of one Arrow batch per partition, made column by column; None: use the loop.

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
    orders = zip(ordvs, inputs, mids, strict=True)
    named = map(names.__getitem__, inputs)
    fields = zip(orders, named, rows, values, pids, cols["__copy"], strict=True)
    made = list(map(tuple.__new__, repeat(Event), fields))
    if len(set(pid_of)) == 1:
        return {pid_of[0]: made}
    out: dict[int, list[Event]] = {}
    for pid, event in zip(pid_of, made, strict=True):
        out.setdefault(pid, []).append(event)
    return out


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
    (:func:`~txstream.spark.runtime.executor.deferred_chains`); it runs its own
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
