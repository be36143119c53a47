"""The broadcast sweep as Spark tasks gives the rows the harness would (one small test)."""

from __future__ import annotations

import pytest

from txstream.bench.broadcast import run_task
from txstream.spark.sweep import run_points

pytestmark = pytest.mark.spark


def test_sweep_points_in_spark_match_local_runs(spark) -> None:  # type: ignore[no-untyped-def]
    tiny = {"transactions": 20, "measured": 10, "min_reps": 1, "max_reps": 1}
    todo = [
        ({"sweep": "client_txn_length", "x": x, "algorithm": a, **tiny}, seed)
        for seed, (x, a) in enumerate([(2, "f-matrix"), (3, "datacycle"), (2, "r-matrix")])
    ]
    rows = run_points(run_task, todo, spark=spark)
    local = [run_task(t) for t in todo]
    drop = ("wall_s",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in rows] == [
        {k: v for k, v in r.items() if k not in drop} for r in local
    ]
    assert run_points(run_task, [], spark=spark) == []
