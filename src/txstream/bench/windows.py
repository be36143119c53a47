"""``txstream bench windows``: Figures 8-14 of Golab et al. (sliding-window concurrency).

Two workloads on the simulated clock of :mod:`txstream.windows.sim`, each a run
the length of one window (``n*t`` simulated seconds), the same stream and
queries for every scheduler of a repetition:

* ``long`` - long-running top-k and percentile queries only: 40 of them for
  t = 1 s, 100 for t = 5 s, in groups of five, re-executed after every slide;
  n = 10..100 sub-windows.  Figure 8 (aborts, ``lws`` vs ``ttu``), Figures 9-11
  (freshness, inter-execution time, throughput; all four schedulers).
* ``mixed`` - t = 5 s, 100 long-running queries plus snapshot queries arriving
  once a second on average (higher priority).  Figures 12-14 (snapshot response
  time and freshness, long-running freshness).

``costs`` names the cost model (:data:`txstream.windows.engine.COSTS`): ``one``
(the default: a snapshot query's scanned tuple costs a hash-table operation) or
``split`` (scans cheaper by the measured ``JAVA_SCAN_RATIO``):
``txstream bench windows --set costs=split``.

CSV columns: ``workload,scheduler,t,n,...,abort_pct,lr_freshness,lr_inter_exec,
throughput,snap_response,snap_freshness``.
"""

from __future__ import annotations

from typing import Any

from txstream.bench.harness import Experiment, Figure, Param
from txstream.windows.engine import COSTS
from txstream.windows.schedulers import SCHEDULERS as ALL_SCHEDULERS
from txstream.windows.sim import WindowParams, run

SCHEDULERS = ("serial", "ws", "lws", "ttu")
SIZES = tuple(range(10, 101, 10))


def _point(workload: str, scheduler: str, t: float, n: int) -> dict[str, Any]:
    queries = 40 if t == 1 else 100
    return {
        "workload": workload,
        "scheduler": scheduler,
        "t": t,
        "n": n,
        "queries": queries,
        "costs": "one",
    }


GRID = [
    *(_point("long", s, t, n) for t in (1, 5) for n in SIZES for s in SCHEDULERS),
    *(_point("mixed", s, 5, n) for n in SIZES for s in SCHEDULERS),
]
QUICK = [
    *(_point("long", s, 1, n) for n in (10, 50) for s in SCHEDULERS),
    *(_point("mixed", s, 5, 10) for s in SCHEDULERS),
]


def measure(point: dict[str, Any], seed: int) -> dict[str, Any]:
    """One simulated run."""
    params = WindowParams(
        scheduler=point["scheduler"],
        n=point["n"],
        t=float(point["t"]),
        long_queries=point["queries"],
        snapshot_interval=1.0 if point["workload"] == "mixed" else 0.0,
        costs=COSTS[point.get("costs", "one")],
        seed=seed,
    )
    return run(params).metrics


def _fig(name: str, y: str, title: str, workload: str, ylabel: str, **kw: Any) -> Figure:
    """A metric against n, a line per scheduler, from the rows of one workload."""
    if workload == "long":
        kw.setdefault("facet", "t")
    return Figure(
        name,
        x="n",
        y=y,
        title=title,
        series="scheduler",
        ylabel=ylabel,
        where=(("workload", workload),),
        **kw,
    )


EXPERIMENT = Experiment(
    name="windows",
    description="Golab et al. Figures 8-14: lws/ttu aborts, freshness, throughput, snapshots",
    grid=GRID,
    quick_grid=QUICK,
    run=measure,
    params={
        "workload": Param(str, choices=("long", "mixed")),
        "scheduler": Param(str, choices=tuple(ALL_SCHEDULERS)),
        "t": Param(float, lo=0, lo_open=True, hi=60),
        "n": Param(int, lo=2, hi=1_000),
        "queries": Param(int, lo=0, hi=1_000),
        "costs": Param(str, choices=tuple(COSTS)),
    },
    repetitions=3,
    # Section 5.1: every scheduler runs "over an identical query workload" on the
    # same input stream; each repetition draws a new stream.
    same_seed=("scheduler",),
    figures=[
        _fig(
            "windows_fig8_aborts",
            "abort_pct",
            "Fig. 8: aborted read-only transactions, lws vs ttu",
            "long",
            "aborted read-only transactions (%)",
        ),
        _fig(
            "windows_fig9_freshness",
            "lr_freshness",
            "Fig. 9: long-running query freshness",
            "long",
            "freshness (s, lower is better)",
        ),
        _fig(
            "windows_fig10_inter_exec",
            "lr_inter_exec",
            "Fig. 10: inter-execution time",
            "long",
            "inter-execution time (s)",
            logy=True,
        ),
        _fig(
            "windows_fig11_throughput",
            "throughput",
            "Fig. 11: read-only transactions per second",
            "long",
            "committed queries / s",
            logy=True,
        ),
        _fig(
            "windows_fig12_snapshot_response",
            "snap_response",
            "Fig. 12: snapshot response time (t = 5 s)",
            "mixed",
            "response time (s)",
            logy=True,
        ),
        _fig(
            "windows_fig13_snapshot_freshness",
            "snap_freshness",
            "Fig. 13: snapshot freshness (t = 5 s)",
            "mixed",
            "freshness (s)",
        ),
        _fig(
            "windows_fig14_long_freshness",
            "lr_freshness",
            "Fig. 14: long-running freshness, mixed workload (t = 5 s)",
            "mixed",
            "freshness (s)",
        ),
    ],
)
