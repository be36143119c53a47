"""Failed transactions speak: logged per committed batch, warned, and a job bug stops the job.

All in process (``run_local``); one Spark test in ``test_runtime_spark.py`` checks
the query's ``processAllAvailable()``/``stop()`` warnings and the stop on Spark.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import pytest

import txstream as tx
from txstream.spark.runtime.failures import LOGGED_PER_BATCH

Item = tuple[str, dict[str, Any]]


def job(on_a: Any = None, on_b: Any = None, **options: Any) -> tx.Job:
    """Two inputs on a counter table; A's function fails when its event says ``boom``."""

    def count(t: Any, e: dict[str, Any]) -> None:
        if e.get("boom"):
            raise ValueError(f"boom at {e['id']}")
        if e.get("no"):
            t.abort("no")
        t.upsert("acc", {"k": e["k"], "v": e["id"]})
        t.emit("out", {"id": e["id"]})

    built = (
        tx.Job("failing")
        .table("acc", key="k", schema="k long, v long")
        .input("A", None, keys="k", order="id")
        .input("B", None, keys="k", order="id")
        .output("out", schema="id long")
        .on("A", on_a or count)
        .on("B", on_b or count)
        .option("merge", "batch")  # (failures counted per batch as handed over)
    )
    for key, value in options.items():
        built.option(key, value)
    return built


def events(name: str, ids: range, **extra: Any) -> list[Item]:
    return [(name, {"k": i % 5, "id": i, **extra}) for i in ids]


def bad_emit(t: Any, e: dict[str, Any]) -> None:
    t.emit("out", {"id": str(e["id"])})  # never fits 'id long'


# -- logged ---------------------------------------------------------------------------
def test_failed_transactions_are_logged_with_position_and_error_when_the_batch_commits(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    batch = [*events("A", range(3)), ("A", {"k": 1, "id": 3, "boom": True})]
    batch += [("B", {"k": 2, "id": 4, "no": True})]
    with caplog.at_level(logging.INFO, logger="txstream.runtime"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        job().run_local([batch], tmp_path, partitions=2)
    records = [r for r in caplog.records if r.name == "txstream.runtime"]
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (
            logging.WARNING,
            "job 'failing', batch 0: transaction at A#3 rolled back (error): ValueError: boom at 3",
        ),
        (
            logging.INFO,
            "job 'failing', batch 0: transaction at B#4 rolled back (abort): "
            "TransactionAborted: no",
        ),
    ]


def test_a_batch_with_many_failures_logs_the_first_ones_and_counts_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    many = LOGGED_PER_BATCH + 15
    batch = events("A", range(many), boom=True) + events("B", range(many, many + 1))
    with caplog.at_level(logging.INFO, logger="txstream.runtime"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        job().run_local([batch], tmp_path, partitions=2)
    lines = [r.getMessage() for r in caplog.records if r.name == "txstream.runtime"]
    assert len(lines) == LOGGED_PER_BATCH + 1
    assert lines[0].endswith("transaction at A#0 rolled back (error): ValueError: boom at 0")
    assert lines[-1].startswith("job 'failing', batch 0: 15 more transaction(s) rolled back")
    assert len(tx.read_failures(tmp_path)) == many  # all recorded, whatever is logged


# -- warned ---------------------------------------------------------------------------
def test_run_local_warns_with_the_count_of_failures_and_where_to_read_them(
    tmp_path: Path,
) -> None:
    batches = [
        [*events("A", range(4)), ("A", {"k": 1, "id": 4, "boom": True})],
        [("A", {"k": 1, "id": 5, "boom": True}), ("B", {"k": 1, "id": 6, "no": True})],
    ]
    with pytest.warns(tx.TransactionFailuresWarning) as caught:
        job().run_local(batches, tmp_path / "s", partitions=2)
    (warning,) = caught
    text = str(warning.message)
    assert "2 transaction(s) failed" in text  # tx.abort is the function's choice: not counted
    assert "first at A#4: ValueError: boom at 4" in text
    assert f"tx.read_failures({str(tmp_path / 's')!r})" in text
    assert warning.filename == __file__  # it points at the caller's line


def test_run_local_without_failures_or_with_only_aborts_does_not_warn(tmp_path: Path) -> None:
    batch = [*events("A", range(4)), ("B", {"k": 1, "id": 9, "no": True})]
    with warnings.catch_warnings():
        warnings.simplefilter("error", tx.TransactionFailuresWarning)
        job().run_local([batch], tmp_path, partitions=2)


# -- a job bug stops the job ----------------------------------------------------------
@pytest.mark.parametrize(
    ("on_a", "error"),
    [
        (bad_emit, "SchemaError: emit to out: column 'id' is long, got '0'"),
        (lambda t, e: t.emit("typo", {"id": e["id"]}), "SchemaError: emit to unknown output"),
        (lambda t, e: t.read("acc", e["k"] + 1), "UndeclaredKeyError: acc: partition value 1"),
    ],
)
def test_an_input_whose_transactions_all_fail_with_a_job_error_stops_the_job_in_one_line(
    tmp_path: Path, on_a: Any, error: str
) -> None:
    batches = [events("A", range(0, 8)) + events("B", range(100, 108))] + [
        events("A", range(i, i + 8)) for i in range(8, 40, 8)
    ]
    with pytest.raises(tx.InputFailingError) as raised, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        job(on_a).run_local(batches, tmp_path, partitions=2)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(
        f"input 'A': all 24 of its transactions since the job started "
        f"failed, the first at A#0 with {error}"
    )
    assert "allFailLimit" in message
    # The 3 batches that ran are committed, the 20th failure's batch with them: B's
    # rows are there, A's transactions are all recorded as rolled back.
    store = tx.LocalRunner(job(on_a).spec, tmp_path, 2)
    assert store.batch == 3
    assert len(tx.read_failures(tmp_path)) == 24
    assert [r["id"] for r in tx.read_output(tmp_path, "out")] == list(range(100, 108))
    # Fixed, the job restarts on the same store and goes on from the next batch.
    job().run_local(batches[3:], tmp_path, partitions=2)
    assert [r["id"] for r in tx.read_output(tmp_path, "out")][8:] == list(range(24, 40))


def test_the_stop_needs_the_limit_of_failures_and_no_commit_of_the_input(tmp_path: Path) -> None:
    short = [events("A", range(0, 19))]  # 19 < 20: a warning, no stop
    with pytest.warns(tx.TransactionFailuresWarning, match="19 transaction"):
        job(bad_emit).run_local(short, tmp_path / "short", partitions=2)

    def sometimes(t: Any, e: dict[str, Any]) -> None:  # one commit: not a bug of every txn
        t.emit("out", {"id": e["id"] if e["id"] == 7 else str(e["id"])})

    batches = [events("A", range(0, 30)), events("A", range(30, 60))]
    with pytest.warns(tx.TransactionFailuresWarning, match="59 transaction"):
        job(sometimes).run_local(batches, tmp_path / "one", partitions=2)
    with pytest.warns(tx.TransactionFailuresWarning, match="60 transaction"):
        job(bad_emit, allFailLimit=0).run_local(batches, tmp_path / "off", partitions=2)
    # Errors of the data (a function that raises, a null key) are not the job's bug.
    data = [[*events("A", range(0, 30), boom=True), ("A", {"k": None, "id": 99})]]
    with pytest.warns(tx.TransactionFailuresWarning, match="31 transaction"):
        job().run_local(data, tmp_path / "data", partitions=2)


def test_the_stop_counts_per_input_and_names_the_failing_one(tmp_path: Path) -> None:
    batches = [events("A", range(0, 25)) + events("B", range(100, 125))]
    with pytest.raises(tx.InputFailingError, match=r"^input 'B': all 25"):  # noqa: SIM117
        with pytest.warns(tx.TransactionFailuresWarning, match="25 transaction"):
            job(on_b=bad_emit).run_local(batches, tmp_path, partitions=2)
    assert [r["id"] for r in tx.read_output(tmp_path, "out")] == list(range(25))


def test_the_option_is_checked() -> None:
    with pytest.raises(tx.RuntimeJobError, match="allFailLimit must be an integer >= 0"):
        tx.Job().option("allFailLimit", -1)
