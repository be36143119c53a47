"""Totals for global reads: exact partial sums per partition, added across partitions.

A global read (``Tx.sum``, ``Tx.count``; an input declared with
``global_reads``) needs, at its place in the order, the total of a column over
every partition.  Each partition contributes a *partial*:

    [int sum, float sum in units of 2**-1074, floats, +inf, -inf, NaN, rows, others]

(the last six are counts; ``others``: values that are neither a number nor null,
which make the read fail).  Every finite double is a whole multiple of
2**-1074, so float values are summed exactly and a total does not depend on how
the rows are split into partitions, nor on the order of additions; because
every member is a sum or a count, a value can be taken out again exactly.

That is what makes a partition's partial cheap to keep: the first global read
of a batch counts the partition's rows (:func:`partial_totals`), and from then
on every write of the batch adds the new row and takes out the old one
(:func:`track`), so later reads cost nothing per row.  A value that is not a
number (or null) is counted as such, so that a partial stays exact through any
writes (a read fails while one is there, as counting the rows would): a
partition that runs transactions past a global read keeps their changes apart
and adds them in afterwards (``forward``), which needs partials that never
stop being kept.

A row lent by another partition to a transaction homed here is not counted
here (``forward.messages``): it stays counted at its lender, which counts its
change when the answer comes back.

Ownership: the partials live in ``PartitionState.tracked``, owned by the task
that runs the partition's batch; only the writes of that task change them.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from fractions import Fraction
from itertools import chain
from operator import itemgetter
from typing import Any

EXACT = 2**1074
"""Every finite double is a whole multiple of 2**-1074: float totals are summed exactly
in these units, so a total does not depend on how rows are split into partitions."""

Partial = list[Any]
"""``[ints, exact, floats, pinf, ninf, nan, rows, others]`` (see the module docstring)."""

OTHERS = 7
"""The index of a partial's count of values that are neither a number nor null."""

Tracked = dict[str, list[tuple[str | None, Partial]]]
"""Per table, the partials kept up to date by its writes: (column, partial)."""


def _add(partial: Partial, x: Any, sign: int) -> bool:
    """Add (``sign`` 1) or take out (-1) one value; False when it is not a number or null."""
    kind = type(x)
    if kind is int or kind is bool:
        partial[0] += sign * x
    elif kind is float:
        partial[2] += sign
        if x - x == 0.0:
            n, d = x.as_integer_ratio()
            partial[1] += sign * n * (EXACT // d)
        elif x != x:
            partial[5] += sign
        elif x > 0:
            partial[3] += sign
        else:
            partial[4] += sign
    elif x is not None:
        return False
    return True


def count_rows(
    by_value: Mapping[Any, Any], column: str | None, flat: bool = False
) -> Partial | None:
    """The partial of one table's rows here (``by_value``: value -> key -> row).

    ``flat``: ``by_value`` is key -> row (a flat table, see ``PartitionState.flat``).
    None when a value of ``column`` is neither a number nor null.
    """
    count = len(by_value) if flat else sum(map(len, by_value.values()))
    partial: Partial = [0, 0, 0, 0, 0, 0, count, 0]
    if column is None:
        return partial
    # Every row of the partition, read in C when the column holds integers only
    # (an audit reads them all); nulls, floats or a row without it: one by one.
    every: Any = dict.values
    rows: Any = by_value.values() if flat else chain.from_iterable(map(every, by_value.values()))
    try:
        total = sum(map(itemgetter(column), rows))
    except (TypeError, KeyError):
        total = None
    if type(total) is int:
        partial[0] = total
        return partial
    rows = by_value.values() if flat else chain.from_iterable(map(every, by_value.values()))
    for row in rows:
        if not _add(partial, row.get(column), 1):
            return None
    return partial


def partial_totals(
    data: Mapping[str, Mapping[Any, Any]],
    reads: Iterable[tuple[str, str | None]],
    tracked: Tracked | None = None,
    flat: Collection[str] = (),
) -> dict[tuple[str, str | None], Partial]:
    """One partition's part of a global read: per (table, column), its partial.

    With ``tracked`` (the partition's kept partials), a partial kept there is
    used as it is, and one counted here is kept from now on.  ``flat``: the
    tables of ``data`` kept flat, key -> row (see ``PartitionState.flat``).
    """
    out: dict[tuple[str, str | None], Partial] = {}
    for table, column in reads:
        found = _kept(tracked, table, column)
        if found is None:
            found = count_rows(data.get(table, {}), column, table in flat)
            if found is not None and tracked is not None:
                tracked.setdefault(table, []).append((column, list(found)))
        if found is None or found[OTHERS]:
            raise TypeError(f"the sum of {table}.{column}: a value is not a number")
        out[(table, column)] = list(found)
    return out


def not_a_number(state: Any, what: tuple[str, str | None]) -> Partial:
    """``what``'s partial on ``state`` (a ``PartitionState``), marked when a value is not a number.

    For a partition that sends its partial on: the read it belongs to fails at
    partition 0, in its transaction (:func:`check_numbers`).
    """
    try:
        return partial_totals(state.data, (what,), state.tracked, state.flat)[what]
    except TypeError:
        return [0, 0, 0, 0, 0, 0, 0, 1]


def check_numbers(total: Partial, table: str, column: str | None) -> Partial:
    """``total``, unless a partition found a value that is not a number in it."""
    if total[OTHERS]:
        raise TypeError(f"the sum of {table}.{column}: a value is not a number")
    return total


def keep(
    data: Mapping[str, Mapping[Any, Any]],
    reads: Iterable[tuple[str, str | None]],
    tracked: Tracked,
    flat: Collection[str] = (),
) -> bool:
    """Keep the partials of ``reads`` from now on (counted now unless kept already).

    False when a value is not a number (then what it counted is not kept).
    """
    for table, column in reads:
        if _kept(tracked, table, column) is not None:
            continue
        found = count_rows(data.get(table, {}), column, table in flat)
        if found is None:
            return False
        tracked.setdefault(table, []).append((column, found))
    return True


def _kept(tracked: Tracked | None, table: str, column: str | None) -> Partial | None:
    """The partial of ``table.column`` that ``tracked`` keeps, or None."""
    for col, partial in (tracked or {}).get(table, ()):
        if col == column:
            return partial
    return None


def track(tracked: Tracked, table: str, old: Any, new: Any) -> None:
    """A row of ``table`` changed from ``old`` to ``new`` (None: absent): keep its partials."""
    for column, partial in tracked[table]:
        if old is not None:
            if new is not None:
                if column is None:
                    continue  # (a row changed: the count stays)
                a, b = old.get(column), new.get(column)
                if type(a) is int and type(b) is int:  # (the common case, e.g. a balance)
                    partial[0] += b - a
                    continue
            else:
                partial[6] -= 1
                if column is None:
                    continue
                a, b = old.get(column), None
        elif new is None:  # (a row that was not there deleted)
            continue
        else:
            partial[6] += 1
            if column is None:
                continue
            a, b = None, new.get(column)
        if a is not None and not _add(partial, a, -1):
            partial[OTHERS] -= 1
        if b is not None and not _add(partial, b, 1):
            partial[OTHERS] += 1


def add_totals(into: dict[Any, Partial], more: Mapping[Any, Partial]) -> None:
    """Add the partials ``more`` to ``into`` (see :func:`partial_totals`)."""
    for what, partial in more.items():
        mine = into.get(what)
        if mine is None:
            into[what] = list(partial)
        else:
            for i, x in enumerate(partial):
                mine[i] += x


def finish_total(total: Partial) -> list[Any]:
    """(sum, count) of a total: an int when no float was summed, else the rounded exact sum."""
    ints, exact, floats, pinf, ninf, nan, rows, _others = total
    if not floats:
        return [ints, rows]
    if nan or (pinf and ninf):  # an infinity or NaN decides the sum, whatever the order
        return [math.nan, rows]
    if pinf or ninf:
        return [math.inf if pinf else -math.inf, rows]
    value = Fraction(ints * EXACT + exact, EXACT)
    try:
        return [float(value), rows]
    except OverflowError:  # beyond the largest double: rounded to an infinity, as IEEE does
        return [math.inf if value > 0 else -math.inf, rows]
