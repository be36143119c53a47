"""``TxQuery.output_stream``: committed outputs as a stream, each row once downstream."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import txstream as tx
from txstream.spark.runtime.sinks import deliver
from txstream.spark.runtime.state import RuntimeStore

pytestmark = pytest.mark.spark


def _job(spark: Any, inputs: Path, folder: Path) -> tx.Job:
    source = (
        spark.readStream.schema("k long, v long").option("maxFilesPerTrigger", 1).json(str(inputs))
    )

    def add(t: Any, e: dict[str, Any]) -> None:
        t.emit("seen", {"k": e["k"], "v": e["v"] * 10})

    return (
        tx.Job("streamed")
        .input("ev", source, keys="k")
        .output("seen", schema="k long, v long")
        .on("ev", add)
        .sink("seen", tx.FolderSink(folder))
    )


def _downstream(stream: Any, out: Path, ckpt: Path) -> None:
    q = (
        stream.writeStream.format("parquet")
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start(str(out))
    )
    try:
        q.awaitTermination()
    finally:
        q.stop()


def test_output_stream_feeds_a_spark_file_sink_every_committed_row_once(
    spark: Any, tmp_path: Path
) -> None:
    inputs, folder = tmp_path / "in", tmp_path / "published"
    inputs.mkdir()
    for n in range(3):
        rows = [{"k": n * 10 + i, "v": i} for i in range(5)]
        (inputs / f"{n}.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ckpt = tmp_path / "ckpt"
    query = _job(spark, inputs, folder).trigger(availableNow=True).start(ckpt, spark=spark)
    try:
        query.awaitTermination()
        stream = query.output_stream("seen")
    finally:
        query.stop()
    assert stream.isStreaming
    out = tmp_path / "parquet"
    _downstream(stream, out, tmp_path / "down-ckpt")
    want = sorted((r["k"], r["v"]) for r in tx.read_output(ckpt, "seen"))
    assert len(want) == 15

    def got() -> list[tuple[int, int]]:
        return sorted((r.k, r.v) for r in spark.read.parquet(str(out)).collect())

    assert got() == want
    # A crash between a batch's file and its .done record: the restart delivers the
    # batch again, rewriting the same file; the downstream query takes it once.
    store = RuntimeStore(ckpt / "txstream")
    shutil.rmtree(ckpt / "txstream" / "sinks" / "seen")
    assert deliver(store, {"seen": [tx.FolderSink(folder)]}) == len(store.committed())
    _downstream(
        spark.readStream.schema("k long, v long").json(str(folder)), out, tmp_path / "down-ckpt"
    )
    assert got() == want


def test_output_stream_needs_a_schema_and_a_folder_sink(tmp_path: Path) -> None:
    job = tx.Job().input("ev", None, keys="k").output("seen")
    with pytest.raises(tx.RuntimeJobError, match="declare the output's schema"):
        job._plan_output_stream("seen")
    job = tx.Job().input("ev", None, keys="k").output("seen", schema="k int")
    with pytest.raises(tx.RuntimeJobError, match=r"add \.sink\('seen', tx\.FolderSink\(path\)\)"):
        job._plan_output_stream("seen")
    with pytest.raises(tx.RuntimeJobError, match="no output 'other'"):
        job._plan_output_stream("other")
    afile = tmp_path / "f"
    afile.write_text("x")
    with pytest.raises(tx.RuntimeJobError, match="is a file"):
        tx.FolderSink(afile)


class _WaitsForTheNextBatch:
    """A background sink whose batch 0 waits (up to a minute) for batch 1 to commit.

    Run in the batch's thread, as a user's callable is, it would wait in vain:
    batch 1 cannot start before batch 0's sinks return.
    """

    background = True

    def __init__(self, store: Path) -> None:
        self.store = store
        self.calls: list[tuple[int, int]] = []
        self.saw_next: bool | None = None

    def __call__(self, batch: int, rows: list[dict[str, Any]]) -> None:
        import time

        if batch == 0:
            deadline = time.time() + 60
            while not RuntimeStore(self.store).is_committed(1) and time.time() < deadline:
                time.sleep(0.05)
            self.saw_next = RuntimeStore(self.store).is_committed(1)
        self.calls.append((batch, len(rows)))


def test_the_next_batch_runs_while_the_built_in_sinks_deliver_the_last(
    spark: Any, tmp_path: Path
) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    for n in range(3):
        rows = [{"k": n * 10 + i, "v": i} for i in range(n + 1)]
        (inputs / f"{n}.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ckpt = tmp_path / "ckpt"
    slow = _WaitsForTheNextBatch(ckpt / "txstream")
    job = _job(spark, inputs, tmp_path / "published").sink("seen", slow)
    query = job.trigger(availableNow=True).start(ckpt, spark=spark)
    try:
        query.awaitTermination()  # (returns once the sinks have every batch)
        assert [b for b, _ in slow.calls] == [0, 1, 2]  # (a file each, in batch order)
        assert sorted(n for _, n in slow.calls) == [1, 2, 3]
        assert slow.saw_next is True
    finally:
        query.stop()
    # (and the hidden claim of the folder for this store and output, which Spark's
    # readers skip)
    assert sorted(p.name for p in (tmp_path / "published").iterdir()) == [
        ".txstream-owner",
        *(f"batch-{n:012d}.jsonl" for n in range(3)),
    ]
