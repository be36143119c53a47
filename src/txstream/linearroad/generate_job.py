"""Linear Road input generation as a Spark job: one task per expressway.

Each task runs :func:`txstream.linearroad.generate.generate_direction` for the
directions of its expressway (seeded by ``(seed, xway, dir)``), so the result
is the same file the sequential generator writes; the driver merges the
per-expressway streams by time and writes the input and historical tolls.  The
tasks go through the runtime's generic :func:`txstream.spark.sweep.run_points`.
"""

from __future__ import annotations

from collections import defaultdict
from functools import partial
from pathlib import Path
from typing import Any

from txstream.linearroad.generate import (
    GeneratedPaths,
    check_params,
    generate_direction,
    lanes_of,
    write_files,
)
from txstream.spark.session import local_session
from txstream.spark.sweep import run_points


def xway_tuples(
    lanes: list[tuple[int, int]], minutes: int, seed: int, rate: float, xway: int
) -> list[tuple[int, int, Any]]:
    """The Spark task body: every tuple of the given directions of one expressway."""
    return [
        (x, d, generate_direction(x, d, minutes=minutes, seed=seed, rate=rate))
        for x, d in lanes
        if x == xway
    ]


def generate_spark(
    out_dir: str | Path,
    *,
    L: float = 1.0,
    minutes: int = 10,
    seed: int = 0,
    rate: float = 2.0,
    spark: Any = None,
) -> GeneratedPaths:
    """Like :func:`txstream.linearroad.generate.generate`, one Spark task per expressway."""
    lanes = lanes_of(L)
    # Fail on bad values before Spark starts.
    check_params(minutes, rate)
    if spark is None:
        spark = local_session("txstream-lrgen")
    xways = sorted({x for x, _ in lanes})
    parts = run_points(partial(xway_tuples, lanes, minutes, seed, rate), xways, spark=spark)
    by_lane: dict[tuple[int, int], list[tuple[int, ...]]] = defaultdict(list)
    for part in parts:
        for x, d, tuples in part:
            by_lane[(x, d)] = [tuple(t) for t in tuples]
    streams = [by_lane[lane] for lane in lanes]
    return write_files(Path(out_dir), streams, L=L, minutes=minutes, seed=seed)
