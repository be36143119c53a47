"""The units a continuous query runs in: input events, count-based and time-based windows.

Each function runs one engine's units from where its input stands until the
input ends (or the run's result count or time is up): it builds the unit's
``fill`` (the events of the window, their outputs, the window's result rows
computed inside the unit's transaction) and hands it to the engine's strategy
(:meth:`Strategy.transact <txstream.cq.strategies.Strategy.transact>`), then
emits the results once it committed and prunes the redo queues.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from txstream.cq.base import CQError, Event, Read, Row, WindowAgg, WindowJoin
from txstream.cq.entries import Entry, Pending
from txstream.txn import Transaction

if TYPE_CHECKING:
    from txstream.cq.engine import CQEngine


def run_per_event(engine: CQEngine) -> None:
    """Without a window: one unit per input event."""
    # Without a window, the commit operator is a reference operator (or there
    # is none): one CQ-derived transaction per input event.
    while engine._pos < engine._off + len(engine._input) and not engine._stopped():
        ts = engine._pos

        def fill(txn: Transaction | None, ts: int = ts) -> Any:
            entry = engine._evaluate(ts, txn)
            reads = list(entry.reads)
            row = entry.out.value if entry.out is not None else None
            return [], Pending(row, entry.reads, engine._state(txn, reads), ts, ts)

        # naive with a recorder: the event's reads go through the transaction
        # _transact opens to name them, and the manager records them
        done, attempts = engine.strategy.transact(fill)
        engine._pos += 1
        engine._emit(done[1], attempts)
        if engine._on_commit is not None:
            engine._on_commit(ts)


def window_row(
    engine: CQEngine,
    txn: Transaction | None,
    n: int,
    lwm: int,
    ts: int,
    row: Row,
    dep: list[Read],
    state: bool = True,
) -> Pending:
    """Run the operators above the window up to the commit operator, in ``txn``."""
    if engine._inside:
        reads = list(dep)
        out = engine._apply(engine._inside, Event(row, ts, lwm), txn, reads)
        value = out.value if out is not None else None
    else:
        reads, value = dep, row
    return Pending(value, tuple(reads), engine._state(txn, reads) if state else (0, 0), n, lwm)


def run_count(engine: CQEngine) -> None:
    """Count-based windows: one unit per window of ``r`` output events, sliding by ``s``."""
    w = engine.window
    assert isinstance(w, WindowAgg)
    while not engine._stopped():
        start, n = engine._start, engine._windows

        def fill(txn: Transaction | None, start: int = start, n: int = n) -> Any:
            used: list[Entry] = []
            acc: list[Entry] = []
            i = start
            end, r = engine._off + len(engine._input), w.r
            queue, get_entry = engine._queue, engine._entry
            naive = not engine._transactional
            # an entry checked by the transaction that handed all its reads on to
            # this one is current as it is (what _entry does first, without the call)
            kept = engine.strategy.hand.kept_from if engine._fast else -3
            attempt = engine._attempt
            # snapshot, nothing committed since the previous window found its reads
            # current: an entry checked since then shows its snapshot's versions
            # (what _entry does for it, without the call)
            quiet_from = engine._prev if engine._quiet_now and engine._snapshot else 1 << 62
            while len(acc) < r:
                if i >= end or ((i - start) % 4096 == 4095 and engine._stopped()):
                    # the input ends inside the window (or the run's time is up in a
                    # window that takes long to fill): wait for more
                    return None
                entry = queue.get(i)  # naive: the synopsis as it is
                if entry is None or not (
                    naive or entry.checked == kept or entry.checked >= quiet_from
                ):
                    entry = get_entry(i, txn)
                elif not naive:
                    entry.checked = attempt
                used.append(entry)
                i += 1
                if entry.out is not None:
                    acc.append(entry)
            try:
                values = (
                    [float(e.out.value[w.column]) for e in acc if e.out is not None]
                    if (w.aggregate != "count")
                    else [0.0] * len(acc)
                )
            except (KeyError, TypeError, ValueError):
                raise _not_numeric(w, [e.out.value for e in acc if e.out]) from None
            dep = [r for e in used for r in e.reads]
            last = acc[-1].ts
            pending = window_row(
                engine, txn, n, start, last, {"window": n, "value": w.compute(values)}, dep
            )
            nxt = acc[w.s].ts if w.s < w.r else i
            return used, pending, nxt

        done, attempts = engine.strategy.transact(fill, _carry_count)
        if done is None:
            return
        _, pending, nxt = done
        engine._windows += 1
        engine.stats.windows += 1
        engine._start = nxt
        engine._prune(nxt)
        engine._emit(pending, attempts)
        if engine._on_commit is not None:
            engine._on_commit(n)


def event_time(engine: CQEngine, ts: int) -> float:
    """The time of input event ``ts`` (its index without a time column)."""
    row = engine._input[ts - engine._off]
    column = engine._branches[0].time_column
    return float(ts if column is None else row[column])


def run_time(engine: CQEngine) -> None:
    """Time-based windows (and window joins): one unit per window of ``r`` time units."""
    w = engine.window
    assert w is not None
    while not engine._stopped():
        if engine._wstart is None:
            if not engine._input:
                return
            engine._t0 = engine._wstart = event_time(engine, engine._off)
        end = engine._wstart + w.r
        base, n = engine._base, engine._windows
        # window k starts at t0 + k*s, computed so (adding s to the previous start
        # would round at every window and drift off the definition)
        nxt_start = engine._t0 + (n + 1) * w.s

        def carry(out: Any, nxt_start: float = nxt_start) -> list[Entry]:
            """The entries of the next window: from its start on."""
            return [e for e in out[0] if event_time(engine, e.ts) >= nxt_start]

        def fill(txn: Transaction | None, end: float = end, base: int = base, n: int = n) -> Any:
            used: list[Entry] = []
            i = base
            while True:
                if i >= engine._off + len(engine._input) or (
                    (i - base) % 4096 == 4095 and engine._stopped()
                ):
                    return None  # wait for an event past the window's end
                if event_time(engine, i) >= end:
                    break
                used.append(engine._entry(i, txn))
                i += 1
            if isinstance(w, WindowAgg):
                outs = [e.out for e in used if e.out is not None]
                try:
                    values = (
                        [float(o.value[w.column]) for o in outs]
                        if w.aggregate != "count"
                        else [0.0] * len(outs)
                    )
                except (KeyError, TypeError, ValueError):
                    raise _not_numeric(w, [o.value for o in outs]) from None
                dep = [r for e in used for r in e.reads]
                last = used[-1].ts if used else i
                return used, [
                    window_row(
                        engine, txn, n, base, last, {"window": n, "value": w.compute(values)}, dep
                    )
                ]
            pendings = []
            window_reads = [r for e in used for r in e.reads]
            left = [e for e in used if e.branch == 0 and e.out is not None]
            right = [e for e in used if e.branch == 1 and e.out is not None]
            right_keys = [_join_key(w, "right", w.right_key, e) for e in right]
            for le in left:
                assert le.out is not None
                key = _join_key(w, "left", w.left_key, le)
                for re_, right_key in zip(right, right_keys, strict=True):
                    assert re_.out is not None
                    if right_key == key:
                        row = {
                            **le.out.value,
                            **{w.prefix + c: v for c, v in re_.out.value.items()},
                        }
                        lwm = min(le.ts, re_.ts)  # the window's reads are added below
                        pendings.append(
                            window_row(engine, txn, n, lwm, max(le.ts, re_.ts), row, [], False)
                        )
            # every result of the window is an output of the window's one
            # transaction and reports its whole read set: the reads of events that
            # formed no pair, and of pairs dropped above the join, decided that too
            reads = window_reads + [r for p in pendings for r in p.reads]
            state = engine._state(txn, reads)
            for p in pendings:
                p.reads, p.state = tuple(reads), state
            return used, pendings

        done, attempts = engine.strategy.transact(fill, carry)
        if done is None:
            return
        engine._windows += 1
        engine.stats.windows += 1
        engine._wstart = start = nxt_start
        j = engine._base
        while j < engine._off + len(engine._input) and event_time(engine, j) < start:
            j += 1
        engine._prune(j)
        for pending in done[1]:
            engine._emit(pending, attempts)
        if engine._on_commit is not None:
            engine._on_commit(n)


def no_column(what: str, column: str, value: Row) -> CQError:
    """An event reached ``what`` without the ``column`` it needs."""
    return CQError(
        f"{what}: an event has no column {column!r} (it has {tuple(value)}); a Project below "
        "must give the columns it declares, and each row of a joined table the columns of "
        "its table"
    )


def _not_numeric(w: WindowAgg, rows: list[Row]) -> CQError:
    """The error for a window whose aggregated column is missing or not a number.

    The tables give the engine column names, not types: this is found when the
    first such value reaches the window (its transaction is aborted).
    """
    for row in rows:
        if w.column not in row:
            return CQError(
                f"window {w.name!r}: an event has no column {w.column!r} (it has "
                f"{tuple(row)}); a Project below the window must give the columns it declares"
            )
        try:
            float(row[w.column])
        except (TypeError, ValueError):
            return CQError(
                f"window {w.name!r}: {w.aggregate} of {w.column!r} needs numbers, got "
                f"{row[w.column]!r:.40}; aggregate a numeric column (or use count)"
            )
    return CQError(f"window {w.name!r}: cannot aggregate {w.column!r}")  # (not reached)


def _join_key(w: WindowJoin, side: str, column: str, entry: Entry) -> Any:
    """The key of a window join's input event; :class:`CQError` if it has none."""
    assert entry.out is not None
    try:
        return entry.out.value[column]
    except KeyError:
        err = no_column(f"window join {w.name!r}", column, entry.out.value)
        raise CQError(str(err).replace("an event", f"an event of its {side} input", 1)) from None


def _carry_count(out: Any) -> list[Entry]:
    """Count-based windows: the entries of the next window (it starts at ``out[2]``)."""
    used, _, nxt = out
    # used holds the events start, start + 1, ... of the window, in order
    return used[nxt - used[0].ts :] if used else []


__all__ = ["event_time", "no_column", "run_count", "run_per_event", "run_time", "window_row"]
