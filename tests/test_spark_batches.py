"""``foreach_batch`` on the shared local session: the handle a handler can stop.

Few and deterministic: one input file, one batch, ``stop()`` in ``finally``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from txstream.spark.batches import MicroBatch, StreamHandle, foreach_batch
from txstream.spark.sources import text_files

pytestmark = pytest.mark.spark


def test_stop_from_the_handler_stops_after_its_batch_without_failing_it(
    spark: Any, tmp_path: Path
) -> None:
    # Called from the handler (the thread running Spark's foreachBatch), stop()
    # stopped Spark's query from the query's own thread: Spark interrupted it
    # and the handler's stop() raised (Py4JJavaError ... InterruptedException),
    # which failed the batch and the query.  One input file, one batch; the
    # default trigger keeps the query running after it, so only the handler's
    # stop() can end it.
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "part-0.txt").write_text("a\nb\nc\n")
    started = threading.Event()
    handle: list[StreamHandle] = []
    stops: list[tuple[int, float]] = []
    errors: list[BaseException] = []
    rows: list[str] = []

    def handler(batch: MicroBatch) -> None:
        started.wait(30)
        t0 = time.monotonic()
        try:
            handle[0].stop()
        except BaseException as exc:
            errors.append(exc)
            raise
        stops.append((batch.id, time.monotonic() - t0))
        rows.extend(v for (v,) in batch.rows(["value"]))  # the batch goes on after stop()

    query = foreach_batch(
        text_files(spark, tmp_path / "in"), handler, tmp_path / "ckpt", available_now=False
    )
    handle.append(query)
    started.set()
    try:
        assert query.awaitTermination(60) is True  # the handler's stop() ended it
    finally:
        query.stop()
    assert not errors, [str(e).splitlines()[0] for e in errors]
    assert len(stops) == 1 and stops[0][0] == 0, stops  # (a stop() that hung: no entry)
    assert sorted(rows) == ["a", "b", "c"]
    assert query.failure() is None and not query.isActive
    assert query.batches.handled == [0]
