"""Figure 7b's query without updaters or garbage collector: CPU microseconds per result.

The work each strategy adds to ``naive`` per window, without what moves
``cq-ratio.py``'s baseline (updater threads, the collector's full passes over
the pre-built input). Runs the experiment's query (r = 5, slide 2, a
10,000-row table) to ``--results`` results per run, the four strategies
interleaved, ``--reps`` times, and prints each strategy's runs sorted and the
ratio of ``naive``'s best to its best.

    PYTHONPATH=src .venv/bin/python scripts/cq-pure.py [--reps 5] [--results 20000] \
        [--strategies naive,s2pl]
"""

from __future__ import annotations

import argparse
import gc
import random
import time

from txstream.cq.engine import CQEngine
from txstream.cq.workload import COLUMNS, TABLE, build_query, events, load_table, new_part

STRATEGIES = ("naive", "s2pl", "snapshot", "optimistic")


def main() -> None:
    """Run the strategies interleaved; print microseconds per result."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--results", type=int, default=20_000)
    p.add_argument(
        "--strategies", default=",".join(STRATEGIES), help="comma-separated, naive first"
    )
    a = p.parse_args()
    chosen = [s for s in a.strategies.split(",") if s]
    if not chosen or chosen[0] != "naive" or not set(chosen) <= set(STRATEGIES):
        p.error(f"--strategies: naive first, then some of {', '.join(STRATEGIES[1:])}")
    stream = events(10 * a.results, 10_000, 1)
    runs: dict[str, list[float]] = {s: [] for s in chosen}
    for rep in range(a.reps):
        for s in chosen:
            rng = random.Random(rep)
            tm = load_table(s, {k: new_part(rng) for k in range(10_000)})
            engine = CQEngine(build_query(5), tm, s, {TABLE: COLUMNS})
            gc.disable()
            try:
                cpu = time.thread_time()
                results = engine.run(stream, max_results=a.results)
                cpu = time.thread_time() - cpu
            finally:
                gc.enable()
            runs[s].append(cpu / len(results) * 1e6)
    best = min(runs["naive"])
    for s, values in runs.items():
        shown = " ".join(f"{v:.2f}" for v in sorted(values))
        print(f"{s:10s} {shown} us/result; naive's best / its best: {best / min(values):.3f}")


if __name__ == "__main__":
    main()
