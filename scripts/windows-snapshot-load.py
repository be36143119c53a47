"""The snapshot queries' load in Golab et al.'s mixed workload (issue 31, session 24).

Section 5.4 runs a snapshot query a second on average over a window of n
sub-windows of t = 5 s at 1 packet/ms.  Snapshot queries have the higher
priority, so they queue only among themselves (and behind the long-running
read or slide in progress); this script measures that queue from the
engine's committed results, per n, means over the seeds:

* execution: commit time minus the start of the query's first read;
* wait: that start minus the arrival;
* load: mean execution times arrivals per simulated second (above 1 the
  queue grows for the whole run);
* unfinished: snapshot queries still queued at the end, of those submitted.

With ``--all-schedulers`` it prints the mean response and freshness of the
four schedulers instead (Figures 12-13), e.g. with ``--snapshot-scope length``
(each snapshot query reads its own random length 1..n, not the whole window).

    PYTHONPATH=src .venv/bin/python scripts/windows-snapshot-load.py --costs split --n 50,60,70,100
"""

from __future__ import annotations

import argparse
import statistics

from txstream.windows.engine import COSTS
from txstream.windows.sim import WindowParams, run


def _params(args: argparse.Namespace, scheduler: str, n: int, seed: int) -> WindowParams:
    return WindowParams(
        scheduler=scheduler,
        n=n,
        t=5.0,
        long_queries=100,
        snapshot_interval=1.0,
        seed=seed,
        costs=COSTS[args.costs],
        snapshot_scope=args.snapshot_scope,
    )


def load(args: argparse.Namespace, n: int) -> str:
    """One line: the snapshot queue of ``args.scheduler`` at ``n``."""
    cols: dict[str, list[float]] = {k: [] for k in ("exec", "wait", "rate", "unf", "sub")}
    for seed in range(args.seeds):
        r = run(_params(args, args.scheduler, n, seed))
        snaps = [x for x in r.engine.results if x.kind == "snapshot"]
        submitted = len(snaps) + r.metrics["snap_unfinished"]
        cols["exec"].append(statistics.fmean(x.committed - x.started for x in snaps))
        cols["wait"].append(statistics.fmean(x.started - x.arrival for x in snaps))
        cols["rate"].append(submitted / (n * 5.0))
        cols["unf"].append(r.metrics["snap_unfinished"])
        cols["sub"].append(submitted)
    m = {k: statistics.fmean(v) for k, v in cols.items()}
    return (
        f"{args.costs} n={n} {args.scheduler}: execution {m['exec']:.3f} s, "
        f"arrivals {m['rate']:.3f}/s, load {m['exec'] * m['rate']:.3f}, "
        f"wait {m['wait']:.3f} s, unfinished {m['unf']:.1f} of {m['sub']:.0f}"
    )


def orders(args: argparse.Namespace, n: int) -> str:
    """One line: mean snapshot response and freshness of the four schedulers at ``n``."""
    parts = []
    for s in ("serial", "ws", "lws", "ttu"):
        ms = [run(_params(args, s, n, seed)).metrics for seed in range(args.seeds)]
        resp = statistics.fmean(m["snap_response"] for m in ms)
        fresh = statistics.fmean(m["snap_freshness"] for m in ms)
        unf = statistics.fmean(m["snap_unfinished"] for m in ms)
        parts.append(f"{s} response {resp:.3f} freshness {fresh:.3f} unfinished {unf:.1f}")
    return f"{args.costs} n={n} " + " | ".join(parts)


def main() -> None:
    """Parse the options and print a line per n."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--costs", choices=tuple(COSTS), default="split")
    ap.add_argument("--n", default="50,60,70,100", help="comma-separated sub-window counts")
    ap.add_argument("--scheduler", default="ttu")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--snapshot-scope", choices=("window", "length"), default="window")
    ap.add_argument("--all-schedulers", action="store_true")
    args = ap.parse_args()
    for n in (int(x) for x in args.n.split(",")):
        print(orders(args, n) if args.all_schedulers else load(args, n), flush=True)


if __name__ == "__main__":
    main()
