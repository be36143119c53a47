"""On Spark: plain stream-static joins mix table versions in windows; txstream does not."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

from txstream.cq import VERSION_KEY, CQEngine
from txstream.cq.workload import COLUMNS, TABLE, build_query, load_table


def test_windows_spanning_micro_batches(spark: Any, tmp_path: Path) -> None:
    from txstream.jobs.cq import EVENT_SCHEMA, plain_spark, with_txstream
    from txstream.spark.sources import csv_files

    rng = random.Random(4)
    rows = {k: {"price": rng.randint(1, 60), "cat": 0} for k in range(10)}
    incoming = tmp_path / "events"
    incoming.mkdir()
    for f in range(6):  # six micro-batches of 12 events each
        lines = "".join(f"{12 * f + i},{rng.randrange(10)},1\n" for i in range(12))
        path = incoming / f"e{f}.csv"
        path.write_text(lines)
        os.utime(path, (1_000_000 + f, 1_000_000 + f))
    query = build_query(8, 4)

    def fresh(strategy: str) -> Any:
        return load_table(strategy, dict(rows))

    def updater(tm: Any) -> Any:
        def update(batch_id: int) -> None:  # another system changes every price
            with tm.begin() as t:
                t.increment(TABLE, VERSION_KEY, 1)
                for k in rows:
                    t.put(TABLE, k, {"price": 1 + (k * 7 + batch_id * 13) % 50, "cat": 0})

        return update

    def stream() -> Any:
        return csv_files(spark, incoming, EVENT_SCHEMA, max_files_per_trigger=1)

    tm = fresh("naive")
    plain = plain_spark(spark, stream(), tm, TABLE, query, str(tmp_path / "cp-plain"), updater(tm))
    assert plain and any(not r.consistent for r in plain)

    for strategy in ("snapshot", "s2pl", "optimistic"):
        tm = fresh(strategy)
        engine = CQEngine(query, tm, strategy, {TABLE: COLUMNS})
        got = with_txstream(stream(), engine, str(tmp_path / f"cp-{strategy}"), updater(tm))
        assert got and all(r.consistent for r in got), strategy
