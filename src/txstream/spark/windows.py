"""Feed a sliding window from a Spark Structured Streaming source.

Each micro-batch's rows fill the sub-window buffers of a
:class:`txstream.windows.feed.WindowFeed` through ``foreachBatch`` (rows come
over Arrow, not as ``Row`` objects, which SPARK-NOTES.md measures as far faster);
the feed skips a replayed batch id, so an at-least-once replay after a crash
does not slide the window twice.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql.streaming.query import StreamingQuery

from txstream.windows.feed import WindowFeed

PACKET_SCHEMA = "ts DOUBLE, src INT, dst INT, size INT"
"""The schema of the packet files (CSV ``ts,src,dst,size``)."""


def feed_window(
    stream: DataFrame,
    feed: WindowFeed,
    checkpoint: str,
    *,
    available_now: bool = True,
) -> StreamingQuery:
    """Start a query that hands every micro-batch of ``stream`` to ``feed``.

    ``stream`` must have the window's fields in order (e.g. ``ts, src, dst,
    size``).  With ``available_now`` the query processes what is there and
    stops (deterministic; what the tests use).
    """
    fields = list(feed.window.fields)

    def batch(df: DataFrame, batch_id: int) -> None:
        table = df.select(*fields).toArrow()
        columns = [table.column(f).to_pylist() for f in fields]
        rows: list[tuple[Any, ...]] = list(zip(*columns, strict=True))
        feed.add_batch(batch_id, rows)

    writer = stream.writeStream.foreachBatch(batch).option("checkpointLocation", checkpoint)
    if available_now:
        writer = writer.trigger(availableNow=True)
    return writer.start()
