"""Watching a running job on Spark: progress, Spark's own listener, ids, plan, logs, errors.

Two Spark tests (the shared session): a job run twice on one checkpoint, and a
job whose input Spark cannot read.  ``tests/test_observability.py`` covers the
same methods without Spark.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

import txstream as tx

pytestmark = pytest.mark.spark


def _write(folder: Path, name: str, rows: list[dict[str, Any]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def _wait_for_listeners(spark: Any) -> None:
    """Let Spark's listener bus hand its queued events to the listeners (not a timing)."""
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()


def test_progress_reaches_the_callback_and_sparks_listener_with_the_same_ids(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    from pyspark.sql.streaming import StreamingQueryListener

    class Seen(StreamingQueryListener):  # type: ignore[misc]
        def __init__(self) -> None:
            self.progress: list[tuple[str, str, int, int]] = []

        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            p = event.progress
            self.progress.append((str(p.id), str(p.runId), p.batchId, p.numInputRows))

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    def deposit(t: Any, e: Any) -> None:  # (here: the workers unpickle it by value)
        row = t.read("accounts", e["acct"], default={"balance": 0})
        t.upsert("accounts", {"acct": e["acct"], "balance": row["balance"] + e["amount"]})

    folder = tmp_path / "in"
    _write(folder, "a.json", [{"acct": n % 3, "amount": n} for n in range(6)])
    deposits = spark.readStream.schema("acct long, amount long").json(str(folder))
    ours: list[dict[str, Any]] = []
    job = (
        tx.Job("watched-ledger")
        .table("accounts", key="acct")
        .input("deposits", deposits, keys="acct")
        .on("deposits", deposit)
        .on_progress(ours.append)
        .trigger(availableNow=True)
    )
    listener = Seen()
    spark.streams.addListener(listener)
    runs = []
    try:
        with caplog.at_level(logging.INFO, logger="txstream"):
            for extra in ([], [{"acct": 1, "amount": 100}]):
                if extra:
                    _write(folder, "b.json", extra)
                query = job.start(tmp_path / "ckpt", spark=spark, partitions=2)
                try:
                    query.processAllAvailable()
                    runs.append((query.id, query.runId, query.exception()))
                    query.explain()
                finally:
                    query.stop()
        _wait_for_listeners(spark)
    finally:
        spark.streams.removeListener(listener)
    (first_id, first_run, error1), (second_id, second_run, error2) = runs
    assert error1 is None and error2 is None
    assert first_id == second_id and first_run != second_run  # id: the checkpoint's
    assert [(p["runId"], p["batchId"], p["numInputRows"], p["committed"]) for p in ours] == [
        (first_run, 0, 6, 6),
        (second_run, 1, 1, 1),
    ]
    assert {p["id"] for p in ours} == {first_id} and ours[-1]["name"] == "watched-ledger"
    # Spark's own listener sees the same query, run and batches (its progress
    # has Spark's counters: txstream's are in the callback, see docs/spark.md).
    spark_seen = [p for p in listener.progress if p[0] == first_id]
    assert [(run, batch, rows) for _, run, batch, rows in spark_seen] == [
        (first_run, 0, 6),
        (second_run, 1, 1),
    ]
    plan = capsys.readouterr().out
    assert f"txstream job 'watched-ledger' (id {first_id}, runId {second_run})" in plan
    assert "input deposits: keys acct (streaming DataFrame)" in plan
    assert "== Physical Plan ==" in plan and "FileScan json" in plan
    logged = [r.getMessage() for r in caplog.records if r.name == "txstream.runtime"]
    assert any(
        m.startswith("job 'watched-ledger' batch 0 committed: 6 events, 6 committed")
        for m in logged
    )
    assert any("resuming after committed batch 0" in m for m in logged)
    assert "job 'watched-ledger' stopped after 1 committed batch(es) of this run" in logged
    assert tx.read_table(tmp_path / "ckpt" / "txstream", "accounts") == [
        {"acct": 0, "balance": 3},
        {"acct": 1, "balance": 105},
        {"acct": 2, "balance": 7},
    ]


def test_a_spark_failure_is_one_line_with_pysparks_exception_as_its_cause(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from pyspark.errors import PySparkException

    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "a.json").write_text('{"k": 1}\n{"k": oops\n')
    source = spark.readStream.schema("k long").option("mode", "FAILFAST").json(str(folder))
    job = tx.Job("unreadable").input("e", source, keys="k").on("e", lambda t, e: None)
    caplog.set_level(logging.INFO, logger="txstream")  # (before the batch's thread logs)
    query = job.trigger(availableNow=True).start(tmp_path / "ckpt", spark=spark, partitions=1)
    try:
        with pytest.raises(tx.SparkJobError) as caught:
            query.awaitTermination()
    finally:
        query.stop()
    error = caught.value
    assert str(error).startswith("job 'unreadable' failed: ") and "\n" not in str(error)
    assert isinstance(error.__cause__, PySparkException)
    assert error.__cause__.getCondition() == "STREAM_FAILED"
    # PySpark's condition of the innermost cause (inside STREAM_FAILED's message).
    assert error.spark_condition == "FAILED_READ_FILE.NO_HINT", str(error)
    assert "[FAILED_READ_FILE.NO_HINT] Encountered error while reading file" in str(error)
    assert error.getCondition() == "TXSTREAM_SPARK_FAILURE"
    later = query.exception()
    assert isinstance(later, tx.SparkJobError) and str(later) == str(error)
    assert isinstance(later.__cause__, PySparkException)
    assert any(
        r.getMessage().startswith("job 'unreadable' failed in batch 0: ") for r in caplog.records
    )
