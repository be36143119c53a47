"""Linear Road's rules as the engines apply them: variants, records, accidents, LAV, tolls.

What the driver engine (:class:`~txstream.linearroad.engine.LinearRoadEngine`)
and the runtime job's transaction function (:mod:`~txstream.linearroad.txns`)
share: the variants and transaction sizes by name, the records of the ingest
path (:class:`Entry`, :class:`Query`, :class:`Job`, :class:`Latency`), the rules
of stopped cars and accidents (:func:`stops_here`, ``_span``, ``_active``), the
latest average velocity (``_lav``) and HISTORICAL TOLLS
(:class:`HistoricalTolls`).  Pure functions and records: no store, no thread.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from txstream.errors import TxStreamError, UnknownNameError
from txstream.linearroad.formats import (
    ACCIDENT_END_DEFINITIONS,
    DIR,
    EXIT_LANE,
    LANE,
    SEG,
    SEGMENTS,
    TIME,
    VID,
    XWAY,
)
from txstream.txn import Transaction

VARIANTS: dict[str, str] = {
    "serializable": "SS2PL with the arrival order: notifications read the committed tolls "
    "and accidents of the previous minute",
    "not-serializable": "writers lock, no order: reads take whatever the stores hold",
}
"""The variants by name, as the command line takes them."""

TXN_SIZES: dict[str, int] = {"event": 0, "1s": 1, "2s": 2, "3s": 3}
"""Toll-notification transaction size: one per event, or per 1, 2 or 3 seconds."""


MEAN_SCALE = 2520
"""Per-car mean speeds are kept as ``MEAN_SCALE * sum / count``: exact for up to 10
reports per car and segment-minute (a car reports every 30 seconds)."""

# Indexes into a ``cars`` row.
C_TIME, C_XWAY, C_DIR, C_SEG, C_LANE, C_POS, C_SAME, C_ENTERED, C_MINUTE, C_SUM, C_COUNT = range(11)

Tuple = tuple[int, ...]
Arrival = tuple[int, float, Tuple]
"""An input tuple as the engine gets it: ``(line number, handoff wall time, fields)``."""


class DuplicateEvents(TxStreamError):
    """A notification found the alert of one of its events already committed."""

    def __init__(self, indexes: list[int]) -> None:
        super().__init__(f"{len(indexes)} duplicated event(s)")
        self.indexes = indexes


def _known(kind: str, name: str, known: Iterable[str]) -> str:
    names = list(known)
    if name not in names:
        raise UnknownNameError(kind, name, names)
    return name


def check_variant(name: str) -> str:
    """Return ``name`` if it names a variant, else :class:`UnknownNameError`."""
    return _known("variant", name, VARIANTS)


def check_txn_size(name: str) -> str:
    """Return ``name`` if it names a transaction size, else :class:`UnknownNameError`."""
    return _known("transaction size", name, TXN_SIZES)


def check_accident_end(name: str) -> str:
    """Return ``name`` if it names an accident-end reading, else :class:`UnknownNameError`."""
    return _known("accident-end reading", name, ACCIDENT_END_DEFINITIONS)


@dataclass
class Entry:
    """A car entering a segment: what a toll notification (or a charge) is about."""

    seq: int
    handoff: float
    vid: int
    time: int
    xway: int
    dir: int
    seg: int
    exit: bool
    """Entered on the exit lane: charge the previous toll, no notification."""
    pending: tuple[int, ...] = ()
    """Its row in ``pending``, deleted by the transaction that handles it."""


@dataclass
class Query:
    """An account-balance (type 2) or daily-expenditure (type 3) query."""

    seq: int
    handoff: float
    type: int
    time: int
    vid: int
    qid: int
    xway: int
    day: int
    pending: tuple[int, ...] = ()
    """Its row in ``pending``, deleted by the transaction that answers it."""


@dataclass
class Job:
    """One transaction's work, created (and placed in the order) by the ingest path."""

    path: str
    txn: Transaction
    run: Callable[[Transaction, Job], list[tuple[str, Any, float]]]
    items: list[Any] = field(default_factory=list)
    offset: int | None = None
    minute: int = 0
    at: tuple[float, int, int] = (0, 0, 0)
    """Its place in the input order: (line, phase, serial)."""
    dropped: list[Any] = field(default_factory=list)
    """Items rolled back as duplicates: their ``pending`` rows still go."""
    checkpoint: bool = False
    """Checkpoint the stores after this job commits."""


@dataclass
class Latency:
    """One committed answer: its type (0-3), handoff and commit wall times."""

    type: int
    handoff: float
    committed: float


_NO_TOLL = [0, 0, 0, -1]
"""A ``tolls`` row for a segment without one: LAV 0, toll 0, no accident near."""

_ANSWER_TYPE = {"toll_alerts": 0, "acc_alerts": 1, "bal_reports": 2, "exp_reports": 3}


def _lav(rows: Sequence[Any], definition: str) -> int:
    """LAV over the segment's minute rows present (``segstats`` rows), rounded half up."""
    if not rows:
        return 0
    if definition == "raw-mean":
        mean = Fraction(sum(r[0] for r in rows), sum(r[1] for r in rows))
    else:
        mean = sum((Fraction(r[3], MEAN_SCALE * r[2]) for r in rows), Fraction(0)) / len(rows)
    return int(mean + Fraction(1, 2))


def _spot(pos: int, lane: int) -> int:
    """Where a car stops, as one integer: its position and lane.

    A car is stopped after four reports at one (XWay, Lane, Pos, Dir), and an
    accident is two cars stopped at one such place: two cars stopped side by
    side in different lanes are not an accident.
    """
    return pos * 8 + lane


def stops_here(same: int, lane: int) -> bool:
    """Whether a car whose report is its ``same``-th at one place is stopped there.

    Never on the exit ramp: a car there has left the expressway.
    """
    return same >= 4 and lane != EXIT_LANE


def _stop_entry(e: Sequence[int]) -> tuple[int, int, int, int, int]:
    """A ``stops`` entry ``[spot, vid, first, last, moved]`` (``moved`` -1: not yet).

    ``spot`` is :func:`_spot` of the car's position and lane.
    """
    return e[0], e[1], e[2], e[3], (e[4] if len(e) > 4 else -1)


def _span(cars: dict[int, tuple[int, int, int]], accident_end: str) -> tuple[int, float] | None:
    """First and last minute an accident at one position counts, or None if no accident.

    ``cars`` maps each car stopped there to ``(first, last, moved)``: its fourth
    identical report, its last stopped report, and the time of its next report
    (-1 if none yet).  The accident is detected at the second car's fourth
    identical report and counts from the minute after that.  ``spec``: up to
    the minute after the last stopped report there; ``clear-minute``: up to
    the minute of the first report, from the detection on, of a stopped car
    that moved (the report that clears it), and without end while none has.
    """
    if len(cars) < 2:
        return None
    detect = sorted(f for f, _, _ in cars.values())[1]
    start = detect // 60 + 2
    end: float
    if accident_end == "spec":
        end = max(last for _, last, _ in cars.values()) // 60 + 2
    else:
        clears = [mv for _, _, mv in cars.values() if mv >= 0 and mv >= detect]
        end = min(clears) // 60 + 1 if clears else math.inf
    return start, end


def _by_position(stops: Sequence[Sequence[int]]) -> dict[int, dict[int, tuple[int, int, int]]]:
    by_pos: dict[int, dict[int, tuple[int, int, int]]] = {}
    for e in stops:
        pos, vid, first, last, moved = _stop_entry(e)
        by_pos.setdefault(pos, {})[vid] = (first, last, moved)
    return by_pos


def _active(stops: Sequence[Sequence[int]], minute: int, accident_end: str = "spec") -> bool:
    """Whether the stopped cars of one segment make an accident active in ``minute``.

    An accident is two cars stopped at one position; see :func:`_span` for
    when it counts (and :mod:`txstream.linearroad.reference`).
    """
    for cars in _by_position(stops).values():
        span = _span(cars, accident_end)
        if span is not None and span[0] <= minute <= span[1]:
            return True
    return False


def _still_needed(stops: Sequence[Sequence[int]], minute: int, accident_end: str) -> list[Any]:
    """The entries of ``stops`` that can still make an accident count in ``minute`` or later.

    Decided per position, not per car: a car whose own stop ended long ago still
    belongs to an accident that another car stopped there keeps going.
    """
    by_pos = _by_position(stops)
    keep: set[int] = set()
    for pos, cars in by_pos.items():
        span = _span(cars, accident_end)
        if span is not None and span[1] >= minute - 1:
            keep.add(pos)
    return [
        list(e)
        for e in stops
        if e[0] in keep or (len(by_pos[e[0]]) < 2 and e[3] // 60 + 2 >= minute - 1)
    ]


def _entry(seq: int, handoff: float, t: Tuple) -> Entry:
    return Entry(seq, handoff, t[VID], t[TIME], t[XWAY], t[DIR], t[SEG], t[LANE] == EXIT_LANE)


def _downstream(direction: int, seg: int) -> Iterable[int]:
    """The segment and the four downstream of it (direction 0 counts up, 1 down)."""
    step = 1 if direction == 0 else -1
    return (seg + step * k for k in range(5) if 0 <= seg + step * k < SEGMENTS)


class HistoricalTolls:
    """HISTORICAL TOLLS ``VID,Day,XWay,Toll``: a static relation, read without locks.

    Kept as sorted numpy arrays (4 million rows take ~100 MB, not gigabytes of
    dict entries).  A query without an expressway (-1) takes the first toll of
    that car and day in file order; an unknown car or day spends 0.
    """

    def __init__(self, rows: Sequence[tuple[int, int, int, int]] | Any) -> None:
        import numpy as np

        arr = np.asarray(rows, dtype=np.int64).reshape(-1, 4)
        key = arr[:, 0] * 100 + arr[:, 1]
        order = np.argsort(key, kind="stable")
        self._key = key[order]
        self._xway = arr[order, 2]
        self._toll = arr[order, 3]

    @classmethod
    def from_file(cls, path: str | Path) -> HistoricalTolls:
        """Read a historical-tolls file (``.gz`` allowed); :class:`TxStreamError` if unreadable."""
        from txstream.linearroad.reference import read_tolls

        return cls(read_tolls(path).to_numpy())

    def __len__(self) -> int:
        return len(self._key)

    def lookup(self, vid: int, day: int, xway: int) -> int:
        """The toll car ``vid`` paid on ``day`` on ``xway`` (any expressway if -1), else 0."""
        import numpy as np

        k = vid * 100 + day
        lo = int(np.searchsorted(self._key, k, "left"))
        hi = int(np.searchsorted(self._key, k, "right"))
        for i in range(lo, hi):
            if xway < 0 or self._xway[i] == xway:
                return int(self._toll[i])
        return 0
