"""Feeding the continuous loader from Spark Structured Streaming.

A streaming query reads modification operations as JSON lines (one object per
line: ``{"relation": ..., "op": ..., "values": {...}}``) from files dropped
into a directory and hands every micro-batch to a
:class:`~txstream.loading.Loader` through the runtime's ``foreachBatch``
driver (:mod:`txstream.spark.batches`)::

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
from txstream.spark.batches import ExactlyOnce, MicroBatch, StreamHandle, foreach_batch
from txstream.spark.sources import text_files


class LoadingSink:
    """A ``foreachBatch`` function that loads each micro-batch exactly once."""

    def __init__(self, loader: Loader) -> None:
        self.loader = loader
        self.reports: dict[int, LoadReport] = {}
        # The target's record of completed batches survives a crash; an
        # in-memory set of batch ids would not.
        self.batches = ExactlyOnce(self._load, done=loader.target.batch_done)

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        """Load the text rows of ``batch_df`` (column ``value``) as batch ``batch_id``."""
        self.batches(batch_df, batch_id)

    def _load(self, batch: MicroBatch) -> None:
        values = batch.columns(["value"])["value"]
        lines = [v for v in values if v and v.strip()]
        self.reports[batch.id] = self.loader.load(lines, batch_id=batch.id)
        self.loader.target.mark_batch(batch.id)

    @property
    def skipped(self) -> list[int]:
        """The batch ids skipped because the target had them complete."""
        return self.batches.skipped

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
) -> StreamHandle:
    """Start the query: JSON-lines files in ``directory`` -> ``sink``; returns it.

    ``available_now`` processes what is there and stops (tests, catch-up runs);
    otherwise it triggers every ``processing_time`` (default: as fast as it can).
    """
    stream = text_files(spark, directory, max_files_per_trigger=max_files_per_trigger)
    return foreach_batch(
        stream,
        sink.batches,
        checkpoint,
        available_now=available_now,
        processing_time=processing_time,
    )
