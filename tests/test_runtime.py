"""The partitioned runtime without Spark: the executor, boundaries, store and histories.

The local runner runs the same executor, store and driver loop as Spark
tasks; here it is checked against brute-force serial oracles (Hypothesis), and
its recorded histories with the project's own CSAO checker.  One test breaks
the executor on purpose and shows that both the oracle and the checker notice.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import txstream as tx
from txstream.bench.ledger import events, ledger_job, serial_oracle
from txstream.model import check
from txstream.spark.runtime import executor as executor_module
from txstream.spark.runtime import forward as forward_module
from txstream.spark.runtime.partitioning import partition_of
from txstream.spark.runtime.state import RuntimeStore, StoreError, StoreLockedError


def balances(store: Path, partitions: int) -> dict[int, int]:
    rs = RuntimeStore(store)
    last = rs.committed()[-1]
    out: dict[int, int] = {}
    for pid in range(partitions):
        state = rs.load(pid, last)
        for rows in state.data.get("accounts", {}).values():
            out.update({k: r["balance"] for k, r in rows.items()})
    return out


def split(stream: list[Any], sizes: list[int]) -> list[list[Any]]:
    out, i = [], 0
    for size in sizes:
        out.append(stream[i : i + size])
        i += size
    out.append(stream[i:])
    return [b for b in out if b]


@given(
    seed=st.integers(0, 10_000),
    accounts=st.integers(2, 12),
    cross=st.sampled_from([0, 20, 100]),
    partitions=st.integers(1, 4),
    sizes=st.lists(st.integers(1, 40), max_size=4),
    mode=st.sampled_from(["forward", "defer"]),
)
def test_ledger_equals_serial_execution_in_arrival_order(
    tmp_path_factory: pytest.TempPathFactory,
    seed: int,
    accounts: int,
    cross: int,
    partitions: int,
    sizes: list[int],
    mode: str,
) -> None:
    stream = list(events(60, accounts, cross, seed))
    store = tmp_path_factory.mktemp("ledger")
    job = ledger_job().option("recordHistory", True).option("crossPartition", mode)
    job.run_local(split(stream, sizes), store, partitions=partitions)
    balance, outcomes = serial_oracle(stream)
    got = [(r["id"], r["ok"]) for r in tx.read_output(store, "transfers_done")]
    assert got == outcomes
    assert balances(store, partitions) == balance
    assert sum(balance.values()) == sum(e["amount"] for n, e in stream if n == "deposits")
    verdict = check(tx.read_history(store), "csao")
    assert verdict.holds, verdict.evidence


@pytest.mark.parametrize("mode", ["forward", "defer"])
def test_multi_partition_transfers_run_forwarded_or_deferred_and_correct(
    tmp_path: Path, mode: str
) -> None:
    stream = list(events(400, 30, 50, seed=3))
    job = ledger_job().option("recordHistory", True).option("crossPartition", mode)
    stats = job.run_local([stream], tmp_path, 2).stats[0]
    if mode == "defer":
        assert stats["deferred"] > 0 and stats["forwarded"] == 0
    else:  # each one at its home, its other partition's rows forwarded there and back
        assert stats["deferred"] == 0 and stats["forwarded"] > 0
        assert stats["messages"] == 2 * stats["forwarded"]
    balance, outcomes = serial_oracle(stream)
    assert [(r["id"], r["ok"]) for r in tx.read_output(tmp_path, "transfers_done")] == outcomes
    assert balances(tmp_path, 2) == balance
    assert check(tx.read_history(tmp_path), "csao").holds


def test_a_broken_executor_is_caught_by_the_oracle_and_the_checker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # (the deferring executor; the forwarding one: the test below)
    # Run multi-partition transfers as if they were local, ignoring the values
    # other partitions hold: the per-value order breaks.  The evidence must fail.
    def run_everything_locally(self: Any, batch: int, evs: list[Any], abort: set[str]) -> None:
        self.outcome.events = len(evs)
        for group in self.job.boundary.groups(batch, evs, self.state.meta):
            if all(e.copy for e in group.events):
                self.runner.run(group, abort)

    monkeypatch.setattr(executor_module.PartitionExecutor, "run", run_everything_locally)
    monkeypatch.setattr(executor_module.Tx, "_check_value", lambda self, table, value: None)
    stream = list(events(300, 8, 100, seed=5))
    job = ledger_job().option("recordHistory", True).option("crossPartition", "defer")
    job.run_local([stream], tmp_path, 2)
    _, outcomes = serial_oracle(stream)
    got = [(r["id"], r["ok"]) for r in tx.read_output(tmp_path, "transfers_done")]
    assert got != outcomes
    assert not check(tx.read_history(tmp_path), "csao").holds


@pytest.mark.parametrize("tasks", [1, 2])
def test_a_broken_forwarding_is_caught_by_the_oracle_and_the_checker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tasks: int
) -> None:
    # A participant forwards its rows as soon as it sees the transaction, not when
    # the transaction is first in line for its values, and holds no place in line:
    # later transactions there run before the home's write-back.  Both must notice.
    enter = forward_module._Partition._enter

    def enter_without_waiting(self: Any, item: Any) -> None:
        if item.kind == "part" and not item.barrier:
            self.unfinished += 1
            self._start(item)
            return
        enter(self, item)

    monkeypatch.setattr(forward_module._Partition, "_enter", enter_without_waiting)
    stream = list(events(300, 8, 100, seed=5))
    job = ledger_job().option("recordHistory", True)
    job.run_local([stream], tmp_path, 2, tasks=tasks)
    _, outcomes = serial_oracle(stream)
    got = [(r["id"], r["ok"]) for r in tx.read_output(tmp_path, "transfers_done")]
    assert got != outcomes
    assert not check(tx.read_history(tmp_path), "csao").holds


def test_partition_of_spreads_values_and_is_stable() -> None:
    assert partition_of(7, 4) == partition_of(7, 4)
    assert {partition_of(v, 4) for v in range(100)} == {0, 1, 2, 3}
    assert partition_of(("a", 1), 8) == partition_of(("a", 1), 8)
    with pytest.raises(tx.RuntimeJobError, match="partition value"):
        partition_of(1.5, 2)


# -- transaction functions: errors, aborts, undeclared keys --------------------------
def counter_job(boundary: str = "event", **options: Any) -> tx.Job:
    def add(t: tx.Tx, e: dict[str, Any]) -> None:
        if t.read("counts", e["k"]) is None:
            t.insert("counts", {"k": e["k"], "n": 0})
        t.increment("counts", e["k"], "n", 1)
        t.emit("seen", {"k": e["k"], "ts": e["ts"]})
        if e.get("boom"):
            raise ValueError("boom")
        if e.get("stop"):
            t.abort("not today")
        if e.get("other") is not None:
            t.read("counts", e["other"])

    return (
        tx.Job("counter")
        .table("counts", key="k")
        .input("ev", None, keys="k", order="ts")
        .output("seen")
        .on("ev", add)
        .boundary(boundary, **options)
        .option("recordHistory", True)
    )


def counts(store: Path, partitions: int = 2) -> dict[Any, int]:
    rs = RuntimeStore(store)
    out: dict[Any, int] = {}
    for pid in range(partitions):
        for rows in rs.load(pid, rs.committed()[-1]).data.get("counts", {}).values():
            out.update({k: r["n"] for k, r in rows.items()})
    return out


def test_a_failing_transaction_is_rolled_back_and_reported_with_its_position(
    tmp_path: Path,
) -> None:
    batch = [
        ("ev", {"k": 1, "ts": 1}),
        ("ev", {"k": 1, "ts": 2, "boom": True}),
        ("ev", {"k": 2, "ts": 3, "stop": True}),
        ("ev", {"k": 1, "ts": 4, "other": 99}),
    ]
    counter_job().run_local([batch], tmp_path)
    assert counts(tmp_path) == {1: 1}
    assert [r["ts"] for r in tx.read_output(tmp_path, "seen")] == [1]
    failures = tx.read_failures(tmp_path)
    assert [(f["position"], f["kind"]) for f in failures] == [
        ("ev#1", "error"),
        ("ev#2", "abort"),
        ("ev#3", "error"),
    ]
    assert "ValueError: boom" in failures[0]["error"]
    assert "not today" in failures[1]["error"]
    assert "UndeclaredKeyError" in failures[2]["error"] and "99" in failures[2]["error"]


def test_a_timestamp_transaction_spanning_partitions_aborts_everywhere(tmp_path: Path) -> None:
    keys = [k for k in range(40) if partition_of(k, 2) == 0][:1] + [
        k for k in range(40) if partition_of(k, 2) == 1
    ][:1]
    a, b = keys
    batch = [
        ("ev", {"k": a, "ts": 1}),
        ("ev", {"k": b, "ts": 1}),
        ("ev", {"k": a, "ts": 2}),
        ("ev", {"k": b, "ts": 2, "boom": True}),
        ("ev", {"k": a, "ts": 3}),
    ]
    runner = counter_job("timestamp").run_local([batch], tmp_path)
    # ts=2 is one transaction with a part on each partition: b's part failed,
    # so a's part must not stay applied either.
    assert counts(tmp_path) == {a: 2, b: 1}
    assert [r["ts"] for r in tx.read_output(tmp_path, "seen")] == [1, 1, 3]
    assert runner.stats[0]["aborted"] >= 1
    assert check(tx.read_history(tmp_path), "csao").holds


def test_a_spanning_transaction_that_raises_is_reported_once_with_its_error(
    tmp_path: Path,
) -> None:
    a = next(k for k in range(40) if partition_of(k, 2) == 0)
    b = next(k for k in range(40) if partition_of(k, 2) == 1)
    batch = [
        ("ev", {"k": a, "ts": 1}),
        ("ev", {"k": b, "ts": 1}),
        ("ev", {"k": b, "ts": 1, "boom": True}),
    ]
    runner = counter_job("timestamp").run_local([batch], tmp_path)
    # One transaction failed, in the function of ev#2: that is what is reported
    # (once, as an error, so that onError=stop stops), not the re-run's abort of
    # each of its parts.
    expected = [("b0_t1d0", "error", "ev#2", "ValueError: boom")]
    failures = tx.read_failures(tmp_path)
    assert [(f["txn"], f["kind"], f["position"], f["error"]) for f in failures] == expected
    stats = runner.stats[0]["failures"]
    assert [(f["txn"], f["kind"], f["position"], f["error"]) for f in stats] == expected
    # onError=stop: run_local stops as a query does, after the batch committed.
    job = counter_job("timestamp").option("onError", "stop")
    with pytest.raises(tx.TxStreamError, match=r"transaction at ev#2 failed: ValueError: boom"):
        job.run_local([batch, [("ev", {"k": a, "ts": 2})]], tmp_path / "stop")
    assert tx.read_output(tmp_path / "stop", "seen") == tx.read_output(tmp_path, "seen")


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


def test_unknown_names_and_bad_declarations_fail_with_one_line() -> None:
    with pytest.raises(tx.UnknownNameError, match="unknown boundary 'hourly'"):
        tx.Job().boundary("hourly")
    with pytest.raises(tx.RuntimeJobError, match="positive finite"):
        tx.Job().boundary("seconds", seconds=float("nan"))
    with pytest.raises(tx.RuntimeJobError, match="'seconds': unknown option 'second'; it takes"):
        tx.Job().boundary("seconds", second=2)  # named, not an internal class's TypeError
    with pytest.raises(tx.RuntimeJobError, match="'timeslice': missing option 'of'"):
        tx.Job().boundary("timeslice", seconds=1)
    with pytest.raises(tx.RuntimeJobError, match="unknown option"):
        tx.Job().option("partitons", 2)
    with pytest.raises(tx.RuntimeJobError, match="no transaction function"):
        tx.Job().input("a", None, keys="k").validate()
    with pytest.raises(tx.RuntimeJobError, match="needs an order column"):
        tx.Job().input("a", None, keys="k").on("a", print).boundary("timestamp").validate()
    with pytest.raises(tx.RuntimeJobError, match="partition_by"):
        tx.Job().table("t", key="a", partition_by="b")


def test_rows_that_do_not_fit_the_schema_are_rejected(tmp_path: Path) -> None:
    stream = [("deposits", {"acct": 1, "amount": "ten", "id": 0})]
    ledger_job().run_local([stream], tmp_path, 1)
    (failure,) = tx.read_failures(tmp_path)
    assert "SchemaError" in failure["error"] and "balance" in failure["error"]


# -- the store: restarts, replays, damage, one owner -----------------------------------
def test_a_batch_replayed_after_a_crash_takes_effect_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = list(events(200, 10, 50, seed=9))
    batches = split(stream, [50, 50, 50])
    ledger_job().run_local(batches[:2], tmp_path, 2)
    # The third batch runs completely but dies before its commit marker.
    from txstream.spark.runtime import tasks

    def die(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(RuntimeStore, "commit", die)
    with pytest.raises(KeyboardInterrupt):
        ledger_job().run_local(batches[2:3], tmp_path, 2)
    monkeypatch.undo()
    assert tasks  # the real loop ran
    runner = tx.LocalRunner(ledger_job().spec, tmp_path, 2)
    assert runner.batch == 2  # the uncommitted batch runs again
    runner.run(batches[2:])
    balance, outcomes = serial_oracle(stream)
    assert [(r["id"], r["ok"]) for r in tx.read_output(tmp_path, "transfers_done")] == outcomes
    assert balances(tmp_path, 2) == balance


def test_a_damaged_state_file_is_reported_not_loaded(tmp_path: Path) -> None:
    ledger_job().run_local([list(events(50, 5, 0, seed=1))] * 1, tmp_path, 1)
    for path in (tmp_path / "state" / "p00000").glob("*.bin"):
        raw = bytearray(path.read_bytes())
        raw[-3] ^= 0x40
        path.write_bytes(bytes(raw))
    with pytest.raises(StoreError, match="checksum mismatch"):
        RuntimeStore(tmp_path).load(0, 0)


def test_a_second_owner_of_a_store_gets_one_line_naming_the_first(tmp_path: Path) -> None:
    lock = RuntimeStore(tmp_path).lock()
    try:
        code = (
            "import sys\n"
            "from txstream.spark.runtime.state import RuntimeStore, StoreLockedError\n"
            f"try:\n    RuntimeStore({str(tmp_path)!r}).lock()\n"
            "except StoreLockedError as e:\n    print(e); sys.exit(3)\n"
        )
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert result.returncode == 3
        assert "in use by pid" in result.stdout and str(__import__("os").getpid()) in result.stdout
    finally:
        lock.release()
    RuntimeStore(tmp_path).lock().release()
    with pytest.raises(StoreLockedError):
        held = RuntimeStore(tmp_path).lock()
        try:
            RuntimeStore(tmp_path).lock()
        finally:
            held.release()


def test_history_arrival_comes_from_the_declared_order_not_commit_order(tmp_path: Path) -> None:
    # Events arrive out of id order within the batch; the order column decides.
    stream = [
        ("deposits", {"acct": 1, "amount": 5, "id": 2}),
        ("deposits", {"acct": 1, "amount": 7, "id": 1}),
    ]
    ledger_job().option("recordHistory", True).run_local([stream], tmp_path, 1)
    text = tx.spark.runtime.history_text(tmp_path)
    arrival = next(line for line in text.splitlines() if line.startswith("arrival"))
    assert arrival.split(": ")[1].split() == ["b0_1", "b0_0"]
    assert json.loads(json.dumps(check(tx.read_history(tmp_path), "csao").holds))


def test_sinks_get_each_committed_batch_once_even_after_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[int, int]] = []
    stream = list(events(120, 6, 50, seed=2))
    batches = split(stream, [40, 40])

    def sink(batch: int, rows: list[dict[str, Any]]) -> None:
        calls.append((batch, len(rows)))

    ledger_job().sink("transfers_done", sink).run_local(batches[:2], tmp_path, 2)
    assert [b for b, _ in calls] == [0, 1]
    # The driver dies after batch 2 committed but before its sink delivery was recorded.
    from txstream.spark.runtime import sinks

    real = sinks.write_atomic
    monkeypatch.setattr(sinks, "write_atomic", lambda *a: (_ for _ in ()).throw(OSError("gone")))
    with pytest.raises(OSError):
        tx.LocalRunner(ledger_job().spec, tmp_path, 2).run(batches[2:])
        sinks.deliver(RuntimeStore(tmp_path), {"transfers_done": [sink]})
    monkeypatch.setattr(sinks, "write_atomic", real)
    sinks.deliver(RuntimeStore(tmp_path), {"transfers_done": [sink]})
    # Batch 2 was handed over again (a sink must be idempotent per batch id) and
    # nothing else was.
    assert [b for b, _ in calls] == [0, 1, 2, 2]
    total = sum(n for b, n in calls[:3])
    assert total == len(tx.read_output(tmp_path, "transfers_done"))


def test_a_running_job_delivers_a_new_batch_without_checking_every_batch_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each micro-batch looked at every batch ever committed (its commit marker
    # and sink record): 0.13 s per micro-batch after 20,000 of them, growing.
    # Now the start looks at them all (a crash may have left one undelivered),
    # then each batch delivers itself.
    listed: list[str] = []
    committed = RuntimeStore.committed

    def counted(store: RuntimeStore) -> list[int]:
        listed.append(sys._getframe(1).f_code.co_name)
        return committed(store)

    monkeypatch.setattr(RuntimeStore, "committed", counted)
    calls: list[int] = []
    job = ledger_job().sink("transfers_done", lambda batch, rows: calls.append(batch))
    job.run_local(split(list(events(120, 6, 50, seed=2)), [30, 30, 30]), tmp_path, 2)
    assert calls == [0, 1, 2, 3]
    assert listed.count("deliver") == 1


def test_postgres_sink_is_exactly_once_per_batch(tmp_path: Path) -> None:
    from txstream.loading.pgserver import PostgresServer, find_bindir

    if find_bindir() is None:
        pytest.fail("PostgreSQL server binaries missing: run scripts/pg-install.sh")
    server = PostgresServer().start()
    try:
        import psycopg

        sink = tx.PostgresSink(
            server.conninfo, "transfers", ["id", "ok"], types={"id": "bigint", "ok": "boolean"}
        )
        stream = list(events(150, 6, 50, seed=4))
        ledger_job().sink("transfers_done", sink).run_local(split(stream, [50, 50]), tmp_path, 2)
        sink(1, [{"id": -1, "ok": True}])  # a re-delivered batch is skipped
        with psycopg.connect(server.conninfo) as conn:
            got = conn.execute("SELECT id, ok FROM transfers ORDER BY id").fetchall()
        expected = sorted((r["id"], r["ok"]) for r in tx.read_output(tmp_path, "transfers_done"))
        assert [tuple(r) for r in got] == expected
    finally:
        server.stop()


# -- several inputs merged into one order across micro-batches ---------------------------
def specs_job(merge: str) -> tx.Job:
    def change(t: tx.Tx, c: dict[str, Any]) -> None:
        t.update("specs", c["device"], high=c["high"])

    def reading(t: tx.Tx, r: dict[str, Any]) -> None:
        if r["temp"] > t.read("specs", r["device"])["high"]:
            t.emit("alerts", {"device": r["device"], "ts": r["ts"]})

    return (
        tx.Job("specs")
        .table("specs", key="device", initial=[{"device": d, "high": 30.0} for d in "ABC"])
        .input("changes", None, keys="device", order="ts")
        .input("readings", None, keys="device", order="ts")
        .output("alerts")
        .boundary("timestamp")
        .on("changes", change)
        .on("readings", reading)
        .option("merge", merge)
        .option("recordHistory", True)
    )


def test_event_time_merge_holds_a_change_that_arrives_ahead_of_the_readings(
    tmp_path: Path,
) -> None:
    # The change to Fahrenheit (high 86) at ts 10 is handed over a batch early,
    # with readings up to ts 5 only; readings 6..12 come in the next batch.
    readings = [
        ("readings", {"device": "A", "temp": 50.0 if ts < 10 else 80.0, "ts": ts})
        for ts in range(13)
    ]
    batches = [
        [("changes", {"device": "A", "high": 86.0, "ts": 10}), *readings[:6]],
        readings[6:],
        [("readings", {"device": "B", "temp": 1.0, "ts": 20})],
    ]
    expected = [{"device": "A", "ts": ts} for ts in range(10)]  # 50 C > 30; 80 F < 86
    specs_job("event-time").run_local(batches, tmp_path / "merged", partitions=2)
    assert tx.read_output(tmp_path / "merged", "alerts") == expected
    assert check(tx.read_history(tmp_path / "merged"), "csao").holds
    # Batch order applies the change before readings 6..9: they are missed.
    specs_job("batch").run_local(batches, tmp_path / "batch", partitions=2)
    assert tx.read_output(tmp_path / "batch", "alerts") == expected[:6]


@given(
    seed=st.integers(0, 10_000),
    cuts=st.lists(st.integers(0, 30), min_size=2, max_size=6),
    partitions=st.integers(1, 3),
)
def test_event_time_merge_equals_serial_order_by_time_however_sources_split_batches(
    tmp_path_factory: pytest.TempPathFactory, seed: int, cuts: list[int], partitions: int
) -> None:
    import random

    rng = random.Random(seed)
    changes = [
        {"device": rng.choice("ABC"), "high": float(rng.randrange(20, 90)), "ts": ts}
        for ts in sorted(rng.sample(range(40), 5))
    ]
    readings = [
        {"device": rng.choice("ABC"), "temp": float(rng.randrange(0, 100)), "ts": ts}
        for ts in range(40)
    ]
    # Serial execution by time, changes first at equal times.
    high = dict.fromkeys("ABC", 30.0)
    expected = []
    for ts in range(40):
        for c in changes:
            if c["ts"] == ts:
                high[c["device"]] = c["high"]
        for r in readings:
            if r["ts"] == ts and r["temp"] > high[r["device"]]:
                expected.append({"device": r["device"], "ts": ts})

    # Each input is split into batches at its own random points, so one runs
    # ahead of the other; an input is quiet only once it has nothing left (the
    # premise of idleBatches=1).
    def chunks(items: list[Any], k: int) -> list[list[Any]]:
        points = sorted(rng.sample(range(1, len(items)), min(k, len(items)) - 1))
        return [items[x:y] for x, y in zip([0, *points], [*points, len(items)], strict=True)]

    change_chunks = chunks(changes, max(1, cuts[0] % 5))
    reading_chunks = chunks(readings, max(1, cuts[1] % 8))
    batches = [
        [("changes", c) for c in (change_chunks[i] if i < len(change_chunks) else [])]
        + [("readings", r) for r in (reading_chunks[i] if i < len(reading_chunks) else [])]
        for i in range(max(len(change_chunks), len(reading_chunks)))
    ]
    batches.append([])  # one quiet batch at the end releases what is still held
    store = tmp_path_factory.mktemp("merge")
    specs_job("event-time").run_local(batches, store, partitions=partitions)
    assert tx.read_output(store, "alerts") == expected
    assert check(tx.read_history(store), "csao").holds


def audit(t: Any, e: dict[str, Any]) -> None:
    # One fragment per partition: the sum of the balances placed here.
    total = sum(r["balance"] for v in t.values("accounts") for r in t.scan("accounts", v))
    t.emit("audits", {"audit": e["id"], "total": total})


def audited_ledger() -> tx.Job:
    return (
        ledger_job()
        .input("audits", None, keys=(), order="id")
        .output("audits", schema="audit long, total long")
        .on("audits", audit)
        .option("recordHistory", True)
    )


@given(
    seed=st.integers(0, 10_000),
    cross=st.sampled_from([0, 30, 100]),
    partitions=st.integers(1, 4),
    sizes=st.lists(st.integers(1, 40), max_size=3),
    every=st.integers(3, 15),
)
def test_keyless_fragments_read_each_partition_at_their_place_in_the_order(
    tmp_path_factory: pytest.TempPathFactory,
    seed: int,
    cross: int,
    partitions: int,
    sizes: list[int],
    every: int,
) -> None:
    # A keyless event runs as one fragment per partition; the fragments' partial
    # sums must add up to the total a serial execution has at the audit's place,
    # also when multi-partition transfers before it in the batch were deferred.
    stream: list[Any] = []
    for name, e in events(60, 10, cross, seed):
        stream.append((name, {**e, "id": 2 * e["id"]}))
        if e["id"] % every == 0:
            stream.append(("audits", {"id": 2 * e["id"] + 1}))
    store = tmp_path_factory.mktemp("audits")
    audited_ledger().run_local(split(stream, sizes), store, partitions=partitions)
    expected: dict[int, int] = {}
    for name, e in stream:
        if name == "audits":
            prefix = [(n, x) for n, x in stream if n != "audits" and x["id"] < e["id"]]
            expected[e["id"]] = sum(serial_oracle(prefix)[0].values())
    got: dict[int, int] = {}
    for r in tx.read_output(store, "audits"):
        got[r["audit"]] = got.get(r["audit"], 0) + r["total"]
    assert got == expected
    verdict = check(tx.read_history(store), "csao")
    assert verdict.holds, verdict.evidence


def test_values_is_only_for_keyless_events(tmp_path: Path) -> None:
    def peek(t: Any, e: dict[str, Any]) -> None:
        t.values("accounts")

    job = ledger_job().on("deposits", peek)
    job.run_local([[("deposits", {"acct": 1, "amount": 5, "id": 0})]], tmp_path, 2)
    (failure,) = tx.read_failures(tmp_path)
    assert "values('accounts') is for events of an input declared without keys" in failure["error"]


def test_a_worker_with_an_older_cached_state_catches_up_from_the_deltas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Spark runs a partition on whichever Python worker is free: a worker may hold
    # the partition as of a few batches ago.  It must catch up exactly (applying
    # the committed deltas) or reload, never run on the stale rows.
    import copy

    from txstream.spark.runtime import state as state_module

    stream = list(events(240, 12, 0, seed=9))
    batches = split(stream, [40] * 5)
    job = ledger_job()
    runner = job.run_local(batches[:2], tmp_path, 2)
    stale = {k: copy.deepcopy(v) for k, v in state_module._CACHE.items()}
    assert stale, "the local runner caches partition states"
    loads = []
    real_load = state_module.RuntimeStore.load
    monkeypatch.setattr(
        state_module.RuntimeStore,
        "load",
        lambda self, pid, upto, token=None: loads.append(pid) or real_load(self, pid, upto, token),
    )
    for batch in batches[2:4]:
        runner.run_batch(batch)
    state_module._CACHE.update(copy.deepcopy(stale))  # the workers of two batches ago
    for batch in batches[4:]:
        runner.run_batch(batch)
    assert loads == [], "caught up from the deltas, no reload"
    balance, outcomes = serial_oracle(stream)
    assert [(r["id"], r["ok"]) for r in tx.read_output(tmp_path, "transfers_done")] == outcomes
    assert balances(tmp_path, 2) == balance
    # A cached state that is no committed version at all is not used.
    for st_ in stale.values():
        st_.token = "not-a-committed-version"
    state_module._CACHE.update(stale)
    runner.run_batch([("deposits", {"acct": 1, "amount": 5, "id": 10_000})])
    assert loads, "an unknown version is reloaded from disk"


def run_on_random_workers(
    store: Path, stream: list[Any], sizes: list[int], placement: Any, monkeypatch: Any
) -> int:
    """Run the ledger with each phase-1 and phase-3 task on a random simulated worker.

    On Spark each task runs on whichever Python worker is free, and each worker
    keeps its own cached partition states: here three workers.  Returns how
    often a worker applied phase 3's patch to a cached copy or a reload.
    """
    from txstream.spark.runtime import local
    from txstream.spark.runtime import state as state_module

    workers: list[dict[Any, Any]] = [{}, {}, {}]

    def on_a_worker(fn: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            cache = state_module._CACHE
            mine = placement.choice(workers)
            cache.clear()
            cache.update(mine)
            try:
                return fn(*args, **kwargs)
            finally:
                mine.clear()
                mine.update(cache)
                cache.clear()

        return run

    patched: list[bool] = []
    real_apply = state_module.PartitionState.apply_patch

    def count(self: Any, patch: dict[str, Any]) -> bool:
        patched.append(real_apply(self, patch))
        return patched[-1]

    with monkeypatch.context() as m:
        m.setattr(local, "phase1", on_a_worker(local.phase1))
        m.setattr(local, "phase3", on_a_worker(local.phase3))
        m.setattr(state_module.PartitionState, "apply_patch", count)
        ledger_job().option("crossPartition", "defer").run_local(
            split(stream, sizes), store, partitions=2
        )
    return sum(patched)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    seed=st.integers(0, 10_000),
    cross=st.sampled_from([5.0, 30.0, 100.0]),
    sizes=st.lists(st.integers(1, 30), min_size=2, max_size=6),
    placement=st.randoms(use_true_random=False),
)
def test_phases_on_random_workers_give_the_serial_answer(
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    seed: int,
    cross: float,
    sizes: list[int],
    placement: Any,
) -> None:
    # Whatever the placement, a worker must catch up exactly (from phase 3's
    # patch, the deltas, or a reload), so the answers are the serial ones.
    stream = list(events(sum(sizes), 8, cross, seed=seed))
    store = tmp_path_factory.mktemp("workers")
    run_on_random_workers(store, stream, sizes, placement, monkeypatch)
    balance, outcomes = serial_oracle(stream)
    assert [(r["id"], r["ok"]) for r in tx.read_output(store, "transfers_done")] == outcomes
    assert balances(store, 2) == balance


def test_a_worker_that_ran_phase1_reads_phase3s_patch_not_the_whole_delta(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import random

    stream = list(events(200, 8, 30.0, seed=3))
    used = run_on_random_workers(tmp_path, stream, [25] * 8, random.Random(1), monkeypatch)
    assert used > 0
    balance, outcomes = serial_oracle(stream)
    assert [(r["id"], r["ok"]) for r in tx.read_output(tmp_path, "transfers_done")] == outcomes
    assert balances(tmp_path, 2) == balance


def broadcast_ledger() -> tx.Job:
    # Deposits and audits in ONE input: an audit row (audit=True) reaches every
    # partition as a keyless event does; a deposit goes to its account's partition.
    def event(t: Any, e: dict[str, Any]) -> None:
        if e["audit"]:
            audit(t, e)
            if t.home == 0:
                t.emit("once", {"audit": e["id"]})
        else:
            from txstream.bench.ledger import deposit

            assert t.home is None
            deposit(t, e)

    return (
        tx.Job("broadcast")
        .table("accounts", key="acct", schema="acct long, balance long")
        .input("events", None, keys="acct", order="id", broadcast="audit")
        .output("audits", schema="audit long, total long")
        .output("once", schema="audit long")
        .on("events", event)
        .option("recordHistory", True)
    )


@given(
    seed=st.integers(0, 10_000),
    partitions=st.integers(1, 4),
    sizes=st.lists(st.integers(1, 40), max_size=3),
    every=st.integers(2, 9),
)
def test_broadcast_rows_of_a_keyed_input_reach_every_partition_in_order(
    tmp_path_factory: pytest.TempPathFactory,
    seed: int,
    partitions: int,
    sizes: list[int],
    every: int,
) -> None:
    # The audit rows are mixed into the deposits' own input; each must run as one
    # fragment per partition at its place in the order (partial sums add up to the
    # serial total before it), and t.home == 0 picks exactly one fragment.
    stream: list[Any] = []
    for name, e in events(60, 10, 0, seed, deposit_pct=100.0):
        assert name == "deposits"
        stream.append(("events", {**e, "id": 2 * e["id"], "audit": False}))
        if e["id"] % every == 0:
            stream.append(("events", {"acct": None, "amount": 0, "id": 2 * e["id"] + 1,
                                      "audit": True}))  # fmt: skip
    store = tmp_path_factory.mktemp("broadcast")
    broadcast_ledger().run_local(split(stream, sizes), store, partitions=partitions)
    expected: dict[int, int] = {}
    total = 0
    for _, e in stream:
        if e["audit"]:
            expected[e["id"]] = total
        else:
            total += e["amount"]
    got: dict[int, int] = {}
    fragments: dict[int, int] = {}
    for r in tx.read_output(store, "audits"):
        got[r["audit"]] = got.get(r["audit"], 0) + r["total"]
        fragments[r["audit"]] = fragments.get(r["audit"], 0) + 1
    assert got == expected
    assert set(fragments.values()) <= {partitions}
    assert sorted(r["audit"] for r in tx.read_output(store, "once")) == sorted(expected)
    verdict = check(tx.read_history(store), "csao")
    assert verdict.holds, verdict.evidence


def test_broadcast_needs_keys_to_mean_something() -> None:
    with pytest.raises(tx.TxStreamError, match="broadcast='b' needs keys"):
        tx.Job("j").input("x", None, keys=(), broadcast="b")


def test_output_lines_are_json_dumps_of_the_rows() -> None:
    import datetime

    from txstream.spark.runtime.executor import _json_line

    rows = [
        {"id": 1, "ok": True, "__order": [1.5, 0, 7, 0]},
        {"s": 'é\n"', "n": None, "f": float("inf"), "nested": {"a": [1, 2.0]}},
        {"when": datetime.date(2026, 11, 25)},  # not JSON: as str, like default=str
    ]
    for row in rows:
        assert _json_line(row) == json.dumps(row, default=str)
    loop: dict[str, object] = {}
    loop["self"] = loop
    with pytest.raises(RecursionError):
        _json_line(loop)
    assert _json_line({"after": "a failed row"}) == '{"after": "a failed row"}'


def test_a_worker_that_ran_phase1_applies_phase3s_patch_and_loads_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Worker A runs batch 1's phase 1 of the partition; phase 3 of batch 1 (the
    # deferred transactions' rows taken back) writes a patch of the values it
    # rewrote. Batch 2's phase 1 lands on A again: A applies the patch (not the
    # snapshot or a whole delta: in the 1%-cross benchmark reloads took a quarter
    # of the workers' time) and ends with exactly what a reload gives.
    from txstream.spark.runtime import state as st

    store = RuntimeStore(tmp_path)
    key = (str(tmp_path), 0)
    state = store.state_for(0, 0, -1, None)
    for k in range(6):
        state.put("t", k % 3, k, {"k": k, "b": 0})
    t0 = store.save(0, state, 0, snapshot=True)
    store.commit(0, {"prev": -1}, {})
    state = store.state_for(0, 1, 0, t0)  # worker A, phase 1 of batch 1
    state.put("t", 0, 0, {"k": 0, "b": 1})
    state.put("t", 1, 1, st.ABSENT)
    t1 = store.save(0, state, 1, snapshot=False)
    worker_a = st._CACHE.pop(key)
    values = [(0, {"t": {6: {"k": 6, "b": "phase 3"}}}), (2, {"t": {}})]
    t3 = store.write_patch(0, 1, t1, values)  # phase 3, on any worker
    store.commit(1, {"prev": 0}, {})
    expected = store.load(0, 1)  # a full reload: the snapshot, the delta, the patch
    assert expected.token == t3
    assert expected.data["t"] == {0: {6: {"k": 6, "b": "phase 3"}}, 1: {4: {"k": 4, "b": 0}}}

    def no_reload(*args: object) -> None:
        raise AssertionError("reloaded the snapshot")

    st._CACHE[key] = worker_a
    with monkeypatch.context() as m:
        m.setattr(RuntimeStore, "load", no_reload)
        got = store.state_for(0, 2, 1, t3)
    assert got is worker_a and got.token == t3 and got.data == expected.data
    # A copy of another phase-1 version (an attempt that did not commit) gets no
    # patch: it is reloaded.
    discarded = st.PartitionState(
        data={"t": {0: {0: {"k": 0, "b": "a discarded attempt"}}}}, version=1, token="other"
    )
    st._CACHE[key] = discarded
    reloaded = store.state_for(0, 2, 1, t3)
    assert reloaded is not discarded and reloaded.data == expected.data
    assert not discarded.apply_patch({"parent": t1, "values": [], "token": "x"})
    st._CACHE.clear()


STREAM_FAILED = (
    "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: "
    "[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided "
    "function in foreach batch sink. Reason: An exception was raised by the Python "
    "Proxy. Return Message: Traceback (most recent call last):\n"
    '  File "py4j/clientserver.py", line 644, in _call_proxy\n'
)
"""How Spark's message of a failed foreachBatch function begins (abridged)."""


def test_a_python_failure_inside_spark_is_one_line_naming_its_cause() -> None:
    from txstream.spark.runtime.query import one_line

    # What Spark raises when a Python worker cannot unpickle the job's functions
    # (their module is not on the executors' path), abridged.
    text = (
        STREAM_FAILED
        + "pyspark.errors.exceptions.captured.PythonException: An exception was thrown "
        "from the Python worker:\n"
        "Traceback (most recent call last):\n"
        '  File "pyspark/serializers.py", line 483, in loads\n'
        "    return cloudpickle.loads(obj, encoding=encoding)\n"
        "ModuleNotFoundError: No module named 'myjob'\n"
        " SQLSTATE: 39000 SQLSTATE: XXKST\n"
        "=== Streaming Query ===\n"
        "Identifier: job [id = 1]\n"
    )
    assert one_line(RuntimeError(text)) == (
        "ModuleNotFoundError: No module named 'myjob' (Spark's Python workers unpickle "
        "the job's functions and import the modules they name: define them in the driver's "
        "script, ship their module with spark.sparkContext.addPyFile(path), or install it "
        "where the workers run)"
    )
    jvm = "[STREAM_FAILED] Query terminated: [FAILED_READ_FILE] x.json\n  at org.apache.Foo"
    assert one_line(RuntimeError(jvm)) == jvm.splitlines()[0]


def test_run_local_refuses_a_row_without_its_key_in_one_line_naming_it(tmp_path: Path) -> None:
    job = counter_job()
    with pytest.raises(tx.RuntimeJobError, match=r"^ev#b1\+1: the row has no key column 'k'$"):
        job.run_local(
            [[("ev", {"k": 1, "ts": 1})], [("ev", {"k": 2, "ts": 2}), ("ev", {"ts": 3})]], tmp_path
        )


def test_an_event_with_a_null_key_or_order_value_is_reported_not_run(tmp_path: Path) -> None:
    # A file source turns a missing or unreadable field into null: such an event
    # has no partition (or no place in the order). It is reported with its input
    # position like a failed transaction, and the batch goes on (Spark's phase-1
    # task does the same; it used to drop a null key silently and run a null
    # order value first).
    batch = [
        ("ev", {"k": 1, "ts": 1}),
        ("ev", {"k": None, "ts": 2}),
        ("ev", {"k": 1, "ts": None}),
        ("ev", {"k": 1, "ts": 4}),
    ]
    runner = counter_job().run_local([batch], tmp_path)
    failures = [(f["position"], f["error"]) for f in tx.read_failures(tmp_path)]
    assert failures == [  # in the declared order: a null order value counts as 0
        ("ev#2", "SchemaError: the event has a null order value; it was not run"),
        ("ev#1", "SchemaError: the event has a null key; it was not run"),
    ]
    assert runner.stats[0]["committed"] == 2 and runner.stats[0]["aborted"] == 2
    with pytest.raises(
        tx.TxStreamError, match="ev#2 failed: SchemaError: the event has a null order"
    ):
        counter_job().option("onError", "stop").run_local([batch], tmp_path / "stop")


@given(
    st.lists(st.lists(st.integers(0, 30), min_size=0, max_size=3), max_size=40),
    st.integers(1, 4),
)
def test_deferred_chains_split_phase_2_into_shares_with_disjoint_values(
    txns: list[list[int]], tasks: int
) -> None:
    # Each transaction: the values of its events (an empty list: a keyless event).
    from txstream.spark.runtime.boundaries import Event

    shipped = [
        (f"t{i}", Event((float(i), 0, i), "in", {}, values, [0] * len(values)))
        for i, values in enumerate(txns)
    ]
    rows = [(v, {"t": {}}) for v in sorted({v for values in txns for v in values})]
    shares = executor_module.deferred_chains(rows, shipped, tasks)
    assert len(shares) == tasks
    assert sorted(g for _, events in shares for g, _ in events) == sorted(g for g, _ in shipped)
    assert sorted(item[0] for share_rows, _ in shares for item in share_rows) == [
        item[0] for item in rows
    ]
    if any(not values for values in txns):  # a keyless fragment: one share runs everything
        assert all(not r and not e for r, e in shares[1:])
        return
    owner: dict[int, int] = {}
    for k, (share_rows, share_events) in enumerate(shares):
        for _, event in share_events:
            for value in event.values:  # a value's whole chain is in one share, with its rows
                assert owner.setdefault(value, k) == k
        for value, _ in share_rows:
            assert owner.get(value, k) == k
    assert shares == executor_module.deferred_chains(rows, shipped, tasks)  # every task agrees


def test_run_local_refuses_a_spark_querys_store_and_a_query_refuses_a_local_one(
    tmp_path: Path,
) -> None:
    # A Spark query's batches are Spark's micro-batches: a local batch committed in
    # its store would take the number of the query's next batch, which the query
    # would then skip as done (its rows lost). Each runner keeps to its own stores.
    stream = [("deposits", {"acct": 1, "amount": 5, "id": 0})]
    checkpoint = tmp_path / "ck"
    spark_store = RuntimeStore(checkpoint / "txstream")
    spark_store.root.mkdir(parents=True)
    (spark_store.root / "job.json").write_text('{"job": "x", "partitions": 2, "outputs": []}')
    spark_store.commit(0, {"prev": -1}, {})
    for path in (checkpoint, checkpoint / "txstream"):
        with pytest.raises(tx.TxStreamError, match="run_local needs a store"):
            ledger_job().run_local([stream], path, 2)
    assert spark_store.committed() == [0] and not (checkpoint / "commits").exists()
    # While a job holds the store, run_local waits for nothing: a one-line error.
    mine = tmp_path / "local"
    runner = ledger_job().run_local([stream], mine, 2)
    held = RuntimeStore(mine).lock()
    try:
        with pytest.raises(StoreLockedError):
            runner.run_batch(stream)
        with pytest.raises(StoreLockedError):
            ledger_job().run_local([stream], mine, 2)
    finally:
        held.release()
    runner.run_batch([("deposits", {"acct": 1, "amount": 5, "id": 1})])
    with pytest.raises(tx.RuntimeJobError, match="with 2 partitions"):
        ledger_job().run_local([stream], mine, 3)
    # ... and a Spark query does not start on a store of run_local (no JVM needed).
    for path in (mine, tmp_path / "ck2"):
        if path != mine:
            (path / "txstream").mkdir(parents=True)
            (path / "txstream" / "job.json").write_text((mine / "job.json").read_text())
        with pytest.raises(tx.TxStreamError, match="store of run_local"):
            ledger_job().start(path)


def test_the_sensor_alerts_example_gives_every_expected_alert_without_spark(
    tmp_path: Path,
) -> None:
    # The example's job (its own transaction functions) on its generated input,
    # handed over as its file sources would (2 files per input and micro-batch),
    # with run_local: every expected alert, none held back at the end of the input.
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "examples" / "sensor_alerts.py"
    module_spec = importlib.util.spec_from_file_location("sensor_alerts", path)
    assert module_spec is not None and module_spec.loader is not None
    example = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(example)
    data = tmp_path / "data"
    expected = example.generate(data, devices=6, files=12, per_file=40, seed=5)
    specs = [json.loads(line) for line in (data / "specs.json").read_text().splitlines()]
    job = example.job(specs, None, None)

    def files(name: str) -> list[list[tuple[str, Any]]]:
        paths = sorted((data / name).glob("*.json"))
        rows = [[(name, json.loads(x)) for x in p.read_text().splitlines()] for p in paths]
        return [[r for part in rows[i : i + 2] for r in part] for i in range(0, len(rows), 2)]

    readings, changes = files("readings"), files("changes")
    batches = [
        (readings[i] if i < len(readings) else []) + (changes[i] if i < len(changes) else [])
        for i in range(max(len(readings), len(changes)))
    ]
    job.run_local(batches, tmp_path / "store", 2)
    assert tx.read_output(tmp_path / "store", "alerts") == expected


def test_a_spark_failure_under_the_foreach_batch_function_is_one_line_naming_its_cause() -> None:
    from txstream.spark.runtime.query import one_line

    # What Spark raised when a string order column held ISO-8601 times: Spark's
    # first line ends in "Traceback (most recent call last):" and the cause is
    # the Spark error class of a job the function started (abridged).
    text = (
        STREAM_FAILED + "    return_value = getattr(self.pool[obj_id], method)(*params)\n"
        '  File "txstream/spark/runtime/query.py", line 632, in phase1\n'
        "    stats = [pickle.loads(r[0]) for r in rows.collect()]\n"
        '  File "pyspark/errors/exceptions/captured.py", line 262, in deco\n'
        "    raise converted from None\n"
        "pyspark.errors.exceptions.captured.NumberFormatException: [CAST_INVALID_INPUT] "
        "The value '2024-01-01T00:00:10' of the type \"STRING\" cannot be cast to "
        '"DOUBLE" because it is malformed. SQLSTATE: 22018\n'
        "== SQL (line 1, position 1) ==\n"
        "cast(`ts` as double)\n"
        "^^^^^^^^^^^^^^^^^^^^\n"
        "\n"
        " SQLSTATE: 39000 SQLSTATE: XXKST\n"
        "=== Streaming Query ===\n"
        "Identifier: job [id = 1]\n"
    )
    assert one_line(RuntimeError(text)) == (
        "[CAST_INVALID_INPUT] The value '2024-01-01T00:00:10' of the type \"STRING\" "
        'cannot be cast to "DOUBLE" because it is malformed.'
    )
    # A JVM failure under a Spark job the function started (no error class).
    jvm = text.split("pyspark.errors")[0] + (
        "py4j.protocol.Py4JJavaError: An error occurred while calling o97.collectToPython.\n"
        ": java.lang.OutOfMemoryError: Java heap space\n"
        "\tat java.base/java.util.Arrays.copyOf(Arrays.java:3537)\n"
        "=== Streaming Query ===\n"
    )
    assert one_line(RuntimeError(jvm)) == "java.lang.OutOfMemoryError: Java heap space"


class FakeStream:
    """A streaming DataFrame as far as ``job.start`` reads one before Spark starts: its schema."""

    isStreaming = True

    def __init__(self, ddl: str) -> None:
        from pyspark.sql import types as T

        kinds = {
            "int": T.IntegerType(),
            "long": T.LongType(),
            "double": T.DoubleType(),
            "decimal": T.DecimalType(12, 3),
            "string": T.StringType(),
            "boolean": T.BooleanType(),
            "timestamp": T.TimestampType(),
            "timestamp_ntz": T.TimestampNTZType(),
            "date": T.DateType(),
            "array<long>": T.ArrayType(T.LongType()),
        }
        pairs = [part.split() for part in ddl.split(",")]
        self.schema = T.StructType([T.StructField(name, kinds[kind]) for name, kind in pairs])
        self.columns = self.schema.names


def test_start_refuses_an_order_column_spark_cannot_order_by_before_anything_runs(
    tmp_path: Path,
) -> None:
    from txstream.spark.runtime.query import check_inputs, order_value

    def job(ddl: str, order: str = "ts") -> tx.Job:
        return (
            tx.Job("o")
            .input("e", FakeStream(ddl), keys="k", order=order)
            .on("e", lambda t, e: None)
        )

    # spark=object(): the check must come before Spark is used at all.
    with pytest.raises(tx.RuntimeJobError) as caught:
        job("k long, ts string").start(tmp_path / "ck", spark=object())
    message = str(caught.value)
    assert message.startswith(
        "input 'e': order column 'ts' is StringType; an order column is a number, a timestamp "
        "or a date: convert it first, e.g. df.withColumn('ts', F.to_timestamp('ts'))"
    )
    assert "\n" not in message and not (tmp_path / "ck").exists()
    for ddl in ("k long, ts timestamp_ntz", "k long, ts boolean", "k long, ts array<long>"):
        with pytest.raises(tx.RuntimeJobError, match=r"order column 'ts' is .*Type; an order"):
            check_inputs(job(ddl))
    with pytest.raises(tx.RuntimeJobError, match=r"order column 'x' is not in its schema \(k, ts"):
        check_inputs(job("k long, ts long", order="x"))
    for kind in ("int", "long", "double", "decimal", "timestamp", "date"):
        check_inputs(job(f"k long, ts {kind}"))
    # Spark casts a timestamp to its epoch seconds, but refuses to cast a date.
    date, stamp = (FakeStream(f"ts {kind}").schema["ts"].dataType for kind in ("date", "timestamp"))
    assert order_value("ts", date) == "cast(unix_date(`ts`) as double) * 86400"
    assert order_value("ts", stamp) == "cast(`ts` as double)"


def test_arrival_time_must_name_a_numeric_column_of_an_input(tmp_path: Path) -> None:
    from txstream.spark.runtime.query import check_inputs

    for bad in (5, "", None):
        with pytest.raises(tx.RuntimeJobError, match="option arrivalTime is the name of an input"):
            tx.Job().option("arrivalTime", bad)

    def job(arrival: str) -> tx.Job:
        return (
            tx.Job("a")
            .input("d", FakeStream("acct long, sent double, at timestamp"), keys="acct")
            .input("c", FakeStream("id long"))
            .on("d", lambda t, e: None)
            .on("c", lambda t, e: None)
            .option("arrivalTime", arrival)
        )

    with pytest.raises(tx.RuntimeJobError) as caught:
        check_inputs(job("nocol"))
    assert str(caught.value) == (
        "option arrivalTime names column 'nocol', which no input has (d: acct, sent, at; c: id)"
    )
    with pytest.raises(tx.RuntimeJobError, match="column 'at' of input 'd' is TimestampType"):
        check_inputs(job("at"))
    check_inputs(job("sent"))  # an input without the column: its events have no latency
    # run_local has rows, no schemas: the first batch with rows stands for them
    rows = [[], [("d", {"acct": 1, "sent": 5.0}), ("c", {"id": 2})]]
    with pytest.raises(tx.RuntimeJobError) as caught:
        job("snet").run_local(iter(rows), tmp_path / "typo", 1)
    assert str(caught.value) == (
        "option arrivalTime names column 'snet', which no row of the first batch has "
        "(its columns: acct, id, sent)"
    )
    runner = job("sent").run_local((iter(b) for b in rows), tmp_path / "ok", 1)
    assert runner.prev == 1  # both batches ran, the generators' rows included


def test_a_checkpoint_or_store_that_is_a_file_or_cannot_be_made_is_one_line(
    tmp_path: Path,
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("not a directory\n")
    job = tx.Job("c").input("e", FakeStream("k long"), keys="k").on("e", lambda t, e: None)
    with pytest.raises(StoreError, match=f"^checkpoint {afile} is a file; give a directory"):
        job.start(afile, spark=object())
    with pytest.raises(StoreError, match=f"^checkpoint {afile}/ck is under {afile}, which is a"):
        job.start(afile / "ck", spark=object())
    with pytest.raises(StoreError, match=f"^store {afile} is a file; give a directory"):
        counter_job().run_local([[("ev", {"k": 1, "ts": 1})]], afile)
    with pytest.raises(StoreError, match=f"^store {afile}/s is under {afile}, which is a file"):
        counter_job().run_local([[("ev", {"k": 1, "ts": 1})]], afile / "s")
    if Path("/proc/self").is_dir():  # a directory no one can create anything in
        with pytest.raises(StoreError, match=r"^checkpoint /proc/ck cannot be created"):
            job.start("/proc/ck", spark=object())
    assert afile.read_text() == "not a directory\n"


def test_every_reader_refuses_a_path_that_holds_no_job(tmp_path: Path) -> None:
    from txstream.spark.runtime import history_text

    empty = tmp_path / "empty"
    empty.mkdir()
    for path in (tmp_path / "nonexistent", empty):
        for read in (
            tx.read_failures,
            tx.read_history,
            history_text,
            lambda p: tx.read_output(p, "seen"),
        ):
            with pytest.raises(tx.TxStreamError, match="not a txstream checkpoint or store"):
                read(path)
    # A checkpoint whose job started but committed nothing yet: nothing, not an error.
    started = tmp_path / "ck" / "txstream"
    started.mkdir(parents=True)
    (started / "job.json").write_text(json.dumps({"job": "j", "partitions": 2, "outputs": ["o"]}))
    assert tx.read_failures(tmp_path / "ck") == [] and tx.read_output(tmp_path / "ck", "o") == []
    with pytest.raises(tx.TxStreamError, match="declared no output 'x'"):
        tx.read_output(tmp_path / "ck", "x")
    with pytest.raises(tx.TxStreamError, match="recorded no history"):
        tx.read_history(tmp_path / "ck")


def test_the_spark_handle_raises_the_class_of_the_error_that_failed_a_batch(
    tmp_path: Path,
) -> None:
    from txstream.spark.runtime.boundaries import GroupOrderError
    from txstream.spark.runtime.query import TxQuery

    job = counter_job("by", group=lambda e: e["g"])
    query = TxQuery(job, tmp_path, None, 2, "executors")
    refused = "batch 3: boundary 'by': the events of group 1 (...) and of group 2 (...) interleave"

    def run(df: Any, batch_id: int) -> None:
        raise GroupOrderError(refused)

    class FailedStream:  # what Spark raises once foreachBatch raised
        def processAllAvailable(self) -> None:
            raise RuntimeError(f"[STREAM_FAILED] ... Traceback ...\nGroupOrderError: {refused}")

        awaitTermination = processAllAvailable
        isActive = False

        def stop(self) -> None:
            pass

    query._run = run  # type: ignore[method-assign]
    with pytest.raises(GroupOrderError):
        query._on_batch(None, 3)  # in foreachBatch
    query.query = FailedStream()
    for call in (query.processAllAvailable, query.awaitTermination):
        with pytest.raises(GroupOrderError) as caught:
            call()
        assert str(caught.value) == refused and isinstance(caught.value, tx.RuntimeJobError)
        assert caught.value.__traceback__ is not None and caught.value.__cause__ is None
    assert query.status["failure"] == refused
    query.stop()


def test_event_ids_stay_unique_past_128_spark_input_splits_and_positions_name_the_split() -> None:
    # Spark's monotonically_increasing_id() is split index * 2**33 + row: with 40
    # bits for the place in a batch, row r of split 128 of batch b had the id of
    # row r of split 0 of batch b + 1 (a Kafka topic of 200 partitions does that).
    from txstream.spark.runtime.boundaries import MID_BITS, position

    def mid(batch: int, split: int, row: int) -> int:
        return (batch << MID_BITS) + (split << 33) + row

    ids = {mid(b, s, r) for b in range(3) for s in (0, 1, 127, 128, 2**30) for r in (0, 5)}
    assert len(ids) == 3 * 5 * 2
    assert position("readings", mid(0, 0, 17)) == "readings#17"
    assert position("readings", mid(3, 0, 17)) == "readings#b3+17"
    assert position("readings", mid(3, 1, 17)) == "readings#b3+p1.17"
    assert position("readings", mid(0, 200, 4)) == "readings#p200.4"


def test_start_refuses_a_batch_dataframe_in_one_line_before_spark_starts(tmp_path: Path) -> None:
    # Spark would refuse it only when the stream starts (WRITE_STREAM_NOT_ALLOWED).
    batch = FakeStream("k long, ts long")
    batch.isStreaming = False
    job = tx.Job("b").input("e", batch, keys="k", order="ts").on("e", lambda t, e: None)
    with pytest.raises(tx.RuntimeJobError, match=r"^input 'e' is a batch DataFrame; give a stre"):
        job.start(tmp_path / "ck", spark=object())
    assert not (tmp_path / "ck").exists()


def ordered_job(order: str = "ts") -> tx.Job:
    """Emits each event's n and its place in the declared order (one key, one partition)."""

    def step(t: tx.Tx, e: dict[str, Any]) -> None:
        if t.read("c", e["k"]) is None:
            t.insert("c", {"k": e["k"], "seq": 0})
        t.increment("c", e["k"], "seq", 1)
        t.emit("o", {"n": e["n"], "seq": t.read("c", e["k"])["seq"]})

    return (
        tx.Job("ordered")
        .table("c", key="k")
        .input("e", None, keys="k", order=order)
        .output("o", schema="n long, seq long")
        .on("e", step)
    )


def test_run_local_orders_a_date_column_by_day_as_spark_does(tmp_path: Path) -> None:
    import datetime as dt

    # test_a_date_order_column_orders_by_day runs the same rows on Spark.
    days = [dt.date(2024, 1, 3), dt.date(2024, 1, 1), dt.date(2024, 1, 2)]
    rows = [("e", {"k": 1, "n": n, "day": day}) for n, day in enumerate(days)]
    ordered_job("day").run_local([rows], tmp_path, 1)
    got = tx.read_output(tmp_path, "o", with_order=True)
    assert [(r["n"], r["seq"]) for r in got] == [(1, 1), (2, 2), (0, 3)]
    assert got[0]["__order"][1] == 1704067200.0  # 2024-01-01, midnight UTC in epoch seconds


def test_run_local_orders_timestamps_by_their_epoch_seconds_as_spark_does(tmp_path: Path) -> None:
    import datetime as dt
    from zoneinfo import ZoneInfo

    import pandas as pd

    utc = dt.UTC
    stamps = [
        dt.datetime(2024, 1, 1, 0, 0, 10, 250_000, tzinfo=utc),  # 1704067210.25
        dt.datetime(2024, 1, 1, 0, 0, 10),  # naive: read as UTC, 1704067210.0
        dt.datetime(2024, 1, 1, 0, 30, tzinfo=ZoneInfo("Europe/Paris")),  # 23:30 UTC the day before
        pd.Timestamp("2024-01-01 00:00:10.000001999"),  # nanoseconds go, as on Spark
        dt.datetime(1969, 12, 31, 23, 59, 59, 500_000, tzinfo=utc),  # before the epoch: -0.5
        pd.Timestamp("2024-01-01 01:00:05", tz="Europe/Paris"),  # 00:00:05 UTC
    ]
    rows = [("e", {"k": 1, "n": n, "ts": ts}) for n, ts in enumerate(stamps)]
    ordered_job().run_local([rows], tmp_path, 1)
    got = tx.read_output(tmp_path, "o", with_order=True)
    assert [(r["n"], r["__order"][1]) for r in got] == [
        (4, -0.5),
        (2, 1704065400.0),
        (5, 1704067205.0),
        (1, 1704067210.0),
        (3, 1704067210.000001),
        (0, 1704067210.25),
    ]
    assert [r["seq"] for r in got] == list(range(1, 7))


def test_run_local_orders_decimal_values_as_spark_casts_them(tmp_path: Path) -> None:
    from decimal import Decimal

    # before: refused ("is a Decimal"), while Spark orders a DecimalType column
    values = [Decimal("2.50"), Decimal("-1"), Decimal("0.1")]
    rows = [("e", {"k": 1, "n": n, "ts": v}) for n, v in enumerate(values)]
    ordered_job().run_local([rows], tmp_path, 1)
    got = tx.read_output(tmp_path, "o", with_order=True)
    assert [(r["n"], r["__order"][1]) for r in got] == [(1, -1.0), (2, 0.1), (0, 2.5)]
    # A NaN is a failure with its input position (tests/test_runtime_order.py), not run.
    with pytest.warns(tx.TransactionFailuresWarning, match=r"non-finite order value \(NaN\)"):
        ordered_job().run_local(
            [[("e", {"k": 1, "n": 0, "ts": Decimal("NaN")})]], tmp_path / "x", 1
        )


def test_run_local_reports_pandas_missing_time_as_a_null_order_value(tmp_path: Path) -> None:
    import pandas as pd

    rows = [("e", {"k": 1, "n": 0, "ts": pd.Timestamp("2024-01-01")})]
    rows.append(("e", {"k": 1, "n": 1, "ts": pd.NaT}))  # Spark reads NaT as null
    ordered_job().run_local([rows], tmp_path, 1)
    assert [(f["position"], f["error"]) for f in tx.read_failures(tmp_path)] == [
        ("e#1", "SchemaError: the event has a null order value; it was not run")
    ]
    assert [r["n"] for r in tx.read_output(tmp_path, "o")] == [0]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "2024-01-01T00:00:10",
            "e#0: order column 'ts' is a str ('2024-01-01T00:00:10'); an order column is a "
            "number, a timestamp or a date: convert it first, e.g. datetime.fromisoformat(text) "
            "for ISO-8601 times, or float(text) for numbers written as text",
        ),
        (
            True,
            "e#0: order column 'ts' is a bool (True); an order column is a number, a timestamp "
            "or a date: convert it first",
        ),
    ],
)
def test_run_local_refuses_an_order_value_spark_cannot_order_by_in_one_line(
    tmp_path: Path, value: Any, message: str
) -> None:
    # job.start refuses a string column in one line too, with a hint for DataFrames
    # (test_start_refuses_an_order_column_spark_cannot_order_by_before_anything_runs).
    with pytest.raises(tx.RuntimeJobError) as caught:
        ordered_job().run_local([[("e", {"k": 1, "n": 0, "ts": value})]], tmp_path, 1)
    assert str(caught.value) == message
    with pytest.raises(tx.RuntimeJobError, match=r"^e#0: the row has no order column 'ts'$"):
        ordered_job().run_local([[("e", {"k": 1, "n": 0})]], tmp_path / "other", 1)


def test_the_spark_handle_counts_every_committed_batch_past_its_recent_progress(
    tmp_path: Path,
) -> None:
    from txstream.spark.runtime.query import RECENT, TxQuery

    query = TxQuery(counter_job(), tmp_path, None, 2, "executors")
    try:
        for batch in range(RECENT + 50):
            query._progressed({"batchId": batch})
        # committedBatches was len(recentProgress): stuck at 100 in a long run.
        assert query.status["committedBatches"] == RECENT + 50
        assert len(query.recentProgress) == RECENT
        assert query.lastProgress == {"batchId": RECENT + 49}
    finally:
        query.stop()


def keyed_moves(composite: bool) -> tx.Job:
    """Counts per key (one event) and moves a count between two keys (two values)."""
    columns = ["a", "b"] if composite else ["k"]

    def bump(t: tx.Tx, e: dict[str, Any]) -> None:
        key = tuple(e[c] for c in columns) if composite else e["k"]
        if t.read("c", key) is None:
            t.insert("c", {**{c: e[c] for c in columns}, "n": 0, "wide": e["wide"]})
        t.emit("o", {"id": e["id"], "n": t.increment("c", key, "n", 1)})

    def move(t: tx.Tx, e: dict[str, Any]) -> None:
        src, dst = (tuple(e[c]) for c in ("src", "dst")) if composite else (e["src"], e["dst"])
        ok = t.read("c", src) is not None and t.read("c", dst) is not None
        if ok:
            t.increment("c", src, "n", -1)
            t.increment("c", dst, "n", 1)
        t.emit("o", {"id": e["id"], "n": 0 if ok else -1})

    keys: Any = [tuple(columns)] if composite else "k"
    moves: Any = [("s0", "s1"), ("d0", "d1")] if composite else ["src", "dst"]
    return (
        tx.Job("keyed")
        .table("c", key=columns)
        .input("bump", None, keys=keys, order="ts")
        .input("move", None, keys=moves, order="ts")
        .output("o")
        .on("bump", bump)
        .on("move", move)
    )


@given(data=st.data(), partitions=st.integers(1, 4), composite=st.booleans())
def test_string_composite_and_large_keys_with_tied_float_orders_run_as_serial_execution(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject, partitions: int, composite: bool
) -> None:
    # Keys beyond 64 bits, unicode text (the tuple separator U+001F too), 0 next
    # to "0", tuples; order values that tie across inputs and batches; wide rows.
    text = st.text(alphabet="a\x1f|é€ 😀0", max_size=3)
    big = st.integers(-(2**70), 2**70)
    key = st.tuples(text, big) if composite else st.one_of(big, text)
    keys = data.draw(st.lists(key, min_size=1, max_size=5, unique=True))
    ts = st.sampled_from([-2.25, 0.0, 1e-300, 0.5, 1.0, 1.5])
    wide = {f"c{i}": "é" * i for i in range(300)}
    rows: list[tuple[str, dict[str, Any]]] = []
    for i in range(data.draw(st.integers(1, 25))):
        if data.draw(st.booleans()):
            k = data.draw(st.sampled_from(keys))
            cols = {"a": k[0], "b": k[1]} if composite else {"k": k}
            rows.append(("bump", {**cols, "id": i, "ts": data.draw(ts), "wide": wide}))
        else:
            s, d = data.draw(st.sampled_from(keys)), data.draw(st.sampled_from(keys))
            move = {"src": s, "dst": d, "id": i, "ts": data.draw(ts)}
            if composite:
                move |= {"s0": s[0], "s1": s[1], "d0": d[0], "d1": d[1]}
            rows.append(("move", move))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(rows)), max_size=3)))
    batches = [rows[i:j] for i, j in zip([0, *cuts], [*cuts, len(rows)], strict=True)]
    # The serial oracle: batch, order value, input's declaration, position.
    counts: dict[Any, int] = {}
    expected = []
    placed = [
        ((b, e["ts"], n == "move", i), n, e)
        for b, rs in enumerate(batches)
        for i, (n, e) in enumerate(rs)
    ]
    for _, name, e in sorted(placed, key=lambda p: p[0]):
        k = (e["a"], e["b"]) if composite and name == "bump" else e.get("k")
        if name == "bump":
            counts[k] = counts.get(k, 0) + 1
            expected.append({"id": e["id"], "n": counts[k]})
        else:
            ok = e["src"] in counts and e["dst"] in counts
            if ok:
                counts[e["src"]] -= 1
                counts[e["dst"]] += 1
            expected.append({"id": e["id"], "n": 0 if ok else -1})
    store = tmp_path_factory.mktemp("keys")
    job = keyed_moves(composite).option("merge", "batch")  # (the oracle's order)
    job.run_local([b for b in batches if b], store, partitions)
    assert tx.read_output(store, "o") == expected
