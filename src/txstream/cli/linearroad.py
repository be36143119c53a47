"""``txstream linear-road``: generate Linear Road inputs, run the queries, validate answers.

``txstream linear-road run [--input FILE [--tolls FILE] | --L X --minutes D]
[--speedup S] [--variant serializable|not-serializable|adhoc] [--txn-size
event|1s|2s|3s] [--lav spec|raw-mean] [--accident-end spec|clear-minute]
[--inject-duplicates SECONDS] --out DIR``
replays the input through Spark Structured Streaming into the transactional
engine and writes ``DIR/answers.txt``, ``DIR/rejected.txt``,
``DIR/summary.json`` and ``DIR/latency.png``; it validates the answers unless
``--no-validate``.  Run it again with the same ``--out`` after a crash and it
resumes from the checkpoint and write-ahead log in ``DIR/state``.

``txstream linear-road generate --out DIR [--L X] [--minutes D] [--seed S]
[--spark]`` writes ``DIR/input.dat`` and ``DIR/tolls.dat`` and prints the
tuple density (tuples per expressway-second), which labels any L rating
measured on the input.

``txstream linear-road validate --input FILE [--answers FILE] [--lav
spec|raw-mean] [--accident-end spec|clear-minute] [--tolls FILE] [--expected
FILE] [--format table|json]`` recomputes the expected answers from the input
and counts wrong, missing and duplicate answers per type; with ``--expected``
it also reports the per-field agreement with a reference answers file.  Exit
1 when any answer is wrong, missing or duplicated, any input tuple was
rejected, or (with ``--expected``) any answer disagrees with the reference.  Without
``--answers`` the validator's own expected answers are checked, which with
``--expected`` measures the validator against an independent one.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from txstream.cli import Group, Subparsers
from txstream.cli.types import (
    float_range,
    int_range,
    json_safe,
    nonnegative_int,
    path_arg,
    positive_float,
    seed,
)
from txstream.errors import TxStreamError, UnknownNameError
from txstream.storage.files import check_folder

FORMATS = ("table", "json")
SPARK_FROM_L = 8.0
"""From this L on, ``generate`` runs as a Spark job even without ``--spark``."""


GROUP = Group("linear-road", help="Linear Road: generate inputs, validate answers")


def register_cli(group: Subparsers) -> None:
    """Add ``linear-road``'s subcommands (``generate``, ``validate``)."""
    g = group.add_parser("generate", help="write a deterministic input and historical tolls")
    g.add_argument("--out", type=path_arg, required=True, metavar="DIR")
    g.add_argument(
        "--L",
        dest="L",
        type=float_range(0.5, 512),
        default=1.0,
        help="expressways (halves allowed)",
    )
    g.add_argument("--minutes", type=int_range(1, 180), default=10, help="simulated minutes")
    g.add_argument("--seed", type=seed, default=0)
    g.add_argument(
        "--rate",
        type=float_range(0.01, 20),
        default=2.0,
        help="cars entering per second and direction",
    )
    g.add_argument(
        "--spark",
        action="store_true",
        help=f"one Spark task per expressway (default from L={SPARK_FROM_L:g})",
    )
    g.set_defaults(func=_generate)

    r = group.add_parser(
        "run",
        help="run the queries on Spark under the transaction manager, then validate",
        description="Replay a Linear Road input through Spark Structured Streaming at a "
        "speedup into the transactional engine; write DIR/answers.txt, rejected.txt, "
        "summary.json and latency.png, and validate the answers. Re-running with the "
        "same --out after a crash resumes. See docs/linear-road.md.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    src = r.add_mutually_exclusive_group()
    src.add_argument("--input", type=path_arg, metavar="FILE", help="an input file (.gz allowed)")
    src.add_argument(
        "--L",
        dest="L",
        type=float_range(0.5, 512),
        help="generate an input with L expressways (1 if no --input)",
    )
    # (None: not given; --input refuses them rather than ignore them)
    r.add_argument(
        "--minutes",
        type=int_range(1, 180),
        default=None,
        help="simulated minutes to generate (3; not with --input)",
    )
    r.add_argument(
        "--seed", type=seed, default=None, help="seed of the generated input (0; not with --input)"
    )
    r.add_argument("--tolls", type=path_arg, metavar="FILE", help="historical tolls for --input")
    r.add_argument(
        "--speedup",
        type=positive_float(1e6),
        default=None,
        help="simulated seconds per wall second (1; not with --no-spark)",
    )
    r.add_argument(
        "--variant",
        default="serializable",
        help="serializable, not-serializable or adhoc (the runtime only: the two jobs "
        "synchronized by the TOLLS store, the paper's ADHOC SERIALIZABLE)",
    )
    r.add_argument("--txn-size", default="event", help="event, 1s, 2s or 3s")
    r.add_argument("--lav", default="spec", help="LAV definition: spec or raw-mean")
    r.add_argument(
        "--accident-end",
        default="spec",
        help="when an accident stops counting: spec (the minute after the last stopped "
        "report) or clear-minute (the minute of the report that clears it)",
    )
    r.add_argument(
        "--inject-duplicates",
        type=nonnegative_int(86_400),
        default=0,
        metavar="SECONDS",
        help="duplicate a segment-entering report every SECONDS of input time",
    )
    r.add_argument(
        "--engine",
        default=None,
        help="runtime (the default: partitions on Spark executors; the not-serializable "
        "variant as two jobs, the minute path and the notification path, with no common "
        "order) or driver (the transaction manager's concurrent paths as threads in the "
        "driver)",
    )
    r.add_argument(
        "--master", default=None, help="Spark master, e.g. local[1], local-cluster[2,1,1024]"
    )
    r.add_argument(
        "--partitions",
        type=int_range(1, 4096),
        default=None,
        help="runtime partitions (4; fixed at the first start of --out; not with --engine driver)",
    )
    r.add_argument(
        "--sync", default="off", help="write-ahead log sync (driver engine): off, group or commit"
    )
    r.add_argument("--no-validate", action="store_true", help="skip the validation")
    r.add_argument(
        "--no-spark",
        action="store_true",
        help="replay in Python as fast as the engine takes it (no JVM, no --speedup pacing)",
    )
    r.add_argument(
        "--record",
        type=path_arg,
        metavar="FILE",
        help="write the committed history of operations (for txstream check)",
    )
    r.add_argument("--out", type=path_arg, required=True, metavar="DIR")
    r.set_defaults(func=_run)

    v = group.add_parser("validate", help="check an answers file against the input")
    v.add_argument("--input", type=path_arg, required=True, metavar="FILE")
    v.add_argument("--answers", type=path_arg, metavar="FILE", help="default: the validator's own")
    v.add_argument("--lav", default="spec", help="LAV definition: spec or raw-mean")
    v.add_argument(
        "--accident-end", default="spec", help="when an accident stops counting: spec, clear-minute"
    )
    v.add_argument(
        "--tolls", type=path_arg, metavar="FILE", help="historical tolls VID,Day,XWay,Toll"
    )
    v.add_argument("--expected", type=path_arg, metavar="FILE", help="reference answers to compare")
    v.add_argument("--format", default="table", help="table or json")
    v.set_defaults(func=_validate)


def _generate(args: argparse.Namespace) -> int:
    from txstream.linearroad.generate import check_params, generate, lanes_of

    lanes_of(args.L)
    check_params(args.minutes, args.rate)
    check_folder(args.out)  # the files are written once the whole input is computed
    if args.spark or args.L >= SPARK_FROM_L:
        from txstream.linearroad.generate_job import generate_spark

        paths = generate_spark(
            args.out, L=args.L, minutes=args.minutes, seed=args.seed, rate=args.rate
        )
    else:
        paths = generate(args.out, L=args.L, minutes=args.minutes, seed=args.seed, rate=args.rate)
    print(f"input: {paths.input} ({paths.tuples} tuples)")
    print(f"tolls: {paths.tolls}")
    print(f"density: {paths.density:.1f} tuples per expressway-second (L={args.L:g})")
    return 0


SYNC_MODES = ("off", "group", "commit")


def _check_files(*options: tuple[str, Path | None]) -> None:
    """Refuse an input option naming no file, in one line that says what is there instead.

    A folder was "no such file: DIR", which sent the user looking for a typo.
    """
    for option, path in options:
        if path is None or path.is_file():
            continue
        if path.is_dir():
            raise TxStreamError(f"{option} {path} is a folder; name a file")
        if path.exists():
            raise TxStreamError(f"{option} {path} is not a regular file; name a file")
        raise TxStreamError(f"{option} {path}: no such file")


def _check_not_empty(path: Path) -> None:
    """Refuse an input without a tuple, or whose first line is not one, before Spark starts.

    Running it checked nothing (exit 0), or replayed a file of another kind line by
    line into rejected.txt.
    """
    from txstream.linearroad.formats import MalformedTupleError, open_text, parse_input_line

    with open_text(path) as f:
        try:
            for no, line in enumerate(f, 1):
                if line.strip():
                    try:
                        parse_input_line(line)
                    except MalformedTupleError as exc:
                        raise TxStreamError(
                            f"{path} line {no}: {exc}: not a Linear Road input"
                        ) from None
                    return
        except (UnicodeDecodeError, OSError) as exc:
            raise TxStreamError(f"cannot read {path}: {exc}") from None
    raise TxStreamError(f"{path} holds no input tuples")


RUN_FILES = frozenset(
    {"answers.txt", "answers.txt.batches.json", "rejected.txt", "summary.json", "latency.png",
     "run.json", "started.json", "input.dat", "tolls.dat", "ckpt"}
)  # fmt: skip
"""What ``run`` writes in --out (``ckpt`` a folder): no --record may name one of them."""


def _refuse_ignored(args: argparse.Namespace) -> None:
    """Refuse options this run would ignore, and a --record that would overwrite a run file.

    Then fill the generator's defaults (``--minutes`` 3, ``--seed`` 0).  Each
    was accepted: ``--minutes``/``--seed`` with ``--input`` and ``--tolls``
    without it did nothing, ``--master`` with ``--no-spark`` started no Spark;
    ``--record`` naming the input replaced it with the history, and naming
    ``answers.txt`` in --out replaced the answers before they were validated.
    """
    if args.input is not None:
        given = [
            o for o, v in (("--minutes", args.minutes), ("--seed", args.seed)) if v is not None
        ]
        if given:
            raise TxStreamError(
                f"{' and '.join(given)} only shape a generated input, and --input names "
                f"one: leave {'them' if len(given) > 1 else 'it'} out, or leave out --input"
            )
    elif args.tolls is not None:
        raise TxStreamError("--tolls goes with --input: a generated input comes with its own tolls")
    args.minutes = 3 if args.minutes is None else args.minutes
    args.seed = 0 if args.seed is None else args.seed
    if args.master is not None and args.no_spark:
        raise TxStreamError(
            "--master names the Spark master; --no-spark starts no Spark: leave one of them out"
        )
    if args.record is not None:
        record = args.record.resolve()
        for option, path in (("--input", args.input), ("--tolls", args.tolls)):
            if path is not None and path.resolve() == record:
                raise TxStreamError(
                    f"--record {args.record} is the {option} file; the history would replace it"
                )
        out = args.out.resolve()
        inside = record.relative_to(out).parts if record.is_relative_to(out) else ()
        if inside and inside[0] in RUN_FILES:
            raise TxStreamError(
                f"--record {args.record} is the run's own {inside[0]} in --out {args.out}; "
                "name another file"
            )


def _run(args: argparse.Namespace) -> int:
    from txstream.linearroad.engine import check_txn_size
    from txstream.linearroad.reference import check_accident_end, check_lav
    from txstream.linearroad.run_job import RunOptions, check_engine, run_job
    from txstream.linearroad.runtime_job import check_variant

    check_variant(args.variant)
    check_txn_size(args.txn_size)
    check_lav(args.lav)
    check_accident_end(args.accident_end)
    if args.sync not in SYNC_MODES:
        raise UnknownNameError("sync setting", args.sync, list(SYNC_MODES))
    if args.speedup is not None and args.no_spark:
        # (accepted and ignored: the Python replay runs as fast as the engine takes it)
        raise TxStreamError(
            "--speedup paces the Spark replay; --no-spark replays as fast as the engine takes "
            "it: leave one of them out"
        )
    if args.partitions is not None and args.engine == "driver":
        raise TxStreamError(
            "--partitions sets the runtime engine's partitions; the driver engine runs its "
            "paths as threads in one process: leave --partitions out, or use --engine runtime"
        )
    if args.inject_duplicates < 0:
        raise TxStreamError("--inject-duplicates must be 0 (off) or a number of seconds")
    _refuse_ignored(args)
    _check_files(("--input", args.input), ("--tolls", args.tolls))
    if args.input is not None:
        _check_not_empty(args.input)
    if args.tolls is not None:
        from txstream.linearroad.reference import read_tolls

        # a bad line fails now, in one line, not on the executors once Spark runs
        # the first query that reads the tolls (the driver engine read it after
        # the output folder was made)
        read_tolls(args.tolls)
    if args.master is not None:
        from txstream.spark.session import check_master

        check_master(args.master)
    if args.input is None:
        from txstream.linearroad.generate import check_params, lanes_of

        lanes_of(args.L if args.L is not None else 1.0)
        check_params(args.minutes, 2.0)
    options = RunOptions(
        out=args.out,
        input=args.input,
        tolls=args.tolls,
        L=args.L if args.L is not None else 1.0,
        minutes=args.minutes,
        seed=args.seed,
        speedup=args.speedup if args.speedup is not None else 1.0,
        variant=args.variant,
        txn_size=args.txn_size,
        lav=args.lav,
        accident_end=args.accident_end,
        inject_duplicates=args.inject_duplicates,
        sync=args.sync,
        validate=not args.no_validate,
        record=args.record,
        spark=not args.no_spark,
        engine=args.engine,
        master=args.master,
        partitions=args.partitions if args.partitions is not None else 4,
    )
    check_engine(options)
    result = run_job(options)
    from txstream.linearroad.report import table

    print(table(result))
    print(f"outputs in {args.out}/ (answers.txt, rejected.txt, summary.json, latency.png)")
    if args.record is not None:
        print(
            f"history: {result['history']} ({result['history_operations']} operations), "
            f"conflict-serializable: {result['history_cs']}"
            + (
                f", with arrival order: {result['history_csao']}"
                if "history_csao" in result
                else ""
            )
        )
    if result.get("rejected_lines"):  # (a bad input is an error whatever the variant)
        print(f"{result['rejected_lines']} input line(s) rejected ({args.out}/rejected.txt)")
        return 1
    if args.variant == "serializable" and result.get("valid") is False:
        return 1
    return 0


def _validate(args: argparse.Namespace) -> int:
    from txstream.linearroad.reference import check_accident_end, check_lav, expected_answers
    from txstream.linearroad.validate import compare_expected, disagreements, validate

    check_lav(args.lav)
    check_accident_end(args.accident_end)
    if args.format not in FORMATS:
        raise UnknownNameError("format", args.format, list(FORMATS))
    _check_files(
        ("--input", args.input),
        ("--answers", args.answers),
        ("--tolls", args.tolls),
        ("--expected", args.expected),
    )
    _check_not_empty(args.input)
    for option, path in (("--answers", args.answers), ("--expected", args.expected)):
        if path is not None:
            _check_answers(option, path)
    with tempfile.TemporaryDirectory() as tmp:
        answers = args.answers
        if answers is None:
            answers = Path(tmp) / "answers.txt"
            lines = expected_answers(
                args.input, lav=args.lav, tolls_path=args.tolls, accident_end=args.accident_end
            )
            answers.write_text("".join(line + "\n" for line in lines))
        report = validate(
            args.input,
            answers,
            lav=args.lav,
            tolls_path=args.tolls,
            accident_end=args.accident_end,
        )
        agreement = compare_expected(answers, args.expected) if args.expected else None
    disagree = disagreements(agreement) if agreement is not None else 0
    if args.format == "json":
        out: dict[str, Any] = json.loads(report.to_json())
        if agreement is not None:
            out["agreement"] = agreement
            out["agreement_ok"] = disagree == 0
        print(json.dumps(json_safe(out), allow_nan=False))
    else:
        _print_table(report, agreement)
        if report.rejected_input:
            print(f"{len(report.rejected_input)} input tuple(s) rejected: exit status 1")
        if disagree:
            print(f"{disagree} answer(s) disagree with {args.expected}: exit status 1")
    return 0 if report.clean and not disagree else 1


def _check_answers(option: str, path: Path) -> None:
    """Refuse an answers file of another kind (no line is an answer) in one line.

    A history, a CSV or another command's JSON was validated line by line: a
    table of zeros and one "malformed answer" line per line of the file, exit 1.
    An empty ``--answers`` stays a run that answered nothing (all missing); an
    empty ``--expected`` has nothing to compare with and is refused.
    """
    from txstream.linearroad.validate import read_answers

    try:
        answers, malformed = read_answers(path)
    except (UnicodeDecodeError, OSError) as exc:
        raise TxStreamError(f"cannot read {path}: {exc}") from None
    if answers:
        return
    if malformed:
        line, reason = malformed[0]
        raise TxStreamError(
            f"{option} {path}: none of its {len(malformed)} line(s) is a Linear Road answer "
            f"(line {line}: {reason})"
        )
    if option == "--expected":
        raise TxStreamError(f"--expected {path} holds no answers to compare with")


def _print_table(report: Any, agreement: dict[str, Any] | None) -> None:
    print(
        f"{'type':<12}{'expected':>10}{'got':>10}{'correct':>10}{'wrong':>8}{'missing':>9}{'dup':>6}"
    )
    for name, c in report.by_type.items():
        print(
            f"{name:<12}{c.expected:>10}{c.got:>10}{c.correct:>10}"
            f"{c.wrong:>8}{c.missing:>9}{c.duplicates:>6}"
        )
    for line, reason in report.malformed[:20]:
        print(f"malformed answer, line {line}: {reason}")
    for line, reason, _raw in report.rejected_input[:20]:
        print(f"rejected input, line {line}: {reason}")
    if agreement is None:
        return
    print("agreement with the reference answers (per field, % of matched answers):")
    for name, a in agreement.items():
        if not isinstance(a, dict):
            continue
        fields = ", ".join(f"{f} {v['pct']:.2f}%" for f, v in a["fields"].items())
        print(
            f"  {name:<12} reference {a['reference']}, matched {a['matched']}, "
            f"missing {a['missing']}, extra {a['extra']}: {fields}"
        )
