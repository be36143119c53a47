"""Micro-batches handed to Python callbacks, exactly once per batch id.

:func:`foreach_batch` starts a Structured Streaming query whose every
micro-batch goes to a plain Python function as a :class:`MicroBatch`: the batch
id and the batch's rows, shaped with Spark SQL expression strings (``where``,
``select``, ``order_by``, a join with rows the caller supplies) and delivered
over Arrow as Python lists (SPARK-NOTES.md measures Arrow as far faster than
``Row`` objects).  The callback never sees a pyspark object.

Exactly once: ``foreachBatch`` is at-least-once (after a crash between the
sink's write and Spark's commit log, the same batch id runs again with the same
rows).  :class:`ExactlyOnce` skips a batch id that is already done: by default
one this process has handed over before, or, across restarts, whatever the
``done`` predicate says (a sink that commits its effects with the batch id
atomically answers it from its own store).

Importing this module does not import pyspark.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming.query import StreamingQuery

Columns = dict[str, list[Any]]
"""A batch's rows by column: ``{name: [value of row 0, value of row 1, ...]}``."""


class MicroBatch:
    """One micro-batch: its id and its rows, shaped with SQL strings, read as Python lists."""

    def __init__(self, batch_id: int, df: DataFrame) -> None:
        self.id = batch_id
        self._df = df

    @property
    def frame(self) -> DataFrame:
        """The batch's DataFrame, as an opaque handle for the runtime's other helpers."""
        return self._df

    def _with(self, df: DataFrame) -> MicroBatch:
        return MicroBatch(self.id, df)

    def where(self, condition: str) -> MicroBatch:
        """The rows for which the SQL ``condition`` holds."""
        return self._with(self._df.where(condition))

    def select(self, *exprs: str) -> MicroBatch:
        """The rows projected to the SQL expressions ``exprs``."""
        return self._with(self._df.selectExpr(*exprs))

    def order_by(self, *columns: str) -> MicroBatch:
        """The rows sorted by ``columns`` (names or SQL expressions such as ``"id DESC"``)."""
        from pyspark.sql import functions as F

        return self._with(self._df.orderBy(*[F.expr(c) for c in columns]))

    def join_rows(self, rows: Sequence[Sequence[Any]], schema: str, on: str) -> MicroBatch:
        """An inner join on column ``on`` with ``rows`` (a DDL ``schema``) made for this batch.

        This is a stream-static join whose static side is read when the batch
        runs, which is what Spark does with a table that changes.
        """
        static = self._df.sparkSession.createDataFrame(list(rows), schema)
        return self._with(self._df.join(static, on))

    def columns(self, names: Sequence[str] | None = None) -> Columns:
        """The rows by column (all columns, in order, when ``names`` is None)."""
        df = self._df if names is None else self._df.select(*names)
        table = df.toArrow()
        return {name: table.column(name).to_pylist() for name in table.column_names}

    def rows(self, names: Sequence[str] | None = None) -> list[tuple[Any, ...]]:
        """The rows as tuples of the ``names`` columns, in the batch's order."""
        return list(zip(*self.columns(names).values(), strict=True))

    def dicts(self, names: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """The rows as dicts of the ``names`` columns, in the batch's order."""
        cols = self.columns(names)
        keys = list(cols)
        return [dict(zip(keys, vals, strict=True)) for vals in zip(*cols.values(), strict=True)]


STOP_WAIT_S = 30.0
"""How long a stop waits for the micro-batch in flight before it stops the query anyway."""


class BatchThread:
    """Which thread runs a micro-batch, so that a ``stop()`` called from inside it can wait.

    Spark calls a ``foreachBatch`` function in the query's own thread, and
    whatever the function calls (a handler, a job's sinks) runs there too.  A
    ``stop()`` from there must neither wait for the batch (it is that batch) nor
    stop Spark's query (Spark interrupts the query's thread and waits for it
    to end: the ``stop`` call fails with an ``InterruptedException`` and so
    does the batch).  :meth:`stop` runs such a stop in a thread of its own,
    after the batch.
    """

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        """Held by the thread that runs a micro-batch, for all of it."""
        self._ident: int | None = None
        self._stopping = threading.Lock()

    @contextmanager
    def running(self) -> Iterator[None]:
        """Around one micro-batch (in Spark's ``foreachBatch`` call)."""
        with self.mutex:
            self._ident = threading.get_ident()
            try:
                yield
            finally:
                self._ident = None

    def inside(self) -> bool:
        """Whether the calling thread is running a micro-batch."""
        return self._ident == threading.get_ident()

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for no micro-batch to be running; whether none is."""
        if self.mutex.acquire(timeout=timeout):
            self.mutex.release()
            return True
        return False

    def stop(self, stop: Callable[[], None], name: str, wait_s: float = STOP_WAIT_S) -> None:
        """Call ``stop`` (one call at a time): now, or, from inside a micro-batch, after it.

        From inside a batch it returns at once; a daemon thread named ``name``
        waits up to ``wait_s`` for the batch to end, then calls ``stop``.
        """
        if self.inside():
            threading.Thread(
                target=self._after_batch, args=(stop, wait_s), name=name, daemon=True
            ).start()
            return
        with self._stopping:
            stop()

    def _after_batch(self, stop: Callable[[], None], wait_s: float) -> None:
        self.wait_idle(wait_s)
        with self._stopping:
            stop()


class ExactlyOnce:
    """A ``foreachBatch`` function that hands each batch id to ``handler`` at most once.

    ``done(batch_id)`` says whether a batch id is already done (e.g. a target
    that recorded it durably); without it, a batch id this object handed over
    before is done.  Skipped ids are listed in :attr:`skipped`, handled ones in
    :attr:`handled`.
    """

    def __init__(
        self,
        handler: Callable[[MicroBatch], None],
        done: Callable[[int], bool] | None = None,
    ) -> None:
        self.handler = handler
        self.done = done
        self.handled: list[int] = []
        self.skipped: list[int] = []
        self._seen: set[int] = set()
        self.thread = BatchThread()
        """The thread running a batch (see :meth:`StreamHandle.stop`)."""

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        """Spark's ``foreachBatch`` entry point."""
        batch_id = int(batch_id)
        with self.thread.running():
            already = self.done(batch_id) if self.done is not None else batch_id in self._seen
            if already:
                self.skipped.append(batch_id)
                return
            self.handler(MicroBatch(batch_id, df))
            self._seen.add(batch_id)
            self.handled.append(batch_id)


class StreamHandle:
    """A started query, with the names a PySpark user knows from ``StreamingQuery``."""

    def __init__(self, query: StreamingQuery, batches: ExactlyOnce) -> None:
        self.query = query
        self.batches = batches

    @property
    def id(self) -> str:
        """The query's id (stable across restarts from the same checkpoint)."""
        return str(self.query.id)

    @property
    def isActive(self) -> bool:
        """Whether the query is running."""
        return bool(self.query.isActive)

    @property
    def status(self) -> dict[str, Any]:
        """The query's current status (``StreamingQuery.status``)."""
        return dict(self.query.status)

    @property
    def lastProgress(self) -> dict[str, Any] | None:
        """The last micro-batch's progress, or None before the first."""
        progress = self.query.lastProgress
        return None if progress is None else dict(progress)

    @property
    def recentProgress(self) -> list[dict[str, Any]]:
        """The progress of the recent micro-batches, oldest first."""
        return [dict(p) for p in self.query.recentProgress]

    def input_rows(self) -> int:
        """Rows read over the recent micro-batches (0 before the first batch with rows)."""
        return sum(int(p.get("numInputRows", 0)) for p in self.query.recentProgress)

    def processAllAvailable(self) -> None:
        """Block until everything available when called has been processed."""
        self.query.processAllAvailable()

    def awaitTermination(self, timeout: float | None = None) -> bool | None:
        """Wait for the query to end (``StreamingQuery.awaitTermination``)."""
        # (typed int by PySpark, which takes seconds as a float all the same)
        return self.query.awaitTermination(timeout)  # type: ignore[arg-type]

    def stop(self) -> None:
        """Stop the query.

        Called from the handler (which runs in the query's own thread), it
        returns at once, and the query stops in a thread of its own as soon as
        the batch has finished (``awaitTermination()`` returns then): stopping
        Spark's query from its own thread failed the batch and the query.
        """
        self.batches.thread.stop(self.query.stop, name="stop foreach_batch query")

    def exception(self) -> BaseException | None:
        """The exception that ended the query, or None."""
        return self.query.exception()

    def failure(self) -> str | None:
        """Why the query failed, as one line (no Java stack trace), or None if it has not."""
        exc = self.query.exception()
        if exc is None:
            return None
        lines = str(getattr(exc, "desc", exc)).strip().splitlines()
        return lines[0] if lines else str(exc)


def foreach_batch(
    stream: DataFrame,
    handler: Callable[[MicroBatch], None] | ExactlyOnce,
    checkpoint: str | Path,
    *,
    done: Callable[[int], bool] | None = None,
    available_now: bool = True,
    processing_time: str | None = None,
) -> StreamHandle:
    """Start a query that hands every micro-batch of ``stream`` to ``handler``, once per id.

    ``checkpoint`` is Spark's checkpoint folder.  With ``available_now`` the
    query processes what is there and stops (deterministic; what tests and
    catch-up runs use); otherwise it triggers every ``processing_time`` (e.g.
    ``"100 milliseconds"``; default: as fast as it can).  ``done``: see
    :class:`ExactlyOnce` (ignored when ``handler`` already is one).
    """
    batches = handler if isinstance(handler, ExactlyOnce) else ExactlyOnce(handler, done)
    writer = stream.writeStream.foreachBatch(batches).option("checkpointLocation", str(checkpoint))
    if available_now:
        writer = writer.trigger(availableNow=True)
    elif processing_time is not None:
        writer = writer.trigger(processingTime=processing_time)
    return StreamHandle(writer.start(), batches)


def run_available(
    stream: DataFrame,
    handler: Callable[[MicroBatch], None] | ExactlyOnce,
    checkpoint: str | Path,
    *,
    done: Callable[[int], bool] | None = None,
) -> ExactlyOnce:
    """Process everything ``stream`` has now through ``handler``, then stop; return the driver."""
    handle = foreach_batch(stream, handler, checkpoint, done=done, available_now=True)
    try:
        handle.processAllAvailable()
    finally:
        handle.stop()
    return handle.batches
