"""The cost of one hash-table operation against one scanned tuple (Golab et al., issue 31).

The simulated clock of ``txstream.windows.sim`` charges two kinds of work:
a long-running read builds a hash table on its attribute (a unit per tuple put
into it and per entry merged into the group's answer: ``Costs.per_unit``), and
a snapshot query scans tuples (a subset test and an add per tuple:
``Costs.per_scan_tuple``).  This script measures their ratio in two
implementations, over the same 100,000 tuples (100 sub-windows of 1,000, the
calibration point t = 1 s, n = 100):

* ``--java`` (the default): ``scripts/WindowOps.java``, a stand-in in the
  paper's language (its Section 5.1: Java, J2SE 1.4.2), run with the serial
  collector and without escape analysis (as 1.4.2's HotSpot had), and with
  today's default JVM settings, ``--runs`` times each; process CPU time.
* ``--python``: the simulator's own data structures (``QueryGroup._scan`` in
  window-scan mode and ``QueryGroup._fold``), counted in machine instructions
  under valgrind (two sizes, the difference divided: load-proof), or with
  ``--cpu`` in CPU seconds of alternated rounds.

    PYTHONPATH=src .venv/bin/python scripts/windows-op-ratio.py [--java] [--python] [--cpu]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUBS, TUPLES = 100, 1000
JAVA_FLAGS = (
    ("-XX:+UseSerialGC", "-XX:-DoEscapeAnalysis"),  # as J2SE 1.4.2's HotSpot: no escape analysis
    (),  # today's defaults (G1, escape analysis)
)


def _structures() -> tuple[object, object, list[object]]:
    """A long-running group, a snapshot group and 100 sub-windows of the simulator."""
    from txstream.windows.queries import Query, QueryGroup
    from txstream.windows.sim import WindowParams, packets
    from txstream.windows.window import SlidingWindow

    p = WindowParams(n=SUBS, t=1.0)
    rng = random.Random(0)
    window = SlidingWindow(SUBS, 1.0)
    subs = []
    for k in range(SUBS):
        rows = packets(rng, p, k * 1.0)[:TUPLES]
        while len(rows) < TUPLES:  # a quiet sub-window: top it up to the same size
            rows += packets(rng, p, k * 1.0)[: TUPLES - len(rows)]
        subs.append(rows)
    long = QueryGroup([Query("topk", SUBS, attr="src", k=10)], window, mode="ws")
    subset = frozenset(rng.sample(range(1000), 20))
    snap = QueryGroup([Query("sum", SUBS, attr="src", subset=subset)], window, mode="ws")
    return long, snap, subs


class _Sub:
    """What ``QueryGroup._scan`` reads of a sub-window: its tuples."""

    def __init__(self, tuples: list[object]) -> None:
        self.tuples = tuples


def child(kind: str, reps: int) -> None:
    """Run ``reps`` long-running executions or snapshot scans over the 100 sub-windows."""
    import gc

    long, snap, rows = _structures()
    subs = [_Sub(r) for r in rows]
    gc.collect()
    for _ in range(reps):
        _work(kind, long, snap, subs)
    os._exit(0)


def _work(kind: str, long: object, snap: object, subs: list[_Sub]) -> None:
    """One pass over the sub-windows: a long-running read (``long``) or a snapshot scan."""
    if kind == "long":
        acc: dict[object, float] = {}
        for s in subs:
            acc = long._fold(acc, long._scan(s))  # type: ignore[attr-defined]
    else:
        for s in subs:
            snap._scan(s)  # type: ignore[attr-defined]


def _entries() -> int:
    """The entries one long-running execution merges (the sub-windows' distinct sources)."""
    long, _, rows = _structures()
    return sum(len(long._scan(_Sub(r))) for r in rows)  # type: ignore[attr-defined]


def python_instructions() -> None:
    """Instructions per long-running unit and per scanned tuple (valgrind, two sizes)."""
    sys.path.insert(0, str(HERE))
    from valgrind_count import instructions

    me = str(Path(__file__).resolve())
    per: dict[str, float] = {}
    entries = _entries()
    for kind in ("long", "scan"):
        lo = instructions(me, "--child", kind, "1")
        hi = instructions(me, "--child", kind, "3")
        units = SUBS * TUPLES + (entries if kind == "long" else 0)
        per[kind] = (hi - lo) / 2 / units
    print(
        f"python {sys.version.split()[0]} (valgrind): instructions per long-running unit "
        f"{per['long']:.0f}, per tuple scanned {per['scan']:.0f}; "
        f"unit/scan {per['long'] / per['scan']:.2f}"
    )


def python_cpu(rounds: int) -> None:
    """Their ratio in CPU seconds, over ``rounds`` alternated rounds."""
    long, snap, rows = _structures()
    subs = [_Sub(r) for r in rows]
    entries = _entries()
    ratios = []
    for r in range(rounds):
        times = {}
        for kind in ("long", "scan") if r % 2 == 0 else ("scan", "long"):
            t0 = time.process_time()
            _work(kind, long, snap, subs)
            times[kind] = time.process_time() - t0
        ratios.append(
            (times["long"] / (SUBS * TUPLES + entries)) / (times["scan"] / (SUBS * TUPLES))
        )
    print(
        f"python {sys.version.split()[0]} (CPU, {rounds} alternated rounds): unit/scan "
        f"median {statistics.median(ratios):.2f} (min {min(ratios):.2f}, max {max(ratios):.2f})"
    )


def java(runs: int) -> None:
    """``scripts/WindowOps.java`` ``runs`` times under each of :data:`JAVA_FLAGS`."""
    for flags in JAVA_FLAGS:
        ratios = []
        for _ in range(runs):
            out = subprocess.run(
                [
                    "java",
                    *flags,
                    f"-Dwo.flags={' '.join(flags) or 'defaults'}",
                    str(HERE / "WindowOps.java"),
                    "40",
                    str(TUPLES),
                    str(SUBS),
                ],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            print(out.strip())
            ratios.append(float(re.search(r"unit/scan ([\d.]+) \(totals\)", out).group(1)))
        name = " ".join(flags) or "defaults"
        print(f"java {name}: median unit/scan {statistics.median(ratios):.2f}")


def main() -> None:
    """Parse the options and measure."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--java", action="store_true")
    ap.add_argument("--python", action="store_true")
    ap.add_argument("--cpu", action="store_true", help="with --python: CPU seconds, not valgrind")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--child", nargs=2, metavar=("KIND", "REPS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
    if args.python:
        python_cpu(20) if args.cpu else python_instructions()
    if args.java or not args.python:
        java(args.runs)


if __name__ == "__main__":
    main()
