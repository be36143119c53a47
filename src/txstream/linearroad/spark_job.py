"""Linear Road on Spark Structured Streaming, the transactions in txstream.

:class:`Feeder` (the runtime's :class:`~txstream.spark.sources.FileReplay`)
replays an input file at a speedup (simulated seconds per wall second): one
file per chunk of simulated time lands in a source folder when its time comes,
each line tagged ``line|handoff|raw`` with its input line number and the wall
time it was handed to Spark.  A Structured Streaming file source reads the
folder; Spark parses and validates every line in parallel (:func:`parse`, Spark
SQL expressions); each micro-batch's tuples, in line order, go through the
runtime's ``foreachBatch`` driver to
:class:`~txstream.linearroad.engine.LinearRoadEngine`, whose transactions keep
the stores and write the answers.

Restarting with the same folders resumes: the feeder skips chunk files it
already wrote, Spark re-runs the micro-batch it had not committed, and the
engine skips the lines its recovered state already covers (replaying the rest
is idempotent, see the engine).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from txstream.errors import TxStreamError
from txstream.linearroad.engine import Arrival, LinearRoadEngine
from txstream.linearroad.formats import FEET_PER_SEGMENT, INPUT_FIELDS, MAX_TIME, open_text
from txstream.linearroad.replay import duplicate_entries, numbered_lines
from txstream.linearroad.report import FellBehind
from txstream.spark.batches import Columns, MicroBatch, StreamHandle, foreach_batch
from txstream.spark.sources import TAG, FileReplay, text_files, untag
from txstream.spark.sql import case_when, literal, select

__all__ = ["TAG", "Feeder", "parse", "parse_rows", "run"]


def _second(line: str, default: int) -> int:
    parts = line.split(",", 2)
    try:
        return max(default, int(parts[1]))
    except (IndexError, ValueError):
        return default


class Feeder(FileReplay):
    """Hands the input to Spark at ``speedup``: one file per ``chunk_seconds`` of input time.

    ``duplicate_every``: every that many simulated seconds, the first report that
    enters a new segment is sent twice (a faulty source, Table 2 of the paper).
    """

    def __init__(
        self,
        input_path: str | Path,
        source_dir: str | Path,
        speedup: float,
        chunk_seconds: int = 1,
        duplicate_every: int = 0,
    ) -> None:
        self.input_path = Path(input_path)
        self.duplicate_every = duplicate_every
        super().__init__(self._lines, source_dir, speedup, _second, chunk_seconds, name="lr-feeder")

    def _lines(self) -> Iterator[tuple[int, str]]:
        with open_text(self.input_path) as f:
            yield from duplicate_entries(numbered_lines(f), self.duplicate_every)

    @property
    def duplicated(self) -> int:
        """Reports sent twice so far."""
        return self.repeated


def _reason(n: str) -> str:
    """Why a line is malformed, or null; the same rules and messages as ``parse_input_line``.

    Over the columns ``_s0.._s14`` (the trimmed fields), ``f0..f14`` (them as
    integers, null when not one) and ``n`` (the number of fields).
    """
    TYPE, TIME, VID, SPD, XWAY, LANE, DIR, SEG, POS, QID = (f"f{k}" for k in range(10))
    DAY = "f14"
    count = len(INPUT_FIELDS)
    bad = (
        "coalesce("
        + ", ".join(f"CASE WHEN f{k} IS NULL THEN _s{k} END" for k in range(count))
        + ")"
    )

    def fmt(message: str, *args: str) -> str:
        return f"format_string({literal(message)}, {', '.join(args)})"

    report = f"({TYPE} = 0)"
    rules = [
        (f"{n} != {count}", fmt(f"input tuple: expected {count} fields, got %d", n)),
        (f"{bad} IS NOT NULL", fmt("input tuple: field '%s' is not an integer", bad)),
        (
            f"NOT ({TYPE} IN (0, 2, 3, 4))",
            fmt("unknown tuple type %d (expected 0, 2, 3 or 4)", TYPE),
        ),
        (f"{TIME} < 0", fmt("negative time %d", TIME)),
        (
            f"{TIME} > {MAX_TIME}",
            fmt(f"time %d beyond the 3-hour simulation (max {MAX_TIME})", TIME),
        ),
        (f"{VID} < 0", fmt("negative vehicle id %d", VID)),
        (f"{report} AND ({SPD} < 0 OR {SPD} > 200)", fmt("speed %d out of range 0-200", SPD)),
        (f"{report} AND {XWAY} < 0", fmt("negative expressway %d", XWAY)),
        (f"{report} AND ({LANE} < 0 OR {LANE} > 4)", fmt("lane %d out of range 0-4", LANE)),
        (f"{report} AND NOT ({DIR} IN (0, 1))", fmt("direction %d is not 0 or 1", DIR)),
        (f"{report} AND ({SEG} < 0 OR {SEG} > 99)", fmt("segment %d out of range 0-99", SEG)),
        (
            f"{report} AND floor({POS} / {FEET_PER_SEGMENT}) != {SEG}",
            fmt("position %d is not in segment %d", POS, SEG),
        ),
        (f"NOT {report} AND {QID} < 0", fmt("negative query id %d", QID)),
        (f"{TYPE} = 3 AND ({DAY} < 1 OR {DAY} > 69)", fmt("day %d out of range 1-69", DAY)),
    ]
    return case_when(*rules)


def parse(lines: Any) -> Any:
    """Tagged lines (column ``value``) to ``seq, handoff, f0..f14, reason, raw``.

    Valid tuples have ``reason`` null; a malformed one keeps its raw text and says why.
    """
    return parse_rows(untag(lines))


def parse_rows(rows: Any) -> Any:
    """As :func:`parse`, from untagged rows (columns ``seq``, ``handoff``, ``raw``)."""
    count = len(INPUT_FIELDS)
    # The split is its own projection, referenced by every field: Spark keeps it
    # apart (it does not inline an expensive expression used more than once), so
    # a line is split once, not once per field (the largest JVM cost of a run).
    parts = select(
        rows, "seq", "handoff", "raw",
        r"split(regexp_replace(raw, '^\\s+|\\s+$', ''), ',') AS _parts",
    )  # fmt: skip
    fields = select(
        parts,
        "seq",
        "handoff",
        "raw",
        "size(_parts) AS _n",
        *[f"trim(try_element_at(_parts, {k + 1})) AS _s{k}" for k in range(count)],
    )
    ints = select(
        fields,
        "*",
        *[f"try_cast(_s{k} AS BIGINT) AS f{k}" for k in range(count)],
    )
    return select(
        ints,
        "seq",
        "handoff",
        *[f"f{k}" for k in range(count)],
        f"{_reason('_n')} AS reason",
        "raw",
    )


def _batch_rows(cols: Columns) -> tuple[list[Arrival], list[tuple[int, str, str]]]:
    arrivals: list[Arrival] = []
    rejects: list[tuple[int, str, str]] = []
    fs = [cols[f"f{k}"] for k in range(15)]
    for i, (seq, handoff, reason) in enumerate(
        zip(cols["seq"], cols["handoff"], cols["reason"], strict=True)
    ):
        if reason is None:
            arrivals.append((seq, handoff, tuple(f[i] for f in fs)))
        else:
            rejects.append((seq, reason, cols["raw"][i]))
    arrivals.sort(key=lambda a: a[0])
    rejects.sort()
    return arrivals, rejects


def run(
    spark: Any,
    engine: LinearRoadEngine,
    input_path: str | Path,
    work_dir: str | Path,
    *,
    speedup: float,
    duplicate_every: int = 0,
    progress: Callable[[str], None] | None = None,
    give_up_after_s: float | None = None,
) -> Feeder:
    """Replay ``input_path`` through Spark into ``engine`` (started); return the feeder.

    ``work_dir`` holds the source folder and Spark's checkpoint.  The engine is
    not finished here: the caller calls ``engine.finish()``.
    """
    work = Path(work_dir)
    chunk_seconds = max(1, int(speedup // 10))  # at most ~10 files per wall second
    feeder = Feeder(input_path, work / "source", speedup, chunk_seconds, duplicate_every)
    parsed = parse(text_files(spark, work / "source"))

    def batch(b: MicroBatch) -> None:
        # Line 0 is the feeder's warm-up marker.
        arrivals, rejects = _batch_rows(b.where("seq > 0").columns())
        engine.process(arrivals, rejects)

    query = foreach_batch(
        parsed,
        batch,
        work / "spark-checkpoint",
        available_now=False,
        processing_time="100 milliseconds",
    )
    feeder.warm_up(query.input_rows, lambda: query.exception() is not None)
    feeder.start()
    last = time.time()
    try:
        while feeder.is_alive():
            feeder.join(timeout=1.0)
            _raise_if_failed(query, feeder)
            if give_up_after_s is not None:
                lag = _lag(engine, feeder)
                if lag > give_up_after_s:
                    raise FellBehind(f"the answers lag the input by {lag:.0f} s")
            if progress is not None and time.time() - last >= 5:
                last = time.time()
                progress(_progress(engine, feeder))
        _raise_if_failed(query, feeder)
        query.processAllAvailable()
    finally:
        feeder.stopping.set()
        with contextlib.suppress(Exception):
            query.stop()
    _raise_if_failed(query, feeder)
    return feeder


def _lag(engine: LinearRoadEngine, feeder: Feeder) -> float:
    """How far behind the engine is: wall seconds since the oldest handed, unanswered input."""
    recent = engine.latencies[-200:]
    worst = max((x.committed - x.handoff for x in recent), default=0.0)
    behind = (feeder.sim_time - engine.input_time) / feeder.speedup
    return max(worst, behind)


def _progress(engine: LinearRoadEngine, feeder: Feeder) -> str:
    lat = engine.latencies
    worst = max((x.committed - x.handoff for x in lat[-2000:]), default=0.0)
    return (
        f"input time {feeder.sim_time} s, {feeder.handed} tuples handed to Spark, "
        f"{engine.tuples} processed, {len(lat)} answers committed, "
        f"recent max response {worst:.2f} s"
    )


def _raise_if_failed(query: StreamHandle, feeder: Feeder) -> None:
    if feeder.error is not None:
        raise TxStreamError(f"input replay failed: {feeder.error}")
    failure = query.failure()
    if failure is not None:
        raise TxStreamError(f"the Spark query failed: {failure}")
