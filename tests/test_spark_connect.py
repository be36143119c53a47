"""The runtime through Spark Connect: the same ledger answers as a classic session.

A session-scoped fixture starts the Connect server that the PySpark wheel ships
(on loopback, a free port, stopped at the end) and connects a client session to
it.  Skipped only when the Connect client's packages (``txstream[connect]``,
which ``make install`` installs) are missing.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import txstream as tx
from test_runtime_spark import ledger_streams, run_available, write_ledger_input
from txstream.bench.ledger import events, ledger_job, serial_oracle
from txstream.errors import TxStreamError
from txstream.spark.connect import client_missing, connect_server, is_connect

pytestmark = pytest.mark.spark


@pytest.fixture(scope="session")
def connect_spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A Spark Connect session on a server of its own (local[2], loopback)."""
    missing = client_missing()
    if missing:
        pytest.skip(f"Spark Connect's client needs {missing}: pip install 'txstream[connect]'")
    # (pyspark.sql.SparkSession.builder.remote refuses a Connect session beside the
    # classic one this test process runs too; Connect's own builder does not)
    from pyspark.sql.connect.session import SparkSession

    log = tmp_path_factory.mktemp("connect") / "server.log"
    with connect_server("local[2]", log=log) as url:
        session = SparkSession.builder.remote(url).getOrCreate()
        try:
            yield session
        finally:
            session.stop()  # (a client left open keeps this process from exiting)


def _run_ledger(spark: Any, folder: Path, mode: str, merge: str) -> tuple[Path, Any]:
    job = ledger_job(*ledger_streams(spark, folder / "in"), merge=merge)
    job.option("crossPartition", mode)
    checkpoint = folder / "ckpt"
    return checkpoint, run_available(job, checkpoint, spark, partitions=2)


@pytest.mark.parametrize(("mode", "merge"), [("forward", "batch"), ("defer", "event-time")])
def test_ledger_through_connect_equals_the_classic_session(
    spark: Any, connect_spark: Any, tmp_path: Path, mode: str, merge: str
) -> None:
    # forward: phase 1 in a barrier stage; defer: phases 2-3 (no RDDs over Connect);
    # event-time: the end of the inputs runs one more batch from the client.
    assert is_connect(connect_spark) and not is_connect(spark)
    stream = list(events(600, 30, 30, seed=5))
    answers, progress, tables = {}, {}, {}
    for kind, session in (("classic", spark), ("connect", connect_spark)):
        write_ledger_input(tmp_path / kind / "in", stream, files=3)
        checkpoint, query = _run_ledger(session, tmp_path / kind, mode, merge)
        assert not query.isActive
        answers[kind] = tx.read_output(checkpoint, "transfers_done")
        tables[kind] = sorted(tx.read_table(checkpoint, "accounts"), key=lambda r: r["acct"])
        progress[kind] = [
            (p["batchId"], p["numInputRows"], p["committed"]) for p in query.recentProgress
        ]
        assert len(RuntimeCommits(checkpoint)) >= 3  # one batch per file (and the end)
    _, outcomes = serial_oracle(stream)
    assert [(r["id"], r["ok"]) for r in answers["classic"]] == outcomes
    assert answers["connect"] == answers["classic"]  # row for row
    assert tables["connect"] == tables["classic"]  # every balance (held deposits included)
    # The batches ran in the server's process; the client's handle reports them all.
    assert progress["connect"] == progress["classic"]
    assert sum(rows for _, rows, _ in progress["connect"]) == len(stream)
    assert {p["runId"] for p in query.recentProgress} == {query.runId} != {""}
    deferred = mode == "defer"
    assert any(RuntimeCommits(tmp_path / "connect" / "ckpt").roles("coord")) is deferred


class RuntimeCommits:
    """The commit markers of a checkpoint's store (what each batch's tasks wrote)."""

    def __init__(self, checkpoint: Path) -> None:
        from txstream.spark.runtime.state import RuntimeStore

        self.store = RuntimeStore(checkpoint / "txstream")

    def __len__(self) -> int:
        return len(self.store.committed())

    def roles(self, prefix: str) -> list[str]:
        return [
            rel
            for _, info in self.store.chain()
            for rel in info["files"]
            if Path(rel).stem.startswith(prefix)
        ]


def test_the_driver_engine_is_refused_on_connect_in_one_line(
    connect_spark: Any, tmp_path: Path
) -> None:
    write_ledger_input(tmp_path / "in", list(events(20, 4, 0, seed=1)), files=1)
    job = ledger_job(*ledger_streams(connect_spark, tmp_path / "in"))
    job.trigger(availableNow=True)
    with pytest.raises(TxStreamError, match=r"driver engine .* Spark Connect.*'executors'"):
        job.start(tmp_path / "ckpt", spark=connect_spark, engine="driver")


def test_the_server_side_copy_of_a_query_holds_no_client_object(spark: Any, tmp_path: Path) -> None:
    # What foreachBatch pickles over Connect: without the sources, the session, the locks.
    write_ledger_input(tmp_path / "in", list(events(20, 4, 0, seed=1)), files=1)
    job = ledger_job(*ledger_streams(spark, tmp_path / "in"))
    query = job.trigger(availableNow=True).start(tmp_path / "ckpt", spark=spark)
    try:
        query.awaitTermination()
        copy = pickle.loads(pickle.dumps(query))
    finally:
        query.stop()
    assert copy.spark is None and copy.query is None
    assert all(spec.source is None for spec in copy.spec.inputs.values())
    assert copy._prev == query.store.committed()[-1]  # its position, read from the store


def test_a_batch_failure_on_the_server_reaches_the_client_as_its_own_class(
    connect_spark: Any, tmp_path: Path
) -> None:
    # The handler emits to an output the job does not declare: every transfer fails with
    # a SchemaError, and after allFailLimit of them the batch (on the server) raises.
    stream = [e for e in events(60, 6, 50, seed=2) if e[0] == "transfers"]
    write_ledger_input(tmp_path / "in", stream, files=1)
    _, transfers = ledger_streams(connect_spark, tmp_path / "in")
    job = (
        tx.Job("typo")
        .table("accounts", key="acct", schema="acct long, balance long")
        .input("transfers", transfers, keys=["src", "dst"], order="id")
        .on("transfers", lambda t, e: t.emit("typo", {"id": e["id"]}))
        .option("allFailLimit", 5)
        .trigger(availableNow=True)
    )
    query = job.start(tmp_path / "ckpt", spark=connect_spark)
    try:
        with pytest.raises(tx.InputFailingError, match=r"^input 'transfers': all \d+ of its"):
            query.awaitTermination()
        assert isinstance(query.exception(), tx.InputFailingError)
        assert query.status["message"] == "failed"
    finally:
        query.stop()


def test_a_watermark_on_a_connect_input_is_seen_as_on_a_classic_one(
    spark: Any, connect_spark: Any, tmp_path: Path
) -> None:
    # Read from Spark's plan: over Connect through the server's explain text (no py4j).
    write_ledger_input(tmp_path / "in", list(events(20, 4, 0, seed=1)), files=1)
    for session in (spark, connect_spark):
        deposits, _ = ledger_streams(session, tmp_path / "in")
        deposits = deposits.withColumn("ts", deposits["id"].cast("timestamp"))
        job = tx.Job("marks").table("accounts", key="acct")
        job.input("deposits", deposits.withWatermark("ts", "7 seconds"), keys="acct")
        with pytest.raises(TxStreamError, match=r"withWatermark is on column 'ts'.*order="):
            job.on("deposits", lambda t, e: None).start(tmp_path / "ckpt", spark=session)


class _FakeConf:
    def __init__(self, settings: dict[str, str]) -> None:
        self.settings = settings

    def get(self, key: str, default: Any = None) -> Any:
        return self.settings.get(key, default)


class _FakeConnectSession:
    """Only what default_parallelism asks of a Connect session (a Spark job fails)."""

    def __init__(self, **settings: str) -> None:
        self.conf = _FakeConf(settings)
        self.jobs = 0

    def range(self, n: int) -> Any:
        self.jobs += 1
        raise RuntimeError("a Spark job")


_FakeConnectSession.__module__ = "pyspark.sql.connect.session"


def test_a_connect_sessions_parallelism_comes_from_its_settings_without_a_job() -> None:
    from txstream.spark.connect import default_parallelism

    assert default_parallelism(_FakeConnectSession(**{"spark.master": "local[3]"})) == 3
    assert default_parallelism(_FakeConnectSession(**{"spark.master": "local[2, 4]"})) == 2
    assert default_parallelism(_FakeConnectSession(**{"spark.master": "local"})) == 1
    given = {"spark.master": "local[3]", "spark.default.parallelism": "5"}
    assert default_parallelism(_FakeConnectSession(**given)) == 5
    cluster = _FakeConnectSession(**{"spark.master": "spark://h:7077"})
    with pytest.raises(RuntimeError, match="a Spark job"):  # (then it counts partitions)
        default_parallelism(cluster)


def test_a_connect_query_restarts_from_its_checkpoint_where_it_stopped(
    connect_spark: Any, tmp_path: Path
) -> None:
    # Half the input, stop, the other half arrives, a new query (a new Connect
    # batch process) on the same checkpoint: the serial answer, each batch once.
    import shutil

    stream = list(events(600, 30, 30, seed=8))
    write_ledger_input(tmp_path / "all", stream, files=4)
    inputs, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    runs = []
    for parts in ((0, 1), (2, 3)):
        for name in ("deposits", "transfers"):
            (inputs / name).mkdir(parents=True, exist_ok=True)
            for n in parts:
                part = f"part-{n:04d}.json"
                shutil.copy2(tmp_path / "all" / name / part, inputs / name / part)
        job = ledger_job(*ledger_streams(connect_spark, inputs), merge="batch")
        runs.append(run_available(job, checkpoint, connect_spark, partitions=2))
    first, second = ([p["batchId"] for p in q.recentProgress] for q in runs)
    assert first == [0, 1] and second == [2, 3]  # (the restart went on, it did not redo)
    assert sum(p["numInputRows"] for q in runs for p in q.recentProgress) == len(stream)
    _, outcomes = serial_oracle(stream)
    assert [(r["id"], r["ok"]) for r in tx.read_output(checkpoint, "transfers_done")] == outcomes
