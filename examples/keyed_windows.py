"""Sliding windows per key on Spark executors: top talkers and snapshot queries per link.

Every link (the group key) has its own sliding window of ``n`` sub-windows of
``t`` seconds over its packets ``(ts, src, dst, size)`` - what
``groupBy("key").window(...)`` means to a user - with long-running queries
re-executed at every slide (the heaviest sources over the last 2 and 4
sub-windows, the 90th percentile of bytes per destination, how many
destinations) and snapshot queries (bytes to or from a few addresses) that
arrive on their own stream.  Reads and slides interleave on each key's clock
under a scheduler of Golab et al. (``serial``, ``ws``, ``lws``, ``ttu``): each
key's window is the state of one runtime partition on the executors, every
packet and query a transaction there (``txstream.jobs.windows.window_job``).
``show`` compares the committed answers with the in-process engine's on the
same input (``txstream.windows.keyed.run_keyed``).

    python examples/keyed_windows.py generate --out /tmp/win --scheduler ttu
    python examples/keyed_windows.py run --data /tmp/win --checkpoint /tmp/win/ckpt
    python examples/keyed_windows.py show --data /tmp/win --checkpoint /tmp/win/ckpt
    txstream check --criterion lws /tmp/win/ckpt/history-0.txt   # written by show
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import txstream as tx
from txstream.jobs.windows import start, window_histories, write_input
from txstream.windows import Costs, Query
from txstream.windows.keyed import KeyedWindows, run_keyed, workload


# ---- the job: what a user writes ----------------------------------------------------------
def spec(scheduler: str, n: int = 5, t: float = 0.2) -> KeyedWindows:
    """Each key's window and queries under ``scheduler``."""
    return KeyedWindows(
        n=n,
        t=t,
        scheduler=scheduler,
        long_queries=(
            (Query("topk", 2, attr="src", k=3), Query("topk", 4, attr="src", k=3)),
            (Query("percentile", n, attr="dst", p=90.0), Query("count-distinct", n, attr="dst")),
        ),
        costs=Costs(per_unit=3e-5),  # a read costs 10-20 ms of the key's CPU: slides meet it
        record=True,  # each key's window history, for txstream check --criterion ws|lws
    )


def run(spark: Any, data: Path, checkpoint: Path, continuous: bool, partitions: int) -> Any:
    """Start the job on ``data`` (one file of each input per micro-batch)."""
    settings = json.loads((data / "settings.json").read_text())
    return start(
        spark,
        spec(settings["scheduler"]),
        data,
        checkpoint,
        once=not continuous,
        partitions=partitions,
        record=True,
    )


# ---- end of the job -------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """The command line: generate, run, show."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    gen = sub.add_parser("generate", help="write an input and the in-process engine's answers")
    gen.add_argument("--out", type=Path, required=True)
    gen.add_argument("--scheduler", default="ttu")
    gen.add_argument("--keys", type=int, default=4)
    gen.add_argument("--seconds", type=float, default=4.0)
    gen.add_argument("--files", type=int, default=20)
    gen.add_argument("--seed", type=int, default=1)
    r = sub.add_parser("run", help="run the job until the input is consumed")
    r.add_argument("--data", type=Path, required=True)
    r.add_argument("--checkpoint", type=Path, required=True)
    r.add_argument("--partitions", type=int, default=2)
    r.add_argument("--master", default=None, help="Spark master (default local[2])")
    r.add_argument("--continuous", action="store_true", help="keep running (processingTime)")
    show = sub.add_parser("show", help="compare the committed answers with the expected ones")
    show.add_argument("--checkpoint", type=Path, required=True)
    show.add_argument("--data", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "generate":
            events = workload(
                args.keys,
                args.seconds,
                snapshot_interval=0.1,
                addresses=100,
                subset=5,
                n=5,
                seed=args.seed,
            )
            s = spec(args.scheduler)
            s.validate()
            write_input(events, args.out, args.files)
            expected = run_keyed(s, events)
            (args.out / "settings.json").write_text(json.dumps({"scheduler": args.scheduler}))
            (args.out / "expected.json").write_text(
                json.dumps(
                    {
                        "results": expected.results,
                        "histories": {str(k): expected.history(k) for k in expected.windows},
                    }
                )
            )
            print(f"wrote {args.out}: {len(events)} events, {len(expected.results)} answers")
        elif args.cmd == "run":
            from txstream.spark import local_session

            spark = local_session(
                "keyed-windows", **({"master": args.master} if args.master else {})
            )
            query = run(spark, args.data, args.checkpoint, args.continuous, args.partitions)
            try:
                query.awaitTermination()
            finally:
                query.stop()
            print(json.dumps(query.lastProgress, default=str))
        else:
            expected = json.loads((args.data / "expected.json").read_text())
            got = tx.read_output(args.checkpoint, "results")
            histories = window_histories(args.checkpoint, 5)
            for key, text in histories.items():
                (args.checkpoint / f"history-{key}.txt").write_text(text)

            def order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
                return sorted(rows, key=lambda r: (r["key"], r["tid"]))

            ok = order(got) == order(expected["results"]) and histories == expected["histories"]
            print(json.dumps({"answers": len(got), "exactly_as_expected": ok}))
            return 0 if ok else 1
    except tx.TxStreamError as exc:
        print(f"keyed_windows: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
