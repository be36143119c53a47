"""Spark's checkpoint logs reconciled with txstream's commit markers.

Spark records a batch's offsets before it runs and its commit after
``foreachBatch`` returned; txstream counts a batch only with its own marker.
:func:`reconcile_commit_log` makes the two agree before Spark starts, and
:func:`forward_spark_log` records the batch that ended the inputs (txstream's
alone) in Spark's logs.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from txstream.spark.runtime.state import RuntimeStore, StoreError, write_atomic

log = logging.getLogger("txstream.runtime")


def _log_ids(folder: Path) -> list[int]:
    """The batch ids of one of Spark's checkpoint logs (``offsets``, ``commits``), in order."""
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def spark_log_ends(spark_dir: Path) -> tuple[int, int]:
    """The last batch of Spark's commit log and of its offset log (-1: none)."""
    commits, offsets = _log_ids(spark_dir / "commits"), _log_ids(spark_dir / "offsets")
    return (commits[-1] if commits else -1), (offsets[-1] if offsets else -1)


def forward_spark_log(spark_dir: Path, batch: int) -> None:
    """Record in Spark's checkpoint that batch ``batch`` ran without input (the inputs' end).

    The batch that ends the inputs is txstream's alone (Spark's query has
    stopped): its offsets are those of batch ``batch - 1`` (no input read) and
    it is committed.  Copying both files of ``batch - 1`` (each after its
    ``.crc``, which Hadoop checks when it is there) makes Spark count it done
    and resume with ``batch + 1``; otherwise a restart would run new input as
    ``batch``, whose marker already exists.  The offsets go first: a crash
    between the two leaves a batch that Spark runs again without input, which
    txstream skips as committed.  Files already there are kept.
    """
    for log in ("offsets", "commits"):
        folder = spark_dir / log
        if (folder / str(batch)).exists():
            continue
        for name in (".{}.crc", "{}"):
            source = folder / name.format(batch - 1)
            if source.exists():
                write_atomic(folder / name.format(batch), source.read_bytes())


def reconcile_commit_log(store: RuntimeStore, spark_dir: Path) -> None:
    """Make Spark's checkpoint agree with txstream's commit markers before Spark starts.

    A batch that ended the inputs (:meth:`TxQuery._end_inputs`) and committed
    before Spark's checkpoint recorded it (a crash between the two) is recorded
    now (:func:`forward_spark_log`): Spark would otherwise run new input as that
    batch, which txstream would skip as committed.

    Spark runs again a batch it counts as done whose txstream marker is missing.

    Spark's checkpoint records a batch's offsets (``offsets/<n>``) before it
    runs and counts it done in ``commits/<n>`` after ``foreachBatch`` returned.
    A batch counts for txstream only with its own marker (``commits/<n>.json``
    of the store): a marker lost after Spark's commit would leave the batch's
    outputs and effects out for good.  Spark runs the last batch of its offset
    log again when its commit log ends one short, so the last batch's Spark
    commit is removed when its marker is missing (the re-run clears the files
    the batch left and writes them again).  Earlier batches cannot be run again:
    a one-line :class:`StoreError`.
    """
    commits, offsets = spark_dir / "commits", spark_dir / "offsets"
    if not commits.is_dir():
        return
    chain = store.chain()
    last = chain[-1][0] if chain else -1
    spark_done, spark_planned = spark_log_ends(spark_dir)
    if chain and chain[-1][1].get("frontier", {}).get("ended") and last > spark_done:
        if spark_done != last - 1 or spark_planned not in (last - 1, last):
            raise StoreError(
                f"{store.root / 'commits' / f'{last:012d}.json'} ended the inputs after "
                f"batch {last - 1}, but Spark's checkpoint {spark_dir} has offsets up to "
                f"batch {spark_planned} and commits up to batch {spark_done}; start on a new "
                "checkpoint or restore both from one backup"
            )
        forward_spark_log(spark_dir, last)
        log.info(
            "recovery: batch %d ended the inputs before a crash; recorded in Spark's checkpoint %s",
            last,
            spark_dir,
        )
    done = sorted(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    lost = [n for n in done if n > last]
    if not lost:
        return
    names = list(offsets.iterdir()) if offsets.is_dir() else []
    logged = [int(p.name) for p in names if p.name.isdigit()]
    if lost == [max(logged, default=-1)] and (not chain or lost[0] - 1 in done):
        for name in (str(lost[0]), f".{lost[0]}.crc"):
            with contextlib.suppress(FileNotFoundError):
                (commits / name).unlink()
        log.info(
            "recovery: Spark counted batch %d as done but its txstream commit marker is "
            "missing; Spark's commit of it is removed and the batch runs again",
            lost[0],
        )
        return
    markers = ", ".join(str(store.root / "commits" / f"{n:012d}.json") for n in lost)
    raise StoreError(
        f"Spark's commit log in {spark_dir} counts batches {lost} as done but their "
        f"txstream commit markers are missing ({markers}); only the last batch can be run "
        "again: restore the markers from a backup or start on a new checkpoint"
    )
