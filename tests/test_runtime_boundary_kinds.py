"""Boundaries on the runtime without Spark: by name, ``by`` a group value, ``timeslice``.

(``test_runtime_boundaries.py`` compares every boundary with a serial oracle.)

Moved from ``tests/test_runtime.py`` (split by subject); shared helpers are in
``tests/runtime_jobs.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import txstream as tx
from runtime_jobs import counter_job, counts
from txstream.model import check
from txstream.spark.runtime.partitioning import partition_of
from txstream.spark.runtime.state import RuntimeStore


# -- boundaries --------------------------------------------------------------------
def group_sizes(boundary: str, batch: list[Any], **options: Any) -> list[int]:
    from txstream.spark.runtime.boundaries import Event

    evs = [
        Event((float(e.get("ts", 0)), 0 if n == "ev" else 1, i), n, e, [0], [0])
        for i, (n, e) in enumerate(batch)
    ]
    meta: dict[str, Any] = {}
    return [len(g.events) for g in tx.boundary(boundary, **options).groups(0, evs, meta)]


def test_boundaries_by_name_group_events_as_table_3_says() -> None:
    batch = [("ev", {"ts": t}) for t in (1, 1, 2, 3.5, 4, 4, 4)]
    assert group_sizes("event", batch) == [1] * 7
    assert group_sizes("timestamp", batch) == [2, 1, 1, 3]
    assert group_sizes("seconds", batch, seconds=2) == [2, 2, 3]
    assert group_sizes("batch", batch) == [7]
    assert group_sizes("by", batch, group=lambda e: e["ts"] > 2) == [3, 4]
    cti = [("ev", {"ts": 1}), ("cti", {}), ("ev", {"ts": 2}), ("ev", {"ts": 3}), ("cti", {})]
    assert group_sizes("punctuation", cti, of="cti") == [2, 3]


def two_keys(partitions: int = 2) -> tuple[int, int]:
    """A key placed on partition 0 and one on partition 1."""
    a = next(k for k in range(40) if partition_of(k, partitions) == 0)
    b = next(k for k in range(40) if partition_of(k, partitions) == 1)
    return a, b


def same_answers(job: tx.Job, batches: list[Any], root: Path) -> dict[str, Any]:
    """The job's outputs, failures and table on 1, 2 and 3 partitions: they must be equal."""
    answers = []
    for partitions in (1, 2, 3):
        store = root / f"p{partitions}"
        job.run_local(batches, store, partitions)
        seen = tx.read_output(store, "seen")
        answers.append(
            {
                # One transaction's parts on several partitions emit in no global order.
                "seen": sorted(seen, key=lambda r: json.dumps(r, sort_keys=True)),
                "failures": [
                    (f["txn"], f["kind"], f["position"], f["error"])
                    for f in tx.read_failures(store)
                ],
                "counts": counts(store, partitions),
            }
        )
        assert check(tx.read_history(store), "csao").holds
    assert answers[0] == answers[1] == answers[2]
    return answers[0]


@pytest.mark.parametrize("partitions", [1, 2])
def test_boundary_by_refuses_a_batch_whose_group_values_interleave(
    tmp_path: Path, partitions: int
) -> None:
    # g=1 on key a, g=2 on key b, g=1 on key a: partition 0 alone would see one
    # run of g=1 (the failure of ev#2 rolling ev#0 back), one partition three
    # runs.  Same answer for every partition count: the batch is refused.
    a, b = two_keys()
    batch = [
        ("ev", {"k": a, "g": 1, "ts": 1}),
        ("ev", {"k": b, "g": 2, "ts": 2}),
        ("ev", {"k": a, "g": 1, "ts": 3, "boom": True}),
    ]
    job = counter_job("by", group=lambda e: e["g"])
    with pytest.raises(tx.RuntimeJobError) as caught:
        job.run_local([[("ev", {"k": a, "g": 0, "ts": 0})], batch], tmp_path, partitions)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(
        "batch 1: boundary 'by': the events of group 1 (from ev#b1+0 to ev#b1+2) and of "
        "group 2 (from ev#b1+1) interleave; 'by' needs each value's events consecutive"
    )
    assert "partition count" in message
    assert RuntimeStore(tmp_path).committed() == [0]  # nothing of batch 1
    assert [r["ts"] for r in tx.read_output(tmp_path, "seen")] == [0]


def test_boundary_by_with_runs_that_do_not_interleave_is_the_same_on_any_partitions(
    tmp_path: Path,
) -> None:
    keys = list(range(12))
    batches = [
        [("ev", {"k": keys[i % 12], "ts": i, "boom": i == 13}) for i in range(0, 40)],
        [("ev", {"k": keys[(i * 7) % 12], "ts": i, "stop": i == 55}) for i in range(35, 70)],
    ]
    # A period of event time, as Linear Road's: 1 and 1.0 are one value (one id).
    job = counter_job("by", group=lambda e: e["ts"] // 10 * (1.0 if e["ts"] % 2 else 1))
    answers = same_answers(job, batches, tmp_path)
    assert [f[0] for f in answers["failures"]] == ["b0_u1", "b1_u5"]
    assert len(answers["seen"]) == 40 + 35 - 10 - 10


def test_boundary_by_in_the_driver_engine_refuses_interleaving_runs_too() -> None:
    from txstream.spark.runtime.boundaries import Event
    from txstream.spark.runtime.driver import DriverEngine

    job = counter_job("by", group=lambda e: e["g"])
    rows = [{"k": 1, "g": 1, "ts": 1}, {"k": 2, "g": 2, "ts": 2}, {"k": 1, "g": 1, "ts": 3}]
    events = [Event((r["ts"], 0, i), "ev", r, [r["k"]], [0]) for i, r in enumerate(rows)]
    engine = DriverEngine(job.spec)
    with pytest.raises(tx.RuntimeJobError, match=r"group 1 .* and of group 2 .* interleave"):
        engine.run_batch(0, events)
    assert engine.run_batch(1, events[:2]).committed == 2


def test_boundary_by_values_that_spell_alike_or_are_not_ascii_make_valid_distinct_ids(
    tmp_path: Path,
) -> None:
    groups = ["a b", "a_b", "é", "日本", ("x", 1)]
    batch = [("ev", {"k": 1, "g": g, "ts": i, "boom": g == "a_b"}) for i, g in enumerate(groups)]
    counter_job("by", group=lambda e: e["g"]).run_local([batch], tmp_path, 1)
    assert [r["ts"] for r in tx.read_output(tmp_path, "seen")] == [0, 2, 3, 4]
    history = tx.read_history(tmp_path)  # transaction ids are ASCII letters, digits and _
    assert len(history.arrivals["IN"]) == 5 == len(set(history.arrivals["IN"]))
    assert check(history, "csao").holds


def timeslice_job() -> tx.Job:
    """``counter_job`` cut into 10 s slices of a keyless ``tick`` input."""

    def tick(t: tx.Tx, e: dict[str, Any]) -> None:
        if t.home == 0:  # one fragment per partition: emit once
            t.emit("seen", {"tick": e["ts"]})

    return (
        counter_job("timeslice", seconds=10, of="tick")
        .input("tick", None, keys=(), order="ts")
        .on("tick", tick)
        .option("merge", "batch")  # (these tests are of late events in batch order)
    )


def test_timeslice_aborts_late_events(tmp_path: Path) -> None:
    a, b = two_keys()
    batches = [
        [("tick", {"ts": 5}), ("ev", {"k": a, "ts": 6}), ("tick", {"ts": 25})],
        [("tick", {"ts": 12}), ("ev", {"k": b, "ts": 13}), ("tick", {"ts": 27})],
    ]
    timeslice_job().run_local(batches, tmp_path, 2)
    # ts=12 is late against the slice of ts=25 (on key a's partition as well as
    # on b's); ev ts=13 joins the open slice.
    assert tx.read_output(tmp_path, "seen") == [
        {"tick": 5},
        {"k": a, "ts": 6},
        {"tick": 25},
        {"k": b, "ts": 13},
        {"tick": 27},
    ]
    late = tx.read_failures(tmp_path)
    assert [(f["kind"], f["position"]) for f in late] == [("late", "tick#b1+0")]


def test_timeslice_is_the_same_on_any_partitions_and_needs_a_keyless_input(
    tmp_path: Path,
) -> None:
    batches = [
        [("ev", {"k": 0, "ts": 1})]
        + [("tick", {"ts": t}) for t in (2, 12, 31)]
        + [("ev", {"k": k, "ts": 2 + k * 3, "boom": k == 7}) for k in range(12)],
        [("tick", {"ts": t}) for t in (15, 45, 33, 60)]
        + [("ev", {"k": k, "ts": 40 + k, "stop": k == 2}) for k in range(12)],
    ]
    answers = same_answers(timeslice_job(), batches, tmp_path / "ok")
    # ev k=7 (ts=23) fails in the slice opened by the tick at 12 and open until
    # the tick at 31: its 8 events roll back on every partition.  Tick ts=15 is
    # late; ts=33 joins the open slice 3 with ev 40-44, where k=2 aborts (6).
    assert [(f[0], f[1]) for f in answers["failures"]] == [
        ("b0_ts1", "error"),
        (f"b1_late{1 << 64}", "late"),
        ("b1_ts3", "abort"),
    ]
    assert len(answers["seen"]) == 16 - 8 + 16 - 1 - 6
    with pytest.raises(tx.RuntimeJobError, match=r"timeslice input 'ev' must have keys=\(\)"):
        counter_job("timeslice", seconds=10, of="ev").validate()


def test_a_fragment_after_a_global_read_of_its_group_has_its_own_home(tmp_path: Path) -> None:
    # Under a grouping boundary the global read's home (0) and totals stayed on the
    # transaction object for the group's later events: every fragment of a keyless
    # event after it saw `t.home == 0` and emitted, once per partition.
    def audit(t: Any, e: dict[str, Any]) -> None:
        t.emit("log", {"id": e["id"], "total": t.sum("acct", "bal")})

    def tick(t: Any, e: dict[str, Any]) -> None:
        if t.home == 0:
            t.emit("log", {"id": e["id"], "here": sorted(t.values("acct"))})

    job = (
        tx.Job("home")
        .table("acct", key="a", initial=[{"a": a, "bal": 1} for a in range(6)])
        .input("audits", None, order="ts", global_reads=["acct.bal"])
        .input("ticks", None, order="ts")
        .output("log")
        .on("audits", audit)
        .on("ticks", tick)
        .boundary("timestamp")
    )
    batch = [("ticks", {"id": 1, "ts": 4}), ("audits", {"id": 2, "ts": 4})]
    for partitions in (1, 3):
        store = tmp_path / f"p{partitions}"
        job.run_local([batch], store, partitions=partitions)
        here = [a for a in range(6) if partition_of(a, partitions) == 0]
        assert tx.read_output(store, "log") == [{"id": 2, "total": 6}, {"id": 1, "here": here}]
