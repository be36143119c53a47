"""The ledger on the partitioned runtime without Spark equals serial execution.

The local runner runs the same executor, store and driver loop as Spark
tasks; here it is checked against brute-force serial oracles (Hypothesis), and
its recorded histories with the project's own CSAO checker.  One test breaks
the executor on purpose and shows that both the oracle and the checker notice.

Moved from ``tests/test_runtime.py`` (split by subject); shared helpers are in
``tests/runtime_jobs.py``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import txstream as tx
from runtime_jobs import balances, split
from txstream.bench.ledger import events, ledger_job, serial_oracle
from txstream.model import check
from txstream.spark.runtime import deferred as deferred_module
from txstream.spark.runtime import executor as executor_module
from txstream.spark.runtime.forward import partition as forward_partition
from txstream.spark.runtime.partitioning import partition_of


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
        # (and each partition's list of the copies it homes, to the other: forward.announce;
        # and the list of transactions the partition with more rows hands the other,
        # when it has at least 2 more: forward.handed)
        rows = Counter(partition_of(e["acct" if n == "deposits" else "src"], 2) for n, e in stream)
        handing = int(abs(rows[0] - rows[1]) >= 2)
        assert handing == 1  # (this input hands some over)
        assert stats["messages"] == 2 * stats["forwarded"] + 2 + handing
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
    enter = forward_partition._Partition._enter

    def enter_without_waiting(self: Any, item: Any) -> None:
        if item.kind == "part" and not item.barrier:
            self.unfinished += 1
            self._start(item)
            return
        enter(self, item)

    monkeypatch.setattr(forward_partition._Partition, "_enter", enter_without_waiting)
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
    shares = deferred_module.deferred_chains(rows, shipped, tasks)
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
    assert shares == deferred_module.deferred_chains(rows, shipped, tasks)  # every task agrees


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


def test_phase_1_in_blocks_frees_each_event_after_it_ran_and_equals_the_oracle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Phase 1 takes its events out of the list block by block (each is freed soon
    # after it ran, in the CPU's cache): blocks of 7, deferred transfers between
    # them, still the serial answer, and the list a task gave it left empty.
    monkeypatch.setattr(executor_module, "_BLOCK", 7)
    left: list[list[Any]] = []
    run = executor_module.PartitionExecutor.run

    def run_and_keep(self: Any, batch: int, evs: list[Any], abort: Any) -> None:
        run(self, batch, evs, abort)
        left.append(evs)

    monkeypatch.setattr(executor_module.PartitionExecutor, "run", run_and_keep)
    stream = list(events(200, 30, 20, seed=4))
    job = ledger_job().option("recordHistory", True).option("crossPartition", "defer")
    stats = job.run_local([stream], tmp_path, 2).stats[0]
    assert stats["deferred"] > 0 and stats["events"] == 200
    balance, outcomes = serial_oracle(stream)
    assert [(r["id"], r["ok"]) for r in tx.read_output(tmp_path, "transfers_done")] == outcomes
    assert balances(tmp_path, 2) == balance
    assert check(tx.read_history(tmp_path), "csao").holds
    assert left and all(e is None for evs in left for e in evs) and sum(map(len, left)) >= 200
