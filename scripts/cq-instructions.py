"""Figure 7b's query under valgrind: machine instructions per window, per strategy.

A measure that does not move with the host's load (wall-clock and CPU
seconds swing on a shared machine): runs the experiment's query (r = 5,
slide 2, a 10,000-row table, no updaters, no collector) to 1,000 and to
4,000 results under ``valgrind --tool=cachegrind`` with a fixed hash seed,
and prints the difference divided by 3,000 (set-up and interpreter exit
cancel out).  Needs valgrind; about a minute per strategy.

    PYTHONPATH=src .venv/bin/python scripts/cq-instructions.py [--strategies naive,s2pl]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys


def child(strategy: str, results: int) -> None:
    """The measured run (in valgrind): the query to ``results`` results, then exit at once."""
    import gc
    import random

    from txstream.cq.engine import CQEngine
    from txstream.cq.workload import COLUMNS, TABLE, build_query, events, load_table, new_part

    stream = events(50_000, 10_000, 1)
    rng = random.Random(0)
    tm = load_table(strategy, {k: new_part(rng) for k in range(10_000)})
    engine = CQEngine(build_query(5), tm, strategy, {TABLE: COLUMNS})
    gc.disable()
    engine.run(stream, max_results=results)
    os._exit(0)  # (no collection at exit: its cost grows with what the run left alive)


def instructions(strategy: str, results: int) -> int:
    """Instructions valgrind counted for one child run."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    out = subprocess.run(
        [
            "valgrind",
            "--tool=cachegrind",
            "--cache-sim=no",
            "--cachegrind-out-file=/dev/null",
            sys.executable,
            __file__,
            "--child",
            strategy,
            str(results),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    match = re.search(r"I\s+refs:\s+([\d,]+)", out)
    if match is None:
        raise SystemExit(f"no instruction count in valgrind's output:\n{out[-2000:]}")
    return int(match.group(1).replace(",", ""))


def main() -> None:
    """Parse the options; print instructions per window for each strategy."""
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategies", default="naive,s2pl")
    a = p.parse_args()
    for strategy in a.strategies.split(","):
        per = (instructions(strategy, 4000) - instructions(strategy, 1000)) // 3000
        print(f"{strategy:10s} {per:,} instructions per window", flush=True)


if __name__ == "__main__":
    main()
