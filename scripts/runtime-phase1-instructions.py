"""Phase 1 under valgrind: machine instructions per event of the local path (0% cross).

The load-proof counterpart of ``runtime-phase1-cpu.py`` (CPU seconds swing by
10-30% on a shared machine): runs that script's batches (two partitions, one
task each, the Streaming Ledger, 100,000 accounts, history recorded unless
``--no-history``) for 2 and for 3 batches under ``valgrind --tool=cachegrind``
with a fixed hash seed, and prints the difference divided by one batch's events
(set-up, the inputs' building for 3 batches, the store's first load and the
interpreter's exit cancel out: what remains is one batch's two tasks and the
driver's commit of it).  Works
on older checkouts too (point ``PYTHONPATH`` at their ``src``).  Needs
valgrind; a few minutes.

    PYTHONPATH=src .venv/bin/python scripts/runtime-phase1-instructions.py [--no-history]
        [--per 4000] [--cache]

``--cache`` turns cachegrind's cache simulation on and prints D1 and LL data
misses per event beside the instructions (the same difference; runs about
twice as long).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import sys
from pathlib import Path

import valgrind_count  # (scripts/, beside this file)


def child(per: int, batches: int, history: bool) -> None:
    """The measured run (in valgrind): ``batches`` batches, then exit at once."""
    import gc

    path = Path(__file__).with_name("runtime-phase1-cpu.py")
    spec = importlib.util.spec_from_file_location("phase1_cpu", path)
    assert spec is not None and spec.loader is not None
    cpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cpu)
    args = argparse.Namespace(
        per=per, batches=batches, no_history=not history, accounts=cpu.ACCOUNTS, prepare=3
    )
    gc.disable()
    with contextlib.redirect_stdout(io.StringIO()):
        cpu.run(args)
    os._exit(0)  # (no collection at exit: its cost grows with what the run left alive)


def main() -> None:
    """Parse the options; print instructions per event."""
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "history")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per", type=int, default=4_000, help="events per partition and batch")
    p.add_argument("--no-history", action="store_true", help="without history recording")
    p.add_argument(
        "--cache", action="store_true", help="also data-cache misses (cachegrind's simulation)"
    )
    a = p.parse_args()
    mode = "no-history" if a.no_history else "history"
    if a.cache:
        runs = [
            valgrind_count.counts(__file__, "--child", str(a.per), str(n), mode) for n in (2, 3)
        ]
        per = {k: (runs[1][k] - runs[0][k]) / (2 * a.per) for k in runs[0]}
        print(
            f"{per['I']:,.0f} instructions, {per['D1']:,.1f} D1 misses, "
            f"{per['LLd']:,.1f} LL data misses per event ({mode})"
        )
        return
    counts = [
        valgrind_count.instructions(__file__, "--child", str(a.per), str(n), mode) for n in (2, 3)
    ]
    print(f"{(counts[1] - counts[0]) // (2 * a.per):,} instructions per event ({mode})")


if __name__ == "__main__":
    main()
