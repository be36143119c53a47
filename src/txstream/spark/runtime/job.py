"""The public API: declare a transactional job, start it on Spark, watch it like a query.

::

    import txstream as tx

    job = (
        tx.Job("sensor-alerts")
        .table("specs", key="device", initial=[{"device": "d1", "unit": "C", "limit": 30.0}])
        .input("specs_changes", changes_df, keys="device", order="ts")
        .input("readings", readings_df, keys="device", order="ts")
        .output("alerts", schema="device string, ts double, celsius double")
        .boundary("timestamp")
        .on("specs_changes", apply_change)
        .on("readings", check_reading)
    )
    query = job.start(checkpoint="/data/ckpt/alerts")     # a StreamingQuery-like handle
    query.processAllAvailable(); query.stop()
    tx.read_output("/data/ckpt/alerts", "alerts")

Nothing here imports pyspark until :meth:`Job.start`; ``job.run_local(...)``
runs the same job in this process (the reference the tests compare with).
"""

from __future__ import annotations

import inspect
import math
import pickle
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from txstream.errors import TxStreamError
from txstream.spark.runtime.base import (
    InputSpec,
    JobSpec,
    OutputSpec,
    Row,
    RuntimeJobError,
    TableSpec,
    TxnFunction,
    _names,
    canonical_kind,
    check_partitions,
    parse_schema,
)
from txstream.spark.runtime.boundaries import Boundary, PerEvent, boundary
from txstream.spark.runtime.checks import (
    check_initial,
    check_place,
    check_source,
    check_trigger,
    takes_two,
)
from txstream.spark.runtime.failures import ALL_FAIL_LIMIT, FailureWatch
from txstream.spark.runtime.local import LocalRunner
from txstream.spark.runtime.merge import MERGES, plan_watermarks, watermark_delay
from txstream.spark.runtime.sinks import deliver
from txstream.spark.runtime.tasks import stop_on_error

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from txstream.spark.runtime.query import TxQuery

ON_ERROR = ("rollback", "stop")

CROSS_PARTITION = ("forward", "defer")
"""The ways a multi-partition transaction can run (option ``crossPartition``)."""


def _global_reads(name: str, reads: Sequence[str]) -> tuple[tuple[str, str | None], ...]:
    """``["accounts.balance", "limits"]`` as (table, column) pairs (column None: a count)."""
    if isinstance(reads, str):
        reads = [reads]
    if not isinstance(reads, (list, tuple)):
        raise RuntimeJobError(
            f"input {name!r}: global_reads is a list like ['accounts.balance'], not {reads!r}"
        )
    out: list[tuple[str, str | None]] = []
    for item in reads:
        parts = item.split(".") if isinstance(item, str) else []
        if not 1 <= len(parts) <= 2 or not all(parts):
            raise RuntimeJobError(
                f"input {name!r}: global_reads entry {item!r} is 'table' or 'table.column'"
            )
        out.append((parts[0], parts[1] if len(parts) == 2 else None))
    return tuple(out)


NEVER_QUIET = 2**62
"""``idleBatches`` of a bounded ``run_local``: no input counts as quiet before it ends."""

_END: list[tuple[str, Row]] = []
"""Stands for the batch that ends the inputs in :meth:`Job.run_local`'s loop."""


def _ended(
    batches: Iterable[Iterable[tuple[str, Row]]], runner: LocalRunner
) -> Iterator[Iterable[tuple[str, Row]]]:
    """``batches``, then :data:`_END` when the event-time merge holds events after them."""
    yield from batches
    if runner.held():
        yield _END


class Job:
    """A transactional job under construction (builder methods return the job).

    Declare tables, inputs, outputs and a transaction function per input, then
    run it: :meth:`run_local` in this process, :meth:`start` on Spark.

    >>> import txstream as tx
    >>> def transfer(t, e):
    ...     if t.read("accounts", e["src"])["balance"] < e["amount"]:
    ...         t.abort("insufficient funds")
    ...     t.increment("accounts", e["src"], "balance", -e["amount"])
    ...     t.increment("accounts", e["dst"], "balance", e["amount"])
    >>> job = (
    ...     tx.Job("ledger")
    ...     .table("accounts", key="acct", initial=[{"acct": 1, "balance": 10},
    ...                                             {"acct": 2, "balance": 0}])
    ...     .input("transfers", None, keys=["src", "dst"])
    ...     .on("transfers", transfer)
    ... )
    >>> _ = job.run_local([[("transfers", {"src": 1, "dst": 2, "amount": 4}),
    ...                     ("transfers", {"src": 2, "dst": 1, "amount": 9})]], "ckpt/ledger")
    >>> tx.read_table("ckpt/ledger", "accounts")
    [{'acct': 1, 'balance': 6}, {'acct': 2, 'balance': 4}]
    >>> [f["error"] for f in tx.read_failures("ckpt/ledger")]
    ['TransactionAborted: insufficient funds']
    """

    def __init__(self, name: str = "txstream-job") -> None:
        if not isinstance(name, str) or not name.strip():
            # (it names the Spark query, the logs and the errors: Job(123) failed at start())
            raise RuntimeJobError(f"Job(name): a job's name is a non-empty string, not {name!r}")
        self.spec = JobSpec(name=name, boundary=PerEvent())
        self._partitions: int | None = None
        self._on_error = "rollback"
        self._snapshot_every = 20
        self._trigger: dict[str, Any] = {"processingTime": "0 seconds"}
        self._arrival: str | None = None
        self._sinks: dict[str, list[Any]] = {}
        self._merge = "batch"
        """The merge chosen with ``.option("merge", ...)`` (the runs take :meth:`merge_for`)."""
        self._merge_chosen = False
        self._idle_batches = 1
        self._idle_chosen = False
        self._all_fail_limit = ALL_FAIL_LIMIT
        self._watermarks: dict[str, float] = {}
        """Each input's watermark delay: declared, or from ``withWatermark`` (:meth:`start`)."""
        self._progress_listeners: list[Callable[[dict[str, Any]], object]] = []
        """Called with each committed batch's progress (:meth:`on_progress`)."""

    # -- declarations ----------------------------------------------------------------
    def table(
        self,
        name: str,
        key: str | Sequence[str],
        partition_by: str | Sequence[str] | None = None,
        schema: str | None = None,
        initial: DataFrame | str | Path | list[Row] | None = None,
    ) -> Job:
        """Declare a partitioned table keyed by ``key``, placed by ``partition_by`` (default key).

        ``initial`` is a Spark DataFrame, a file (``.json``/``.jsonl``/``.csv``/
        ``.parquet``) or a list of dicts, loaded when the job first starts.

        >>> import txstream as tx
        >>> job = tx.Job().table("seats", key=["flight", "seat"], partition_by="flight")
        >>> job.spec.tables["seats"].partition_by
        ('flight',)
        >>> job.table("fares", key="route", partition_by="price")
        Traceback (most recent call last):
        txstream.spark.runtime.errors.RuntimeJobError: table 'fares': partition_by ['price'] must
        name key columns ['route']
        """
        _name("table", name, self.spec.tables)
        keys = _names(key, f"table {name!r}: key")
        part = (
            _names(partition_by, f"table {name!r}: partition_by")
            if partition_by is not None
            else keys
        )
        if not keys or any(c not in keys for c in part):
            raise RuntimeJobError(
                f"table {name!r}: partition_by {list(part)} must name key columns {list(keys)}"
            )
        columns = parse_schema(schema) if schema is not None else None
        if columns is not None and any(c not in columns for c in keys):
            raise RuntimeJobError(f"table {name!r}: key columns {list(keys)} are not all in schema")
        self.spec.tables[name] = check_initial(TableSpec(name, keys, part, columns, initial))
        return self

    def input(
        self,
        name: str,
        source: DataFrame | Sequence[Row] | None,
        keys: str | Sequence[str | Sequence[str]] = (),
        order: str | None = None,
        broadcast: str | None = None,
        global_reads: Sequence[str] = (),
        watermark: Any = None,
    ) -> Job:
        """Declare an input stream (a streaming DataFrame, or a list of dicts for ``run_local``).

        ``keys`` names the column(s) holding the event's partition values: one
        column (``"device"``), several partition values (``["src", "dst"]``, a
        multi-partition transaction), composite values (``[("xway", "dir")]``),
        or none (``()``: the event reaches every partition, e.g. a CTI).
        ``order`` is the column of the declared order (event time); without it,
        the order is the source's (inputs in declaration order within a batch).
        ``broadcast`` names a boolean column: the events where it is true reach
        every partition, as the events of an input without keys do (one stream
        that mixes keyed events with queries over every partition, read once).
        ``global_reads`` (an input without keys only) names what its transactions
        read across all partitions: ``"table.column"`` (``tx.sum``, ``tx.count``)
        or ``"table"`` (``tx.count``).  Such a transaction runs once, at its place
        in the order, over the totals of every partition; it writes no table rows
        (it may emit).
        ``watermark`` (event-time merge, needs ``order``): how far below the
        largest order value it has delivered this input may still deliver an
        event, in order-value units (seconds for a timestamp column) or as an
        interval (``"10 seconds"``, ``"2 minutes"``).  Its frontier is its largest
        value less the delay: the other inputs are held only that far, and its
        events further behind are late (they run in the batch they arrive in).
        On Spark, without it, ``withWatermark`` on the DataFrame's order column
        gives the delay.  A watermark makes the event-time merge the default,
        even for one input; ``merge='batch'`` refuses it.

        >>> import txstream as tx
        >>> job = (tx.Job().input("readings", None, keys="device", order="ts")
        ...        .input("transfers", None, keys=["src", "dst"])
        ...        .input("audits", None))                     # every partition
        >>> job.spec.inputs["transfers"].keys
        (('src',), ('dst',))
        >>> job.input("late", None, keys="device", watermark="10 seconds")
        Traceback (most recent call last):
        txstream.spark.runtime.errors.RuntimeJobError: input 'late': a watermark is a delay in the
        order column's values; declare order=... too
        """
        _name("input", name, self.spec.inputs)
        check_source(name, source)
        if isinstance(keys, str):
            key_list: tuple[tuple[str, ...], ...] = (_names(keys, f"input {name!r}: keys"),)
        else:
            if not isinstance(keys, (list, tuple)):
                raise RuntimeJobError(
                    f"input {name!r}: keys is a column name or a list of them, not {keys!r}"
                )
            key_list = tuple(_names(k, f"input {name!r}: keys") for k in keys)
        for what, column in (("order", order), ("broadcast", broadcast)):
            if column is not None and (not isinstance(column, str) or not column):
                raise RuntimeJobError(f"input {name!r}: {what} is a column name, not {column!r}")
        if broadcast is not None and not key_list:
            raise RuntimeJobError(
                f"input {name!r}: broadcast={broadcast!r} needs keys (an input without keys "
                "reaches every partition already)"
            )
        reads = _global_reads(name, global_reads)
        if reads and (key_list or broadcast is not None):
            raise RuntimeJobError(
                f"input {name!r}: global_reads needs an input without keys and without "
                "broadcast (its events read every partition)"
            )
        if watermark is not None:
            if order is None:
                raise RuntimeJobError(
                    f"input {name!r}: a watermark is a delay in the order column's values; "
                    "declare order=... too"
                )
            self._watermarks[name] = watermark_delay(watermark, f"input {name!r}")
        self.spec.inputs[name] = InputSpec(
            name, source, key_list, order, len(self.spec.inputs), broadcast, reads
        )
        return self

    def output(self, name: str, schema: str | None = None) -> Job:
        """Declare an output; emitted rows are checked against ``schema`` when given.

        >>> import txstream as tx
        >>> def alert(t, e):
        ...     t.emit("alerts", {"device": e["device"], "celsius": str(e["celsius"])})
        >>> job = (tx.Job().input("readings", None, keys="device")
        ...        .output("alerts", schema="device string, celsius double")
        ...        .on("readings", alert))
        >>> _ = job.run_local([[("readings", {"device": "d1", "celsius": 31.5})]], "ckpt/out")
        >>> tx.read_output("ckpt/out", "alerts")
        []
        >>> tx.read_failures("ckpt/out")[0]["error"]
        "SchemaError: emit to alerts: column 'celsius' is double, got '31.5'"
        """
        _name("output", name, self.spec.outputs)
        columns = parse_schema(schema) if schema is not None else None
        self.spec.outputs[name] = OutputSpec(name, columns)
        return self

    def sink(self, output: str, sink: Any) -> Job:
        """Also deliver ``output``'s committed rows to ``sink(batch_id, rows)``.

        Exactly once when the sink is idempotent per batch id, as
        :class:`~txstream.spark.runtime.sinks.PostgresSink` is.

        >>> import txstream as tx
        >>> delivered = {}
        >>> def keep(batch_id, rows):                 # idempotent: a batch id once
        ...     delivered[batch_id] = rows
        >>> job = (tx.Job().input("ev", None, keys="k").output("seen")
        ...        .on("ev", lambda t, e: t.emit("seen", {"k": e["k"]}))
        ...        .sink("seen", keep))
        >>> _ = job.run_local([[("ev", {"k": 1})], [("ev", {"k": 2})]], "ckpt/sink")
        >>> delivered
        {0: [{'k': 1}], 1: [{'k': 2}]}
        """
        if output not in self.spec.outputs:
            raise RuntimeJobError(f".sink({output!r}, ...) names no output; declare it first")
        if not callable(sink) or not takes_two(sink):
            raise RuntimeJobError(f".sink({output!r}, ...) needs a callable sink(batch_id, rows)")
        columns = self.spec.outputs[output].columns
        declare = getattr(sink, "declare", None)
        if columns is not None and callable(declare):
            declare(output, columns)  # (a table sink takes or checks the declared schema)
        target = _claimed(sink)
        if target is not None:
            # (batch ids are one output's: a second output's would be skipped as written)
            for other, sinks in self._sinks.items():
                if other != output and any(_claimed(s) == target for s in sinks):
                    raise RuntimeJobError(
                        f".sink({output!r}, ...): output {other!r} already writes to "
                        f"{type(sink).__name__} {target[-1]!r}; give each output a target "
                        "of its own (a folder, or a name= of its own)"
                    )
        self._sinks.setdefault(output, []).append(sink)
        return self

    def _plan_output_stream(self, name: str) -> tuple[Path, str]:
        """The folder and DDL schema of output ``name``'s stream (see ``TxQuery.output_stream``)."""
        from txstream.spark.runtime.sinks import FolderSink

        spec = self.spec.outputs.get(name)
        if spec is None:
            raise RuntimeJobError(f"output_stream({name!r}): the job has no output {name!r}")
        if spec.columns is None:
            raise RuntimeJobError(
                f"output_stream({name!r}): declare the output's schema "
                f"(.output({name!r}, schema='...')): a stream needs one"
            )
        folders = [s.path for s in self._sinks.get(name, []) if isinstance(s, FolderSink)]
        if not folders:
            raise RuntimeJobError(
                f"output_stream({name!r}): add .sink({name!r}, tx.FolderSink(path)) before "
                "start(): the stream reads the committed batches it writes"
            )
        ddl = ", ".join(f"`{c}` {canonical_kind(k)}" for c, k in spec.columns.items())
        return folders[0], ddl

    def on(self, input_name: str, fn: TxnFunction) -> Job:
        """The transaction function for events of ``input_name``: ``fn(tx, event_row)``.

        ``fn`` runs once per transaction with a :class:`~txstream.Tx` and the
        event (a dict); whatever it raises rolls the transaction back.

        >>> import txstream as tx
        >>> def count(t, e):
        ...     row = t.read("counts", e["word"], default={"n": 0})
        ...     t.upsert("counts", {"word": e["word"], "n": row["n"] + 1})
        >>> job = tx.Job().table("counts", key="word").input("words", None, keys="word")
        >>> _ = job.on("words", count).run_local(
        ...     [[("words", {"word": w}) for w in "a b a".split()]], "ckpt/on")
        >>> tx.read_table("ckpt/on", "counts")
        [{'word': 'a', 'n': 2}, {'word': 'b', 'n': 1}]
        >>> def gen(t, e):
        ...     yield
        >>> job.on("words", gen)
        Traceback (most recent call last):
        txstream.spark.runtime.errors.RuntimeJobError: .on('words', gen): a transaction function is
        a plain function (this one yields or is async, so calling it runs nothing)
        """
        if not callable(fn) or not takes_two(fn):  # (else every transaction: a TypeError)
            raise RuntimeJobError(f".on({input_name!r}, ...) needs a function fn(tx, event)")
        if inspect.isgeneratorfunction(fn) or inspect.iscoroutinefunction(fn):
            # Calling one runs none of its body: the transaction would do nothing.
            raise RuntimeJobError(
                f".on({input_name!r}, {getattr(fn, '__name__', fn)}): a transaction function "
                "is a plain function (this one yields or is async, so calling it runs nothing)"
            )
        self.spec.handlers[input_name] = fn
        return self

    def boundary(self, name: str | Boundary, **options: Any) -> Job:
        """Choose the transaction boundary by name (see :mod:`~txstream.spark.runtime.boundaries`).

        Names: event, timestamp, timeslice, punctuation, seconds, batch, by.

        >>> import txstream as tx
        >>> def tally(t, e):
        ...     row = t.read("totals", e["ts"], default={"n": 0})
        ...     t.upsert("totals", {"ts": e["ts"], "n": row["n"] + 1})
        >>> job = (tx.Job().table("totals", key="ts").input("ev", None, keys="ts", order="ts")
        ...        .boundary("timestamp")                  # one transaction per ts value
        ...        .on("ev", tally))
        >>> runner = job.run_local([[("ev", {"ts": 1}), ("ev", {"ts": 1}), ("ev", {"ts": 2})]],
        ...                        "ckpt/boundary")
        >>> runner.stats[0]["events"], runner.stats[0]["committed"]
        (3, 2)
        """
        self.spec.boundary = boundary(name, **options)
        return self

    def option(self, key: str, value: Any) -> Job:
        """Set an option by name.

        ``partitions``, ``onError`` (rollback|stop), ``snapshotEvery``,
        ``recordHistory`` (bool), ``arrivalTime`` (a numeric column of epoch seconds for
        latency; :meth:`start` refuses one that no input has),
        ``merge`` (``batch`` | ``event-time``, see :mod:`~txstream.spark.runtime.merge`;
        the default: :meth:`merge_for`),
        ``idleBatches`` (event-time merge: quiet batches before an input stops holding
        the others back, 1), ``allFailLimit`` (stop when that many transactions of an
        input, and none that committed, failed with a schema or undeclared-key error
        since the start, 20; 0: never, see :mod:`~txstream.spark.runtime.failures`),
        ``crossPartition`` (``forward``, the default: a transaction whose values live on
        several partitions runs in phase 1 at its home partition, the others forwarding
        their rows, see :mod:`~txstream.spark.runtime.forward`; ``defer``: it and what
        follows it on its values wait for phases 2 and 3).

        >>> import txstream as tx
        >>> job = tx.Job().option("partitions", 4).option("recordHistory", True)
        >>> job.option("partition", 4)
        Traceback (most recent call last):
        txstream.spark.runtime.errors.RuntimeJobError: unknown option 'partition'; choose one of:
        allFailLimit, arrivalTime, crossPartition, idleBatches, merge, onError, partitions,
        recordHistory, snapshotEvery
        """
        if key == "partitions":
            self._partitions = check_partitions(value, "option partitions")
        elif key == "onError":
            self._on_error = _one_of(key, value, ON_ERROR)
        elif key == "snapshotEvery":
            self._snapshot_every = _whole(key, value, 1, "a positive integer")
        elif key == "merge":
            self._merge = _one_of(key, value, MERGES)
            self._merge_chosen = True
        elif key == "idleBatches":
            self._idle_batches = _whole(key, value, 1, "a positive integer")
            self._idle_chosen = True
        elif key == "allFailLimit":
            self._all_fail_limit = _whole(key, value, 0, "an integer >= 0 (0: no limit)")
        elif key == "recordHistory":
            if not isinstance(value, bool):
                raise RuntimeJobError(f"option recordHistory is True or False, not {value!r}")
            self.spec.record_history = value
        elif key == "crossPartition":
            self.spec.cross_partition = _one_of(key, value, CROSS_PARTITION)
        elif key == "arrivalTime":
            if not isinstance(value, str) or not value:
                raise RuntimeJobError(
                    f"option arrivalTime is the name of an input column of epoch seconds, "
                    f"not {value!r}"
                )
            self._arrival = value
        else:
            raise RuntimeJobError(
                f"unknown option {key!r}; choose one of: allFailLimit, arrivalTime, "
                "crossPartition, idleBatches, merge, onError, partitions, recordHistory, "
                "snapshotEvery"
            )
        return self

    def trigger(self, **trigger: Any) -> Job:
        """The Structured Streaming trigger, as for ``DataStreamWriter.trigger``.

        One of ``processingTime="5 seconds"``, ``availableNow=True`` or ``once=True``,
        checked here (not when the query starts); the runtime commits micro-batches.

        >>> import txstream as tx
        >>> tx.Job().trigger(processingTime="soon")
        Traceback (most recent call last):
        txstream.spark.runtime.errors.RuntimeJobError: trigger(processingTime='soon'): an
        interval such as '5 seconds' or '200 milliseconds'
        """
        self._trigger = check_trigger(trigger)
        return self

    def on_progress(self, listener: Callable[[dict[str, Any]], object]) -> Job:
        """Call ``listener(progress)`` after each batch a started query commits.

        ``progress`` is the dict ``query.lastProgress`` holds for the batch (a
        copy): ``id``, ``runId``, ``name``, ``batchId``, ``numInputRows``,
        ``committed``, ``aborted``, ``deferred``, ``held``, ``late``,
        ``failed``, ``durationMs``, ``latency`` ... (docs/spark.md, "Watching a
        query").  It runs on the driver, in the batch's thread, after the
        batch's commit and before its sinks; a listener that raises is logged
        on ``txstream.runtime`` and does not fail the batch.  Several may be
        added; ``run_local`` does not call them.

        >>> import txstream as tx
        >>> seen = []
        >>> job = tx.Job("watched").input("ev", None, keys="k").on("ev", lambda t, e: None)
        >>> job.on_progress(lambda p: seen.append((p["batchId"], p["committed"]))) is job
        True
        """
        if not callable(listener):
            raise RuntimeJobError(".on_progress(...) needs a callable listener(progress)")
        self._progress_listeners.append(listener)
        return self

    # -- running ------------------------------------------------------------------------
    def validate(self) -> None:
        """Check the job's declarations (raises :class:`RuntimeJobError`).

        :meth:`run_local` and :meth:`start` call it first; so may a test.

        >>> import txstream as tx
        >>> job = tx.Job().input("ev", None, keys="k").on("ev", print)
        >>> job.validate()
        >>> job.option("merge", "event-time").validate()
        Traceback (most recent call last):
        txstream.spark.runtime.errors.RuntimeJobError: option merge='event-time' merges inputs by
        their order column; input(s) ev declare none (add order=...)
        """
        self.spec.validate()
        unordered = [n for n, spec in self.spec.inputs.items() if spec.order is None]
        if self._merge == "event-time" and unordered:
            # Without an order column every event has order value 0: nothing to merge by.
            raise RuntimeJobError(
                f"option merge='event-time' merges inputs by their order column; "
                f"input(s) {', '.join(unordered)} declare none (add order=...)"
            )
        if self._watermarks and self._merge_chosen and self._merge == "batch":
            raise RuntimeJobError(
                f"input(s) {', '.join(self._watermarks)} declare a watermark, which delays the "
                "event-time merge's frontier; option merge='batch' has none (choose "
                "merge='event-time', or leave the watermark out)"
            )
        self.spec.boundary.validate(self.spec.inputs)

    def merge_for(self, runner: str) -> str:
        """The merge a run uses: the one chosen with ``.option("merge", ...)``, else the safe one.

        With one input with an order column, or none, the two merges give the
        serial answer (order value first within each micro-batch, which is the
        whole order): ``batch``.  With several, ``batch`` runs a later
        micro-batch after an earlier one whatever its order value, so the answer
        depends on how the sources hand files over: both ``run_local``
        (``runner`` ``"run_local"``) and ``start`` take ``event-time``, and both
        end their inputs at the end of a bounded run (``run_local``'s last
        batch; on Spark an ``availableNow`` run, or ``processAllAvailable()``
        then ``stop()``: see ``TxQuery.stop``).  A job that mixes ordered and
        unordered inputs is refused in one line until it chooses.  ``runner``
        is kept for the callers' sake: both runners now choose alike.
        """
        if self._merge_chosen:
            return self._merge
        inputs = self.spec.inputs
        ordered = [n for n, spec in inputs.items() if spec.order is not None]
        if len(ordered) < 2 and not self._watermarks:  # (a watermark asks for event-time)
            return "batch"
        unordered = [n for n in inputs if n not in ordered]
        if not unordered:
            return "event-time"
        fix = f"add order=... to input(s) {', '.join(unordered)} (the event-time merge), or "
        raise RuntimeJobError(
            f"job {self.spec.name!r} has {len(ordered)} inputs with an order column "
            f"({', '.join(ordered)}): under merge='batch' an event of a later micro-batch runs "
            "after the earlier ones whatever its order value, so the answer would depend on "
            f"how the sources hand files over; choose {fix}.option('merge', 'batch') (keep "
            "micro-batch order)"
        )

    def arrival_fn(self) -> Callable[[Row], float | None] | None:
        """A function giving an event's arrival time (epoch seconds), if declared."""
        if self._arrival is None:
            return None
        return ArrivalColumn(self._arrival)

    def failure_watch(self, where: str) -> FailureWatch:
        """The account of failed transactions for one run (``where``: how to read them)."""
        names = {spec.index: name for name, spec in self.spec.inputs.items()}
        return FailureWatch(self.spec.name, names, where, self._all_fail_limit)

    def run_local(
        self,
        batches: Sequence[Iterable[tuple[str, Row]]],
        store: str | Path,
        partitions: int = 2,
        end_inputs: bool = True,
        tasks: int = 1,
    ) -> LocalRunner:
        """Run the job in this process over ``batches`` of ``(input, row)``; returns the runner.

        Failed transactions are logged as each batch commits, and the run ends with
        a :class:`~txstream.spark.runtime.failures.TransactionFailuresWarning`
        counting them when there are any (as a query's ``processAllAvailable()``).
        The merge is :meth:`merge_for` ``("run_local")``.  Under the event-time
        merge, ``end_inputs`` (the default) ends the inputs after the last batch:
        when events are held, one more committed batch without events runs them
        (:meth:`LocalRunner.end_inputs`); ``end_inputs=False`` leaves them held
        for a later run on the same store.  ``tasks`` > 1 runs each batch's phase
        1 in that many threads that forward rows to each other over local
        sockets, as Spark's tasks do (a test of the exchange, not a speed-up).

        A second run on the same store goes on from its last committed batch:

        >>> import txstream as tx
        >>> def add(t, e):
        ...     row = t.read("sums", e["k"], default={"total": 0})
        ...     t.upsert("sums", {"k": e["k"], "total": row["total"] + e["v"]})
        >>> job = tx.Job().table("sums", key="k").input("ev", None, keys="k").on("ev", add)
        >>> runner = job.run_local([[("ev", {"k": "a", "v": 1})], [("ev", {"k": "a", "v": 2})]],
        ...                        "ckpt/run", partitions=3)
        >>> len(runner.stats), runner.stats[-1]["committed"]
        (2, 1)
        >>> runner = job.run_local([[("ev", {"k": "a", "v": 4})]], "ckpt/run", partitions=3)
        >>> runner.prev, tx.read_table("ckpt/run", "sums")
        (2, [{'k': 'a', 'total': 7}])
        """
        check_place(store, "run_local(store)")
        self.validate()
        merge = self.merge_for("run_local")  # (event-time only when every input is ordered)
        runner = LocalRunner(
            self.spec, store, partitions, self._snapshot_every, merge, tasks, self._watermarks
        )
        runner.arrival = self.arrival_fn()
        if merge == "event-time":
            # A bounded run ends its inputs: without idleBatches chosen, a quiet
            # input holds the others back until it delivers or ends (the serial
            # answer whatever the hand-over); end_inputs=False keeps Spark's rule.
            unbounded = self._idle_chosen or not end_inputs
            runner.idle_batches = self._idle_batches if unbounded else NEVER_QUIET
        todo: Iterable[Iterable[tuple[str, Row]]] = batches
        if merge == "event-time" and end_inputs:
            todo = _ended(batches, runner)
        deliver(runner.store, self._sinks)  # as at a query's start: any a crash left
        unchecked = self._arrival is not None
        watch = self.failure_watch(f"tx.read_failures({str(store)!r})")
        for batch in todo:
            if unchecked and batch is not _END:
                # as start() checks the inputs' schemas: a column no row has is a typo
                # (rows carry no schema: the first batch with rows stands for them)
                batch = list(batch)
                if batch:
                    unchecked = False
                    _check_arrival(str(self._arrival), batch)
            stats = runner.end_inputs() if batch is _END else runner.run_batch(batch)
            watch.after_batch(stats)
            deliver(runner.store, self._sinks, [runner.prev])  # as on Spark: once it commits
            try:
                stop_on_error(stats, self._on_error)
                watch.check()
            except TxStreamError:
                watch.warn(stacklevel=3)
                raise
        watch.warn(stacklevel=3)
        return runner

    def start(
        self,
        checkpoint: str | Path,
        spark: SparkSession | None = None,
        partitions: int | None = None,
        engine: str = "executors",
    ) -> TxQuery:
        """Start the job on Spark; returns a :class:`~txstream.spark.runtime.query.TxQuery`.

        ``checkpoint`` holds Spark's checkpoint (``spark/``) and txstream's store
        (``txstream/``); it must be on a file system every executor reaches.
        ``engine``: ``executors`` (partitions on Spark executors, the default) or
        ``driver`` (the SS2PL transaction manager in the driver, for comparisons).

        Declarations are checked before Spark is touched, so a wrong job fails in
        one line without a session; running one needs a live Spark session:

        >>> import txstream as tx
        >>> tx.Job("unfinished").input("ev", None, keys="k").start("ckpt/start")
        Traceback (most recent call last):
        txstream.spark.runtime.errors.RuntimeJobError: input 'ev' has no transaction function; add
        one with .on('ev', fn)
        >>> query = job.start(checkpoint="ckpt/alerts")    # doctest: +SKIP
        >>> query.processAllAvailable(); query.stop()      # doctest: +SKIP
        """
        check_place(checkpoint, "start(checkpoint)")
        self._dataframe_watermarks()
        self.validate()
        self.merge_for("start")  # ordered and unordered inputs: a merge chosen (see there)
        from txstream.spark.runtime.query import TxQuery

        if partitions is not None:  # (0 is refused, not taken for "the default")
            partitions = check_partitions(partitions, "start partitions")
        chosen = self._partitions if partitions is None else partitions
        return TxQuery.start(self, Path(checkpoint), spark, chosen, engine)

    def _dataframe_watermarks(self) -> None:
        """Take an input's watermark from ``withWatermark`` on its DataFrame, if not declared.

        Read from the analyzed plan's text before Spark starts anything; a
        watermark on another column than the input's order column is refused
        (the merge delays order values only).
        """
        for name, spec in self.spec.inputs.items():
            plan = _plan_text(spec.source)
            if plan is None:
                continue
            marks = plan_watermarks(plan)
            other = [column for column, _ in marks if column != spec.order]
            if other and name not in self._watermarks and spec.order is None:
                raise RuntimeJobError(
                    f"input {name!r}: withWatermark is on column {other[0]!r}, and the input "
                    f"declares no order column; declare order={other[0]!r} (the merge delays "
                    "order values), or leave withWatermark out"
                )
            if other and name not in self._watermarks:
                raise RuntimeJobError(
                    f"input {name!r}: withWatermark is on column {other[0]!r}, not on the "
                    f"order column {spec.order!r}; put it on {spec.order!r}, or give "
                    ".input(..., watermark=...)"
                )
            if marks and name not in self._watermarks:
                self._watermarks[name] = watermark_delay(marks[-1][1], f"input {name!r}")


def _plan_text(source: Any) -> str | None:
    """A DataFrame's analyzed logical plan as text (None: not a Spark DataFrame)."""
    jdf = getattr(source, "_jdf", None)
    if jdf is None:
        explain = getattr(source, "_explain_string", None)  # a Spark Connect DataFrame
        if explain is None or not type(source).__module__.startswith("pyspark.sql.connect"):
            return None
        # (no py4j over Connect: the server's explain text, its analyzed plan only)
        text = str(explain(extended=True))
        analyzed = text.partition("== Analyzed Logical Plan ==")[2]
        return analyzed.partition("== Optimized Logical Plan ==")[0]
    return str(jdf.queryExecution().analyzed().toString())


class ArrivalColumn:
    """An event's arrival time read from its column ``column`` (epoch seconds), or None.

    A class rather than a closure so that the executor can see the column and
    read plain floats inline (once per event).
    """

    def __init__(self, column: str) -> None:
        self.column = column

    def __call__(self, row: Row) -> float | None:
        return _seconds(row.get(self.column))


def _check_arrival(column: str, batch: list[tuple[str, Row]]) -> None:
    """Refuse option ``arrivalTime`` naming a column that no row of ``batch`` has."""
    if any(isinstance(row, dict) and column in row for _, row in batch):
        return
    seen = sorted({c for _, row in batch if isinstance(row, dict) for c in row})
    raise RuntimeJobError(
        f"option arrivalTime names column {column!r}, which no row of the first batch has "
        f"(its columns: {', '.join(map(str, seen)) or 'none'})"
    )


def _seconds(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _name(kind: str, name: str, known: dict[str, Any]) -> None:
    if not isinstance(name, str) or not name.replace("_", "").isalnum():
        raise RuntimeJobError(f"a {kind} name is letters, digits and _, not {name!r}")
    if name in known:
        raise RuntimeJobError(f"{kind} {name!r} is declared twice")


def _claimed(sink: Any) -> tuple[str, ...] | None:
    """The target a built-in sink claims for one output (see ``sinks.SinkOwner``), else None."""
    target = getattr(sink, "target", None)
    return target() if getattr(sink, "claims", False) is True and callable(target) else None


def dumps(obj: Any) -> bytes:
    """Pickle for the task payloads."""
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


__all__ = ["Job"]


def _whole(key: str, value: Any, least: int, what: str) -> int:
    """Option ``key``'s value: an int (no bool) of at least ``least``; else ``what`` it must be."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise RuntimeJobError(f"option {key} must be {what}, not {value!r}")
    return value


def _one_of(key: str, value: Any, choices: tuple[str, ...]) -> Any:
    """Option ``key``'s value, one of ``choices`` (a one-line error naming them otherwise)."""
    if value not in choices:
        raise RuntimeJobError(f"option {key} is one of {choices}, not {value!r}")
    return value
