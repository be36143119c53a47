"""Per-input watermarks of the event-time merge (issue 27, "Inputs end").

An input with ``watermark=delay`` may deliver an event up to ``delay`` below
the largest order value it has delivered: its frontier is ``max_seen - delay``,
so such out-of-order events still run in order; further behind they are late.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import txstream as tx
from txstream.bench.ledger import deposit, events, serial_oracle, transfer
from txstream.spark.runtime.base import RuntimeJobError
from txstream.spark.runtime.merge import advance, plan_watermarks, watermark_delay

Event = tuple[str, dict[str, Any]]


def ledger(watermark: Any = None) -> tx.Job:
    """The ledger job (two inputs ordered by id), each input with ``watermark``."""
    return (
        tx.Job("wm-ledger")
        .table("accounts", key="acct", schema="acct long, balance long")
        .input("deposits", None, keys="acct", order="id", watermark=watermark)
        .input("transfers", None, keys=["src", "dst"], order="id", watermark=watermark)
        .output("transfers_done", schema="id long, ok boolean")
        .on("deposits", deposit)
        .on("transfers", transfer)
    )


def shuffled(stream: list[Event], delay: int, size: int, seed: int) -> list[list[Event]]:
    """The events in an arrival order where each is at most ``delay`` ids late, in batches.

    Arrival key ``id + u`` (u uniform in [0, delay)): an event arrives after an
    event of a higher id only if that id is less than ``delay`` above its own.
    """
    rng = random.Random(seed)
    arrival = sorted(stream, key=lambda e: e[1]["id"] + rng.random() * delay)
    return [arrival[i : i + size] for i in range(0, len(arrival), size)]


def outcomes(store: Path) -> list[tuple[int, bool]]:
    return [(r["id"], r["ok"]) for r in tx.read_output(store, "transfers_done")]


# -- run_local: the serial answer within the delay ---------------------------------------
def test_a_watermark_gives_the_serial_answer_for_events_out_of_order_within_it(
    tmp_path: Path,
) -> None:
    stream = list(events(400, 4, 30, seed=5, deposit_pct=20.0))
    _, expected = serial_oracle(stream)
    batches = shuffled(stream, delay=15, size=7, seed=2)
    assert [e[1]["id"] for b in batches for e in b] != sorted(e[1]["id"] for e in stream)
    runner = ledger(watermark=15).run_local(batches, tmp_path / "wm", 2)
    assert outcomes(tmp_path / "wm") == expected
    assert runner.held() == 0 and tx.read_failures(tmp_path / "wm") == []
    # Without it (the same merge, event-time) the events behind the frontier are
    # late and run where they arrive: another answer, and a warning says so.
    with pytest.warns(tx.LateEventsWarning, match=r"event\(s\) arrived after later ones"):
        ledger().run_local(batches, tmp_path / "late", 2)
    assert outcomes(tmp_path / "late") != expected
    # Too small a watermark: the same (late events run in the batch they arrive in).
    with pytest.warns(tx.LateEventsWarning, match="give the input a watermark"):
        ledger(watermark=2).run_local(batches, tmp_path / "small", 2)
    assert outcomes(tmp_path / "small") != expected


def test_a_watermark_on_one_input_makes_the_event_time_merge_hold_its_own_events(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[float] = []
    job = (
        tx.Job("one")
        .input("e", None, keys="k", order="ts", watermark="3 seconds")
        .on("e", lambda t, e: seen.append(e["ts"]))
    )
    # One ordered input would take the batch merge; a watermark asks for event time.
    assert job.merge_for("run_local") == "event-time" == job.merge_for("start")
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    at = [t0 + timedelta(seconds=s) for s in (5, 6, 3, 9, 7, 4)]  # 4 is 5 s behind 9: late
    with (
        caplog.at_level(logging.WARNING, logger="txstream.runtime"),
        pytest.warns(tx.LateEventsWarning, match="'one': 1 event"),
    ):
        runner = job.run_local([[("e", {"k": 1, "ts": t})] for t in at], tmp_path, 1)
    assert [t.second for t in seen] == [3, 5, 6, 4, 7, 9]  # 4: late, run where it arrived
    assert json.loads((tmp_path / "job.json").read_text())["watermarks"] == {"e": 3.0}
    # ... and said: counted in its batch's progress and warned about, once.
    assert [s["late"] for s in runner.stats] == [0, 0, 0, 0, 0, 1, 0]
    [warning] = [r.getMessage() for r in caplog.records if "ran late" in r.getMessage()]
    assert "batch 5: 1 event(s)" in warning and "raise the input's watermark" in warning
    # With a delay that covers the disorder nothing is late.
    seen.clear()
    wide = tx.Job("one").input("e", None, keys="k", order="ts", watermark="6 seconds")
    wide.on("e", lambda t, e: seen.append(e["ts"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", tx.LateEventsWarning)
        runner = wide.run_local([[("e", {"k": 1, "ts": t})] for t in at], tmp_path / "w", 1)
    assert [t.second for t in seen] == [3, 4, 5, 6, 7, 9]
    assert sum(s["late"] for s in runner.stats) == 0


# -- the frontier arithmetic ----------------------------------------------------------------
def test_the_frontier_is_each_inputs_largest_value_less_its_delay() -> None:
    index = {"a": 0, "b": 1}
    bound, frontier = advance({}, {"a": 10.0, "b": 20.0}, 1, index, {"b": 15.0})
    assert bound == (5.0, 1)  # b: 20 - 15 holds a (10) back to 5
    assert frontier["high"] == {"a": 10.0, "b": 20.0}  # the largest values are kept
    bound, frontier = advance(frontier, {"a": 30.0, "b": 22.0}, 1, index, {"b": 15.0})
    assert bound == (7.0, 1)
    # At equal contributions the earlier declared input decides (it may deliver that value).
    assert advance({}, {"a": 7.0, "b": 9.0}, 1, index, {"b": 2.0})[0] == (7.0, 0)
    # An input quiet for idleBatches holds nothing back, watermark or not.
    bound, _ = advance(frontier, {"a": 40.0}, 1, index, {"a": 5.0, "b": 15.0})
    assert bound == (35.0, 0)
    assert advance({}, {"a": 10.0, "b": 20.0}, 1, index)[0] == (10.0, 0)  # no delays: as before


# -- declarations ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "delay"),
    [(10, 10.0), (0.5, 0.5), ("10 seconds", 10.0), ("2 minutes", 120.0),
     ("interval 1 hours 30 seconds", 3630.0), ("1.5 seconds", 1.5), ("1500 milliseconds", 1.5),
     ("1 days", 86400.0), (timedelta(minutes=1), 60.0), (0, 0.0)],
)  # fmt: skip
def test_watermark_delays_as_numbers_and_intervals(value: Any, delay: float) -> None:
    assert watermark_delay(value, "input 'e'") == delay


@pytest.mark.parametrize(
    "value", [-1, math.nan, math.inf, True, "ten", "10", "", "10 parsecs", "1 month", [10]]
)
def test_bad_watermarks_are_refused_in_one_line(value: Any) -> None:
    with pytest.raises(RuntimeJobError, match="input 'e': watermark") as err:
        tx.Job("j").input("e", None, keys="k", order="ts", watermark=value)
    assert "\n" not in str(err.value)


def test_a_watermark_needs_an_order_column_and_the_event_time_merge() -> None:
    with pytest.raises(RuntimeJobError, match="declare order=") as err:
        tx.Job("j").input("e", None, keys="k", watermark=5)
    assert "\n" not in str(err.value)
    job = tx.Job("j").input("e", None, keys="k", order="ts", watermark=5).on("e", print)
    job.option("merge", "batch")
    with pytest.raises(RuntimeJobError, match="merge='batch' has none") as err:
        job.validate()
    assert "\n" not in str(err.value)


def test_the_watermark_of_a_spark_plan_is_read() -> None:
    plan = (
        "Project [ts#2, k#3L]\n"
        "+- ~EventTimeWatermark 6a5fece3-6434-4690-8c5e-7b5b0c9a5661, ts#2: timestamp, "
        "1 hours 30 seconds\n"
        "   +- StreamingRelation FileSource[/in], [ts#2, k#3L]"
    )
    assert plan_watermarks(plan) == [("ts", "1 hours 30 seconds")]
    assert plan_watermarks("EventTimeWatermark event_time#17: timestamp, 10 seconds") == [
        ("event_time", "10 seconds")
    ]
    assert plan_watermarks("Project [ts#2]") == []


class _Plan:
    """Stands for a Spark DataFrame: ``_jdf.queryExecution().analyzed().toString()``."""

    schema = None  # (what Job.input's check of a source looks for in a DataFrame)

    def __init__(self, text: str) -> None:
        self.text = text
        self._jdf = self

    def queryExecution(self) -> _Plan:
        return self

    def analyzed(self) -> _Plan:
        return self

    def toString(self) -> str:
        return self.text


def test_withwatermark_is_taken_only_on_the_order_column_and_never_over_watermark() -> None:
    mark = "+- ~EventTimeWatermark 6a5fece3-6434-4690-8c5e-7b5b0c9a5661, {}#2: timestamp, {}"
    job = tx.Job("j").input("e", _Plan(mark.format("ts", "2 minutes")), keys="k", order="ts")
    job._dataframe_watermarks()
    assert job._watermarks == {"e": 120.0} and job.merge_for("start") == "event-time"
    declared = tx.Job("j").input(
        "e", _Plan(mark.format("ts", "2 minutes")), keys="k", order="ts", watermark=5
    )
    declared._dataframe_watermarks()
    assert declared._watermarks == {"e": 5.0}  # watermark= wins
    for order, match in (("ts", "withWatermark is on column 'w', not on"), (None, "order='w'")):
        job = tx.Job("j").input("e", _Plan(mark.format("w", "1 second")), keys="k", order=order)
        with pytest.raises(RuntimeJobError, match=match) as err:
            job._dataframe_watermarks()
        assert "\n" not in str(err.value)


# -- restarts ----------------------------------------------------------------------------------
def test_a_restart_may_change_the_watermark_and_records_it(tmp_path: Path) -> None:
    stream = list(events(200, 4, 30, seed=9, deposit_pct=20.0))
    _, expected = serial_oracle(stream)
    batches = shuffled(stream, delay=10, size=5, seed=4)
    half = len(batches) // 2
    ledger(watermark=10).run_local(batches[:half], tmp_path, 2, end_inputs=False)
    meta = json.loads((tmp_path / "job.json").read_text())
    assert meta["watermarks"] == {"deposits": 10.0, "transfers": 10.0}
    # The merge keeps each input's largest value: a larger delay goes on from there.
    ledger(watermark="20 seconds").run_local(batches[half:], tmp_path, 2)
    meta = json.loads((tmp_path / "job.json").read_text())
    assert meta["watermarks"] == {"deposits": 20.0, "transfers": 20.0}
    assert outcomes(tmp_path) == expected


# -- Spark: withWatermark on the order column ------------------------------------------------
def _sequence_job(source: Any, watermark: Any = None) -> tx.Job:
    """Each event emits the previous event of its key (so the answer shows the order)."""

    def step(t: Any, e: dict[str, Any]) -> None:
        prev = t.read("last", e["k"])
        t.emit("seq", {"k": e["k"], "n": e["n"], "prev": -1 if prev is None else prev["n"]})
        t.upsert("last", {"k": e["k"], "n": e["n"]})

    return (
        tx.Job("wm-seq")
        .table("last", key="k", schema="k long, n long")
        .input("e", source, keys="k", order="ts", watermark=watermark)
        .output("seq", schema="k long, n long, prev long")
        .on("e", step)
    )


@pytest.mark.spark
def test_spark_takes_the_watermark_from_withwatermark_on_the_order_column(
    spark: Any, tmp_path: Path
) -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    # One file per micro-batch; an event is at most 3 s behind the largest before it
    # (without the watermark 7, delivered after 9 of its key, would run after it).
    files = [[5, 6, 3], [9, 8], [7, 10, 12], [11, 13]]
    local: list[list[Event]] = []
    (tmp_path / "in").mkdir()
    for k, part in enumerate(files):
        rows = [{"k": n % 2, "n": n, "ts": (t0 + timedelta(seconds=n)).isoformat()} for n in part]
        text = "".join(json.dumps(r) + "\n" for r in rows)
        path = tmp_path / "in" / f"part-{k:04d}.json"
        path.write_text(text)
        # Spark takes files in modification-time order; written within one clock
        # tick (in memory, say) they tie and come in any order.
        os.utime(path, (1_700_000_000 + k, 1_700_000_000 + k))
        local.append([("e", {**r, "ts": t0 + timedelta(seconds=r["n"])}) for r in rows])
    df = (
        spark.readStream.schema("k long, n long, ts timestamp")
        .option("maxFilesPerTrigger", 1)
        .json(str(tmp_path / "in"))
    )
    other = df.withColumn("w", df.ts).withWatermark("w", "1 second")
    with pytest.raises(RuntimeJobError, match="withWatermark is on column 'w'") as err:
        _sequence_job(other).start(tmp_path / "bad", spark, partitions=2)
    assert "\n" not in str(err.value)
    job = _sequence_job(df.withWatermark("ts", "3 seconds")).trigger(availableNow=True)
    query = job.start(tmp_path / "ckpt", spark, partitions=2)
    try:
        query.awaitTermination()
    finally:
        query.stop()
    _sequence_job(None, watermark=3).run_local(local, tmp_path / "local", 2)
    got = sorted((r["k"], r["n"], r["prev"]) for r in tx.read_output(tmp_path / "ckpt", "seq"))
    want = sorted((r["k"], r["n"], r["prev"]) for r in tx.read_output(tmp_path / "local", "seq"))
    last: dict[int, int] = {}
    serial = []
    for n in sorted(n for part in files for n in part):  # each key's events in time order
        serial.append((n % 2, n, last.get(n % 2, -1)))
        last[n % 2] = n
    assert got == want == sorted(serial)
    assert query.job._watermarks == {"e": 3.0} and query.lastProgress["held"] == 0
    assert json.loads((tmp_path / "ckpt" / "txstream" / "job.json").read_text())["watermarks"] == {
        "e": 3.0
    }


@pytest.mark.parametrize("boundary", [("seconds", {"seconds": 10.0}), ("timestamp", {})])
def test_an_event_of_a_group_that_ran_on_other_partitions_is_late(
    tmp_path: Path, boundary: tuple[str, dict[str, Any]]
) -> None:
    # Serially, key 4's event at ts 5 joins the group of ts 1 (the slice [0, 10),
    # or with "timestamp" the same ts) and its error rolls key 1's write back.
    # Arriving after the frontier passed that group, it ran alone: key 1's row
    # stayed, and nothing was reported, since its partition (keys 1 and 4 are on
    # partitions 1 and 0) had run nothing later.
    def put(t: tx.Tx, e: dict[str, Any]) -> None:
        if e["k"] == 4:
            raise ValueError("refused")
        t.upsert("rows", {"k": e["k"], "ts": e["ts"]})

    ts = 5.0 if boundary[0] == "seconds" else 1.0
    job = (
        tx.Job("groups")
        .table("rows", key="k")
        .input("ev", None, keys="k", order="ts", watermark=0.0)
        .on("ev", put)
        .boundary(boundary[0], **boundary[1])
    )
    first = [[("ev", {"k": 1, "ts": 1.0}), ("ev", {"k": 1, "ts": 12.0})]]
    with warnings.catch_warnings():
        warnings.simplefilter("error", tx.LateEventsWarning)
        job.run_local(first, tmp_path / "s", partitions=2, end_inputs=False)
    with (
        pytest.warns(tx.LateEventsWarning, match="1 event"),
        pytest.warns(tx.TransactionFailuresWarning),
    ):
        job.run_local([[("ev", {"k": 4, "ts": ts})]], tmp_path / "s", partitions=2)


@pytest.mark.parametrize("partitions", [1, 2])
@pytest.mark.parametrize("boundary", [("seconds", {"seconds": 3}), ("timestamp", {})])
def test_an_event_of_a_group_that_ran_when_every_input_was_quiet_is_late(
    tmp_path: Path, boundary: tuple[str, dict[str, Any]], partitions: int
) -> None:
    # A batch in which no input delivers (or the inputs' end) runs every held
    # event, the last group too (the slice [15, 18), or ts 16); a later event of
    # that group ran as a transaction of its own with no warning, since the
    # frontier was no number.  The late event is on the later input b: on a it
    # would come before (16, b) in the order and be late whatever the group.
    # With 2 partitions its key is on the one that ran nothing of that group
    # (which counted nothing as late before tasks.release took what every input
    # delivered into account).
    from txstream.spark.runtime.partitioning import partition_of

    def put(t: tx.Tx, e: dict[str, Any]) -> None:
        t.upsert("rows", {"k": e["k"], "ts": e["ts"]})

    job = (
        tx.Job("quiet")
        .table("rows", key="k")
        .input("a", None, keys="k", order="ts")
        .input("b", None, keys="k", order="ts")
        .on("a", put)
        .on("b", put)
        .boundary(boundary[0], **boundary[1])
        .option("idleBatches", 2)
    )
    ran = [k for k in range(100) if partition_of(k, partitions) == 0][:2]
    idle = next(k for k in range(100) if partition_of(k, partitions) == partitions - 1)
    # (b delivers nothing in the first batch: a is held, and nothing is late;
    # two batches without events make both inputs quiet)
    first = [[("a", {"k": ran[0], "ts": 15.0})], [("b", {"k": ran[1], "ts": 16.0})], [], []]
    with warnings.catch_warnings():
        warnings.simplefilter("error", tx.LateEventsWarning)
        job.run_local(first, tmp_path / "s", partitions=partitions, end_inputs=False)
    ts = 17.0 if boundary[0] == "seconds" else 16.0
    with pytest.warns(tx.LateEventsWarning, match="1 event"):
        job.run_local([[("b", {"k": idle, "ts": ts})]], tmp_path / "s", partitions=partitions)


def test_an_event_behind_a_crossing_transaction_its_partition_took_part_in_is_late(
    tmp_path: Path,
) -> None:
    # The transfer a -> b (home a's partition) ran in batch 1; b's partition only took part
    # in it, through its home's list of copies (forward._Partition.announce), so its own
    # released events stop at ts 2.  An event of b at ts 15 in batch 2 runs after the
    # transfer, out of the declared order: late, as when b's partition held a copy row.
    from txstream.spark.runtime.partitioning import partition_of

    a, c = [k for k in range(100) if partition_of(k, 2) == 0][:2]
    b = next(k for k in range(100) if partition_of(k, 2) == 1)

    def put(t: tx.Tx, e: dict[str, Any]) -> None:
        t.upsert("acc", {"k": e["k"], "v": e["v"]})

    def move(t: tx.Tx, e: dict[str, Any]) -> None:
        t.increment("acc", e["src"], "v", -5)
        t.increment("acc", e["dst"], "v", 5)

    job = (
        tx.Job("late")
        .table("acc", key="k", schema="k long, v long")
        .input("d", None, keys="k", order="ts", watermark=0)
        .input("t", None, keys=["src", "dst"], order="ts", watermark=0)
        .on("d", put)
        .on("t", move)
    )
    first = [
        ("d", {"k": a, "v": 50, "ts": 1.0}),
        ("d", {"k": b, "v": 50, "ts": 2.0}),
        ("t", {"src": a, "dst": b, "ts": 20.0}),
        ("d", {"k": c, "v": 0, "ts": 25.0}),
        ("t", {"src": c, "dst": c, "ts": 30.0}),
    ]
    with pytest.warns(tx.LateEventsWarning, match="1 event"):
        job.run_local([first, [("d", {"k": b, "v": 100, "ts": 15.0})]], tmp_path, partitions=2)
