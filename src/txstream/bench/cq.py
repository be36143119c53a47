"""``txstream bench cq``: Figures 7 and 8 of Oyamada et al. (SAC 2013).

* ``sweep=rate`` (Figure 7): window range r = 5 (slide 2), update rates 1 to
  100,000 transactions per second: the proportion of consistent results and
  the CQ throughput per strategy;
* ``sweep=range`` (Figure 8): r = 5 to 640 (slide floor(r/2)) at the highest
  update rate: update-transaction and CQ throughput per strategy.

Each run lets the query run for ``seconds`` of wall-clock time against a
10,000-row table while two updater threads dispatch update transactions at the
rate (rates above what Python threads reach are measured as reached: the
``update_throughput`` column). ``naive`` in the same run is the baseline.

CQ throughput is reported in two units: ``cq_throughput``, results (committed
CQ-derived transactions) per second, and ``cq_event_throughput``, input events
per second that the committed windows cover (:func:`events_covered`).  Figure
8b plots the second: the paper explains its rising curve by per-event work
(the join is blocked less often by updates) and, with slide floor(r/2), a
result covers about r input events, so results per second must fall with r
unless per-event speed grows more than r-fold (128-fold from r = 5 to 640).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from txstream.bench.harness import Experiment, Figure
from txstream.cq.workload import CQRun, run

STRATEGIES = ("naive", "s2pl", "snapshot", "optimistic")
RATES = (1, 10, 100, 1_000, 10_000, 100_000)
RANGES = (5, 10, 20, 40, 80, 160, 320, 640)


def _grid(rates: tuple[int, ...], ranges: tuple[int, ...], seconds: float) -> list[dict[str, Any]]:
    points = [
        {"sweep": "rate", "strategy": s, "update_rate": rate, "window_range": 5, "seconds": seconds}
        for rate in rates
        for s in STRATEGIES
    ]
    points += [
        {
            "sweep": "range",
            "strategy": s,
            "update_rate": max(rates),
            "window_range": r,
            "seconds": seconds,
        }
        for r in ranges
        for s in STRATEGIES
    ]
    return points


SELECTIVITY = 0.5
"""The query's selection (price <= 50 of prices uniform on 1..100, also after
updates, which draw from the same distribution) keeps half the joined events."""


def events_covered(results: int, r: int) -> float:
    """Input events that ``results`` consecutive windows (range r, slide floor(r/2)) cover.

    ``results`` windows span ``(results - 1) * s + r`` selected events, each
    standing for ``1 / SELECTIVITY`` input events on average.
    """
    if results <= 0:
        return 0.0
    s = max(1, r // 2)
    return ((results - 1) * s + r) / SELECTIVITY


def measure(point: dict[str, Any], seed: int) -> dict[str, Any]:
    """One run of the query under updaters."""
    seconds = float(point["seconds"])
    m = run(
        CQRun(
            strategy=point["strategy"],
            update_rate=float(point["update_rate"]),
            r=int(point["window_range"]),
            seconds=seconds,
            events=int(300_000 * seconds),
            seed=seed,
        )
    )
    keys = ("consistent_ratio", "cq_throughput", "cq_cpu_throughput", "update_throughput", "redos")
    out = {k: m[k] for k in keys}
    results = int(m["results"])
    # results / elapsed is cq_throughput: elapsed = results / cq_throughput
    per_result = events_covered(results, int(point["window_range"])) / results if results else 0.0
    out["cq_event_throughput"] = m["cq_throughput"] * per_result
    return out


_FIG7 = partial(Figure, x="update_rate", series="strategy", logx=True, where=(("sweep", "rate"),))
"""Fig. 7's frame: against the update rate (the ``rate`` sweep), a line per strategy."""
_FIG8 = partial(Figure, x="window_range", series="strategy", logx=True, where=(("sweep", "range"),))
"""Fig. 8's frame: against the window range (the ``range`` sweep), a line per strategy."""

EXPERIMENT = Experiment(
    name="cq",
    description="Oyamada et al. Figures 7-8: consistency and throughput per CQ strategy",
    grid=_grid(RATES, RANGES, 2.0),
    quick_grid=_grid((1, 1_000, 100_000), (5, 80), 0.5),
    run=measure,
    repetitions=2,
    figures=[
        _FIG7(
            "cq_fig7a_consistency",
            y="consistent_ratio",
            title="Fig. 7a: proportion of consistent results (r = 5)",
            ylabel="consistent results / results",
        ),
        _FIG7(
            "cq_fig7b_cq_throughput",
            y="cq_throughput",
            title="Fig. 7b: CQ throughput (r = 5)",
            logy=True,
            ylabel="results / s",
        ),
        _FIG7(
            "cq_fig7b_cq_cpu_throughput",
            y="cq_cpu_throughput",
            title="Fig. 7b per CPU second of the query's thread (r = 5)",
            logy=True,
            ylabel="results / CPU s",
        ),
        _FIG8(
            "cq_fig8a_update_throughput",
            y="update_throughput",
            title="Fig. 8a: update transactions committed per second",
            ylabel="update txn / s",
        ),
        _FIG8(
            "cq_fig8b_cq_throughput",
            y="cq_event_throughput",
            title="Fig. 8b: CQ throughput at the highest update rate",
            logy=True,
            ylabel="input events / s",
        ),
        _FIG8(
            "cq_fig8b_results",
            y="cq_throughput",
            title="Fig. 8b counted in results (one per window)",
            logy=True,
            ylabel="results / s",
        ),
    ],
)
