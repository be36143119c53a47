"""CPU to write and load one partition's state in the runtime store's format, without Spark.

A Streaming-Ledger-shaped table (``--rows`` accounts, one row per partition
value), then a batch that changes ``--changed`` of them. Prints the best of
``--repeat`` CPU times of: writing the delta, writing a snapshot, loading from
the snapshot, loading from the initial rows and the delta. Compare two
checkouts by pointing ``PYTHONPATH`` at each.

    PYTHONPATH=src .venv/bin/python scripts/store-format-cost.py [--rows 100000]
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

from txstream.spark.runtime import state as st


def best(repeat: int, run: Callable[[], Any]) -> float:
    """The least CPU milliseconds of ``repeat`` runs of ``run``."""
    times = []
    for _ in range(repeat):
        began = time.process_time()
        run()
        times.append(1e3 * (time.process_time() - began))
    return min(times)


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--changed", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="store-cost-")
    try:
        store = st.RuntimeStore(root)
        store.write_init(
            0, "accounts", {a: {a: {"acct": a, "balance": 1000}} for a in range(args.rows)}
        )
        state = store.state_for(0, 0, -1, None)
        rng = random.Random(1)
        for a in rng.sample(range(args.rows), args.changed):
            state.put("accounts", a, a, {"acct": a, "balance": rng.randint(0, 10**6)})

        def save(snapshot: bool) -> None:
            store.save(0, state, 0, snapshot)

        def load() -> None:
            st._CACHE.clear()
            store.load(0, 0)

        delta = best(args.repeat, lambda: save(False))
        snap = best(args.repeat, lambda: save(True)) - delta
        from_snap = best(args.repeat, load)
        for path in (store.root / "state" / "p00000").glob("snap-*"):
            path.unlink()
        from_init = best(args.repeat, load)
        print(
            f"rows {args.rows}, changed {args.changed}: delta write {delta:.0f} ms, "
            f"snapshot write {snap:.0f} ms, load from snapshot {from_snap:.0f} ms, "
            f"load from initial rows + delta {from_init:.0f} ms"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
