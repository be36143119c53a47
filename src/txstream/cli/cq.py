"""``txstream cq``: a continuous query over an updatable table, under a strategy.

``txstream cq run`` runs the experiment's query (stream-table equi-join,
selection, windowed mean) for a few seconds while updaters change the table,
and prints the proportion of consistent results and both throughputs as JSON;
``--record FILE`` writes the history for ``txstream check --criterion cs``.
``txstream cq strategies`` lists the strategies.
"""

from __future__ import annotations

import argparse
import json

from txstream.cli import Group, Subparsers
from txstream.cli.types import (
    json_safe,
    nonnegative_float,
    path_arg,
    positive_float,
    positive_int,
    seed,
)
from txstream.cq.engine import STRATEGIES
from txstream.model import format_history
from txstream.storage.files import check_writable, write_whole

GROUP = Group("cq", help="continuous queries over updatable tables: CQ-derived transactions")


def register_cli(group: Subparsers) -> None:
    """Add ``cq``'s subcommands (``run``, ``strategies``)."""
    r = group.add_parser("run", help="run the query with concurrent updaters (JSON)")
    r.add_argument("--strategy", default="snapshot", help=f"one of: {', '.join(STRATEGIES)}")
    r.add_argument(
        "--update-rate",
        type=nonnegative_float(10_000_000),
        default=1000.0,
        help="update txn/s (0: none)",
    )
    r.add_argument(
        "--window", type=positive_int(1_000_000), default=5, help="window range r (events)"
    )
    r.add_argument(
        "--slide",
        type=positive_int(1_000_000),
        default=None,
        help="window slide s (default r // 2)",
    )
    r.add_argument(
        "--seconds", type=positive_float(3600), default=2.0, help="how long the query runs"
    )
    r.add_argument(
        "--rows", type=positive_int(1_000_000), default=10_000, help="rows of the referenced table"
    )
    r.add_argument("--table", default="parts", help="the table the join references")
    r.add_argument("--column", default="price", help="the column the window averages")
    r.add_argument("--seed", type=seed, default=0)
    r.add_argument("--record", type=path_arg, metavar="FILE", help="write the history here")
    r.set_defaults(func=_run)

    s = group.add_parser("strategies", help="list the strategies")
    s.set_defaults(func=_strategies)


def _run(args: argparse.Namespace) -> int:
    from txstream.cq.engine import get_strategy
    from txstream.cq.workload import CQRun, run

    get_strategy(args.strategy)  # fail on a bad name before building anything
    # an unwritable history path must fail before the query runs, not after it (the
    # run takes --seconds); the check leaves the path alone (write_whole writes it)
    if args.record is not None:
        check_writable(args.record)
    params = CQRun(
        strategy=args.strategy,
        update_rate=args.update_rate,
        r=args.window,
        s=args.slide,
        seconds=args.seconds,
        rows=args.rows,
        table=args.table,
        column=args.column,
        seed=args.seed,
        record=args.record is not None,
        events=max(10_000, int(400_000 * args.seconds / 2)),
    )
    metrics = run(params)
    history = metrics.pop("history", None)
    if args.record is not None and history is not None:
        write_whole(args.record, format_history(history) + "\n")
        metrics["history"] = str(args.record)
    print(json.dumps(json_safe({"strategy": args.strategy, **metrics}), allow_nan=False))
    return 0


def _strategies(args: argparse.Namespace) -> int:
    for name, cls in STRATEGIES.items():
        print(f"{name:11} {cls.summary}")
    return 0
