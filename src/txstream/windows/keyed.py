"""One sliding window per group key, fed by a stream and run on the stream's clock.

Users write ``groupBy(key).window(...)``: every key has its own window of
``n`` sub-windows, its own long-running queries (re-executed every ``m``
slides) and its own snapshot queries, under one scheduler.  A
:class:`KeyWindow` is one key's window: a :class:`WindowEngine`, the buffer
that fills the next sub-window, and the key's *CPU clock*.

**The clock.**  The simulation (:mod:`txstream.windows.sim`) runs the
engine's loop on a clock that reads and slides advance by their cost
(:class:`Costs`).  Here the events' timestamps drive the same loop: before an
event with timestamp ``ts`` is taken in, the key's CPU runs query reads (one
at a time, as the engine's ``pick``/``step`` choose) until its clock reaches
``ts``; a buffer is full at the end of its span (time-based, ``t``) or at its
``b``-th tuple (tuple-based), and its slide runs then, as soon as the
scheduler lets it.  So how reads and slides interleave, hence aborts,
freshness and answers, is a function of the input alone: the same on one
process and on Spark executors, before and after a crash.

A key's window starts at its first event; queries start once the first
``n`` buffers have filled the window (snapshot queries that arrive before wait
for it, with their arrival time).  :class:`KeyWindow` keeps everything in
memory (:func:`run_keyed`, the in-process engine); the executors' version
(:mod:`txstream.windows.rows`) keeps the same state in the runtime's tables
and reuses this logic unchanged.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from txstream.windows.base import PACKET_FIELDS, Row, WindowError
from txstream.windows.engine import Costs, HistoryLog, Result, WindowEngine
from txstream.windows.queries import Query, QueryGroup
from txstream.windows.schedulers import get_scheduler
from txstream.windows.sim import LONG_AGGREGATES, PERCENTILES
from txstream.windows.window import SlidingWindow


@dataclass(frozen=True)
class KeyedWindows:
    """The window every key gets, its long-running queries and its scheduler.

    ``long_queries`` holds groups of :class:`Query` (one tuple per group,
    evaluated together, as :class:`QueryGroup`); each group is re-executed
    every ``m`` slides.  ``snapshot_*`` say how a snapshot query's group reads
    (the defaults: the whole window, charged per tuple, as in Section 5).
    """

    n: int
    t: float | None = 1.0
    tuples_per_subwindow: int | None = None
    scheduler: str = "ttu"
    long_queries: tuple[tuple[Query, ...], ...] = ()
    m: int = 1
    mode: str = "ss"
    long_cost: str = "tuples"
    long_scope: str = "window"
    snapshot_cost: str = "tuples"
    snapshot_scope: str = "window"
    costs: Costs = field(default_factory=Costs)
    fields: tuple[str, ...] = PACKET_FIELDS
    numeric: tuple[str, ...] = ("size",)
    groups: tuple[str, ...] = ("src", "dst")
    measure: str = "size"
    record: bool = False

    def validate(self) -> None:
        """Raise :class:`WindowError` (or UnknownNameError) on a bad setting."""
        get_scheduler(self.scheduler)
        window = self.window()
        if "ts" not in window.fields:
            raise WindowError("a keyed window runs on its events' clock: its fields need 'ts'")
        if not isinstance(self.m, int) or isinstance(self.m, bool) or self.m < 1:
            raise WindowError(f"re-execution period m is a whole number >= 1, got {self.m!r}")
        self.long_groups(window)

    def window(self, cls: type[SlidingWindow] = SlidingWindow) -> SlidingWindow:
        """An empty window of this shape (of class ``cls``, a SlidingWindow)."""
        return cls(
            self.n,
            self.t,
            tuples_per_subwindow=self.tuples_per_subwindow,
            fields=self.fields,
            numeric=self.numeric,
            groups=self.groups,
            measure=self.measure,
        )

    def long_groups(self, window: SlidingWindow) -> list[QueryGroup]:
        """The long-running query groups over ``window``."""
        return [
            QueryGroup(
                list(qs),
                window,
                mode=self.mode,
                name=f"G{g}:{qs[0].aggregate}({qs[0].attr})" if qs else "",
                cost=self.long_cost,
                scope=self.long_scope,
            )
            for g, qs in enumerate(self.long_queries)
        ]

    def snapshot_group(self, window: SlidingWindow, query: Query) -> QueryGroup:
        """A snapshot query's group (raises :class:`WindowError` on a bad query)."""
        if not isinstance(query, Query):
            raise WindowError(f"a snapshot query is a Query, not {query!r}")
        return QueryGroup.snapshot(
            query, window, self.mode, self.snapshot_cost, self.snapshot_scope
        )


class StreamLog(HistoryLog):
    """A :class:`HistoryLog` kept as entries that can leave the process one event at a time.

    An entry is ``(seq, op, before, drop)``: the operation's text, the slide id
    whose write it must precede (a ``ws`` read of an expired version, -1
    otherwise), or ``drop``, the seq of a read a re-scan undid (``op`` None).
    :func:`history_operations` turns the entries back into the history's order.
    """

    def __init__(self, n: int, seq: int = 0) -> None:
        super().__init__(n)
        self.seq = seq
        self.entries: list[tuple[int, str | None, int, int]] = []

    def _add(self, op: str | None, before: int = -1, drop: int = -1) -> int:
        pos = self.seq
        self.entries.append((pos, op, before, drop))
        self.seq += 1
        return pos

    def slide(self, j: int) -> None:
        """``w<j>[j mod n] c<j>``."""
        self._add(f"w{j}[{j % self.n}]")
        self._add(f"c{j}")

    def read(self, tid: str, index: int, version: int, current: int) -> int:
        """``r<tid>[index]``; a read of an expired version goes before its expiry."""
        op = f"r{tid}[{index}]"
        if version == current:
            return self._add(op)
        self._add(op, before=version + self.n)
        return -1

    def remove(self, pos: int) -> None:
        """Undo the read at ``pos`` (a re-scan)."""
        if pos >= 0:
            self._add(None, drop=pos)

    def end(self, tid: str, committed: bool) -> None:
        """``c<tid>`` or ``a<tid>``."""
        self._add(f"{'c' if committed else 'a'}{tid}")


def history_operations(entries: Iterable[Sequence[Any]]) -> list[str]:
    """The operations of a :class:`StreamLog`'s entries, in history order."""
    ordered = sorted((tuple(e) for e in entries), key=lambda e: e[0])
    dropped = {e[3] for e in ordered if e[1] is None}
    before: dict[int, list[str]] = {}
    for seq, op, at, _ in ordered:
        if op is not None and at >= 0 and seq not in dropped:
            before.setdefault(at, []).append(op)
    out: list[str] = []
    for seq, op, at, _ in ordered:
        if op is None or at >= 0 or seq in dropped:
            continue
        if op.startswith("w"):
            out.extend(before.get(int(op[1 : op.index("[")]), ()))
        out.append(op)
    return out


def history_text(entries: Iterable[Sequence[Any]], n: int, title: str = "") -> str:
    """The history in the notation ``txstream check --criterion ws|lws`` reads."""
    ops = history_operations(entries)
    head = f"# {title}\n" if title else ""
    lines = [" ".join(ops[k : k + 16]) for k in range(0, len(ops), 16)]
    return f"{head}# subwindows: {n}\n" + "\n".join(lines) + "\n"


def result_row(key: Any, r: Result) -> dict[str, Any]:
    """A committed query execution as an output row (answers as JSON text)."""
    return {
        "key": key,
        "tid": r.tid,
        "kind": r.kind,
        "tag": str(r.tag),
        "query": r.group.name,
        "arrival": r.arrival,
        "started": r.started,
        "committed": r.committed,
        "attempts": r.attempts,
        "newest_version": r.newest_version,
        "freshness": r.freshness,
        "answers": json.dumps(r.answers, default=str),
    }


RESULT_SCHEMA = (
    "key string, tid string, kind string, tag string, query string, arrival double, "
    "started double, committed double, attempts long, newest_version long, "
    "freshness double, answers string"
)
"""The schema of :func:`result_row`'s rows (the key as text)."""


_SHAPES: dict[int, tuple[KeyedWindows, SlidingWindow]] = {}


def shape_of(spec: KeyedWindows) -> SlidingWindow:
    """An empty window of ``spec``'s shape, made once per spec object, never changed.

    Keyed by the object's identity: hashing a spec hashes all its queries.
    """
    found = _SHAPES.get(id(spec))
    if found is None or found[0] is not spec:
        if len(_SHAPES) > 64:
            _SHAPES.clear()
        found = _SHAPES[id(spec)] = (spec, spec.window())
    return found[1]


def check_row(window: SlidingWindow, row: Row) -> float:
    """The tuple's timestamp; :class:`WindowError` if the tuple cannot enter the window.

    Checked when the tuple arrives, so that a bad tuple is refused alone rather
    than making its whole sub-window fail at its slide.
    """
    if not isinstance(row, tuple) or len(row) != len(window.fields):
        raise WindowError(
            f"tuple {row!r} does not have the window's {len(window.fields)} fields: "
            f"{', '.join(window.fields)}"
        )
    ts = row[window.field("ts")]
    for a, k in (*window.numeric, ("ts", window.field("ts")), ("measure", window.measure)):
        v = row[k]
        if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
            raise WindowError(f"tuple {row!r}: {a} must be a finite number, not {v!r}")
    for a, k in window.groups:
        if not isinstance(row[k], Hashable) or row[k] is None:
            raise WindowError(f"tuple {row!r}: {a} must be a value, not {row[k]!r}")
    return float(ts)


class KeyWindow:
    """One key's window on the stream's clock (the module's docstring has the rules).

    Call :meth:`packet` for each tuple and :meth:`snapshot` for each snapshot
    query, in timestamp order; :meth:`drain` returns the query executions that
    committed and the history entries written since the last call.  A call that
    raises :class:`WindowError` (a bad tuple or query) changes nothing.

    The buffer and the filling are behind :meth:`_append` and :meth:`_take`, and
    the engine behind :attr:`engine`, so that the executors' subclass keeps
    them in tables and loads the engine only when an event needs it.
    """

    def __init__(self, spec: KeyedWindows, key: Any) -> None:
        self.spec = spec
        self.key = key
        self.now = -math.inf  # the key's CPU clock
        self.span_end: float | None = None  # time-based: when the buffer is full
        self.buffer_start = 0.0  # when the buffer began filling
        self.buffered = 0  # tuples in the buffer (all the cut buffers' too while filling)
        self.cuts: list[tuple[int, float]] = []  # filling: (tuples, full time) per buffer
        self.filled = False
        self.slides = 0  # slides applied since the window filled (for m)
        self.waiting: list[tuple[float, Query, Any]] = []  # snapshots before the fill
        self.busy = False  # the engine has queries to run or slides waiting
        self._buffer: list[Row] = []
        self._engine: WindowEngine | None = None
        self._window: SlidingWindow | None = None
        self._groups: list[QueryGroup] | None = None
        self._drained = 0

    # -- what the subclass may keep elsewhere ----------------------------------------------

    @property
    def window(self) -> SlidingWindow:
        """The key's window."""
        if self._window is None:
            self._window = self._make_window()
        return self._window

    def _make_window(self) -> SlidingWindow:
        return self.spec.window()

    @property
    def groups(self) -> list[QueryGroup]:
        """The long-running query groups over the key's window."""
        if self._groups is None:
            self._groups = self.spec.long_groups(self.window)
        return self._groups

    @property
    def engine(self) -> WindowEngine:
        """The key's engine (made on first use)."""
        if self._engine is None:
            self._engine = self._new_engine()
        return self._engine

    def _new_engine(self, log_seq: int = 0) -> WindowEngine:
        engine = WindowEngine(self.window, self.spec.scheduler, costs=self.spec.costs)
        if self.spec.record:
            engine.log = StreamLog(self.window.n, log_seq)
        return engine

    def _snapshot_group(self, query: Query) -> QueryGroup:
        return self.spec.snapshot_group(self.window, query)

    def _append(self, row: Row) -> None:
        self._buffer.append(row)

    def _take(self, count: int) -> list[Row]:
        """The ``count`` oldest buffered tuples, removed from the buffer."""
        rows, self._buffer = self._buffer[:count], self._buffer[count:]
        return rows

    # -- events ------------------------------------------------------------------------

    def packet(self, row: Row) -> None:
        """Take one tuple in at its timestamp."""
        ts = check_row(shape_of(self.spec), row)
        self._start(ts)
        crossing = self.span_end is not None and ts >= self.span_end
        if crossing or (self.busy and self.now < ts):
            self._advance(ts)
        elif self.now < ts:
            self.now = ts  # idle: the CPU waits for the tuple
        self._append(row)
        self.buffered += 1
        b = self.spec.tuples_per_subwindow
        if b is not None and self.buffered - sum(c for c, _ in self.cuts) >= b:
            self._full(ts)

    def snapshot(self, ts: float, query: Query, tag: Any = None) -> None:
        """A snapshot query arrives at ``ts`` (priority over long-running ones)."""
        if not isinstance(ts, int | float) or isinstance(ts, bool) or not math.isfinite(ts):
            raise WindowError(f"a snapshot query's time is a finite number, not {ts!r}")
        group = self._snapshot_group(query)  # checked before any change
        self._start(float(ts))
        self._advance(float(ts))
        if not self.filled:
            self.waiting.append((float(ts), query, tag))
            return
        self.engine.submit(group, float(ts), kind="snapshot", priority=1, tag=tag)
        self.busy = True

    def drain(self) -> tuple[list[Result], list[tuple[int, str | None, int, int]]]:
        """The executions committed and the history entries since the last call."""
        if self._engine is None:
            return [], []
        results = self._engine.results[self._drained :]
        self._drained = len(self._engine.results)
        log = self._engine.log
        entries: list[tuple[int, str | None, int, int]] = []
        if isinstance(log, StreamLog):
            entries, log.entries = log.entries, []
        return results, entries

    # -- the loop ----------------------------------------------------------------------

    def _start(self, ts: float) -> None:
        if self.now == -math.inf:
            self.now = ts
            self.buffer_start = ts
            if self.spec.tuples_per_subwindow is None:
                assert self.spec.t is not None
                self.span_end = ts + self.spec.t

    def _advance(self, ts: float) -> None:
        """Run the CPU up to ``ts``, sliding at every span end passed on the way."""
        t = self.spec.t
        if self.span_end is not None and t is not None:
            while ts >= self.span_end:
                self._run_until(self.span_end)
                self._full(self.span_end)
                self.span_end += t
        self._run_until(ts)

    def _run_until(self, target: float) -> None:
        if not self.busy:
            self.now = max(self.now, target)
            return
        engine = self.engine
        while True:
            self._apply()
            if self.now >= target:
                break
            txn = engine.pick()
            if txn is None:
                self.now = target
                break
            self.now += engine.step(txn, self.now)
        self.busy = bool(engine.active or engine.pending)

    def _apply(self) -> None:
        engine = self.engine
        elapsed, done = engine.apply_slides()
        if not done:
            return
        self.now += elapsed
        for _ in done:
            self.slides += 1
            if self.slides % self.spec.m == 0:
                self._trigger(self.now)

    def _trigger(self, at: float) -> None:
        engine = self.engine
        for g, group in enumerate(self.groups):
            if not engine.running(g):
                engine.submit(group, at, kind="long", priority=0, tag=g)

    def _full(self, at: float) -> None:
        """The buffer is full at ``at``: fill the window with it, or slide."""
        pending = self.buffered - sum(c for c, _ in self.cuts)
        start, self.buffer_start = self.buffer_start, at
        if not self.filled:
            self.cuts.append((pending, at))
            if len(self.cuts) < self.spec.n:
                return
            rows = self._take(self.buffered)
            buffers, k = [], 0
            for count, _ in self.cuts:
                buffers.append(rows[k : k + count])
                k += count
            engine = self.engine
            engine.fill(buffers, self.spec.t or 1.0, fulls=[f for _, f in self.cuts])
            self.cuts, self.buffered, self.filled = [], 0, True
            self._trigger(self.now)
            for ts, query, tag in self.waiting:
                group = self._snapshot_group(query)
                engine.submit(group, ts, kind="snapshot", priority=1, tag=tag)
            self.waiting = []
            self.busy = bool(engine.active)
            return
        rows = self._take(pending)
        self.buffered -= pending
        engine = self.engine
        engine.offer_slide(rows, start, at)
        self.busy = True
        self._apply()
        self.busy = bool(engine.active or engine.pending)


@dataclass
class KeyedRun:
    """What :func:`run_keyed` gives: each key's window, committed results and history."""

    windows: dict[Any, KeyWindow]
    results: list[dict[str, Any]]
    histories: dict[Any, list[tuple[int, str | None, int, int]]]

    def history(self, key: Any) -> str:
        """Key ``key``'s window history in the notation (``txstream check``)."""
        n = next(iter(self.windows.values())).window.n
        return history_text(self.histories.get(key, []), n, f"window of key {key}")


Event = tuple[str, dict[str, Any]]
"""``("packets", row)`` or ``("snapshots", row)``, as :meth:`Job.run_local` takes them."""


def snapshot_query(row: dict[str, Any]) -> Query:
    """A snapshot-query event's :class:`Query`.

    Fields ``aggregate``, ``length``, ``attr`` and ``subset``: addresses as
    integers separated by spaces, empty for none.
    """
    subset_text = row.get("subset") or ""
    try:
        subset = frozenset(int(v) for v in str(subset_text).split()) if subset_text else None
    except ValueError:
        raise WindowError(
            f"a snapshot query's subset is integers separated by spaces, not {subset_text!r}"
        ) from None
    length = row.get("length")
    if not isinstance(length, int) or isinstance(length, bool):
        raise WindowError(f"a snapshot query's length is a whole number, not {length!r}")
    return Query(
        str(row.get("aggregate")), length, attr=str(row.get("attr") or "src"), subset=subset
    )


def run_keyed(spec: KeyedWindows, events: Iterable[Event], *, key: str = "key") -> KeyedRun:
    """The in-process engine: every key's window over ``events`` in timestamp order.

    ``events`` are ``("packets", row)`` and ``("snapshots", row)`` pairs (dicts
    with the key column, ``ts`` and the window's fields, or a snapshot query's
    fields, see :func:`snapshot_query`, and ``id``); they run in the order of
    ``ts``, then packets before snapshot queries, then as given, which is the
    order the executor runtime's event-time merge gives the job of
    :mod:`txstream.jobs.windows`.
    """
    spec.validate()
    numbered = sorted(
        (
            (row["ts"], 0 if kind == "packets" else 1, k, kind, row)
            for k, (kind, row) in enumerate(events)
        ),
        key=lambda e: e[:3],
    )
    windows: dict[Any, KeyWindow] = {}
    results: list[dict[str, Any]] = []
    histories: dict[Any, list[tuple[int, str | None, int, int]]] = {}
    fields = spec.fields
    for _, _, _, kind, row in numbered:
        k = row[key]
        kw = windows.get(k)
        if kw is None:
            kw = windows[k] = KeyWindow(spec, k)
        if kind == "packets":
            kw.packet(tuple(row[f] for f in fields))
        else:
            kw.snapshot(row["ts"], snapshot_query(row), row.get("id"))
        done, entries = kw.drain()
        results.extend(result_row(str(k), r) for r in done)
        histories.setdefault(k, []).extend(entries)
    return KeyedRun(windows, results, histories)


def workload(
    keys: int,
    seconds: float,
    *,
    rate: float = 1000.0,
    snapshot_interval: float = 0.0,
    subset: int = 20,
    addresses: int = 1000,
    n: int = 20,
    seed: int = 0,
) -> list[Event]:
    """A keyed packet stream and snapshot queries, as :func:`run_keyed` and the job take them.

    Each of ``keys`` keys (0 .. keys-1) gets about ``rate`` packets
    ``(ts, src, dst, size)`` a second for ``seconds``, with the rate of
    Section 5 (0.5-1.2x, bursts up to 10x with probability 0.1, per tenth of
    a second); snapshot queries (count, sum or avg of the sizes over
    ``subset`` random addresses, a random length ``1..n``) arrive at random,
    ``snapshot_interval`` seconds apart on average per key (0: none).
    Timestamps are distinct within a key, so the order is the same whatever
    ties would be broken by.  Sorted by ``ts``.
    """
    rng = random.Random(seed)
    events: list[Event] = []
    for k in range(keys):
        ts, end = 0.0, float(seconds)
        while ts < end:
            factor = rng.uniform(1.0, 10.0) if rng.random() < 0.1 else rng.uniform(0.5, 1.2)
            count = max(1, int(rate * 0.1 * factor))
            step = 0.1 / count
            for j in range(count):
                events.append(
                    (
                        "packets",
                        {
                            "key": k,
                            "ts": round(ts + j * step, 9),
                            "src": rng.randrange(addresses),
                            "dst": rng.randrange(addresses),
                            "size": 40 + rng.randint(1, 100),
                        },
                    )
                )
            ts += 0.1
        if snapshot_interval > 0:
            at = rng.expovariate(1 / snapshot_interval)
            while at < end:
                chosen = sorted(rng.sample(range(addresses), min(subset, addresses)))
                events.append(
                    (
                        "snapshots",
                        {
                            "key": k,
                            "ts": round(at, 9) + 5e-10,  # never a packet's time
                            "id": len(events),
                            "aggregate": rng.choice(("count", "sum", "avg")),
                            "length": rng.randint(1, n),
                            "attr": rng.choice(("src", "dst")),
                            "subset": " ".join(map(str, chosen)),
                        },
                    )
                )
                at += rng.expovariate(1 / snapshot_interval)
    events.sort(key=lambda e: (e[1]["ts"], e[0] != "packets"))
    return events


def random_long_queries(
    n: int, count: int, *, group_size: int = 5, seed: int = 0
) -> tuple[tuple[Query, ...], ...]:
    """``count`` top-k / percentile queries over random lengths ``1..n``, in groups.

    The long-running workload of Section 5, as :func:`txstream.windows.sim.long_groups`
    draws it: each group one aggregate of one attribute (src or dst).
    """
    rng = random.Random(seed * 31 + 7)
    groups = []
    for g in range((count + group_size - 1) // group_size):
        aggregate = rng.choice(LONG_AGGREGATES)
        attr = rng.choice(("src", "dst"))
        size = min(group_size, count - g * group_size)
        groups.append(
            tuple(
                Query(
                    aggregate,
                    rng.randint(1, n),
                    attr=attr,
                    k=rng.choice((5, 10, 20)),
                    p=rng.choice(PERCENTILES),
                )
                for _ in range(size)
            )
        )
    return tuple(groups)
