"""``txstream bench``: run a registered experiment and write its CSV and plots."""

from __future__ import annotations

import argparse
from pathlib import Path

from txstream.bench.harness import run_experiment
from txstream.bench.registry import EXPERIMENT_MODULES, experiments, get_experiment


def register_cli(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    p.add_argument("--out", type=Path, default=Path("bench-out"), help="output folder")
    p.add_argument("--seed", type=int, default=0, help="base seed of the repetitions")
    p.add_argument("--no-progress", action="store_true", help="no progress output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Execute ``txstream bench``."""
    chosen = list(experiments().values()) if args.name == "all" else [get_experiment(args.name)]
    for exp in chosen:
        rows = run_experiment(
            exp, args.out, quick=args.quick, progress=not args.no_progress, seed=args.seed
        )
        files = [args.out / f"{exp.name}.csv", *(args.out / f"{f.name}.png" for f in exp.figures)]
        print(f"{exp.name}: {len(rows)} runs; wrote {', '.join(str(f) for f in files)}", flush=True)
    return 0
