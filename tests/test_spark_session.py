"""The shared local SparkSession starts and runs a job (one of the few Spark tests)."""

import pytest

pytestmark = pytest.mark.spark


def test_local_session_runs_a_job(spark) -> None:  # type: ignore[no-untyped-def]
    df = spark.range(10).selectExpr("id % 3 AS k").groupBy("k").count()
    assert sorted((r["k"], r["count"]) for r in df.collect()) == [(0, 4), (1, 3), (2, 3)]
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"


def test_the_jvms_compile_with_c1_unless_the_caller_sets_java_options(spark) -> None:  # type: ignore[no-untyped-def]
    from txstream.spark.session import JVM_OPTIONS, _settings

    assert spark.conf.get("spark.driver.extraJavaOptions") == JVM_OPTIONS
    mine = {"spark.executor.extraJavaOptions": "-Xss4m"}
    settings = _settings({"sql_shuffle_partitions": 4, "conf": mine})
    assert settings["spark.sql.shuffle.partitions"] == "4"
    assert settings["spark.executor.extraJavaOptions"] == "-Xss4m"
    assert settings["spark.driver.extraJavaOptions"] == JVM_OPTIONS
