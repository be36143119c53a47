"""``txstream bench broadcast``: Figures 1-3 of Shanmugasundaram et al. (SIGMOD 1999).

Each grid point varies one parameter of Table 1 (a *sweep*) for one algorithm
(``f-matrix``, ``r-matrix``, ``datacycle``, ``f-matrix-no``):

* ``client_txn_length`` (Figure 1: response time and restarts),
* ``server_txn_length`` and ``server_interarrival`` (Figure 2),
* ``objects`` and ``object_bytes`` (Figure 3);
* ``groups``: the grouped matrix with g groups at client length 8 (the spectrum
  between Datacycle's vector and F-Matrix that Section 3.2.2 describes but does
  not measure).

A point runs independent replications of 1000 client transactions, each
measured on its last 500, until the 95% confidence interval of the mean response
time is within 10% of the mean (at least ``min_reps``, at most ``max_reps``).
Rows carry the point (``sweep``, ``x``, ``algorithm``), every parameter, the
means over replications, the interval's half-width and the replication count.

``txstream bench broadcast [--out DIR]`` (or ``python -m txstream bench
broadcast``) runs the full grid as a Spark job, every point a task on a local
SparkSession (``--no-spark``: one point after another in this process, with
identical rows: same seeds, same code per point); ``--quick`` runs in this
process unless ``--spark``.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

from txstream.bench.harness import Experiment, Figure, Param
from txstream.broadcast.base import ALGORITHM_NAMES, BroadcastError
from txstream.broadcast.params import step_budget
from txstream.broadcast.sim import SimParams, simulate
from txstream.errors import TxStreamError

ALGORITHMS = ("f-matrix", "r-matrix", "datacycle", "f-matrix-no")

SWEEPS: dict[str, list[float]] = {
    "client_txn_length": [2, 4, 6, 8, 10],
    "server_txn_length": [2, 4, 8, 12, 16],
    "server_interarrival": [100_000, 175_000, 250_000, 400_000, 600_000],
    "objects": [100, 200, 300, 400, 500],
    "object_bytes": [64, 128, 256, 512, 1024, 2048],
}

# The grouped matrix's spectrum (Section 3.2.2): g groups at client length 8,
# from one group (Datacycle's vector) to one per object (F-Matrix).
GROUP_SWEEP: dict[str, list[float]] = {"groups": [1, 3, 10, 30, 100, 300]}
GROUPS_CLIENT_LENGTH = 8

QUICK_SWEEPS: dict[str, list[float]] = {
    "client_txn_length": [2, 8],
    "object_bytes": [128, 1024],
}

# Two-sided 95% quantiles of Student's t by degrees of freedom.
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228]


BUDGET_FACTOR = 4
"""A point may take this many times the command line's step budget.  With server
transactions that write all their objects, Datacycle restarts as often as the
paper's (hundreds of cycles per transaction at client length 8 or more), and
every server transaction of those cycles is a step."""


def params_for(point: dict[str, Any]) -> SimParams:
    """The simulation parameters of a grid point (Table 1 plus the swept value)."""
    sweep = point["sweep"]
    x = point["x"]
    transactions = int(point.get("transactions", 1000))
    base = SimParams(
        algorithm=point["algorithm"],
        transactions=transactions,
        measured=int(point.get("measured", 500)),
        max_steps=BUDGET_FACTOR * step_budget(transactions),
    )
    if sweep == "object_bytes":
        return _replace(base, object_bits=int(x) * 8)
    if sweep in ("client_txn_length", "server_txn_length", "objects"):
        return _replace(base, **{sweep: int(x)})
    if sweep == "server_interarrival":
        return _replace(base, server_interarrival=float(x))
    if sweep == "groups":
        return _replace(base, groups=int(x), client_txn_length=GROUPS_CLIENT_LENGTH)
    known = [*SWEEPS, *GROUP_SWEEP]
    raise TxStreamError(f"unknown sweep {sweep!r}; choose one of: {', '.join(known)}")


def _replace(p: SimParams, **changes: Any) -> SimParams:
    from dataclasses import replace

    return replace(p, **changes)


def run_point(point: dict[str, Any], seed: int) -> dict[str, Any]:
    """Replicate the simulation of one point until the 95% CI is within 10% of the mean."""
    params = params_for(point)
    min_reps = int(point.get("min_reps", 3))
    max_reps = int(point.get("max_reps", 8))
    rts: list[float] = []
    rss: list[float] = []
    started = time.perf_counter()
    half = math.inf
    while len(rts) < max_reps:
        try:
            result = simulate(params, seed * 101 + len(rts))
        except BroadcastError as exc:
            if "did not finish" not in str(exc):
                raise
            # The paper's "outside the limits of the Y-axis": no number, a marked row.
            return {**_point_columns(params), "response_time": None, "restarts": None,
                    "beyond_budget": 1, "replications": len(rts),
                    "wall_s": round(time.perf_counter() - started, 2)}  # fmt: skip
        rts.append(result.response_time)
        rss.append(result.restarts)
        if len(rts) >= 2:
            t = _T95[min(len(rts) - 2, len(_T95) - 1)]
            half = t * statistics.stdev(rts) / math.sqrt(len(rts))
        if len(rts) >= min_reps and half <= 0.1 * statistics.fmean(rts):
            break
    return {
        "response_time": statistics.fmean(rts),
        "restarts": statistics.fmean(rss),
        "response_time_ci": half if math.isfinite(half) else None,
        "replications": len(rts),
        **_point_columns(params),
        "cycle_length": result.cycle_length,
        "beyond_budget": 0,
        "wall_s": round(time.perf_counter() - started, 2),
    }


def _point_columns(params: SimParams) -> dict[str, Any]:
    return {
        "client_txn_length": params.client_txn_length,
        "server_txn_length": params.server_txn_length,
        "server_interarrival": params.server_interarrival,
        "objects": params.objects,
        "object_bytes": params.object_bits // 8,
        "groups": params.groups,
        "server_ops": params.server_ops,
    }


def run_task(task: tuple[dict[str, Any], int]) -> dict[str, Any]:
    """One ``(point, seed)`` as a row, the way the harness builds rows (for Spark tasks)."""
    point, seed = task
    return {**point, "rep": 0, "seed": seed, **run_point(dict(point), seed)}


def _grid(
    sweeps: dict[str, list[float]], algorithms: tuple[str, ...] = ALGORITHMS, **extra: Any
) -> list[dict[str, Any]]:
    return [
        {"sweep": sweep, "x": x, "algorithm": algorithm, **extra}
        for sweep, xs in sweeps.items()
        for x in xs
        for algorithm in algorithms
    ]


FIGURES = [
    Figure(
        name="broadcast_response",
        x="x",
        y="response_time",
        title="Response time (bit-units)",
        series="algorithm",
        facet="sweep",
        logy=True,
        ylabel="response time (bit-units, log)",
    ),
    Figure(
        name="broadcast_restarts",
        x="x",
        y="restarts",
        title="Restarts per transaction",
        series="algorithm",
        facet="sweep",
        ylabel="restarts per transaction",
    ),
]

EXPERIMENT = Experiment(
    name="broadcast",
    description="F-Matrix, R-Matrix, Datacycle: response time and restarts (Figures 1-3)",
    grid=_grid(SWEEPS) + _grid(GROUP_SWEEP, ("grouped",)),
    quick_grid=_grid(QUICK_SWEEPS, transactions=300, measured=150, min_reps=1, max_reps=1),
    run=run_point,
    params={
        "sweep": Param(str, choices=(*SWEEPS, *GROUP_SWEEP)),
        "x": Param(float, lo=0, lo_open=True, hi=1e12),
        "algorithm": Param(str, choices=ALGORITHM_NAMES),
        "transactions": Param(int, lo=1, hi=10_000_000),
        "measured": Param(int, lo=1, hi=10_000_000),
        "min_reps": Param(int, lo=1, hi=1000),
        "max_reps": Param(int, lo=1, hi=1000),
    },
    figures=FIGURES,
    repetitions=1,
    quick_repetitions=1,
    spark_default=True,
)


def tasks(quick: bool = False, seed: int = 0) -> list[tuple[dict[str, Any], int]]:
    """The ``(point, seed)`` pairs, seeded exactly as the harness seeds them."""
    grid = EXPERIMENT.quick_grid if quick else EXPERIMENT.grid
    return [(dict(point), seed * 1_000_003 + i) for i, point in enumerate(grid)]
