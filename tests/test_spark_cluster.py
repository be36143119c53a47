"""A job submitted to a real Spark standalone cluster runs there and gives the right answers.

``scripts/spark-cluster.sh`` starts a master and two workers on loopback (each
worker its own JVM, executors and Python workers); ``spark-submit --master``
runs ``examples/ledger_audit.py`` on it as a user would: transfers between any
two accounts of 4 partitions, so the phase-1 tasks on the two workers forward
rows to each other over TCP, and audits that read every balance across them.
The job names no master itself (``local_session``): the one given to
``spark-submit`` must win, or the job silently runs on ``local[2]`` in the
submitting process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from txstream.spark.session import DEFAULTS, _launch_settings, _settings

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "spark-cluster.sh"
EXAMPLE = ROOT / "examples" / "ledger_audit.py"


def test_settings_given_at_launch_win_over_the_defaults_and_lose_to_the_callers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.setenv(
        "PYSPARK_SUBMIT_ARGS",
        "--master 'local[3]' --conf spark.sql.shuffle.partitions=7 "
        "--conf spark.ui.enabled=true pyspark-shell",
    )
    launched = _launch_settings()
    assert launched == {
        "spark.master": "local[3]",
        "spark.sql.shuffle.partitions": "7",
        "spark.ui.enabled": "true",
    }
    settings = _settings({"ui_enabled": "false"}, launched)
    assert "spark.sql.shuffle.partitions" not in settings  # the launch's 7 stays
    assert settings["spark.ui.enabled"] == "false"  # the caller's own
    assert settings["spark.driver.memory"] == DEFAULTS["spark.driver.memory"]
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "pyspark-shell")
    assert _launch_settings() == {}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[str]:
    home = tmp_path / "cluster"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    started = subprocess.run(
        ["bash", str(SCRIPT), "start", str(home), "2", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    try:
        assert started.returncode == 0, started.stderr
        yield started.stdout.strip()
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", str(home)], timeout=60, env=env)


@pytest.mark.spark
def test_a_job_submitted_to_a_standalone_cluster_runs_there(cluster: str, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT / "src"),
    }
    data, ckpt = tmp_path / "ledger", tmp_path / "ledger" / "ckpt"

    def example(*args: str, submit: bool = False) -> subprocess.CompletedProcess[str]:
        head = [str(Path(sys.executable).parent / "spark-submit"), "--master", cluster]
        proc = subprocess.run(
            [*(head if submit else [sys.executable]), str(EXAMPLE), *args],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc

    example("generate", "--out", str(data), "--files", "6", "--per-file", "150")
    ran = example("run", "--data", str(data), "--checkpoint", str(ckpt), submit=True)
    progress = json.loads(ran.stdout.splitlines()[-1])
    assert progress["multiPartition"]["transactions"] > 0, progress  # forwarded, not deferred
    assert progress["multiPartition"]["bytes"] > 0, progress  # between the workers' tasks
    master_log = (tmp_path / "cluster" / "master.log").read_text()
    assert "Registered app ledger-audit" in master_log
    # an executor on each worker: the tasks ran in the workers' JVMs, not the driver's
    assert master_log.count("Launching executor") >= 2
    assert list((tmp_path / "cluster").glob("work-*/app-*/*/stderr")), "no executor ran"
    shown = example("show", "--checkpoint", str(ckpt), "--data", str(data))
    summary, verdict = (json.loads(line) for line in shown.stdout.splitlines()[-2:])
    assert summary["audits"] > 0 and summary["audits_failed"] == 0, shown.stdout
    assert verdict["exactly_as_expected"], shown.stdout
