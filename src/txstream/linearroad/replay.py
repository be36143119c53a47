"""Linear Road input as a source: numbered lines, a faulty source's duplicates, a replay.

:func:`numbered_lines` yields ``(line number, raw line)`` for every non-blank
line; :func:`duplicate_entries` is the faulty source of the paper's Table 2
(every ``every`` seconds of input time, the first position report that enters
a new segment off the exit lane is delivered twice); :func:`replay` feeds a
:class:`~txstream.linearroad.engine.LinearRoadEngine` without Spark (tests, and
the pure-Python path).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from txstream.linearroad.engine import Arrival, LinearRoadEngine
from txstream.linearroad.formats import (
    DIR,
    EXIT_LANE,
    LANE,
    POSITION_REPORT,
    SEG,
    TIME,
    TYPE,
    VID,
    XWAY,
    MalformedTupleError,
    parse_input_line,
)

Numbered = tuple[int, str]


def numbered_lines(lines: Iterable[str]) -> Iterator[Numbered]:
    """``(line number, line without its newline)`` for each non-blank line (numbers from 1)."""
    for no, line in enumerate(lines, 1):
        raw = line.rstrip("\r\n")
        if raw.strip():
            yield no, raw


def duplicate_entries(lines: Iterable[Numbered], every: int) -> Iterator[Numbered]:
    """Deliver one segment-entering report twice every ``every`` seconds of input time.

    Only well-formed position reports are duplicated (a malformed line is
    rejected either way, so duplicating it would fault nothing).
    """
    last_segment: dict[int, tuple[int, ...]] = {}
    window = -1
    for no, raw in lines:
        yield no, raw
        if every <= 0:
            continue
        try:
            t = parse_input_line(raw)
        except MalformedTupleError:
            continue
        if t[TYPE] != POSITION_REPORT:
            continue
        where = (t[XWAY], t[DIR], t[SEG])
        entered = last_segment.get(t[VID]) != where
        last_segment[t[VID]] = where
        if not entered or t[LANE] == EXIT_LANE:
            continue
        w = t[TIME] // every
        if w != window:
            window = w
            yield no, raw


def replay(
    engine: LinearRoadEngine,
    lines: Iterable[Numbered],
    batch: int = 2000,
    parse: Callable[[str], tuple[int, ...]] = parse_input_line,
) -> None:
    """Feed numbered lines to a started ``engine`` in batches; malformed ones are rejected."""
    arrivals: list[Arrival] = []
    rejects: list[tuple[int, str, str]] = []
    for no, raw in lines:
        try:
            arrivals.append((no, engine.clock(), parse(raw)))
        except MalformedTupleError as exc:
            rejects.append((no, str(exc), raw))
        if len(arrivals) >= batch:
            engine.process(arrivals, rejects)
            arrivals, rejects = [], []
    engine.process(arrivals, rejects)
