"""A deterministic Linear Road input generator (no traffic simulator needed).

Each expressway direction is generated on its own from ``(seed, xway, dir)``,
so expressways can be generated in parallel (one Spark task each, see
:mod:`txstream.linearroad.generate_job`) and give the same file as the sequential run.

What an input contains, per expressway direction:

- cars entering at a random segment on the entrance lane (0), travelling on
  lanes 1-3 at varying speeds, reporting every 30 seconds, changing segments
  and leaving on the exit lane (4) a few segments later;
- a congested stretch (segments ``CONGESTED``) during the middle of the run,
  where cars crawl at 10-35 mph and arrive densely enough that more than 50
  cars are in a segment in a minute, so tolls are non-zero;
- accidents: two cars stop at the same position and lane for five to eight
  reports (four identical reports make a stopped car) and then drive on, so
  the accident clears;
- account-balance (type 2) and daily-expenditure (type 3) queries from cars
  on the road, and a historical-tolls file ``VID,Day,XWay,Toll`` with one toll
  for every car and day 1-69.

``L`` may be fractional in halves: ``L = 2.5`` is expressways 0 and 1 in both
directions and expressway 2 in direction 0 only (a half expressway).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from txstream.errors import TxStreamError
from txstream.linearroad.formats import (
    ACCOUNT_BALANCE,
    DAILY_EXPENDITURE,
    FEET_PER_SEGMENT,
    POSITION_REPORT,
    SEGMENTS,
    format_input,
)
from txstream.storage.files import writing

CONGESTED = range(40, 50)
"""Segments (in the direction of travel) where traffic crawls mid-run."""
LAST_POS = SEGMENTS * FEET_PER_SEGMENT - 1
REPORT_EVERY = 30
VID_STRIDE = 1024
"""VIDs of lane ``k`` (xway * 2 + dir) are ``k + VID_STRIDE * n``: unique without coordination."""


@dataclass(frozen=True)
class GeneratedPaths:
    """Where :func:`generate` wrote its files, and how dense the input is."""

    input: Path
    tolls: Path
    tuples: int
    density: float
    """Input tuples per expressway-second (L counted as given, halves included)."""


def lanes_of(L: float) -> list[tuple[int, int]]:
    """The ``(xway, dir)`` pairs of an ``L`` rating (multiples of 0.5, at least 0.5)."""
    if L < 0.5 or int(L * 2) != L * 2 or L > VID_STRIDE / 2:
        raise TxStreamError(f"L must be a multiple of 0.5 between 0.5 and 512, got {L}")
    halves = int(L * 2)
    return [(h // 2, h % 2) for h in range(halves)]


def check_params(minutes: int, rate: float) -> None:
    """Raise :class:`TxStreamError` unless ``minutes`` and ``rate`` are in range."""
    if minutes < 1 or minutes > 180:
        raise TxStreamError(f"minutes must be between 1 and 180, got {minutes}")
    if not 0.01 <= rate <= 20.0:
        raise TxStreamError(f"rate must be between 0.01 and 20 cars/s per direction, got {rate}")


def generate_direction(
    xway: int, direction: int, *, minutes: int, seed: int, rate: float = 2.0
) -> list[tuple[int, ...]]:
    """Every tuple of one expressway direction, sorted by time.

    ``rate`` is the mean number of cars entering per second (half of it
    outside the congested period).
    """
    check_params(minutes, rate)
    rng = random.Random(f"lr/{seed}/{xway}/{direction}")
    lane_id = xway * 2 + direction
    seconds = minutes * 60
    jam_from, jam_to = seconds // 5, seconds * 4 // 5
    out: list[tuple[int, ...]] = []
    next_vid = 0
    qid = lane_id  # QIDs, like VIDs, are unique across directions

    def new_vid() -> int:
        nonlocal next_vid
        vid = lane_id + VID_STRIDE * next_vid
        next_vid += 1
        return vid

    def real_pos(fwd: int) -> int:
        return fwd if direction == 0 else LAST_POS - fwd

    def speed_at(seg: int, t: int) -> int:
        if seg in CONGESTED and jam_from <= t < jam_to:
            return rng.randint(10, 35)
        return rng.randint(45, 75)

    def drive(vid: int, t: int, fwd: int, exit_seg: int, stop: tuple[int, int] | None) -> None:
        """Reports of one car from time ``t`` at forward position ``fwd``."""
        nonlocal qid
        lane = 0
        spd = speed_at(fwd // FEET_PER_SEGMENT, t)
        stopped_left = 0
        while t < seconds:
            seg = fwd // FEET_PER_SEGMENT
            at_exit = seg >= exit_seg
            lane_now = 4 if at_exit else lane
            pos = real_pos(fwd)
            out.append(
                (POSITION_REPORT, t, vid, spd, xway, lane_now, direction,
                 pos // FEET_PER_SEGMENT, pos, -1, -1, -1, -1, -1, -1)
            )  # fmt: skip
            r = rng.random()
            if r < 0.01:
                out.append(
                    (ACCOUNT_BALANCE, t, vid, spd, xway, lane_now, direction,
                     pos // FEET_PER_SEGMENT, pos, qid, -1, -1, -1, -1, -1)
                )  # fmt: skip
                qid += VID_STRIDE
            elif r < 0.012:
                out.append(
                    (DAILY_EXPENDITURE, t, vid, spd, xway, lane_now, direction,
                     pos // FEET_PER_SEGMENT, pos, qid, -1, -1, -1, -1, rng.randint(1, 69))
                )  # fmt: skip
                qid += VID_STRIDE
            if at_exit:
                return
            t += REPORT_EVERY
            if stopped_left > 1:
                stopped_left -= 1
                continue
            stopped_left = 0
            lane = rng.choice((1, 2, 3)) if lane == 0 or rng.random() < 0.1 else lane
            spd = speed_at(seg, t)
            fwd = min(LAST_POS, fwd + spd * 44)  # mph * 30 s = 44 ft per mph
            if stop is not None and fwd >= stop[0]:
                # Stopped cars report the same position and lane, speed 0.
                fwd, stopped_left, stop, lane, spd = stop[0], stop[1], None, 1, 0

    # Ordinary traffic: arrivals second by second, denser during the jam.
    for t in range(seconds):
        lam = rate if jam_from <= t < jam_to else rate / 2
        n = int(lam) + (1 if rng.random() < lam - int(lam) else 0)
        for _ in range(n):
            if jam_from <= t < jam_to and rng.random() < 0.6:
                entry = rng.randint(CONGESTED.start - 6, CONGESTED.start + 2)
            else:
                entry = rng.randint(0, SEGMENTS - 8)
            exit_seg = min(SEGMENTS - 1, entry + rng.randint(3, 25))
            drive(new_vid(), t, entry * FEET_PER_SEGMENT + rng.randint(0, 5279), exit_seg, None)

    # Accidents: two cars stop at one position for 5-8 reports, then drive on.
    for start in range(30, max(31, seconds - 360), 600):
        t = start + rng.randint(0, 120)
        seg = rng.randint(55, 85)
        where = seg * FEET_PER_SEGMENT + rng.randint(0, 5279)
        for k in range(2):
            fwd = (seg - 1) * FEET_PER_SEGMENT
            # The first car stays longer, so both are stopped together for 4+ reports.
            reports = rng.randint(9, 11) if k == 0 else rng.randint(5, 7)
            drive(new_vid(), t + 7 * k, fwd, min(SEGMENTS - 1, seg + 6), (where, reports))
    out.sort(key=lambda tup: (tup[1], tup[0], tup[2]))
    return out


def historical_tolls(vids: Iterable[int], *, seed: int) -> Iterator[str]:
    """``VID,Day,XWay,Toll`` lines: one per car and day 1-69, tolls 0-99.

    A car's expressway is the one it drives on today (``vid % VID_STRIDE // 2``),
    so the daily-expenditure queries, which name that expressway, find a toll.
    """
    for vid in vids:
        rng = random.Random(f"lr-tolls/{seed}/{vid}")
        xway = vid % VID_STRIDE // 2
        for day in range(1, 70):
            yield f"{vid},{day},{xway},{rng.randint(0, 99)}"


def write_files(
    out_dir: Path, streams: list[list[tuple[int, ...]]], *, L: float, minutes: int, seed: int
) -> GeneratedPaths:
    """Merge per-direction tuple lists by time and write the input and tolls files.

    Both are written under temporary names and renamed when complete, the tolls
    first: an interrupted run leaves no ``input.dat`` (which ``linear-road run``
    takes as a finished input) beside a truncated ``tolls.dat``, nor a truncated
    ``input.dat``.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    input_path = out_dir / "input.dat"
    tolls_path = out_dir / "tolls.dat"
    input_tmp = out_dir / ".input.dat.tmp"
    tolls_tmp = out_dir / ".tolls.dat.tmp"
    vids: set[int] = set()
    n = 0
    try:
        with writing(input_path), input_tmp.open("w") as f:
            for tup in heapq.merge(*streams, key=lambda tup: tup[1]):
                f.write(format_input(tup) + "\n")
                vids.add(tup[2])
                n += 1
        with writing(tolls_path):
            with tolls_tmp.open("w") as f:
                for line in historical_tolls(sorted(vids), seed=seed):
                    f.write(line + "\n")
            tolls_tmp.replace(tolls_path)
        with writing(input_path):
            input_tmp.replace(input_path)
    finally:
        input_tmp.unlink(missing_ok=True)
        tolls_tmp.unlink(missing_ok=True)
    return GeneratedPaths(input_path, tolls_path, n, n / (L * minutes * 60))


def generate(
    out_dir: str | Path, *, L: float = 1.0, minutes: int = 10, seed: int = 0, rate: float = 2.0
) -> GeneratedPaths:
    """Write ``input.dat`` and ``tolls.dat`` for ``L`` expressways and ``minutes`` minutes."""
    lanes = lanes_of(L)
    check_params(minutes, rate)
    streams = [generate_direction(x, d, minutes=minutes, seed=seed, rate=rate) for x, d in lanes]
    return write_files(Path(out_dir), streams, L=L, minutes=minutes, seed=seed)
