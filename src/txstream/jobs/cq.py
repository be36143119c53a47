"""Continuous queries over a txstream table on Spark Structured Streaming.

Two ways to run the experiment's query (join a stream of events with a
table, select, average over count-based windows) on micro-batches:

* :func:`plain_spark` - what Spark does by itself: each micro-batch is joined
  (in Spark) with the table as it is when that batch runs (a stream-static
  join re-reads its static side every batch), and the window aggregates the
  joined rows across batches.  A window that spans micro-batches can mix
  table versions when the table changes between them.
* :func:`with_txstream` - every micro-batch goes to a :class:`CQEngine` through
  the runtime's ``foreachBatch`` driver; a window's events wait in its redo
  queue until the window is complete, and the window is evaluated by one
  CQ-derived transaction under the engine's strategy, so a result never mixes
  versions.

``between_batches(batch_id)`` runs after each batch (tests use it to update the
table deterministically between micro-batches; a real deployment has updaters
running concurrently).  Replayed batch ids are skipped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from txstream.cq.base import Result, WindowAgg
from txstream.cq.engine import VERSION_KEY, CQEngine
from txstream.spark.batches import MicroBatch, run_available
from txstream.txn import TransactionManager

EVENT_SCHEMA = "id LONG, part LONG, qty LONG"
"""The schema of the event files (CSV ``id,part,qty``)."""


def plain_spark(
    spark: Any,
    stream: Any,
    tm: TransactionManager,
    table: str,
    window: WindowAgg,
    checkpoint: str,
    between_batches: Callable[[int], None] | None = None,
    threshold: int = 50,
) -> list[Result]:
    """Stream-static join per micro-batch, window over the joined rows (Spark's behaviour).

    ``spark`` is the session of ``stream`` (kept for callers; the join uses the
    batch's own session).
    """
    tbl = tm.table(table)
    synopsis: deque[tuple[float, int]] = deque(maxlen=window.r)
    results: list[Result] = []
    since = 0

    def batch(b: MicroBatch) -> None:
        nonlocal since
        version = int(tbl.read(VERSION_KEY, 0))
        rows = [
            (key, row["price"], version) for key, row in tbl.rows().items() if key != VERSION_KEY
        ]
        joined = (
            b.join_rows(rows, "part LONG, price LONG, version LONG", on="part")
            .where(f"price <= {int(threshold)}")
            .order_by("id")
        )
        for row in joined.dicts(["price", "version"]):
            synopsis.append((float(row["price"]), int(row["version"])))
            since += 1
            if len(synopsis) == window.r and (not results or since >= window.s):
                since = 0
                values = [p for p, _ in synopsis]
                versions = frozenset(v for _, v in synopsis)
                results.append(Result(window.compute(values), len(results), 0, versions))
        if between_batches is not None:
            between_batches(b.id)

    run_available(stream, batch, checkpoint)
    return results


def with_txstream(
    stream: Any,
    engine: CQEngine,
    checkpoint: str,
    between_batches: Callable[[int], None] | None = None,
) -> list[Result]:
    """Feed every micro-batch to ``engine``; windows are evaluated transactionally."""
    results: list[Result] = []
    columns = list(engine.source.columns)

    def batch(b: MicroBatch) -> None:
        results.extend(engine.feed(b.order_by("id").dicts(columns)))
        if between_batches is not None:
            between_batches(b.id)

    run_available(stream, batch, checkpoint)
    return results
