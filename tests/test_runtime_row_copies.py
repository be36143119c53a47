"""A row a transaction reads, writes or emits shares nothing mutable with the store.

Found by a new user's job (session 20): a table without a schema may hold
lists and dicts; ``t.read`` returned a shallow copy, so appending to a read
row's list changed the stored row itself, outside the undo log: a rolled-back
transaction's append stayed, a read-only transaction's change was seen by the
next batch of the same run but not after a restart (the delta never had it),
and an ``emit`` followed by a change of the emitted row's list wrote the
changed list.  Serial execution over plain values gives none of that.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import pytest

import txstream as tx
from txstream.spark.runtime.boundaries import MID_BITS
from txstream.spark.runtime.driver import DriverEngine
from txstream.spark.runtime.local import event_copies


def _append(t: Any, e: dict[str, Any]) -> None:
    """Keep a list per key; a negative value is refused after the append."""
    row = t.read("lists", e["k"])
    if row is None:
        item = [e["v"]]
        t.insert("lists", {"k": e["k"], "items": item, "meta": {"n": 1}})
        item.append("after insert")  # the caller's list: not the stored row's
        return
    row["items"].append(e["v"])
    row["meta"]["n"] += 1
    t.emit("seen", row)
    row["items"].append("after emit")  # not in the emitted row
    for found in t.scan("lists", e["k"]):
        found["items"].append("scanned")  # a scanned copy: not the stored row
    if e["v"] < 0:
        raise ValueError("negative")  # rolled back: the append must not stay
    if e["v"] % 2:  # odd: written back; even: a read-only transaction
        changed = t.update("lists", e["k"], items=row["items"][:-1], meta=row["meta"])
        changed["items"].append("returned by update")


EVENTS = [
    [("ev", {"k": 1, "v": 1})],
    [("ev", {"k": 1, "v": 3}), ("ev", {"k": 1, "v": -5})],
    [("ev", {"k": 1, "v": 4})],  # read-only: its append is dropped
    [("ev", {"k": 1, "v": 7})],
]
WANT_TABLE = [{"k": 1, "items": [1, 3, 7], "meta": {"n": 3}}]
WANT_SEEN = [
    {"k": 1, "items": [1, 3], "meta": {"n": 2}},
    {"k": 1, "items": [1, 3, 4], "meta": {"n": 3}},
    {"k": 1, "items": [1, 3, 7], "meta": {"n": 3}},
]


def _job() -> tx.Job:
    return (
        tx.Job("lists")
        .table("lists", key="k")
        .input("ev", None, keys="k")
        .output("seen")
        .on("ev", _append)
    )


@pytest.mark.parametrize("restart_each_batch", [False, True])
def test_changing_a_read_or_emitted_rows_list_changes_neither_the_table_nor_the_output(
    tmp_path: Path, restart_each_batch: bool
) -> None:
    # Fails before the fix (shallow copies): the table held the rolled-back -5,
    # the read-only 4 and the "after ..." items, and the outputs the later appends.
    job = _job()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tx.TransactionFailuresWarning)
        logging.getLogger("txstream.runtime").disabled = True
        try:
            if restart_each_batch:  # (each run loads the state from the store)
                for batch in EVENTS:
                    job.run_local([batch], tmp_path)
            else:
                job.run_local(EVENTS, tmp_path)
        finally:
            logging.getLogger("txstream.runtime").disabled = False
    assert tx.read_table(tmp_path, "lists") == WANT_TABLE
    assert tx.read_output(tmp_path, "seen") == WANT_SEEN
    assert len(tx.read_failures(tmp_path)) == 1


def test_the_driver_engine_copies_rows_alike() -> None:
    job = _job()
    engine = DriverEngine(job.spec)
    for b, batch in enumerate(EVENTS):
        copies = [
            event_copies(job.spec, 1, n, row, (b << MID_BITS) + i)
            for i, (n, row) in enumerate(batch)
        ]
        engine.run_batch(b, [event for [(_, event)] in copies])
    assert list(engine.tm.table("lists").rows().values()) == WANT_TABLE


# -- a function that changes its event's row --------------------------------------------
def _double(t: Any, e: dict[str, Any]) -> None:
    e["qty"] *= 2  # a user normalising the event in place
    if e["bad"]:
        raise ValueError("bad")
    t.emit("out", {"k": e["k"], "qty": e["qty"]})


def _countdown(t: Any, e: dict[str, Any]) -> None:
    e["n"] -= 1  # each fragment of a keyless event: from the event's own value
    if t.home == 0:
        t.emit("out", {"k": -1, "qty": e["n"]})


def _changing_job(merge: str) -> tx.Job:
    return (
        tx.Job("changing")
        .input("ev", None, keys="k", order="ts")
        .input("ev2", None, keys="k", order="ts")
        .input("cti", None, keys=(), order="ts")
        .output("out")
        .on("ev", _double)
        .on("ev2", _double)
        .on("cti", _countdown)
        .boundary("timestamp")  # events of one ts on several partitions: one transaction
        .option("merge", merge)
    )


def _ev(name: str, k: int, ts: int, bad: bool = False) -> tuple[str, dict[str, Any]]:
    return name, {"k": k, "ts": ts, "qty": 1, "bad": bad}


@pytest.mark.parametrize("merge", ["batch", "event-time"])
def test_a_function_that_changes_its_events_row_gives_the_serial_answer(
    tmp_path: Path, merge: str
) -> None:
    # ts 2 spans partitions and fails: the batch runs again with it aborted.  Before
    # the fix the events of ts 1 ran twice on one row each, doubled twice (qty 4):
    # run_local's rows under merge="batch", or, held by the event-time merge until
    # ev2 and cti deliver, the rows of the cached state; and the keyless event's
    # fragments, one row for all, counted down from each other's value.
    batches = [
        [_ev("ev", 1, 1), _ev("ev", 2, 1), _ev("ev", 3, 2), _ev("ev", 4, 2, bad=True)],
        [_ev("ev2", 7, 5), ("cti", {"ts": 6, "n": 10})],
        [_ev("ev", 5, 7), _ev("ev", 6, 7), _ev("ev", 9, 8, bad=True), _ev("ev2", 8, 9)],
        [_ev("ev", 10, 9)],
    ]
    given = repr(batches)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tx.TransactionFailuresWarning)
        logging.getLogger("txstream.runtime").disabled = True
        try:
            _changing_job(merge).run_local(batches, tmp_path, partitions=4)
        finally:
            logging.getLogger("txstream.runtime").disabled = False
    got = sorted((r["k"], r["qty"]) for r in tx.read_output(tmp_path, "out"))
    assert got == [(-1, 9), (1, 2), (2, 2), (5, 2), (6, 2), (7, 2), (8, 2), (10, 2)]
    assert repr(batches) == given  # the caller's rows are the caller's
