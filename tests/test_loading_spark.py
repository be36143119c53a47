"""Spark feeds the loader: JSON-lines files -> foreachBatch -> Loader, exactly once per batch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from txstream.jobs.loading import LoadingSink, load_directory
from txstream.loading import EmbeddedTarget, Loader
from txstream.loading.oracle import check_loaded
from txstream.loading.workloads import demand_schema, demand_stream, initial_rows

pytestmark = pytest.mark.spark


def test_stream_of_files_loads_exactly_once(spark: Any, tmp_path: Path) -> None:
    schema = demand_schema(aggregate_view=True)
    init = initial_rows(30, seed=1)
    ops = demand_stream(300, 30, seed=2)
    inbox = tmp_path / "in"
    inbox.mkdir()
    for i in range(3):
        lines = [json.dumps(op.to_json(schema)) for op in ops[i * 100 : (i + 1) * 100]]
        if i == 1:
            lines.insert(5, '{"relation": "orders", "op": "insert", "values": {}}')
        (inbox / f"part-{i}.jsonl").write_text("\n".join(lines) + "\n")
    target = EmbeddedTarget(schema)
    target.setup()
    target.bulk_load(init)
    with Loader(target, "reorder", sessions=3, grouping=8) as loader:
        sink = LoadingSink(loader)
        query = load_directory(
            spark, inbox, sink, checkpoint=tmp_path / "ckpt", max_files_per_trigger=1
        )
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        assert sorted(sink.reports) == [0, 1, 2]
        assert [r[2] for r in sink.rejected] == [
            "unknown relation 'orders'; relations: demand, inventory"
        ]
        assert check_loaded(target, init, ops) == []

        # a batch id that already committed is skipped when Spark runs it again
        again = spark.read.text(str(inbox / "part-0.jsonl"))
        sink(again, 0)
        assert sink.skipped == [0]

        # a crash after the transactions committed but before the batch was marked:
        # the re-run skips every transaction through the ledger
        extra = demand_stream(50, 30, seed=3)
        path = tmp_path / "extra.jsonl"
        path.write_text("\n".join(json.dumps(op.to_json(schema)) for op in extra) + "\n")
        df = spark.read.text(str(path))
        lines = [r.value for r in df.collect()]
        loader.load(lines, batch_id=10)  # effects committed, batch not marked
        sink(df, 10)
        assert sink.reports[10].transactions == 0
        assert sink.reports[10].skipped > 0
        assert target.batch_done(10)
    assert check_loaded(target, init, ops + extra) == []
