"""The shared local SparkSession starts and runs a job (one of the few Spark tests)."""

import pytest

pytestmark = pytest.mark.spark


def test_local_session_runs_a_job(spark) -> None:  # type: ignore[no-untyped-def]
    df = spark.range(10).selectExpr("id % 3 AS k").groupBy("k").count()
    assert sorted((r["k"], r["count"]) for r in df.collect()) == [(0, 4), (1, 3), (2, 3)]
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
