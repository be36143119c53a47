"""Order values and merges without Spark: safe defaults, inputs that end, NaN and infinities.

Issue 27: with several ordered inputs the answer must not depend on how the
sources hand files over (the default merge), a bounded run must end with
nothing held, and a NaN or infinite order value is a failure with its input
position that neither reorders nor holds the other events.
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

import txstream as tx
from txstream.bench.ledger import events, ledger_job, serial_oracle
from txstream.spark.runtime.state import RuntimeStore


def by_input(stream: list[Any], first: str, chunks: int = 3) -> list[list[Any]]:
    """Adversarial hand-over: all of ``first``'s events in early batches, the others' later.

    Each input keeps its own order, as a file source does; the inputs' batches
    do not line up with each other.
    """
    names = list(dict.fromkeys(name for name, _ in stream))
    ordered = [first] + [n for n in names if n != first]
    batches: list[list[Any]] = []
    for name in ordered:
        mine = [e for e in stream if e[0] == name]
        size = max(1, math.ceil(len(mine) / chunks))
        batches += [mine[i : i + size] for i in range(0, len(mine), size)]
    return batches


def outcomes(store: Path) -> list[tuple[int, bool]]:
    return [(r["id"], r["ok"]) for r in tx.read_output(store, "transfers_done")]


# -- safe defaults ---------------------------------------------------------------------
@pytest.mark.parametrize("first", ["deposits", "transfers"])
def test_the_default_merge_gives_the_serial_answer_whatever_the_hand_over(
    tmp_path: Path, first: str
) -> None:
    # Before: the default merge="batch" ran every transfer handed over first
    # before the deposits that precede it (ok=False instead of True), silently.
    stream = list(events(240, 6, 30, seed=11))
    _, expected = serial_oracle(stream)
    runner = ledger_job(merge=None).run_local(by_input(stream, first), tmp_path, 2)
    assert outcomes(tmp_path) == expected
    assert runner.held() == 0 and tx.read_failures(tmp_path) == []
    # docs/spark.md's quick start: the same job with merge='event-time' chosen.
    quick = ledger_job(merge="event-time").run_local(by_input(stream, first), tmp_path / "q", 2)
    assert outcomes(tmp_path / "q") == expected and quick.held() == 0
    # The explicit choice of the batch merge stays allowed (and differs here).
    chosen = ledger_job(merge=None).option("merge", "batch")
    chosen.run_local(by_input(stream, first), tmp_path / "b", 2)
    assert outcomes(tmp_path / "b") != expected


def test_one_ordered_input_keeps_the_batch_merge_by_default(tmp_path: Path) -> None:
    job = tx.Job("one").input("e", None, keys="k", order="ts").on("e", lambda t, e: None)
    assert job.merge_for("run_local") == "batch" and job.merge_for("start") == "batch"
    job.run_local([[("e", {"k": 1, "ts": 2})], [("e", {"k": 1, "ts": 1})]], tmp_path)
    assert json.loads((tmp_path / "job.json").read_text())["merge"] == "batch"


def test_start_takes_the_event_time_merge_for_several_ordered_inputs_and_mixed_ones_choose() -> (
    None
):
    # A Spark query now ends its inputs at the end of a bounded run (see
    # test_spark_end_inputs.py), so start() defaults to the event-time merge as
    # run_local does; it used to refuse until the merge was chosen.  A job that
    # mixes ordered and unordered inputs is still refused before Spark starts.
    assert ledger_job(merge=None).merge_for("start") == "event-time"
    assert ledger_job(merge="batch").merge_for("start") == "batch"
    mixed = ledger_job(merge=None).input("notes", None, keys="acct").on("notes", lambda t, e: None)
    for run in (lambda: mixed.start("/nonexistent/ckpt"), lambda: mixed.run_local([], "/x")):
        with pytest.raises(tx.RuntimeJobError) as caught:
            run()
        message = str(caught.value)
        assert "\n" not in message
        assert message.startswith(
            "job 'ledger' has 2 inputs with an order column (deposits, transfers): under "
            "merge='batch' an event of a later micro-batch runs after the earlier ones"
        )
        assert "choose add order=... to input(s) notes (the event-time merge), or" in message
        assert message.endswith("or .option('merge', 'batch') (keep micro-batch order)")


def test_a_store_of_the_old_default_batch_merge_restarts_under_the_event_time_merge(
    tmp_path: Path,
) -> None:
    # A store recorded with merge='batch' (the old default) and restarted with
    # the default: the event-time merge (entering it is allowed; nothing was held).
    stream = list(events(120, 5, 30, seed=2))
    head, tail = stream[:60], stream[60:]
    ledger_job(merge="batch").run_local([head], tmp_path, 2)
    assert json.loads((tmp_path / "job.json").read_text())["merge"] == "batch"
    ledger_job(merge=None).run_local(by_input(tail, "transfers"), tmp_path, 2)
    assert json.loads((tmp_path / "job.json").read_text())["merge"] == "event-time"
    assert outcomes(tmp_path) == serial_oracle(stream)[1]


# -- inputs that end ---------------------------------------------------------------------
def test_run_local_ends_its_inputs_with_nothing_held(tmp_path: Path) -> None:
    # Before: the last events stayed held (lastProgress["held"] > 0) until an
    # event past them arrived on every input still delivering.
    stream = list(events(90, 4, 30, seed=7))
    batches = [stream[:30], stream[30:60], stream[60:]]  # both inputs in every batch
    for job in (ledger_job(merge=None), ledger_job(merge="event-time")):
        runner = job.run_local(batches, tmp_path / str(job._merge_chosen), 2)
        assert len(runner.stats) == 4 and runner.stats[-2]["held"] > 0  # held at the end ...
        assert runner.stats[-1]["held"] == 0 and runner.stats[-1]["events"] > 0  # ... then ran
        assert runner.held() == 0
        assert outcomes(tmp_path / str(job._merge_chosen)) == serial_oracle(stream)[1]
    # end_inputs=False leaves them held for a later run on the same store.
    kept = ledger_job(merge=None).run_local(batches, tmp_path / "kept", 2, end_inputs=False)
    assert kept.held() > 0
    assert kept.end_inputs()["held"] == 0 and kept.held() == 0
    assert outcomes(tmp_path / "kept") == serial_oracle(stream)[1]


def test_the_end_of_inputs_is_a_committed_batch_that_a_restart_keeps(tmp_path: Path) -> None:
    stream = list(events(60, 4, 30, seed=3))
    runner = ledger_job(merge=None).run_local(by_input(stream, "transfers"), tmp_path, 2)
    store = RuntimeStore(tmp_path)
    last = store.committed()[-1]
    assert last == runner.prev and store.commit_info(last).get("held", 0) == 0
    # a later run on the store goes on after it (late events run in their batch)
    more = [("deposits", {"acct": 0, "amount": 5, "id": 1000})]
    ledger_job(merge=None).run_local([more], tmp_path, 2)
    assert store.committed()[-1] == last + 1


# -- NaN and infinite order values -----------------------------------------------------
def ordered_two(a: Any = None, b: Any = None) -> tx.Job:
    """Two ordered inputs; each event emits its n and its place in the serial order."""

    def step(t: tx.Tx, e: dict[str, Any]) -> None:
        if t.read("c", e["k"]) is None:
            t.insert("c", {"k": e["k"], "seq": 0})
        t.increment("c", e["k"], "seq", 1)
        t.emit("o", {"n": e["n"], "seq": t.read("c", e["k"])["seq"]})

    return (
        tx.Job("two")
        .table("c", key="k")
        .input("a", a, keys="k", order="ts")
        .input("b", b, keys="k", order="ts")
        .output("o", schema="n long, seq long")
        .on("a", step)
        .on("b", step)
    )


ODD = [float("nan"), float("inf"), -float("inf"), Decimal("NaN"), Decimal("-Infinity")]


@pytest.mark.parametrize("merge", ["batch", "event-time"])
@pytest.mark.parametrize("odd", ODD, ids=str)
def test_a_non_finite_order_value_is_a_failure_that_moves_nothing(
    tmp_path: Path, merge: str, odd: Any
) -> None:
    # Before: refused the whole run (run_local); on Spark a NaN ran at an arbitrary
    # place under merge='batch' (scrambling its batch) and was held forever under
    # merge='event-time'; an infinity released or held every other event.
    batches = [
        [("a", {"k": 1, "n": 0, "ts": 1.0}), ("b", {"k": 1, "n": 1, "ts": odd})],
        [("a", {"k": 1, "n": 2, "ts": 3.0}), ("a", {"k": 1, "n": 3, "ts": 2.0})],
        [("b", {"k": 1, "n": 4, "ts": 2.5}), ("b", {"k": 1, "n": 5, "ts": 4.0})],
    ]
    with pytest.warns(tx.TransactionFailuresWarning, match="non-finite order value"):
        runner = ordered_two().option("merge", merge).run_local(batches, tmp_path, 1)
    got = [r["n"] for r in tx.read_output(tmp_path, "o")]
    serial = [0, 3, 2, 4, 5] if merge == "batch" else [0, 3, 4, 2, 5]
    assert got == serial
    assert [r["seq"] for r in tx.read_output(tmp_path, "o")] == [1, 2, 3, 4, 5]
    failures = tx.read_failures(tmp_path)
    assert [(f["position"], f["error"]) for f in failures] == [
        ("b#1", f"SchemaError: the event has a non-finite order value ({odd}); it was not run")
    ]
    assert runner.held() == 0
    stop = pytest.raises(tx.TxStreamError, match=r"b#1 failed: SchemaError: the event has a non-f")
    with stop, pytest.warns(tx.TransactionFailuresWarning):
        ordered_two().option("merge", merge).option("onError", "stop").run_local(
            batches, tmp_path / "stop", 1
        )


# -- the examples under adversarial hand-over --------------------------------------------
def sensor_alerts() -> Any:
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "examples" / "sensor_alerts.py"
    module_spec = importlib.util.spec_from_file_location("sensor_alerts_order", path)
    assert module_spec is not None and module_spec.loader is not None
    example = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(example)
    return example


@pytest.mark.parametrize("first", ["changes", "readings"])
def test_the_readme_quick_start_gives_the_serial_answer_whatever_the_hand_over(
    tmp_path: Path, first: str
) -> None:
    # README.md's quick start is examples/sensor_alerts.py's job (merge='event-time'):
    # one input's files all handed over before the other's.  Before, the input
    # handed over later was quiet for a batch and stopped holding the first back.
    example = sensor_alerts()
    data = tmp_path / "data"
    expected = example.generate(data, devices=6, files=6, per_file=30, seed=9)
    specs = [json.loads(line) for line in (data / "specs.json").read_text().splitlines()]
    job = example.job(specs, None, None)
    stream = [
        (name, json.loads(line))
        for name in ("changes", "readings")
        for p in sorted((data / name).glob("*.json"))
        for line in p.read_text().splitlines()
    ]
    runner = job.run_local(by_input(stream, first), tmp_path / "store", 2)
    assert tx.read_output(tmp_path / "store", "alerts") == expected
    assert runner.held() == 0


@pytest.mark.parametrize("engine", ["executors", "driver"])
def test_non_finite_order_values_on_spark_are_failures_that_move_no_frontier(
    spark: Any, tmp_path: Path, engine: str
) -> None:
    # Spark's JSON reader reads NaN and Infinity into a double column.  Before:
    # Spark's max() takes NaN as the largest double, so the frontier (the driver
    # engine's Spark job, the executors' barrier stage) became NaN and released
    # nothing; the NaN event was held forever and never reported.
    for name, lines in {
        "a": ['{"k": 1, "n": 0, "ts": 1.0}', '{"k": 1, "n": 2, "ts": 3.0}'],
        "b": ['{"k": 1, "n": 1, "ts": NaN}', '{"k": 1, "n": 4, "ts": 2.5}'],
        "c": ['{"k": 1, "n": 5, "ts": Infinity}', '{"k": 1, "n": 6, "ts": 2.0}'],
    }.items():
        (tmp_path / "in" / name).mkdir(parents=True)
        (tmp_path / "in" / name / "x.json").write_text("\n".join(lines) + "\n")

    def read(name: str) -> Any:
        folder = str(tmp_path / "in" / name)
        return spark.readStream.schema("k long, n long, ts double").json(folder)

    job = ordered_two(read("a"), read("b"))
    job.input("c", read("c"), keys="k", order="ts").on("c", lambda t, e: None)
    job.option("merge", "event-time").trigger(availableNow=True)
    with pytest.warns(UserWarning):  # the failures
        query = job.start(tmp_path / "ckpt", spark=spark, partitions=2, engine=engine)
        try:
            query.awaitTermination()
        finally:
            query.stop()
    # The frontier is min(3.0, 2.5, 2.0): 1.0 and 2.0 run (c's event emits nothing),
    # 3.0 and 2.5 are held; then the availableNow run ends its inputs: they run.
    assert query.recentProgress[0]["held"] == 2 and query.lastProgress["held"] == 0
    assert [r["n"] for r in tx.read_output(tmp_path / "ckpt", "o")] == [0, 4, 2]
    errors = sorted(
        (f["position"].split("#")[0], f["error"]) for f in tx.read_failures(tmp_path / "ckpt")
    )
    assert errors == [
        ("b", "SchemaError: the event has a non-finite order value (nan); it was not run"),
        ("c", "SchemaError: the event has a non-finite order value (inf); it was not run"),
    ]


def test_an_input_that_has_delivered_nothing_holds_the_others_until_it_is_quiet() -> None:
    from txstream.spark.runtime.merge import advance

    index = {"a": 0, "b": 1}
    # Before: an input counted only once it had delivered, so "a" ran ahead of a
    # "b" whose first events came in a later micro-batch, whatever idleBatches.
    bound, frontier = advance({}, {"a": 5.0}, 3, index)
    assert bound == (-math.inf, 0)
    bound, frontier = advance(frontier, {"a": 6.0}, 3, index)
    assert bound == (-math.inf, 0)
    bound, frontier = advance(frontier, {"a": 7.0}, 3, index)  # b quiet for 3 batches
    assert bound == (7.0, 0)
    bound, _ = advance(frontier, {"b": 6.5}, 3, index)
    assert bound == (6.5, 1)
    assert advance({}, {"a": 5.0}, 1, index)[0] == (5.0, 0)  # idleBatches=1: as before


class _Stream:
    """A Spark query's handle as TxQuery sees it: active or ended, no failure."""

    def __init__(self, active: bool) -> None:
        self.isActive = active
        self.drains = 0

    def processAllAvailable(self) -> None:
        self.drains += 1

    def awaitTermination(self, timeout: float | None = None) -> bool:
        return not self.isActive

    def exception(self) -> None:
        return None

    def stop(self) -> None:
        self.isActive = False

    @property
    def status(self) -> dict[str, bool]:
        return {"isTriggerActive": False, "isDataAvailable": False}


@pytest.mark.parametrize(
    ("trigger", "active", "drained", "end_inputs", "ends"),
    [
        ({"availableNow": True}, False, False, None, True),  # finished by itself
        ({"availableNow": True}, True, False, None, False),  # stopped before its end
        ({"processingTime": "0 seconds"}, True, False, None, False),  # paused
        ({"processingTime": "0 seconds"}, True, True, None, True),  # drained, then stopped
        ({"processingTime": "0 seconds"}, True, False, True, True),  # told to end
        ({"availableNow": True}, False, False, False, False),  # told not to
    ],
)
def test_stop_ends_the_inputs_of_a_run_that_read_all_its_input_and_only_then(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    trigger: dict[str, Any],
    active: bool,
    drained: bool,
    end_inputs: bool | None,
    ends: bool,
) -> None:
    from txstream.spark.runtime.query import TxQuery

    job = ledger_job(merge="event-time").trigger(**trigger)
    query = TxQuery(job, tmp_path, None, 2, "executors")
    query.query = stream = _Stream(active)
    ended: list[bool] = []
    monkeypatch.setattr(query, "_end_locked", lambda: ended.append(True))
    if drained:
        query.processAllAvailable()
    query.stop(end_inputs=end_inputs)
    assert ended == ([True] if ends else [])
    assert stream.drains == int(drained or bool(end_inputs))
    # Once stopped, a bounded run's awaitTermination() ends nothing more (nor a
    # stop() again): the store is given up, and a stop() before the run's end
    # must not pass for its end.
    query.awaitTermination()
    query.stop()
    assert ended == ([True] if ends else [])


def test_a_bounded_run_that_finished_by_itself_ends_when_awaited_or_drained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from txstream.spark.runtime.query import TxQuery

    for trigger, finished, call, ends in [
        ({"availableNow": True}, True, "awaitTermination", True),
        ({"availableNow": True}, True, "processAllAvailable", True),
        ({"availableNow": True}, False, "awaitTermination", False),  # (a timeout: running)
        ({"processingTime": "0 seconds"}, True, "awaitTermination", False),  # stopped by someone
        ({"processingTime": "0 seconds"}, False, "processAllAvailable", False),  # goes on
    ]:
        job = ledger_job(merge="event-time").trigger(**trigger)
        query = TxQuery(job, tmp_path, None, 2, "executors")
        query.query = _Stream(not finished)
        ended: list[bool] = []
        monkeypatch.setattr(query, "_end_locked", lambda ended=ended: ended.append(True))
        getattr(query, call)()
        assert ended == ([True] if ends else []), (trigger, call)
        query._lock.release()


def test_await_termination_returns_after_a_stop_in_another_thread_has_ended_the_inputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A sink's stop() runs in a thread of its own: Spark's query stops first, then
    # the inputs end.  The caller's awaitTermination() used to return in between,
    # and the outputs it then read lacked the end's batch.
    import threading

    from txstream.spark.runtime.query import TxQuery

    job = ledger_job(merge="event-time")
    query = TxQuery(job, tmp_path, None, 2, "executors")
    query.query = _Stream(active=True)
    entered, release = threading.Event(), threading.Event()
    happened: list[str] = []

    def end() -> None:
        entered.set()
        release.wait()
        happened.append("ended")

    monkeypatch.setattr(query, "_end_locked", end)
    stopper = threading.Thread(target=lambda: query.stop(end_inputs=True))
    stopper.start()
    entered.wait()  # Spark's query has stopped; the end runs
    waiter = threading.Thread(target=lambda: (query.awaitTermination(), happened.append("back")))
    waiter.start()
    waiter.join(0.2)  # (a slow machine only makes this check weaker, never fail)
    release.set()
    waiter.join()
    stopper.join()
    assert happened == ["ended", "back"]
