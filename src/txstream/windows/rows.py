"""A key's window kept in the executor runtime's tables (the state of :class:`KeyWindow`).

:class:`RowKeyWindow` is :class:`txstream.windows.keyed.KeyWindow` whose
state lives in four tables of a ``tx.Job``, all placed by the group key, so
that a key's window is rows of one runtime partition:

* ``win_meta`` (``key``): the key's clock, buffer bounds, filling cuts, and the
  engine's small state: the running query executions (which sub-window
  versions each has read, its bit array ``B``), the slides waiting under
  ``serial``, the retain counts and the counters;
* ``win_sub`` (``key, i``): sub-window ``i``'s current version: its tuples and
  summary, written once per slide;
* ``win_old`` (``key, i, v``): an expired version that a query still needs
  (``ws`` retains its start state; a query's partial result of a version it
  read is recomputed from the version);
* ``win_buf`` (``key, seq``): the tuples of the buffer that fills the next
  sub-window, one row each.

A tuple that arrives while the key's CPU is ahead of it (or idle) touches
``win_meta`` and ``win_buf`` only; the engine (the sub-window rows) is loaded
when the event makes the CPU run reads or slide.  The logic is the in-process
engine's, unchanged: so are the answers (a test compares them).

Rows are never changed in place (a new dict per write): a rolled-back
transaction's undo log holds the rows as they were.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from txstream.windows.base import Row, WindowError
from txstream.windows.engine import QueryTxn, WindowEngine
from txstream.windows.keyed import KeyedWindows, KeyWindow, result_row
from txstream.windows.queries import Query, QueryGroup
from txstream.windows.window import SlidingWindow, SubWindow, Summary

META, SUB, OLD, BUF = "win_meta", "win_sub", "win_old", "win_buf"
TABLES: dict[str, list[str]] = {
    META: ["key"],
    SUB: ["key", "i"],
    OLD: ["key", "i", "v"],
    BUF: ["key", "seq"],
}
"""The state tables and their key columns; every table is placed by ``key``."""

RESULTS, HISTORY = "results", "window_history"
HISTORY_SCHEMA = "key string, seq long, op string, before long, drop long"
"""The schema of the window-history output (see :class:`txstream.windows.keyed.StreamLog`)."""


class _Tracked(SlidingWindow):
    """A window that remembers every version it installed during an event."""

    seen: dict[tuple[int, int], SubWindow]

    def slide(
        self, rows: Any, *, start: float = 0.0, full: float = 0.0
    ) -> SubWindow:  # (rows: the buffer or a built SubWindow, as the base class)
        """As :meth:`SlidingWindow.slide`; the new version is remembered."""
        new = super().slide(rows, start=start, full=full)
        self.seen[(new.index, new.version)] = new
        return new


_LOCAL = threading.local()


def _template(spec: KeyedWindows) -> tuple[_Tracked, list[QueryGroup], dict[Query, QueryGroup]]:
    """The window object of this thread for ``spec``, its long-running and snapshot groups.

    Building a window and its query groups (which check every query) for each
    event cost more than the event's own work; one window object per thread is
    reset and refilled from the rows by every event instead (a thread runs one
    transaction at a time).
    """
    cache = getattr(_LOCAL, "cache", None)
    if cache is None:
        cache = _LOCAL.cache = {}
    found = cache.get(id(spec))
    if found is None or found[0] is not spec:
        window = spec.window(_Tracked)
        assert isinstance(window, _Tracked)
        window.seen = {}
        found = cache[id(spec)] = (spec, window, spec.long_groups(window), {})
    _, window, groups, snapshots = found
    window.slides = 0
    window._subs = [None] * window.n
    window._retained = {}
    window._keep = Counter()
    window.seen = {}
    return window, groups, snapshots


def _query_dict(q: Query) -> dict[str, Any]:
    return {
        "aggregate": q.aggregate,
        "length": q.length,
        "attr": q.attr,
        "value": q.value,
        "k": q.k,
        "p": q.p,
        "subset": None if q.subset is None else sorted(q.subset, key=repr),
    }


def _query_of(d: dict[str, Any]) -> Query:
    subset = d["subset"]
    return Query(
        d["aggregate"],
        d["length"],
        attr=d["attr"],
        value=d["value"],
        k=d["k"],
        p=d["p"],
        subset=None if subset is None else frozenset(subset),
    )


def _sub_row(key: Any, sub: SubWindow, table: str) -> dict[str, Any]:
    s = sub.summary
    row = {
        "key": key,
        "i": sub.index,
        "version": sub.version,
        "start": sub.start_time,
        "full": sub.full_time,
        "tuples": sub.tuples,
        "count": s.count,
        "sums": s.sums,
        "mins": s.mins,
        "maxs": s.maxs,
        "distinct": s.distinct,
    }
    if table == OLD:
        row["v"] = sub.version
    return row


def _sub_of(row: dict[str, Any]) -> SubWindow:
    summary = Summary(row["count"], row["sums"], row["mins"], row["maxs"], row["distinct"])
    # (rows are never changed in place: the tuples are shared, not copied)
    sub = SubWindow(row["i"], row["version"], row["tuples"], summary)
    sub.start_time, sub.full_time = row["start"], row["full"]
    return sub


class RowKeyWindow(KeyWindow):
    """Key ``key``'s window, read from and written back to the job's tables through ``t``.

    Make one per event (``RowKeyWindow(spec, t, key)``), call :meth:`packet` or
    :meth:`snapshot`, then :meth:`save`, which writes the changed rows and
    emits the committed executions and history entries.
    """

    _waiting: list[tuple[float, Query, Any]] | None
    _waiting_rows: list[Any]

    def __init__(self, spec: KeyedWindows, t: Any, key: Any) -> None:
        super().__init__(spec, key)
        self.t = t
        self._window, self._groups, self._snapshots = _template(spec)
        meta = t.read(META, key)
        self._meta = meta
        self._seq_first = self._seq_next = 0
        self._state: dict[str, Any] | None = None
        self._stored_old: list[tuple[int, int]] = []
        if meta is not None:
            self.now = meta["now"]
            self.span_end = meta["span_end"]
            self.buffer_start = meta["buffer_start"]
            self.buffered = meta["buffered"]
            self.cuts = [(c, f) for c, f in meta["cuts"]]
            self.filled = meta["filled"]
            self.slides = meta["slides"]
            self._waiting_rows = meta["waiting"]
            self._waiting = None
            self.busy = meta["busy"]
            self._seq_first, self._seq_next = meta["seq_first"], meta["seq_next"]
            self._state = meta["engine"]
            if self._state is not None:
                self._stored_old = [(i, v) for i, v in self._state["old"]]
        self._loaded: dict[int, SubWindow] = {}

    @property
    def waiting(self) -> list[tuple[float, Query, Any]]:
        """The snapshot queries waiting for the window to fill (read from the row on use)."""
        if self._waiting is None:
            self._waiting = [(ts, _query_of(q), tag) for ts, q, tag in self._waiting_rows]
        return self._waiting

    @waiting.setter
    def waiting(self, value: list[tuple[float, Query, Any]]) -> None:
        self._waiting = value

    def _snapshot_group(self, query: Query) -> QueryGroup:
        group = self._snapshots.get(query)
        if group is None:
            if len(self._snapshots) > 1_000:
                self._snapshots.clear()
            group = self._snapshots[query] = self.spec.snapshot_group(self.window, query)
        return group

    # -- the buffer ------------------------------------------------------------------------

    def _append(self, row: Row) -> None:
        self.t.insert(BUF, {"key": self.key, "seq": self._seq_next, "row": row})
        self._seq_next += 1

    def _take(self, count: int) -> list[Row]:
        t, key, first = self.t, self.key, self._seq_first
        rows = []
        for seq in range(first, first + count):
            found = t.read(BUF, (key, seq))
            if found is None:
                raise WindowError(f"window of key {key!r}: buffered tuple {seq} is missing")
            rows.append(tuple(found["row"]))
            t.delete(BUF, (key, seq))
        self._seq_first = first + count
        return rows

    # -- the engine ------------------------------------------------------------------------

    @property
    def engine(self) -> WindowEngine:
        """The key's engine, loaded from the tables on first use."""
        if self._engine is None:
            state = self._state
            self._engine = self._new_engine(0) if state is None else self._load(state)
        return self._engine

    def _load(self, state: dict[str, Any]) -> WindowEngine:
        # Sets the window's and engine's private fields directly: they are this
        # package's own classes, and their state is exactly what the rows hold.
        t, key = self.t, self.key
        window = self.window
        assert isinstance(window, _Tracked)
        window.slides = state["window_slides"]
        for i in range(window.n):
            row = t.read(SUB, (key, i))
            if row is not None:
                sub = _sub_of(row)
                window._subs[i] = self._loaded[i] = window.seen[(i, sub.version)] = sub
        for i, v in self._stored_old:
            row = t.read(OLD, (key, i, v))
            if row is None:
                raise WindowError(
                    f"window of key {key!r}: version {v} of sub-window {i} is missing"
                )
            window.seen[(i, v)] = _sub_of(row)
        for i, v, count in state["keep"]:
            window._keep[(i, v)] = count
            if window.current(i).version != v:
                window._retained[(i, v)] = window.seen[(i, v)]
        engine = self._new_engine(state["log_seq"])
        engine.pending = [(list(rows), start, full) for rows, start, full in state["pending"]]
        engine._full_time = {v: sub.full_time for (_, v), sub in window.seen.items()}
        engine.aborts = state["aborts"]
        engine.rescans = state["rescans"]
        engine.slides_applied = state["slides_applied"]
        engine.max_retained = state["max_retained"]
        engine._next_id = state["next_id"]
        for d in state["active"]:
            group = self._group_of(d["group"])
            txn = QueryTxn(
                d["tid"],
                group,
                d["kind"],
                d["priority"],
                d["arrival"],
                d["tag"],
                attempt=d["attempt"],
                started=d["started"],
                start_versions=None if d["start"] is None else dict(d["start"]),
                debt=d["debt"],
                log_pos=dict(d["log_pos"]),
                read_work=dict(d["read_work"]),
            )
            for i, v in d["read"].items():
                # the partial result is a function of the version read: recomputed
                txn.read[i] = (v, group.partial(window.seen[(i, v)])[0])
            engine.active.append(txn)
        if state["holder"] is not None:
            engine.holder = engine.active[state["holder"]]
        return engine

    def _group_of(self, ref: list[Any]) -> QueryGroup:
        if ref[0] == "L":
            group: QueryGroup = self.groups[ref[1]]
            return group
        return self._snapshot_group(_query_of(ref[1]))

    def _group_ref(self, txn: QueryTxn) -> list[Any]:
        if txn.kind == "long":
            return ["L", txn.tag]
        return ["S", _query_dict(txn.group.queries[0])]

    # -- saving ----------------------------------------------------------------------------

    def save(self) -> None:
        """Write the key's changed rows and emit what committed since it was loaded."""
        t, key = self.t, self.key
        results, entries = self.drain()
        for r in results:
            t.emit(RESULTS, result_row(str(key), r))
        for seq, op, before, drop in entries:
            t.emit(HISTORY, {"key": str(key), "seq": seq, "op": op, "before": before, "drop": drop})
        state = self._state if self._engine is None else self._dump(self._engine)
        meta = {
            "key": key,
            "now": self.now,
            "span_end": self.span_end,
            "buffer_start": self.buffer_start,
            "buffered": self.buffered,
            "cuts": [[c, f] for c, f in self.cuts],
            "filled": self.filled,
            "slides": self.slides,
            "waiting": self._waiting_rows
            if self._waiting is None
            else [[ts, _query_dict(q), tag] for ts, q, tag in self._waiting],
            "busy": self.busy,
            "seq_first": self._seq_first,
            "seq_next": self._seq_next,
            "engine": state,
        }
        t.upsert(META, meta)

    def _dump(self, engine: WindowEngine) -> dict[str, Any]:
        t, key = self.t, self.key
        window = self.window
        assert isinstance(window, _Tracked)
        for i in range(window.n):
            sub = window._subs[i]
            if sub is not None and self._loaded.get(i) is not sub:
                t.upsert(SUB, _sub_row(key, sub, SUB))
        current = {i: s.version for i, s in enumerate(window._subs) if s is not None}
        needed = {iv for iv in window._keep if current.get(iv[0]) != iv[1]}
        for txn in engine.active:
            needed |= {(i, v) for i, (v, _) in txn.read.items() if current.get(i) != v}
        stored = set(self._stored_old)
        for i, v in sorted(stored - needed):
            t.delete(OLD, (key, i, v))
        for i, v in sorted(needed - stored):
            t.insert(OLD, _sub_row(key, window.seen[(i, v)], OLD))
        active = []
        for txn in engine.active:
            active.append(
                {
                    "tid": txn.tid,
                    "group": self._group_ref(txn),
                    "kind": txn.kind,
                    "priority": txn.priority,
                    "arrival": txn.arrival,
                    "tag": txn.tag,
                    "attempt": txn.attempt,
                    "started": txn.started,
                    "read": {i: v for i, (v, _) in txn.read.items()},
                    "start": None if txn.start_versions is None else dict(txn.start_versions),
                    "debt": txn.debt,
                    "log_pos": dict(txn.log_pos),
                    "read_work": dict(txn.read_work),
                }
            )
        holder = engine.holder
        log = engine.log
        return {
            "window_slides": window.slides,
            "keep": [[i, v, c] for (i, v), c in sorted(window._keep.items())],
            "old": sorted(needed),
            "pending": [[rows, start, full] for rows, start, full in engine.pending],
            "aborts": engine.aborts,
            "rescans": engine.rescans,
            "slides_applied": engine.slides_applied,
            "max_retained": engine.max_retained,
            "next_id": engine._next_id,
            "log_seq": getattr(log, "seq", 0),
            "active": active,
            "holder": None
            if holder is None
            else next(k for k, a in enumerate(engine.active) if a is holder),
        }


def on_packet(spec: KeyedWindows, t: Any, key: Any, row: Row) -> None:
    """One tuple of key ``key``'s stream, as one transaction of the runtime."""
    kw = RowKeyWindow(spec, t, key)
    kw.packet(row)
    kw.save()


def on_snapshot(spec: KeyedWindows, t: Any, key: Any, ts: float, query: Query, tag: Any) -> None:
    """One snapshot query on key ``key``'s window, as one transaction of the runtime."""
    kw = RowKeyWindow(spec, t, key)
    kw.snapshot(ts, query, tag)
    kw.save()
