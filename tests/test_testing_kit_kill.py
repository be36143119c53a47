"""``txstream.spark.testing.sigkill_after_commits``: the kill of a real driver, without Spark.

A stand-in driver writes commit markers where a job's checkpoint keeps them
and starts a child of its own (as a driver starts its JVM); the kit must kill
both once the markers reach the target, and report a driver that ended first.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import pytest

from txstream.spark.testing import sigkill_after_commits

DRIVER = """
import os, subprocess, sys, time
from pathlib import Path
ckpt, stop_at = Path(sys.argv[1]), int(sys.argv[2])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
(ckpt / "pids").write_text(f"{os.getpid()} {child.pid}")
markers = ckpt / "txstream" / "commits"
markers.mkdir(parents=True, exist_ok=True)
for batch in range(stop_at):
    (markers / f"{batch}.json").write_text("{}")
    time.sleep(0.01)
print("driver: all input committed", file=sys.stderr)
"""


def _gone(pid: int) -> bool:
    """Whether ``pid`` is dead: no process, or a zombie not yet reaped by its new parent."""
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_the_driver_and_its_children_die_after_the_target_commit(tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    argv = [sys.executable, str(script), str(tmp_path), "1000000"]
    at = sigkill_after_commits(
        argv, tmp_path, 5, rng=random.Random(1), jitter_s=0.1, stderr=tmp_path / "run.err"
    )
    assert at >= 5
    driver, child = map(int, (tmp_path / "pids").read_text().split())
    # The whole process group, the "JVM" too.  A SIGKILLed process may still be on
    # its way out when the kill returns (a busy machine schedules it later): wait for
    # it, bounded, which bounds a hang and never a speed.
    deadline = time.monotonic() + 60
    while not (_gone(driver) and _gone(child)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(driver) and _gone(child)
    assert "all input committed" not in (tmp_path / "run.err").read_text()


def test_a_driver_that_ends_before_the_kill_fails_with_its_stderr(tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    argv = [sys.executable, str(script), str(tmp_path), "2"]
    with pytest.raises(AssertionError, match="all input committed"):
        sigkill_after_commits(
            argv, tmp_path, 5, rng=random.Random(1), jitter_s=0.0, stderr=tmp_path / "run.err"
        )
