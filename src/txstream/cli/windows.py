"""``txstream windows``: run the sliding-window workload under a scheduler.

``txstream windows run`` simulates one run of the Section 5 workload (or of the
queries given with ``--query``) and prints its metrics; ``--record FILE`` writes
the history, which ``txstream check --criterion ws|lws FILE`` judges (the file
carries its ``# subwindows:`` directive).  ``txstream windows run --spark --out
DIR`` runs one window per group key on Spark executors instead
(:func:`txstream.jobs.windows.run_spark`) over a generated packet stream and
compares the answers with the in-process engine's.  ``txstream windows schedulers`` lists
the schedulers.
"""

from __future__ import annotations

import argparse
import json

from txstream.cli import Group, Subparsers
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
from txstream.windows.engine import COSTS, Costs
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


GROUP = Group("windows", help="sliding windows: queries and window slides under a scheduler")


def register_cli(group: Subparsers) -> None:
    """Add ``windows``'s subcommands (``run``, ``schedulers``)."""
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
        default=None,  # (None: not given; --query refuses it rather than ignore it)
        help="random long-running queries (40; not with --query)",
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
    r.add_argument(
        "--costs",
        choices=tuple(COSTS),
        default=None,
        help="cost model: one (a scanned tuple costs a hash-table operation; the default) or "
        "split (scans cheaper by the ratio measured in a Java stand-in)",
    )
    r.add_argument("--record", type=path_arg, metavar="FILE", help="write the history here")
    r.add_argument("--answers", action="store_true", help="print the last answer of each group")
    r.add_argument(
        "--spark",
        action="store_true",
        help="run one window per key on Spark executors (tx.Job) over a generated packet "
        "stream, and compare with the in-process engine",
    )
    r.add_argument(
        "--keys", type=int_range(1, 1_000), default=None, help="with --spark: group keys (4)"
    )
    r.add_argument(
        "--files",
        type=int_range(1, 10_000),
        default=None,
        help="with --spark: input files per input, one micro-batch each (10)",
    )
    r.add_argument(
        "--partitions",
        type=int_range(1, 256),
        default=None,
        help="with --spark: runtime partitions (2)",
    )
    r.add_argument("--master", help="with --spark: Spark master (default local[2])")
    r.add_argument(
        "--out",
        type=path_arg,
        metavar="DIR",
        help="with --spark: the run's folder (input, checkpoint, histories); required",
    )
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


SPARK_ONLY = ("keys", "files", "partitions", "master", "out")
"""The options of a ``--spark`` run (None when not given)."""


def _run(args: argparse.Namespace) -> int:
    from txstream.windows.sim import run

    if args.query and args.long_queries is not None:
        # (it was accepted and ignored: the --query list replaces the random queries)
        raise WindowError(
            "--long-queries sets how many random queries run; --query names the queries: "
            "leave one of them out"
        )
    args.long_queries = 40 if args.long_queries is None else args.long_queries
    if args.spark:
        return _run_spark(args)
    given = [f"--{a}" for a in SPARK_ONLY if getattr(args, a) is not None]
    if given:
        raise WindowError(f"{', '.join(given)} go with --spark")

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
    costs = COSTS[args.costs or "one"]
    _check_size(args.n, args.t, simulated, args.snapshot_interval > 0, costs)
    if args.snapshot_interval > 0 and simulated / args.snapshot_interval > MAX_SNAPSHOTS:
        raise WindowError(
            f"--snapshot-interval {args.snapshot_interval:g} makes "
            f"{simulated / args.snapshot_interval:,.0f} snapshot queries; at most "
            f"{MAX_SNAPSHOTS:,} per run (a larger interval or a shorter run)"
        )
    if args.duration is not None and args.duration < args.t:
        # (it ran no slide and printed a summary of zeros, exit 0)
        raise WindowError(
            f"--duration {args.duration:g} is shorter than one sub-window (--t {args.t:g}): "
            "nothing would be computed; give a --duration of at least --t"
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
        costs=costs,
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


def _check_size(n: int, t: float, simulated: float, snapshots: bool, costs: Costs) -> None:
    """Refuse, before any work, a run whose window, slides or reads would not fit.

    The simulated clock charges every read at least the tuples of a sub-window
    (about half of ``t * rate`` at the slowest rate; snapshot queries scan
    tuples too); so the reads are at most the simulated seconds over that
    cost (a scanned tuple's, when snapshot queries scan and scans are cheaper),
    and each read looks at up to ``n`` sub-windows.
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
    rate = min(costs.per_unit, costs.per_scan_tuple) if snapshots else costs.per_unit
    reads = simulated / (rate * per_read)
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


def _run_spark(args: argparse.Namespace) -> int:
    """``txstream windows run --spark``: one window per key on the executors."""
    from txstream.spark.session import check_master
    from txstream.storage.files import check_folder
    from txstream.windows.keyed import KeyedWindows, random_long_queries, run_keyed, workload

    if args.out is None:
        raise WindowError("--spark needs --out DIR: the run's input, checkpoint and histories")
    if args.record is not None or args.answers:
        raise WindowError(
            "--record and --answers are for the simulation; a --spark run writes each key's "
            "history to DIR/histories and its answers to DIR/checkpoint (output 'results')"
        )
    if args.master is not None:
        check_master(args.master)
    keys = 4 if args.keys is None else args.keys
    seconds = args.duration if args.duration is not None else 2 * args.n * args.t
    # every key's packets are generated and written: bound them as the simulation's window
    if keys * seconds * 1_000 > 10 * MAX_WINDOW_PACKETS:
        raise WindowError(
            f"{keys} keys over {seconds:g} s make about {keys * seconds * 1_000:,.0f} packets; "
            f"at most {10 * MAX_WINDOW_PACKETS:,} (fewer --keys or a shorter --duration)"
        )
    if seconds / args.t > MAX_SLIDES:
        raise WindowError(f"{seconds:g} s with t={args.t:g} s make more than {MAX_SLIDES:,} slides")
    queries = [parse_query(q) for q in args.query] if args.query else None
    long = (
        tuple((q,) for q in queries)
        if queries is not None
        else random_long_queries(args.n, args.long_queries, seed=args.seed)
    )
    spec = KeyedWindows(
        n=args.n,
        t=args.t,
        scheduler=args.scheduler,
        long_queries=long,
        m=args.m,
        record=True,
        costs=COSTS[args.costs or "one"],
    )
    spec.validate()
    check_folder(args.out, "run folder ")  # before the input is made and Spark starts
    events = workload(
        keys, seconds, snapshot_interval=args.snapshot_interval, n=args.n, seed=args.seed
    )
    from txstream.jobs.windows import run_spark

    summary = run_spark(
        spec,
        events,
        args.out,
        files=10 if args.files is None else args.files,
        partitions=2 if args.partitions is None else args.partitions,
        master=args.master,
    )
    from txstream.jobs.windows import summarize
    from txstream.spark.runtime import read_output

    got = read_output(args.out / "checkpoint", "results")
    want = run_keyed(spec, events)
    order = sorted(got, key=lambda r: (r["key"], r["tid"]))
    summary["equal_in_process"] = order == sorted(want.results, key=lambda r: (r["key"], r["tid"]))
    summary["in_process"] = summarize(want.results)
    out = {"scheduler": args.scheduler, "n": args.n, "t": args.t, "spark": summary}
    print(json.dumps(json_safe(out), default=str, allow_nan=False))
    return 0 if summary["equal_in_process"] else 1
