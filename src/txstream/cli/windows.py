"""``txstream windows``: run the sliding-window workload under a scheduler.

``txstream windows run`` simulates one run of the Section 5 workload (or of the
queries given with ``--query``) and prints its metrics; ``--record FILE`` writes
the history, which ``txstream check --criterion ws|lws FILE`` judges (the file
carries its ``# subwindows:`` directive).  ``txstream windows schedulers`` lists
the schedulers.
"""

from __future__ import annotations

import argparse
import json

from txstream.cli import Subparsers, command_group
from txstream.cli.types import (
    int_range,
    json_safe,
    nonnegative_float,
    nonnegative_int,
    path_arg,
    positive_float,
    positive_int,
    seed,
)
from txstream.storage.files import check_writable, write_whole
from txstream.windows.base import WindowError
from txstream.windows.queries import AGGREGATES, Query
from txstream.windows.schedulers import SCHEDULERS
from txstream.windows.sim import WindowParams

MAX_SIMULATED_S = 3_600
"""Longest run the command accepts: memory and time grow with the simulated seconds."""
MAX_WORK = 100_000
"""Largest n x simulated seconds (a couple of minutes of work)."""
MAX_SNAPSHOTS = 5_000
"""Most snapshot queries in one run (1,000 take about 1 s, 20,000 take 50 s)."""
MAX_WINDOW_PACKETS = 2_000_000
"""Largest window, n * t * 1,000 packets: the whole window is built at the start
(about 450 bytes a packet: 2 million take some 900 MB)."""
MAX_SLIDES = 100_000
"""Most slides in one run (simulated seconds / t; 100,000 take about 10 s)."""
MAX_READ_WORK = 500_000_000
"""Largest bound on reads x n: every read picks among a query's n sub-windows, and
the simulated clock bounds the reads (at this bound a run takes some 20 s; n=100,
t=0.001 over 100 s, twice the bound, took 75 s)."""


def register_cli(sub: Subparsers) -> None:
    """Add the ``windows`` subcommand group (``run``, ``schedulers``)."""
    group = command_group(
        sub,
        "windows",
        help="sliding windows: queries and window slides under a scheduler",
        description=__doc__,
    )

    r = group.add_parser("run", help="simulate one run and print its metrics (JSON)")
    r.add_argument("--scheduler", default="ttu", help=f"one of: {', '.join(SCHEDULERS)}")
    r.add_argument(
        "--n", type=int_range(2, 10_000), default=20, help="sub-windows in the window (>= 2)"
    )
    r.add_argument(
        "--t", type=positive_float(86_400), default=1.0, help="seconds per sub-window (> 0)"
    )
    r.add_argument(
        "--long-queries",
        type=nonnegative_int(1_000),
        default=40,
        help="random long-running queries",
    )
    r.add_argument(
        "--query",
        action="append",
        metavar="AGG:LENGTH[:ATTR]",
        help=f"a long-running query instead of random ones (repeatable); AGG one of: "
        f"{', '.join(AGGREGATES)}; ATTR (topk, percentile, count-distinct) src (default) or dst",
    )
    r.add_argument(
        "--m", type=positive_int(100_000), default=1, help="re-execute long queries every m slides"
    )
    r.add_argument(
        "--snapshot-interval",
        type=nonnegative_float(86_400),
        default=0.0,
        help="mean seconds between snapshot queries (0: none)",
    )
    r.add_argument(
        "--duration", type=positive_float(10_000_000), default=None, help="simulated seconds (n*t)"
    )
    r.add_argument("--seed", type=seed, default=0)
    r.add_argument("--record", type=path_arg, metavar="FILE", help="write the history here")
    r.add_argument("--answers", action="store_true", help="print the last answer of each group")
    r.set_defaults(func=_run)

    s = group.add_parser("schedulers", help="list the schedulers")
    s.set_defaults(func=_schedulers)


def parse_query(text: str) -> Query:
    """``AGG:LENGTH[:ATTR]`` as a :class:`Query` (checked against a window later)."""
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise WindowError(f"query {text!r} is not AGG:LENGTH[:ATTR], e.g. topk:10:src")
    agg, length = parts[0], parts[1]
    if agg not in AGGREGATES:
        raise WindowError(f"unknown aggregate {agg!r}; choose one of: {', '.join(AGGREGATES)}")
    try:
        n = int(length)
    except ValueError:
        raise WindowError(f"query {text!r}: window length {length!r} is not an integer") from None
    attr = parts[2] if len(parts) == 3 else "src"
    if agg in ("count", "sum", "avg", "min", "max"):
        if len(parts) == 3:  # it was ignored: sum:5:dst summed the sizes as sum:5 does
            raise WindowError(
                f"query {text!r}: {agg} is over the packet sizes and takes no ATTR; "
                "ATTR is for topk, percentile and count-distinct"
            )
        return Query(agg, n, value="size")
    return Query(agg, n, attr=attr)


def _run(args: argparse.Namespace) -> int:
    from txstream.windows.sim import run

    simulated = args.duration if args.duration is not None else args.n * args.t
    if simulated > MAX_SIMULATED_S:
        raise WindowError(
            f"a run of {simulated:g} simulated seconds (--duration, default n*t) takes hours; "
            f"at most {MAX_SIMULATED_S:,} (about 0.01 s of work per simulated second)"
        )
    # Long-running queries rescan all n sub-windows at every slide: the work grows
    # with n times the simulated seconds (n=1000 over 10 s takes some 15 s).
    if args.n * simulated > MAX_WORK:
        raise WindowError(
            f"n={args.n} sub-windows over {simulated:g} simulated seconds would take hours; "
            f"keep n times the run's simulated seconds at most {MAX_WORK:,}"
        )
    _check_size(args.n, args.t, simulated, args.snapshot_interval > 0)
    if args.snapshot_interval > 0 and simulated / args.snapshot_interval > MAX_SNAPSHOTS:
        raise WindowError(
            f"--snapshot-interval {args.snapshot_interval:g} makes "
            f"{simulated / args.snapshot_interval:,.0f} snapshot queries; at most "
            f"{MAX_SNAPSHOTS:,} per run (a larger interval or a shorter run)"
        )
    queries = [parse_query(q) for q in args.query] if args.query else None
    if args.record is not None:
        check_writable(args.record)  # before the run, not after it
    params = WindowParams(
        scheduler=args.scheduler,
        n=args.n,
        t=args.t,
        long_queries=args.long_queries if queries is None else len(queries),
        m=args.m,
        snapshot_interval=args.snapshot_interval,
        duration=args.duration,
        seed=args.seed,
        record=args.record is not None,
        queries=queries,
    )
    result = run(params)
    out = {"scheduler": args.scheduler, "n": args.n, "t": args.t, **result.metrics}
    if args.answers:
        last: dict[str, object] = {}
        for r in result.engine.results:
            if r.kind == "long":
                last[r.group.name] = r.answers
        out["answers"] = last
    if args.record is not None and result.history is not None:
        write_whole(args.record, result.history)
        out["history"] = str(args.record)
    print(json.dumps(json_safe(out), default=str, allow_nan=False))
    return 0


def _check_size(n: int, t: float, simulated: float, snapshots: bool) -> None:
    """Refuse, before any work, a run whose window, slides or reads would not fit.

    The simulated clock charges every read at least the tuples of a sub-window
    (about half of ``t * rate`` at the slowest rate; snapshot queries scan
    tuples too); so the reads are at most the simulated seconds over that
    cost, and each read looks at up to ``n`` sub-windows.
    """
    params = WindowParams()
    packets = n * t * params.rate
    if packets > MAX_WINDOW_PACKETS:
        raise WindowError(
            f"a window of n={n} sub-windows of t={t:g} s holds about {packets:,.0f} packets "
            f"(1,000 a second), more than {MAX_WINDOW_PACKETS:,} fit in memory; a smaller n or t"
        )
    slides = simulated / t
    if slides > MAX_SLIDES:
        raise WindowError(
            f"{simulated:g} simulated seconds with t={t:g} s make {slides:,.0f} slides; at most "
            f"{MAX_SLIDES:,} per run (a larger t or a shorter --duration)"
        )
    per_read = max(1.0, 0.5 * t * params.rate)
    if snapshots and params.snapshot_cost != "tuples":
        per_read = min(per_read, float(params.snapshot_subset))
    reads = simulated / (params.costs.per_unit * per_read)
    if reads * n > MAX_READ_WORK:
        raise WindowError(
            f"n={n} sub-windows of t={t:g} s over {simulated:g} simulated seconds allow up to "
            f"{reads:,.0f} reads over {n} sub-windows each, minutes of work or more; at most "
            f"{MAX_READ_WORK:,} (fewer sub-windows, a larger t or a shorter --duration)"
        )


def _schedulers(args: argparse.Namespace) -> int:
    for name, cls in SCHEDULERS.items():
        print(f"{name:12} {cls.summary}")
    return 0
