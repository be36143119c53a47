"""``txstream bench checker``: how fast ``cs`` decides large histories.

Each point generates a history in the notation (not timed), then times, in a
fresh Python process so that peak memory is the point's own:

* ``parse_s`` - reading the text into a :class:`~txstream.model.History`;
* ``scan_s`` - the baseline: one pass over the operations with one dict update
  each, the least any checker must do;
* ``check_s`` - the ``cs`` checker (conflict graph, then a serial order or a cycle);
* ``peak_mb`` - peak resident memory during parse and check, above what the
  process held before parsing.

The goal of the foundation issue: ``cs`` on 1,000,000 operations over 100,000
transactions in under 10 seconds on one core, with memory linear in the history.
"""

from __future__ import annotations

import json
import random
import resource
import subprocess
import sys
import time
from typing import Any

from txstream.bench.harness import Experiment, Figure, Param
from txstream.errors import TxStreamError


def generate_history_text(
    operations: int,
    ops_per_txn: int = 10,
    items: int | None = None,
    concurrency: int = 8,
    seed: int = 0,
) -> str:
    """A random interleaved history with about ``operations`` operations.

    ``concurrency`` transactions are active at any time; each has
    ``ops_per_txn - 1`` reads/writes (30% writes, skewed towards a hot tenth of
    the items) and then commits, one in twenty aborting.  ``items`` defaults to
    one per 20 operations, so the conflict density is the same at every size.
    """
    rng = random.Random(seed)
    if items is None:
        items = max(100, operations // 20)
    txns = max(1, operations // ops_per_txn)
    accesses = ops_per_txn - 1
    hot = max(1, items // 10)
    active: list[list[Any]] = []
    next_id = 0
    words: list[str] = []
    while next_id < txns or active:
        while len(active) < concurrency and next_id < txns:
            active.append([str(next_id), accesses])
            next_id += 1
        slot = rng.randrange(len(active))
        txn = active[slot]
        if txn[1] == 0:
            words.append(("a" if rng.random() < 0.05 else "c") + txn[0])
            active[slot] = active[-1]
            active.pop()
            continue
        txn[1] -= 1
        item = rng.randrange(hot) if rng.random() < 0.3 else rng.randrange(items)
        kind = "w" if rng.random() < 0.3 else "r"
        words.append(f"{kind}{txn[0]}(x{item})")
    return "\n".join(" ".join(words[i : i + 20]) for i in range(0, len(words), 20)) + "\n"


def measure(operations: int, seed: int) -> dict[str, Any]:
    """Generate, parse and check one history in this process; return the metrics."""
    from txstream.model import check, parse_one

    text = generate_history_text(operations, seed=seed)
    base_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    history = parse_one(text)
    t1 = time.perf_counter()
    last: dict[str | None, str] = {}
    for op in history.operations:
        last[op.item] = op.txn
    t2 = time.perf_counter()
    verdict = check(history, "cs")
    t3 = time.perf_counter()
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "parse_s": round(t1 - t0, 4),
        "scan_s": round(t2 - t1, 4),
        "check_s": round(t3 - t2, 4),
        "total_s": round(t3 - t0, 4),
        "peak_mb": round(max(0, peak_kb - base_kb) / 1024, 1),
        "transactions": verdict.evidence.get("transactions"),
        "holds": verdict.holds,
    }


def run_point(point: dict[str, Any], seed: int) -> dict[str, Any]:
    """Measure one point in a fresh interpreter (clean memory high-water mark)."""
    proc = subprocess.run(
        [sys.executable, "-m", "txstream.bench.checker", str(point["operations"]), str(seed)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise TxStreamError(f"checker benchmark point failed: {proc.stderr.strip()[-300:]}")
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


EXPERIMENT = Experiment(
    name="checker",
    description="cs checker speed and memory against history length",
    grid=[{"operations": n} for n in (10_000, 100_000, 300_000, 1_000_000)],
    quick_grid=[{"operations": n} for n in (10_000, 100_000)],
    run=run_point,
    params={"operations": Param(int, lo=1, hi=100_000_000)},
    repetitions=3,
    quick_repetitions=1,
    figures=[
        Figure(
            "checker_time",
            x="operations",
            y=("parse_s", "scan_s", "check_s", "total_s"),
            title="cs checker time (dashed: the 10 s goal)",
            ylabel="seconds",
            logx=True,
            logy=True,
            hline=10.0,
        ),
        Figure(
            "checker_memory",
            x="operations",
            y="peak_mb",
            title="cs checker peak memory",
            ylabel="MiB above baseline",
            logx=True,
        ),
    ],
)


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]), int(sys.argv[2]))))
