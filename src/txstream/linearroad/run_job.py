"""The Linear Road run job behind ``txstream linear-road run`` and ``txstream bench linear-road``.

:func:`run_job` prepares the input (generating one if asked), recovers or
creates the engine's durable state in the output folder, replays the input
through Spark (:mod:`txstream.linearroad.spark_job`) or, with ``spark=False``, in
Python as fast as the engine takes it, then writes the answers, the rejected
lines, the summary and the latency plot, validating the answers on the way.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from txstream.errors import TxStreamError
from txstream.linearroad.engine import HistoricalTolls, LinearRoadEngine
from txstream.linearroad.formats import open_text
from txstream.linearroad.generate import generate
from txstream.linearroad.replay import duplicate_entries, numbered_lines, replay
from txstream.linearroad.report import (
    FellBehind,
    plot_latency,
    response_stats,
    summary,
    write_summary,
)
from txstream.linearroad.validate import validate
from txstream.storage.files import check_folder, check_writable, write_whole


def log(message: str) -> None:
    """Progress lines go to stderr, the results to stdout."""
    print(message, file=sys.stderr, flush=True)


@dataclass
class RunOptions:
    """What ``txstream linear-road run`` does (see its ``--help``)."""

    out: Path
    input: Path | None = None
    tolls: Path | None = None
    L: float = 1.0
    minutes: int = 3
    seed: int = 0
    speedup: float = 1.0
    variant: str = "serializable"
    txn_size: str = "event"
    lav: str = "spec"
    accident_end: str = "spec"
    inject_duplicates: int = 0
    sync: str = "off"
    validate: bool = True
    checkpoint_minutes: int = 5
    quiet: bool = False
    give_up_after_s: float | None = None
    """Stop early (a benchmark's failed point) once the run lags this many seconds."""
    record: Path | None = None
    """Write the committed history of operations here, for ``txstream check``."""
    spark: bool = True
    """Replay through Spark at ``speedup``; false: in Python, as fast as possible."""
    engine: str | None = None
    """``runtime`` (the default): partitions on Spark executors, the not-serializable
    variant as two jobs with no common order; ``driver``: the transaction manager in
    the driver, the paper's concurrent paths as threads (both variants)."""
    master: str | None = None
    """The Spark master (default ``local[2]``), e.g. ``local-cluster[2,1,1024]``."""
    partitions: int = 4
    """The runtime's partitions (fixed at the first start of an output folder)."""


_FIXED = (
    "input", "L", "minutes", "seed", "variant", "txn_size", "lav", "accident_end",
    "inject_duplicates", "engine",
)  # fmt: skip

ENGINES = ("runtime", "driver")
"""Options a resumed run must share with the run it resumes."""


def _check_resume(out: Path, o: RunOptions) -> None:
    mine = {k: str(getattr(o, k)) for k in _FIXED}
    mine["engine"] = engine_of(o)
    record = out / "run.json"
    if record.exists():
        before = _record(record)
        diff = [k for k in _FIXED if before.get(k) != mine[k]]
        if diff:
            raise TxStreamError(
                f"{out} holds a run with other options ({', '.join(diff)}); "
                "use another --out, or delete it to start over"
            )
    else:
        write_whole(record, json.dumps(mine, indent=2) + "\n")


def _record(path: Path) -> dict[str, Any]:
    """The JSON object a run left in ``path``; damaged, one line naming it (not a traceback)."""
    try:
        record = json.loads(path.read_text())
    except ValueError as exc:
        raise TxStreamError(f"{path} is damaged ({exc}); use another --out") from None
    if not isinstance(record, dict):
        raise TxStreamError(f"{path} is damaged (not a JSON object); use another --out")
    return record


def _replay(
    o: RunOptions,
    engine: LinearRoadEngine,
    input_path: Path,
    spark: Any,
    say: Callable[[str], None],
) -> int:
    """Feed the input to the started engine; return how many reports were sent twice."""
    if o.spark:
        from txstream.linearroad.spark_job import run
        from txstream.spark.session import local_session

        feeder = run(
            spark or local_session("txstream-linear-road", master=o.master), engine, input_path,
            o.out,
            speedup=o.speedup, duplicate_every=o.inject_duplicates, progress=say,
            give_up_after_s=o.give_up_after_s,
        )  # fmt: skip
        return feeder.duplicated
    with open_text(input_path) as f:
        lines = list(numbered_lines(f))
    sent = list(duplicate_entries(lines, o.inject_duplicates))
    say(f"replaying {len(lines)} lines in Python, as fast as the engine takes them")
    replay(engine, sent)
    return len(sent) - len(lines)


def _write_history(engine: LinearRoadEngine, path: Path) -> dict[str, Any]:
    """Write the committed history in the notation; say whether it is CS (and CSAO)."""
    from txstream.model import check, format_history

    history = engine.history()
    write_whole(path, format_history(history), "history file ")
    out: dict[str, Any] = {"history": str(path), "history_operations": len(history)}
    out["history_cs"] = check(history, "cs").holds
    out["history_csao"] = check(history, "csao").holds
    return out


def run_job(o: RunOptions, spark: Any = None) -> dict[str, Any]:
    """Run Linear Road as ``o`` says, write the outputs into ``o.out``, return the summary.

    ``spark``: a SparkSession to use (default: a local one); ignored when
    ``o.spark`` is false.
    """
    say: Callable[[str], None] = (lambda _m: None) if o.quiet else log
    out = o.out
    made = [p for p in (out, *out.parents) if not p.exists()]
    check_folder(out)
    if o.record is not None:
        # written at the end: an impossible path must fail now, not after the run
        # (checked once --out exists, which may hold it, and before run.json is made);
        # a refusal takes back the folders just made for --out, which were left empty
        try:
            check_writable(o.record, "history file ")
        except TxStreamError:
            for folder in made:  # deepest first; rmdir leaves a folder that is not empty
                with contextlib.suppress(OSError):
                    folder.rmdir()
            raise
    _check_resume(out, o)
    input_path: Path
    tolls: Path | None
    if o.input is None:
        input_path, tolls = out / "input.dat", out / "tolls.dat"
        if not input_path.exists():
            paths = generate(out, L=o.L, minutes=o.minutes, seed=o.seed)
            say(f"generated {paths.tuples} tuples ({paths.density:.1f} per expressway-second)")
    else:
        input_path, tolls = o.input, o.tolls
    if engine_of(o) == "runtime":
        return _run_runtime(o, input_path, tolls, spark, say)
    history = HistoricalTolls.from_file(tolls) if tolls is not None else None
    engine = LinearRoadEngine(
        variant=o.variant,
        txn_size=o.txn_size,
        lav=o.lav,
        accident_end=o.accident_end,
        state_dir=out / "state",
        answers_path=out / "answers.txt",
        historical_tolls=history,
        sync=o.sync,
        checkpoint_minutes=o.checkpoint_minutes,
        record=o.record is not None,
    )
    if engine.resumed_from:
        say(f"resuming: the recovered state covers input lines 1-{engine.resumed_from}")
    engine.start()
    started = time.time()
    try:
        duplicated = _replay(o, engine, input_path, spark, say)
        engine.finish()
    except FellBehind as exc:
        engine.abandon()
        say(f"gave up: {exc}")
        return {"variant": o.variant, "speedup": o.speedup, "fell_behind": True,
                "reason": str(exc), **response_stats(engine.latencies)}  # fmt: skip
    except BaseException:
        engine.abandon()
        raise
    say(f"replay done in {time.time() - started:.1f} s; validating")
    extra: dict[str, Any] = {}
    if o.record is not None:
        extra.update(_write_history(engine, o.record))
    rejected = engine.rejected_lines()
    write_whole(out / "rejected.txt", "".join(line + "\n" for line in rejected))
    report = (
        validate(
            input_path,
            out / "answers.txt",
            lav=o.lav,
            tolls_path=tolls,
            accident_end=o.accident_end,
        )
        if o.validate
        else None
    )
    data = summary(
        variant=o.variant,
        txn_size=o.txn_size,
        lav=o.lav,
        speedup=o.speedup if o.spark else None,  # (no pacing without Spark)
        tuples=engine.tuples,
        latencies=engine.latencies,
        engine_stats=engine.stats(),
        validation=report,
        extra={
            "input": str(input_path),
            "accident_end": o.accident_end,
            "resumed_from_line": engine.resumed_from,
            "duplicated_reports": duplicated,
            "spark": o.spark,
            "rejected_lines": len(rejected),
            "fell_behind": False,
            **extra,
        },
    )
    return _write_outputs(
        out, data, engine.latencies, f"Linear Road, {o.variant}, txn size {o.txn_size}, "
        + (f"speedup {o.speedup:g}" if o.spark else "pure-Python replay at full speed"),
    )  # fmt: skip


def _write_outputs(out: Path, data: dict[str, Any], latencies: Any, title: str) -> dict[str, Any]:
    """``summary.json`` and ``latency.png``; returns the summary."""
    write_summary(out / "summary.json", data)
    plot_latency(out / "latency.png", latencies, title)
    return data


def engine_of(o: RunOptions) -> str:
    """The engine ``o`` runs on (its default depends on the variant)."""
    return o.engine if o.engine is not None else "runtime"


def check_engine(o: RunOptions) -> None:
    """Refuse an engine name or a variant the engine cannot run, before anything starts."""
    engine = engine_of(o)
    if engine not in ENGINES:
        from txstream.errors import UnknownNameError

        raise UnknownNameError("engine", engine, list(ENGINES))
    if engine == "driver" and o.variant == "adhoc":
        raise TxStreamError(
            "the adhoc variant runs on the runtime engine only; use --engine runtime"
        )
    if engine == "runtime" and o.sync != "off":
        # It was accepted and did nothing: a user asking for fsyncs got no answer.
        raise TxStreamError(
            f"--sync {o.sync} sets the driver engine's write-ahead log; the runtime engine "
            "fsyncs every batch commit already: leave --sync off, or use --engine driver"
        )
    if engine == "runtime" and o.variant != "serializable" and o.record is not None:
        raise TxStreamError(
            "--record on the runtime's not-serializable variant would miss its reads of the "
            "TOLLS store between its two jobs; record it with --engine driver"
        )


def _run_runtime(
    o: RunOptions, input_path: Path, tolls: Path | None, spark: Any, say: Callable[[str], None]
) -> dict[str, Any]:
    """Linear Road on the partitioned executor runtime (``tx.Job``)."""
    from txstream.linearroad.runtime_job import AnswersFile, rejected_lines, run_local, run_spark
    from txstream.linearroad.txns import LinearRoadTxns, tolls_path

    check_engine(o)
    out = o.out
    txns = LinearRoadTxns(lav=o.lav, accident_end=o.accident_end, tolls_path=tolls_path(tolls))
    started_file = out / "started.json"
    if not started_file.exists():
        write_whole(started_file, json.dumps({"start_wall": time.time()}))
    try:
        start_wall = float(_record(started_file)["start_wall"])
    except (KeyError, TypeError, ValueError):
        raise TxStreamError(
            f"{started_file} is damaged (no start time); use another --out"
        ) from None
    store = out / "ckpt" / "txstream" if o.spark else out / "ckpt"  # run_local's is ckpt/
    resumed = (store / "commits").is_dir()
    if resumed:
        say("resuming from the checkpoint in " + str(out / "ckpt"))
    started = time.time()
    master = "in-process (no Spark)"
    batches: list[dict[str, Any]] = []
    if o.spark:
        from txstream.spark.session import local_session

        session = spark or local_session("txstream-linear-road", master=o.master)
        answers = AnswersFile(out / "answers.txt", start_wall)
        try:
            run = run_spark(
                session, input_path, out, txns, answers, txn_size=o.txn_size,
                speedup=o.speedup, duplicate_every=o.inject_duplicates,
                partitions=o.partitions, record=o.record is not None, progress=say,
                give_up_after_s=o.give_up_after_s, variant=o.variant,
            )  # fmt: skip
        except FellBehind as exc:
            say(f"gave up: {exc}")
            return {"variant": o.variant, "engine": o.engine, "speedup": o.speedup,
                    "fell_behind": True, "reason": str(exc),
                    **response_stats(answers.latencies)}  # fmt: skip
        tuples, duplicated, master = run.feeder.handed, run.feeder.duplicated, run.master
        batches = run.progress
        gate_waited = run.gate_waited_s
    else:
        say("replaying the input in Python through the runtime's local runner")
        _, answers = run_local(
            input_path, out, txns, o.txn_size, o.partitions,
            duplicate_every=o.inject_duplicates, record=o.record is not None, variant=o.variant,
        )  # fmt: skip
        # Counted as the Spark feeder counts them (the faulty source's repeats
        # included): this said 0 duplicated reports while run_local sent and
        # rolled back hundreds.
        tuples = duplicated = 0
        previous = -1
        with open_text(input_path) as f:
            for no, _ in duplicate_entries(numbered_lines(f), o.inject_duplicates):
                tuples += 1
                duplicated += no == previous  # a repeat follows its original, same number
                previous = no
        gate_waited = 0.0
    say(f"replay done in {time.time() - started:.1f} s; validating")
    from txstream.spark.runtime import read_output

    ckpt = out / "ckpt"
    extra: dict[str, Any] = {}
    if o.record is not None:
        extra.update(_write_runtime_history(ckpt, o.record))
    rejected = rejected_lines(ckpt)
    write_whole(out / "rejected.txt", "".join(line + "\n" for line in rejected))
    dropped = len(read_output(ckpt, "duplicates"))
    report = (
        validate(input_path, out / "answers.txt", lav=o.lav, tolls_path=tolls,
                 accident_end=o.accident_end)
        if o.validate else None
    )  # fmt: skip
    data = summary(
        variant=o.variant,
        txn_size=o.txn_size,
        lav=o.lav,
        speedup=o.speedup if o.spark else None,  # (no pacing without Spark)
        tuples=tuples,
        latencies=answers.latencies,
        engine_stats={"rolled_back": dropped, **_batch_stats(batches)},
        validation=report,
        extra={
            "input": str(input_path),
            "execution": "runtime",
            "paths": {"serializable": "one job", "adhoc": "two jobs: minute, notify, gated"}.get(
                o.variant, "two jobs: minute, notify"
            ),
            "master": master,
            "partitions": o.partitions,
            "accident_end": o.accident_end,
            "resumed": resumed,
            "duplicated_reports": duplicated,
            "spark": o.spark,
            "rejected_lines": len(rejected),
            "gate_waited_s": round(gate_waited, 3),
            "fell_behind": False,
            **extra,
        },
    )
    return _write_outputs(
        out, data, answers.latencies,
        f"Linear Road on the runtime ({master}), txn size {o.txn_size}, "
        + (f"speedup {o.speedup:g}" if o.spark else "in-process replay"),
    )  # fmt: skip


def _write_runtime_history(ckpt: Path, path: Path) -> dict[str, Any]:
    """Write the run's recorded history (all partitions, all batches); say if CS and CSAO."""
    from txstream.model import check, format_history
    from txstream.spark.runtime import read_history

    history = read_history(ckpt)
    write_whole(path, format_history(history), "history file ")
    return {
        "history": str(path),
        "history_operations": len(history),
        "history_cs": check(history, "cs").holds,
        "history_csao": check(history, "csao").holds,
    }


def _batch_stats(batches: list[dict[str, Any]]) -> dict[str, Any]:
    """Micro-batch counts and durations (median and slowest), from the runtime's progress."""
    if not batches:
        return {"batches": 0}
    spans = sorted(int(b["durationMs"]) for b in batches)
    phase1 = sorted(int(b["phase1Ms"]) for b in batches)
    rows = sorted(int(b["numInputRows"]) for b in batches)
    return {
        "batches": len(batches),
        "batch_ms_median": spans[len(spans) // 2],
        "batch_ms_max": spans[-1],
        "phase1_ms_median": phase1[len(phase1) // 2],
        "batch_rows_median": rows[len(rows) // 2],
        "batch_rows_max": rows[-1],
    }
