"""The public API is typed against pyspark's own types, and mypy checks them.

PySpark ships ``py.typed``; the project's mypy configuration must not tell
mypy to ignore it, and a user's program that passes the wrong thing where a
``DataFrame`` or ``SparkSession`` belongs is an error for mypy.  The
annotations are imported under ``TYPE_CHECKING`` only (``test_layering``
checks that ``import txstream`` imports no pyspark).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

USER_PROGRAM = """
from pathlib import Path

import txstream as tx
from txstream.spark.session import local_session

spark = local_session("typed")
reveal_type(spark)
deposits = spark.readStream.schema("acct long, amount long").json("in/")
job = tx.Job("bank").input("deposits", deposits, keys="acct").on("deposits", lambda t, e: None)
query = job.start(Path("ckpt"), spark=spark)
reveal_type(query)
reveal_type(query.query)
tx.Job().input("deposits", 42, keys="acct")
job.start("ckpt", spark="local[2]")
"""


def test_mypy_is_not_told_to_ignore_pysparks_types() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    ignored = [
        module
        for override in config.get("overrides", [])
        if override.get("ignore_missing_imports") or override.get("follow_imports") == "skip"
        for module in override["module"]
    ]
    assert not [m for m in ignored if m.split(".")[0] == "pyspark"], ignored


def test_a_users_program_is_checked_against_pysparks_types(tmp_path: Path) -> None:
    program = tmp_path / "job.py"
    program.write_text(USER_PROGRAM)
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", str(program)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "MYPYPATH": str(ROOT / "src"), "MYPY_CACHE_DIR": str(tmp_path / "c")},
    )
    lines = [line.split(": ", 1)[1] for line in proc.stdout.splitlines() if ": " in line]
    assert lines == [
        'note: Revealed type is "pyspark.sql.session.SparkSession"',
        'note: Revealed type is "txstream.spark.runtime.query.TxQuery"',
        'note: Revealed type is "pyspark.sql.streaming.query.StreamingQuery | None"',
        'error: Argument 2 to "input" of "Job" has incompatible type "int"; expected '
        '"DataFrame | Sequence[dict[str, Any]] | None"  [arg-type]',
        'error: Argument "spark" to "start" of "Job" has incompatible type "str"; expected '
        '"SparkSession | None"  [arg-type]',
    ], proc.stdout + proc.stderr
