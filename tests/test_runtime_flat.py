"""The flat layout of one-column-keyed tables in a partition's state (``PartitionState.flat``).

In memory a table whose key is one column is kept key -> row, the others
partition value -> key -> row; on disk both write the same columns (a
delta leaves out the partition values of a table whose keys are its values),
so a store written before the flat layout loads, and one written with it is
the same files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import txstream as tx
from txstream.spark.runtime import state as state_module
from txstream.spark.runtime.state import ABSENT, PartitionState, RuntimeStore, load_blob

SIMPLE = "accounts"  # key acct: its own partition value
COMPOSITE = "moves"  # key (acct, n), partition_by acct


def _fill(state: PartitionState, batch: int) -> None:
    """One batch's writes: rows made, changed and deleted in both tables."""
    state.begin(batch)
    for acct in range(batch * 3, batch * 3 + 5):
        state.put(SIMPLE, acct, acct, {"balance": acct * 10 + batch})
        state.put(COMPOSITE, acct, (acct, batch), {"amount": acct})
    state.put(SIMPLE, batch * 3, batch * 3, ABSENT)
    state.put(COMPOSITE, batch * 3 + 1, (batch * 3 + 1, batch), ABSENT)


def _write(root: Path, flat: frozenset[str]) -> RuntimeStore:
    """A store of two batches (a snapshot, then a delta) written with the layout ``flat``."""
    store = RuntimeStore(root)
    state = PartitionState()
    state.use_flat(flat)
    _fill(state, 0)
    store.save(0, state, 0, snapshot=True)
    state.settle()
    _fill(state, 1)
    store.save(0, state, 1, snapshot=False)
    state_module._CACHE.clear()  # (a restart: the next read is from disk)
    return store


def _without_tokens(blob: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in blob.items() if k not in ("token", "parent")}


def test_a_store_written_flat_is_the_store_written_nested(tmp_path: Path) -> None:
    nested = _write(tmp_path / "nested", frozenset())  # the layout of every earlier version
    flat = _write(tmp_path / "flat", frozenset({SIMPLE}))
    for name in ("snap-000000000000.bin", "delta-000000000001.bin"):
        before = load_blob(nested.root / "state" / "p00000" / name)
        after = load_blob(flat.root / "state" / "p00000" / name)
        assert _without_tokens(after) == _without_tokens(before), name
    a, b = nested.load(0, 1), flat.load(0, 1)
    for table in (SIMPLE, COMPOSITE):
        assert sorted(a.all_rows(table)) == sorted(b.all_rows(table))
    assert a.all_rows(SIMPLE) and a.all_rows(COMPOSITE)


def test_a_nested_store_loads_flat_and_goes_on(tmp_path: Path) -> None:
    store = _write(tmp_path, frozenset())  # written before the flat layout
    state = store.load(0, 1)
    expected = {t: sorted(state.all_rows(t)) for t in (SIMPLE, COMPOSITE)}
    state.use_flat(frozenset({SIMPLE}))
    assert state.data[SIMPLE] == dict(expected[SIMPLE])  # key -> row
    assert {t: sorted(state.all_rows(t)) for t in expected} == expected
    # A third batch on the flat state, saved and read back, equals the nested one's.
    twin = store.load(0, 1)
    _fill(state, 2)
    _fill(twin, 2)
    store.save(0, state, 2, snapshot=False)
    state_module._CACHE.clear()
    loaded = store.load(0, 2)
    for table in (SIMPLE, COMPOSITE):
        assert sorted(loaded.all_rows(table)) == sorted(twin.all_rows(table))
    # Back to nested (a job of another shape): the same rows.
    state.use_flat(frozenset())
    for table in (SIMPLE, COMPOSITE):
        assert sorted(state.all_rows(table)) == sorted(twin.all_rows(table))


def test_a_flat_batch_rolls_back_to_its_rows(tmp_path: Path) -> None:
    state = PartitionState()
    state.use_flat(frozenset({SIMPLE}))
    _fill(state, 0)
    state.settle()
    before = {t: sorted(state.all_rows(t)) for t in (SIMPLE, COMPOSITE)}
    _fill(state, 1)
    assert sorted(state.all_rows(SIMPLE)) != before[SIMPLE]
    state.rollback()
    assert {t: sorted(state.all_rows(t)) for t in before} == before


# -- a job with both kinds of table, across a restart -------------------------------------
def _job() -> tx.Job:
    def deposit(t: tx.Tx, e: dict[str, Any]) -> None:
        if t.read(SIMPLE, e["acct"]) is None:
            t.insert(SIMPLE, {"acct": e["acct"], "balance": 0})
        t.increment(SIMPLE, e["acct"], "balance", e["amount"])
        t.insert(COMPOSITE, {"acct": e["acct"], "n": e["n"], "amount": e["amount"]})

    def transfer(t: tx.Tx, e: dict[str, Any]) -> None:
        src = t.read(SIMPLE, e["src"])
        if src is None or src["balance"] < e["amount"]:
            t.abort("cannot pay")
        t.update(SIMPLE, e["src"], balance=src["balance"] - e["amount"])
        t.upsert(SIMPLE, {"acct": e["dst"], "balance": 0, **(t.read(SIMPLE, e["dst"]) or {})})
        t.increment(SIMPLE, e["dst"], "balance", e["amount"])
        t.insert(COMPOSITE, {"acct": e["src"], "n": e["n"], "amount": -e["amount"]})
        t.insert(COMPOSITE, {"acct": e["dst"], "n": e["n"], "amount": e["amount"]})
        for move in t.scan(COMPOSITE, e["src"]):
            if move["amount"] == 1:  # (deletes: a row set that changes shape)
                t.delete(COMPOSITE, (e["src"], move["n"]))
        seen = [m["n"] for m in t.scan(COMPOSITE, e["dst"])]  # (every row of dst's moves)
        t.emit("seen", {"n": e["n"], "moves": seen})

    def audit(t: tx.Tx, e: dict[str, Any]) -> None:
        if t.home in (None, 0):  # (once per event: it reaches every partition)
            total = {"money": t.sum(SIMPLE, "balance"), "accounts": t.count(SIMPLE)}
            t.emit("audits", {**total, "moves": t.sum(COMPOSITE, "amount")})

    return (
        tx.Job("flat")
        .table(SIMPLE, key="acct", initial=[{"acct": 1, "balance": 100}])
        .table(
            COMPOSITE,
            key=["acct", "n"],
            partition_by="acct",
            initial=[{"acct": 1, "n": 0, "amount": 100}],
        )
        .input("deposits", None, keys="acct")
        .input("transfers", None, keys=["src", "dst"])
        .input("audit", None, global_reads=[f"{SIMPLE}.balance", f"{COMPOSITE}.amount"])
        .on("deposits", deposit)
        .on("transfers", transfer)
        .on("audit", audit)
        .output("audits")
        .output("seen")
    )


def _dep(acct: int, n: int, amount: int) -> tuple[str, dict[str, Any]]:
    return ("deposits", {"acct": acct, "n": n, "amount": amount})


def _pay(src: int, dst: int, n: int, amount: int) -> tuple[str, dict[str, Any]]:
    return ("transfers", {"src": src, "dst": dst, "n": n, "amount": amount})


@pytest.mark.parametrize("tasks", [1, 2], ids=["deferred", "forwarded"])
def test_both_kinds_of_table_in_one_job_across_a_restart(tmp_path: Path, tasks: int) -> None:
    first = [[_dep(2, 1, 1), _dep(3, 2, 7), _pay(1, 2, 3, 40), _dep(2, 4, 1)]]
    second = [
        [_pay(2, 3, 5, 30), _dep(4, 6, 5), _pay(3, 4, 7, 500)],
        [_pay(4, 1, 8, 2), ("audit", {"at": 1})],
    ]
    _job().run_local(first, tmp_path, partitions=3, tasks=tasks)
    state_module._CACHE.clear()  # (a restart: new workers read the store)
    _job().run_local(second, tmp_path, partitions=3, tasks=tasks)
    assert tx.read_table(tmp_path, SIMPLE) == [
        {"acct": 1, "balance": 62},
        {"acct": 2, "balance": 12},
        {"acct": 3, "balance": 37},
        {"acct": 4, "balance": 3},
    ]
    assert tx.read_output(tmp_path, "audits") == [{"money": 114, "accounts": 4, "moves": 112}]
    # acct 2's moves of amount 1 went when it paid (transfer 5).
    assert tx.read_table(tmp_path, COMPOSITE) == [
        {"acct": 1, "n": 0, "amount": 100},
        {"acct": 1, "n": 3, "amount": -40},
        {"acct": 1, "n": 8, "amount": 2},
        {"acct": 2, "n": 3, "amount": 40},
        {"acct": 2, "n": 5, "amount": -30},
        {"acct": 3, "n": 2, "amount": 7},
        {"acct": 3, "n": 5, "amount": 30},
        {"acct": 4, "n": 6, "amount": 5},
        {"acct": 4, "n": 8, "amount": -2},
    ]


@st.composite
def _streams(draw: Any) -> list[list[tuple[str, dict[str, Any]]]]:
    acct = st.integers(1, 7)
    amount = st.integers(1, 60)
    event = st.one_of(
        st.builds(lambda a, m: ("deposits", {"acct": a, "amount": m}), acct, amount),
        st.builds(
            lambda s, d, m: ("transfers", {"src": s, "dst": d, "amount": m}), acct, acct, amount
        ),
        st.builds(lambda: ("audit", {"at": 0})),
    )
    batches = draw(st.lists(st.lists(event, min_size=1, max_size=25), min_size=1, max_size=3))
    n = 10
    for batch in batches:
        for _, e in batch:
            e["n"] = n  # (a move's key: unique, so every insert is new)
            n += 1
    return batches


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches=_streams())
def test_forwarded_rows_of_both_layouts_give_the_one_partition_answer(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[tuple[str, dict[str, Any]]]]
) -> None:
    # One partition runs every transaction where it is, one after the other in the
    # declared order: the serial answer.  Three partitions forward the crossing ones'
    # rows of both layouts (a flat table's row sent bare, a nested one's rows by key)
    # in memory (tasks=1) and over sockets (tasks=2), with inserts, deletes and audits.
    answers = []
    for partitions, tasks in ((1, 1), (3, 1), (3, 2)):
        root = tmp_path_factory.mktemp("flat-fwd")
        state_module._CACHE.clear()
        _job().run_local(batches, root, partitions=partitions, tasks=tasks)
        answers.append(
            (
                tx.read_table(root, SIMPLE),
                tx.read_table(root, COMPOSITE),
                tx.read_output(root, "audits"),
                tx.read_output(root, "seen"),
                len(tx.read_failures(root)),
            )
        )
    assert answers[1] == answers[0]
    assert answers[2] == answers[0]


@pytest.mark.parametrize("flat", [frozenset(), frozenset({SIMPLE})])
def test_a_delta_of_a_one_column_key_has_two_columns_and_three_still_load(
    flat: frozenset[str],
) -> None:
    state = PartitionState()
    state.use_flat(flat)
    _fill(state, 1)
    delta = state.delta()
    keys, rows = delta["changes"][SIMPLE]  # (no partition values: each key is its own)
    assert len(delta["changes"][COMPOSITE]) == 3
    assert keys == [3, 4, 5, 6, 7] and rows[0] is ABSENT
    # The three columns every earlier version wrote load the same rows.
    old = {**delta, "changes": {**delta["changes"], SIMPLE: [keys, keys, rows]}}
    a, b = PartitionState(), PartitionState()
    a.use_flat(flat)
    b.use_flat(flat)
    a.apply(delta)
    b.apply(old)
    assert (
        sorted(a.all_rows(SIMPLE))
        == sorted(b.all_rows(SIMPLE))
        == [(k, {"balance": k * 10 + 1}) for k in (4, 5, 6, 7)]
    )


def test_a_delta_names_each_rows_value_when_only_later_blocks_differ_from_their_keys() -> None:
    # The delta makes no column of values while every value is its key (a
    # one-column key), block by block; a later block whose values differ must
    # still give every row its value, the earlier ones included.  (Fails when
    # the values column starts at the first differing block.)
    from txstream.spark.runtime import partition_state

    state = PartitionState()
    state.begin(1, pre_images=False)
    n = partition_state._BLOCK + 5
    for k in range(n):
        value = k if k < partition_state._BLOCK + 2 else f"v{k}"
        state.put("t", value, k, {"k": k})
    [values, keys, rows] = state.delta()["changes"]["t"]
    assert keys == list(range(n)) and rows == [{"k": k} for k in range(n)]
    assert values == [k if k < partition_state._BLOCK + 2 else f"v{k}" for k in range(n)]
    assert all(old is None for old in state.undo.values())  # (no pre-image kept)
    assert not state.rollback()
    state.begin(2)  # (values that are their keys: two columns)
    state.put("t", 1, 1, {"k": 2})
    assert state.delta()["changes"]["t"] == [[1], [{"k": 2}]]


def test_a_delta_keeps_the_type_of_earlier_blocks_values_equal_to_their_keys() -> None:
    # A value 1 of a key 1.0 equals it, so the first block makes no column of
    # values; when a later block needs one, the earlier values are the values
    # (ints), not their keys (floats): the file's bytes do not depend on the
    # blocks (review, session 22; fails when the column starts from the keys).
    from txstream.spark.runtime import partition_state

    state = PartitionState()
    state.begin(1, pre_images=False)
    n = partition_state._BLOCK
    for k in range(n):
        state.put("t", k, float(k), {"r": k})
    state.put("t", "v", 0.5, {"r": -1})
    [values, keys, _] = state.delta()["changes"]["t"]
    assert values == [*range(n), "v"] and keys == [float(k) for k in range(n)] + [0.5]
    assert [type(v) for v in values[:n]] == [int] * n
