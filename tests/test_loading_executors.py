"""Loading from the executors: the k sessions as Spark tasks with connections of their own.

The pure pieces (routing, grouping, J as the server's locks, the header
transaction) run against a real PostgreSQL server without Spark; the Spark
tests check that no statement goes through the driver, that the result equals
the driver's loader and the serial oracle, and that a run whose driver is
SIGKILLed midway ends, once restarted, with every operation applied once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from txstream.errors import TxStreamError
from txstream.loading import EmbeddedTarget, Loader, LoadTransaction
from txstream.loading.loader import LoadReport
from txstream.loading.methods import Partition
from txstream.loading.oracle import (
    apply_serial,
    base_from_rows,
    check_loaded,
    differences,
    expected_state,
)
from txstream.loading.pgserver import PostgresServer, find_bindir
from txstream.loading.postgres import PostgresTarget
from txstream.loading.sessions import form, gate_keys, route, run_session
from txstream.loading.workloads import demand_schema, demand_stream, initial_rows

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


@pytest.fixture(scope="module")
def server() -> Iterator[PostgresServer]:
    if find_bindir() is None:
        proc = subprocess.run(
            [str(SCRIPTS / "pg-install.sh")], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0 or find_bindir() is None:
            pytest.fail(f"PostgreSQL server not available: {proc.stderr.strip()[-200:]}")
    srv = PostgresServer(deadlock_timeout_ms=20).start()
    yield srv
    srv.stop()


def _fresh(server: PostgresServer, parts: int = 40, cls: type = PostgresTarget) -> Any:
    target = cls(demand_schema(), server)
    init = initial_rows(parts, seed=1)
    target.setup()
    target.bulk_load(init)
    return target, init


class _Recording(Partition):
    """The partitioning method, keeping every transaction the driver's loader forms."""

    def bind(self, schema: Any, k: int, seed: int) -> None:
        super().bind(schema, k, seed)
        self.formed: list[LoadTransaction] = []

    def enqueue(self, txn: LoadTransaction) -> None:
        self.formed.append(txn)


def test_each_session_forms_the_driver_loaders_transactions() -> None:
    schema = demand_schema()
    ops = demand_stream(700, 40, seed=3)
    k, n, batch = 4, 5, 7
    method = _Recording()
    method.bind(schema, k, 0)
    loader = Loader(EmbeddedTarget(schema), method, sessions=k, grouping=n)
    loader._feed(ops, method, LoadReport("partition", "embedded", k, n, False), batch, [])
    for m in range(k):
        mine = [
            op for i, op in enumerate(ops) if route(schema, "partition", op, k, 0, batch, i) == m
        ]
        apart = form(mine, m, n, batch)
        driver = [t for t in method.formed if t.session == m]
        assert [(t.relation, t.ops) for t in apart] == [(t.relation, t.ops) for t in driver]
        assert [t.ident for t in apart] == [(batch, (m << 32) + i) for i in range(len(apart))]
    # naive: a reproducible spread over every session, whatever process computes it
    spread = [route(schema, "naive", op, k, 0, batch, i) for i, op in enumerate(ops)]
    assert set(spread) == set(range(k))
    assert spread == [route(schema, "naive", op, k, 0, batch, i) for i, op in enumerate(ops)]


def _txn(relation: str, m: int, batch: int, seq: int) -> LoadTransaction:
    ops = demand_stream(60, 40, seed=seq)
    mine = [op for op in ops if op.relation == relation][:3]
    return LoadTransaction(seq, m, relation, mine, (batch, seq))


def _waiting_advisory_locks(target: PostgresTarget) -> int:
    with target._connect(autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        ).fetchone()
    return int(row[0]) if row else 0


def test_the_j_array_is_the_servers_locks_and_a_header_stops_newcomers(
    server: PostgresServer,
) -> None:
    target, _init = _fresh(server)
    schema = target.schema
    k = 4
    holder = target.connect(3, k)
    other = target.connect(1, k)
    try:
        # Session 3 is running an inventory transaction (it holds its gate, uncommitted).
        cur = holder.conn.cursor()
        gate = gate_keys(schema, "inventory", 3, k)
        assert gate is not None
        assert holder._gate(cur, gate, wait=False)
        # demand conflicts with inventory (the view joins them): not desirable now
        demand1 = _txn("demand", 1, 900, 1)
        assert (
            other.execute_gated(demand1, demand1.ops, gate_keys(schema, "demand", 1, k), False)
            is None
        )
        # another inventory transaction is: the same relation never conflicts with itself
        inv1 = _txn("inventory", 1, 900, 2)
        assert other.execute_gated(inv1, inv1.ops, gate_keys(schema, "inventory", 1, k), False)

        # Session 0's demand transaction waits past TS and becomes the header: it
        # waits in the server's lock queue...
        done: dict[str, Any] = {}

        def session0() -> None:
            done["report"] = run_session(
                target, schema, "reorder", 0, k, [_txn("demand", 0, 900, 3)], starvation_ts=0.05
            )

        thread = threading.Thread(target=session0)
        thread.start()
        deadline = time.time() + 120  # (a bound on a hang, not a speed requirement)
        while _waiting_advisory_locks(target) == 0 and time.time() < deadline:
            time.sleep(0.02)
        assert _waiting_advisory_locks(target) == 1
        # ... and a new inventory transaction, desirable before, may not start before it
        inv2 = _txn("inventory", 1, 900, 4)
        assert (
            other.execute_gated(inv2, inv2.ops, gate_keys(schema, "inventory", 1, k), False) is None
        )
        holder.conn.rollback()  # session 3's transaction ends
        thread.join(timeout=120)
        report = done["report"]
        assert (report.headers, report.transactions) == (1, 1)
        assert other.execute_gated(inv2, inv2.ops, gate_keys(schema, "inventory", 1, k), False)
    finally:
        holder.close()
        other.close()


@pytest.mark.parametrize("method", ["naive", "reorder"])
def test_sessions_apart_load_what_the_oracle_says(server: PostgresServer, method: str) -> None:
    # Each session in its own thread with its own queue, as Spark tasks would run them.
    target, init = _fresh(server)
    schema = target.schema
    ops = demand_stream(1500, 40, seed=5)
    k, n = 4, 6
    queues = [
        form(
            [op for i, op in enumerate(ops) if route(schema, method, op, k, 0, 3, i) == m], m, n, 3
        )
        for m in range(k)
    ]
    reports: list[Any] = [None] * k
    threads = [
        threading.Thread(
            target=lambda m=m: reports.__setitem__(
                m, run_session(target, schema, method, m, k, queues[m], starvation_ts=0.2)
            )
        )
        for m in range(k)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert check_loaded(target, init, ops) == []
    assert sum(r.transactions for r in reports) == sum(len(q) for q in queues)
    if method == "reorder":
        assert sum(r.deadlocks for r in reports) == 0
    # run again (a task Spark re-runs): the ledger skips every transaction
    again = run_session(target, schema, method, 2, k, form(
        [op for i, op in enumerate(ops) if route(schema, method, op, k, 0, 3, i) == 2], 2, n, 3
    ))  # fmt: skip
    assert (again.transactions, again.skipped) == (0, len(queues[2]))
    assert check_loaded(target, init, ops) == []


def test_a_batch_begun_one_way_is_not_resumed_another(server: PostgresServer) -> None:
    # Ledger rows name transactions by (batch, seq): under another method, k, n or
    # seed, or under the driver's loader, the same seq is another transaction, and
    # a resumed batch would skip transactions that never ran.
    from txstream.jobs.loading import ExecutorLoadingSink, LoadingSink

    target, init = _fresh(server)
    sink = ExecutorLoadingSink(target, "reorder", sessions=4, grouping=8)
    target.begin_batch(1, sink.plan())
    target.begin_batch(1, sink.plan())  # resumed with the same settings
    other = ExecutorLoadingSink(target, "reorder", sessions=2, grouping=8)
    with pytest.raises(TxStreamError, match=r"begun as .*k=4.*resume it with the same settings"):
        other(None, 1)  # (refused before the batch's rows are read)
    with Loader(target, "reorder", sessions=2, grouping=4) as loader:
        ops = demand_stream(30, 40, seed=1)
        loader.load(ops, batch_id=2)  # the driver's loader began batch 2
        with pytest.raises(TxStreamError, match="begun by the driver's loader"):
            sink(None, 2)
        with pytest.raises(TxStreamError, match="finish it with ExecutorLoadingSink"):
            LoadingSink(loader)(None, 1)
    assert check_loaded(target, init, ops) == []


# -- on Spark ----------------------------------------------------------------------------


class DriverRefusingTarget(PostgresTarget):
    """A target whose copy in the driver process opens no loading session."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.driver_pid = os.getpid()

    def connect(self, slot: int, slots: int) -> Any:
        if os.getpid() == self.driver_pid:
            raise AssertionError("a loading session was opened in the driver")
        return super().connect(slot, slots)


def _batch_folders(tmp_path: Path, schema: Any, ops: list[Any]) -> list[Path]:
    """Two batches of two files each (two input partitions), one bad line in the second."""
    folders = []
    half = len(ops) // 2
    for b, chunk in enumerate((ops[:half], ops[half:])):
        folder = tmp_path / f"batch{b}"
        folder.mkdir()
        lines = [json.dumps(op.to_json(schema)) for op in chunk]
        if b == 1:
            lines.insert(7, '{"relation": "orders", "op": "insert", "values": {}}')
        mid = len(lines) // 2
        (folder / "a.jsonl").write_text("\n".join(lines[:mid]) + "\n")
        (folder / "b.jsonl").write_text("\n".join(lines[mid:]) + "\n")
        folders.append(folder)
    return folders


@pytest.mark.spark
def test_sessions_run_as_tasks_with_no_statement_through_the_driver(
    spark: Any, server: PostgresServer, tmp_path: Path
) -> None:
    from pyspark import cloudpickle

    from txstream.jobs.loading import ExecutorLoadingSink

    # The test's target class travels to the executors by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    schema = demand_schema()
    ops = demand_stream(1200, 40, seed=11)
    folders = _batch_folders(tmp_path, schema, ops)
    k = 3
    for method in ("naive", "partition", "reorder"):
        target, init = _fresh(server, cls=DriverRefusingTarget)
        sink = ExecutorLoadingSink(target, method, sessions=k, grouping=5, starvation_ts=0.2)
        frames = [spark.read.text(str(f)) for f in folders]
        for b, df in enumerate(frames):
            sink(df, b)
        sink(frames[0], 0)  # Spark runs a committed batch again: skipped
        assert sink.skipped == [0]
        assert check_loaded(target, init, ops) == [], method

        # The driver's loader on the same input loads the same contents.
        driver = EmbeddedTarget(schema)
        driver.setup()
        driver.bulk_load(init)
        with Loader(driver, method, sessions=k, grouping=5) as loader:
            lines = [r.value for f in frames for r in f.collect()]
            report = loader.load(lines)
        assert differences(schema, target.state(), driver.state()) == [], method
        assert [r[2] for r in sink.rejected] == [msg for _i, msg in report.rejected]

        # One task per session, each in a Python worker (not the driver).
        for b in (0, 1):
            rows = sink.sessions[b]
            assert [r["session"] for r in rows] == list(range(k))
            assert all(r["pid"] != os.getpid() for r in rows)
        assert sum(r.operations for r in sink.reports.values()) == len(ops)
        if method == "reorder":
            assert sum(r.deadlocks for r in sink.reports.values()) == 0

    # Effects committed but the batch not marked (the driver died before it): the
    # re-run skips every transaction through the ledger.
    more = demand_stream(300, 40, seed=12)
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "x.jsonl").write_text("".join(json.dumps(op.to_json(schema)) + "\n" for op in more))
    marks = target.mark_batch
    target.mark_batch = lambda batch_id: (_ for _ in ()).throw(TxStreamError("driver died"))
    with pytest.raises(TxStreamError, match="driver died"):
        sink(spark.read.text(str(extra)), 5)
    target.mark_batch = marks
    sink(spark.read.text(str(extra)), 5)
    assert sink.reports[5].transactions == 0 and sink.reports[5].skipped > 0
    assert target.batch_done(5)
    assert check_loaded(target, init, ops + more) == []


# The SIGKILL test's run: 6 files (micro-batches) of 500 operations each.  Each
# batch pays Spark's and the sessions' fixed costs, so fewer batches is what keeps
# the test short; 6 leave a kill after the first batch well inside the run.
KILL_OPERATIONS, KILL_FILES = 3000, 6


def _loading_cli(out: Path, conninfo: str, on: str = "executors") -> list[str]:
    return [
        sys.executable, "-c", "from txstream.cli import main; raise SystemExit(main())",
        "loading", "run", "--spark", "--on", on, "--target", "postgres",
        "--conninfo", conninfo, "--out", str(out), "--method", "reorder",
        "--sessions", "4", "--grouping", "8", "--operations", str(KILL_OPERATIONS),
        "--parts", "300", "--files", str(KILL_FILES), "--seed", "4",
    ]  # fmt: skip


def _count(target: PostgresTarget, sql: str) -> int:
    import psycopg

    try:
        with target._connect(autocommit=True) as conn:
            row = conn.execute(sql).fetchone()
    except (TxStreamError, psycopg.Error):  # the run has not made its tables yet
        return 0
    return int(row[0]) if row else 0


@pytest.mark.spark
def test_driver_sigkilled_mid_batch_then_restarted_loads_every_operation_once(
    server: PostgresServer, tmp_path: Path
) -> None:
    schema = demand_schema()
    target = PostgresTarget(schema, server)
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    victim = subprocess.Popen(
        _loading_cli(out, server.conninfo),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "victim.err").open("w"),
        start_new_session=True,
    )
    in_flight = (
        "SELECT count(*) FROM txstream_ledger l WHERE NOT EXISTS "
        "(SELECT 1 FROM txstream_batches b WHERE b.batch = l.batch)"
    )
    try:
        # Kill once a batch after the first is under way: some of its load
        # transactions committed, the batch not yet marked complete.
        deadline = time.time() + 300  # (a bound on a hang, not a speed requirement)
        while victim.poll() is None and time.time() < deadline:
            if _count(target, "SELECT count(*) FROM txstream_batches") >= 1 and _count(
                target, in_flight
            ):
                break
            time.sleep(0.01)
        assert victim.poll() is None, (tmp_path / "victim.err").read_text()[-3000:]
    finally:
        os.killpg(victim.pid, signal.SIGKILL)  # the driver and its JVM die at once
        victim.wait()
    marked = _count(target, "SELECT count(*) FROM txstream_batches")
    assert 1 <= marked < KILL_FILES  # killed mid-run
    done = subprocess.run(
        _loading_cli(out, server.conninfo), env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["resumed"] is True and summary["exact"] is True
    assert _count(target, "SELECT count(*) FROM txstream_batches") == KILL_FILES

    # The contents equal the serial oracle and the driver's loader on the same input.
    init = initial_rows(300, seed=4)
    ops = demand_stream(KILL_OPERATIONS, 300, p=0.5, seed=4)
    state = target.state()
    expected = expected_state(schema, apply_serial(schema, ops, base_from_rows(schema, init)))
    assert differences(schema, state, expected) == []
    driver = EmbeddedTarget(schema)
    driver.setup()
    driver.bulk_load(init)
    with Loader(driver, "reorder", sessions=4, grouping=8, seed=4) as loader:
        loader.load(ops)
    assert differences(schema, state, driver.state()) == []
