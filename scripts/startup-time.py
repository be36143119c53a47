"""How long ``Job.start()`` takes beyond the Spark session's own start (issue 27).

Starts one local session (timed), then starts the bank ledger job
(:mod:`txstream.bench.ledger`: two file inputs, a table with initial rows from
a list) ``--runs`` times on a fresh checkpoint and ``--runs`` times again on
the same checkpoints (a restart), stopping each query at once.  Prints the
session's start time and each start() time, and their medians.  The first
start() of the session is shown apart: it pays Spark's first-job warm-up if
start() runs a Spark job at all.

    PYTHONPATH=src .venv/bin/python scripts/startup-time.py --runs 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from txstream.bench.ledger import ledger_job, opening
from txstream.spark import local_session


def main() -> None:
    """Measure and print (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--accounts", type=int, default=100)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="txstream-startup-"))
    for name in ("deposits", "transfers"):
        (folder / "in" / name).mkdir(parents=True)
    (folder / "in" / "deposits" / "a.json").write_text(
        json.dumps({"acct": 1, "amount": 5, "id": 0}) + "\n"
    )
    began = time.perf_counter()
    spark = local_session("startup-time")
    session_s = time.perf_counter() - began
    print(f"session start: {session_s:.2f} s")

    def streams() -> tuple[object, object]:
        deposits = spark.readStream.schema("acct long, amount long, id long").json(
            str(folder / "in" / "deposits")
        )
        transfers = spark.readStream.schema("src long, dst long, amount long, id long").json(
            str(folder / "in" / "transfers")
        )
        return deposits, transfers

    def timed(ckpt: Path) -> float:
        job = ledger_job(*streams(), initial=opening(args.accounts))
        began = time.perf_counter()
        query = job.start(ckpt, spark=spark, partitions=2)
        took = time.perf_counter() - began
        query.processAllAvailable()  # (the restart then finds a committed batch)
        query.stop()
        return took

    times: dict[str, list[float]] = {"fresh": [], "restart": []}
    for run in range(args.runs):
        times["fresh"].append(timed(folder / f"ckpt{run}"))
    for run in range(args.runs):
        times["restart"].append(timed(folder / f"ckpt{run}"))
    for kind, values in times.items():
        shown = " ".join(f"{v:.2f}" for v in values)
        later = values[1:] if kind == "fresh" and len(values) > 1 else values
        print(f"start() {kind}: {shown} s; median {statistics.median(later):.2f} s"
              + (" (without the first)" if later is not values else ""))
    spark.stop()


if __name__ == "__main__":
    main()
