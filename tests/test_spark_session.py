"""The shared local SparkSession starts and runs a job (one of the few Spark tests).

And a failing job's stderr holds its one-line error, not Spark's stack traces.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parent.parent


def test_local_session_runs_a_job(spark) -> None:  # type: ignore[no-untyped-def]
    df = spark.range(10).selectExpr("id % 3 AS k").groupBy("k").count()
    assert sorted((r["k"], r["count"]) for r in df.collect()) == [(0, 4), (1, 3), (2, 3)]
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"


FAILING_JOBS = """
import json, sys
from pathlib import Path
import txstream as tx
from txstream.spark import local_session

root = Path(sys.argv[1])
spark = local_session("txstream-test-quiet")

def frozen(t, e):
    if e["n"] == 2:
        raise ValueError("account 2 is frozen")

(root / "ok").mkdir()
(root / "ok" / "a.json").write_text("".join(json.dumps({"k": n, "n": n}) + "\\n" for n in range(4)))
(root / "bad").mkdir()
(root / "bad" / "a.json").write_text('{"k": 1, "n": 1}\\n{"k": 2, "n": oops\\n')
jobs = {
    # A transaction raises under onError=stop: the foreachBatch function fails.
    "stop": tx.Job("stop").input("e", spark.readStream.schema("k long, n long").json(
        str(root / "ok")), keys="k").on("e", frozen).option("onError", "stop"),
    # A malformed input line under FAILFAST: a Spark task fails and aborts its job.
    "task": tx.Job("task").input("e", spark.readStream.schema("k long, n long").option(
        "mode", "FAILFAST").json(str(root / "bad")), keys="k").on("e", lambda t, e: None),
}
for name, job in jobs.items():
    query = job.trigger(availableNow=True).start(root / name / "ckpt", spark=spark, partitions=1)
    try:
        query.awaitTermination()
    except tx.TxStreamError as exc:
        print(f"failed: {exc}", file=sys.stderr)
    finally:
        query.stop()
"""


def test_a_failing_job_prints_its_one_line_error_without_spark_stack_traces(
    tmp_path: Path,
) -> None:
    # Its own Spark application: the shared session's loggers are already set.
    proc = subprocess.run(
        [sys.executable, "-c", FAILING_JOBS, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # PySpark's worker daemon prints a BrokenPipeError when Spark kills a task of the
    # aborted job while the worker still writes (a race, now and then): a Python
    # process of Spark's own, outside the loggers' reach
    stderr = re.sub(
        r"Traceback \(most recent call last\):\n(  File .*daemon\.py.*\n)+BrokenPipeError: .*\n",
        "",
        proc.stderr,
    )
    # ... or, when the driver's process ends while that worker writes, only the
    # traceback's first line, last in the output (seen once in CI: nothing after it)
    stderr = re.sub(r"Traceback \(most recent call last\):\n?\Z", "", stderr)
    lines = stderr.splitlines()
    failed = [line for line in lines if line.startswith("failed: ")]
    assert len(failed) == 2, proc.stderr[-3000:]
    assert failed[0] == (
        "failed: transaction at e#2 failed: ValueError: account 2 is frozen "
        "(onError=stop; the batch is committed with it rolled back)"
    )
    assert failed[1].startswith("failed: job 'task' failed: ") and "bad/a.json" in failed[1]
    # What remains is Spark's and Java's start-up notices (5 lines here).
    noise = [line for line in lines if " ERROR " in line or "Traceback" in line or "\tat " in line]
    assert noise == [] and len(lines) <= 10, proc.stderr[-3000:]
