"""Phase 1 with forwarding under valgrind: machine instructions per event, cross 0 and uniform.

A measure that does not move with the host's load (CPU seconds swing by 10-30%
on a shared machine, more than most changes to the crossing path are worth):
runs ``runtime-mp-cpu.py``'s batches (two partitions in one task, the Streaming
Ledger, 100,000 accounts) for 2 and for 3 batches under ``valgrind
--tool=cachegrind`` with a fixed hash seed, and prints the difference divided
by one batch's events (set-up, the store's first load and the interpreter's
exit cancel out; so do drawing the events and building the Arrow batches, made
for 3 batches in both runs: until session 24 they were counted, about 45,000 of
cross 0's 131,500 instructions per event and 41,000 of uniform's 151,000, which
made uniform / cross 0 read 1.15x for 1.28x).  Needs valgrind; a few minutes per
pattern.  The child runs with ``OPENBLAS_NUM_THREADS=1`` (unless set): the
OpenBLAS threads loaded with the runtime spin, and their instructions moved
cross 0 by 10% between two runs of the same code (session 24).

    PYTHONPATH=src .venv/bin/python scripts/runtime-mp-instructions.py [--patterns cross0,uniform]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

import valgrind_count  # (scripts/, beside this file)

PER = 4_000
"""Events per partition and batch (two partitions)."""


def child(pattern: str, batches: int, history: bool) -> None:
    """The measured run (in valgrind): ``batches`` batches of ``pattern``, then exit at once."""
    import gc

    path = Path(__file__).with_name("runtime-mp-cpu.py")
    spec = importlib.util.spec_from_file_location("mp_cpu", path)
    assert spec is not None and spec.loader is not None
    mp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mp)
    mp.q._forwarded_phase1 = mp.one_task
    args = argparse.Namespace(
        per=PER, batches=batches, no_history=not history, audit_every=1000, prepare=3
    )
    gc.disable()
    mp.run(pattern, args, None)
    os._exit(0)  # (no collection at exit: its cost grows with what the run left alive)


def instructions(pattern: str, batches: int, history: bool) -> int:
    """Instructions valgrind counted for one child run."""
    mode = "history" if history else "no-history"
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # (see the module docstring)
    return valgrind_count.instructions(__file__, "--child", pattern, str(batches), mode)


def main() -> None:
    """Parse the options; print instructions per event for each pattern, and the ratio."""
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "history")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--patterns", default="cross0,uniform", help="of cross0, uniform, audits")
    p.add_argument("--history", action="store_true", help="record the history (off by default)")
    a = p.parse_args()
    per: dict[str, int] = {}
    for pattern in a.patterns.split(","):
        one = instructions(pattern, 3, a.history) - instructions(pattern, 2, a.history)
        per[pattern] = one // (2 * PER)
        print(f"{pattern:8s} {per[pattern]:,} instructions per event", flush=True)
    first = next(iter(per))
    for pattern, n in per.items():
        print(f"{pattern:8s} {n / per[first]:.3f}x of {first}")


if __name__ == "__main__":
    main()
