"""Bad declarations, bad rows and failures inside Spark: one line naming the cause.

Mostly without Spark: a fake streaming DataFrame stands for what ``start``
reads before Spark starts, and Spark's messages are given as text.

Moved from ``tests/test_runtime.py`` (split by subject); shared helpers are in
``tests/runtime_jobs.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import txstream as tx
from runtime_jobs import FakeStream, counter_job
from txstream.bench.ledger import ledger_job


def test_unknown_names_and_bad_declarations_fail_with_one_line() -> None:
    with pytest.raises(tx.UnknownNameError, match="unknown boundary 'hourly'"):
        tx.Job().boundary("hourly")
    with pytest.raises(tx.RuntimeJobError, match="positive finite"):
        tx.Job().boundary("seconds", seconds=float("nan"))
    with pytest.raises(tx.RuntimeJobError, match="'seconds': unknown option 'second'; it takes"):
        tx.Job().boundary("seconds", second=2)  # named, not an internal class's TypeError
    with pytest.raises(tx.RuntimeJobError, match="'timeslice': missing option 'of'"):
        tx.Job().boundary("timeslice", seconds=1)
    with pytest.raises(tx.RuntimeJobError, match="unknown option"):
        tx.Job().option("partitons", 2)
    with pytest.raises(tx.RuntimeJobError, match="no transaction function"):
        tx.Job().input("a", None, keys="k").validate()
    with pytest.raises(tx.RuntimeJobError, match="needs an order column"):
        tx.Job().input("a", None, keys="k").on("a", print).boundary("timestamp").validate()
    with pytest.raises(tx.RuntimeJobError, match="partition_by"):
        tx.Job().table("t", key="a", partition_by="b")


def test_rows_that_do_not_fit_the_schema_are_rejected(tmp_path: Path) -> None:
    stream = [("deposits", {"acct": 1, "amount": "ten", "id": 0})]
    ledger_job().run_local([stream], tmp_path, 1)
    (failure,) = tx.read_failures(tmp_path)
    assert "SchemaError" in failure["error"] and "balance" in failure["error"]


STREAM_FAILED = (
    "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: "
    "[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided "
    "function in foreach batch sink. Reason: An exception was raised by the Python "
    "Proxy. Return Message: Traceback (most recent call last):\n"
    '  File "py4j/clientserver.py", line 644, in _call_proxy\n'
)
"""How Spark's message of a failed foreachBatch function begins (abridged)."""


def test_a_python_failure_inside_spark_is_one_line_naming_its_cause() -> None:
    from txstream.spark.runtime.spark_errors import one_line

    # What Spark raises when a Python worker cannot unpickle the job's functions
    # (their module is not on the executors' path), abridged.
    text = (
        STREAM_FAILED
        + "pyspark.errors.exceptions.captured.PythonException: An exception was thrown "
        "from the Python worker:\n"
        "Traceback (most recent call last):\n"
        '  File "pyspark/serializers.py", line 483, in loads\n'
        "    return cloudpickle.loads(obj, encoding=encoding)\n"
        "ModuleNotFoundError: No module named 'myjob'\n"
        " SQLSTATE: 39000 SQLSTATE: XXKST\n"
        "=== Streaming Query ===\n"
        "Identifier: job [id = 1]\n"
    )
    assert one_line(RuntimeError(text)) == (
        "ModuleNotFoundError: No module named 'myjob' (Spark's Python workers unpickle "
        "the job's functions and import the modules they name: define them in the driver's "
        "script, ship their module with spark.sparkContext.addPyFile(path), or install it "
        "where the workers run)"
    )
    jvm = "[STREAM_FAILED] Query terminated: [FAILED_READ_FILE] x.json\n  at org.apache.Foo"
    assert one_line(RuntimeError(jvm)) == jvm.splitlines()[0]


def test_run_local_refuses_a_row_without_its_key_in_one_line_naming_it(tmp_path: Path) -> None:
    job = counter_job()
    with pytest.raises(tx.RuntimeJobError, match=r"^ev#b1\+1: the row has no key column 'k'$"):
        job.run_local(
            [[("ev", {"k": 1, "ts": 1})], [("ev", {"k": 2, "ts": 2}), ("ev", {"ts": 3})]], tmp_path
        )


def test_an_event_with_a_null_key_or_order_value_is_reported_not_run(tmp_path: Path) -> None:
    # A file source turns a missing or unreadable field into null: such an event
    # has no partition (or no place in the order). It is reported with its input
    # position like a failed transaction, and the batch goes on (Spark's phase-1
    # task does the same; it used to drop a null key silently and run a null
    # order value first).
    batch = [
        ("ev", {"k": 1, "ts": 1}),
        ("ev", {"k": None, "ts": 2}),
        ("ev", {"k": 1, "ts": None}),
        ("ev", {"k": 1, "ts": 4}),
    ]
    runner = counter_job().run_local([batch], tmp_path)
    failures = [(f["position"], f["error"]) for f in tx.read_failures(tmp_path)]
    assert failures == [  # in the declared order: a null order value counts as 0
        ("ev#2", "SchemaError: the event has a null order value; it was not run"),
        ("ev#1", "SchemaError: the event has a null key; it was not run"),
    ]
    assert runner.stats[0]["committed"] == 2 and runner.stats[0]["aborted"] == 2
    with pytest.raises(
        tx.TxStreamError, match="ev#2 failed: SchemaError: the event has a null order"
    ):
        counter_job().option("onError", "stop").run_local([batch], tmp_path / "stop")


def test_a_spark_failure_under_the_foreach_batch_function_is_one_line_naming_its_cause() -> None:
    from txstream.spark.runtime.spark_errors import one_line

    # What Spark raised when a string order column held ISO-8601 times: Spark's
    # first line ends in "Traceback (most recent call last):" and the cause is
    # the Spark error class of a job the function started (abridged).
    text = (
        STREAM_FAILED + "    return_value = getattr(self.pool[obj_id], method)(*params)\n"
        '  File "txstream/spark/runtime/query.py", line 632, in phase1\n'
        "    stats = [pickle.loads(r[0]) for r in rows.collect()]\n"
        '  File "pyspark/errors/exceptions/captured.py", line 262, in deco\n'
        "    raise converted from None\n"
        "pyspark.errors.exceptions.captured.NumberFormatException: [CAST_INVALID_INPUT] "
        "The value '2024-01-01T00:00:10' of the type \"STRING\" cannot be cast to "
        '"DOUBLE" because it is malformed. SQLSTATE: 22018\n'
        "== SQL (line 1, position 1) ==\n"
        "cast(`ts` as double)\n"
        "^^^^^^^^^^^^^^^^^^^^\n"
        "\n"
        " SQLSTATE: 39000 SQLSTATE: XXKST\n"
        "=== Streaming Query ===\n"
        "Identifier: job [id = 1]\n"
    )
    assert one_line(RuntimeError(text)) == (
        "[CAST_INVALID_INPUT] The value '2024-01-01T00:00:10' of the type \"STRING\" "
        'cannot be cast to "DOUBLE" because it is malformed.'
    )
    # A JVM failure under a Spark job the function started (no error class).
    jvm = text.split("pyspark.errors")[0] + (
        "py4j.protocol.Py4JJavaError: An error occurred while calling o97.collectToPython.\n"
        ": java.lang.OutOfMemoryError: Java heap space\n"
        "\tat java.base/java.util.Arrays.copyOf(Arrays.java:3537)\n"
        "=== Streaming Query ===\n"
    )
    assert one_line(RuntimeError(jvm)) == "java.lang.OutOfMemoryError: Java heap space"


def test_start_refuses_an_order_column_spark_cannot_order_by_before_anything_runs(
    tmp_path: Path,
) -> None:
    from txstream.spark.runtime.inputs import check_inputs, order_value

    def job(ddl: str, order: str = "ts") -> tx.Job:
        return (
            tx.Job("o")
            .input("e", FakeStream(ddl), keys="k", order=order)
            .on("e", lambda t, e: None)
        )

    # spark=object(): the check must come before Spark is used at all.
    with pytest.raises(tx.RuntimeJobError) as caught:
        job("k long, ts string").start(tmp_path / "ck", spark=object())
    message = str(caught.value)
    assert message.startswith(
        "input 'e': order column 'ts' is StringType; an order column is a number, a timestamp "
        "or a date: convert it first, e.g. df.withColumn('ts', F.to_timestamp('ts'))"
    )
    assert "\n" not in message and not (tmp_path / "ck").exists()
    for ddl in ("k long, ts timestamp_ntz", "k long, ts boolean", "k long, ts array<long>"):
        with pytest.raises(tx.RuntimeJobError, match=r"order column 'ts' is .*Type; an order"):
            check_inputs(job(ddl))
    with pytest.raises(tx.RuntimeJobError, match=r"order column 'x' is not in its schema \(k, ts"):
        check_inputs(job("k long, ts long", order="x"))
    for kind in ("int", "long", "double", "decimal", "timestamp", "date"):
        check_inputs(job(f"k long, ts {kind}"))
    # Spark casts a timestamp to its epoch seconds, but refuses to cast a date.
    date, stamp = (FakeStream(f"ts {kind}").schema["ts"].dataType for kind in ("date", "timestamp"))
    assert order_value("ts", date) == "cast(unix_date(`ts`) as double) * 86400"
    assert order_value("ts", stamp) == "cast(`ts` as double)"


def test_arrival_time_must_name_a_numeric_column_of_an_input(tmp_path: Path) -> None:
    from txstream.spark.runtime.inputs import check_inputs

    for bad in (5, "", None):
        with pytest.raises(tx.RuntimeJobError, match="option arrivalTime is the name of an input"):
            tx.Job().option("arrivalTime", bad)

    def job(arrival: str) -> tx.Job:
        return (
            tx.Job("a")
            .input("d", FakeStream("acct long, sent double, at timestamp"), keys="acct")
            .input("c", FakeStream("id long"))
            .on("d", lambda t, e: None)
            .on("c", lambda t, e: None)
            .option("arrivalTime", arrival)
        )

    with pytest.raises(tx.RuntimeJobError) as caught:
        check_inputs(job("nocol"))
    assert str(caught.value) == (
        "option arrivalTime names column 'nocol', which no input has (d: acct, sent, at; c: id)"
    )
    with pytest.raises(tx.RuntimeJobError, match="column 'at' of input 'd' is TimestampType"):
        check_inputs(job("at"))
    check_inputs(job("sent"))  # an input without the column: its events have no latency
    # run_local has rows, no schemas: the first batch with rows stands for them
    rows = [[], [("d", {"acct": 1, "sent": 5.0}), ("c", {"id": 2})]]
    with pytest.raises(tx.RuntimeJobError) as caught:
        job("snet").run_local(iter(rows), tmp_path / "typo", 1)
    assert str(caught.value) == (
        "option arrivalTime names column 'snet', which no row of the first batch has "
        "(its columns: acct, id, sent)"
    )
    runner = job("sent").run_local((iter(b) for b in rows), tmp_path / "ok", 1)
    assert runner.prev == 1  # both batches ran, the generators' rows included


def test_the_spark_handle_raises_the_class_of_the_error_that_failed_a_batch(
    tmp_path: Path,
) -> None:
    from txstream.spark.runtime.boundaries import GroupOrderError
    from txstream.spark.runtime.query import TxQuery

    job = counter_job("by", group=lambda e: e["g"])
    query = TxQuery(job, tmp_path, None, 2, "executors")
    refused = "batch 3: boundary 'by': the events of group 1 (...) and of group 2 (...) interleave"

    def run(df: Any, batch_id: int) -> None:
        raise GroupOrderError(refused)

    class FailedStream:  # what Spark raises once foreachBatch raised
        def processAllAvailable(self) -> None:
            raise RuntimeError(f"[STREAM_FAILED] ... Traceback ...\nGroupOrderError: {refused}")

        awaitTermination = processAllAvailable
        isActive = False

        def stop(self) -> None:
            pass

    query._run = run  # type: ignore[method-assign]
    with pytest.raises(GroupOrderError):
        query._on_batch(None, 3)  # in foreachBatch
    query.query = FailedStream()
    for call in (query.processAllAvailable, query.awaitTermination):
        with pytest.raises(GroupOrderError) as caught:
            call()
        assert str(caught.value) == refused and isinstance(caught.value, tx.RuntimeJobError)
        # Spark's exception is kept as the cause (issue 30: PySpark's error types).
        assert caught.value.__traceback__ is not None
        assert isinstance(caught.value.__cause__, RuntimeError)
        assert "[STREAM_FAILED]" in str(caught.value.__cause__)
    assert query.status["failure"] == refused
    query.stop()


def test_event_ids_stay_unique_past_128_spark_input_splits_and_positions_name_the_split() -> None:
    # Spark's monotonically_increasing_id() is split index * 2**33 + row: with 40
    # bits for the place in a batch, row r of split 128 of batch b had the id of
    # row r of split 0 of batch b + 1 (a Kafka topic of 200 partitions does that).
    from txstream.spark.runtime.boundaries import MID_BITS, position

    def mid(batch: int, split: int, row: int) -> int:
        return (batch << MID_BITS) + (split << 33) + row

    ids = {mid(b, s, r) for b in range(3) for s in (0, 1, 127, 128, 2**30) for r in (0, 5)}
    assert len(ids) == 3 * 5 * 2
    assert position("readings", mid(0, 0, 17)) == "readings#17"
    assert position("readings", mid(3, 0, 17)) == "readings#b3+17"
    assert position("readings", mid(3, 1, 17)) == "readings#b3+p1.17"
    assert position("readings", mid(0, 200, 4)) == "readings#p200.4"


def test_start_refuses_a_batch_dataframe_in_one_line_before_spark_starts(tmp_path: Path) -> None:
    # Spark would refuse it only when the stream starts (WRITE_STREAM_NOT_ALLOWED).
    batch = FakeStream("k long, ts long")
    batch.isStreaming = False
    job = tx.Job("b").input("e", batch, keys="k", order="ts").on("e", lambda t, e: None)
    with pytest.raises(tx.RuntimeJobError, match=r"^input 'e' is a batch DataFrame; give a stre"):
        job.start(tmp_path / "ck", spark=object())
    assert not (tmp_path / "ck").exists()


def test_the_spark_handle_counts_every_committed_batch_past_its_recent_progress(
    tmp_path: Path,
) -> None:
    from txstream.spark.runtime.query import RECENT, TxQuery

    query = TxQuery(counter_job(), tmp_path, None, 2, "executors")
    try:
        for batch in range(RECENT + 50):
            query._progressed({"batchId": batch})
        # committedBatches was len(recentProgress): stuck at 100 in a long run.
        assert query.status["committedBatches"] == RECENT + 50
        assert len(query.recentProgress) == RECENT
        assert query.lastProgress == {"batchId": RECENT + 49}
    finally:
        query.stop()
