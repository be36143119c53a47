"""Transaction functions on the runtime without Spark: errors, aborts, outputs.

Moved from ``tests/test_runtime.py`` (split by subject); shared helpers are in
``tests/runtime_jobs.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import txstream as tx
from runtime_jobs import counter_job, counts
from txstream.model import check
from txstream.spark.runtime.partitioning import partition_of


def test_a_failing_transaction_is_rolled_back_and_reported_with_its_position(
    tmp_path: Path,
) -> None:
    batch = [
        ("ev", {"k": 1, "ts": 1}),
        ("ev", {"k": 1, "ts": 2, "boom": True}),
        ("ev", {"k": 2, "ts": 3, "stop": True}),
        ("ev", {"k": 1, "ts": 4, "other": 99}),
    ]
    counter_job().run_local([batch], tmp_path)
    assert counts(tmp_path) == {1: 1}
    assert [r["ts"] for r in tx.read_output(tmp_path, "seen")] == [1]
    failures = tx.read_failures(tmp_path)
    assert [(f["position"], f["kind"]) for f in failures] == [
        ("ev#1", "error"),
        ("ev#2", "abort"),
        ("ev#3", "error"),
    ]
    assert "ValueError: boom" in failures[0]["error"]
    assert "not today" in failures[1]["error"]
    assert "UndeclaredKeyError" in failures[2]["error"] and "99" in failures[2]["error"]


def test_a_timestamp_transaction_spanning_partitions_aborts_everywhere(tmp_path: Path) -> None:
    keys = [k for k in range(40) if partition_of(k, 2) == 0][:1] + [
        k for k in range(40) if partition_of(k, 2) == 1
    ][:1]
    a, b = keys
    batch = [
        ("ev", {"k": a, "ts": 1}),
        ("ev", {"k": b, "ts": 1}),
        ("ev", {"k": a, "ts": 2}),
        ("ev", {"k": b, "ts": 2, "boom": True}),
        ("ev", {"k": a, "ts": 3}),
    ]
    runner = counter_job("timestamp").run_local([batch], tmp_path)
    # ts=2 is one transaction with a part on each partition: b's part failed,
    # so a's part must not stay applied either.
    assert counts(tmp_path) == {a: 2, b: 1}
    assert [r["ts"] for r in tx.read_output(tmp_path, "seen")] == [1, 1, 3]
    assert runner.stats[0]["aborted"] >= 1
    assert check(tx.read_history(tmp_path), "csao").holds


def test_a_spanning_transaction_that_raises_is_reported_once_with_its_error(
    tmp_path: Path,
) -> None:
    a = next(k for k in range(40) if partition_of(k, 2) == 0)
    b = next(k for k in range(40) if partition_of(k, 2) == 1)
    batch = [
        ("ev", {"k": a, "ts": 1}),
        ("ev", {"k": b, "ts": 1}),
        ("ev", {"k": b, "ts": 1, "boom": True}),
    ]
    runner = counter_job("timestamp").run_local([batch], tmp_path)
    # One transaction failed, in the function of ev#2: that is what is reported
    # (once, as an error, so that onError=stop stops), not the re-run's abort of
    # each of its parts.
    expected = [("b0_t1d0", "error", "ev#2", "ValueError: boom")]
    failures = tx.read_failures(tmp_path)
    assert [(f["txn"], f["kind"], f["position"], f["error"]) for f in failures] == expected
    stats = runner.stats[0]["failures"]
    assert [(f["txn"], f["kind"], f["position"], f["error"]) for f in stats] == expected
    # onError=stop: run_local stops as a query does, after the batch committed.
    job = counter_job("timestamp").option("onError", "stop")
    with pytest.raises(tx.TxStreamError, match=r"transaction at ev#2 failed: ValueError: boom"):
        job.run_local([batch, [("ev", {"k": a, "ts": 2})]], tmp_path / "stop")
    assert tx.read_output(tmp_path / "stop", "seen") == tx.read_output(tmp_path, "seen")


def test_output_lines_are_json_dumps_of_the_rows() -> None:
    import datetime

    from txstream.spark.runtime.outcome import _json_line

    rows = [
        {"id": 1, "ok": True, "__order": [1.5, 0, 7, 0]},
        {"s": 'é\n"', "n": None, "f": float("inf"), "nested": {"a": [1, 2.0]}},
        {"when": datetime.date(2026, 11, 25)},  # not JSON: as str, like default=str
    ]
    for row in rows:
        assert _json_line(row) == json.dumps(row, default=str)
    loop: dict[str, object] = {}
    loop["self"] = loop
    with pytest.raises(RecursionError):
        _json_line(loop)
    assert _json_line({"after": "a failed row"}) == '{"after": "a failed row"}'
