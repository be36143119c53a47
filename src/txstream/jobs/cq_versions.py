"""The driver's copy of a table a :class:`~txstream.jobs.cq.SparkCQ` query joins with.

:class:`_Versions` keeps one joined table's rows, with their versions, current
from the table's change watcher (drained at each pin), and makes the pinned
relation a micro-batch's transaction reads as of an instant
(:meth:`_Versions.frame`), without walking the table per batch.  The query's
runner (``_Runner`` in :mod:`txstream.jobs.cq`, on Spark's ``foreachBatch``
thread) owns one per join and closes it when the query stops.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from txstream.spark.reference import (
    NEVER,
    arrow_rows,
    arrow_type,
    fits,
    pin_frame,
    pin_schema,
)
from txstream.storage.base import ABSENT

if TYPE_CHECKING:
    from txstream.jobs.cq import _Runner


class _Versions:
    """One joined table's rows as the executors get them, kept current from its changes.

    An Arrow table of every key the table has had (a deleted key as an absent
    row, ``__p`` false, with its deletion's timestamp), as of the last pin.
    Built once, from the table, at the query's first batch; after that a pin
    recomputes only the rows of the keys committed since (the table's change
    watcher, drained under the commit mutex), so the driver does work per
    change, not per row, and ships the Arrow table (a 10,000-row table in
    milliseconds).  A key whose version at the pin's instant is not its newest
    (a snapshot older than a commit) stays pending: its row says until when it
    was current (``__until``) and is recomputed at the next pin.
    """

    def __init__(self, runner: _Runner, i: int) -> None:
        import pyarrow as pa

        self.tm = runner.tm
        self.index = i
        self.join = runner.joins[i]
        self.table = runner.tables[i]
        self.events = runner.cq._stream
        self.schema = pin_schema(self.events, runner.joins, i)
        self.key_type = arrow_type(self.schema["__k"].dataType)
        self.changes = self.table.watch()
        self.pending: dict[Any, None] = {}
        self._frame: tuple[int, Any] | None = None
        try:
            with self.tm.commit_mutex:
                self.changes.clear()
                at = self.tm.clock
                rows = list(self.table.committed(None, deleted=True))
            self.rel: pa.Table = arrow_rows(self.join, self.schema, self._bulk(rows))
        except BaseException:
            self.close()
            raise
        self.at = at

    def close(self) -> None:
        """Stop recording the table's changes."""
        self.table.unwatch(self.changes)

    def _columns(self) -> dict[str, list[Any]]:
        return {f.name: [] for f in self.schema.fields}

    def _add(
        self, cols: dict[str, list[Any]], key: Any, version: int, row: Any, until: int
    ) -> None:
        present = isinstance(row, dict)
        if not present and (row not in (None, ABSENT) or not fits(key, self.key_type)):
            # a value that is not a row of columns (a counter row) is left out, as is
            # an absent key of another type than the join's column: they join nothing
            return
        cols["__k"].append(key)
        cols["__v"].append(version)
        cols["__seen"].append(0)  # set per pin
        cols["__until"].append(until)
        cols["__p"].append(present)
        for n in self.join.names:
            cols[n].append(row.get(n) if present else None)

    def _bulk(self, rows: list[tuple[Any, int, Any]]) -> dict[str, list[Any]]:
        """The columns of many rows at once (as :meth:`_add` would make them, faster)."""
        fit = self.key_type
        rows = [
            r
            for r in rows
            if isinstance(r[2], dict) or (r[2] in (None, ABSENT) and fits(r[0], fit))
        ]
        cols: dict[str, list[Any]] = {
            "__k": [r[0] for r in rows],
            "__v": [r[1] for r in rows],
            "__seen": [0] * len(rows),
            "__until": [NEVER] * len(rows),
            "__p": [isinstance(r[2], dict) for r in rows],
        }
        for n in self.join.names:
            cols[n] = [r[2].get(n) if isinstance(r[2], dict) else None for r in rows]
        return cols

    def drain(self) -> dict[Any, int]:
        """The keys committed since the last drain, each with its first commit (mutex held)."""
        if not self.changes:
            return {}
        changes = dict(self.changes)
        self.changes.clear()
        self.pending.update(dict.fromkeys(changes))
        return changes

    def update(self, at: int) -> None:
        """Bring the rows of the pending keys to instant ``at`` (the commit mutex held).

        ``at`` is the clock, or an open snapshot's instant (whose versions the
        table keeps), and never before the previous update's.
        """
        import pyarrow as pa
        import pyarrow.compute as pc

        if not self.pending:
            return
        tbl = self.table
        cols = self._columns()
        still: dict[Any, None] = {}
        for key in self.pending:
            version = tbl.version_at(key, at)
            row = tbl.read_at(key, at) if version else None
            later = tbl.changed_after(key, at)
            if later is not None:
                still[key] = None
            self._add(cols, key, version, row, NEVER if later is None else later - 1)
        try:
            gone = pa.array(list(self.pending), type=self.key_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):  # e.g. a counter row's key
            gone = pa.array([k for k in self.pending if fits(k, self.key_type)], self.key_type)
        self.pending = still
        delta = arrow_rows(self.join, self.schema, cols)
        keep = pc.invert(pc.is_in(self.rel.column("__k"), value_set=gone))
        self.rel = pa.concat_tables([self.rel.filter(keep), delta])
        if self.rel.column("__k").num_chunks > 64:
            self.rel = self.rel.combine_chunks()
        self._frame = None

    def frame(self, at: int) -> Any:
        """The pinned rows as a DataFrame (reused while the table has not changed)."""
        import pyarrow as pa

        if self._frame is not None:
            return self._frame[1]
        seen = self.schema.names.index("__seen")
        rel = self.rel.set_column(
            seen, "__seen", pa.repeat(pa.scalar(at, pa.int64()), self.rel.num_rows)
        )
        df = pin_frame(self.events, self.schema, rel, self.index)
        self._frame = (at, df)
        return df
