"""Streaming sources: file folders read by Spark, and a replay that fills one in real time.

* :func:`text_files` and :func:`csv_files` are Structured Streaming file sources
  (one row per line; CSV with a DDL schema).
* :class:`FileReplay` replays numbered input lines into a folder at a speedup
  (simulated seconds per wall second): one file per chunk of simulated time
  lands when its time comes, each line tagged ``line|handoff|raw`` with its
  input line number and the wall time it was handed to Spark, so that a job can
  measure response times from the handoff.  :func:`untag` splits the tags off
  again, in Spark.  A replay that is restarted with the same folder skips the
  chunk files it already wrote.

Importing this module does not import pyspark.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from txstream.errors import TxStreamError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

TAG = "|"
"""Separates a replayed line's number and handoff time from its raw text."""

WARM_UP_LINE = 0
"""The line number of :meth:`FileReplay.warm_up`'s marker line (real lines count from 1)."""


def text_files(
    spark: SparkSession, directory: str | Path, *, max_files_per_trigger: int | None = None
) -> DataFrame:
    """A stream of the lines of the files landing in ``directory`` (column ``value``)."""
    reader = spark.readStream.format("text")
    if max_files_per_trigger is not None:
        reader = reader.option("maxFilesPerTrigger", max_files_per_trigger)
    return reader.load(str(directory))


def csv_files(
    spark: SparkSession,
    directory: str | Path,
    schema: str,
    *,
    max_files_per_trigger: int | None = None,
) -> DataFrame:
    """A stream of the CSV rows (DDL ``schema``, no header) of the files in ``directory``."""
    reader = spark.readStream.schema(schema)
    if max_files_per_trigger is not None:
        reader = reader.option("maxFilesPerTrigger", max_files_per_trigger)
    return reader.csv(str(directory))


def untag(lines: DataFrame) -> DataFrame:
    """Tagged lines (column ``value``) to ``seq BIGINT, handoff DOUBLE, raw STRING``."""
    # Split once (its own projection) rather than once per column.
    return lines.selectExpr(r"split(value, '\\|', 3) AS _tag").selectExpr(
        "CAST(_tag[0] AS BIGINT) AS seq",
        "CAST(_tag[1] AS DOUBLE) AS handoff",
        "_tag[2] AS raw",
    )


def _kept_chunk_seconds(source_dir: Path, chunk_seconds: int) -> int:
    """The chunk length ``source_dir``'s files were cut by, recorded on first use.

    A restart skips the chunks whose files exist, by name (the chunk's index):
    cut by another length (a caller that derives it from the speedup, resumed at
    another speedup), the indices of the chunks still to write were those of
    chunks already written, and their lines never reached Spark.  The record is
    a hidden file, which Spark's file source does not read.
    """
    record = source_dir / ".chunk-seconds"
    if record.exists():
        text = record.read_text().strip()
        if not text.isdigit() or int(text) < 1:
            raise TxStreamError(
                f"{record}: damaged chunk-length record {text[:20]!r}; write the chunk "
                "length the folder's files were cut by into it, or replay into a new folder"
            )
        return int(text)
    tmp = source_dir / ".chunk-seconds.tmp"
    tmp.write_text(str(chunk_seconds))
    os.replace(tmp, record)
    return chunk_seconds


class FileReplay(threading.Thread):
    """Writes ``lines()`` into ``source_dir`` at ``speedup``, one file per ``chunk_seconds``.

    ``lines`` is called once, in the thread, and yields ``(line number, raw
    text)`` in input order (it opens its input itself; an error lands in
    :attr:`error`).  ``time_of(raw, previous)`` is a line's simulated second
    (``previous`` when the line has none).  :attr:`repeated` counts lines handed
    over right after a line with the same number (an input that sends some
    lines twice).
    """

    def __init__(
        self,
        lines: Callable[[], Iterable[tuple[int, str]]],
        source_dir: str | Path,
        speedup: float,
        time_of: Callable[[str, int], int],
        chunk_seconds: int = 1,
        name: str = "file-replay",
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.lines = lines
        self.source_dir = Path(source_dir)
        self.speedup = speedup
        self.time_of = time_of
        self.source_dir.mkdir(parents=True, exist_ok=True)
        self.chunk_seconds = _kept_chunk_seconds(self.source_dir, chunk_seconds)
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.handed = 0
        self.repeated = 0
        self.sim_time = 0
        self.first_handoff: float | None = None

    def _chunks(
        self, lines: Iterable[tuple[int, str]]
    ) -> Iterator[tuple[int, list[tuple[int, str]]]]:
        chunk: list[tuple[int, str]] = []
        index = 0
        second = 0
        for no, raw in lines:
            second = self.time_of(raw, second)
            at = second // self.chunk_seconds
            if at != index and chunk:
                yield index, chunk
                chunk = []
            index = at
            if chunk and chunk[-1][0] == no:
                self.repeated += 1
            chunk.append((no, raw))
        if chunk:
            yield index, chunk

    def run(self) -> None:
        """Replay the whole input (the thread's body); failures land in :attr:`error`."""
        lines: Iterable[tuple[int, str]] | None = None
        try:
            lines = self.lines()
            self._feed(lines)
        except BaseException as exc:  # reported by whoever watches the replay
            self.error = exc
        finally:
            close = getattr(lines, "close", None)
            if close is not None:  # a generator's ``with open(...)`` ends here
                close()

    def _feed(self, lines: Iterable[tuple[int, str]]) -> None:
        start: float | None = None
        for index, chunk in self._chunks(lines):
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

    def warm_up(
        self, input_rows: Callable[[], int], failed: Callable[[], bool], timeout: float = 120.0
    ) -> None:
        """Hand over one marker line (line number 0) and wait until Spark has read it.

        Spark's first job in a session takes seconds (code generation, class
        loading); a job that skips line 0 and runs this before :meth:`start`
        keeps that out of the first lines' response times.  ``input_rows()``
        says how many rows the query has read, ``failed()`` whether it failed.
        A restart writes a marker of its own (``chunk-warmup-rN.txt``) and waits
        too: a restarted query recovers its checkpoint and re-runs its
        uncommitted batch before it reads anything new, and a replay that went
        on meanwhile piled the rest of the input into one late batch (a
        resumed Linear Road run at speedup 20 answered everything 50 s late).
        """
        earlier = sorted(self.source_dir.glob("chunk-warmup*.txt"))
        name = f"chunk-warmup-r{len(earlier)}.txt" if earlier else "chunk-warmup.txt"
        tmp = self.source_dir / f".{name}.tmp"
        tmp.write_text(f"{WARM_UP_LINE}{TAG}0{TAG}warm-up\n")
        os.replace(tmp, self.source_dir / name)
        deadline = time.time() + timeout
        while not input_rows():
            if failed() or time.time() > deadline:
                return
            time.sleep(0.1)
