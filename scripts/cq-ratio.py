"""Figure 7b focused: each CQ strategy's throughput against naive's at low update rates.

Runs the experiment's query (r = 5, slide 2, a 10,000-row table, two updater
threads) for ``--seconds`` per run, the four strategies interleaved, ``--reps``
times per rate, and prints per strategy and rate the best run's results per
wall-clock second and per CPU second of the query's thread, each also as a
ratio to ``naive``. CPU seconds make the comparison hold on a machine other
work loads (wall-clock results per second then swing with the load). Each
line ends with the median, over the repetitions, of the strategy's ratio to
``naive`` in the same repetition per CPU second: a best run of ``naive``
(the collector happened to run little in it) moves the best-to-best ratio
but not this one.  A third line gives, per strategy, the median update
transactions per second the updaters got done (a strategy that holds read
locks longer may slow them).

    PYTHONPATH=src .venv/bin/python scripts/cq-ratio.py [--rates 1,10,100,1000] [--reps 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from txstream.cq.engine import CQEngine, Updaters
from txstream.cq.workload import COLUMNS, TABLE, build_query, events, load_table, new_part

STRATEGIES = ("naive", "s2pl", "snapshot", "optimistic")


def main() -> None:
    """Parse the options, run the grid, print one line per rate."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="1,10,100,1000")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--seconds", type=float, default=1.0)
    a = p.parse_args()
    stream = events(600_000, 10_000, 1)
    for rate in (float(x) for x in a.rates.split(",")):
        best: dict[str, tuple[float, float]] = {}
        per_rep: dict[str, list[float]] = {s: [] for s in STRATEGIES}
        updates: dict[str, list[float]] = {s: [] for s in STRATEGIES}
        for rep in range(a.reps):
            for s in STRATEGIES:
                rng = random.Random(rep)
                tm = load_table(s, {k: new_part(rng) for k in range(10_000)})
                engine = CQEngine(build_query(5), tm, s, {TABLE: COLUMNS})
                up = None
                if rate > 0:
                    up = Updaters(tm, TABLE, range(10_000), rate, new_part, seed=rep).start()
                cpu, wall = time.thread_time(), time.monotonic()
                results = engine.run(stream, until=wall + a.seconds)
                cpu, wall = time.thread_time() - cpu, time.monotonic() - wall
                if up is not None:
                    updates[s].append(up.stop())
                w, c = best.get(s, (0.0, 0.0))
                best[s] = (
                    max(w, len(results) / wall),
                    max(c, len(results) / cpu if cpu > 0 else 0),
                )
                per_rep[s].append(len(results) / cpu if cpu > 0 else 0.0)
        nw, nc = best["naive"]
        if not nw:  # (a host so loaded that naive got no window done in any repetition)
            raise SystemExit(f"rate {rate:g}: naive produced no result in {a.seconds} s")
        cells = [
            f"{s} {w:,.0f}/s ({w / nw:.2f}x) {c:,.0f}/cpu-s ({c / nc:.2f}x)"
            for s, (w, c) in best.items()
        ]
        paired = []
        for s, v in per_rep.items():
            # (a repetition in which naive produced nothing has no ratio)
            ratios = [c / n for c, n in zip(v, per_rep["naive"], strict=True) if n]
            if s != "naive":
                paired.append(f"{s} {statistics.median(ratios):.2f}x")
        print(f"rate {rate:g}: " + " | ".join(cells), flush=True)
        print(f"rate {rate:g}, median ratio per repetition (CPU): " + ", ".join(paired), flush=True)
        if rate > 0:
            done = [f"{s} {statistics.median(v):,.0f}/s" for s, v in updates.items()]
            print(f"rate {rate:g}, updates done (median): " + ", ".join(done), flush=True)


if __name__ == "__main__":
    main()
