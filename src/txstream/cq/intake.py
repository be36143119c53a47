"""Raw input events as a continuous query's engine takes them: checked before any runs.

A malformed event is refused (one :class:`~txstream.cq.base.CQError` naming
the first) before any event of its call runs: a row that is not a dict with
its source's columns, a (source, row) pair of an unknown source, and for a
window on a time column a time that is not a number or goes back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any

from txstream.cq.base import CQError, Row

if TYPE_CHECKING:
    from txstream.cq.engine import CQEngine

# keys >= columns: a row has all of its source's columns (see tag)
_KEYS_GE: Callable[[Any, Any], bool] = type({}.keys()).__ge__


def tag(engine: CQEngine, events: Sequence[Any]) -> tuple[list[Row], list[int]]:
    """The raw rows and, with several sources, the branch of each.

    Malformed events are refused here, before any of them runs (one
    :class:`CQError` naming the first): a row that is not a dict with its
    source's columns, and for a window on a time column a time that is
    not a number or goes back.
    """
    if isinstance(events, Mapping | str):
        raise CQError(
            f"events must be a sequence of events, got one {type(events).__name__}; "
            "pass a list (e.g. [row])"
        )
    if not isinstance(events, Iterable):
        raise CQError(
            f"events must be a sequence of events, got {type(events).__name__} "
            f"{events!r:.40}; pass a list (e.g. [row])"
        )
    if len(engine.sources) == 1:
        rows = list(events)
        need = engine._need[0]
        try:  # all dicts with the source's columns (the usual case, checked at C speed)
            ok = all(map(_KEYS_GE, map(dict.keys, rows), repeat(need)))
        except TypeError:  # not a dict
            ok = False
        if not ok:
            for i, row in enumerate(rows):
                check_row(engine, row, 0, engine._off + len(engine._input) + i)
        check_times(engine, rows)
        return rows, []
    rows, branches = [], []
    for i, e in enumerate(events):
        if not (isinstance(e, tuple) and len(e) == 2 and e[0] in engine._names):
            raise CQError(
                f"a query with several sources takes (source, row) pairs with a source in "
                f"{sorted(engine._names)}; got {e!r:.80}"
            )
        branch = engine._names[e[0]]
        row = e[1]
        if row.__class__ is not dict or not row.keys() >= engine._need[branch]:
            check_row(engine, row, branch, engine._off + len(engine._input) + i)
        branches.append(branch)
        rows.append(row)
    check_times(engine, rows)
    return rows, branches


def check_row(engine: CQEngine, row: Any, branch: int, ts: int) -> None:
    """:class:`CQError` unless ``row`` is a dict with the columns of its source."""
    src = engine.sources[branch]
    if not isinstance(row, dict):
        hint = (
            "; a query with one source takes its rows, not (source, row) pairs"
            if isinstance(row, tuple) and len(row) == 2 and row[0] == src.name
            else ""
        )
        raise CQError(
            f"event {ts} of source {src.name!r} must be a dict of its columns "
            f"{src.columns}, got {type(row).__name__} {row!r:.60}{hint}"
        )
    missing = [c for c in src.columns if c not in row]
    if missing:
        raise CQError(
            f"event {ts} of source {src.name!r} has no column {missing[0]!r}; give every "
            f"event the source's columns {src.columns} (it has {tuple(row)})"
        )


def check_times(engine: CQEngine, rows: list[Row]) -> None:
    """A window on a time column: times are numbers that never go back."""
    column = engine._branches[0].time_column
    if column is None or not rows:
        return
    prev = engine._input[-1][column] if engine._input else -math.inf
    for i, row in enumerate(rows):
        t = row[column]
        # (not t >= prev: a NaN is refused too)
        if not isinstance(t, int | float) or isinstance(t, bool) or not t >= prev:
            what = (
                f"is {t!r}, not a number"
                if not isinstance(t, int | float) or isinstance(t, bool) or t != t
                else f"goes back from {prev!r} to {t!r}"
            )
            raise CQError(
                f"event {engine._off + len(engine._input) + i}: time column {column!r} {what}; "
                "a time-based window needs numeric times in non-decreasing order (sort "
                "the events)"
            )
        prev = t


__all__ = ["check_row", "check_times", "tag"]
