"""How long ``Job.start()`` takes beyond the Spark session's own start (issue 27).

Each run is a new Python process, as a user's job is: it starts a local
session (timed), then the bank ledger job (:mod:`txstream.bench.ledger`: two
file inputs, its ``accounts`` table with 100 opening rows from a list) on a
checkpoint, timing ``start()`` alone, and lets it commit its input.  Each run
does it on a fresh checkpoint, then again in a new process on that checkpoint
(a restart).  Prints every figure and the medians.

    PYTHONPATH=src .venv/bin/python scripts/startup-time.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(folder: Path, ckpt: Path) -> dict[str, float]:
    """One process: the session's start and the job's start() on ``ckpt``, in seconds."""
    from txstream.bench.ledger import ledger_job, opening
    from txstream.spark import local_session

    began = time.perf_counter()
    spark = local_session("startup-time")
    session_s = time.perf_counter() - began
    deposits = spark.readStream.schema("acct long, amount long, id long").json(
        str(folder / "deposits")
    )
    transfers = spark.readStream.schema("src long, dst long, amount long, id long").json(
        str(folder / "transfers")
    )
    job = ledger_job(deposits, transfers, initial=opening(100))
    began = time.perf_counter()
    query = job.start(ckpt, spark=spark, partitions=2)
    start_s = time.perf_counter() - began
    query.processAllAvailable()
    query.stop()
    return {"session": session_s, "start": start_s}


def main() -> None:
    """Run the children and print (see the module docstring)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child", nargs=2, metavar=("INPUT", "CHECKPOINT"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(Path(args.child[0]), Path(args.child[1]))))
        return
    folder = Path(tempfile.mkdtemp(prefix="txstream-startup-"))
    for name in ("deposits", "transfers"):
        (folder / "in" / name).mkdir(parents=True)
    events = [{"acct": a % 100, "amount": 5, "id": a} for a in range(200)]
    (folder / "in" / "deposits" / "a.json").write_text(
        "".join(json.dumps(e) + "\n" for e in events)
    )
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    got: dict[str, list[dict[str, float]]] = {"fresh": [], "restart": []}
    for run in range(args.runs):
        for kind in ("fresh", "restart"):
            out = subprocess.run(
                [sys.executable, __file__, "--child", str(folder / "in"), str(folder / f"c{run}")],
                capture_output=True,
                text=True,
                env=env,
                check=True,
            )
            figures = json.loads(out.stdout.strip().splitlines()[-1])
            got[kind].append(figures)
            print(
                f"run {run} {kind}: session {figures['session']:.2f} s, start() "
                f"{figures['start']:.2f} s",
                flush=True,
            )
    for kind, rows in got.items():
        session = statistics.median(r["session"] for r in rows)
        start = statistics.median(r["start"] for r in rows)
        print(f"median {kind}: session {session:.2f} s, start() {start:.2f} s")


if __name__ == "__main__":
    main()
