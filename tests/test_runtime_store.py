"""The runtime's store without Spark: restarts, replays, damage, one owner, exactly-once sinks.

Moved from ``tests/test_runtime.py`` (split by subject); shared helpers are in
``tests/runtime_jobs.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import txstream as tx
from runtime_jobs import FakeStream, balances, counter_job, split
from txstream.bench.ledger import events, ledger_job, serial_oracle
from txstream.model import check
from txstream.spark.runtime.state import RuntimeStore, StoreError, StoreLockedError


# -- the store: restarts, replays, damage, one owner -----------------------------------
def test_a_batch_replayed_after_a_crash_takes_effect_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = list(events(200, 10, 50, seed=9))
    batches = split(stream, [50, 50, 50])
    ledger_job().run_local(batches[:2], tmp_path, 2)
    # The third batch runs completely but dies before its commit marker.
    from txstream.spark.runtime import tasks

    def die(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(RuntimeStore, "commit", die)
    with pytest.raises(KeyboardInterrupt):
        ledger_job().run_local(batches[2:3], tmp_path, 2)
    monkeypatch.undo()
    assert tasks  # the real loop ran
    runner = tx.LocalRunner(ledger_job().spec, tmp_path, 2)
    assert runner.batch == 2  # the uncommitted batch runs again
    runner.run(batches[2:])
    balance, outcomes = serial_oracle(stream)
    assert [(r["id"], r["ok"]) for r in tx.read_output(tmp_path, "transfers_done")] == outcomes
    assert balances(tmp_path, 2) == balance


def test_a_damaged_state_file_is_reported_not_loaded(tmp_path: Path) -> None:
    ledger_job().run_local([list(events(50, 5, 0, seed=1))] * 1, tmp_path, 1)
    for path in (tmp_path / "state" / "p00000").glob("*.bin"):
        raw = bytearray(path.read_bytes())
        raw[-3] ^= 0x40
        path.write_bytes(bytes(raw))
    with pytest.raises(StoreError, match="checksum mismatch"):
        RuntimeStore(tmp_path).load(0, 0)


def test_a_second_owner_of_a_store_gets_one_line_naming_the_first(tmp_path: Path) -> None:
    lock = RuntimeStore(tmp_path).lock()
    try:
        code = (
            "import sys\n"
            "from txstream.spark.runtime.state import RuntimeStore, StoreLockedError\n"
            f"try:\n    RuntimeStore({str(tmp_path)!r}).lock()\n"
            "except StoreLockedError as e:\n    print(e); sys.exit(3)\n"
        )
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert result.returncode == 3
        assert "in use by pid" in result.stdout and str(__import__("os").getpid()) in result.stdout
    finally:
        lock.release()
    RuntimeStore(tmp_path).lock().release()
    with pytest.raises(StoreLockedError):
        held = RuntimeStore(tmp_path).lock()
        try:
            RuntimeStore(tmp_path).lock()
        finally:
            held.release()


def test_history_arrival_comes_from_the_declared_order_not_commit_order(tmp_path: Path) -> None:
    # Events arrive out of id order within the batch; the order column decides.
    stream = [
        ("deposits", {"acct": 1, "amount": 5, "id": 2}),
        ("deposits", {"acct": 1, "amount": 7, "id": 1}),
    ]
    ledger_job().option("recordHistory", True).run_local([stream], tmp_path, 1)
    text = tx.spark.runtime.history_text(tmp_path)
    arrival = next(line for line in text.splitlines() if line.startswith("arrival"))
    assert arrival.split(": ")[1].split() == ["b0_1", "b0_0"]
    assert json.loads(json.dumps(check(tx.read_history(tmp_path), "csao").holds))


def test_sinks_get_each_committed_batch_once_even_after_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int, int]] = []
    stream = list(events(120, 6, 50, seed=2))
    batches = split(stream, [40, 40])

    def sink(batch: int, rows: list[dict[str, Any]]) -> None:
        calls.append((batch, len(rows)))

    ledger_job().sink("transfers_done", sink).run_local(batches[:2], tmp_path, 2)
    assert [b for b, _ in calls] == [0, 1]
    # The driver dies after batch 2 committed but before its sink delivery was recorded.
    from txstream.spark.runtime import sinks

    real = sinks.write_atomic
    monkeypatch.setattr(sinks, "write_atomic", lambda *a: (_ for _ in ()).throw(OSError("gone")))
    with pytest.raises(OSError):
        tx.LocalRunner(ledger_job().spec, tmp_path, 2).run(batches[2:])
        sinks.deliver(RuntimeStore(tmp_path), {"transfers_done": [sink]})
    monkeypatch.setattr(sinks, "write_atomic", real)
    sinks.deliver(RuntimeStore(tmp_path), {"transfers_done": [sink]})
    # Batch 2 was handed over again (a sink must be idempotent per batch id) and
    # nothing else was.
    assert [b for b, _ in calls] == [0, 1, 2, 2]
    total = sum(n for b, n in calls[:3])
    assert total == len(tx.read_output(tmp_path, "transfers_done"))


def test_a_running_job_delivers_a_new_batch_without_checking_every_batch_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each micro-batch looked at every batch ever committed (its commit marker
    # and sink record): 0.13 s per micro-batch after 20,000 of them, growing.
    # Now the start looks at them all (a crash may have left one undelivered),
    # then each batch delivers itself.
    listed: list[str] = []
    committed = RuntimeStore.committed

    def counted(store: RuntimeStore) -> list[int]:
        listed.append(sys._getframe(1).f_code.co_name)
        return committed(store)

    monkeypatch.setattr(RuntimeStore, "committed", counted)
    calls: list[int] = []
    job = ledger_job().sink("transfers_done", lambda batch, rows: calls.append(batch))
    job.run_local(split(list(events(120, 6, 50, seed=2)), [30, 30, 30]), tmp_path, 2)
    assert calls == [0, 1, 2, 3]
    assert listed.count("deliver") == 1


def test_postgres_sink_is_exactly_once_per_batch(tmp_path: Path) -> None:
    from txstream.loading.pgserver import PostgresServer, find_bindir

    if find_bindir() is None:
        pytest.fail("PostgreSQL server binaries missing: run scripts/pg-install.sh")
    server = PostgresServer().start()
    try:
        import psycopg

        sink = tx.PostgresSink(
            server.conninfo, "transfers", ["id", "ok"], types={"id": "bigint", "ok": "boolean"}
        )
        stream = list(events(150, 6, 50, seed=4))
        ledger_job().sink("transfers_done", sink).run_local(split(stream, [50, 50]), tmp_path, 2)
        sink(1, [{"id": -1, "ok": True}])  # a re-delivered batch is skipped
        with psycopg.connect(server.conninfo) as conn:
            got = conn.execute("SELECT id, ok FROM transfers ORDER BY id").fetchall()
        expected = sorted((r["id"], r["ok"]) for r in tx.read_output(tmp_path, "transfers_done"))
        assert [tuple(r) for r in got] == expected
    finally:
        server.stop()


def test_run_local_refuses_a_spark_querys_store_and_a_query_refuses_a_local_one(
    tmp_path: Path,
) -> None:
    # A Spark query's batches are Spark's micro-batches: a local batch committed in
    # its store would take the number of the query's next batch, which the query
    # would then skip as done (its rows lost). Each runner keeps to its own stores.
    stream = [("deposits", {"acct": 1, "amount": 5, "id": 0})]
    checkpoint = tmp_path / "ck"
    spark_store = RuntimeStore(checkpoint / "txstream")
    spark_store.root.mkdir(parents=True)
    (spark_store.root / "job.json").write_text('{"job": "x", "partitions": 2, "outputs": []}')
    spark_store.commit(0, {"prev": -1}, {})
    for path in (checkpoint, checkpoint / "txstream"):
        with pytest.raises(tx.TxStreamError, match="run_local needs a store"):
            ledger_job().run_local([stream], path, 2)
    assert spark_store.committed() == [0] and not (checkpoint / "commits").exists()
    # While a job holds the store, run_local waits for nothing: a one-line error.
    mine = tmp_path / "local"
    runner = ledger_job().run_local([stream], mine, 2)
    held = RuntimeStore(mine).lock()
    try:
        with pytest.raises(StoreLockedError):
            runner.run_batch(stream)
        with pytest.raises(StoreLockedError):
            ledger_job().run_local([stream], mine, 2)
    finally:
        held.release()
    runner.run_batch([("deposits", {"acct": 1, "amount": 5, "id": 1})])
    with pytest.raises(tx.RuntimeJobError, match="with 2 partitions"):
        ledger_job().run_local([stream], mine, 3)
    # ... and a Spark query does not start on a store of run_local (no JVM needed).
    for path in (mine, tmp_path / "ck2"):
        if path != mine:
            (path / "txstream").mkdir(parents=True)
            (path / "txstream" / "job.json").write_text((mine / "job.json").read_text())
        with pytest.raises(tx.TxStreamError, match="store of run_local"):
            ledger_job().start(path)


def test_a_checkpoint_or_store_that_is_a_file_or_cannot_be_made_is_one_line(
    tmp_path: Path,
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a directory\n")
    job = tx.Job("c").input("e", FakeStream("k long"), keys="k").on("e", lambda t, e: None)
    with pytest.raises(StoreError, match=f"^checkpoint {afile} is a file; give a directory"):
        job.start(afile, spark=object())
    with pytest.raises(StoreError, match=f"^checkpoint {afile}/ck is under {afile}, which is a"):
        job.start(afile / "ck", spark=object())
    with pytest.raises(StoreError, match=f"^store {afile} is a file; give a directory"):
        counter_job().run_local([[("ev", {"k": 1, "ts": 1})]], afile)
    with pytest.raises(StoreError, match=f"^store {afile}/s is under {afile}, which is a file"):
        counter_job().run_local([[("ev", {"k": 1, "ts": 1})]], afile / "s")
    if Path("/proc/self").is_dir():  # a directory no one can create anything in
        with pytest.raises(StoreError, match=r"^checkpoint /proc/ck cannot be created"):
            job.start("/proc/ck", spark=object())
    assert afile.read_text() == "not a directory\n"


def test_every_reader_refuses_a_path_that_holds_no_job(tmp_path: Path) -> None:
    from txstream.spark.runtime import history_text

    empty = tmp_path / "empty"
    empty.mkdir()
    for path in (tmp_path / "nonexistent", empty):
        for read in (
            tx.read_failures,
            tx.read_history,
            history_text,
            lambda p: tx.read_output(p, "seen"),
        ):
            with pytest.raises(tx.TxStreamError, match="not a txstream checkpoint or store"):
                read(path)
    # A checkpoint whose job started but committed nothing yet: nothing, not an error.
    started = tmp_path / "ck" / "txstream"
    started.mkdir(parents=True)
    (started / "job.json").write_text(json.dumps({"job": "j", "partitions": 2, "outputs": ["o"]}))
    assert tx.read_failures(tmp_path / "ck") == [] and tx.read_output(tmp_path / "ck", "o") == []
    with pytest.raises(tx.TxStreamError, match="declared no output 'x'"):
        tx.read_output(tmp_path / "ck", "x")
    with pytest.raises(tx.TxStreamError, match="recorded no history"):
        tx.read_history(tmp_path / "ck")
