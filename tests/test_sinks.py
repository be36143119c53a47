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
