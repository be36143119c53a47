"""Luo et al.: the per-statement server cost reaches the targets the bench makes.

The test fails if a parameter of the figure's setup is not applied; it does not
measure the figure (no timing).
"""

from __future__ import annotations

from typing import Any

import pytest

from txstream.bench import loading as bench_loading
from txstream.errors import TxStreamError
from txstream.loading import EmbeddedTarget, Modification
from txstream.loading.postgres import PostgresTarget, _PostgresSession
from txstream.loading.workloads import demand_schema

# -- Luo et al.: the per-statement server cost ---------------------------------------------


def test_loading_grids_charge_the_per_statement_server_cost() -> None:
    exp = bench_loading.experiment("embedded")
    for grid in (exp.grid, exp.quick_grid):
        assert grid and all(p["statement_ms"] == bench_loading.STATEMENT_MS for p in grid)
    # the figures' checkpoints n = 32 and n = 64 are in the quick grid too
    assert {32, 64} <= {p["n"] for p in exp.quick_grid}


def test_statement_ms_reaches_the_embedded_target(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []
    real = bench_loading.make_target

    def spy(name: str, **options: Any) -> Any:
        target = real(name, **options)
        made.append(target)
        return target

    monkeypatch.setattr(bench_loading, "make_target", spy)
    point = {"target": "embedded", "study": "concurrency", "method": "naive", "k": 2, "n": 4}
    point.update(quick=True, statement_ms=0.25)
    out = bench_loading.run_point(point, seed=1)
    assert out["view_ok"]
    (target,) = made
    assert isinstance(target, EmbeddedTarget)
    assert target.statement_delay == pytest.approx(0.00025)
    assert real("embedded").statement_delay == pytest.approx(bench_loading.STATEMENT_MS / 1000)


class _Cursor:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []

    def execute(self, sql: str, params: Any = None, prepare: bool = False) -> None:
        self.sent.append((sql, params))


def test_postgres_target_spends_the_statement_cost_in_the_server() -> None:
    schema = demand_schema()
    target = PostgresTarget(schema, "host=/nonexistent", statement_delay=0.002)
    session = _PostgresSession.__new__(_PostgresSession)
    session.target = target
    cur = _Cursor()
    op = Modification("inventory", "increment", (1, 0), (("quantity", 1),))
    session._statement(cur, op)
    assert len(cur.sent) == 2
    assert cur.sent[1] == ("SELECT pg_sleep(%s)", (0.002,))
    cur.sent.clear()
    target.statement_delay = 0.0
    session._statement(cur, op)
    assert len(cur.sent) == 1
    with pytest.raises(TxStreamError, match="statement_delay"):
        PostgresTarget(schema, "host=/nonexistent", statement_delay=float("nan"))
