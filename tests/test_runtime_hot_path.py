"""The phase-1 hot path's shortcuts give exactly what the general code gives.

A phase-1 task makes a batch's events column by column in C
(``query._column_events``), writes an emitted row's JSON without the C
encoder (``executor._plain_members``) and reuses one ``Tx`` for every
transaction of a runner.  Each shortcut is checked here against the general
code it stands in for: the row loop, ``json.dumps``, a fresh ``Tx``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import txstream as tx
from txstream.spark.runtime import spark_tasks as q
from txstream.spark.runtime.base import RuntimeJobError
from txstream.spark.runtime.boundaries import Event, Group
from txstream.spark.runtime.executor import GroupRunner, PartitionExecutor
from txstream.spark.runtime.outcome import Outcome
from txstream.spark.runtime.partitioning import partition_of
from txstream.spark.runtime.state import PartitionState
from txstream.spark.runtime.tasks import BatchContext

P = 3
A = pa.struct([("k", pa.int64()), ("t", pa.float64()), ("v", pa.string())])
B = pa.struct([("x", pa.int64()), ("y", pa.string()), ("t", pa.float64())])
C = pa.struct([("g", pa.int64()), ("h", pa.string()), ("all", pa.bool_())])
COLUMNS = [
    ("__input", pa.int32()),
    ("__ordv", pa.float64()),
    ("__in0", A),
    ("__in1", B),
    ("__in2", C),
    ("__pids", pa.list_(pa.int32())),
    ("__mid", pa.int64()),
    ("__pid", pa.int32()),
    ("__copy", pa.bool_()),
]


def three_inputs() -> Any:
    """One key column; two keys; a composite key with a broadcast column (no order)."""
    job = (
        tx.Job("hot")
        .table("t", key="k")
        .input("a", None, keys="k", order="t")
        .input("b", None, keys=["x", "y"], order="t")
        .input("c", None, keys=[("g", "h")], broadcast="all")
    )
    for name in ("a", "b", "c"):
        job.on(name, lambda t, e: None)
    return job.spec.for_tasks()


def place(value: Any) -> int:
    return (
        -1
        if value is None or (isinstance(value, tuple) and None in value)
        else (partition_of(value, P))
    )


# Mostly good events: a batch with one event to report goes to the loop whole.
keys = st.integers(-3, 40) | st.integers(0, 9) | st.integers(2**40, 2**40 + 3) | st.none()
texts = st.sampled_from(["", "a", "é", "7", "x y", None])
finite = st.floats(-5, 5)
orders = finite | finite | finite | st.sampled_from([math.nan, math.inf, None])
rows = st.one_of(
    st.tuples(st.just(0), st.fixed_dictionaries({"k": keys, "t": orders, "v": texts})),
    st.tuples(st.just(1), st.fixed_dictionaries({"x": keys, "y": texts, "t": orders})),
    st.tuples(
        st.just(2),
        st.fixed_dictionaries({"g": keys, "h": texts, "all": st.sampled_from([None, False, True])}),
    ),
)


def arrow_batch(events: list[tuple[int, dict[str, Any]]], wrong: int | None) -> Any:
    """The rows a phase-1 task receives: each event's copy on the partition of its first value.

    ``wrong``: a partition Spark would give every value (as if it placed keys
    unlike Python), None for Python's placement.
    """
    cols: dict[str, list[Any]] = {name: [] for name, _ in COLUMNS}
    for mid, (inp, row) in enumerate(events):
        if inp == 0:
            values = [row["k"]]
        elif inp == 1:
            values = [row["x"], row["y"]]
        else:
            values = [] if row["all"] else [(row["g"], row["h"])]
        pids = [place(v) if wrong is None or place(v) < 0 else wrong for v in values]
        cols["__input"].append(inp)
        cols["__ordv"].append(row.get("t") if inp < 2 else 0.0)
        for j in range(3):
            cols[f"__in{j}"].append(row if j == inp else None)
        cols["__pids"].append(pids)
        cols["__mid"].append(mid)
        cols["__pid"].append(pids[0] if pids else mid % P)
        cols["__copy"].append(True)
    arrays = [pa.array(cols[name], type=kind) for name, kind in COLUMNS]
    return pa.RecordBatch.from_arrays(arrays, names=[name for name, _ in COLUMNS])


def phase1_events(
    monkeypatch: pytest.MonkeyPatch, store: Path, batches: list[Any], loop_only: bool
) -> tuple[dict[int, list[Event]], list[Any]]:
    """The events phase 1 hands each partition (and the failures it reports), or the error."""
    spec = three_inputs()
    names = {0: "a", 1: "b", 2: "c"}
    seen: dict[int, list[Event]] = {}
    failures: list[Any] = []

    def capture(
        job: Any, ctx: Any, pid: int, evs: list[Event], ordered: bool = False
    ) -> dict[str, Any]:
        if ordered:  # (then phase 1 does not sort them: they must be in order)
            assert [e.order for e in evs] == sorted(e.order for e in evs)
        seen[pid] = list(evs)
        stats = {"failures": [], "aborted": 0, "files": {}}
        return {"token": "t", "stats": stats, "rows": [], "events": []}

    with monkeypatch.context() as m:
        m.setattr(q, "phase1", capture)
        if loop_only:
            m.setattr(q, "_column_events", lambda *args: None)
        ctx = BatchContext(str(store), 2, 1, partitions=P)
        for out in q._phase1_outputs(spec, ctx, P, names, iter(batches)):
            failures.extend(__import__("pickle").loads(out["payload"])["stats"]["failures"])
    return seen, failures


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batches=st.lists(st.lists(rows, min_size=1, max_size=12), min_size=1, max_size=3),
    wrong=st.sampled_from([None, None, None, 1]),
)
def test_events_made_by_columns_equal_the_row_loops(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path_factory: pytest.TempPathFactory,
    batches: list[list[tuple[int, dict[str, Any]]]],
    wrong: int | None,
) -> None:
    # Nulls, NaN and infinite order values, composite keys, broadcast events and
    # keys Spark places unlike Python: whatever the row loop makes or reports,
    # the column path makes or reports the same (it hands such batches to the loop).
    q._PLACED.clear()
    arrow = [arrow_batch(b, wrong) for b in batches]
    outcomes = []
    for loop_only in (True, False):
        store = tmp_path_factory.mktemp("s")
        try:
            outcomes.append(phase1_events(monkeypatch, store, arrow, loop_only))
        except RuntimeJobError as exc:
            outcomes.append(("error", str(exc)))
    by_loop, by_columns = outcomes
    assert by_columns == by_loop
    # (type-exact: a value 1 must not come back as True or 1.0)
    if by_loop[0] != "error":
        loop_values = [repr(e.values) for evs in by_loop[0].values() for e in evs]
        column_values = [repr(e.values) for evs in by_columns[0].values() for e in evs]
        assert column_values == loop_values


def test_phase_1_is_told_which_partitions_events_came_in_order(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Events that came in their declared order (over every Arrow batch and slice
    # of one) are not sorted again; out of order, they are.
    q._PLACED.clear()
    told: list[tuple[int, bool, list[Any]]] = []

    def capture(
        job: Any, ctx: Any, pid: int, evs: list[Event], ordered: bool = False
    ) -> dict[str, Any]:
        told.append((pid, ordered, [e.row["v"] for e in evs]))
        return {
            "token": "t",
            "stats": {"failures": [], "aborted": 0, "files": {}},
            "rows": [],
            "events": [],
        }

    monkeypatch.setattr(q, "phase1", capture)

    def run(*batches: list[float]) -> list[tuple[int, bool, list[Any]]]:
        told.clear()
        ctx = BatchContext(str(tmp_path), 2, 1, partitions=P)
        arrow = [
            arrow_batch([(0, {"k": 1, "t": t, "v": f"{t}"}) for t in b], None) for b in batches
        ]
        q._phase1_outputs(three_inputs(), ctx, P, {0: "a", 1: "b", 2: "c"}, iter(arrow))
        return told

    pid = place(1)
    assert run([1.0, 2.0, 2.0, 3.0]) == [(pid, True, ["1.0", "2.0", "2.0", "3.0"])]
    assert run([1.0, 3.0, 2.0]) == [(pid, False, ["1.0", "3.0", "2.0"])]
    assert run([1.0, 2.0], [3.0, 4.0]) == [(pid, True, ["1.0", "2.0", "3.0", "4.0"])]
    assert run([1.0, 3.0], [2.0]) == [(pid, False, ["1.0", "3.0", "2.0"])]
    monkeypatch.setattr(q, "_SLICE", 2)  # (a batch is made into events in slices)
    assert run([1.0, 2.0, 2.0, 3.0, 4.0]) == [(pid, True, ["1.0", "2.0", "2.0", "3.0", "4.0"])]
    assert run([1.0, 2.0, 1.5, 3.0]) == [(pid, False, ["1.0", "2.0", "1.5", "3.0"])]


def test_a_key_placed_unlike_python_is_refused_even_when_the_worker_knows_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The worker remembers each checked key's partition across batches: a later
    # batch where Spark places the same key elsewhere is still refused, naming it.
    q._PLACED.clear()
    good = arrow_batch([(0, {"k": 5, "t": 1.0, "v": "a"})], None)
    seen, _ = phase1_events(monkeypatch, tmp_path / "1", [good], loop_only=False)
    assert [e.values for evs in seen.values() for e in evs] == [[5]]
    other = (partition_of(5, P) + 1) % P
    bad = arrow_batch([(0, {"k": 5, "t": 1.0, "v": "a"})], other)
    with pytest.raises(RuntimeJobError, match="place key 5 differently"):
        phase1_events(monkeypatch, tmp_path / "2", [bad], loop_only=False)


plain = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)


@settings(max_examples=200, deadline=None)
@given(
    row=st.dictionaries(st.text(max_size=6).filter(lambda c: c != "__order"), plain, max_size=5),
    order=st.tuples(st.floats(-1e6, 1e6), st.integers(0, 3), st.integers(0, 2**70)),
    times=st.sampled_from([1, 2]),
)
def test_an_emitted_line_is_json_dumps_of_the_row_and_its_order(
    row: dict[str, Any], order: tuple[float, int, int], times: int
) -> None:
    # (one emit takes a shorter path than several: both are checked)
    job = tx.Job("emit").table("t", key="k").input("i", None, keys="k").output("out")
    job.on("i", lambda t, e: [t.emit("out", e["row"]) for _ in range(times)])
    spec = job.spec.for_tasks()
    outcome = Outcome()
    runner = GroupRunner(spec, PartitionState(), outcome)
    emitted = dict(row)
    runner.run(Group("g", [Event(order, "i", {"k": 1, "row": emitted}, [1], [0])]), {})
    emitted["changed after emit"] = 1  # (the emitted copies do not see it)
    expected = [json.dumps({**row, "__order": [*order, seq]}, default=str) for seq in range(times)]
    assert outcome.outputs["out"] == expected


def test_a_transaction_after_a_global_read_reads_no_totals(tmp_path: Path) -> None:
    # One Tx serves every transaction of a runner: what a global read may do
    # (tx.sum) must not carry over to the keyed transaction that runs next.
    def audit(t: Any, e: dict[str, Any]) -> None:
        t.emit("totals", {"total": t.sum("acct", "bal")})

    def deposit(t: Any, e: dict[str, Any]) -> None:
        t.upsert("acct", {"id": e["id"], "bal": 1})
        t.emit("totals", {"total": t.sum("acct", "bal")})  # undeclared here

    job = (
        tx.Job("g")
        .table("acct", key="id", schema="id long, bal long")
        .input("audits", None, global_reads=["acct.bal"])
        .input("deposits", None, keys="id")
        .output("totals", schema="total long")
        .on("audits", audit)
        .on("deposits", deposit)
    )
    spec = job.spec.for_tasks()
    outcome = Outcome()
    runner = GroupRunner(spec, PartitionState(), outcome, partitions=1)
    runner.run(Group("a", [Event((0.0, 0, 0), "audits", {}, [], [0])]), {})
    runner.run(Group("d", [Event((1.0, 1, 1), "deposits", {"id": 7}, [7], [0])]), {})
    assert outcome.outputs["totals"] == ['{"total": 0, "__order": [0.0, 0, 0, 0]}']
    assert [f["txn"] for f in outcome.failures] == ["d"]
    assert "UndeclaredKeyError" in outcome.failures[0]["error"]


typed = st.fixed_dictionaries(
    {
        # (a long's range: beyond it, a SchemaError, see test_runtime_boundaries.py)
        "a": st.none() | st.integers(-(2**63), 2**63 - 1),
        "b": st.none() | st.text(max_size=6),
        "c": st.none() | st.integers(-5, 5) | st.floats(),
        "d": st.none() | st.booleans(),
    }
)


@settings(max_examples=200, deadline=None)
@given(row=typed, order=st.permutations(["a", "b", "c", "d"]))
def test_a_row_of_an_output_with_a_schema_is_checked_and_written_as_json_dumps(
    row: dict[str, Any], order: list[str]
) -> None:
    # Any order of the columns, NaN and infinities (the C encoder's spelling),
    # ints in a double column: the line is json.dumps of the row and its order.
    job = tx.Job("e").table("t", key="k").input("i", None, keys="k")
    job.output("out", schema="a long, b string, c double, d boolean")
    job.on("i", lambda t, e: t.emit("out", e["row"]))
    outcome = Outcome()
    runner = GroupRunner(job.spec.for_tasks(), PartitionState(), outcome)
    emitted = {name: row[name] for name in order}
    runner.run(Group("g", [Event((1.5, 0, 7), "i", {"k": 1, "row": emitted}, [1], [0])]), {})
    assert outcome.outputs["out"] == [json.dumps({**emitted, "__order": [1.5, 0, 7, 0]})]


@pytest.mark.parametrize(
    ("row", "error"),
    [
        ({"a": True, "b": "x", "c": 1.0, "d": None}, "column 'a' is long, got True"),
        ({"a": 1, "b": "x", "c": 1.0}, "missing columns ['d']"),
        ({"a": 1, "b": "x", "c": 1.0, "d": None, "e": 2}, "emit to out: unknown columns ['e']"),
        ({"a": 1, "b": "x", "c": 1.0, "e": None}, "missing columns ['d'], unknown columns ['e']"),
        ({"a": 1, "b": 2, "c": 1.0, "d": None}, "column 'b' is string, got 2"),
    ],
)
def test_a_row_that_does_not_fit_the_schema_fails_its_transaction(
    row: dict[str, Any], error: str
) -> None:
    job = tx.Job("e").table("t", key="k").input("i", None, keys="k")
    job.output("out", schema="a long, b string, c double, d boolean")
    job.on("i", lambda t, e: t.emit("out", e["row"]))
    outcome = Outcome()
    runner = GroupRunner(job.spec.for_tasks(), PartitionState(), outcome)
    runner.run(Group("g", [Event((1.5, 0, 7), "i", {"k": 1, "row": row}, [1], [0])]), {})
    assert "out" not in outcome.outputs
    assert len(outcome.failures) == 1
    assert "SchemaError" in outcome.failures[0]["error"]
    assert error in outcome.failures[0]["error"]


@pytest.mark.parametrize("row", [[1, 2], "text", None])
def test_a_row_that_is_no_dict_fails_its_transaction_by_name(row: Any) -> None:
    # To an output without a schema it failed with "AttributeError: 'list' object
    # has no attribute 'items'", naming neither emit nor the output.
    job = tx.Job("e").table("t", key="k").input("i", None, keys="k").output("out")
    job.on("i", lambda t, e: t.emit("out", e["row"]))
    outcome = Outcome()
    runner = GroupRunner(job.spec.for_tasks(), PartitionState(), outcome)
    runner.run(Group("g", [Event((1.5, 0, 7), "i", {"k": 1, "row": row}, [1], [0])]), {})
    [failure] = outcome.failures
    assert failure["error"] == (
        f"SchemaError: emit to out: a row is a dict of columns, not {type(row).__name__}"
    )


def test_a_batch_rolls_back_to_its_rows_whatever_its_transactions_did() -> None:
    # Phase 1 (the event boundary) keeps
    # each row's first pre-image of the batch: written twice in one transaction and
    # again in a later one, by a transaction that failed after a write, inserted.
    def change(t: Any, e: dict[str, Any]) -> None:
        k = e["k"]
        if e["op"] == "inc-delete":
            t.increment("t", k, "v", 1)
            t.delete("t", k)
        elif e["op"] == "inc-upsert":
            t.increment("t", k, "v", 10)
            t.upsert("t", {"k": k, "v": t.read("t", k)["v"] + 100})
        elif e["op"] == "insert":
            t.insert("t", {"k": k, "v": 0})
        else:  # (a failure after a write)
            t.increment("t", k, "v", 1000)
            raise ValueError("no")

    job = tx.Job("u").table("t", key="k", schema="k long, v long").input("i", None, keys="k")
    job.on("i", change)
    spec = job.spec.for_tasks()
    state = PartitionState()
    state.use_flat(frozenset({"t"}))
    state.begin(0)
    for k in range(5):
        state.put("t", k, k, {"k": k, "v": k})
    state.settle()
    before = sorted(state.all_rows("t"))
    ops = ["inc-upsert", "inc-upsert", "inc-delete", "fail", "insert", "fail", "inc-upsert"]
    keys = [1, 1, 2, 3, 7, 4, 7]
    events = [
        Event((float(n), 0, n), "i", {"k": k, "op": op}, [k], [0])
        for n, (k, op) in enumerate(zip(keys, ops, strict=True))
    ]
    state.begin(1)
    executor = PartitionExecutor(spec, 0, state, partitions=1)
    executor.run(1, events, {})
    assert executor.outcome.committed == 5 and executor.outcome.aborted == 2
    assert dict(state.all_rows("t")) == {
        0: {"k": 0, "v": 0},
        1: {"k": 1, "v": 221},
        3: {"k": 3, "v": 3},
        4: {"k": 4, "v": 4},
        7: {"k": 7, "v": 110},
    }
    assert {1, 2, 7} <= set(state.delta()["changes"]["t"][0])
    state.rollback()
    assert sorted(state.all_rows("t")) == before


def test_plain_events_count_in_the_latency_histogram(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Plain events run in GroupRunner.run_plain's own loop, which records each committed
    # one's arrival for the batch's latency histogram; a failed one is not counted.
    import time

    from txstream.spark.runtime import local, tasks

    seen: list[Any] = []
    run_batch = tasks.run_batch

    def spy(*args: Any, **kwargs: Any) -> Any:
        stats = run_batch(*args, **kwargs)
        seen.append(stats.get("latency"))
        return stats

    monkeypatch.setattr(tasks, "run_batch", spy)
    monkeypatch.setattr(local, "run_batch", spy)

    def put(t: tx.Tx, e: dict[str, Any]) -> None:
        if e["k"] == 7:
            raise ValueError("unlucky key")
        t.upsert("a", {"k": e["k"], "v": 1})

    job = (
        tx.Job("latency")
        .table("a", key="k", schema="k long, v long")
        .input("d", None, keys="k")
        .on("d", put)
        .option("arrivalTime", "sent")
    )
    sent = time.time() - 1.0
    job.run_local([[("d", {"k": k, "sent": sent}) for k in range(20)]], tmp_path, partitions=2)
    counted = sum(n for histogram in seen if histogram for n in histogram.values())
    assert counted == 19
