"""``run_local`` orders dates, timestamps and decimals as Spark does; refuses what it cannot.

Moved from ``tests/test_runtime.py`` (split by subject); shared helpers are in
``tests/runtime_jobs.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import txstream as tx


def ordered_job(order: str = "ts") -> tx.Job:
    """Emits each event's n and its place in the declared order (one key, one partition)."""

    def step(t: tx.Tx, e: dict[str, Any]) -> None:
        if t.read("c", e["k"]) is None:
            t.insert("c", {"k": e["k"], "seq": 0})
        t.increment("c", e["k"], "seq", 1)
        t.emit("o", {"n": e["n"], "seq": t.read("c", e["k"])["seq"]})

    return (
        tx.Job("ordered")
        .table("c", key="k")
        .input("e", None, keys="k", order=order)
        .output("o", schema="n long, seq long")
        .on("e", step)
    )


def test_run_local_orders_a_date_column_by_day_as_spark_does(tmp_path: Path) -> None:
    import datetime as dt

    # test_a_date_order_column_orders_by_day runs the same rows on Spark.
    days = [dt.date(2024, 1, 3), dt.date(2024, 1, 1), dt.date(2024, 1, 2)]
    rows = [("e", {"k": 1, "n": n, "day": day}) for n, day in enumerate(days)]
    ordered_job("day").run_local([rows], tmp_path, 1)
    got = tx.read_output(tmp_path, "o", with_order=True)
    assert [(r["n"], r["seq"]) for r in got] == [(1, 1), (2, 2), (0, 3)]
    assert got[0]["__order"][1] == 1704067200.0  # 2024-01-01, midnight UTC in epoch seconds


def test_run_local_orders_timestamps_by_their_epoch_seconds_as_spark_does(tmp_path: Path) -> None:
    import datetime as dt
    from zoneinfo import ZoneInfo

    import pandas as pd

    utc = dt.UTC
    stamps = [
        dt.datetime(2024, 1, 1, 0, 0, 10, 250_000, tzinfo=utc),  # 1704067210.25
        dt.datetime(2024, 1, 1, 0, 0, 10),  # naive: read as UTC, 1704067210.0
        dt.datetime(2024, 1, 1, 0, 30, tzinfo=ZoneInfo("Europe/Paris")),  # 23:30 UTC the day before
        pd.Timestamp("2024-01-01 00:00:10.000001999"),  # nanoseconds go, as on Spark
        dt.datetime(1969, 12, 31, 23, 59, 59, 500_000, tzinfo=utc),  # before the epoch: -0.5
        pd.Timestamp("2024-01-01 01:00:05", tz="Europe/Paris"),  # 00:00:05 UTC
    ]
    rows = [("e", {"k": 1, "n": n, "ts": ts}) for n, ts in enumerate(stamps)]
    ordered_job().run_local([rows], tmp_path, 1)
    got = tx.read_output(tmp_path, "o", with_order=True)
    assert [(r["n"], r["__order"][1]) for r in got] == [
        (4, -0.5),
        (2, 1704065400.0),
        (5, 1704067205.0),
        (1, 1704067210.0),
        (3, 1704067210.000001),
        (0, 1704067210.25),
    ]
    assert [r["seq"] for r in got] == list(range(1, 7))


def test_run_local_orders_decimal_values_as_spark_casts_them(tmp_path: Path) -> None:
    from decimal import Decimal

    # before: refused ("is a Decimal"), while Spark orders a DecimalType column
    values = [Decimal("2.50"), Decimal("-1"), Decimal("0.1")]
    rows = [("e", {"k": 1, "n": n, "ts": v}) for n, v in enumerate(values)]
    ordered_job().run_local([rows], tmp_path, 1)
    got = tx.read_output(tmp_path, "o", with_order=True)
    assert [(r["n"], r["__order"][1]) for r in got] == [(1, -1.0), (2, 0.1), (0, 2.5)]
    # A NaN is a failure with its input position (tests/test_runtime_order.py), not run.
    with pytest.warns(tx.TransactionFailuresWarning, match=r"non-finite order value \(NaN\)"):
        ordered_job().run_local(
            [[("e", {"k": 1, "n": 0, "ts": Decimal("NaN")})]], tmp_path / "x", 1
        )


def test_run_local_reports_pandas_missing_time_as_a_null_order_value(tmp_path: Path) -> None:
    import pandas as pd

    rows = [("e", {"k": 1, "n": 0, "ts": pd.Timestamp("2024-01-01")})]
    rows.append(("e", {"k": 1, "n": 1, "ts": pd.NaT}))  # Spark reads NaT as null
    ordered_job().run_local([rows], tmp_path, 1)
    assert [(f["position"], f["error"]) for f in tx.read_failures(tmp_path)] == [
        ("e#1", "SchemaError: the event has a null order value; it was not run")
    ]
    assert [r["n"] for r in tx.read_output(tmp_path, "o")] == [0]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "2024-01-01T00:00:10",
            "e#0: order column 'ts' is a str ('2024-01-01T00:00:10'); an order column is a "
            "number, a timestamp or a date: convert it first, e.g. datetime.fromisoformat(text) "
            "for ISO-8601 times, or float(text) for numbers written as text",
        ),
        (
            True,
            "e#0: order column 'ts' is a bool (True); an order column is a number, a timestamp "
            "or a date: convert it first",
        ),
    ],
)
def test_run_local_refuses_an_order_value_spark_cannot_order_by_in_one_line(
    tmp_path: Path, value: Any, message: str
) -> None:
    # job.start refuses a string column in one line too, with a hint for DataFrames
    # (test_start_refuses_an_order_column_spark_cannot_order_by_before_anything_runs).
    with pytest.raises(tx.RuntimeJobError) as caught:
        ordered_job().run_local([[("e", {"k": 1, "n": 0, "ts": value})]], tmp_path, 1)
    assert str(caught.value) == message
    with pytest.raises(tx.RuntimeJobError, match=r"^e#0: the row has no order column 'ts'$"):
        ordered_job().run_local([[("e", {"k": 1, "n": 0})]], tmp_path / "other", 1)
