"""Continuous loading into a real PostgreSQL server the test starts itself.

The server package is installed with scripts/pg-install.sh (apt-get) when it is
missing; if that is impossible the tests fail with the reason (the issue requires
a real server, so a missing one is a failure, not a skip).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txstream.loading import Loader, Modification
from txstream.loading.ops import validate
from txstream.loading.oracle import check_loaded
from txstream.loading.pgserver import PostgresServer, find_bindir
from txstream.loading.postgres import PostgresTarget
from txstream.loading.workloads import (
    demand_schema,
    demand_stream,
    increment_stream,
    initial_rows,
)

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


@pytest.fixture(scope="module")
def server() -> Iterator[PostgresServer]:
    if find_bindir() is None:
        proc = subprocess.run(
            [str(SCRIPTS / "pg-install.sh")], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0 or find_bindir() is None:
            pytest.fail(f"PostgreSQL server not available: {proc.stderr.strip()[-200:]}")
    srv = PostgresServer(deadlock_timeout_ms=20).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def target(server: PostgresServer) -> PostgresTarget:
    return PostgresTarget(demand_schema(aggregate_view=True), server)


def fresh(target: PostgresTarget, parts: int) -> dict[str, list[dict[str, object]]]:
    init = initial_rows(parts, seed=1)
    target.setup()
    target.bulk_load(init)
    return init


def test_naive_deadlocks_yet_applies_everything_once(target: PostgresTarget) -> None:
    init = fresh(target, 200)
    ops = demand_stream(2000, 200, seed=2)
    with Loader(target, "naive", sessions=6, grouping=32, seed=1) as loader:
        report = loader.load(ops)
    assert report.deadlocks > 0
    assert report.operations == 2000
    assert check_loaded(target, init, ops) == []
    assert target.stats()["server_deadlocks"] >= report.deadlocks


@pytest.mark.parametrize("method", ["partition", "reorder"])
def test_partitioned_methods(target: PostgresTarget, method: str) -> None:
    init = fresh(target, 60)
    ops = demand_stream(3000, 60, seed=3)
    with Loader(target, method, sessions=8, grouping=64) as loader:
        report = loader.load(ops)
    assert check_loaded(target, init, ops) == []
    if method == "reorder":
        assert report.deadlocks == 0


def test_reorder_never_deadlocks_across_k_and_n(target: PostgresTarget) -> None:
    for k, n in [(2, 128), (16, 32), (16, 128)]:
        init = fresh(target, 100)
        ops = demand_stream(2500, 100, seed=k * n)
        with Loader(target, "reorder", sessions=k, grouping=n) as loader:
            report = loader.load(ops)
        assert report.deadlocks == 0, (k, n)
        assert check_loaded(target, init, ops) == []


def test_preaggregation_same_state_fewer_statements(target: PostgresTarget) -> None:
    ops = increment_stream(1500, 20, seed=4)
    results = {}
    for pre in (False, True):
        init = fresh(target, 20)
        with Loader(target, "reorder", sessions=4, grouping=32, preaggregate=pre) as loader:
            report = loader.load(ops)
        assert check_loaded(target, init, ops) == []
        results[pre] = (report.statements, target.state())
    assert results[True][0] < results[False][0]
    assert results[True][1] == results[False][1]


def test_exactly_once_ledger_and_bad_input(target: PostgresTarget) -> None:
    init = fresh(target, 20)
    schema = target.schema
    ops = [op.to_json(schema) for op in demand_stream(400, 20, seed=5)]
    raw = [*ops[:200], {"relation": "orders", "op": "insert", "values": {}}, *ops[200:]]
    raw.append({"relation": "inventory", "op": "increment", "values": {"partkey": 1}})
    with Loader(target, "reorder", sessions=4, grouping=16) as loader:
        first = loader.load(raw, batch_id=3)
        replay = loader.load(raw, batch_id=3)
    assert len(first.rejected) == 2 and first.operations == 400
    assert "unknown relation 'orders'" in first.rejected[0][1]
    assert "missing key" in first.rejected[1][1]
    assert replay.transactions == 0 and replay.skipped == first.transactions
    good = [validate(schema, r) for r in ops]
    assert check_loaded(target, init, good) == []
    assert not target.batch_done(3)
    target.mark_batch(3)
    assert target.batch_done(3)


KEYS = st.integers(0, 3)


def small_ops() -> st.SearchStrategy[list[Modification]]:
    demand = st.one_of(
        st.builds(
            lambda c, p, q: Modification(
                "demand",
                "insert",
                (c,),
                (("comment", None), ("date", 1), ("partkey", p), ("quantity", q)),
            ),
            KEYS,
            KEYS,
            st.integers(1, 5),
        ),
        st.builds(lambda c: Modification("demand", "delete", (c,), ()), KEYS),
        st.builds(
            lambda c, p: Modification("demand", "update", (c,), (("partkey", p),)), KEYS, KEYS
        ),
    )
    inventory = st.one_of(
        st.builds(
            lambda p, q: Modification(
                "inventory",
                "upsert",
                (p, 1),
                (("extended_cost", 0), ("extended_price", 0), ("quantity", q)),
            ),
            KEYS,
            st.integers(-3, 3),
        ),
        st.builds(lambda p: Modification("inventory", "delete", (p, 1), ()), KEYS),
        st.builds(
            lambda p, q: Modification("inventory", "increment", (p, 1), (("quantity", q),)),
            KEYS,
            st.integers(-3, 3),
        ),
    )
    return st.lists(st.one_of(demand, inventory), max_size=25)


@settings(max_examples=15)
@given(
    ops=small_ops(),
    k=st.integers(1, 3),
    n=st.integers(1, 4),
    method=st.sampled_from(["partition", "reorder"]),
)
def test_postgres_matches_serial_oracle(
    target: PostgresTarget, ops: list[Modification], k: int, n: int, method: str
) -> None:
    target.setup()
    with Loader(target, method, sessions=k, grouping=n, preaggregate=n > 2) as loader:
        loader.load(ops)
    assert check_loaded(target, {}, ops) == []
