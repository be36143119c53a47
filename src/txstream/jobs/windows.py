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


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's metrics from its committed executions (result rows)."""

    def mean(xs: list[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    long = [r for r in results if r["kind"] == "long"]
    snap = [r for r in results if r["kind"] == "snapshot"]
    return {
        "commits": len(results),
        "long_commits": len(long),
        "snapshots": len(snap),
        "restarts": sum(r["attempts"] - 1 for r in results),
        "lr_freshness": mean([r["freshness"] for r in long]),
        "snap_response": mean([r["committed"] - r["arrival"] for r in snap]),
        "snap_freshness": mean([r["freshness"] for r in snap]),
    }


def run_spark(
    spec: KeyedWindows,
    events: list[tuple[str, dict[str, Any]]],
    out: str | Path,
    *,
    files: int = 10,
    partitions: int = 2,
    master: str | None = None,
) -> dict[str, Any]:
    """Run :func:`window_job` on Spark over ``events``, written under ``out``; a summary.

    ``out`` receives the input files (``in/``), the checkpoint (``checkpoint/``)
    and each key's window history (``histories/key-<k>.txt``, with
    ``spec.record``).  The summary has the metrics (:func:`summarize`), the
    events per second of the run, and the CPU seconds of the driver (this
    Python process), Spark's JVM and the Python workers over the run (from
    ``/proc``: :class:`txstream.jobs.loading.ProcessCPU`), per event in µs;
    with ``spec.record``, whether every key's history meets the scheduler's
    criterion (``ws`` or ``lws``).
    """
    import time

    from txstream.jobs.loading import ProcessCPU
    from txstream.spark import local_session

    root = Path(out)
    write_input(events, root / "in", files)
    spark = local_session("txstream-windows", master=master)
    try:
        cpu = ProcessCPU(spark)
        before, wall = cpu.sample(), time.perf_counter()
        query = start(spark, spec, root / "in", root / "checkpoint", partitions=partitions)
        try:
            query.awaitTermination()
        finally:
            query.stop()
        after, wall = cpu.sample(), time.perf_counter() - wall
    finally:
        spark.stop()
    results = read_output(root / "checkpoint", RESULTS)
    summary: dict[str, Any] = {
        "events": len(events),
        "keys": len({row["key"] for _, row in events}),
        "batches": len(query.recentProgress),
        "seconds": round(wall, 3),
        "events_per_s": round(len(events) / wall, 1),
        **summarize(results),
    }
    used = {k: after[k] - before[k] for k in ("driver", "jvm", "workers")}
    summary["cpu_us_per_event"] = {k: round(v / len(events) * 1e6, 2) for k, v in used.items()}
    summary["driver_over_workers"] = round(used["driver"] / max(used["workers"], 1e-9), 4)
    summary["driver_over_executors"] = round(
        used["driver"] / max(used["workers"] + used["jvm"], 1e-9), 4
    )
    if spec.record:
        from txstream.model import check, parse_one
        from txstream.model.check import CheckOptions
        from txstream.windows.schedulers import get_scheduler

        folder = root / "histories"
        folder.mkdir(exist_ok=True)
        criterion = get_scheduler(spec.scheduler).guarantees
        holds = True
        for key, text in window_histories(root / "checkpoint", spec.n).items():
            (folder / f"key-{key}.txt").write_text(text)
            verdict = check(parse_one(text), criterion, CheckOptions(subwindows=spec.n))
            holds = holds and verdict.holds
        summary["histories"] = {"criterion": criterion, "hold": holds}
    return summary
