"""Figure 7b's query under valgrind: machine instructions per window, per strategy.

A measure that does not move with the host's load (wall-clock and CPU
seconds swing on a shared machine): runs the experiment's query (r = 5,
slide 2, a 10,000-row table, no updaters, no collector) to 1,000 and to
4,000 results under ``valgrind --tool=cachegrind`` with a fixed hash seed,
and prints the difference divided by 3,000 (set-up and interpreter exit
cancel out).  Needs valgrind; about a minute per strategy.

    PYTHONPATH=src .venv/bin/python scripts/cq-instructions.py [--strategies naive,s2pl]
        [--gc] [--functions 20] [--cache]

``--gc`` leaves the cyclic collector on (``scripts/cq-ratio.py`` runs with it);
``--functions N`` runs callgrind instead and also prints the N interpreter (C)
functions with the most instructions per window (self cost), e.g. the
collector's ``gc_collect_main`` or the lock's ``acquire``; ``--cache`` turns
on cachegrind's cache simulation and also prints the I1 and D1 misses per
window (its simulated caches, not this host's: deterministic like the count).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile


def child(strategy: str, results: int, collect: bool) -> None:
    """The measured run (in valgrind): the query to ``results`` results, then exit at once.

    ``collect``: the cyclic collector stays on, as in ``scripts/cq-ratio.py``
    (its passes are deterministic: they follow allocation counts).
    """
    import gc
    import random

    from txstream.cq.engine import CQEngine
    from txstream.cq.workload import COLUMNS, TABLE, build_query, events, load_table, new_part

    stream = events(50_000, 10_000, 1)
    rng = random.Random(0)
    tm = load_table(strategy, {k: new_part(rng) for k in range(10_000)})
    engine = CQEngine(build_query(5), tm, strategy, {TABLE: COLUMNS})
    gc.collect()
    if not collect:
        gc.disable()
    engine.run(stream, max_results=results)
    os._exit(0)  # (no collection at exit: its cost grows with what the run left alive)


def _valgrind(strategy: str, results: int, collect: bool, tool: list[str]) -> str:
    """Run one child under valgrind with ``tool``'s options; its stderr."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    return subprocess.run(
        [
            "valgrind",
            *tool,
            sys.executable,
            __file__,
            "--child",
            strategy,
            str(results),
            "gc" if collect else "nogc",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stderr


def instructions(strategy: str, results: int, collect: bool = False) -> int:
    """Instructions valgrind counted for one child run."""
    return counts(strategy, results, collect, cache=False)[0]


def counts(strategy: str, results: int, collect: bool, cache: bool) -> tuple[int, int, int]:
    """Instructions, I1 misses and D1 misses (0, 0 without ``cache``) of one child run."""
    out = _valgrind(
        strategy,
        results,
        collect,
        [
            "--tool=cachegrind",
            f"--cache-sim={'yes' if cache else 'no'}",
            "--cachegrind-out-file=/dev/null",
        ],
    )
    found = []
    for label in ("I\\s+refs", "I1\\s+misses", "D1\\s+misses") if cache else ("I\\s+refs",):
        match = re.search(label + r":\s+([\d,]+)", out)
        if match is None:
            raise SystemExit(f"no {label} count in valgrind's output:\n{out[-2000:]}")
        found.append(int(match.group(1).replace(",", "")))
    found += [0, 0]
    return found[0], found[1], found[2]


def functions(strategy: str, results: int, collect: bool) -> dict[str, int]:
    """Instructions per function (self cost, callgrind) for one child run."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "callgrind.out")
        _valgrind(strategy, results, collect, ["--tool=callgrind", f"--callgrind-out-file={path}"])
        text = subprocess.run(
            ["callgrind_annotate", "--threshold=100", path],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    costs: dict[str, int] = {}
    for line in text.splitlines():
        # "1,234,567 (12.3%)  file.c:function [object]" (older: without the percentage)
        match = re.match(r"\s*([\d,]+)\s+(?:\(\s*[\d.]+%\)\s+)?(\S.*?)(?:\s+\[.*\])?$", line)
        if match is not None and ":" in match.group(2):
            name = match.group(2).rsplit("/", 1)[-1]  # "ceval.c:_PyEval_EvalFrameDefault"
            costs[name] = costs.get(name, 0) + int(match.group(1).replace(",", ""))
    return costs


def main() -> None:
    """Parse the options; print instructions per window for each strategy."""
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "gc")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategies", default="naive,s2pl")
    p.add_argument(
        "--gc", action="store_true", help="leave the cyclic collector on (as cq-ratio.py does)"
    )
    p.add_argument(
        "--functions",
        type=int,
        default=0,
        metavar="N",
        help="under callgrind: also the N functions with the most instructions per window",
    )
    p.add_argument(
        "--cache",
        action="store_true",
        help="cachegrind's cache simulation: also I1 and D1 misses per window",
    )
    a = p.parse_args()
    for strategy in a.strategies.split(","):
        if a.functions:
            lo, hi = functions(strategy, 1000, a.gc), functions(strategy, 4000, a.gc)
            per = {f: (hi.get(f, 0) - lo.get(f, 0)) // 3000 for f in hi.keys() | lo.keys()}
            print(f"{strategy:10s} {sum(per.values()):,} instructions per window", flush=True)
            for f, n in sorted(per.items(), key=lambda kv: -kv[1])[: a.functions]:
                print(f"  {n:>9,}  {f}", flush=True)
            continue
        hi, lo = counts(strategy, 4000, a.gc, a.cache), counts(strategy, 1000, a.gc, a.cache)
        per = [(h - low) // 3000 for h, low in zip(hi, lo, strict=True)]
        line = f"{strategy:10s} {per[0]:,} instructions per window"
        if a.cache:
            line += f", {per[1]:,} I1 misses, {per[2]:,} D1 misses"
        print(line, flush=True)


if __name__ == "__main__":
    main()
