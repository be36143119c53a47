"""A Spark file source fills the sub-window buffers (one test only: Spark is slow)."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

from txstream.windows import SlidingWindow, WindowEngine, get_scheduler
from txstream.windows.feed import WindowFeed


def test_micro_batches_fill_and_slide_the_window(spark: Any, tmp_path: Path) -> None:
    from txstream.jobs.windows import PACKET_SCHEMA, feed_window
    from txstream.spark.sources import csv_files

    rng = random.Random(3)
    incoming = tmp_path / "in"
    incoming.mkdir()
    packets = [
        (round(k * 0.01, 2), rng.randrange(50), rng.randrange(50), rng.randint(41, 140))
        for k in range(700)
    ]
    for f in range(7):  # seven files, one micro-batch each
        chunk = packets[f * 100 : (f + 1) * 100]
        path = incoming / f"p{f}.csv"
        path.write_text("".join(f"{a},{b},{c},{d}\n" for a, b, c, d in chunk))
        os.utime(path, (1_000_000 + f, 1_000_000 + f))  # the file source goes by mtime

    window = SlidingWindow(4, 1.0)
    feed = WindowFeed(WindowEngine(window, get_scheduler("ttu")))
    stream = csv_files(spark, incoming, PACKET_SCHEMA, max_files_per_trigger=1)
    query = feed_window(stream, feed, str(tmp_path / "checkpoint"))
    try:
        query.processAllAvailable()
    finally:
        query.stop()

    # The same packets fed directly give the same window: timestamps 0.00 .. 6.99,
    # spans of 1 s, 4 sub-windows: [0,1) .. [3,4) fill, [4,5) and [5,6) slide; [6,7) waits.
    direct = SlidingWindow(4, 1.0)
    WindowFeed(WindowEngine(direct, get_scheduler("ttu"))).add_batch(0, packets)
    assert feed.last_batch == 6
    assert window.slides == direct.slides == 6
    for i in range(4):
        got, want = window.current(i), direct.current(i)
        assert got.version == want.version
        assert sorted(got.tuples) == sorted(want.tuples)
        assert got.summary.distinct == want.summary.distinct
    assert sorted(feed.buffer) == sorted(packets[600:])
