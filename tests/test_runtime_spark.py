"""The runtime on Spark: the same answers as serial execution, on executors, across crashes.

Few and deterministic (``availableNow``); one shared local session, and
subprocesses for what needs its own Spark application (SIGKILL of the driver,
``local-cluster`` with two executor JVMs).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import txstream as tx
from store_checks import assert_markers_name_their_files
from txstream.bench.ledger import events, ledger_job, opening, serial_oracle, transfer
from txstream.model import check
from txstream.spark.runtime.partitioning import partition_of, spark_hash_long, sql_partition
from txstream.spark.testing import sigkill_after_commits

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "sensor_alerts.py"
LEDGER_AUDIT = ROOT / "examples" / "ledger_audit.py"


def write_ledger_input(folder: Path, stream: list[Any], files: int) -> None:
    for name in ("deposits", "transfers"):
        (folder / name).mkdir(parents=True, exist_ok=True)
    size = -(-len(stream) // files)
    for n in range(files):
        part = stream[n * size : (n + 1) * size]
        for name in ("deposits", "transfers"):
            path = folder / name / f"part-{n:04d}.json"
            path.write_text("".join(json.dumps(e) + "\n" for i, e in part if i == name))
            os.utime(path, (1_700_000_000 + n, 1_700_000_000 + n))


def ledger_streams(spark: Any, folder: Path) -> tuple[Any, Any]:
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


def run_available(job: Any, checkpoint: Path, spark: Any, **options: Any) -> Any:
    """Run ``job`` over what its sources hold now; returns the stopped query."""
    query = job.trigger(availableNow=True).start(checkpoint, spark=spark, **options)
    try:
        query.awaitTermination()
    finally:
        query.stop()
    return query


def transfer_outcomes(checkpoint: Path) -> list[tuple[int, bool]]:
    return [(r["id"], r["ok"]) for r in tx.read_output(checkpoint, "transfers_done")]


@pytest.mark.parametrize("mode", ["forward", "defer"])
def test_ledger_on_executors_equals_serial_execution(spark: Any, tmp_path: Path, mode: str) -> None:
    stream = list(events(1500, 40, 30, seed=11))
    write_ledger_input(tmp_path / "in", stream, files=3)
    job = ledger_job(*ledger_streams(spark, tmp_path / "in")).option("recordHistory", True)
    query = run_available(job.option("crossPartition", mode), tmp_path / "ckpt", spark)
    assert transfer_outcomes(tmp_path / "ckpt") == serial_oracle(stream)[1]
    progress = query.recentProgress
    assert len(progress) == 3 and sum(p["numInputRows"] for p in progress) == len(stream)
    forwarded = sum(p["multiPartition"]["transactions"] for p in progress)
    roles = {Path(rel).stem for rel in _marker_files(tmp_path / "ckpt" / "txstream")}
    if mode == "defer":
        assert sum(p["deferred"] for p in progress) > 0  # multi-partition transfers took phase 2
        assert forwarded == 0 and any(role.startswith("coord") for role in roles)
    else:  # they ran in phase 1, at their home, with rows sent between the two tasks
        assert sum(p["deferred"] for p in progress) == 0 and forwarded > 0
        assert sum(p["multiPartition"]["bytes"] for p in progress) > 0
        assert not any(role.startswith("coord") for role in roles)
        rendezvous = tmp_path / "ckpt" / "txstream" / "rendezvous"  # used, then cleaned up
        assert not any(rendezvous.glob("*"))
    for kind in ("shipped", "back"):  # the phases' hand-over files go with the commit
        assert not any((tmp_path / "ckpt" / "txstream" / kind).glob("*/*"))
    verdict = check(tx.read_history(tmp_path / "ckpt"), "csao")
    assert verdict.holds, verdict.evidence
    # The tasks handed their files' CRCs to the markers.
    assert assert_markers_name_their_files(tmp_path / "ckpt" / "txstream") > 0
    assert "p00000" in roles


def _marker_files(root: Path) -> list[str]:
    from txstream.spark.runtime.state import RuntimeStore

    return [rel for _, info in RuntimeStore(root).chain() for rel in info["files"]]


@pytest.mark.parametrize("engine", ["executors", "driver"])
def test_events_with_a_null_key_or_order_value_are_reported_as_run_local_does(
    spark: Any, tmp_path: Path, engine: str
) -> None:
    # A JSON source reads a missing field as null: the event is reported with its
    # input position and not run, and the others commit (a null key used to be
    # dropped without a report, a null order value to run first).
    lines = ['{"acct": 1, "amount": 5, "id": 0}', '{"amount": 7, "id": 1}']
    lines += ['{"acct": 1, "amount": 9}', '{"acct": 1, "amount": 2, "id": 3}']
    (tmp_path / "in" / "deposits").mkdir(parents=True)
    (tmp_path / "in" / "transfers").mkdir(parents=True)
    (tmp_path / "in" / "deposits" / "d.json").write_text("\n".join(lines) + "\n")
    job = ledger_job(*ledger_streams(spark, tmp_path / "in"))
    run_available(job, tmp_path / "ckpt", spark, engine=engine)
    rows = [{c: json.loads(x).get(c) for c in ("acct", "amount", "id")} for x in lines]
    local = ledger_job().run_local([[("deposits", r) for r in rows]], tmp_path / "l")
    assert local.stats[0]["aborted"] == 2
    for store in (tmp_path / "ckpt", tmp_path / "l"):
        assert [(f["position"], f["error"]) for f in tx.read_failures(store)] == [
            ("deposits#2", "SchemaError: the event has a null order value; it was not run"),
            ("deposits#1", "SchemaError: the event has a null key; it was not run"),
        ]  # in the declared order: a null order value counts as 0
    # The markers name every file with its CRC, handed over by the tasks (or the
    # driver engine) that wrote it, the failure records of unplaced events too.
    assert assert_markers_name_their_files(tmp_path / "ckpt" / "txstream") >= 1


@pytest.mark.parametrize(
    ("engine", "partitions"),
    # 2 partitions on 2 task slots: the phase-1 tasks find the frontier together in
    # a barrier stage; 3: the driver finds it with a Spark job of its own.
    [("executors", 2), ("executors", 3), ("driver", 2)],
)
def test_event_time_merge_orders_inputs_handed_over_unevenly(
    spark: Any, tmp_path: Path, engine: str, partitions: int
) -> None:
    # All deposits arrive in the first micro-batch, the transfers over three: in
    # batch order the late deposits would run before earlier transfers.
    stream = list(events(900, 30, 30, seed=5))
    write_ledger_input(tmp_path / "in", [e for e in stream if e[0] == "transfers"], files=3)
    write_ledger_input(tmp_path / "dep", [e for e in stream if e[0] == "deposits"], files=1)
    deposits, transfers = ledger_streams(spark, tmp_path / "in")
    deposits = (
        spark.readStream.schema("acct long, amount long, id long")
        .option("maxFilesPerTrigger", 1)
        .json(str(tmp_path / "dep" / "deposits"))
    )
    job = ledger_job(deposits, transfers).option("merge", "event-time")
    job.option("recordHistory", True)
    query = run_available(job, tmp_path / "ckpt", spark, engine=engine, partitions=partitions)
    assert transfer_outcomes(tmp_path / "ckpt") == serial_oracle(stream)[1]
    assert query.recentProgress[0]["held"] > 0
    # Either engine leaves a history in the checkpoint that `txstream check` judges.
    history = tx.read_history(tmp_path / "ckpt")
    assert [len(order) for order in history.arrivals.values()] == [len(stream)]
    verdict = check(history, "csao")
    assert verdict.holds, verdict.evidence
    if engine == "executors":
        barrier = query.tasks <= spark.sparkContext.defaultParallelism  # (tasks: forward/)
        assert query._barrier == barrier
        rendezvous = tmp_path / "ckpt" / "txstream" / "rendezvous"  # used, then cleaned up
        assert rendezvous.is_dir() == barrier and not any(rendezvous.glob("*"))


def test_held_events_run_when_their_partition_gets_nothing_new(spark: Any, tmp_path: Path) -> None:
    # Batch 0: every deposit, and the transfers up to id 150: the later deposits are
    # held on both partitions.  Batch 1: one transfer between accounts of partition
    # 0 releases them all; partition 1 gets no event but must run its held ones.
    stream = [e for e in events(300, 30, 0, seed=8) if e[0] == "deposits" or e[1]["id"] < 150]
    home = [a for a in range(30) if partition_of(a, 2) == 0]
    last = ("transfers", {"src": home[0], "dst": home[1], "amount": 1, "id": 10_000})
    write_ledger_input(tmp_path / "in", stream, files=1)
    path = tmp_path / "in" / "transfers" / "part-0001.json"
    path.write_text(json.dumps(last[1]) + "\n")
    os.utime(path, (1_700_000_100, 1_700_000_100))
    job = ledger_job(*ledger_streams(spark, tmp_path / "in")).option("merge", "event-time")
    query = run_available(job, tmp_path / "ckpt", spark, partitions=2)
    progress = query.recentProgress
    assert len(progress) == 2 and progress[0]["held"] > 0
    assert sum(p["numInputRows"] for p in progress) == len(stream) + 1
    assert progress[1]["held"] == 0


def test_spark_and_python_place_keys_alike(spark: Any) -> None:
    rng = random.Random(4)
    ints = [rng.randrange(-(10**12), 10**12) for _ in range(200)]
    texts = [
        "".join(rng.choice("aé€ b\x1f7") for _ in range(rng.randrange(0, 6))) for _ in range(200)
    ]
    rows = [(i, t, i % 2 == 0) for i, t in zip(ints, texts, strict=True)]
    df = spark.createDataFrame(rows, "i long, t string, b boolean")
    for cols, value in (
        (["i"], lambda r: r[0]),
        (["t"], lambda r: r[1]),
        (["b"], lambda r: r[2]),  # (placed as the int it equals: True and 1 are one row)
        (["i", "t", "b"], lambda r: r),
    ):
        got = [r[0] for r in df.selectExpr(sql_partition(cols, 7, {"b"})).collect()]
        assert got == [partition_of(value(r), 7) for r in rows], cols


def test_python_computes_spark_hash_of_longs_as_spark_does(spark: Any) -> None:
    # The routes (numbers Spark's hash partitioner sends to each partition) come
    # from Python now, without a Spark job at start.
    rng = random.Random(9)
    numbers = [0, 1, -1, 2**63 - 1, -(2**63), *(rng.randrange(-(2**63), 2**63) for _ in range(300))]
    df = spark.createDataFrame([(n,) for n in numbers], "n long")
    assert [r[0] for r in df.selectExpr("hash(n)").collect()] == [
        spark_hash_long(n) for n in numbers
    ]
    assert [r[0] for r in df.selectExpr("pmod(hash(n), 7)").collect()] == [
        spark_hash_long(n) % 7 for n in numbers
    ]


def test_start_runs_no_spark_job_and_initial_rows_from_a_list_load_as_before(
    spark: Any, tmp_path: Path
) -> None:
    # start() ran Spark jobs (the routes, the initial rows through a shuffle and
    # Python workers): 10-30 s on a fresh session.  The stream's own jobs run in
    # its job group, not in the caller's.
    stream = list(events(300, 12, 10, seed=3))
    write_ledger_input(tmp_path / "in", stream, files=1)
    # Transfers succeed or not by the opening balances: the initial rows must be
    # where the transactions look for them.
    job = ledger_job(*ledger_streams(spark, tmp_path / "in"), initial=opening(12))
    sc = spark.sparkContext
    sc.setJobGroup("txstream-start-test", "start()")
    try:
        query = job.trigger(availableNow=True).start(tmp_path / "ckpt", spark=spark, partitions=2)
        at_start = list(sc.statusTracker().getJobIdsForGroup("txstream-start-test"))
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)
    try:
        query.awaitTermination()
    finally:
        query.stop()
    assert at_start == []
    assert transfer_outcomes(tmp_path / "ckpt") == serial_oracle(stream, 12)[1]


def test_bad_declarations_fail_in_one_line_before_the_stream_starts(
    spark: Any, tmp_path: Path
) -> None:
    df = spark.readStream.schema("k double, v long").json(str(tmp_path))
    job = tx.Job("bad").input("ev", df, keys="k").on("ev", lambda t, e: None)
    with pytest.raises(tx.RuntimeJobError, match="key column 'k' is DoubleType"):
        job.start(tmp_path / "ckpt", spark=spark)
    job = tx.Job("bad").input("ev", df, keys="nope").on("ev", lambda t, e: None)
    with pytest.raises(tx.RuntimeJobError, match="key column 'nope' is not in its schema"):
        job.start(tmp_path / "ckpt", spark=spark)
    # ISO-8601 text cannot be cast to an order value: refused before the first batch.
    df = spark.readStream.schema("k long, ts string").json(str(tmp_path))
    job = tx.Job("bad").input("ev", df, keys="k", order="ts").on("ev", lambda t, e: None)
    with pytest.raises(tx.RuntimeJobError, match="order column 'ts' is StringType; an order"):
        job.start(tmp_path / "ckpt", spark=spark)
    job = tx.Job("bad").input("ev", df, keys="k").on("ev", lambda t, e: None)
    with pytest.raises(tx.RuntimeJobError, match=r"column 'sent', which no input has \(ev: k"):
        job.option("arrivalTime", "sent").start(tmp_path / "ckpt", spark=spark)
    assert not spark.streams.active


def test_a_second_job_on_a_running_checkpoint_is_refused(spark: Any, tmp_path: Path) -> None:
    stream = list(events(50, 5, 0, seed=1))
    write_ledger_input(tmp_path / "in", stream, files=1)
    first = ledger_job(*ledger_streams(spark, tmp_path / "in")).start(tmp_path / "ckpt", spark)
    try:
        with pytest.raises(tx.StoreLockedError, match=f"pid {os.getpid()}"):
            ledger_job(*ledger_streams(spark, tmp_path / "in")).start(tmp_path / "ckpt", spark)
    finally:
        first.stop()


def test_jobs_whose_names_differ_only_by_dash_and_underscore_run_side_by_side(
    spark: Any, tmp_path: Path
) -> None:
    # before: both were Spark query "ledger_a", and the second start failed
    stream = list(events(50, 5, 0, seed=1))
    write_ledger_input(tmp_path / "in", stream, files=1)
    started = []
    try:
        for name in ("ledger-a", "ledger_a"):
            job = ledger_job(*ledger_streams(spark, tmp_path / "in"), name=name)
            started.append(job.start(tmp_path / name, spark))
        assert all(q.isActive for q in started)
    finally:
        for query in started:
            query.stop()


def test_a_date_order_column_orders_by_day(spark: Any, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    days = ["2024-01-03", "2024-01-01", "2024-01-02"]
    rows = [{"k": 1, "n": n, "day": day} for n, day in enumerate(days)]
    (tmp_path / "in" / "a.json").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def step(t: Any, e: dict[str, Any]) -> None:
        if t.read("c", e["k"]) is None:
            t.insert("c", {"k": e["k"], "seq": 0})
        t.increment("c", e["k"], "seq", 1)
        t.emit("o", {"n": e["n"], "seq": t.read("c", e["k"])["seq"]})

    df = spark.readStream.schema("k long, n long, day date").json(str(tmp_path / "in"))
    job = (
        tx.Job("days")
        .table("c", key="k")
        .input("e", df, keys="k", order="day")
        .output("o", schema="n long, seq long")
        .on("e", step)
    )
    run_available(job, tmp_path / "ckpt", spark, partitions=1)
    got = tx.read_output(tmp_path / "ckpt", "o", with_order=True)
    assert [(r["n"], r["seq"]) for r in got] == [(1, 1), (2, 2), (0, 3)]
    assert got[0]["__order"][1] == 1704067200.0  # 2024-01-01, midnight UTC in epoch seconds


def test_a_by_batch_whose_groups_interleave_fails_the_query_with_group_order_error(
    spark: Any, tmp_path: Path
) -> None:
    (tmp_path / "in").mkdir()
    rows = [{"user": 1, "session": 1, "ts": 1}, {"user": 2, "session": 2, "ts": 2}]
    rows.append({"user": 1, "session": 1, "ts": 3})  # session 1 again: the runs interleave
    (tmp_path / "in" / "a.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    clicks = spark.readStream.schema("user long, session long, ts long").json(str(tmp_path / "in"))
    job = (
        tx.Job("sessions")
        .input("clicks", clicks, keys="user", order="ts")
        .output("o")
        .on("clicks", lambda t, c: t.emit("o", c))
        .boundary("by", group=lambda r: r["session"])
    )
    with pytest.raises(tx.GroupOrderError) as caught:  # as run_local raises
        run_available(job, tmp_path / "ckpt", spark, partitions=2)
    assert "\n" not in str(caught.value)
    assert "boundary 'by': the events of group 1 (from clicks#0 to clicks#2)" in str(caught.value)
    assert tx.read_output(tmp_path / "ckpt", "o") == []


def run_example(
    *args: str, example: Path = EXAMPLE, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(example), *args], capture_output=True, text=True, check=False, **kwargs
    )


def test_sensor_alerts_survive_sigkills_at_start_up_recovery_and_mid_batch(
    tmp_path: Path,
) -> None:
    # Four SIGKILLs of the example's driver (and its JVM), one of each kind of moment
    # and a second mid-batch one: during the first start-up (nothing committed),
    # mid-batch after a commit, during the restart that recovers that killed batch,
    # mid-batch again on a checkpoint that has been recovered twice.  (Ten kills,
    # the same kinds at more random moments, cost six more Spark starts.)
    data, ckpt = tmp_path / "data", tmp_path / "ckpt"
    assert run_example("generate", "--out", str(data), "--files", "40").returncode == 0
    rng = random.Random(7)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    commits = ckpt / "txstream" / "commits"
    kills = 0
    for n in range(4):
        before = len(list(commits.glob("*.json"))) if commits.exists() else 0
        proc = subprocess.Popen(
            [
                sys.executable,
                str(EXAMPLE),
                "run",
                "--continuous",
                "--data",
                str(data),
                "--checkpoint",
                str(ckpt),
            ],
            stdout=subprocess.DEVNULL,
            stderr=(tmp_path / f"run{n}.err").open("w"),
            env=env,
            start_new_session=True,
        )
        if n % 2 == 0:
            time.sleep(rng.uniform(1, 8))  # during start-up or recovery
        else:
            # Once the run has committed something new, at a random moment of
            # the batches that follow (or, when the input is all committed, once
            # it is surely running).  While nothing is committed yet the input
            # cannot be all committed, so that wait is bounded only against a hang:
            # on a busy machine a start-up takes long, and the test must not kill
            # every run before its first commit.
            deadline = time.time() + (600 if before == 0 else 30)
            while time.time() < deadline and proc.poll() is None:
                if commits.exists() and len(list(commits.glob("*.json"))) > before:
                    break
                time.sleep(0.2)
            time.sleep(rng.uniform(0, 2.5))
        assert proc.poll() is None, (tmp_path / f"run{n}.err").read_text()[-3000:]
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM die at once
        proc.wait()
        kills += 1
    committed = len(list((ckpt / "txstream" / "commits").glob("*.json")))
    assert committed > 0  # work was done between kills
    final = run_example("run", "--data", str(data), "--checkpoint", str(ckpt), env=env)
    assert final.returncode == 0, final.stderr[-2000:]
    shown = run_example("show", "--data", str(data), "--checkpoint", str(ckpt))
    assert '"exactly_as_expected": true' in shown.stdout, shown.stdout
    verdict = check(tx.read_history(ckpt), "csao")
    assert verdict.holds and kills == 4


def test_ledger_audit_survives_sigkills_mid_run_exactly_once(tmp_path: Path) -> None:
    # examples/ledger_audit.py: forwarded transfers between any accounts and audits
    # (global reads) in every micro-batch; the driver and its JVM are SIGKILLed
    # while batches run (after the k-th commit, at a random moment of the next
    # ones), twice: a first run mid-batch, then the run that recovered its batch,
    # itself mid-batch (a third kill, as the second, adds no new kind of moment and
    # costs a Spark start); then the input is run to its end: every output once,
    # every audit ok, every final row as serial execution gives them.
    data, ckpt = tmp_path / "data", tmp_path / "ckpt"
    made = run_example(
        "generate",
        "--out",
        str(data),
        "--accounts",
        "60",
        "--files",
        "20",
        "--per-file",
        "80",
        example=LEDGER_AUDIT,
    )
    assert made.returncode == 0, made.stderr[-2000:]
    rng = random.Random(3)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    at_kill = []
    for n, target in enumerate((2, 6)):
        argv = [sys.executable, str(LEDGER_AUDIT), "run", "--continuous", "--partitions", "3"]
        argv += ["--data", str(data), "--checkpoint", str(ckpt)]
        at_kill.append(
            sigkill_after_commits(
                argv, ckpt, target, rng=rng, jitter_s=0.6, stderr=tmp_path / f"run{n}.err", env=env
            )
        )
    assert at_kill[1] < 20  # both kills came before the input's end: mid-run, not after it
    final = run_example(
        "run",
        "--data",
        str(data),
        "--checkpoint",
        str(ckpt),
        "--partitions",
        "3",
        example=LEDGER_AUDIT,
        env=env,
    )
    assert final.returncode == 0, final.stderr[-2000:]
    shown = run_example(
        "show", "--data", str(data), "--checkpoint", str(ckpt), example=LEDGER_AUDIT
    )
    assert '"audits_failed": 0' in shown.stdout and '"exactly_as_expected": true' in shown.stdout
    verdict = check(tx.read_history(ckpt), "csao")
    assert verdict.holds, verdict.evidence


CLUSTER_JOB = """
import importlib.util, json, os, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_runtime_spark import ledger_streams
import txstream as tx
from txstream.bench.ledger import ledger_job
from txstream.spark import local_session

spark = local_session("cluster-test", master={master!r})

def killing(inner, marker):
    # The first task of the run's batch 1 takes its executor JVM down with it (once).
    def transfer(t, e):
        if e["id"] > 500 and not marker.exists():
            marker.write_text(str(os.getpid()))
            os.kill(os.getppid(), 9)
            os._exit(1)
        inner(t, e)
    return transfer

runs = []
# One application for every run (each local-cluster start costs two executor JVMs):
# the runs follow one another, each killing an executor of the cluster as the run
# before it left it (the master has launched a new one for the one killed).
for run in json.loads(sys.argv[1]):
    folder, ckpt, which = Path(run["in"]), Path(run["ckpt"]), run["which"]
    if which == "ledger_audit":  # audits (global reads) amid the transfers
        spec = importlib.util.spec_from_file_location("ledger_audit", {example!r})
        example = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(example)
        streams = [spark.readStream.schema(schema).option("maxFilesPerTrigger", 1)
                   .json(str(folder / name)) for name, schema in example.INPUTS.items()]
        job = example.job(str(folder / "accounts.json"), *streams)
    else:
        job = ledger_job(*ledger_streams(spark, folder))
    job.option("merge", run["merge"])
    job.on("transfers", killing(job.spec.handlers["transfers"], Path(run["killed"])))
    query = job.trigger(availableNow=True).start(ckpt, spark=spark, partitions=2)
    try:
        query.awaitTermination()
    finally:
        query.stop()
    got = {{name: tx.read_output(ckpt, name) for name in job.spec.outputs}}
    if which == "ledger_audit":
        got["accounts"] = tx.read_table(ckpt, "accounts")
    forwarded = sum(p["multiPartition"]["transactions"] for p in query.recentProgress)
    runs.append({{"got": got, "forwarded": forwarded}})
cq = None
if len(sys.argv) > 2:
    # SparkCQ on the same cluster (issue 31): s2pl, prices rewritten between batches
    from test_cq_spark import price_setter, query as cq_query
    from txstream.cq.workload import load_table
    cq_in = Path(sys.argv[2])
    rows = {{int(k): v for k, v in json.loads((cq_in / "rows.json").read_text()).items()}}
    tm = load_table("s2pl", rows)
    handle = cq_query(spark, cq_in / "events", tm, "s2pl", 8, 3).start(
        cq_in.parent / "cq-ckpt", after_batch=price_setter(tm, sorted(rows), 0))
    try:
        handle.processAllAvailable()
    finally:
        handle.stop()
    cq = [[x.window, x.lwm, round(x.value, 9), x.consistent] for x in handle.results]
print(json.dumps({{"runs": runs, "cq": cq}}))
"""


def test_local_cluster_gives_the_answers_of_local_even_when_an_executor_dies(
    tmp_path: Path,
) -> None:
    # One local-cluster[2,1,1024] application runs two jobs, one after the other;
    # in each an executor dies inside a forwarded multi-partition batch (ids
    # 400-799 of 1,200 in 3 files):
    # - examples/ledger_audit.py, merge "batch": audits run before and after the
    #   kill's place in that batch, each a global read over both executors' partitions;
    # - the ledger, merge "event-time": a barrier stage; then SparkCQ on the same cluster.
    spec = importlib.util.spec_from_file_location("ledger_audit", LEDGER_AUDIT)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    audit, ledger = tmp_path / "audit", tmp_path / "ledger"
    want_audit = example.generate(audit / "in", accounts=30, files=3, per_file=400, seed=21)
    stream = list(events(1200, 30, 30, seed=21))
    # event-time: a last deposit (held itself) releases every transfer
    stream.append(("deposits", {"acct": 0, "amount": 0, "id": 10**6}))
    write_ledger_input(ledger / "in", stream, files=3)
    want_ledger = {"transfers_done": [{"id": i, "ok": ok} for i, ok in serial_oracle(stream)[1]]}
    runs = [
        {"which": "ledger_audit", "merge": "batch", "in": str(audit / "in")},
        {"which": "ledger", "merge": "event-time", "in": str(ledger / "in")},
    ]
    for run, folder in zip(runs, (audit, ledger), strict=True):
        run |= {"ckpt": str(folder / "ckpt"), "killed": str(folder / "killed")}
    # SparkCQ under s2pl on two executor JVMs gives the windows of CQEngine fed the
    # same batches, all consistent
    from test_cq_spark import engine_oracle, make_batches, write_batches

    rng = random.Random(4)
    rows = {k: {"price": rng.randint(1, 60), "cat": 0} for k in range(10)}
    batches = make_batches(rng, 2, 16, 12)  # parts 10 and 11 have no row: absent reads
    (tmp_path / "cq").mkdir()
    write_batches(tmp_path / "cq" / "events", batches)
    (tmp_path / "cq" / "rows.json").write_text(json.dumps(rows))
    cq_want = [[w, lwm, v, True] for w, lwm, v in engine_oracle(rows, batches, 8, 3, seed=0)]
    assert cq_want
    script = tmp_path / "job.py"
    script.write_text(
        CLUSTER_JOB.format(
            tests=str(ROOT / "tests"),
            master="local-cluster[2,1,1024]",
            example=str(LEDGER_AUDIT),
        )
    )
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(ROOT / "src")}
    result = subprocess.run(
        [sys.executable, str(script), json.dumps(runs), str(tmp_path / "cq")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # an executor really died mid-batch, in each run
    assert (audit / "killed").exists() and (ledger / "killed").exists()
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert [run["got"] for run in answer["runs"]] == [want_audit, want_ledger]
    assert answer["cq"] == cq_want
    # multi-partition transfers ran forwarded, not deferred
    assert all(run["forwarded"] > 0 for run in answer["runs"])
    audits = answer["runs"][0]["got"]["audits"]
    assert all(a["ok"] for a in audits) and any(500 < a["id"] < 800 for a in audits)


KILLED_DRIVER = """
import os, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_runtime_spark import ledger_streams
from txstream.bench.ledger import deposit, ledger_job, transfer
from txstream.spark import local_session

folder, ckpt, master = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
# Under spark-submit the JVM runs already (it started this process) with its master.
spark = local_session("killed-driver", master=None if master == "submit" else master)
sleeper = 0
if master != "submit":
    # A process the driver forked (a multiprocessing worker, say) holds the other end
    # of the JVM's stdin pipe: Spark's own end-of-input check never fires.
    sleeper = os.fork()
    if sleeper == 0:
        time.sleep(600)
        os._exit(0)
gate = ckpt.parent / "go"
def gated(inner):
    def run(t, e):
        # Batch 1's phase-1 tasks wait here, in their Python workers, until the
        # test opens the gate: a task still alive then would write on.
        if e["id"] > 500 and not gate.exists():
            (ckpt.parent / f"inflight-{{os.getpid()}}").touch()
            while not gate.exists():
                time.sleep(0.05)
        inner(t, e)
    return run
job = ledger_job(*ledger_streams(spark, folder))
job.on("deposits", gated(deposit)).on("transfers", gated(transfer))
query = job.trigger(availableNow=True).start(ckpt, spark=spark, partitions=2)
print(spark.sparkContext._jvm.ProcessHandle.current().pid(), sleeper, os.getpid(), flush=True)
query.awaitTermination()
"""


def _started(pid: int) -> str | None:
    """Process ``pid``'s start time; None when it is gone (a zombie counts as gone)."""
    from txstream.spark.jvmwatchdog import start_time

    return start_time(pid)


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in folder.rglob("*")
        if p.is_file()
    }


def _executors(pids: Any) -> int:
    """How many of ``pids`` are executor JVMs (a ``local-cluster``'s own processes)."""
    count = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            count += b"CoarseGrainedExecutorBackend" in Path(f"/proc/{pid}/cmdline").read_bytes()
    return count


@pytest.mark.parametrize("launch", ["local-cluster[2,1,1024]", "spark-submit"])
def test_a_sigkilled_driver_takes_its_jvm_down_and_nothing_is_written_after_it(
    spark: Any, tmp_path: Path, launch: str
) -> None:
    # On local-cluster the driver's JVM, two executor JVMs (its children) and
    # their Python workers; a local[N] JVM's workers are its children too, the
    # same tree for the watchdog.  Under spark-submit the JVM is the Python
    # driver's parent and has no watchdog: Spark must end it (and its executors).
    from txstream.spark.jvmwatchdog import tree

    stream = list(events(1200, 30, 30, seed=21))
    write_ledger_input(tmp_path / "in", stream, files=3)
    ckpt = tmp_path / "ckpt"
    script = tmp_path / "job.py"
    script.write_text(KILLED_DRIVER.format(tests=str(ROOT / "tests")))
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT / "src"),
    }
    args = [str(script), str(tmp_path / "in"), str(ckpt)]
    if launch == "spark-submit":
        submit = Path(sys.executable).parent / "spark-submit"
        command = [str(submit), "--master", "local-cluster[2,1,1024]", *args, "submit"]
    else:
        command = [sys.executable, *args, launch]
    err = tmp_path / "driver.err"
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=err.open("w"),
        text=True,
        env=env,
        start_new_session=True,
    )
    sleeper, processes = None, {}
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line, err.read_text()[-3000:]
        jvm, sleeper, driver = map(int, line.split())
        deadline = time.time() + 300
        while not any(tmp_path.glob("inflight-*")):  # batch 1 waits at the gate
            assert proc.poll() is None and time.time() < deadline, err.read_text()[-3000:]
            time.sleep(0.1)
        before = {}
        while before != _files(ckpt):  # what does not wait at the gate has written its files
            before = _files(ckpt)
            time.sleep(1)
        # The JVM, its Python workers (one waits at the gate) and their daemon; on
        # local-cluster its executor JVMs and theirs; under spark-submit the driver.
        processes = {p: s for p in tree(jvm) if (s := _started(p)) is not None}
        assert len(processes) >= 3 and any((ckpt / "txstream" / "commits").iterdir())
        assert _executors(processes) == 2
        os.kill(driver, signal.SIGKILL)
        if launch != "spark-submit":
            proc.wait()
        deadline = time.time() + 60  # generous: without the watchdog they run on for good
        while any(_started(p) == s for p, s in processes.items()) and time.time() < deadline:
            time.sleep(0.1)
        left = [p for p, s in processes.items() if _started(p) == s]
        assert left == [], subprocess.run(
            ["ps", "-o", "pid,ppid,stat,etime,args", "-p", ",".join(map(str, left))],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        (tmp_path / "go").touch()  # a task that survived the driver would run on and write now
        time.sleep(2)
        assert _files(ckpt) == before
    finally:
        for pid, started in [*processes.items(), (sleeper or None, None)]:
            if pid is not None and (started is None or _started(pid) == started):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()
        if proc.stdout:
            proc.stdout.close()
    # The store's lock went with the driver: a restart runs, and gives the serial answers.
    run_available(ledger_job(*ledger_streams(spark, tmp_path / "in")), ckpt, spark, partitions=2)
    assert transfer_outcomes(ckpt) == serial_oracle(stream)[1]


def test_run_local_computes_timestamp_and_date_order_values_as_spark_does(spark: Any) -> None:
    import datetime as dt
    from zoneinfo import ZoneInfo

    from pyspark.sql import types as T

    from txstream.spark.runtime.inputs import order_value
    from txstream.spark.runtime.local import order_number

    rng = random.Random(5)
    zones = [dt.UTC, ZoneInfo("Europe/Paris"), ZoneInfo("America/St_Johns"), ZoneInfo("Asia/Tokyo")]
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    stamps = [
        (epoch + dt.timedelta(microseconds=rng.randrange(-(10**15), 10**17))).astimezone(
            rng.choice(zones)
        )
        for _ in range(200)
    ]
    days = [dt.date(1970, 1, 1) + dt.timedelta(days=rng.randrange(-40_000, 40_000)) for _ in stamps]
    df = spark.createDataFrame(list(zip(stamps, days, strict=True)), "ts timestamp, day date")
    got = df.selectExpr(
        f"{order_value('ts', T.TimestampType())} as ts",
        f"{order_value('day', T.DateType())} as day",
    ).collect()
    assert [r["ts"] for r in got] == [order_number(s) for s in stamps]
    assert [r["day"] for r in got] == [order_number(d) for d in days]


def test_a_restart_on_spark_keeps_inputs_and_key_types_and_reads_new_outputs(
    spark: Any, tmp_path: Path
) -> None:
    # test_runtime_restart.py checks each change with run_local; here what only
    # Spark has: its sources resumed by place, and key columns' types.
    stream = list(events(120, 8, 20, seed=5))
    write_ledger_input(tmp_path / "in", stream[:60], files=1)
    deposits, transfers = ledger_streams(spark, tmp_path / "in")
    run_available(ledger_job(deposits, transfers), tmp_path / "ckpt", spark)
    swapped = (
        tx.Job("ledger")
        .table("accounts", key="acct", schema="acct long, balance long")
        .input("transfers", transfers, keys=["src", "dst"], order="id")
        .input("deposits", deposits, keys="acct", order="id")
        .output("transfers_done")
        .on("deposits", lambda t, e: None)
        .on("transfers", lambda t, e: None)
        .option("merge", "batch")
    )
    # Spark would resume each file source from the other's offsets (or, for a
    # source without paths such as Kafka, read on silently): refused at start.
    with pytest.raises(tx.RuntimeJobError, match=r"^checkpoint \S+ was started with inputs \['de"):
        swapped.start(tmp_path / "ckpt", spark=spark)
    texts = spark.readStream.schema("acct string, amount long, id long").json(
        str(tmp_path / "in" / "deposits")
    )
    # Accounts 5 and '5' are different keys: every deposit would open a new account.
    with pytest.raises(
        tx.RuntimeJobError,
        match=r"^input 'deposits': its key columns held integer values in checkpoint \S+, now "
        r"string: rows stored under the old values would not be found",
    ):
        ledger_job(texts, transfers).start(tmp_path / "ckpt", spark=spark)
    assert not spark.streams.active

    def audited(t: tx.Tx, e: dict[str, Any]) -> None:
        transfer(t, e)
        t.emit("audit", {"id": e["id"]})

    write_ledger_input(tmp_path / "in2", stream[60:], files=1)
    for name in ("deposits", "transfers"):  # the second file of each input
        (tmp_path / "in2" / name / "part-0000.json").rename(tmp_path / "in" / name / "p1.json")
    job = ledger_job(deposits, transfers).output("audit").on("transfers", audited)
    run_available(job, tmp_path / "ckpt", spark)
    assert transfer_outcomes(tmp_path / "ckpt") == serial_oracle(stream)[1]
    later = [e["id"] for n, e in stream[60:] if n == "transfers"]
    assert [r["id"] for r in tx.read_output(tmp_path / "ckpt", "audit")] == later


@pytest.mark.parametrize("background", [False, True], ids=["in-batch", "background"])
def test_a_failing_sink_fails_the_query_after_the_commit_and_gets_the_batch_on_restart(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture, background: bool
) -> None:
    # A user's callable runs in the batch's thread; a built-in sink (background)
    # on the query's delivery thread: the failure speaks the same either way.
    stream = list(events(90, 6, 20, seed=9))
    write_ledger_input(tmp_path / "in", stream, files=2)
    delivered: list[tuple[int, list[int]]] = []
    down = [True]  # the database is down for the first call of batch 1

    class Sink:
        def __call__(self, batch: int, rows: list[dict[str, Any]]) -> None:
            if batch == 1 and down and down.pop():
                raise ConnectionError("db down")
            delivered.append((batch, [r["id"] for r in rows]))

    sink = Sink()
    sink.background = background  # type: ignore[attr-defined]
    job = ledger_job(*ledger_streams(spark, tmp_path / "in")).sink("transfers_done", sink)
    query = job.trigger(availableNow=True).start(tmp_path / "ckpt", spark=spark)
    try:
        with pytest.raises(
            tx.TxStreamError,
            match=r"sink of output 'transfers_done' failed on batch 1: ConnectionError: db down; "
            "it is called again on restart$",
        ) as failed:
            query.awaitTermination()
    finally:
        query.stop()
    # Batch 1 committed before its sink ran: its progress counts (it was missing
    # from lastProgress and committedBatches), and read_output has its rows.
    assert query.lastProgress is not None and query.lastProgress["batchId"] == 1
    assert query.status["committedBatches"] == 2 and "db down" in query.status["failure"]
    assert transfer_outcomes(tmp_path / "ckpt") == serial_oracle(stream)[1]
    assert [b for b, _ in delivered] == [0]
    with caplog.at_level(logging.INFO, logger="txstream.runtime"):
        run_available(job, tmp_path / "ckpt", spark)  # the restart delivers batch 1, once
    assert [b for b, _ in delivered] == [0, 1]
    assert any(
        r.getMessage().endswith(
            "recovery: 1 committed batch(es) delivered to sinks at start "
            "(not delivered before the last stop)"
        )
        for r in caplog.records
    )
    # The error raised again by the handle keeps Spark's exception as its cause.
    assert failed.value.__cause__ is not None
    assert [i for _, ids in delivered for i in ids] == [i for i, _ in serial_oracle(stream)[1]]


def test_stop_from_a_sink_does_not_wait_for_its_own_batch(spark: Any, tmp_path: Path) -> None:
    # stop() waited STOP_WAIT_S (30 s) for the batch in flight, which was the very
    # batch whose sink called it (its thread held the batch), then stopped Spark's
    # query from the query's own thread: an InterruptedException failed the job.
    # One input file, one batch; the default trigger keeps the query running
    # after it, so only the sink's stop() ends it.
    stream = list(events(40, 6, 20, seed=5))
    write_ledger_input(tmp_path / "in", stream, files=1)
    started = threading.Event()
    handle: list[Any] = []
    stops: list[tuple[int, float]] = []

    def sink(batch: int, rows: list[dict[str, Any]]) -> None:
        started.wait(30)
        t0 = time.monotonic()
        handle[0].stop()
        stops.append((batch, time.monotonic() - t0))

    job = ledger_job(*ledger_streams(spark, tmp_path / "in")).sink("transfers_done", sink)
    query = job.start(tmp_path / "ckpt", spark=spark)
    handle.append(query)
    started.set()
    try:
        assert query.awaitTermination(timeout=60) is True  # the sink's stop() ended it
    finally:
        query.stop()
    assert len(stops) == 1 and stops[0][0] == 0, stops  # (a stop() that hung: no entry)
    assert not query.isActive and query.status["failure"] is None
    assert query.status["message"] == "stopped" and query.status["committedBatches"] == 1
    assert transfer_outcomes(tmp_path / "ckpt") == serial_oracle(stream)[1]


def test_failed_transactions_are_logged_and_warned_and_a_job_bug_stops_the_query(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging
    import warnings

    folder = tmp_path / "in"
    folder.mkdir()
    for n in range(2):
        rows = [{"k": i % 3, "id": i} for i in range(n * 15, n * 15 + 15)]
        path = folder / f"part-{n}.json"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.utime(path, (1_700_000_000 + n, 1_700_000_000 + n))  # one file per batch, in order

    def count(t: tx.Tx, e: dict[str, Any]) -> None:
        if e["id"] in (3, 20):
            raise ValueError(f"boom at {e['id']}")
        t.emit("out", {"id": e["id"]})

    def made(fn: Any) -> tx.Job:
        df = spark.readStream.schema("k long, id long").option("maxFilesPerTrigger", 1)
        return (
            tx.Job("speaks")
            .input("ev", df.json(str(folder)), keys="k", order="id")
            .output("out", schema="id long")
            .on("ev", fn)
        )

    query = made(count).start(tmp_path / "ckpt", spark=spark, partitions=2)
    try:
        with (
            caplog.at_level(logging.WARNING, logger="txstream.runtime"),
            pytest.warns(tx.TransactionFailuresWarning) as caught,
        ):
            query.processAllAvailable()
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("error", tx.TransactionFailuresWarning)  # reported already
            query.stop()
    (warning,) = caught
    assert "2 transaction(s) failed" in str(warning.message)
    assert "first at ev#3: ValueError: boom at 3" in str(warning.message)
    logged = [r.getMessage() for r in caplog.records if r.name == "txstream.runtime"]
    assert logged == [
        "job 'speaks', batch 0: transaction at ev#3 rolled back (error): ValueError: boom at 3",
        "job 'speaks', batch 1: transaction at ev#b1+5 rolled back (error): ValueError: boom at 20",
    ]

    # An emit that never fits its output stops the query (the driver engine too).
    def bad(t: tx.Tx, e: dict[str, Any]) -> None:
        t.emit("out", {"id": str(e["id"])})

    query = made(bad).start(tmp_path / "bad", spark=spark, partitions=2, engine="driver")
    try:
        with pytest.raises(tx.InputFailingError, match=r"^input 'ev': all 30 of its"):  # noqa: SIM117
            with pytest.warns(tx.TransactionFailuresWarning, match="30 transaction"):
                query.processAllAvailable()
    finally:
        query.stop()
    assert len(tx.read_failures(tmp_path / "bad")) == 30

    # On executors, after the batch that reached the limit committed: a restart
    # with the job fixed goes on after it (that batch is not run again).
    rows = [{"k": i % 3, "id": i} for i in range(30, 40)]
    (folder / "part-2.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.utime(folder / "part-2.json", (1_700_000_002, 1_700_000_002))
    query = made(bad).option("allFailLimit", 15).start(tmp_path / "ex", spark=spark, partitions=2)
    try:
        with pytest.raises(tx.InputFailingError, match=r"^input 'ev': all 15 of its"):  # noqa: SIM117
            with pytest.warns(tx.TransactionFailuresWarning, match="15 transaction"):
                query.processAllAvailable()
    finally:
        query.stop()
    run_available(made(count), tmp_path / "ex", spark)
    assert [r["id"] for r in tx.read_output(tmp_path / "ex", "out")] == [
        i for i in range(15, 40) if i != 20
    ]
    assert len(tx.read_failures(tmp_path / "ex")) == 16

    # onError=stop now stops the driver engine too (it was ignored there).
    driver = made(count).option("onError", "stop")
    query = driver.start(tmp_path / "stop", spark=spark, partitions=2, engine="driver")
    try:
        with pytest.raises(tx.TxStreamError, match=r"^transaction at ev#3 failed: ValueError"):  # noqa: SIM117
            with pytest.warns(tx.TransactionFailuresWarning, match="1 transaction"):
                query.processAllAvailable()
    finally:
        query.stop()


def test_a_batch_whose_marker_was_lost_runs_again_on_restart(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Spark's commit log counts the last batch done; txstream's marker of it is
    # gone (a lost file): the restart must run it again, not take it as done.
    stream = list(events(150, 8, 20, seed=5))
    write_ledger_input(tmp_path / "in", stream, files=3)
    job = ledger_job(*ledger_streams(spark, tmp_path / "in"))
    run_available(job, tmp_path / "ckpt", spark)
    marker = tmp_path / "ckpt" / "txstream" / "commits" / f"{2:012d}.json"
    assert (tmp_path / "ckpt" / "spark" / "commits" / "2").exists()
    marker.unlink()
    with caplog.at_level(logging.INFO, logger="txstream.runtime"):
        run_available(job, tmp_path / "ckpt", spark)
    assert marker.exists()
    # The recovery is logged (quiet unless logging is configured).
    assert any(
        r.getMessage().startswith("recovery: Spark counted batch 2 as done but its txstream")
        for r in caplog.records
    )
    balance, outcomes = serial_oracle(stream)
    assert transfer_outcomes(tmp_path / "ckpt") == outcomes
    rows = tx.read_table(tmp_path / "ckpt", "accounts")
    assert {r["acct"]: r["balance"] for r in rows} == balance
