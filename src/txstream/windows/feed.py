"""Filling sub-window buffers from a stream of tuples (a file, a socket, Spark micro-batches).

A :class:`WindowFeed` collects arriving tuples into the buffer of the next
sub-window and hands each full buffer to the engine as a window update:

* tuple-based windows (``tuples_per_subwindow=b``): every ``b`` tuples;
* time-based windows (``t``): when a tuple's timestamp (field ``ts``) reaches
  the end of the current sub-window's span; tuples must come in timestamp order
  within ``t`` of each other's sub-window (a late tuple joins the current buffer).

The first ``n`` buffers fill the window (:meth:`WindowEngine.fill`); later ones
slide it.  Batches carry an id so that a replayed batch (Spark's foreachBatch is
at-least-once) is applied once.
"""

from __future__ import annotations

from collections.abc import Iterable

from txstream.windows.base import Row, WindowError
from txstream.windows.engine import WindowEngine


class WindowFeed:
    """Buffers tuples for ``engine`` and slides its window when a buffer is full."""

    def __init__(self, engine: WindowEngine) -> None:
        self.engine = engine
        self.window = engine.window
        self.buffer: list[Row] = []
        self.filling: list[list[Row]] = []
        self.last_batch: int | None = None
        self.slides = 0
        self._ts = self.window.field("ts") if "ts" in self.window.fields else None
        self._span_end: float | None = None

    def add_batch(self, batch_id: int, rows: Iterable[Row]) -> int:
        """Add one micro-batch; returns the number of window updates it caused.

        A batch id not above the last one applied is a replay and is skipped.
        """
        if self.last_batch is not None and batch_id <= self.last_batch:
            return 0
        before = self.slides
        for row in rows:
            self.add(row)
        self.last_batch = batch_id
        return self.slides - before

    def add(self, row: Row) -> None:
        """Add one tuple."""
        if len(row) != len(self.window.fields):
            raise WindowError(
                f"tuple {row!r} has {len(row)} fields; the window expects "
                f"{len(self.window.fields)}: {', '.join(self.window.fields)}"
            )
        if self.window.b is not None:
            self.buffer.append(row)
            if len(self.buffer) >= self.window.b:
                self._full(float(self.slides + 1))
            return
        if self._ts is None:
            raise WindowError("a time-based window needs a 'ts' field in its tuples")
        ts = float(row[self._ts])
        assert self.window.t is not None
        if self._span_end is None:
            self._span_end = ts + self.window.t
        while ts >= self._span_end:
            self._full(self._span_end)
            self._span_end += self.window.t
        self.buffer.append(row)

    def _full(self, at: float) -> None:
        rows, self.buffer = self.buffer, []
        n = self.window.n
        if len(self.filling) < n and not self.window.slides:
            self.filling.append(rows)
            if len(self.filling) == n:
                self.engine.fill(self.filling, self.window.t or 1.0)
                self.filling = []
        else:
            start = at - (self.window.t or 1.0)
            self.engine.offer_slide(rows, start, at)
            self.engine.apply_slides()
        self.slides += 1
