"""Exactly-once output sinks: Delta Lake through delta-rs (no Spark session needed)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

import txstream as tx
from txstream.errors import TxStreamError
from txstream.spark.runtime.sinks import deliver
from txstream.spark.runtime.state import RuntimeStore


def _job(sink: Any) -> tx.Job:
    def greet(t: Any, e: dict[str, Any]) -> None:
        t.emit("greetings", {"name": e["name"], "n": e["n"]})

    return (
        tx.Job()
        .input("people", None, keys="name")
        .output("greetings")
        .on("people", greet)
        .sink("greetings", sink)
    )


BATCHES = [
    [("people", {"name": "ada", "n": 1}), ("people", {"name": "bob", "n": 2})],
    [("people", {"name": "cy", "n": 3})],
]


def _delta_rows(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return sorted(rows, key=lambda r: r["n"])


def test_delta_round_trip_equals_read_output(tmp_path: Path) -> None:
    table = tmp_path / "greetings"
    _job(tx.DeltaSink(table)).run_local(BATCHES, tmp_path / "ckpt")
    want = tx.read_output(tmp_path / "ckpt", "greetings")
    assert len(want) == 3
    assert _delta_rows(table) == sorted(want, key=lambda r: r["n"])


def test_delta_replayed_batch_is_skipped(tmp_path: Path) -> None:
    table = tmp_path / "greetings"
    sink = tx.DeltaSink(table)
    _job(sink).run_local(BATCHES, tmp_path / "ckpt")
    store = RuntimeStore(tmp_path / "ckpt")
    # As after a crash between the Delta commit and the .done record:
    shutil.rmtree(tmp_path / "ckpt" / "sinks" / "greetings")
    assert deliver(store, {"greetings": [sink]}) > 0
    # and a direct second call for the same batch ids:
    for batch in store.committed():
        sink(batch, [{"name": "dup", "n": 99}])
    assert _delta_rows(table) == sorted(
        tx.read_output(tmp_path / "ckpt", "greetings"), key=lambda r: r["n"]
    )


def test_delta_declared_schema_and_mismatch(tmp_path: Path) -> None:
    schema = pa.schema([("name", pa.string()), ("n", pa.int32())])
    table = tmp_path / "t"
    sink = tx.DeltaSink(table, schema=schema)
    sink(0, [{"name": "ada", "n": 1}])
    assert DeltaTable(str(table)).schema().to_arrow() is not None
    with pytest.raises(TxStreamError, match="does not fit") as err:
        sink(1, [{"name": "bob", "n": "not a number"}])
    assert "\n" not in str(err.value)
    # never a half-written batch: batch 1 left nothing, and can still come later
    assert DeltaTable(str(table)).transaction_version(sink.app_id) == 0
    inferred = tx.DeltaSink(tmp_path / "u")
    inferred(0, [{"name": "ada", "n": 1}])
    with pytest.raises(TxStreamError, match="does not fit"):
        inferred(1, [{"other": "x"}])
    assert len(DeltaTable(str(tmp_path / "u")).to_pyarrow_table()) == 1


def _declared_job(sink: Any, schema: str = "name string, n double") -> tx.Job:
    def greet(t: Any, e: dict[str, Any]) -> None:
        t.emit("greetings", {"name": e["name"], "n": e["n"]})

    return (
        tx.Job()
        .input("people", None, keys="name")
        .output("greetings", schema=schema)
        .on("people", greet)
        .sink("greetings", sink)
    )


def test_delta_takes_the_outputs_declared_schema(tmp_path: Path) -> None:
    # The events carry ints; the output declares n double: the table has the declared
    # types (inferred from the first batch it would be int64), even when the first
    # batch emits nothing.
    table = tmp_path / "t"
    sink = tx.DeltaSink(table)
    _declared_job(sink).run_local([[], *BATCHES], tmp_path / "ckpt")
    schema = pa.schema(DeltaTable(str(table)).schema().to_arrow())
    assert [(f.name, str(f.type)) for f in schema] in (
        [("name", "string"), ("n", "double")],
        [("name", "large_string"), ("n", "double")],
        [("name", "string_view"), ("n", "double")],
    )
    assert _delta_rows(table) == [
        {"name": "ada", "n": 1.0},
        {"name": "bob", "n": 2.0},
        {"name": "cy", "n": 3.0},
    ]


def test_delta_refuses_a_schema_or_table_that_does_not_fit_the_output_before_it_runs(
    tmp_path: Path,
) -> None:
    given = tx.DeltaSink(tmp_path / "a", schema=pa.schema([("name", pa.string())]))
    with pytest.raises(
        tx.RuntimeJobError,
        match=r"the sink's schema \(name string\) does not fit output 'greetings'",
    ) as err:
        _declared_job(given)
    assert "\n" not in str(err.value)
    # A table written before with other columns: refused when the sink is declared.
    old = tmp_path / "b"
    tx.DeltaSink(old)(0, [{"name": "ada", "age": 3}])
    with pytest.raises(tx.RuntimeJobError, match=r"the table \(name \w+, age int64\) does not fit"):
        _declared_job(tx.DeltaSink(old))
    # The same table fits an output that declares its columns.
    _declared_job(tx.DeltaSink(old), schema="name string, age long")


def test_delta_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(TxStreamError, match="str or a Path, not int"):
        tx.DeltaSink(42)  # type: ignore[arg-type]
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(TxStreamError, match="is a file"):
        tx.DeltaSink(afile)


def test_read_output_arrow_and_pandas(tmp_path: Path) -> None:
    table = tmp_path / "greetings"
    _job(tx.DeltaSink(table)).run_local(BATCHES, tmp_path / "ckpt")
    rows = tx.read_output(tmp_path / "ckpt", "greetings")
    arrow = tx.read_output_arrow(tmp_path / "ckpt", "greetings")
    assert isinstance(arrow, pa.Table) and arrow.to_pylist() == rows
    frame = tx.read_output_pandas(tmp_path / "ckpt", "greetings")
    assert frame.to_dict("records") == rows
    with pytest.raises(TxStreamError, match="no output 'greeting'"):
        tx.read_output_arrow(tmp_path / "ckpt", "greeting")


def _notes(t: Any, e: dict[str, Any]) -> None:
    row = {"id": e["id"]}
    if e["id"] % 2:
        row["note"] = "odd"  # (the first row of a batch may lack it)
    t.upsert("seen", row)
    t.emit("out", row)


def test_a_column_the_first_row_lacks_is_kept_or_refused_never_dropped(tmp_path: Path) -> None:
    # pa.Table.from_pylist takes its columns from the first row: read_output_arrow,
    # read_table(as_="arrow"/"pandas") and DeltaSink dropped "note" without a word
    # (and DeltaSink's select() dropped a later batch's new column).
    job = (
        tx.Job()
        .table("seen", key="id")
        .input("ev", None, keys="id")
        .output("out")
        .on("ev", _notes)
        .sink("out", tx.DeltaSink(tmp_path / "d"))
    )
    job.run_local([[("ev", {"id": i}) for i in range(4)], [("ev", {"id": 6})]], tmp_path / "c")
    want = [{"id": i, "note": "odd" if i % 2 else None} for i in (0, 1, 2, 3, 6)]
    assert tx.read_output_arrow(tmp_path / "c", "out").to_pylist() == want
    assert tx.read_table(tmp_path / "c", "seen", as_="arrow").to_pylist() == want
    assert sorted(_delta_rows_by_id(tmp_path / "d"), key=lambda r: r["id"]) == want
    # A table without the column, then a batch with it: refused before anything is written.
    evens = tx.DeltaSink(tmp_path / "evens")
    evens(0, [{"id": 0}])
    with pytest.raises(
        TxStreamError, match=r"does not fit the table \(id\): it has column\(s\) note;"
    ):
        evens(1, [{"id": 2}, {"id": 3, "note": "odd"}])
    fixed = tx.DeltaSink(tmp_path / "fixed", schema=pa.schema([("id", pa.int64())]))
    with pytest.raises(TxStreamError, match=r"the sink's schema \(id\): it has column\(s\) note;"):
        fixed(0, [{"id": 2}, {"id": 3, "note": "odd"}])
    assert DeltaTable(str(tmp_path / "evens")).version() == 0
    assert not DeltaTable.is_deltatable(str(tmp_path / "fixed"))


def _delta_rows_by_id(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return rows


def _folder_rows(path: Path) -> list[str]:
    return [line for f in sorted(path.glob("batch-*.jsonl")) for line in f.read_text().split()]


@pytest.mark.parametrize("kind", ["delta", "folder"])
def test_a_target_written_by_another_store_is_refused_in_one_line(
    tmp_path: Path, kind: str
) -> None:
    # A second job (or the same job on a new checkpoint) numbers its batches
    # from 0 again: without a claim its batches were skipped as "delivered
    # before a crash" (Delta) or overwrote the first job's files (folder).
    target = tmp_path / "target"

    def sink() -> Any:
        return tx.DeltaSink(target) if kind == "delta" else tx.FolderSink(target)

    def rows() -> list[Any]:
        return _delta_rows(target) if kind == "delta" else _folder_rows(target)

    _job(sink()).run_local(BATCHES[:1], tmp_path / "first", end_inputs=False)
    _job(sink()).run_local(BATCHES[1:], tmp_path / "first")  # its own restart: goes on
    assert len(rows()) == 3
    before = rows()
    other = [[("people", {"name": "dee", "n": 4})], [("people", {"name": "eve", "n": 5})]]
    with pytest.raises(TxStreamError) as err:
        _job(sink()).run_local(other, tmp_path / "second")
    message = str(err.value)
    assert "\n" not in message
    assert f"holds the batches of output 'greetings' of {tmp_path / 'first'}" in message
    assert rows() == before
    if kind == "delta":  # a name of its own appends beside the first job's rows
        _job(tx.DeltaSink(target, name="second")).run_local(other, tmp_path / "third")
        assert [r["n"] for r in rows()] == [1, 2, 3, 4, 5]


def test_two_outputs_on_one_sink_target_are_refused_by_sink(tmp_path: Path) -> None:
    # Their batch ids collide: the second output's batches were skipped (or overwrote).
    for make in (
        lambda: tx.FolderSink(tmp_path / "f"),
        lambda: tx.DeltaSink(tmp_path / "d"),
        lambda: tx.PostgresSink("dbname=x", "events", ["name"]),
    ):
        job = _job(make()).output("echo")
        with pytest.raises(TxStreamError, match=r"output 'greetings' already writes to"):
            job.sink("echo", make())
    job = _job(tx.DeltaSink(tmp_path / "d")).output("echo")
    job.sink("echo", tx.DeltaSink(tmp_path / "d", name="echo"))  # a name of its own: fine
    job.sink("greetings", tx.FolderSink(tmp_path / "f"))  # one output, two sinks: fine


def test_a_postgres_sink_column_the_output_does_not_declare_is_refused() -> None:
    # It was written NULL in every row (a misspelt column name), without a word.
    job = tx.Job().input("ev", None, keys="id").output("out", schema="id long, temp double")
    with pytest.raises(TxStreamError, match=r"column\(s\) celsius are not in output 'out'"):
        job.sink("out", tx.PostgresSink("dbname=x", "t", ["id", "celsius"]))
    job.sink("out", tx.PostgresSink("dbname=x", "t", ["temp"]))  # a part of them: fine


def test_postgres_sink_columns_as_text_or_stray_types_are_refused() -> None:
    # columns="id" made columns i and d (NULL in every row); a type for a column
    # that is not there left the real one text: both without a word.
    with pytest.raises(TxStreamError, match="columns must be a non-empty list"):
        tx.PostgresSink("dbname=x", "t", "id")  # type: ignore[arg-type]
    with pytest.raises(TxStreamError, match="types names 'temp', not among the columns"):
        tx.PostgresSink("dbname=x", "t", ["id", "celsius"], types={"temp": "double precision"})


CHILD = r"""
import sys
import txstream as tx
from txstream.spark.runtime.state import RuntimeStore
ckpt, table, conninfo = sys.argv[1], sys.argv[2], sys.argv[3]
import os
from pathlib import Path
crash_at = int(os.environ.get("CRASH_AFTER_SINKS", "-1"))
def add(t, e):
    t.emit("out", {"id": e["id"], "v": e["id"] * 2})
def crash(batch, rows):  # the sinks before it wrote this batch; its .done record is not written
    if batch == crash_at:
        os._exit(137)
job = (tx.Job().input("ev", None, keys="id").output("out").on("ev", add)
       .sink("out", tx.DeltaSink(table))
       .sink("out", tx.PostgresSink(conninfo, "kills", ["id", "v"],
                                    types={"id": "bigint", "v": "bigint"}))
       .sink("out", crash))
batches = [[("ev", {"id": b * 5 + i}) for i in range(5)] for b in range(40)]
done = len(list(RuntimeStore(ckpt).committed())) if Path(ckpt, "job.json").exists() else 0
print("ready", flush=True)
job.run_local(batches[done:], ckpt)
print("finished", flush=True)
"""


def test_sigkill_delta_and_postgres_exactly_once(tmp_path: Path) -> None:
    import os
    import random
    import signal
    import subprocess
    import sys
    import time

    import psycopg

    from txstream.loading.pgserver import PostgresServer, find_bindir

    if find_bindir() is None:
        pytest.fail("PostgreSQL server binaries missing: run scripts/pg-install.sh")
    server = PostgresServer().start()
    try:
        script = tmp_path / "child.py"
        script.write_text(CHILD)
        ckpt, table = tmp_path / "ckpt", tmp_path / "delta"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        rng = random.Random(30)
        argv = [sys.executable, str(script), str(ckpt), str(table), server.conninfo]
        kills = 0
        for round_no in range(12):
            child_env = dict(env)
            if round_no % 3 == 0:  # a crash between the sinks' write and the .done record
                child_env["CRASH_AFTER_SINKS"] = str(round_no * 3 + 1)
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, env=child_env)
            assert proc.stdout is not None
            assert proc.stdout.readline().startswith(b"ready")
            if round_no % 3:
                time.sleep(rng.uniform(0.0, 0.4))
                proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += proc.returncode != 0
        subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
        assert kills >= 10
        want = sorted((r["id"], r["v"]) for r in tx.read_output(ckpt, "out"))
        assert want == [(i, 2 * i) for i in range(200)]
        got = DeltaTable(str(table)).to_pyarrow_table().to_pylist()
        assert sorted((r["id"], r["v"]) for r in got) == want
        with psycopg.connect(server.conninfo) as conn:
            rows = conn.execute("SELECT id, v FROM kills ORDER BY id").fetchall()
        assert [tuple(r) for r in rows] == want
        # Another store's batches under the same sink name: refused, nothing written
        # (they were skipped as delivered before; the folder and Delta cases:
        # test_a_target_written_by_another_store_is_refused_in_one_line).
        new, delta = str(tmp_path / "new"), str(tmp_path / "delta-new")  # (Delta: refused too)
        again = [sys.executable, str(script), new, delta, server.conninfo]
        failed = subprocess.run(again, env=env, capture_output=True, text=True)
        assert failed.returncode != 0
        assert "sink name 'kills' holds the batches of output 'out' of" in failed.stderr
        with psycopg.connect(server.conninfo) as conn:
            assert conn.execute("SELECT count(*) FROM kills").fetchone() == (200,)
    finally:
        server.stop()


def test_refusing_postgres_server_is_one_line(tmp_path: Path) -> None:
    sink = tx.PostgresSink("host=127.0.0.1 port=1 dbname=x connect_timeout=5", "t", ["name"])
    with pytest.raises(TxStreamError, match="Connection refused") as err:
        _job(sink).run_local(BATCHES, tmp_path / "ckpt")
    assert "\n" not in str(err.value) and "'greetings' failed on batch 0" in str(err.value)


def test_the_built_in_sinks_travel_to_a_connect_server(tmp_path: Path) -> None:
    # Over Spark Connect the batches run in the server's Python process, from a
    # pickled copy of the query and its job: the sinks go with it.
    import pickle

    sinks = [
        tx.DeltaSink(tmp_path / "d", schema=pa.schema([("k", pa.int64())])),
        tx.FolderSink(tmp_path / "f"),
        tx.PostgresSink("host=localhost dbname=x", "t", ["k"], types={"k": "bigint"}),
    ]
    for sink in sinks:
        copy = pickle.loads(pickle.dumps(sink))
        assert type(copy) is type(sink)
        assert {k: str(v) for k, v in vars(copy).items()} == {
            k: str(v) for k, v in vars(sink).items()
        }
    rows = [{"k": 1}, {"k": 2}]
    pickle.loads(pickle.dumps(sinks[1]))(3, rows)  # the copy writes where the original would
    assert (tmp_path / "f" / f"batch-{3:012d}.jsonl").read_text().splitlines() == [
        '{"k":1}',
        '{"k":2}',
    ]


# -- delivery off the batch's thread (a running query's built-in sinks) ---------------
class _Recorder:
    """A sink that may run in the background: records (batch, thread, rows) of each call."""

    background = True

    def __init__(self, fail_at: int | None = None, gate: Any = None) -> None:
        self.calls: list[tuple[int, str, int]] = []
        self.fail_at, self.gate = fail_at, gate

    def __call__(self, batch: int, rows: list[dict[str, Any]]) -> None:
        import threading

        if self.gate is not None:
            self.gate.wait()
        if batch == self.fail_at:
            raise ConnectionError("the table's server went away\nsecond line")
        self.calls.append((batch, threading.current_thread().name, len(rows)))


def _committed_store(tmp_path: Path, batches: int) -> RuntimeStore:
    more = [
        [("people", {"name": f"p{b}-{i}", "n": i}) for i in range(b + 1)] for b in range(batches)
    ]
    _job(lambda batch, rows: None).run_local(more, tmp_path / "ckpt")
    shutil.rmtree(tmp_path / "ckpt" / "sinks")  # (committed, none delivered yet)
    return RuntimeStore(tmp_path / "ckpt")


def test_only_sinks_that_say_so_run_in_the_background() -> None:
    from txstream.spark.runtime.sinks import in_background

    assert in_background({"o": [tx.FolderSink("f"), tx.DeltaSink("d"), _Recorder()]})
    assert not in_background({"o": [tx.FolderSink("f")], "p": [lambda b, rows: None]})
    assert not in_background({})


def test_background_delivery_delivers_every_batch_in_order_off_the_callers_thread(
    tmp_path: Path,
) -> None:
    import threading

    from txstream.spark.runtime.sinks import BackgroundDelivery

    store = _committed_store(tmp_path, 5)
    sink = _Recorder()
    delivery = BackgroundDelivery(store, {"greetings": [sink]}, "greet")
    for batch in store.committed():
        delivery.submit(batch)
    delivery.flush()
    assert [(b, n) for b, _, n in sink.calls] == [(b, b + 1) for b in range(5)]
    assert {name for _, name, _ in sink.calls} == {"txstream sinks greet"}
    assert threading.current_thread().name != "txstream sinks greet"
    assert deliver(store, {"greetings": [sink]}) == 0  # every .done record written
    delivery.close()
    delivery.close()


def test_a_slow_sink_holds_the_query_back_after_depth_batches(tmp_path: Path) -> None:
    import threading

    from txstream.spark.runtime.sinks import BackgroundDelivery

    store = _committed_store(tmp_path, 5)
    gate = threading.Event()
    delivery = BackgroundDelivery(store, {"greetings": [_Recorder(gate=gate)]}, "slow")
    delivery.submit(0)  # taken by the thread, which waits at the gate
    for batch in range(1, 1 + BackgroundDelivery.DEPTH):
        delivery.submit(batch)  # queued
    blocked = threading.Thread(target=delivery.submit, args=(1 + BackgroundDelivery.DEPTH,))
    blocked.start()
    blocked.join(0.3)
    still_waiting = blocked.is_alive()
    gate.set()
    blocked.join()
    delivery.flush()
    delivery.close()
    assert still_waiting  # (were the queue unbounded, it would have returned at once)


def test_a_failing_background_sink_stops_later_deliveries_and_speaks_once(
    tmp_path: Path,
) -> None:
    import threading

    from txstream.spark.runtime.sinks import BackgroundDelivery

    store = _committed_store(tmp_path, 4)
    gate = threading.Event()
    sink = _Recorder(fail_at=1, gate=gate)
    delivery = BackgroundDelivery(store, {"greetings": [sink]}, "fails")
    for batch in (0, 1, 2):  # 0 at the gate, 1 and 2 queued behind it
        delivery.submit(batch)
    gate.set()
    with pytest.raises(TxStreamError) as err:
        delivery.flush()
    message = str(err.value)
    assert "\n" not in message and "'greetings' failed on batch 1" in message
    assert "ConnectionError: the table's server went away" in message
    with pytest.raises(TxStreamError, match="failed on batch 1"):
        delivery.submit(3)  # the next micro-batch fails with it
    delivery.flush()  # (reported once)
    delivery.close()
    assert [b for b, _, _ in sink.calls] == [0]
    # A restart delivers what was not: batch 1 on, in order.
    sink.fail_at = None
    assert deliver(store, {"greetings": [sink]}) == 3
    assert [b for b, _, _ in sink.calls] == [0, 1, 2, 3]
