"""Continuous queries as operator trees, and the events that flow through them.

Oyamada, Kawashima and Kitagawa, *Continuous Query Processing with Concurrency
Control* (SAC 2013).  An operator tree has stream sources at its leaves; its
operators are

* stateless: :class:`Select`, :class:`Project`;
* **reference operators**, which read a non-streaming resource (a txstream
  table that other systems update): :class:`RefJoin` (stream-table equi-join)
  and :class:`Reference` (apply a resource held in a table row, e.g. a model);
* **window-based operators**: :class:`WindowAgg` (COUNT/SUM/AVG/MIN/MAX over
  count- or time-based windows of range ``r`` and slide ``s``; overlapping when
  ``s < r``) and :class:`WindowJoin` (stream-stream equi-join of two inputs
  over time-based windows).

An :class:`Event` carries its timestamp, its low water-mark (LWM, Definition
4.1: the lowest input timestamp it depends on) and the reads it depends on:
``refs`` is TXN(e) of Definition 3.1, the union of REF over its dependencies
(DEP, Definition 2.2), each read as ``(table, key, version, seen)``: the row's
version is the commit timestamp of the row version read (``DIRTY`` for an
uncommitted row), ``seen`` an instant at which that version was known to be the
committed one.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

from txstream.errors import TxStreamError

Row = dict[str, Any]

DIRTY = -1
"""The version recorded for a read that saw an uncommitted (or not yet installed) row."""

Read = tuple[str, Any, int, int]
"""One reference: (table, key, version read, an instant at which that version was current)."""


class CQError(TxStreamError, ValueError):
    """A continuous query is malformed (unknown table or column, bad window, ...)."""


class Event(NamedTuple):
    """A stream event ``<s, t>`` with its LWM and the resource reads it depends on.

    A named tuple: immutable like before, and cheap to build on the per-event path.
    """

    value: Row
    ts: int
    lwm: int
    refs: tuple[Read, ...] = ()


class Operator:
    """A node of an operator tree; ``name`` is stable and unique within a query."""

    kind: ClassVar[str] = "operator"
    is_reference: ClassVar[bool] = False
    is_window: ClassVar[bool] = False

    def __init__(self, name: str, *children: Operator) -> None:
        if not name:
            raise CQError("every operator needs a name")
        for child in children:
            if not isinstance(child, Operator):  # else an AttributeError when it runs
                raise CQError(
                    f"operator {name!r}: its input must be an operator (e.g. Source(name, "
                    f"columns)), got {type(child).__name__} {child!r:.40}"
                )
        self.name = name
        self.children = list(children)

    def walk(self) -> list[Operator]:
        """The operator and everything below it, parents before children."""
        out: list[Operator] = [self]
        for c in self.children:
            out.extend(c.walk())
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def _whole(x: Any) -> bool:
    """A whole number (numpy's too) and not a bool (``True`` would pass for a range of 1)."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _window(r: Any, s: Any) -> tuple[int, int]:
    """A window's range ``r`` and slide ``s`` (``r`` when None), checked, as Python ints.

    Whole numbers of numpy or pandas become ints; :class:`CQError` unless both
    are positive and the slide is no larger than the range.
    """
    if s is None:
        s = r
    r, s = (int(r) if _whole(r) else r), (int(s) if _whole(s) else s)
    if not _whole(r) or not _whole(s) or r < 1 or s < 1:
        raise CQError(f"window range and slide must be positive integers, got r={r}, s={s}")
    if s > r:
        raise CQError(f"window slide {s} is larger than its range {r}: events would be lost")
    return r, s


def _callable(name: str, what: str, fn: Any) -> None:
    """:class:`CQError` unless ``fn`` can be called (a SQL string, say, cannot)."""
    if not callable(fn):
        raise CQError(
            f"operator {name!r}: {what} must be a function of the event's value (e.g. "
            f"lambda v: v['price'] <= 50), got {type(fn).__name__} {fn!r:.40}"
        )


class Source(Operator):
    """A leaf: a raw input stream of the query."""

    kind = "source"

    def __init__(self, name: str, columns: tuple[str, ...]) -> None:
        super().__init__(name)
        if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
            raise CQError(
                f"source {name!r}: columns must be a tuple of names, e.g. ('id', 'part'); "
                f"got {columns!r:.60}"
            )
        self.columns = tuple(columns)


class Select(Operator):
    """Keep the events whose value satisfies ``predicate``."""

    kind = "select"

    def __init__(self, name: str, child: Operator, predicate: Callable[[Row], bool]) -> None:
        super().__init__(name, child)
        _callable(name, "predicate", predicate)
        self.predicate = predicate


class Project(Operator):
    """Map each event's value with ``fn``, which yields the ``columns`` named."""

    kind = "project"

    def __init__(
        self, name: str, child: Operator, fn: Callable[[Row], Row], columns: tuple[str, ...]
    ) -> None:
        super().__init__(name, child)
        _callable(name, "fn", fn)
        self.fn = fn
        self.columns = columns


class RefJoin(Operator):
    """Equi-join each event with the row of ``table`` whose key is ``value[key]``.

    The row's columns are added to the event (prefixed by ``prefix``; a
    table column that would replace a column of the stream is refused when
    the engine is built); an event without a matching row is dropped (inner
    join).
    """

    kind = "refjoin"
    is_reference = True

    def __init__(self, name: str, child: Operator, table: str, key: str, prefix: str = "") -> None:
        super().__init__(name, child)
        self.table = table
        self.key = key
        self.prefix = prefix


class Reference(Operator):
    """Apply a resource held in one row of a table (e.g. a classifier) to each event.

    ``apply(value, resource)`` returns the new value (with ``columns`` added)
    or None to drop the event.
    """

    kind = "reference"
    is_reference = True

    def __init__(
        self,
        name: str,
        child: Operator,
        table: str,
        key: Any,
        apply: Callable[[Row, Any], Row | None],
        columns: tuple[str, ...] = (),
    ) -> None:
        super().__init__(name, child)
        _callable(name, "apply", apply)
        try:
            hash(key)
        except TypeError:  # else a TypeError from inside the engine when it ran
            raise CQError(
                f"operator {name!r}: key {key!r:.40} cannot key a row (give a number, a "
                "string or a tuple)"
            ) from None
        self.table = table
        self.key = key
        self.apply = apply
        self.columns = columns


AGGREGATES = ("count", "sum", "avg", "min", "max")


class WindowAgg(Operator):
    """An aggregate of ``column`` over windows of range ``r`` and slide ``s``.

    Count-based by default (``r`` and ``s`` count events); with ``time_column``
    time-based: window ``k`` holds the events whose ``time_column`` lies in
    ``[t0 + k*s, t0 + k*s + r)``, ``t0`` being the first event's time (the
    column must come from the source, in non-decreasing order).
    """

    kind = "window"
    is_window = True

    def __init__(
        self,
        name: str,
        child: Operator,
        aggregate: str,
        column: str,
        r: int,
        s: int | None = None,
        *,
        time_column: str | None = None,
    ) -> None:
        super().__init__(name, child)
        if aggregate not in AGGREGATES:
            raise CQError(
                f"unknown aggregate {aggregate!r}; choose one of: {', '.join(AGGREGATES)}"
            )
        r, s = _window(r, s)
        self.aggregate = aggregate
        self.column = column
        self.r = r
        self.s = s
        self.time_column = time_column

    def compute(self, values: list[float]) -> float | None:
        """The aggregate of one window's values."""
        if self.aggregate == "count":
            return float(len(values))
        if not values:
            return None
        if self.aggregate == "sum":
            return float(sum(values))
        if self.aggregate == "avg":
            return sum(values) / len(values)
        return float(min(values) if self.aggregate == "min" else max(values))


class WindowJoin(Operator):
    """Stream-stream equi-join of two inputs over time-based windows (window-based).

    Window ``k`` holds the input events whose time lies in
    ``[t0 + k*s, t0 + k*s + r)``: the raw input position, or ``time_column`` of
    both sources (non-decreasing), ``t0`` being the first input event's time.
    Each pair of a left and a right event of one window with
    ``left[left_key] == right[right_key]`` is output once per window, the right
    event's columns prefixed by ``prefix``.
    """

    kind = "window-join"
    is_window = True

    def __init__(
        self,
        name: str,
        left: Operator,
        right: Operator,
        left_key: str,
        right_key: str,
        r: int,
        s: int | None = None,
        *,
        prefix: str = "r_",
        time_column: str | None = None,
    ) -> None:
        super().__init__(name, left, right)
        r, s = _window(r, s)
        self.left_key = left_key
        self.right_key = right_key
        self.r = r
        self.s = s
        self.prefix = prefix
        self.time_column = time_column


@dataclass
class Result:
    """One output of the query and the row versions its CQ-derived transaction read.

    ``versions`` holds one ``(table, key, version)`` per distinct row version
    read (``version`` is the commit timestamp of the row version, ``DIRTY`` for
    an uncommitted row); ``state`` is the range ``[lo, hi]`` of instants
    (commit timestamps) at which every one of those versions was the committed
    one, as far as the engine could establish. ``row`` is the whole output row;
    ``value`` its ``"value"`` column (a window aggregate) or the row itself.
    """

    value: Any
    window: int
    lwm: int
    versions: frozenset[Any] = field(default_factory=frozenset)
    attempts: int = 1
    state: tuple[int, int] | None = None
    row: Row | None = None

    @property
    def consistent(self) -> bool:
        """Its reads saw one state of the tables: some instant at which all were current.

        Results built by hand without ``state`` (table-level versions, e.g.
        plain Spark's) are consistent when each row, or the table, was seen at
        one version.
        """
        if self.state is not None:
            return self.state[0] <= self.state[1]
        seen: dict[Any, Any] = {}
        for v in self.versions:
            row, version = (v[:2], v[2]) if isinstance(v, tuple) else (None, v)
            if version == DIRTY or seen.setdefault(row, version) != version:
                return False
        return True

    def rows(self) -> dict[tuple[str, Any], frozenset[int]]:
        """Per (table, key): the versions of that row the result's transaction read."""
        out: dict[tuple[str, Any], set[int]] = {}
        for v in self.versions:
            if isinstance(v, tuple):
                out.setdefault((v[0], v[1]), set()).add(v[2])
        return {k: frozenset(vs) for k, vs in out.items()}

    def tables(self) -> frozenset[str]:
        """The referenced tables it read."""
        return frozenset(v[0] for v in self.versions if isinstance(v, tuple))
