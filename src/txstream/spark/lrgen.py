"""Linear Road input generation as a Spark job: one task per expressway.

Each task runs :func:`txstream.linearroad.generate.generate_direction` for the
directions of its expressway (seeded by ``(seed, xway, dir)``), so the result
is the same file the sequential generator writes; the driver merges the
per-expressway streams by time and writes the input and historical tolls.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from txstream.linearroad.generate import (
    GeneratedPaths,
    check_params,
    generate_direction,
    lanes_of,
    write_files,
)


def _xway_task(lanes: list[tuple[int, int]], minutes: int, seed: int, rate: float) -> Any:
    """The Spark task body: every tuple of the given directions of one expressway."""

    def run(part: Any) -> Any:
        for xway in part:
            for x, d in lanes:
                if x == xway:
                    yield (x, d, generate_direction(x, d, minutes=minutes, seed=seed, rate=rate))

    return run


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
        from txstream.spark.session import local_session

        spark = local_session("txstream-lrgen")
    xways = sorted({x for x, _ in lanes})
    rdd = spark.sparkContext.parallelize(xways, len(xways))
    parts = rdd.mapPartitions(_xway_task(lanes, minutes, seed, rate)).collect()
    by_lane: dict[tuple[int, int], list[tuple[int, ...]]] = defaultdict(list)
    for x, d, tuples in parts:
        by_lane[(x, d)] = [tuple(t) for t in tuples]
    streams = [by_lane[lane] for lane in lanes]
    return write_files(Path(out_dir), streams, L=L, minutes=minutes, seed=seed)
