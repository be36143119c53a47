"""The periodically sliding window: a circular array of n sub-windows with summaries.

Golab et al., Section 2: a window of time-length ``n*t`` (or ``n*b`` tuples) is
stored as ``n`` sub-windows; a *window update* (slide ``T_j``) replaces the oldest
sub-window, index ``j mod n``, with the buffer of tuples that arrived since the
last slide, and rebuilds that sub-window's summary.  A sub-window's *version* is
the id ``j`` of the slide that wrote it, which is what recorded histories and the
``ws``/``lws`` checkers reason about.

Summaries serve summary-scan (SS) evaluation: per attribute, the associative
aggregates (COUNT, SUM, MIN, MAX) and the distinct-value counts (value ->
(tuples, sum of a measure)) that top-k, percentiles and COUNT DISTINCT merge.
Window-scan (WS) evaluation reads the tuples themselves.

Expired versions can be *retained* while a query still needs them (the ``ws``
scheduler reads the window as of its start; the re-scan variants of Section 4.2
re-read an expired copy to undo its contribution), and released afterwards.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from txstream.windows.base import PACKET_FIELDS, Row, WindowError

MAX_SUBWINDOWS = 1_000_000
"""Most sub-windows a window may have (as ``txstream check --subwindows``)."""


def _is_number(value: object) -> bool:
    """A real number that is not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass
class Summary:
    """Per-sub-window pre-aggregates for summary scans.

    ``count`` is the number of tuples; for each numeric attribute, ``sums``,
    ``mins`` and ``maxs``; for each grouping attribute, ``distinct[attr]`` maps a
    value to (tuples with that value, sum of the measure over them).
    """

    count: int = 0
    sums: dict[str, float] = field(default_factory=dict)
    mins: dict[str, float] = field(default_factory=dict)
    maxs: dict[str, float] = field(default_factory=dict)
    distinct: dict[str, dict[Any, list[float]]] = field(default_factory=dict)

    def add(
        self,
        row: Row,
        numeric: Sequence[tuple[str, int]],
        groups: Sequence[tuple[str, int]],
        measure: int,
    ) -> None:
        """Fold one tuple in (also used for tuples inserted into a materialized result).

        ``numeric`` and ``groups`` are (attribute, field index) pairs; ``measure``
        is the field index whose sum each distinct value carries.
        """
        self.count += 1
        for a, k in numeric:
            v = float(row[k])
            self.sums[a] = self.sums.get(a, 0.0) + v
            self.mins[a] = min(self.mins.get(a, v), v)
            self.maxs[a] = max(self.maxs.get(a, v), v)
        m = float(row[measure])
        for g, k in groups:
            slot = self.distinct.setdefault(g, {}).setdefault(row[k], [0.0, 0.0])
            slot[0] += 1
            slot[1] += m

    def entries(self, attr: str | None = None) -> int:
        """How many summary entries a scan of ``attr`` (or the aggregates) touches."""
        if attr is None:
            return 1 + len(self.sums)
        return len(self.distinct.get(attr, {}))


@dataclass
class SubWindow:
    """One sub-window: its version (the slide that wrote it), tuples and summary."""

    index: int
    version: int
    tuples: list[Row]
    summary: Summary
    start_time: float = 0.0  # when its buffer began filling
    full_time: float = 0.0  # when its buffer was full (the slide's arrival)


class SlidingWindow:
    """A window of ``n`` sub-windows, each spanning ``t`` time units (or ``b`` tuples).

    Call order: :meth:`slide` once per full buffer, in slide-id order (``T_0 ..
    T_{n-1}`` fill the window; each later slide moves it forward by one
    sub-window); :meth:`current` and :meth:`youngest` read the state; queries
    read a sub-window with :meth:`get` (the current copy) or :meth:`get_version`
    (a retained copy).  Invariant: ``current(i).version % n == i``.
    """

    def __init__(
        self,
        n: int,
        t: float | None = 1.0,
        *,
        tuples_per_subwindow: int | None = None,
        fields: Sequence[str] = PACKET_FIELDS,
        numeric: Sequence[str] = ("size",),
        groups: Sequence[str] = ("src", "dst"),
        measure: str = "size",
    ) -> None:
        if not isinstance(n, int) or isinstance(n, bool) or not 2 <= n <= MAX_SUBWINDOWS:
            raise WindowError(
                f"a window needs n >= 2 (and at most {MAX_SUBWINDOWS:,}) sub-windows, got {n!r}"
            )
        if tuples_per_subwindow is None:
            if not _is_number(t) or not 0 < t < math.inf:  # type: ignore[operator]
                raise WindowError(
                    f"a time-based window needs a finite sub-window length t > 0, got {t!r}"
                )
        elif (
            not isinstance(tuples_per_subwindow, int)
            or isinstance(tuples_per_subwindow, bool)
            or tuples_per_subwindow < 1
        ):
            raise WindowError(
                f"a tuple-based window needs at least 1 tuple per sub-window (a whole number), "
                f"got {tuples_per_subwindow!r}"
            )
        self.n = n
        self.t = t
        self.b = tuples_per_subwindow
        if isinstance(fields, str) or not all(isinstance(f, str) for f in fields):
            raise WindowError(f"fields names the tuple's attributes as strings, not {fields!r}")
        self.fields = tuple(fields)
        if len(set(self.fields)) != len(self.fields):
            raise WindowError(f"the fields repeat a name: {', '.join(self.fields)}")
        self.numeric = tuple((a, self.field(a)) for a in numeric)
        self.groups = tuple((a, self.field(a)) for a in groups)
        self.measure = self.field(measure)
        self.slides = 0  # id of the next slide
        self._subs: list[SubWindow | None] = [None] * n
        self._retained: dict[tuple[int, int], SubWindow] = {}
        self._keep: Counter[tuple[int, int]] = Counter()

    def field(self, name: str) -> int:
        """The index of attribute ``name`` in a tuple."""
        try:
            return self.fields.index(name)
        except ValueError:
            raise WindowError(
                f"unknown attribute {name!r}; the tuples have {', '.join(self.fields)}"
            ) from None

    # -- state -------------------------------------------------------------------------

    @property
    def full(self) -> bool:
        """Whether the first ``n`` slides have filled the window."""
        return self.slides >= self.n

    def current(self, i: int) -> SubWindow:
        """The current copy of sub-window ``i``."""
        sub = self._subs[i]
        if sub is None:
            raise WindowError(f"sub-window {i} has not been filled yet")
        return sub

    def youngest(self, length: int | None = None) -> list[int]:
        """Indexes of the ``length`` youngest sub-windows, youngest first."""
        length = self.n if length is None else length
        if not 1 <= length <= self.n:
            raise WindowError(f"a query window of {length} sub-windows does not fit in n={self.n}")
        last = self.slides - 1
        return [(last - k) % self.n for k in range(length)]

    def ttu(self, i: int) -> int:
        """Time-to-update of sub-window ``i``: slides until it is overwritten (1..n)."""
        return (i - self.slides) % self.n + 1

    def build(self, index: int, version: int, rows: Iterable[Row]) -> SubWindow:
        """A sub-window with its summary (not yet installed).

        Column at a time rather than :meth:`Summary.add` per tuple: the same
        summary, several times faster, and slides must be cheap (Section 2.1).
        A buffer whose tuples do not fit the fields (too short, a numeric
        attribute that is not a finite number, an address that cannot be a
        dict key) raises :class:`WindowError`; nothing is installed then.
        """
        try:
            tuples = list(rows)
            summary = Summary(count=len(tuples))
            for a, k in self.numeric:
                values = [float(r[k]) for r in tuples]
                if values:
                    summary.sums[a] = total = sum(values)
                    summary.mins[a] = min(values)
                    summary.maxs[a] = max(values)
                    if not math.isfinite(total):
                        raise WindowError(
                            f"sub-window {index}: attribute {a} holds NaN or an infinity (or "
                            "values too large to add up); numeric values must be finite"
                        )
            measures = [float(r[self.measure]) for r in tuples]
            if not math.isfinite(sum(measures)):
                raise WindowError(
                    f"sub-window {index}: the measure {self.fields[self.measure]} holds NaN or "
                    "an infinity; numeric values must be finite"
                )
            for g, k in self.groups:
                counts: dict[Any, list[float]] = {}
                for value, m in zip([r[k] for r in tuples], measures, strict=True):
                    slot = counts.get(value)
                    if slot is None:
                        counts[value] = [1.0, m]
                    else:
                        slot[0] += 1
                        slot[1] += m
                summary.distinct[g] = counts
        except (TypeError, ValueError, IndexError, KeyError, OverflowError) as exc:
            if isinstance(exc, WindowError):
                raise
            raise WindowError(
                f"sub-window {index}: a buffer is a list of tuples ({', '.join(self.fields)}) "
                f"with numbers for {', '.join(dict(self.numeric)) or 'the measure'} and hashable "
                f"{', '.join(dict(self.groups)) or 'groups'}: {type(exc).__name__}: {exc}"
            ) from None
        return SubWindow(index, version, tuples, summary)

    def slide(
        self, rows: Iterable[Row] | SubWindow, *, start: float = 0.0, full: float = 0.0
    ) -> SubWindow:
        """Apply the next window update ``T_j``: replace sub-window ``j mod n``.

        ``rows`` is the buffer, or the sub-window :meth:`build` made of it for
        this slide (``build(j % n, j, rows)``).

        Returns the expired copy's replacement; the expired copy itself stays
        readable through :meth:`get_version` while someone :meth:`retain`-ed it.
        """
        j = self.slides
        i = j % self.n
        if isinstance(rows, SubWindow):
            new = rows
            if (new.index, new.version) != (i, j):
                raise WindowError(
                    f"sub-window {new.index} version {new.version} was built for another slide "
                    f"than T_{j}"
                )
        else:
            new = self.build(i, j, rows)  # first: a bad buffer changes nothing
        old = self._subs[i]
        if old is not None and self._keep[(i, old.version)] > 0:
            self._retained[(i, old.version)] = old
        new.start_time, new.full_time = start, full
        self._subs[i] = new
        self.slides = j + 1
        return new

    def insert(self, i: int, rows: Iterable[Row]) -> list[Row]:
        """Insert tuples into sub-window ``i`` (a materialized sub-result, Section 4.3)."""
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < self.n:
            raise WindowError(f"no sub-window {i!r}: the indexes are 0 to {self.n - 1}")
        sub = self.current(i)
        added = self.build(i, sub.version, rows).tuples  # checks the new tuples
        # Copy on write: running queries hold references to the old summary's
        # entries as their partial results, and get the new tuples passed
        # separately (WindowEngine.insert).
        tuples = sub.tuples + added
        sub.summary = self.build(i, sub.version, tuples).summary
        sub.tuples = tuples
        return added

    # -- retained versions -------------------------------------------------------------

    def retain(self, i: int, version: int) -> None:
        """Keep version ``version`` of sub-window ``i`` readable after it expires."""
        self._keep[(i, version)] += 1

    def release(self, i: int, version: int) -> None:
        """Drop one claim on a retained version; the copy goes when nobody needs it."""
        key = (i, version)
        self._keep[key] -= 1
        if self._keep[key] <= 0:
            del self._keep[key]
            self._retained.pop(key, None)

    def get_version(self, i: int, version: int) -> SubWindow:
        """Version ``version`` of sub-window ``i``: the current copy or a retained one."""
        sub = self._subs[i]
        if sub is not None and sub.version == version:
            return sub
        try:
            return self._retained[(i, version)]
        except KeyError:
            raise WindowError(
                f"version {version} of sub-window {i} has expired and was not retained"
            ) from None

    def retained_count(self) -> int:
        """How many expired copies are held (memory the ws/re-scan schedulers cost)."""
        return len(self._retained)
