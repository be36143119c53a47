"""Linear Road file formats: input tuples, historical tolls and answers.

Input, one tuple a line (official format, unused fields are -1)::

    Type,Time,VID,Spd,XWay,Lane,Dir,Seg,Pos,QID,S_init,S_end,DOW,TOD,Day

Type 0 is a position report, 2 an account-balance query, 3 a daily-expenditure
query, 4 a travel-time query (read and skipped: like every published
implementation, txstream does not answer it).  Historical tolls:
``VID,Day,XWay,Toll``.  Answers, one a line:

- ``0,VID,Time,Emit,LAV,Toll``: toll notification;
- ``1,Time,Emit,XWay,Seg,Dir,VID``: accident notification;
- ``2,Time,Emit,ResultTime,QID,Balance``: account balance (``5`` in the
  reference file: the same query answered one charge old);
- ``3,Time,Emit,QID,Toll``: daily expenditure.

``Emit`` is wall-clock bookkeeping (seconds since the run started); validators
ignore it.
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO, TypeVar

from txstream.errors import TxStreamError

T = TypeVar("T")

INPUT_FIELDS: tuple[str, ...] = (
    "Type", "Time", "VID", "Spd", "XWay", "Lane", "Dir", "Seg", "Pos",
    "QID", "S_init", "S_end", "DOW", "TOD", "Day",
)  # fmt: skip
"""Field names of an input tuple, in file order."""

TYPE, TIME, VID, SPD, XWAY, LANE, DIR, SEG, POS, QID, S_INIT, S_END, DOW, TOD, DAY = range(15)

POSITION_REPORT = 0
ACCOUNT_BALANCE = 2
DAILY_EXPENDITURE = 3
TRAVEL_TIME = 4
"""A travel-time estimation query: read (real realizations contain them), never answered."""
INPUT_TYPES = (POSITION_REPORT, ACCOUNT_BALANCE, DAILY_EXPENDITURE, TRAVEL_TIME)

ENTRANCE_LANE = 0
EXIT_LANE = 4
SEGMENTS = 100
"""Segments per direction of an expressway (each one mile, 5280 feet)."""
FEET_PER_SEGMENT = 5280
MAX_TIME = 10_799
"""The last second of Linear Road's three-hour simulation."""

TOLL_FIELDS = ("VID", "Day", "XWay", "Toll")

LAV_DEFINITIONS = ("spec", "raw-mean")
"""The two LAV definitions, by name (see :mod:`txstream.linearroad.reference`)."""

ACCIDENT_END_DEFINITIONS = ("spec", "clear-minute")
"""When an accident stops counting, by name (see :mod:`txstream.linearroad.reference`):
``spec`` through the minute after the last stopped report of a car there,
``clear-minute`` through the minute of the report that clears it."""

ANSWER_FIELDS: dict[int, tuple[str, ...]] = {
    0: ("Type", "VID", "Time", "Emit", "LAV", "Toll"),
    1: ("Type", "Time", "Emit", "XWay", "Seg", "Dir", "VID"),
    2: ("Type", "Time", "Emit", "ResultTime", "QID", "Balance"),
    3: ("Type", "Time", "Emit", "QID", "Toll"),
    5: ("Type", "Time", "Emit", "ResultTime", "QID", "Balance"),
}
"""Field names of each answer type (``5``: a balance answer one charge old)."""


class MalformedTupleError(TxStreamError, ValueError):
    """An input or answer line could not be read; the message says why."""


class _Gzip(gzip.GzipFile):
    """A ``.gz`` reader whose early end (a truncated file) is a one-line :class:`TxStreamError`.

    gzip raises :class:`EOFError` there, which is no :class:`OSError`: every
    reader of an input would have to catch it, and the run's replay did not.
    """

    def read(self, size: int | None = -1) -> bytes:
        try:
            return super().read(size)
        except EOFError as exc:
            raise TxStreamError(f"cannot read {self.name}: {exc}") from None

    def read1(self, size: int = -1) -> bytes:
        try:
            return super().read1(size)
        except EOFError as exc:
            raise TxStreamError(f"cannot read {self.name}: {exc}") from None


def open_text(path: str | Path) -> TextIO:
    """Open ``path`` for reading text, decompressing it when it ends in ``.gz``."""
    p = Path(path)
    try:
        if p.suffix == ".gz":
            return io.TextIOWrapper(_Gzip(p, "rb"), encoding="ascii", newline=None)
        return p.open(encoding="ascii", newline=None)
    except OSError as exc:
        raise TxStreamError(f"cannot read {p}: {exc.strerror or exc}") from None


def out_of_order(time: int, previous: int) -> str:
    """Why a tuple that goes back in time is rejected."""
    return (
        f"time {time} is before the previous tuple's time {previous} (input must be in time order)"
    )


def read_lines(
    path: str | Path, parse: Callable[[str], T], numbers: list[int] | None = None
) -> tuple[list[T], list[tuple[int, str, str]]]:
    """Parse every non-blank line of ``path``; also the malformed ones ``(line_no, reason, raw)``.

    ``numbers``, when given, receives the line number of each parsed item.

    An unreadable file (missing, not text, a broken ``.gz``) is a :class:`TxStreamError`.
    """
    items: list[T] = []
    rejected: list[tuple[int, str, str]] = []
    with open_text(path) as f:
        try:
            for no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    items.append(parse(line))
                    if numbers is not None:
                        numbers.append(no)
                except MalformedTupleError as exc:
                    rejected.append((no, str(exc), line.rstrip("\n")))
        except (UnicodeDecodeError, OSError, EOFError) as exc:
            raise TxStreamError(f"cannot read {path}: {exc}") from None
    return items, rejected


def _ints(line: str, n: int, what: str) -> tuple[int, ...]:
    parts = line.strip().split(",")
    if len(parts) != n:
        raise MalformedTupleError(f"{what}: expected {n} fields, got {len(parts)}")
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        bad = next(p for p in parts if not _is_int(p))
        raise MalformedTupleError(f"{what}: field {bad!r} is not an integer") from None


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def parse_input_line(line: str) -> tuple[int, ...]:
    """Parse one input tuple into its 15 integers; raise :class:`MalformedTupleError`.

    Besides the shape, the values a query depends on are range-checked: the
    type, a time within the three hours and a non-negative vehicle id, lane 0-4, direction 0/1,
    segment 0-99, and a position inside its segment.
    """
    t = _ints(line, 15, "input tuple")
    if t[TYPE] not in INPUT_TYPES:
        raise MalformedTupleError(f"unknown tuple type {t[TYPE]} (expected 0, 2, 3 or 4)")
    if t[TIME] < 0:
        raise MalformedTupleError(f"negative time {t[TIME]}")
    if t[TIME] > MAX_TIME:
        raise MalformedTupleError(f"time {t[TIME]} beyond the 3-hour simulation (max {MAX_TIME})")
    if t[VID] < 0:
        raise MalformedTupleError(f"negative vehicle id {t[VID]}")
    if t[TYPE] == POSITION_REPORT:
        if not 0 <= t[SPD] <= 200:
            raise MalformedTupleError(f"speed {t[SPD]} out of range 0-200")
        if t[XWAY] < 0:
            raise MalformedTupleError(f"negative expressway {t[XWAY]}")
        if not 0 <= t[LANE] <= EXIT_LANE:
            raise MalformedTupleError(f"lane {t[LANE]} out of range 0-4")
        if t[DIR] not in (0, 1):
            raise MalformedTupleError(f"direction {t[DIR]} is not 0 or 1")
        if not 0 <= t[SEG] < SEGMENTS:
            raise MalformedTupleError(f"segment {t[SEG]} out of range 0-99")
        if t[POS] // FEET_PER_SEGMENT != t[SEG]:
            raise MalformedTupleError(f"position {t[POS]} is not in segment {t[SEG]}")
    elif t[QID] < 0:
        raise MalformedTupleError(f"negative query id {t[QID]}")
    elif t[TYPE] == DAILY_EXPENDITURE and not 1 <= t[DAY] <= 69:
        raise MalformedTupleError(f"day {t[DAY]} out of range 1-69")
    return t


def format_input(t: tuple[int, ...]) -> str:
    """One input tuple as its line (without the newline)."""
    return ",".join(str(v) for v in t)


def parse_toll_line(line: str) -> tuple[int, int, int, int]:
    """Parse one historical-tolls line ``VID,Day,XWay,Toll``."""
    vid, day, xway, toll = _ints(line, 4, "historical toll")
    return vid, day, xway, toll


@dataclass(frozen=True)
class Answer:
    """One answer line; ``values`` keeps every field but ``Type`` and ``Emit``.

    ``values`` by type: 0 ``(VID, Time, LAV, Toll)``, 1 ``(Time, XWay, Seg,
    Dir, VID)``, 2 and 5 ``(Time, ResultTime, QID, Balance)``, 3 ``(Time, QID,
    Toll)``.
    """

    type: int
    values: tuple[int, ...]
    emit: float = 0.0

    def key(self) -> tuple[int, ...]:
        """What identifies the question this line answers (not the answer)."""
        if self.type == 0:
            return (0, self.values[0], self.values[1])
        if self.type == 1:
            return (1, self.values[4], self.values[0])
        if self.type in (2, 5):
            return (2, self.values[2])
        return (3, self.values[1])


def parse_answer_line(line: str) -> Answer:
    """Parse one answer line of any type; raise :class:`MalformedTupleError`."""
    parts = line.strip().split(",")
    if not parts or not _is_int(parts[0]):
        raise MalformedTupleError(f"answer type {parts[0]!r} is not an integer")
    kind = int(parts[0])
    fields = ANSWER_FIELDS.get(kind)
    if fields is None:
        raise MalformedTupleError(f"unknown answer type {kind} (expected 0, 1, 2, 3 or 5)")
    if len(parts) != len(fields):
        raise MalformedTupleError(
            f"answer type {kind}: expected {len(fields)} fields, got {len(parts)}"
        )
    emit_at = fields.index("Emit")
    try:
        emit = float(parts[emit_at])
    except ValueError:
        raise MalformedTupleError(f"emit {parts[emit_at]!r} is not a number") from None
    rest = [p for i, p in enumerate(parts) if i not in (0, emit_at)]
    bad = [p for p in rest if not _is_int(p)]
    if bad:
        raise MalformedTupleError(f"answer type {kind}: field {bad[0]!r} is not an integer")
    return Answer(kind, tuple(int(p) for p in rest), emit)


def format_answer(answer: Answer) -> str:
    """One answer as its line (Emit with 3 decimals), without the newline."""
    v = [str(x) for x in answer.values]
    emit = f"{answer.emit:.3f}"
    if answer.type == 0:
        return ",".join(["0", v[0], v[1], emit, v[2], v[3]])
    if answer.type == 1:
        return ",".join(["1", v[0], emit, *v[1:]])
    if answer.type in (2, 5):
        return ",".join([str(answer.type), v[0], emit, *v[1:]])
    return ",".join(["3", v[0], emit, *v[1:]])


def toll_notification(vid: int, time: int, lav: int, toll: int, emit: float = 0.0) -> str:
    """The line ``0,VID,Time,Emit,LAV,Toll``."""
    return format_answer(Answer(0, (vid, time, lav, toll), emit))


def accident_notification(
    time: int, xway: int, seg: int, direction: int, vid: int, emit: float = 0.0
) -> str:
    """The line ``1,Time,Emit,XWay,Seg,Dir,VID``."""
    return format_answer(Answer(1, (time, xway, seg, direction, vid), emit))


def balance_answer(time: int, result_time: int, qid: int, balance: int, emit: float = 0.0) -> str:
    """The line ``2,Time,Emit,ResultTime,QID,Balance``."""
    return format_answer(Answer(2, (time, result_time, qid, balance), emit))


def expenditure_answer(time: int, qid: int, toll: int, emit: float = 0.0) -> str:
    """The line ``3,Time,Emit,QID,Toll``."""
    return format_answer(Answer(3, (time, qid, toll), emit))
