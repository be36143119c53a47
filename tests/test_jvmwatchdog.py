"""The JVM watchdog on stand-in processes (no Spark): what it kills, and when it does not.

The real thing, a SIGKILLed Spark driver, is in test_runtime_spark.py.
"""

import subprocess
import sys
import time

from txstream.spark import jvmwatchdog
from txstream.spark.jvmwatchdog import CLEAN_EXIT, start_time, tree


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


def _watch(driver: int, jvm: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-I", jvmwatchdog.__file__, str(driver), str(jvm)], stdin=subprocess.PIPE
    )


def _fake_jvm() -> tuple[subprocess.Popen[bytes], dict[int, str | None]]:
    """A process with a child and a grandchild (a JVM, its daemon, a worker)."""
    jvm = subprocess.Popen(["sh", "-c", "sh -c 'sleep 600 & wait' & wait"])
    deadline = time.time() + 60
    while len(tree(jvm.pid)) < 3 and time.time() < deadline:
        time.sleep(0.05)
    processes = {p: start_time(p) for p in tree(jvm.pid)}
    if len(processes) < 3:
        for pid in processes:
            subprocess.run(["kill", "-9", str(pid)], check=False)
    assert len(processes) == 3
    return jvm, processes


def _alive(processes: dict[int, str | None]) -> list[int]:
    return [p for p, started in processes.items() if start_time(p) == started]


def test_the_driver_killed_the_jvm_and_all_under_it_are_killed() -> None:
    driver = _sleeper()
    jvm, processes = _fake_jvm()
    watchdog = _watch(driver.pid, jvm.pid)
    try:
        time.sleep(0.5)  # (the watchdog looks at the processes first)
        assert _alive(processes) == list(processes)
        driver.kill()
        driver.wait()
        assert watchdog.wait(timeout=60) == 0
        jvm.wait(timeout=60)
        deadline = time.time() + 60
        while _alive(processes) and time.time() < deadline:
            time.sleep(0.05)
        assert _alive(processes) == []
    finally:
        for pid in _alive(processes):
            subprocess.run(["kill", "-9", str(pid)], check=False)
        driver.kill()


def test_after_a_clean_exit_the_jvm_ends_on_its_own_and_the_watchdog_follows() -> None:
    driver = _sleeper()
    jvm, processes = _fake_jvm()
    watchdog = _watch(driver.pid, jvm.pid)
    try:
        assert watchdog.stdin is not None
        watchdog.stdin.write(CLEAN_EXIT)
        watchdog.stdin.flush()
        driver.kill()
        driver.wait()
        time.sleep(1)  # the JVM has GRACE_S (30 s) to end by itself: untouched meanwhile
        assert watchdog.poll() is None and _alive(processes) == list(processes)
        jvm.kill()
        assert watchdog.wait(timeout=60) == 0
    finally:
        for pid in _alive(processes):
            subprocess.run(["kill", "-9", str(pid)], check=False)
        driver.kill()


def test_a_jvm_that_ends_first_lets_the_watchdog_go_and_the_driver_live() -> None:
    driver = _sleeper()
    jvm = _sleeper()
    watchdog = _watch(driver.pid, jvm.pid)
    try:
        jvm.kill()
        assert watchdog.wait(timeout=60) == 0
        assert driver.poll() is None
    finally:
        driver.kill()
        jvm.kill()
