"""Fixed cost of a runtime micro-batch: tiny batches of Streaming Ledger, each piece timed.

Writes ``--batches`` pairs of small JSON files (``--per`` events each), runs
the ledger job over them one file per input and micro-batch on ``local[2]``,
and prints per batch the wall time between batches (Spark's own trigger
work), the batch's run, and the parts of it (the event-time merge's frontier
job when the driver runs one, phase 1, the deferred phases, the commit), then
their means after the first three batches. Compare Spark settings with
``--conf KEY=VALUE`` (e.g. ``spark.python.unix.domain.socket.enabled=false``).

    PYTHONPATH=src .venv/bin/python scripts/runtime-batch-overhead.py [--batches 15] [--per 200]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from txstream.bench.ledger import events, ledger_job
from txstream.spark import local_session
from txstream.spark.runtime import query as q


def main() -> None:
    """Run the tiny batches and print their timings."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=15)
    p.add_argument("--per", type=int, default=200, help="events per batch (both inputs)")
    p.add_argument("--merge", default="event-time", choices=("batch", "event-time"))
    p.add_argument("--conf", action="append", default=[], help="a Spark setting KEY=VALUE")
    a = p.parse_args()
    conf = dict(c.split("=", 1) for c in a.conf)
    root = Path(tempfile.mkdtemp(prefix="batch-overhead-"))
    try:
        spark = local_session("batch-overhead", cores=2, conf=conf)
        stream = list(events(a.batches * a.per, 1000, 0, 1))
        for name in ("deposits", "transfers"):
            (root / "in" / name).mkdir(parents=True)
        for b in range(a.batches):
            part = stream[b * a.per : (b + 1) * a.per]
            for name in ("deposits", "transfers"):
                rows = [json.dumps({**e, "sent": time.time()}) for n, e in part if n == name]
                (root / "in" / name / f"p{b:04d}.json").write_text("\n".join(rows) + "\n")

        def source(name: str, schema: str) -> Any:
            reader = spark.readStream.option("maxFilesPerTrigger", 1).schema(schema)
            return reader.json(str(root / "in" / name))

        job = ledger_job(
            source("deposits", "acct long, amount long, id long, sent double"),
            source("transfers", "src long, dst long, amount long, id long, sent double"),
            name="overhead",
            initial=spark.range(1000).selectExpr("id as acct", "cast(1000 as bigint) as balance"),
        )
        job.option("recordHistory", True).option("merge", a.merge)
        rows = _timed_run(job, root / "ckpt", spark)
        steady = rows[3:]
        print("means after the first three batches (ms):")
        for key in steady[0]:
            mean = sum(r.get(key, 0.0) for r in steady) / len(steady)
            print(f"  {key:10s} {1000 * mean:6.0f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _timed_run(job: Any, checkpoint: Path, spark: Any) -> list[dict[str, float]]:
    """Run ``job`` to the end of its input, timing each batch's pieces."""
    pieces: dict[str, float] = {}
    patched = []

    def wrap(owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)
        patched.append((owner, name, original))

        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.time()
            try:
                return original(*args, **kwargs)
            finally:
                pieces[label] = pieces.get(label, 0.0) + time.time() - began

        setattr(owner, name, timed)

    wrap(q.TxQuery, "_advance", "frontier")
    wrap(q.SparkPhases, "phase1", "phase1")
    wrap(q.SparkPhases, "deferred", "deferred")
    wrap(q.RuntimeStore, "commit", "commit")
    rows: list[dict[str, float]] = []
    last = [0.0]
    run = q.TxQuery._run

    def batch(self: Any, df: Any, batch_id: int) -> None:
        began = time.time()
        pieces.clear()
        run(self, df, batch_id)
        row = {"gap": began - last[0] if last[0] else 0.0, "run": time.time() - began, **pieces}
        last[0] = time.time()
        rows.append(row)
        print(f"batch {batch_id}: " + " ".join(f"{k}={1000 * v:.0f}" for k, v in row.items()))

    q.TxQuery._run = batch  # type: ignore[method-assign]
    try:
        query = job.start(checkpoint, spark=spark, partitions=2)
        try:
            query.processAllAvailable()
        finally:
            query.stop()
    finally:
        q.TxQuery._run = run  # type: ignore[method-assign]
        for owner, name, original in patched:
            setattr(owner, name, original)
    return rows


if __name__ == "__main__":
    main()
