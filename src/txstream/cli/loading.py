"""``txstream loading``: run the continuous loader from the command line.

* ``txstream loading run --method reorder --target postgres --sessions 8 --grouping 10``
  loads the demand/inventory workload (or ``--input FILE`` of JSON lines) and
  prints a JSON summary: throughput, deadlocks, statements and whether the
  final state is right (``view_ok``, ``exact``).
* The experiment is ``txstream bench loading`` (target postgres;
  ``--set target=embedded`` for the embedded target).
* ``txstream loading run --spark --target postgres`` streams the operations
  through Spark (one JSON-lines file per micro-batch) with the k sessions as
  Spark tasks (``--on executors``, each with its own connection), through the
  driver's loader (``--on driver``), or both alternated on the same input
  (``--on both``, the comparison of ``docs/loading.md``), with the processes'
  CPU time.  ``--out DIR --conninfo ...`` makes a run resumable after a crash.
* ``txstream loading methods`` lists the loading methods.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from txstream.cli import Group, Subparsers
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
from txstream.storage.files import check_folder

MAX_SESSIONS = 256
"""More sessions than this is a typo, not an experiment (each is a thread and a connection)."""


GROUP = Group(
    "loading",
    help="continuous loading with join views (naive / partition / reorder)",
    description="Load modification operations through k sessions without deadlocks.",
    metavar="ACTION",
    raw=False,
)


def register_cli(lsub: Subparsers) -> None:
    """Add ``loading``'s actions."""
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
        "--operations",
        type=nonnegative_int(5_000_000),
        default=None,
        help="stream length (10000; not with --input)",
    )
    run.add_argument("--parts", type=positive_int(1_000_000), default=10_000, help="active parts s")
    run.add_argument(
        "--p",
        type=probability,
        default=None,
        help="fraction of demand inserts (0.5; not with --input)",
    )
    run.add_argument(
        "--workload",
        default=None,
        help="demand (Section 5.1, the default) or increments (repeated); not with --input",
    )
    run.add_argument("--input", type=path_arg, help="JSON-lines operations on demand/inventory")
    run.add_argument("--seed", type=seed, default=0)
    run.add_argument(
        "--starvation-ts", type=positive_float(86_400), default=1.0, help="threshold TS, seconds"
    )
    run.add_argument(
        "--deadlock-timeout-ms",
        type=positive_int(3_600_000),
        default=None,
        help="postgres only (50)",
    )
    run.add_argument("--conninfo", help="postgres: use this server instead of a throwaway one")
    run.add_argument(
        "--spark",
        action="store_true",
        help="feed the operations through a Spark stream of JSON-lines files (one per batch)",
    )
    run.add_argument(
        "--on",
        default=None,
        help="with --spark: executors (sessions are Spark tasks), driver, or both (alternated)",
    )
    run.add_argument(
        "--files", type=positive_int(100_000), default=None, help="with --spark: micro-batches (10)"
    )
    run.add_argument(
        "--rounds",
        type=positive_int(100),
        default=None,
        help="with --on both: driver/executors pairs (3)",
    )
    run.add_argument(
        "--out",
        type=path_arg,
        help="with --spark: the run's folder (input files, checkpoint); a run killed "
        "midway resumes from it (with --conninfo, the same server)",
    )
    run.add_argument("--master", help="with --spark: Spark master (default local[2])")
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
    _refuse_ignored(args)
    if args.method not in METHODS:
        raise UnknownNameError("loading method", args.method, list(METHODS))
    if args.sessions < 1 or args.grouping < 1:
        raise TxStreamError("--sessions and --grouping must be at least 1")
    if args.parts < 1 or args.operations < 0 or not 0.0 <= args.p <= 1.0:
        raise TxStreamError("--parts must be >= 1, --operations >= 0 and --p within [0, 1]")
    if args.spark:
        _check_spark_args(args)
    else:
        given = [f"--{a}" for a in SPARK_ONLY if getattr(args, a) is not None]
        if given:
            raise TxStreamError(f"{', '.join(given)} go with --spark")
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
    if args.spark:
        return _cmd_run_spark(args, schema, init, raw)
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


SPARK_ON = ("executors", "driver", "both")

GENERATOR_ONLY = {"operations": 10_000, "p": 0.5, "workload": "demand"}
"""The options that shape a generated stream, with their defaults (None when not given)."""


def _refuse_ignored(args: argparse.Namespace) -> None:
    """Refuse options the run would ignore, in one line; fill the defaults.

    Each was accepted and did nothing: ``--conninfo`` and ``--deadlock-timeout-ms``
    with the embedded target, ``--operations``, ``--p`` and ``--workload`` with
    ``--input`` (which names the operations).
    """
    if args.target != "postgres":
        given = [
            o
            for o, v in (
                ("--conninfo", args.conninfo),
                ("--deadlock-timeout-ms", args.deadlock_timeout_ms),
            )
            if v is not None
        ]
        if given:
            raise TxStreamError(
                f"{' and '.join(given)} {'go' if len(given) > 1 else 'goes'} with --target "
                f"postgres; the {args.target} target has no server: leave "
                f"{'them' if len(given) > 1 else 'it'} out"
            )
    args.deadlock_timeout_ms = 50 if args.deadlock_timeout_ms is None else args.deadlock_timeout_ms
    if args.input is not None:
        given = [f"--{a}" for a in GENERATOR_ONLY if getattr(args, a) is not None]
        if given:
            raise TxStreamError(
                f"{', '.join(given)} {'shape' if len(given) > 1 else 'shapes'} a generated "
                "stream, and --input names the operations: leave "
                f"{'them' if len(given) > 1 else 'it'} out, or leave out --input"
            )
    for name, default in GENERATOR_ONLY.items():
        if getattr(args, name) is None:
            setattr(args, name, default)


SPARK_ONLY = ("on", "files", "rounds", "out", "master")
"""The options of a ``--spark`` run (None when not given)."""


def _check_spark_args(args: argparse.Namespace) -> None:
    """Refuse what a Spark run cannot do, in one line, before anything starts; fill defaults."""
    from txstream.spark.session import check_master

    args.on = "executors" if args.on is None else args.on
    args.files = 10 if args.files is None else args.files
    args.rounds = 3 if args.rounds is None else args.rounds
    if args.master is not None:
        check_master(args.master)
    if args.on not in SPARK_ON:
        raise UnknownNameError("--on", args.on, list(SPARK_ON))
    if args.on != "driver" and args.target != "postgres":
        raise TxStreamError(
            "the executors' sessions need a database they can reach: add --target postgres "
            "(or --on driver for the embedded target)"
        )
    if args.on == "both" and args.out is not None:
        raise TxStreamError("--on both makes a fresh run per round: leave out --out")
    if args.out is not None:
        check_folder(args.out, "run folder ")  # (before the input is made and Spark starts)
    if (
        args.out is not None
        and args.target == "postgres"
        and not args.conninfo
        and (args.out / RUN_FILE).exists()
    ):
        raise TxStreamError(
            f"{args.out} holds a run whose throwaway server ended with it: resume it with "
            "--conninfo of a server of your own, or choose another --out"
        )


RUN_FILE = "run.json"
"""In a ``--spark --out`` folder: the run's settings, written once the target is set up."""


def _settings(args: argparse.Namespace, on: str) -> dict[str, Any]:
    return {
        "on": on,
        "method": args.method,
        "target": args.target,
        "k": args.sessions,
        "n": args.grouping,
        "preaggregate": args.preaggregate,
        "seed": args.seed,
        "starvation_ts": args.starvation_ts,
        "files": args.files,
        "input": None if args.input is None else str(args.input),
        "workload": args.workload,
        "operations": args.operations,
        "parts": args.parts,
        "p": args.p,
    }


def _write_input(folder: Path, schema: Any, raw: list[Any], files: int) -> None:
    """``raw`` as ``files`` JSON-lines files, oldest first (Spark takes them in that order)."""
    import os
    import time

    from txstream.loading.ops import Modification

    folder.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r.to_json(schema)) if isinstance(r, Modification) else r for r in raw]
    per = -(-len(lines) // files) if lines else 0
    now = time.time()
    for i in range(files):
        path = folder / f"part-{i:05d}.jsonl"
        tmp = folder / f".part-{i:05d}.tmp"
        tmp.write_text("".join(line + "\n" for line in lines[i * per : (i + 1) * per]))
        # Distinct modification times in file order: the file source's order.
        stamp = now - files + i
        os.utime(tmp, (stamp, stamp))
        tmp.rename(path)


def _cmd_run_spark(args: argparse.Namespace, schema: Any, init: Any, raw: list[Any]) -> int:
    """``txstream loading run --spark``: one run, or ``--on both`` alternated."""
    import statistics
    import tempfile

    from txstream.loading.ops import InvalidOperation, validate
    from txstream.loading.oracle import apply_serial, base_from_rows, expected_state

    good = []
    for r in raw:
        with contextlib.suppress(InvalidOperation):
            good.append(validate(schema, r))
    expected = expected_state(schema, apply_serial(schema, good, base_from_rows(schema, init)))
    from txstream.spark import local_session

    server = None
    conninfo = args.conninfo
    if args.target == "postgres" and not conninfo:
        from txstream.loading.pgserver import PostgresServer

        server = PostgresServer(
            deadlock_timeout_ms=args.deadlock_timeout_ms,
            max_connections=max(40, 2 * args.sessions + 10),
        ).start()
        conninfo = server.conninfo
    spark = None
    try:
        spark = local_session("txstream-loading", master=args.master)
        server_pid = _postmaster(server)
        if args.on != "both":
            summary = _spark_once(
                args, args.on, spark, schema, init, raw, expected, conninfo, server_pid, args.out
            )
            ok = summary["view_ok"] and summary["exact"] and not summary["rejected"]
        else:
            rows = []
            with tempfile.TemporaryDirectory(prefix="txstream-loading-") as tmp:
                for r in range(args.rounds):
                    for on in ("driver", "executors"):
                        out = Path(tmp) / f"{on}-{r}"
                        rows.append(
                            _spark_once(
                                args, on, spark, schema, init, raw, expected, conninfo,
                                server_pid, out,
                            )
                        )  # fmt: skip
            summary = {"rounds": rows}
            for on in ("driver", "executors"):
                mine = [row for row in rows if row["on"] == on]
                summary[f"{on}_median"] = {
                    key: round(statistics.median(row[key] for row in mine), 4)
                    for key in (
                        "throughput",
                        "elapsed_s",
                        "driver_cpu_us_per_op",
                        "executors_cpu_us_per_op",
                        "driver_share",
                    )
                }
            summary["executors_over_driver_throughput"] = round(
                summary["executors_median"]["throughput"]
                / max(summary["driver_median"]["throughput"], 1e-9),
                3,
            )
            ok = all(row["view_ok"] and row["exact"] for row in rows)
    finally:
        if spark is not None:
            spark.stop()
        if server is not None:
            server.stop()
    print(json.dumps(json_safe(summary), indent=2, allow_nan=False))
    return 0 if ok else 1


def _postmaster(server: Any) -> int | None:
    """The throwaway server's postmaster pid (for its CPU time), or None."""
    if server is None or server.dir is None:
        return None
    try:
        return int((server.dir / "data" / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _spark_once(
    args: argparse.Namespace,
    on: str,
    spark: Any,
    schema: Any,
    init: Any,
    raw: list[Any],
    expected: Any,
    conninfo: str | None,
    server_pid: int | None,
    out: Path | None,
) -> dict[str, Any]:
    """One streamed run (``on`` the driver or the executors) into a target; its summary."""
    import shutil
    import tempfile
    import time

    from txstream.jobs.loading import ExecutorLoadingSink, LoadingSink, ProcessCPU, load_directory
    from txstream.loading import EmbeddedTarget, Loader, Target
    from txstream.loading.oracle import differences, verify

    temporary = out is None
    folder = Path(tempfile.mkdtemp(prefix="txstream-loading-")) if out is None else out
    settings = _settings(args, on)
    run_file = folder / RUN_FILE
    target: Target
    if args.target == "postgres":
        from txstream.loading.postgres import PostgresTarget

        assert conninfo is not None
        target = PostgresTarget(schema, conninfo, deadlock_timeout_ms=args.deadlock_timeout_ms)
    else:
        target = EmbeddedTarget(schema)
    loader = None
    try:
        resumed = run_file.exists()
        if resumed:
            before = json.loads(run_file.read_text())
            if before != settings:
                changed = sorted(k for k in settings if before.get(k) != settings[k])
                raise TxStreamError(
                    f"{folder} holds a run with other settings ({', '.join(changed)}); "
                    "resume it with the same ones, or choose another --out"
                )
        else:
            shutil.rmtree(folder / "checkpoint", ignore_errors=True)
            _write_input(folder / "in", schema, raw, args.files)
            target.setup()
            target.bulk_load(init)
            run_file.write_text(json.dumps(settings))
        method = {
            "sessions": args.sessions,
            "grouping": args.grouping,
            "preaggregate": args.preaggregate,
            "seed": args.seed,
            "starvation_ts": args.starvation_ts,
        }
        sink: LoadingSink | ExecutorLoadingSink
        if on == "executors":
            sink = ExecutorLoadingSink(target, args.method, **method)
        else:
            sink = LoadingSink(Loader(target, args.method, **method))
        cpu = ProcessCPU(spark, server_pid)
        first, start = cpu.sample(), time.perf_counter()
        query = load_directory(
            spark, folder / "in", sink, checkpoint=folder / "checkpoint", max_files_per_trigger=1
        )
        try:
            query.processAllAvailable()
        finally:
            query.stop()
        failure = query.failure()
        if failure is not None:
            raise TxStreamError(f"the loading query failed: {failure}")
        elapsed = time.perf_counter() - start
        used = {k: v - first[k] for k, v in cpu.sample().items()}
        state = target.state()
        reports = list(sink.reports.values())
        operations = sum(r.operations for r in reports)
        rejected = [msg for r in reports for _i, msg in r.rejected]
        executors = used["jvm"] + used["workers"]
        driver_us = 1e6 * used["driver"] / max(operations, 1)
        summary: dict[str, Any] = {
            "on": on,
            "target": target.name,
            "method": args.method,
            "k": args.sessions,
            "n": args.grouping,
            "batches": len(reports),
            "skipped_batches": len(sink.skipped),
            "resumed": resumed,
            "operations": operations,
            "rejected": len(rejected),
            "transactions": sum(r.transactions for r in reports),
            "skipped_transactions": sum(r.skipped for r in reports),
            "deadlocks": sum(r.deadlocks for r in reports),
            "statements": sum(r.statements for r in reports),
            "method_stats": {
                key: sum(r.method_stats.get(key, 0) for r in reports)
                for key in sorted({key for r in reports for key in r.method_stats})
            },
            "elapsed_s": round(elapsed, 3),
            "throughput": round(operations / elapsed, 1) if elapsed > 0 else 0.0,
            "cpu_s": {k: round(v, 3) for k, v in used.items()},
            "driver_cpu_us_per_op": round(driver_us, 2),
            "executors_cpu_us_per_op": round(1e6 * executors / max(operations, 1), 2),
            "driver_share": round(used["driver"] / executors, 4) if executors > 0 else None,
            "view_ok": not verify(schema, state),
            "exact": not differences(schema, state, expected),
            "rejected_examples": rejected[:10],
        }
        for msg in rejected[:10]:
            print(f"txstream: rejected operation: {msg}", file=sys.stderr)
        return summary
    finally:
        if loader is not None:
            loader.close()
        target.close()
        if temporary:
            shutil.rmtree(folder, ignore_errors=True)
