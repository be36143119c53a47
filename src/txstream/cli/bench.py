"""``txstream bench``: run a registered experiment and write its CSV and plots."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from txstream.bench.harness import apply_overrides, run_experiment, select_points
from txstream.bench.registry import EXPERIMENT_MODULES, experiments, get_experiment
from txstream.cli import Subparsers
from txstream.cli.types import int_range, path_arg, seed
from txstream.errors import TxStreamError


def register_cli(sub: Subparsers) -> None:
    """Add the ``bench`` subcommand."""
    names = [m.rsplit(".", 1)[-1] for m in EXPERIMENT_MODULES]
    p = sub.add_parser(
        "bench",
        help="run a benchmark / paper experiment",
        description="Run an experiment: writes OUT/NAME.csv and a PNG per figure.",
    )
    p.add_argument(
        "name", metavar="NAME", help=f"experiment: {', '.join(names)}, or all (one after another)"
    )
    p.add_argument("--quick", action="store_true", help="the small grid used in CI")
    p.add_argument("--out", type=path_arg, default=Path("bench-out"), help="output folder")
    p.add_argument("--seed", type=seed, default=0, help="base seed of the repetitions")
    p.add_argument("--no-progress", action="store_true", help="no progress output")
    p.add_argument(
        "--reps",
        type=int_range(1, 100),
        metavar="N",
        help="run every point N times, in rounds (every point once, then again), "
        "instead of the experiment's repetitions (the runtime summary takes each point's median)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="PARAM=VALUE",
        help="override a parameter in every point, e.g. --set target=embedded (loading)",
    )
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="PARAM=VALUE",
        help="run only the points whose PARAM is VALUE (repeatable), e.g. --only sweep=speedup "
        "--only variant=serializable (linear-road)",
    )
    p.add_argument(
        "--spark",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the points as Spark tasks on a local session (default: on for the full "
        "grid of experiments with independent simulated points, e.g. broadcast)",
    )
    p.add_argument(
        "--target",
        metavar="NAME",
        help="shorthand for --set target=NAME (loading: postgres or embedded)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Execute ``txstream bench``."""
    if any(c in str(args.out) for c in "[]{}*?"):
        # Spark reads input folders under --out as Hadoop globs: "[1]" would match
        # "1" and the job would wait for input that it never sees.
        raise TxStreamError(f"--out {args.out}: use a folder name without []{{}}*? characters")
    chosen = list(experiments().values()) if args.name == "all" else [get_experiment(args.name)]
    items = args.set + ([f"target={args.target}"] if args.target is not None else [])
    _refuse_twice(items)
    # Check every experiment's overrides before the first one runs for an hour.
    chosen = [select_points(apply_overrides(exp, items), args.only) for exp in chosen]
    if args.reps is not None:
        chosen = [
            replace(exp, repetitions=args.reps, quick_repetitions=args.reps) for exp in chosen
        ]
    for exp in chosen:
        spark = args.spark if args.spark is not None else exp.spark_default and not args.quick
        rows = run_experiment(
            exp,
            args.out,
            quick=args.quick,
            progress=not args.no_progress,
            seed=args.seed,
            mapper=_spark_mapper() if spark else None,
        )
        files = [args.out / f"{exp.name}.csv", *(args.out / f"{f.name}.png" for f in exp.figures)]
        print(f"{exp.name}: {len(rows)} runs; wrote {', '.join(str(f) for f in files)}", flush=True)
    return 0


def _refuse_twice(items: list[str]) -> None:
    """Refuse a parameter set twice to different values (``--target`` counts as ``--set target``).

    The last one won without a word: ``--set threads=2 --set threads=3`` ran threads=3.
    """
    seen: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if eq and key in seen and seen[key] != value:
            raise TxStreamError(
                f"--set {key} is given twice ({key}={seen[key]} and {key}={value}); give it once"
            )
        seen.setdefault(key, value)


def _spark_mapper() -> Any:
    """Run the points as Spark tasks (one per point) on a local session."""
    from txstream.spark.sweep import run_points

    return run_points
