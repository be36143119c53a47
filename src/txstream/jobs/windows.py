"""Sliding windows on Spark: per group key on the executors, or one window fed on the driver.

:func:`window_job` is the executors' version: one window per group key, each
key's window the state of a runtime partition (``tx.Job``), every tuple and
snapshot query a transaction there.  :func:`feed_window` (below) is the older
driver-side feed of one window.


Each micro-batch's rows fill the sub-window buffers of a
:class:`txstream.windows.feed.WindowFeed` through the runtime's exactly-once
``foreachBatch`` driver (:func:`txstream.spark.batches.foreach_batch`, rows over
Arrow); the feed also skips a replayed batch id, so an at-least-once replay
after a crash does not slide the window twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from txstream.spark.batches import MicroBatch, StreamHandle, foreach_batch
from txstream.spark.runtime import Job, read_output
from txstream.windows.base import WindowError
from txstream.windows.feed import WindowFeed
from txstream.windows.keyed import RESULT_SCHEMA, KeyedWindows, history_text, snapshot_query
from txstream.windows.rows import (
    HISTORY,
    HISTORY_SCHEMA,
    RESULTS,
    TABLES,
    on_packet,
    on_snapshot,
)

PACKET_SCHEMA = "ts DOUBLE, src INT, dst INT, size INT"
"""The schema of the packet files (CSV ``ts,src,dst,size``)."""


def feed_window(
    stream: Any,
    feed: WindowFeed,
    checkpoint: str,
    *,
    available_now: bool = True,
) -> StreamHandle:
    """Start a query that hands every micro-batch of ``stream`` to ``feed``.

    ``stream`` must have the window's fields in order (e.g. ``ts, src, dst,
    size``; :func:`txstream.spark.sources.csv_files` with :data:`PACKET_SCHEMA`
    reads packet files).  With ``available_now`` the query processes what is
    there and stops (deterministic; what the tests use).
    """
    fields = list(feed.window.fields)

    def batch(b: MicroBatch) -> None:
        feed.add_batch(b.id, b.rows(fields))

    return foreach_batch(stream, batch, checkpoint, available_now=available_now)


PACKETS_SCHEMA = "key long, ts double, src int, dst int, size int"
"""The keyed packet stream: the group key, then the window's fields."""

SNAPSHOTS_SCHEMA = (
    "key long, ts double, id long, aggregate string, length int, attr string, subset string"
)
"""Snapshot queries on one key's window (``subset``: addresses separated by spaces)."""


@dataclass(frozen=True)
class _OnPacket:
    """The packets input's transaction function (a class: it pickles by reference)."""

    spec: KeyedWindows

    def __call__(self, t: Any, e: dict[str, Any]) -> None:
        on_packet(self.spec, t, e["key"], tuple(e[f] for f in self.spec.fields))


@dataclass(frozen=True)
class _OnSnapshot:
    """The snapshots input's transaction function."""

    spec: KeyedWindows

    def __call__(self, t: Any, e: dict[str, Any]) -> None:
        on_snapshot(self.spec, t, e["key"], e["ts"], snapshot_query(e), e.get("id"))


def window_job(
    spec: KeyedWindows,
    packets: Any = None,
    snapshots: Any = None,
    *,
    name: str = "windows",
    record: bool = False,
) -> Job:
    """Sliding windows per group key on the executors: a ``tx.Job``.

    ``packets`` is a streaming DataFrame with a ``key`` column and the
    window's fields (:data:`PACKETS_SCHEMA` for packets), ``snapshots`` one of
    snapshot queries (:data:`SNAPSHOTS_SCHEMA`); both are ordered by ``ts``
    and placed by ``key``, so each key's window is the state of one runtime
    partition and each event is a transaction there
    (:mod:`txstream.windows.rows`).  Leave both None for ``job.run_local``.
    Outputs: ``results`` (committed query executions, :data:`RESULT_SCHEMA`)
    and ``window_history`` (with ``spec.record``: each key's window history,
    :func:`window_histories`).  ``record`` also records the runtime's history.
    """
    spec.validate()
    job = Job(name)
    for table, key in TABLES.items():
        job.table(table, key=key if len(key) > 1 else key[0], partition_by="key")
    job.input("packets", packets, keys="key", order="ts")
    job.input("snapshots", snapshots, keys="key", order="ts")
    job.output(RESULTS, schema=RESULT_SCHEMA)
    job.output(HISTORY, schema=HISTORY_SCHEMA)
    job.on("packets", _OnPacket(spec))
    job.on("snapshots", _OnSnapshot(spec))
    job.option("recordHistory", record)
    return job


def window_histories(checkpoint: str | Path, n: int) -> dict[str, str]:
    """Each key's window history from a run's ``window_history`` output (the notation)."""
    entries: dict[str, list[tuple[int, str | None, int, int]]] = {}
    for row in read_output(checkpoint, HISTORY):
        entries.setdefault(row["key"], []).append(
            (row["seq"], row["op"], row["before"], row["drop"])
        )
    return {k: history_text(e, n, f"window of key {k}") for k, e in sorted(entries.items())}


INPUTS = {"packets": PACKETS_SCHEMA, "snapshots": SNAPSHOTS_SCHEMA}


def write_input(events: list[tuple[str, dict[str, Any]]], folder: str | Path, files: int) -> None:
    """Write ``events`` as JSON-lines files under ``folder/packets`` and ``folder/snapshots``.

    File ``f`` of each input holds the ``f``-th of ``files`` equal periods of
    ``ts`` (zero-padded names, increasing modification times: the file source
    takes them in that order, one per micro-batch with ``maxFilesPerTrigger``).
    """
    import json
    import os

    root = Path(folder)
    if not events:
        raise WindowError("no events to write")
    end = max(row["ts"] for _, row in events)
    span = (end + 1e-9) / files
    parts: dict[str, list[list[str]]] = {name: [[] for _ in range(files)] for name in INPUTS}
    for name, row in events:
        parts[name][min(files - 1, int(row["ts"] / span))].append(json.dumps(row))
    for name, chunks in parts.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for f, lines in enumerate(chunks):
            path = root / name / f"part-{f:05d}.json"
            path.write_text("".join(line + "\n" for line in lines))
            os.utime(path, (1_000_000 + f, 1_000_000 + f))


def start(
    spark: Any,
    spec: KeyedWindows,
    data: str | Path,
    checkpoint: str | Path,
    *,
    once: bool = True,
    partitions: int = 2,
    record: bool = False,
) -> Any:
    """Start :func:`window_job` on the files :func:`write_input` wrote under ``data``.

    One file of each input per micro-batch; ``once``: ``availableNow`` (process
    what is there, end the inputs and stop), else every 200 ms until stopped.
    Returns the query handle (``tx.TxQuery``).
    """
    root = Path(data)
    streams = [
        spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(root / name))
        for name, schema in INPUTS.items()
    ]
    job = window_job(spec, *streams, record=record)
    trigger = {"availableNow": True} if once else {"processingTime": "200 milliseconds"}
    return job.trigger(**trigger).start(
        checkpoint=str(checkpoint), spark=spark, partitions=partitions
    )
