"""Sliding-window queries and their evaluation by window scan (WS) or summary scan (SS).

A :class:`Query` computes one aggregate over the ``length`` youngest
sub-windows (``1 <= length <= n``).  Aggregates, by name:

* ``count``, ``sum``, ``avg``, ``min``, ``max`` of a numeric attribute, optionally
  restricted to tuples whose ``attr`` value is in ``subset`` (the snapshot
  queries of Section 5: simple aggregates over random address subsets);
* ``topk``: the ``k`` values of ``attr`` with the largest total ``measure``
  (heavy sources or destinations);
* ``percentile``: the ``p``-th percentile (nearest rank) of the per-value totals
  of ``attr`` (bandwidth consumed by distinct addresses);
* ``count-distinct``: how many distinct values of ``attr``.

A :class:`QueryGroup` evaluates similar queries (same aggregate and attribute)
over different window lengths together: one scan of the youngest
``max(length)`` sub-windows, each sub-window's partial result kept apart, so
each query merges the partials of its own ``length`` youngest sub-windows,
youngest to oldest, at the end.  Partials may arrive in any order (the TTU
scheduler reads out of age order); the age ranks are fixed when the answer is
computed, from the sub-window versions read.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from txstream.windows.base import WindowError
from txstream.windows.window import SlidingWindow, SubWindow

AGGREGATES: tuple[str, ...] = (
    "count",
    "sum",
    "avg",
    "min",
    "max",
    "topk",
    "percentile",
    "count-distinct",
)
_SIMPLE = {"count", "sum", "avg", "min", "max"}


@dataclass(frozen=True)
class Query:
    """One aggregate over the ``length`` youngest sub-windows."""

    aggregate: str
    length: int
    attr: str = "src"
    value: str = "size"
    k: int = 10
    p: float = 50.0
    subset: frozenset[Any] | None = None

    def __post_init__(self) -> None:
        # A subset is a set of attribute values; any collection of them will do.
        subset = self.subset
        if subset is not None and not isinstance(subset, frozenset):
            if isinstance(subset, str | bytes) or not isinstance(subset, Iterable):
                raise WindowError(
                    f"subset is a set of {self.attr} values, not {type(subset).__name__} {subset!r}"
                )
            try:
                object.__setattr__(self, "subset", frozenset(subset))
            except TypeError:
                raise WindowError(
                    f"subset holds values of {self.attr}, which must be hashable: {subset!r}"
                ) from None

    def validate(self, window: SlidingWindow) -> None:
        """Raise :class:`WindowError` if this query cannot run on ``window``."""
        if not isinstance(self.aggregate, str) or self.aggregate not in AGGREGATES:
            raise WindowError(
                f"unknown aggregate {self.aggregate!r}; choose one of: {', '.join(AGGREGATES)}"
            )
        if not _whole(self.length) or not 1 <= self.length <= window.n:
            raise WindowError(
                f"query window of {self.length} sub-windows is longer than the window "
                f"(n={window.n}) or empty"
            )
        if self.aggregate not in _SIMPLE or self.subset is not None:
            window.field(self.attr)  # (a plain count/sum/... does not group: attr unused)
        window.field(self.value)
        if self.subset is not None and self.aggregate not in ("count", "sum", "avg"):
            raise WindowError(
                f"{self.aggregate} over an address subset is not supported; use count, sum or avg"
            )
        if self.aggregate in _SIMPLE and self.subset is None:
            if self.value not in dict(window.numeric):
                raise WindowError(f"{self.value!r} is not a summarised numeric attribute")
        elif self.attr not in dict(window.groups):
            raise WindowError(f"{self.attr!r} is not a summarised grouping attribute")
        if self.aggregate == "topk" and (not _whole(self.k) or self.k < 1):
            raise WindowError(f"top-k needs a whole number k >= 1, got {self.k!r}")
        if self.aggregate == "percentile" and (
            not isinstance(self.p, int | float) or isinstance(self.p, bool) or not 0 < self.p <= 100
        ):
            raise WindowError(f"percentile needs a number 0 < p <= 100, got {self.p!r}")


Partial = Any  # the per-sub-window partial result of one group


class QueryGroup:
    """Similar queries evaluated together by one read-only transaction per execution.

    ``mode`` is ``"ss"`` (summary scan, the default) or ``"ws"`` (window scan:
    read every tuple).  :meth:`partial` reads one sub-window and returns the
    partial result and its cost in *work units* (summary entries or tuples
    touched), which the simulation turns into time.  ``cost="tuples"`` charges
    the window scan of the paper's experiment whatever the mode: every tuple of
    the sub-window put into a hash table, plus the table's entries merged into
    the group's answer (a per-read cost that hardly depends on the sub-window's
    size), computed from the summary, which holds exactly that hash table.  ``scope`` is what one
    execution reads: the youngest ``max(length)`` sub-windows (``"length"``) or
    the whole window (``"window"``, as the experiment's full scans do).
    """

    def __init__(
        self,
        queries: Sequence[Query],
        window: SlidingWindow,
        mode: str = "ss",
        name: str = "",
        *,
        cost: str = "work",
        scope: str = "length",
    ) -> None:
        if not isinstance(window, SlidingWindow):
            raise WindowError(f"a query group runs on a SlidingWindow, not {window!r}")
        if isinstance(queries, Query) or not isinstance(queries, Sequence):
            raise WindowError(f"a query group takes a list of Query objects, not {queries!r}")
        if not queries:
            raise WindowError("a query group needs at least one query")
        for q in queries:
            if not isinstance(q, Query):
                raise WindowError(f"a query group takes Query objects, not {q!r}")
        if mode not in ("ss", "ws"):
            raise WindowError(f"unknown evaluation mode {mode!r}; choose ss or ws")
        if cost not in ("work", "tuples"):
            raise WindowError(f"unknown cost {cost!r}; choose work or tuples")
        if scope not in ("length", "window"):
            raise WindowError(f"unknown scope {scope!r}; choose length or window")
        self.cost = cost
        self.scope = scope
        first = queries[0]
        measure = window.fields[window.measure]
        for q in queries:
            q.validate(window)
            if mode == "ss" and q.value != measure and _sums_measure(q):
                raise WindowError(
                    f"{q.aggregate} of {q.value!r} per {q.attr!r} value: the summaries keep "
                    f"per-value sums of the window's measure {measure!r} only; use "
                    f"value={measure!r}, or mode='ws' (window scan)"
                )
            if _shares(q) != _shares(first):
                raise WindowError(
                    "queries of one group must read the same partial results: simple "
                    "aggregates of one attribute (and subset), or top-k / percentile / "
                    "count-distinct of one attribute"
                )
        self.queries = list(queries)
        self.window = window
        self.mode = mode
        self.name = name or f"{first.aggregate}({first.attr})"
        self.length = window.n if scope == "window" else max(q.length for q in queries)
        self._attr = -1 if self._uses_no_attr(first) else window.field(first.attr)
        self._value = window.field(first.value)
        self._simple = first.aggregate in _SIMPLE
        self._subset = first.subset

    @property
    def scans(self) -> bool:
        """Whether this group's work units are scanned tuples rather than hash-table operations.

        Simple aggregates (count, sum, avg, min, max; the snapshot queries)
        charged per tuple (``cost="tuples"`` or a window scan) read a field,
        test the address subset and add: a scan.  Top-k, percentile and
        count-distinct build a hash table on their attribute, as do reads
        charged by summary work (``cost="work"``: each unit a lookup).
        :meth:`Costs.rate <txstream.windows.engine.Costs.rate>` prices the two.
        """
        return self._simple and (self.mode == "ws" or self.cost == "tuples")

    @classmethod
    def snapshot(
        cls, query: Query, window: SlidingWindow, mode: str, cost: str, scope: str
    ) -> QueryGroup:
        """A snapshot query's group of one, named ``snapshot:AGG(ATTR)`` (metrics, histories)."""
        return cls(
            [query],
            window,
            mode,
            f"snapshot:{query.aggregate}({query.attr})",
            cost=cost,
            scope=scope,
        )

    @staticmethod
    def _uses_no_attr(q: Query) -> bool:
        return q.aggregate in _SIMPLE and q.subset is None

    # -- one sub-window -----------------------------------------------------------------

    def partial(self, sub: SubWindow) -> tuple[Partial, int]:
        """The partial result of one sub-window, and the work it took.

        The work is summary entries touched under ``ss`` and tuples under ``ws``.
        """
        q = self.queries[0]
        if self.mode == "ws":
            return self._scan(sub), max(1, len(sub.tuples))
        if self.cost == "tuples":
            part, entries = self._summary_partial(sub, q)
            return part, max(1, len(sub.tuples)) + entries
        return self._summary_partial(sub, q)

    def _summary_partial(self, sub: SubWindow, q: Query) -> tuple[Partial, int]:
        if self._simple and self._subset is None:
            s = sub.summary
            a = q.value
            return (s.count, s.sums.get(a, 0.0), s.mins.get(a), s.maxs.get(a)), 1
        counts = sub.summary.distinct.get(q.attr, {})
        if self._simple:  # restricted to a subset: look each member up
            assert self._subset is not None
            c = total = 0.0
            for v in self._subset:
                slot = counts.get(v)
                if slot is not None:
                    c += slot[0]
                    total += slot[1]
            return (c, total, None, None), max(1, len(self._subset))
        return counts, max(1, len(counts))

    def _scan(self, sub: SubWindow) -> Partial:
        a, v = self._attr, self._value
        if self._simple:
            rows = (
                sub.tuples
                if self._subset is None
                else [r for r in sub.tuples if r[a] in self._subset]
            )
            values = [float(r[v]) for r in rows]
            return (
                len(values),
                sum(values),
                min(values) if values else None,
                max(values) if values else None,
            )
        counts: dict[Any, list[float]] = {}
        for r in sub.tuples:
            slot = counts.setdefault(r[a], [0.0, 0.0])
            slot[0] += 1
            slot[1] += float(r[v])
        return counts

    # -- the answers --------------------------------------------------------------------

    def answers(self, partials: Sequence[Partial]) -> list[Any]:
        """Each query's answer from the partials ordered youngest first.

        One pass from youngest to oldest: the merge of the ``l`` youngest
        partials is reused for the queries over longer windows (Figure 2).
        """
        order = sorted(range(len(self.queries)), key=lambda k: self.queries[k].length)
        out: list[Any] = [None] * len(self.queries)
        if self._simple:
            acc: Any = (0.0, 0.0, None, None)
        else:
            acc = {}
        done = 0
        for k in order:
            q = self.queries[k]
            for part in partials[done : q.length]:
                acc = self._fold(acc, part)
            done = max(done, q.length)
            out[k] = self._finish(q, acc)
        return out

    def _fold(self, acc: Any, part: Partial) -> Any:
        if self._simple:
            lo = [x for x in (acc[2], part[2]) if x is not None]
            hi = [x for x in (acc[3], part[3]) if x is not None]
            return (
                acc[0] + part[0],
                acc[1] + part[1],
                min(lo, default=None),
                max(hi, default=None),
            )
        for value, slot in part.items():
            acc[value] = acc.get(value, 0.0) + slot[1]
        return acc

    def _finish(self, q: Query, acc: Any) -> Any:
        if self._simple:
            count, total, lo, hi = acc
            if q.aggregate == "count":
                return int(count)
            if q.aggregate == "sum":
                return total
            if q.aggregate == "avg":
                return total / count if count else None
            return lo if q.aggregate == "min" else hi
        merged: dict[Any, float] = acc
        if q.aggregate == "count-distinct":
            return len(merged)
        if q.aggregate == "topk":
            ranked = sorted(merged.items(), key=lambda kv: (-kv[1], str(kv[0])))
            return ranked[: q.k]
        totals = sorted(merged.values())
        if not totals:
            return None
        # Nearest rank, ceil(p * N / 100), in exact arithmetic on p as written:
        # in floats 7 / 100 * 100 is 7.000000000000001, which ranked one too high.
        rank = max(1, math.ceil(Fraction(repr(float(q.p))) * len(totals) / 100))
        return totals[rank - 1]


def _whole(value: object) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def _sums_measure(q: Query) -> bool:
    """Whether a summary scan answers ``q`` from the per-value sums of the measure."""
    if q.aggregate in ("topk", "percentile"):
        return True
    return q.subset is not None and q.aggregate in ("sum", "avg")


def _shares(q: Query) -> tuple[Any, ...]:
    """What a query's per-sub-window partial result depends on."""
    if q.aggregate in _SIMPLE:
        # a subset is a set of values of attr: the same subset of another attr differs
        return (True, q.value, q.subset, None if q.subset is None else q.attr)
    return (False, q.attr, q.value)


def evaluate_directly(group: QueryGroup, subs: Sequence[SubWindow]) -> list[Any]:
    """The group's answers over ``subs`` (youngest first), by a plain window scan.

    The oracle that tests compare the engine's answers with: no summaries, no
    partial-result bookkeeping, no scheduling.
    """
    scan = QueryGroup(group.queries, group.window, mode="ws", name=group.name, scope=group.scope)
    return scan.answers([scan._scan(s) for s in subs])
