"""Feeding the continuous loader from Spark Structured Streaming.

A streaming query reads modification operations as JSON lines (one object per
line: ``{"relation": ..., "op": ..., "values": {...}}``) from files dropped
into a directory and hands every micro-batch to a
:class:`~txstream.loading.Loader` through ``foreachBatch``::

    sink = LoadingSink(loader)
    query = load_directory(spark, "in/", sink, checkpoint="ckpt/")
    query.processAllAvailable(); query.stop()

Exactly once per batch id: foreachBatch is at-least-once (after a crash the
same batch id runs again with the same rows).  The sink skips a batch id the
target has marked complete; otherwise it loads the batch with
``batch_id``, so each load transaction records ``(batch id, sequence)`` in
the target in the same database transaction as its effects, and a re-run
skips the transactions that had committed before the crash; finally it marks
the batch complete.  Grouping is deterministic for a given batch (same rows,
same order, same seed), so the re-run forms the same transactions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from txstream.loading import Loader, LoadReport


class LoadingSink:
    """A ``foreachBatch`` function that loads each micro-batch exactly once."""

    def __init__(self, loader: Loader) -> None:
        self.loader = loader
        self.reports: dict[int, LoadReport] = {}
        self.skipped: list[int] = []

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        """Load the text rows of ``batch_df`` (column ``value``) as batch ``batch_id``."""
        target = self.loader.target
        if target.batch_done(batch_id):
            self.skipped.append(batch_id)
            return
        table = batch_df.select("value").toArrow()
        lines = [v for v in table.column("value").to_pylist() if v and v.strip()]
        self.reports[batch_id] = self.loader.load(lines, batch_id=batch_id)
        target.mark_batch(batch_id)

    @property
    def rejected(self) -> list[tuple[int, int, str]]:
        """(batch id, line position, reason) of every rejected operation."""
        return [(b, i, msg) for b, r in sorted(self.reports.items()) for i, msg in r.rejected]


def load_directory(
    spark: Any,
    directory: str | Path,
    sink: LoadingSink,
    *,
    checkpoint: str | Path,
    available_now: bool = True,
    processing_time: str | None = None,
    max_files_per_trigger: int | None = None,
) -> Any:
    """Start the query: JSON-lines files in ``directory`` -> ``sink``; returns it.

    ``available_now`` processes what is there and stops (tests, catch-up runs);
    otherwise it triggers every ``processing_time`` (default: as fast as it can).
    """
    reader = spark.readStream.format("text")
    if max_files_per_trigger is not None:
        reader = reader.option("maxFilesPerTrigger", max_files_per_trigger)
    stream = reader.load(str(directory))
    writer = stream.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
    if available_now:
        writer = writer.trigger(availableNow=True)
    elif processing_time is not None:
        writer = writer.trigger(processingTime=processing_time)
    return writer.start()
