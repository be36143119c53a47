"""Continuous loading without PostgreSQL or Spark: schema, operations, methods, embedded target.

The contract tests run against every loading method (parametrized fixtures);
Hypothesis compares small loads with the brute-force oracle (operations
applied serially, views recomputed from scratch).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txstream.errors import TxStreamError, UnknownNameError
from txstream.loading import (
    Aggregate,
    EmbeddedTarget,
    InvalidOperation,
    JoinView,
    Loader,
    LoadTransaction,
    Modification,
    Relation,
    Schema,
    SchemaError,
    Target,
    TargetSession,
    apply_serial,
    expected_state,
    get_method,
    preaggregate,
    validate,
    verify,
)
from txstream.loading.oracle import base_from_rows, check_loaded, differences
from txstream.loading.workloads import demand_schema, demand_stream, initial_rows

METHODS = ["naive", "partition", "reorder"]


def ab_schema() -> Schema:
    """A(id, j, v, t) and B(id, j, w), C(id, v): views over A-B (ordinary and aggregate)."""
    a = Relation(
        "a", {"id": "int", "j": "int", "v": "int", "t": "text"}, ("id",), aggregates=("v",)
    )
    b = Relation("b", {"id": "int", "j": "int", "w": "int"}, ("id",), aggregates=("w",))
    c = Relation("c", {"id": "int", "v": "int"}, ("id",), aggregates=("v",))
    views = [
        JoinView(
            "ab", ("a", "b"), (("a.j", "b.j"),), select=("a.id as aid", "b.id as bid", "a.v", "b.w")
        ),
        JoinView(
            "ab_sum",
            ("a", "b"),
            (("a.j", "b.j"),),
            group_by=("b.j as j",),
            aggregates=(
                Aggregate("count", None, "cnt"),
                Aggregate("sum", "a.v", "total"),
                Aggregate("avg", "b.w", "mean_w"),
            ),
        ),
    ]
    return Schema([a, b, c], views)


# -- schema and operations -------------------------------------------------------------------


def test_conflict_relation() -> None:
    s = ab_schema()
    assert s.conflicts("a") == {"b"}
    assert s.conflicts("b") == {"a"}
    assert s.conflicts("c") == frozenset()


@pytest.mark.parametrize(
    ("view", "message"),
    [
        (JoinView("v", ("a", "b"), (("a.nope", "b.j"),), select=("a.id",)), "unknown column"),
        (JoinView("v", ("a", "zz"), (("a.j", "zz.j"),), select=("a.id",)), "unknown relation"),
        (JoinView("v", ("a", "b"), (("a.j", "b.j"),), select=("b.missing",)), "unknown column"),
        (JoinView("v", ("a", "b", "c"), (("a.j", "b.j"),), select=("a.id",)), "not joined"),
        (JoinView("v", ("a",), (), select=("a.id",)), "at least two"),
        (
            JoinView(
                "v", ("a", "b"), (("a.j", "b.j"),), aggregates=(Aggregate("max", "a.v", "m"),)
            ),
            "not supported",
        ),
    ],
)
def test_bad_views(view: JoinView, message: str) -> None:
    base = ab_schema()
    with pytest.raises(SchemaError, match=message):
        Schema(base.relations.values(), [view])


def test_bad_relations() -> None:
    with pytest.raises(SchemaError, match="not a column"):
        Relation("r", {"x": "int"}, ("y",))
    with pytest.raises(SchemaError, match="type"):
        Relation("r", {"x": "blob"}, ("x",))
    with pytest.raises(SchemaError, match="aggregate"):
        Relation("r", {"x": "int", "s": "text"}, ("x",), aggregates=("s",))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"relation": "nope", "op": "insert", "values": {"id": 1}}, "unknown relation"),
        ({"relation": "a", "op": "insert", "values": {"j": 1}}, "missing key"),
        ({"relation": "a", "op": "frob", "values": {"id": 1}}, "unknown operation"),
        ({"relation": "a", "op": "increment", "values": {"id": 1, "j": 2}}, "not an aggregate"),
        ({"relation": "a", "op": "insert", "values": {"id": "x"}}, "not an int"),
        ({"relation": "a", "op": "insert", "values": {"id": 1, "zz": 1}}, "unknown column"),
        ("{not json", "not JSON"),
        (42, "object"),
    ],
)
def test_bad_operations(raw: Any, message: str) -> None:
    with pytest.raises(InvalidOperation, match=message):
        validate(ab_schema(), raw)


def test_json_round_trip() -> None:
    s = ab_schema()
    op = validate(s, '{"relation": "a", "op": "insert", "values": {"id": 3, "j": 1, "v": 5}}')
    assert op.key == (3,) and op.fields() == {"j": 1, "v": 5, "t": None}
    assert validate(s, op.to_json(s)) == op


def test_bad_parameters() -> None:
    target = EmbeddedTarget(ab_schema())
    target.setup()
    with pytest.raises(TxStreamError, match="sessions"):
        Loader(target, "reorder", sessions=0)
    with pytest.raises(TxStreamError, match="grouping"):
        Loader(target, "reorder", grouping=0)
    with pytest.raises(UnknownNameError, match="loading method"):
        Loader(target, "fastest")
    with pytest.raises(TxStreamError, match="TS"):
        get_method("reorder", starvation_ts=0)


def test_bad_operations_rejected_rest_loads() -> None:
    s = ab_schema()
    target = EmbeddedTarget(s)
    target.setup()
    raw = [
        {"relation": "a", "op": "insert", "values": {"id": 1, "j": 1, "v": 2}},
        {"relation": "ghost", "op": "insert", "values": {"id": 1}},
        {"relation": "b", "op": "insert", "values": {"id": 1, "j": 1, "w": 3}},
        {"relation": "b", "op": "insert", "values": {"j": 1}},
        "garbage",
    ]
    with Loader(target, "reorder", sessions=2, grouping=2) as loader:
        report = loader.load(raw)
    assert report.operations == 2
    assert [i for i, _ in report.rejected] == [1, 3, 4]
    assert "unknown relation 'ghost'" in report.rejected[0][1]
    assert "missing key" in report.rejected[1][1]
    state = target.state()
    assert not verify(s, state)
    assert state.views["ab"] == {(1, 1, 2, 3): 1}


# -- pre-aggregation ------------------------------------------------------------------------


def inc(rel: str, key: int, **amounts: int) -> Modification:
    return Modification(rel, "increment", (key,), tuple(sorted(amounts.items())))


def test_preaggregate_combines_and_drops_zero() -> None:
    s = ab_schema()
    ops = [inc("a", 1, v=2), inc("a", 2, v=1), inc("a", 1, v=3), inc("a", 2, v=-1)]
    out = preaggregate(s, ops)
    assert out == [inc("a", 1, v=5)]


def test_preaggregate_keeps_order_around_inserts() -> None:
    s = ab_schema()
    ins = Modification("a", "insert", (1,), (("j", 1), ("t", None), ("v", 0)))
    ops = [inc("a", 1, v=2), ins, inc("a", 1, v=3), inc("a", 1, v=4)]
    out = preaggregate(s, ops)
    assert out == [inc("a", 1, v=2), ins, inc("a", 1, v=7)]


def test_preaggregate_upserts() -> None:
    s = ab_schema()
    up = Modification("a", "upsert", (1,), (("j", 1), ("t", "x"), ("v", 2)))
    up2 = Modification("a", "upsert", (1,), (("j", 1), ("t", "y"), ("v", -2)))
    out = preaggregate(s, [up, inc("a", 1, v=5), up2])
    assert out == [Modification("a", "upsert", (1,), (("j", 1), ("t", "y"), ("v", 5)))]


# -- strategies for small workloads ---------------------------------------------------------

KEYS = st.integers(0, 4)
JOIN = st.integers(0, 2)
SMALL = st.integers(-3, 3)


def a_ops() -> st.SearchStrategy[Modification]:
    return st.one_of(
        st.builds(
            lambda k, j, v: Modification("a", "insert", (k,), (("j", j), ("t", "x"), ("v", v))),
            KEYS,
            JOIN,
            SMALL,
        ),
        st.builds(lambda k: Modification("a", "delete", (k,), ()), KEYS),
        st.builds(lambda k, j: Modification("a", "update", (k,), (("j", j),)), KEYS, JOIN),
        st.builds(lambda k, v: inc("a", k, v=v), KEYS, SMALL),
        st.builds(
            lambda k, j, v: Modification("a", "upsert", (k,), (("j", j), ("t", "u"), ("v", v))),
            KEYS,
            JOIN,
            SMALL,
        ),
    )


def b_ops() -> st.SearchStrategy[Modification]:
    return st.one_of(
        st.builds(
            lambda k, j, w: Modification("b", "insert", (k,), (("j", j), ("w", w))),
            KEYS,
            JOIN,
            SMALL,
        ),
        st.builds(lambda k: Modification("b", "delete", (k,), ()), KEYS),
        st.builds(lambda k, w: inc("b", k, w=w), KEYS, SMALL),
        st.builds(lambda k, v: inc("c", k, v=v), KEYS, SMALL),
    )


OPS = st.lists(st.one_of(a_ops(), b_ops()), max_size=40)
INITIAL = {
    "a": [{"id": i, "j": i % 3, "v": i, "t": "init"} for i in range(3)],
    "b": [{"id": i, "j": (i + 1) % 3, "w": 10 * i} for i in range(3)],
    "c": [{"id": i, "v": 0} for i in range(5)],
}


def load_and_compare(
    target: Target, ops: list[Modification], method: str, k: int, n: int, pre: bool
) -> None:
    s = target.schema
    target.setup()
    target.bulk_load(INITIAL)
    with Loader(target, method, sessions=k, grouping=n, preaggregate=pre, seed=k * n) as loader:
        report = loader.load(ops)
    assert report.operations == len(ops)
    state = target.state()
    assert not verify(s, state)
    expected = expected_state(s, apply_serial(s, ops, base_from_rows(s, INITIAL)))
    assert not differences(s, state, expected)


@settings(max_examples=40)
@given(ops=OPS, k=st.integers(1, 4), n=st.integers(1, 5), pre=st.booleans())
@pytest.mark.parametrize("method", ["partition", "reorder"])
def test_embedded_matches_serial_oracle(
    method: str, ops: list[Modification], k: int, n: int, pre: bool
) -> None:
    """Operations on one tuple keep their order, so the result is the serial one."""
    load_and_compare(EmbeddedTarget(ab_schema()), ops, method, k, n, pre)


COMMUTING = st.lists(
    st.one_of(
        st.builds(lambda k, v: inc("a", k, v=v), st.integers(0, 2), SMALL),
        st.builds(lambda k, w: inc("b", k, w=w), st.integers(0, 2), SMALL),
        st.builds(lambda k, v: inc("c", k, v=v), KEYS, SMALL),
    ),
    max_size=40,
)


@settings(max_examples=30)
@given(ops=COMMUTING, k=st.integers(1, 4), n=st.integers(1, 5), pre=st.booleans())
def test_embedded_naive_commuting_matches_oracle(
    ops: list[Modification], k: int, n: int, pre: bool
) -> None:
    """naive may reorder operations on one tuple: exact only for commuting ones."""
    load_and_compare(EmbeddedTarget(ab_schema()), ops, "naive", k, n, pre)


# -- the method contract, against every method -------------------------------------------------


class ProbeTarget(EmbeddedTarget):
    """The embedded target, recording which relations are being loaded at each moment."""

    def __init__(self, schema: Schema, delay: float) -> None:
        super().__init__(schema, statement_delay=delay)
        self.mutex = threading.Lock()
        self.running: dict[str, int] = {}
        self.overlaps = 0
        self.log: list[tuple[float, str, int, str]] = []

    def connect(self, slot: int, slots: int) -> TargetSession:
        inner = super().connect(slot, slots)
        probe = self

        class Session(TargetSession):
            def execute(self, txn: LoadTransaction, statements: list[Modification]) -> bool:
                with probe.mutex:
                    if any(probe.running.get(o) for o in probe.schema.conflicts(txn.relation)):
                        probe.overlaps += 1
                    probe.running[txn.relation] = probe.running.get(txn.relation, 0) + 1
                    probe.log.append((time.monotonic(), "start", txn.seq, txn.relation))
                try:
                    return inner.execute(txn, statements)
                finally:
                    with probe.mutex:
                        probe.running[txn.relation] -= 1
                        probe.log.append((time.monotonic(), "end", txn.seq, txn.relation))

        return Session()


@pytest.fixture(params=METHODS)
def method(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_contract_every_operation_once(method: str) -> None:
    s = demand_schema(aggregate_view=True)
    init = initial_rows(30, seed=3)
    ops = demand_stream(600, 30, seed=4)
    target = ProbeTarget(s, delay=0.0002)
    target.setup()
    target.bulk_load(init)
    with Loader(target, method, sessions=4, grouping=8) as loader:
        report = loader.load(ops)
    assert report.operations == 600
    assert report.transactions == sum(1 for e in target.log if e[1] == "end") - report.retries
    expected = expected_state(s, apply_serial(s, ops, base_from_rows(s, init)))
    assert not differences(s, target.state(), expected)
    if method == "reorder":
        assert target.overlaps == 0, "reorder ran conflicting relations at once"
        assert report.deadlocks == 0


def test_contract_take_done_protocol(method: str) -> None:
    s = ab_schema()
    m = get_method(method)
    m.bind(s, 2, seed=1)
    ops = [Modification("a", "insert", (i,), (("j", 0), ("t", None), ("v", 0))) for i in range(4)]
    txns = [LoadTransaction(i, m.assign(op, op.key), "a", [op]) for i, op in enumerate(ops)]
    for t in txns:
        m.enqueue(t)
    m.close()
    seen = []
    for session in range(2):
        while (t := m.take(session, timeout=0.1)) is not None:
            assert t.session == session
            seen.append(t.seq)
            m.done(t)
        assert m.drained(session)
    assert sorted(seen) == [0, 1, 2, 3]
    with pytest.raises(TxStreamError):
        m.enqueue(txns[0])


def test_reorder_runs_only_desirable_transactions() -> None:
    s = ab_schema()
    m = get_method("reorder")
    m.bind(s, 2, seed=0)
    a = LoadTransaction(0, 0, "a", [])
    b = LoadTransaction(1, 1, "b", [])
    c = LoadTransaction(2, 1, "c", [])
    for t in (a, b, c):
        m.enqueue(t)
    assert m.take(0, timeout=0) is a
    # b conflicts with running a; c (no join view) is desirable and jumps ahead
    assert m.take(1, timeout=0) is c
    m.done(c)
    assert m.take(1, timeout=0) is None
    m.done(a)  # J_a drops to zero: b becomes desirable
    assert m.take(1, timeout=0) is b


def test_starvation_prevention_header_transaction() -> None:
    """A stream of A transactions keeps J_a > 0; the header transaction lets B in."""
    s = ab_schema()

    def b_finish_position(ts: float) -> tuple[int, int]:
        target = ProbeTarget(s, delay=0.004)
        target.setup()
        ops: list[Modification] = [
            Modification("a", "insert", (i,), (("j", 9), ("t", None), ("v", 0))) for i in range(8)
        ]
        ops.append(Modification("b", "insert", (0,), (("j", 9), ("w", 1))))
        ops += [
            Modification("a", "insert", (i,), (("j", 9), ("t", None), ("v", 0)))
            for i in range(8, 120)
        ]
        with Loader(target, "reorder", sessions=3, grouping=1, starvation_ts=ts) as loader:
            report = loader.load(ops)
        assert report.deadlocks == 0 and target.overlaps == 0
        ends = [e for e in target.log if e[1] == "end"]
        b_pos = next(i for i, e in enumerate(ends) if e[3] == "b")
        return b_pos, len(ends)

    late, total = b_finish_position(ts=60.0)
    early, _ = b_finish_position(ts=0.02)
    assert late >= total - 3  # without a header, B waits for the whole A stream
    assert early < total // 2


# -- the embedded target on the paper's workload -----------------------------------------------


def test_embedded_state_check_helper() -> None:
    s = demand_schema()
    init = initial_rows(20)
    ops = demand_stream(200, 20, seed=9)
    target = EmbeddedTarget(s)
    target.setup()
    target.bulk_load(init)
    with Loader(target, "partition", sessions=3, grouping=4) as loader:
        loader.load(ops)
    assert check_loaded(target, init, ops) == []


def test_ledger_skips_committed_transactions() -> None:
    s = demand_schema()
    init = initial_rows(20)
    ops = demand_stream(300, 20, seed=5)
    target = EmbeddedTarget(s)
    target.setup()
    target.bulk_load(init)
    with Loader(target, "reorder", sessions=3, grouping=8) as loader:
        first = loader.load(ops, batch_id=7)
        again = loader.load(ops, batch_id=7)
    assert first.transactions > 0 and first.skipped == 0
    assert again.transactions == 0 and again.skipped == first.transactions
    assert check_loaded(target, init, ops) == []


@pytest.mark.parametrize(("k", "n"), [(16, 128), (8, 32), (2, 1)])
def test_embedded_reorder_never_deadlocks_and_loads_exactly(k: int, n: int) -> None:
    s = demand_schema(aggregate_view=True)
    init = initial_rows(200, seed=5)
    ops = demand_stream(max(2000, 4 * k * n), 200, seed=6)
    target = EmbeddedTarget(s)
    target.setup()
    target.bulk_load(init)
    with Loader(target, "reorder", sessions=k, grouping=n, seed=1) as loader:
        report = loader.load(ops)
    assert report.deadlocks == 0 and report.operations == len(ops)
    expected = expected_state(s, apply_serial(s, ops, base_from_rows(s, init)))
    assert not differences(s, target.state(), expected)


def test_embedded_naive_deadlocks_at_large_k_and_n_yet_loads_exactly() -> None:
    s = demand_schema(aggregate_view=True)
    init = initial_rows(200, seed=5)
    ops = demand_stream(8192, 200, seed=6)
    target = EmbeddedTarget(s)
    target.setup()
    target.bulk_load(init)
    with Loader(target, "naive", sessions=16, grouping=64, seed=1) as loader:
        report = loader.load(ops)
    assert report.deadlocks > 0
    expected = expected_state(s, apply_serial(s, ops, base_from_rows(s, init)))
    assert not differences(s, target.state(), expected)
