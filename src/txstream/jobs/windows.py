"""Feed a sliding window from a Spark Structured Streaming source.

Each micro-batch's rows fill the sub-window buffers of a
:class:`txstream.windows.feed.WindowFeed` through the runtime's exactly-once
``foreachBatch`` driver (:func:`txstream.spark.batches.foreach_batch`, rows over
Arrow); the feed also skips a replayed batch id, so an at-least-once replay
after a crash does not slide the window twice.
"""

from __future__ import annotations

from typing import Any

from txstream.spark.batches import MicroBatch, StreamHandle, foreach_batch
from txstream.windows.feed import WindowFeed

PACKET_SCHEMA = "ts DOUBLE, src INT, dst INT, size INT"
"""The schema of the packet files (CSV ``ts,src,dst,size``)."""


def feed_window(
    stream: Any,
    feed: WindowFeed,
    checkpoint: str,
    *,
    available_now: bool = True,
) -> StreamHandle:
    """Start a query that hands every micro-batch of ``stream`` to ``feed``.

    ``stream`` must have the window's fields in order (e.g. ``ts, src, dst,
    size``; :func:`txstream.spark.sources.csv_files` with :data:`PACKET_SCHEMA`
    reads packet files).  With ``available_now`` the query processes what is
    there and stops (deterministic; what the tests use).
    """
    fields = list(feed.window.fields)

    def batch(b: MicroBatch) -> None:
        feed.add_batch(b.id, b.rows(fields))

    return foreach_batch(stream, batch, checkpoint, available_now=available_now)
