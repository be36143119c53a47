"""Run independent parameter points of a sweep as Spark tasks.

Simulated-time experiments (broadcast cycles, window slides) need no shared
state between points, so each point can be one task: the driver ships
``(index, point)`` pairs, the executors' Python workers call the function, and
the driver gets the results back in input order.  On the local master this
spreads a sweep over the machine's cores; the same call works on a cluster.

The function must be importable by the workers (a module-level function of an
installed package, such as ``txstream.bench.broadcast.run_task``), and so must
everything it returns (plain dicts and numbers are best).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from txstream.errors import TxStreamError

P = TypeVar("P")
R = TypeVar("R")


def run_points(
    fn: Callable[[P], R],
    points: Sequence[P],
    spark: Any | None = None,
    slices: int | None = None,
) -> list[R]:
    """``[fn(p) for p in points]``, computed in Spark tasks; results keep the input order.

    ``spark`` is a SparkSession (default: :func:`txstream.spark.local_session`);
    ``slices`` is the number of tasks (default: one per point, so that slow
    points do not hold up a whole batch of fast ones).
    """
    items = list(points)
    if not items:
        return []
    if slices is not None and slices < 1:
        raise TxStreamError(f"slices must be at least 1, got {slices}")
    if spark is None:
        from txstream.spark.session import local_session

        spark = local_session("txstream-sweep", ui_showConsoleProgress="false")
    sc = spark.sparkContext
    rdd = sc.parallelize(list(enumerate(items)), slices or len(items))
    pairs: list[tuple[int, R]] = rdd.map(lambda kv: (kv[0], fn(kv[1]))).collect()
    pairs.sort(key=lambda kv: kv[0])
    return [result for _, result in pairs]
