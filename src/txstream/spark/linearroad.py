"""Linear Road on Spark Structured Streaming, the transactions in txstream.

:class:`Feeder` replays an input file at a speedup (simulated seconds per wall
second): one file per chunk of simulated time lands in a source folder when its
time comes, each line tagged ``line|handoff|raw`` with its input line number
and the wall time it was handed to Spark.  A Structured Streaming file source
reads the folder; Spark parses and validates every line in parallel
(:func:`parse`); each micro-batch's tuples, in line order, go through
``foreachBatch`` to :class:`~txstream.linearroad.engine.LinearRoadEngine`,
whose transactions keep the stores and write the answers.

Restarting with the same folders resumes: the feeder skips chunk files it
already wrote, Spark re-runs the micro-batch it had not committed, and the
engine skips the lines its recovered state already covers (replaying the rest
is idempotent, see the engine).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from txstream.errors import TxStreamError
from txstream.linearroad.engine import Arrival, LinearRoadEngine
from txstream.linearroad.formats import FEET_PER_SEGMENT, INPUT_FIELDS, MAX_TIME, open_text
from txstream.linearroad.replay import duplicate_entries, numbered_lines
from txstream.linearroad.report import FellBehind

TAG = "|"
"""Separates the feeder's line number and handoff time from the raw input line."""


def _second(line: str, default: int) -> int:
    parts = line.split(",", 2)
    try:
        return max(default, int(parts[1]))
    except (IndexError, ValueError):
        return default


class Feeder(threading.Thread):
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
        super().__init__(name="lr-feeder", daemon=True)
        self.input_path = Path(input_path)
        self.source_dir = Path(source_dir)
        self.speedup = speedup
        self.chunk_seconds = chunk_seconds
        self.duplicate_every = duplicate_every
        self.source_dir.mkdir(parents=True, exist_ok=True)
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.handed = 0
        self.duplicated = 0
        self.sim_time = 0
        self.first_handoff: float | None = None

    def _chunks(self, f: TextIO) -> Iterator[tuple[int, list[tuple[int, str]]]]:
        chunk: list[tuple[int, str]] = []
        index = 0
        second = 0
        for no, raw in duplicate_entries(numbered_lines(f), self.duplicate_every):
            second = _second(raw, second)
            at = second // self.chunk_seconds
            if at != index and chunk:
                yield index, chunk
                chunk = []
            index = at
            if chunk and chunk[-1][0] == no:
                self.duplicated += 1
            chunk.append((no, raw))
        if chunk:
            yield index, chunk

    def run(self) -> None:
        """Feed the whole input (the thread's body); failures land in :attr:`error`."""
        try:
            with open_text(self.input_path) as f:
                self._feed(f)
        except BaseException as exc:  # reported by the runner
            self.error = exc

    def _feed(self, f: TextIO) -> None:
        start: float | None = None
        for index, chunk in self._chunks(f):
            if self.stopping.is_set():
                return
            sim = index * self.chunk_seconds
            path = self.source_dir / f"chunk-{index:07d}.txt"
            if path.exists():  # written before a restart
                self.sim_time = sim
                continue
            if start is None:
                start = time.time() - sim / self.speedup
            delay = start + sim / self.speedup - time.time()
            if delay > 0 and self.stopping.wait(delay):
                return
            now = time.time()
            if self.first_handoff is None:
                self.first_handoff = now
            text = "".join(f"{no}{TAG}{now:.6f}{TAG}{raw}\n" for no, raw in chunk)
            tmp = self.source_dir / f".{path.name}.tmp"
            tmp.write_text(text, encoding="utf-8", errors="replace")
            os.replace(tmp, path)
            self.handed += len(chunk)
            self.sim_time = sim


def _reason(fields: list[Column], ints: list[Column], n: Column) -> Column:
    """Why a line is malformed, or null; the same rules and messages as ``parse_input_line``."""
    TYPE, TIME, VID, SPD, XWAY, LANE, DIR, SEG, POS, QID = ints[:10]
    DAY = ints[14]
    bad = F.coalesce(*[F.when(i.isNull(), f) for f, i in zip(fields, ints, strict=True)])
    fmt = F.format_string
    report = TYPE == 0
    rules = [
        (n != 15, fmt("input tuple: expected 15 fields, got %d", n)),
        (bad.isNotNull(), fmt("input tuple: field '%s' is not an integer", bad)),
        (~TYPE.isin(0, 2, 3), fmt("unknown tuple type %d (expected 0, 2 or 3)", TYPE)),
        (TIME < 0, fmt("negative time %d", TIME)),
        (TIME > MAX_TIME, fmt(f"time %d beyond the 3-hour simulation (max {MAX_TIME})", TIME)),
        (VID < 0, fmt("negative vehicle id %d", VID)),
        (report & ((SPD < 0) | (SPD > 200)), fmt("speed %d out of range 0-200", SPD)),
        (report & (XWAY < 0), fmt("negative expressway %d", XWAY)),
        (report & ((LANE < 0) | (LANE > 4)), fmt("lane %d out of range 0-4", LANE)),
        (report & ~DIR.isin(0, 1), fmt("direction %d is not 0 or 1", DIR)),
        (report & ((SEG < 0) | (SEG > 99)), fmt("segment %d out of range 0-99", SEG)),
        (
            report & (F.floor(POS / FEET_PER_SEGMENT) != SEG),
            fmt("position %d is not in segment %d", POS, SEG),
        ),
        (~report & (QID < 0), fmt("negative query id %d", QID)),
        ((TYPE == 3) & ((DAY < 1) | (DAY > 69)), fmt("day %d out of range 1-69", DAY)),
    ]
    reason = F.when(*rules[0])
    for condition, message in rules[1:]:
        reason = reason.when(condition, message)
    return reason


def parse(lines: DataFrame) -> DataFrame:
    """Tagged lines (column ``value``) to ``seq, handoff, f0..f14, reason, raw``.

    Valid tuples have ``reason`` null; a malformed one keeps its raw text and says why.
    """
    tag = F.split(F.col("value"), "\\|", 3)
    raw = tag.getItem(2)
    df = lines.select(
        tag.getItem(0).cast("long").alias("seq"),
        tag.getItem(1).cast("double").alias("handoff"),
        raw.alias("raw"),
        F.regexp_replace(raw, r"^\s+|\s+$", "").alias("_body"),
    )
    parts = F.split(F.col("_body"), ",")
    fields = [F.trim(F.try_element_at(parts, F.lit(i + 1))) for i in range(len(INPUT_FIELDS))]
    ints = [f.try_cast("long") for f in fields]
    return df.select(
        "seq",
        "handoff",
        *[i.alias(f"f{k}") for k, i in enumerate(ints)],
        _reason(fields, ints, F.size(parts)).alias("reason"),
        "raw",
    )


def _batch_rows(df: DataFrame) -> tuple[list[Arrival], list[tuple[int, str, str]]]:
    table = df.toArrow()
    cols = {name: table.column(name).to_pylist() for name in table.column_names}
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
    spark: SparkSession,
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
    stream = spark.readStream.format("text").load(str(work / "source"))
    parsed = parse(stream)

    def batch(df: DataFrame, batch_id: int) -> None:
        arrivals, rejects = _batch_rows(df.where("seq > 0"))
        engine.process(arrivals, rejects)

    query = (
        parsed.writeStream.foreachBatch(batch)
        .option("checkpointLocation", str(work / "spark-checkpoint"))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    _warm_up(query, work / "source")
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


def _warm_up(query: Any, source: Path, timeout: float = 120.0) -> None:
    """Run one micro-batch of a marker line (line number 0, ignored) before the replay.

    Spark's first job in a session takes seconds (code generation, class
    loading); without this the first tuples' response times would measure that.
    """
    marker = source / "chunk-warmup.txt"
    if not marker.exists():
        tmp = source / ".chunk-warmup.tmp"
        tmp.write_text(f"0{TAG}0{TAG}warm-up\n")
        os.replace(tmp, marker)
        deadline = time.time() + timeout
        while not any(p.get("numInputRows", 0) for p in query.recentProgress):
            if query.exception() is not None or time.time() > deadline:
                return
            time.sleep(0.1)


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


def _raise_if_failed(query: Any, feeder: Feeder) -> None:
    if feeder.error is not None:
        raise TxStreamError(f"input replay failed: {feeder.error}")
    exc = query.exception()
    if exc is not None:
        message = str(getattr(exc, "desc", exc)).strip().splitlines()
        raise TxStreamError(f"the Spark query failed: {message[0] if message else exc}")
