"""On Spark, an event-time job's inputs end: a bounded run finishes with nothing held.

The inputs' files land in different micro-batches (the case where the event-time
merge holds the last events for later ones); the run's answer must be the serial
one and ``run_local``'s, across restarts and a driver killed at the end's step.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import txstream as tx
from test_runtime_spark import transfer_outcomes
from txstream.bench.ledger import events, ledger_job, serial_oracle
from txstream.spark.runtime import commitlog
from txstream.spark.runtime import query as query_module
from txstream.spark.runtime.state import RuntimeStore

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parent.parent

Event = tuple[str, dict[str, Any]]


def ledger_stream(first: int = 0, count: int = 600, seed: int = 3) -> list[Event]:
    """Deposits and transfers with ids ``first ..``, ending with five transfers."""
    stream = [(n, {**e, "id": e["id"] + first}) for n, e in events(count, 20, 30, seed=seed)]
    end = first + count
    stream += [
        ("transfers", {"src": k, "dst": k + 1, "amount": 1, "id": end + k}) for k in range(5)
    ]
    return stream


def write_inputs(folder: Path, stream: list[Event], cuts: dict[str, list[int]], n0: int = 0) -> int:
    """Write each input's events into files cut at these ids (file k of each lands in batch k).

    Returns the number of files per input.  The cuts differ per input, so a
    micro-batch holds one input's later events with the other's earlier ones.
    """
    files = 0
    for name, at in cuts.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        bounds = [-1, *at, 10**9]
        for k in range(len(bounds) - 1):
            part = [e for n, e in stream if n == name and bounds[k] <= e["id"] < bounds[k + 1]]
            path = folder / name / f"part-{n0 + k:04d}.json"
            path.write_text("".join(json.dumps(e) + "\n" for e in part))
            os.utime(path, (1_700_000_000 + n0 + k, 1_700_000_000 + n0 + k))
        files = len(bounds) - 1
    return files


CUTS = {"deposits": [200, 400], "transfers": [100, 350]}
"""Three micro-batches; the last holds both inputs, so its last events wait for later ones."""


def streams(spark: Any, folder: Path) -> tuple[Any, Any]:
    deposits = (
        spark.readStream.schema("acct long, amount long, id long")
        .option("maxFilesPerTrigger", 1)
        .json(str(folder / "deposits"))
    )
    transfers = (
        spark.readStream.schema("src long, dst long, amount long, id long")
        .option("maxFilesPerTrigger", 1)
        .json(str(folder / "transfers"))
    )
    return deposits, transfers


def local_batches(stream: list[Event], cuts: dict[str, list[int]]) -> list[list[Event]]:
    """The micro-batches the file sources hand over (batch k: file k of each input)."""
    out: list[list[Event]] = []
    for name, at in cuts.items():
        bounds = [-1, *at, 10**9]
        for k in range(len(bounds) - 1):
            while len(out) <= k:
                out.append([])
            out[k] += [
                (n, e) for n, e in stream if n == name and bounds[k] <= e["id"] < bounds[k + 1]
            ]
    return out


def balances(checkpoint: Path) -> dict[int, int]:
    return {r["acct"]: r["balance"] for r in tx.read_table(checkpoint, "accounts")}


def spark_logs(checkpoint: Path) -> tuple[int, int]:
    return commitlog.spark_log_ends(checkpoint / "spark")


def check_exactly_once(checkpoint: Path, stream: list[Event]) -> None:
    """Outputs and balances are the serial ones; each transfer's outcome once."""
    balance, outcomes = serial_oracle(stream)
    assert transfer_outcomes(checkpoint) == outcomes
    assert balances(checkpoint) == balance
    store = RuntimeStore(checkpoint / "txstream")
    chain = store.chain()  # the markers form a chain, and Spark's logs end with them
    assert spark_logs(checkpoint) == (chain[-1][0], chain[-1][0])
    assert store.commit_info(chain[-1][0])["held"] == 0


@pytest.mark.parametrize(
    ("engine", "partitions", "how"),
    [
        # availableNow ended by awaitTermination; 2 partitions: a barrier stage.
        ("executors", 2, "awaitTermination"),
        # A continuously running query, drained and stopped; 3: the driver's frontier.
        ("executors", 3, "processAllAvailable"),
        ("driver", 2, "awaitTermination"),
    ],
)
def test_a_bounded_run_ends_its_inputs_with_nothing_held(
    spark: Any, tmp_path: Path, engine: str, partitions: int, how: str
) -> None:
    stream = ledger_stream()
    write_inputs(tmp_path / "in", stream, CUTS)
    # The quick start's shape (docs/spark.md): no merge chosen, start() takes event-time.
    merge = None if how == "processAllAvailable" else "event-time"
    job = ledger_job(*streams(spark, tmp_path / "in"), merge=merge)
    ckpt = tmp_path / "ckpt"
    if how == "awaitTermination":
        job.trigger(availableNow=True)
    query = job.start(ckpt, spark=spark, partitions=partitions, engine=engine)
    try:
        if how == "awaitTermination":
            query.awaitTermination()
        else:
            query.processAllAvailable()
    finally:
        query.stop()
    if engine == "executors":  # (the driver engine writes no job record)
        assert json.loads((ckpt / "txstream" / "job.json").read_text())["merge"] == "event-time"
    progress = query.recentProgress
    # Three micro-batches; the last held the events after the other input's last
    # (the five closing transfers at least); one more batch, without input, ran them
    # (numInputRows counts the events a batch runs).
    assert [p["batchId"] for p in progress] == [0, 1, 2, 3]
    assert progress[2]["held"] >= 5 and progress[3]["numInputRows"] == progress[2]["held"]
    assert query.lastProgress["held"] == 0
    _, outcomes = serial_oracle(stream)
    assert transfer_outcomes(ckpt) == outcomes
    local = ledger_job(merge="event-time").run_local(local_batches(stream, CUTS), tmp_path / "l")
    assert transfer_outcomes(tmp_path / "l") == outcomes and local.held() == 0
    # (The hand-over matters: in micro-batch order the answer differs.)
    ledger_job(merge="batch").run_local(local_batches(stream, CUTS), tmp_path / "b")
    assert transfer_outcomes(tmp_path / "b") != outcomes
    if engine == "executors":
        assert balances(ckpt) == balances(tmp_path / "l")
        check_exactly_once(ckpt, stream)


def job_on(spark: Any, folder: Path) -> Any:
    return ledger_job(*streams(spark, folder), merge="event-time")


def run_available(job: Any, ckpt: Path, spark: Any) -> Any:
    query = job.trigger(availableNow=True).start(ckpt, spark=spark, partitions=2)
    try:
        query.awaitTermination()
    finally:
        query.stop()
    return query


def test_a_restart_after_the_end_goes_on_with_the_next_batch(spark: Any, tmp_path: Path) -> None:
    first = ledger_stream()
    write_inputs(tmp_path / "in", first, CUTS)
    ckpt = tmp_path / "ckpt"
    run_available(job_on(spark, tmp_path / "in"), ckpt, spark)
    assert spark_logs(ckpt) == (3, 3)  # Spark's checkpoint counts the end's batch as done
    # Nothing new: Spark runs no batch, and nothing is held to end.
    again = run_available(
        ledger_job(*streams(spark, tmp_path / "in"), merge="event-time"), ckpt, spark
    )
    assert again.recentProgress == [] and spark_logs(ckpt) == (3, 3)
    # New files on both inputs, with later ids: batches 4, 5 (then the end, 6).
    second = ledger_stream(first=700, count=300, seed=4)
    write_inputs(tmp_path / "in", second, {"deposits": [850], "transfers": [800]}, n0=3)
    job = ledger_job(*streams(spark, tmp_path / "in"), merge="event-time")
    query = run_available(job, ckpt, spark)
    assert [p["batchId"] for p in query.recentProgress] == [4, 5, 6]
    assert query.recentProgress[1]["held"] > 0 and query.lastProgress["held"] == 0
    check_exactly_once(ckpt, first + second)


class Crash(BaseException):
    """Stands for the driver dying at a chosen point (no handler catches it)."""


@pytest.mark.parametrize("point", ["before-marker", "after-marker", "between-logs"])
def test_a_driver_stopped_at_the_end_loses_and_repeats_nothing_on_restart(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    first = ledger_stream()
    write_inputs(tmp_path / "in", first, CUTS)
    ckpt = tmp_path / "ckpt"
    commits = ckpt / "txstream" / "commits"
    if point == "before-marker":  # the end's batch ran; its marker is not written
        commit = RuntimeStore.commit

        def failing_commit(self: RuntimeStore, batch: int, *args: Any) -> None:
            if batch == 3:
                raise Crash
            commit(self, batch, *args)

        monkeypatch.setattr(RuntimeStore, "commit", failing_commit)
    elif point == "after-marker":  # committed; Spark's checkpoint does not know it yet

        def crash(spark_dir: Path, batch: int) -> None:
            raise Crash

        monkeypatch.setattr(query_module, "forward_spark_log", crash)
    else:  # Spark's offsets of the batch written, its commit not
        write = commitlog.write_atomic

        def failing_write(path: Path, payload: bytes, durable: bool = True) -> None:
            if path.parent.name == "commits" and path.parent.parent.name == "spark":
                raise Crash
            write(path, payload, durable)

        monkeypatch.setattr(commitlog, "write_atomic", failing_write)
    job = ledger_job(*streams(spark, tmp_path / "in"), merge="event-time")
    query = job.trigger(availableNow=True).start(ckpt, spark=spark, partitions=2)
    with pytest.raises(Crash):
        query.awaitTermination()
    query._lock.release()  # (a dead driver's lock goes with it)
    monkeypatch.undo()
    marker = commits / f"{3:012d}.json"
    assert marker.exists() == (point != "before-marker")
    assert spark_logs(ckpt) == (2, 3 if point == "between-logs" else 2)
    # New input arrives before the restart: Spark must not run it as batch 3.
    second = ledger_stream(first=700, count=200, seed=9)
    write_inputs(tmp_path / "in", second, {"deposits": [800], "transfers": [750]}, n0=3)
    query = run_available(
        ledger_job(*streams(spark, tmp_path / "in"), merge="event-time"), ckpt, spark
    )
    assert query.lastProgress["held"] == 0
    check_exactly_once(ckpt, first + second)
    ids = [r["id"] for r in tx.read_output(ckpt, "transfers_done")]
    assert len(ids) == len(set(ids))


KILLED_AT_THE_END = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_spark_end_inputs import streams
from txstream.bench.ledger import ledger_job, transfer
from txstream.spark import local_session
from txstream.spark.runtime import query as query_module

folder, ckpt, point = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
spark = local_session("killed-at-the-end")
print(spark.sparkContext._jvm.ProcessHandle.current().pid(), flush=True)
driver = os.getpid()
job = ledger_job(*streams(spark, folder), merge="event-time")
def die(*args):
    os.kill(driver, signal.SIGKILL)  # (its watchdog takes the JVM and workers down)
if point == "after-marker":
    query_module.forward_spark_log = die
else:  # while the end's batch runs its transactions (in a Python worker)
    def closing(t, e):
        if e["id"] >= 600:  # the closing transfers: held until the end
            die()
        transfer(t, e)
    job.on("transfers", closing)
query = job.trigger(availableNow=True).start(ckpt, spark=spark, partitions=2)
query.awaitTermination()
"""


@pytest.mark.parametrize("point", ["in-the-batch", "after-marker"])
def test_a_driver_sigkilled_at_the_end_loses_and_repeats_nothing(
    spark: Any, tmp_path: Path, point: str
) -> None:
    first = ledger_stream()
    write_inputs(tmp_path / "in", first, CUTS)
    ckpt = tmp_path / "ckpt"
    script = tmp_path / "job.py"
    script.write_text(KILLED_AT_THE_END.format(tests=str(ROOT / "tests")))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(ROOT / "src")}
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "in"), str(ckpt), point],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
        start_new_session=True,
    )
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    jvm = int(result.stdout.split()[0])
    deadline = time.time() + 300  # generous: its watchdog ends it within seconds
    while _alive(jvm):  # (nothing of the killed driver may write on after the restart)
        assert time.time() < deadline, f"the killed driver's JVM {jvm} still runs"
        time.sleep(0.1)
    marker = ckpt / "txstream" / "commits" / f"{3:012d}.json"
    assert marker.exists() == (point == "after-marker") and spark_logs(ckpt) == (2, 2)
    second = ledger_stream(first=700, count=200, seed=9)
    write_inputs(tmp_path / "in", second, {"deposits": [800], "transfers": [750]}, n0=3)
    query = run_available(
        ledger_job(*streams(spark, tmp_path / "in"), merge="event-time"), ckpt, spark
    )
    assert query.lastProgress["held"] == 0
    check_exactly_once(ckpt, first + second)


def _alive(pid: int) -> bool:
    from txstream.spark.jvmwatchdog import start_time

    return start_time(pid) is not None


def test_a_continuous_query_stopped_keeps_its_held_events_until_told_to_end_them(
    spark: Any, tmp_path: Path
) -> None:
    # A processingTime query stopped while its sources may still deliver is paused,
    # not ended (later events of a slower input would otherwise be late): its held
    # events stay in the checkpoint and a warning says how to end them.
    stream = ledger_stream()
    write_inputs(tmp_path / "in", stream, CUTS)
    ckpt = tmp_path / "ckpt"
    query = job_on(spark, tmp_path / "in").start(ckpt, spark=spark, partitions=2)
    try:
        while len(query.recentProgress) < 3:  # its three micro-batches (no drain)
            assert query.isActive, query.status
            time.sleep(0.1)
        # txstream reports a batch's progress from inside it, before Spark writes
        # its commit: on a busy machine stop() came in between ((1, 2) below).
        while spark_logs(ckpt)[0] < 2:
            assert query.isActive, query.status
            time.sleep(0.1)
    finally:
        with pytest.warns(UserWarning, match=r"held .* stop\(end_inputs=True\) ends the inputs"):
            query.stop()
    assert query.lastProgress["held"] >= 5 and spark_logs(ckpt) == (2, 2)
    # Restarted and stopped with end_inputs=True: it reads what is there, then ends.
    query = job_on(spark, tmp_path / "in").start(ckpt, spark=spark, partitions=2)
    query.stop(end_inputs=True)
    assert [p["batchId"] for p in query.recentProgress] == [3]
    check_exactly_once(ckpt, stream)
