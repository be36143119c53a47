"""Windows on Spark: a file source feeding one window, and one window per key on the executors."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from txstream.spark.testing import sigkill_after_commits
from txstream.windows import SlidingWindow, WindowEngine, get_scheduler
from txstream.windows.feed import WindowFeed


def test_micro_batches_fill_and_slide_the_window(spark: Any, tmp_path: Path) -> None:
    from txstream.jobs.windows import PACKET_SCHEMA, feed_window
    from txstream.spark.sources import csv_files

    rng = random.Random(3)
    incoming = tmp_path / "in"
    incoming.mkdir()
    packets = [
        (round(k * 0.01, 2), rng.randrange(50), rng.randrange(50), rng.randint(41, 140))
        for k in range(700)
    ]
    for f in range(7):  # seven files, one micro-batch each
        chunk = packets[f * 100 : (f + 1) * 100]
        path = incoming / f"p{f}.csv"
        path.write_text("".join(f"{a},{b},{c},{d}\n" for a, b, c, d in chunk))
        os.utime(path, (1_000_000 + f, 1_000_000 + f))  # the file source goes by mtime

    window = SlidingWindow(4, 1.0)
    feed = WindowFeed(WindowEngine(window, get_scheduler("ttu")))
    stream = csv_files(spark, incoming, PACKET_SCHEMA, max_files_per_trigger=1)
    query = feed_window(stream, feed, str(tmp_path / "checkpoint"))
    try:
        query.processAllAvailable()
    finally:
        query.stop()

    # The same packets fed directly give the same window: timestamps 0.00 .. 6.99,
    # spans of 1 s, 4 sub-windows: [0,1) .. [3,4) fill, [4,5) and [5,6) slide; [6,7) waits.
    direct = SlidingWindow(4, 1.0)
    WindowFeed(WindowEngine(direct, get_scheduler("ttu"))).add_batch(0, packets)
    assert feed.last_batch == 6
    assert window.slides == direct.slides == 6
    for i in range(4):
        got, want = window.current(i), direct.current(i)
        assert got.version == want.version
        assert sorted(got.tuples) == sorted(want.tuples)
        assert got.summary.distinct == want.summary.distinct
    assert sorted(feed.buffer) == sorted(packets[600:])


# -- one window per key on the executors (txstream.jobs.windows.window_job) ---------------------

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "keyed_windows.py"


def _example(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT / "src"),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        **kwargs,
    )


@pytest.mark.spark
def test_keyed_windows_on_executors_equal_the_in_process_engine(spark: Any, tmp_path: Path) -> None:
    # ws: the scheduler whose queries keep expired versions (win_old rows) across
    # micro-batches; every answer, window history and counter as in process.
    import txstream as tx
    from txstream.jobs.windows import start, window_histories, write_input
    from txstream.model import check, parse_one
    from txstream.model.check import CheckOptions
    from txstream.windows import Costs, Query
    from txstream.windows.keyed import KeyedWindows, run_keyed, workload

    spec = KeyedWindows(
        n=4,
        t=0.2,
        scheduler="ws",
        long_queries=((Query("topk", 4, k=3), Query("topk", 2, k=3)),),
        costs=Costs(per_unit=3e-5),
        record=True,
    )
    events = workload(3, 2.0, snapshot_interval=0.15, addresses=60, subset=5, n=4, seed=11)
    write_input(events, tmp_path / "in", files=6)
    query = start(spark, spec, tmp_path / "in", tmp_path / "ckpt", partitions=2, record=True)
    try:
        query.awaitTermination()
    finally:
        query.stop()
    want = run_keyed(spec, events)
    order = lambda rows: sorted(rows, key=lambda r: (r["key"], r["tid"]))  # noqa: E731
    got = tx.read_output(tmp_path / "ckpt", "results")
    assert order(got) == order(want.results)
    assert {r["kind"] for r in got} == {"long", "snapshot"}
    histories = window_histories(tmp_path / "ckpt", 4)
    assert histories == {str(k): want.history(k) for k in want.windows}
    for text in histories.values():
        assert check(parse_one(text), "ws", CheckOptions(subwindows=4)).holds
    assert check(tx.read_history(tmp_path / "ckpt"), "csao").holds
    # more than one micro-batch ran: the windows' state crossed batches in the store
    assert len(query.recentProgress) >= 6


@pytest.mark.spark
def test_keyed_windows_survive_driver_sigkills_exactly_once(tmp_path: Path) -> None:
    # The example's driver (and its JVM) is SIGKILLed mid-run, at a random moment
    # after the k-th commit; a last run consumes the rest (one kill: each start
    # costs a JVM, and the suite's time is bounded).  The answers and
    # the window histories equal the in-process engine's: nothing lost, nothing twice.
    data, ckpt = tmp_path / "data", tmp_path / "data" / "ckpt"
    made = _example(
        "generate",
        "--out",
        str(data),
        "--scheduler",
        "lws",
        "--keys",
        "3",
        "--seconds",
        "3",
        "--files",
        "12",
    )
    assert made.returncode == 0, made.stderr[-2000:]
    rng = random.Random(4)
    at_kill = []
    for k, target in enumerate((4,)):
        env = {
            **os.environ,
            "PYSPARK_PYTHON": sys.executable,
            "PYTHONPATH": str(ROOT / "src"),
            "SPARK_LOCAL_IP": "127.0.0.1",
        }
        argv = [sys.executable, str(EXAMPLE), "run", "--continuous"]
        argv += ["--data", str(data), "--checkpoint", str(ckpt)]
        at_kill.append(
            sigkill_after_commits(
                argv, ckpt, target, rng=rng, jitter_s=0.8, stderr=tmp_path / f"run{k}.err", env=env
            )
        )
    assert at_kill[-1] < 12, at_kill  # the kill came before the input's end
    final = _example("run", "--data", str(data), "--checkpoint", str(ckpt))
    assert final.returncode == 0, final.stderr[-3000:]
    shown = _example("show", "--data", str(data), "--checkpoint", str(ckpt))
    assert '"exactly_as_expected": true' in shown.stdout, shown.stdout + shown.stderr[-2000:]


@pytest.mark.spark
def test_windows_run_spark_on_local_cluster_equals_the_in_process_engine(tmp_path: Path) -> None:
    # The command end to end, in a process of its own (it stops the session it
    # starts), on two executor JVMs, each with its own Python workers: nothing of
    # a key's window may live in driver memory or in one worker only.  Every
    # answer and every key's window history equal the in-process engine's.
    import json

    from txstream.windows.keyed import KeyedWindows, random_long_queries, run_keyed, workload

    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT / "src"),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    keys, n, t, long_queries, snapshots = 4, 4, 0.5, 10, 0.5
    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "txstream",
            "windows",
            "run",
            "--spark",
            "--master",
            "local-cluster[2,1,1024]",
            "--out",
            str(tmp_path / "run"),
            "--scheduler",
            "lws",
            "--keys",
            str(keys),
            "--n",
            str(n),
            "--t",
            str(t),
            "--long-queries",
            str(long_queries),
            "--snapshot-interval",
            str(snapshots),
            "--files",
            "6",
            "--seed",
            "0",
        ],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        timeout=600,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr[-3000:]
    out = json.loads(ran.stdout.strip().splitlines()[-1])["spark"]
    assert out["equal_in_process"] is True
    assert out["histories"] == {"criterion": "lws", "hold": True}
    assert out["long_commits"] > 0 and out["snapshots"] > 0
    assert out["batches"] >= 6  # the windows' state crossed micro-batches in the store
    assert out["cpu_us_per_event"]["workers"] > 0
    spec = KeyedWindows(
        n=n,
        t=t,
        scheduler="lws",
        long_queries=random_long_queries(n, long_queries, seed=0),
        record=True,
    )
    want = run_keyed(spec, workload(keys, 2 * n * t, snapshot_interval=snapshots, n=n, seed=0))
    histories = tmp_path / "run" / "histories"
    assert sorted(p.name for p in histories.iterdir()) == [f"key-{k}.txt" for k in range(keys)]
    for k in want.windows:
        assert (histories / f"key-{k}.txt").read_text() == want.history(k), k
