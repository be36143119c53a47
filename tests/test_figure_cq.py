"""Oyamada et al.: Figure 8b in input events per second.

The test fails if a parameter of the figure's setup is not applied; it does not
measure the figure (no timing).
"""

from __future__ import annotations

import pytest

from txstream.bench import cq as bench_cq

# -- Oyamada et al.: Figure 8b in input events per second ----------------------------------------


def test_cq_figure_8b_counts_input_events() -> None:
    # windows of r = 10 slide by 5 selected events; half the joined events are selected
    assert bench_cq.events_covered(1, 10) == 20
    assert bench_cq.events_covered(3, 10) == (2 * 5 + 10) * 2
    assert bench_cq.events_covered(0, 10) == 0
    (fig,) = [f for f in bench_cq.EXPERIMENT.figures if f.name == "cq_fig8b_cq_throughput"]
    assert fig.y == "cq_event_throughput"


def test_cq_measure_reports_events_per_second(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = {
        "results": 4,
        "consistent_ratio": 1.0,
        "cq_throughput": 8.0,  # 4 results in 0.5 s
        "cq_cpu_throughput": 9.0,
        "update_throughput": 1.0,
        "redos": 0,
    }
    monkeypatch.setattr(bench_cq, "run", lambda p: fake)
    point = {"strategy": "naive", "update_rate": 1, "window_range": 80, "seconds": 0.5}
    out = bench_cq.measure(point, seed=1)
    assert out["cq_event_throughput"] == pytest.approx((3 * 40 + 80) * 2 / 0.5)
