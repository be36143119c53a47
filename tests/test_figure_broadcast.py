"""Shanmugasundaram et al.: the server transaction of Table 1 as the simulation runs it.

The test fails if a parameter of the figure's setup is not applied; it does not
measure the figure (no timing).
"""

from __future__ import annotations

import random

import pytest

from txstream.broadcast.base import BroadcastError
from txstream.broadcast.sim import SimParams, _server_txn

# -- Shanmugasundaram et al.: the server transaction of Table 1 ------------------------------


class _ServerTxn:
    def __init__(self, log: list[tuple[str, str]]) -> None:
        self.id = "t"
        self.log = log

    def read(self, name: str) -> None:
        self.log.append(("r", name))

    def write(self, name: str, value: object) -> None:
        self.log.append(("w", name))

    def commit(self) -> None:
        self.log.append(("c", ""))


class _Server:
    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []

    def begin(self) -> _ServerTxn:
        return _ServerTxn(self.log)


def _server_transactions(params: SimParams, count: int) -> list[list[tuple[str, str]]]:
    server = _Server()
    rng = random.Random(7)
    names = [f"o{i}" for i in range(params.objects)]
    txns = []
    for _ in range(count):
        server.log.clear()
        _server_txn(server, rng, params, names)  # type: ignore[arg-type]
        txns.append(list(server.log))
    return txns


def test_server_transaction_updates_eight_objects_reading_half_first() -> None:
    params = SimParams()
    assert (params.server_txn_length, params.server_read_prob) == (8, 0.5)
    assert params.server_interarrival == 250_000
    txns = _server_transactions(params, 400)
    reads = 0
    for ops in txns:
        writes = [name for kind, name in ops if kind == "w"]
        assert len(writes) == len(set(writes)) == 8  # every operation updates its object
        read = [name for kind, name in ops if kind == "r"]
        assert set(read) <= set(writes)  # a read is the read of a read-modify-write
        for name in read:
            assert ops.index(("r", name)) < ops.index(("w", name))
        reads += len(read)
        assert ops[-1] == ("c", "")
    assert 0.45 < reads / (8 * len(txns)) < 0.55  # Table 1's read probability


def test_read_or_write_server_transactions_stay_available() -> None:
    txns = _server_transactions(SimParams(server_ops="read-or-write"), 400)
    writes = sum(1 for ops in txns for kind, _ in ops if kind == "w")
    assert 0.45 < writes / (8 * len(txns)) < 0.55
    with pytest.raises(BroadcastError, match="server_ops"):
        SimParams(server_ops="blind").validate()


def test_a_broadcast_point_beyond_its_step_budget_is_a_marked_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from txstream.bench import broadcast as bench_broadcast

    monkeypatch.setattr(bench_broadcast, "step_budget", lambda transactions: 50)
    point = {"sweep": "client_txn_length", "x": 8, "algorithm": "datacycle"}
    point.update(transactions=20, measured=10)
    row = bench_broadcast.run_point(point, seed=1)
    assert row["beyond_budget"] == 1 and row["response_time"] is None
    assert row["server_ops"] == "update"
