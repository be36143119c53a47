"""Spark Connect's extra start-up against a classic session (issue 30).

Each run is a new Python process.  Classic: start a local session (timed), then
the bank ledger job (as ``scripts/startup-time.py``: two file inputs, 100
opening rows) on a fresh checkpoint, timing ``start()`` and the first batch
(``processAllAvailable()``).  Connect: start the PySpark wheel's Connect server
on loopback (:func:`txstream.spark.connect.connect_server`, timed until it takes
connections), connect a session (timed), then the same job.  Runs alternate
between the two kinds; prints every figure and the medians.

    PYTHONPATH=src .venv/bin/python scripts/connect-startup.py --runs 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def child(kind: str, folder: Path, ckpt: Path) -> dict[str, float]:
    """One process: server (Connect), session, start() and first batch, in seconds."""
    from txstream.bench.ledger import ledger_job, opening
    from txstream.spark import local_session
    from txstream.spark.connect import connect_server

    figures: dict[str, float] = {"server": 0.0}
    with contextlib.ExitStack() as stack:
        began = time.perf_counter()
        if kind == "connect":
            from pyspark.sql.connect.session import SparkSession

            url = stack.enter_context(connect_server("local[2]"))
            figures["server"] = time.perf_counter() - began
            began = time.perf_counter()
            spark: Any = SparkSession.builder.remote(url).getOrCreate()
            stack.callback(spark.stop)
        else:
            spark = local_session("connect-startup")
        figures["session"] = time.perf_counter() - began
        deposits = spark.readStream.schema("acct long, amount long, id long").json(
            str(folder / "deposits")
        )
        transfers = spark.readStream.schema("src long, dst long, amount long, id long").json(
            str(folder / "transfers")
        )
        job = ledger_job(deposits, transfers, initial=opening(100))
        began = time.perf_counter()
        query = job.start(ckpt, spark=spark, partitions=2)
        figures["start"] = time.perf_counter() - began
        began = time.perf_counter()
        query.processAllAvailable()
        figures["first_batch"] = time.perf_counter() - began
        query.stop()
    figures["total"] = sum(figures[k] for k in ("server", "session", "start", "first_batch"))
    return figures


def main() -> None:
    """Run the children and print (see the module docstring)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child", nargs=3, metavar=("KIND", "INPUT", "CHECKPOINT"))
    args = parser.parse_args()
    if args.child:
        kind, folder, ckpt = args.child
        print(json.dumps(child(kind, Path(folder), Path(ckpt))))
        return
    folder = Path(tempfile.mkdtemp(prefix="txstream-connect-startup-"))
    for name in ("deposits", "transfers"):
        (folder / "in" / name).mkdir(parents=True)
    events = [{"acct": a % 100, "amount": 5, "id": a} for a in range(200)]
    (folder / "in" / "deposits" / "a.json").write_text(
        "".join(json.dumps(e) + "\n" for e in events)
    )
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    got: dict[str, list[dict[str, float]]] = {"classic": [], "connect": []}
    for run in range(args.runs):
        for kind in ("classic", "connect"):
            ckpt = folder / f"{kind}{run}"
            out = subprocess.run(
                [sys.executable, __file__, "--child", kind, str(folder / "in"), str(ckpt)],
                capture_output=True,
                text=True,
                env=env,
                check=True,
            )
            figures = json.loads(out.stdout.strip().splitlines()[-1])
            got[kind].append(figures)
            print(f"run {run} {kind}: " + ", ".join(f"{k} {v:.2f} s" for k, v in figures.items()))
    for kind, rows in got.items():
        medians = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(f"median {kind}: " + ", ".join(f"{k} {v:.2f} s" for k, v in medians.items()))


if __name__ == "__main__":
    main()
