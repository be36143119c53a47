"""``txstream loading``: run the continuous loader from the command line.

* ``txstream loading run --method reorder --target postgres --sessions 8 --grouping 10``
  loads the demand/inventory workload (or ``--input FILE`` of JSON lines) and
  prints a JSON summary: throughput, deadlocks, statements and whether the
  final state is right (``view_ok``, ``exact``).
* The experiment is ``txstream bench loading`` (target postgres;
  ``--set target=embedded`` for the embedded target).
* ``txstream loading methods`` lists the loading methods.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from txstream.cli import Subparsers, command_group
from txstream.cli.types import (
    json_safe,
    nonnegative_int,
    path_arg,
    positive_float,
    positive_int,
    probability,
    seed,
)
from txstream.errors import TxStreamError, UnknownNameError

MAX_SESSIONS = 256
"""More sessions than this is a typo, not an experiment (each is a thread and a connection)."""


def register_cli(sub: Subparsers) -> None:
    """Add the ``loading`` subcommand."""
    lsub = command_group(
        sub,
        "loading",
        help="continuous loading with join views (naive / partition / reorder)",
        description="Load modification operations through k sessions without deadlocks.",
        metavar="ACTION",
        raw=False,
    )

    run = lsub.add_parser("run", help="load a stream and print a JSON summary")
    run.add_argument("--method", default="reorder", help="naive, partition or reorder")
    run.add_argument("--target", default="embedded", help="embedded or postgres")
    run.add_argument(
        "--sessions", "-k", type=positive_int(MAX_SESSIONS), default=4, help="number of sessions k"
    )
    run.add_argument(
        "--grouping", "-n", type=positive_int(1_000_000), default=8, help="grouping factor n"
    )
    run.add_argument("--preaggregate", action="store_true", help="combine increments")
    run.add_argument(
        "--operations", type=nonnegative_int(5_000_000), default=10_000, help="stream length"
    )
    run.add_argument("--parts", type=positive_int(1_000_000), default=10_000, help="active parts s")
    run.add_argument("--p", type=probability, default=0.5, help="fraction of demand inserts")
    run.add_argument(
        "--workload", default="demand", help="demand (Section 5.1) or increments (repeated)"
    )
    run.add_argument("--input", type=path_arg, help="JSON-lines operations on demand/inventory")
    run.add_argument("--seed", type=seed, default=0)
    run.add_argument(
        "--starvation-ts", type=positive_float(86_400), default=1.0, help="threshold TS, seconds"
    )
    run.add_argument(
        "--deadlock-timeout-ms", type=positive_int(3_600_000), default=50, help="postgres only"
    )
    run.add_argument("--conninfo", help="postgres: use this server instead of a throwaway one")
    run.set_defaults(func=cmd_run)

    methods = lsub.add_parser("methods", help="list the loading methods")
    methods.set_defaults(func=cmd_methods)


def _check_target(name: str) -> None:
    if name not in ("embedded", "postgres"):
        raise UnknownNameError("target", name, ["embedded", "postgres"])


def cmd_methods(args: argparse.Namespace) -> int:
    """Print the methods and what they do."""
    from txstream.loading.methods import METHODS

    for name, cls in METHODS.items():
        print(f"{name:10s} {cls.summary}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Execute ``txstream loading run``."""
    from txstream.loading import EmbeddedTarget, Loader, Target
    from txstream.loading.methods import METHODS
    from txstream.loading.oracle import (
        apply_serial,
        base_from_rows,
        differences,
        expected_state,
        verify,
    )
    from txstream.loading.workloads import (
        demand_schema,
        demand_stream,
        increment_stream,
        initial_rows,
    )

    _check_target(args.target)
    if args.method not in METHODS:
        raise UnknownNameError("loading method", args.method, list(METHODS))
    if args.sessions < 1 or args.grouping < 1:
        raise TxStreamError("--sessions and --grouping must be at least 1")
    if args.parts < 1 or args.operations < 0 or not 0.0 <= args.p <= 1.0:
        raise TxStreamError("--parts must be >= 1, --operations >= 0 and --p within [0, 1]")
    schema = demand_schema()
    init = initial_rows(args.parts, seed=args.seed)
    raw: list[Any]
    if args.input is not None:
        raw = [line for line in args.input.read_text().splitlines() if line.strip()]
        _check_input(schema, raw, args.input)
    elif args.workload == "demand":
        raw = list(demand_stream(args.operations, args.parts, p=args.p, seed=args.seed))
    elif args.workload == "increments":
        raw = list(increment_stream(args.operations, min(args.parts, 50), seed=args.seed))
    else:
        raise UnknownNameError("workload", args.workload, ["demand", "increments"])
    server = None
    target: Target
    if args.target == "embedded":
        target = EmbeddedTarget(schema)
    else:
        from txstream.loading.pgserver import PostgresServer
        from txstream.loading.postgres import PostgresTarget

        if args.conninfo:
            target = PostgresTarget(
                schema, args.conninfo, deadlock_timeout_ms=args.deadlock_timeout_ms
            )
        else:
            # A connection per session plus the loader's own few.
            server = PostgresServer(
                deadlock_timeout_ms=args.deadlock_timeout_ms,
                max_connections=max(40, args.sessions + 10),
            ).start()
            target = PostgresTarget(schema, server)
    try:
        target.setup()
        target.bulk_load(init)
        with Loader(
            target,
            args.method,
            sessions=args.sessions,
            grouping=args.grouping,
            preaggregate=args.preaggregate,
            seed=args.seed,
            starvation_ts=args.starvation_ts,
        ) as loader:
            report = loader.load(raw)
        state = target.state()
        good, _bad = loader.validate(raw)
        expected = expected_state(schema, apply_serial(schema, good, base_from_rows(schema, init)))
        summary = report.summary()
        summary["view_ok"] = not verify(schema, state)
        summary["exact"] = not differences(schema, state, expected)
        # Operation numbers are 1-based: with --input, the line among the non-blank lines.
        summary["rejected_examples"] = [f"#{i + 1}: {msg}" for i, msg in report.rejected[:10]]
        for i, msg in report.rejected[:10]:
            print(f"txstream: rejected operation {i + 1}: {msg}", file=sys.stderr)
        if len(report.rejected) > 10:
            print(
                f"txstream: ... and {len(report.rejected) - 10} more rejected operations",
                file=sys.stderr,
            )
        summary.update({f"target_{k}": v for k, v in target.stats().items()})
    finally:
        target.close()
        if server is not None:
            server.stop()
    print(json.dumps(json_safe(summary), indent=2, allow_nan=False))
    # A rejected operation is input that was not loaded: the run did not do what
    # was asked, even if what it did load is consistent.
    return 0 if summary["view_ok"] and not report.rejected else 1


def _check_input(schema: Any, raw: list[Any], path: Path) -> None:
    """Refuse an input with no operation that could be loaded (before any server starts)."""
    from txstream.loading.ops import InvalidOperation, validate

    if not raw:
        raise TxStreamError(f"{path} holds no operations (one JSON object per line)")
    first = ""
    for i, line in enumerate(raw):
        try:
            validate(schema, line)
            return
        except InvalidOperation as exc:
            first = first or f"line {i + 1}: {exc}"
    raise TxStreamError(f"none of the {len(raw)} operations in {path} is valid; {first}")
