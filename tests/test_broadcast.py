"""The broadcast engine: C matrix (rules 1-3 vs the LIVE-set definition), recorded
histories (uc / cs), the paper's ordering in a small simulation, and bad input."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txstream.broadcast import (
    BroadcastError,
    Client,
    ClientTransaction,
    HistoryRecorder,
    Read,
    ReadConditionFailed,
    Server,
    UnknownObjectError,
    ValidationFailed,
    c_matrix,
    make_algorithm,
)
from txstream.broadcast.algorithms import ALGORITHMS, CMatrix, FMatrix
from txstream.broadcast.base import ALGORITHM_NAMES
from txstream.broadcast.sim import SimParams, simulate
from txstream.errors import TransientError, TxStreamError
from txstream.model import History, Operation, check, conflict_graph, criteria, parse_one

EXAMPLE_4 = "w1(ob1) w1(ob2) c1@1 r2(ob1) w2(ob1) c2@2 r3(ob2) w3(ob2) c3@3"


# -- brute-force oracles --------------------------------------------------------------


def reads_from(history: History) -> dict[str, set[str]]:
    """t -> the committed transactions t reads from (by history position)."""
    committed = history.committed()
    last: dict[str, str] = {}
    rf: dict[str, set[str]] = {}
    for op in history.operations:
        if op.txn not in committed or op.item is None:
            continue
        if op.kind == "w":
            last[op.item] = op.txn
        elif op.kind == "r":
            src = last.get(op.item)
            if src is not None and src != op.txn:
                rf.setdefault(op.txn, set()).add(src)
    return rf


def live(t: str, rf: dict[str, set[str]]) -> set[str]:
    out = {t}
    stack = [t]
    while stack:
        for s in rf.get(stack.pop(), ()):
            if s not in out:
                out.add(s)
                stack.append(s)
    return out


def c_by_definition(history: History) -> tuple[list[str], list[list[int]]]:
    """C(i, j) = max commit cycle over t' in LIVE(t_j) writing ob_i (t0: cycle 0)."""
    objects = list(dict.fromkeys(op.item for op in history.operations if op.item))
    committed = history.committed()
    cycles = history.commit_cycles()
    rf = reads_from(history)
    last_writer: dict[str, str] = {}
    writes: dict[str, set[str]] = {}
    for op in history.operations:
        if op.kind == "w" and op.txn in committed and op.item is not None:
            last_writer[op.item] = op.txn
            writes.setdefault(op.txn, set()).add(op.item)
    c = [[0] * len(objects) for _ in objects]
    for j, obj_j in enumerate(objects):
        tj = last_writer.get(obj_j)
        if tj is None:
            continue
        members = live(tj, rf)
        for i, obj_i in enumerate(objects):
            c[i][j] = max((cycles[t] for t in members if obj_i in writes.get(t, ())), default=0)
    return objects, c


def approx(history: History) -> bool:
    """APPROX: update sub-history CS, and S(t_R) acyclic for every read-only t_R."""
    h = history.committed_projection()
    writers = {op.txn for op in h.operations if op.kind == "w"}
    if conflict_graph(History([op for op in h if op.txn in writers])).serial_order() is None:
        return False
    rf = reads_from(h)
    for t in h.committed() - writers:
        members = live(t, rf)
        sub = History([op for op in h.operations if op.txn in members])
        if conflict_graph(sub).serial_order() is None:
            return False
    return True


# -- the C matrix ---------------------------------------------------------------------


def test_example_4() -> None:
    result = c_matrix(parse_one(EXAMPLE_4))
    assert result.objects == ["ob1", "ob2"]
    assert result.c == [[2, 1], [1, 3]]  # C(1,1)=2, C(2,2)=3, C(1,2)=C(2,1)=1
    assert c_by_definition(parse_one(EXAMPLE_4)) == (result.objects, result.c)


@st.composite
def update_histories(draw: st.DrawFn) -> History:
    """Serial update transactions with non-decreasing cycles, plus noise that must not
    matter: aborted transactions and read-only transactions interleaved anywhere."""
    items = ["a", "b", "c", "d"]
    ops: list[Operation] = []
    cycle = 0
    n = draw(st.integers(1, 7))
    for t in range(1, n + 1):
        for _ in range(draw(st.integers(1, 4))):
            ops.append(Operation(draw(st.sampled_from("rw")), str(t), draw(st.sampled_from(items))))
        cycle += draw(st.integers(0, 2))
        ops.append(Operation("c", str(t), None, cycle))
    for k in range(draw(st.integers(0, 3))):
        txn = f"n{k}"
        noise = [
            Operation(draw(st.sampled_from("rw")), txn, draw(st.sampled_from(items)))
            for _ in range(draw(st.integers(1, 3)))
        ]
        noise.append(Operation("a", txn))
        positions = sorted(draw(st.integers(0, len(ops))) for _ in noise)
        for offset, (pos, op) in enumerate(zip(positions, noise, strict=True)):
            ops.insert(pos + offset, op)
    return History(ops)


@given(update_histories())
def test_cmatrix_matches_live_set_definition(history: History) -> None:
    result = c_matrix(history)
    assert (result.objects, result.c) == c_by_definition(history)


@pytest.mark.parametrize("seed", range(4))
def test_cmatrix_of_recorded_interleaved_histories(seed: int) -> None:
    # Recorded runs interleave client reads, server reads and writes; both ways of
    # computing C must agree on their update sub-history.
    p = _small(algorithm="f-matrix", client_update_prob=0.5)
    history = simulate(p, seed).history
    assert history is not None
    result = c_matrix(history)
    assert (result.objects, result.c) == c_by_definition(history)


def test_server_matrix_is_the_history_matrix() -> None:
    rec = HistoryRecorder()
    server = Server(6, "f-matrix", recorder=rec)
    rng = random.Random(3)
    for _ in range(40):
        server.begin_cycle()
        for _ in range(rng.randrange(3)):
            txn = server.begin()
            for _ in range(3):
                name = f"ob{rng.randrange(1, 7)}"
                if rng.random() < 0.5:
                    txn.read(name)
                else:
                    txn.write(name, txn.id)
            txn.commit()
    assert isinstance(server.algorithm, FMatrix)
    expected = server.algorithm.matrix.as_lists()
    result = c_matrix(rec.history(), objects=server.objects)
    assert result.c == expected


# -- recorded histories ----------------------------------------------------------------


def _small(**kw: object) -> SimParams:
    base: dict[str, object] = dict(
        objects=8,
        client_txn_length=4,
        server_txn_length=3,
        server_interarrival=20_000,
        object_bits=1000,
        transactions=25,
        measured=10,
        record=True,
    )
    base.update(kw)
    return SimParams(**base)  # type: ignore[arg-type]


def _uc_holds(history: History) -> bool:
    if "uc" in criteria():
        return check(history, "uc").holds
    return approx(history)


@pytest.mark.parametrize(
    ("algorithm", "cache"),
    [
        (algorithm, cache)
        for algorithm in ["f-matrix", "r-matrix", "grouped", "f-matrix-no"]
        for cache in [None, 3.0]
        if not (cache and algorithm == "r-matrix")  # r-matrix has no cache
    ],
)
def test_matrix_histories_are_update_consistent(algorithm: str, cache: float | None) -> None:
    aborts = 0
    for seed in range(4):
        p = _small(
            algorithm=algorithm,
            groups=3 if algorithm == "grouped" else None,
            cache_cycles=cache,
            client_update_prob=0.3,
        )
        result = simulate(p, seed)
        assert result.history is not None
        assert approx(result.history)
        assert _uc_holds(result.history)
        aborts += result.client_aborts
    assert aborts > 0  # the workload really exercised the read-condition


@pytest.mark.parametrize("cache", [None, 3.0])
def test_datacycle_histories_are_conflict_serializable(cache: float | None) -> None:
    for seed in range(4):
        result = simulate(_small(algorithm="datacycle", cache_cycles=cache), seed)
        assert result.history is not None
        assert check(result.history, "cs").holds


class _Lenient(FMatrix):
    """A broken algorithm that accepts every read: the oracles must notice."""

    name = "lenient"

    def read_condition(self, previous: Sequence[Read], read: Read) -> bool:
        return True


def test_the_history_checks_have_teeth(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(ALGORITHMS, "lenient", _Lenient)
    verdicts = []
    for seed in range(10):
        history = simulate(_small(algorithm="lenient", client_txn_length=6), seed).history
        assert history is not None
        verdicts.append(approx(history))
    assert not all(verdicts)


# -- the paper's ordering -----------------------------------------------------------------


def test_paper_ordering_in_a_small_simulation() -> None:
    def rt(algorithm: str, **kw: object) -> float:
        base: dict[str, object] = dict(algorithm=algorithm, transactions=300, measured=200)
        base.update(kw)
        return simulate(SimParams(**base), seed=5).response_time  # type: ignore[arg-type]

    # Long client transactions: F-Matrix < R-Matrix < Datacycle, F-Matrix-No best.
    f, r, d = (
        rt("f-matrix", client_txn_length=8),
        rt("r-matrix", client_txn_length=8),
        rt("datacycle", client_txn_length=8),
    )
    assert rt("f-matrix-no", client_txn_length=8) < f < r < d
    # Small objects: the n x n control information costs F-Matrix its advantage.
    assert rt("f-matrix", object_bits=64 * 8) > rt("r-matrix", object_bits=64 * 8)


# -- engine behaviour -------------------------------------------------------------------


def test_read_only_transaction_restarts_on_failed_read_condition() -> None:
    server = Server(["x", "y"], "datacycle")
    client = Client(server)
    server.begin_cycle()
    txn = client.begin()
    assert txn.read("x") == 0
    server.run(reads=[], writes={"x": 1})
    server.begin_cycle()
    with pytest.raises(ReadConditionFailed) as info:
        txn.read("y")
    assert isinstance(info.value, TransientError)
    again = client.begin()
    assert again.read("x") == 1 and again.read("y") == 0
    again.commit()


def test_f_matrix_accepts_what_datacycle_rejects() -> None:
    # x is overwritten after t read it, but the y that t then reads does not depend
    # on the new x: F-Matrix lets t go on (Example 2's intuition).
    for algorithm, ok in [("f-matrix", True), ("r-matrix", True), ("datacycle", False)]:
        server = Server(["x", "y"], algorithm)
        server.begin_cycle()
        txn = Client(server).begin()
        txn.read("x")
        server.run(reads=[], writes={"x": 1})
        server.begin_cycle()
        if ok:
            txn.read("y")
        else:
            with pytest.raises(ReadConditionFailed):
                txn.read("y")


def test_f_matrix_rejects_a_dependent_read() -> None:
    server = Server(["x", "y"], "f-matrix")
    server.begin_cycle()
    txn = Client(server).begin()
    txn.read("x")
    server.run(reads=[], writes={"x": 1})
    server.run(reads=["x"], writes={"y": 2})  # y now depends on the new x
    server.begin_cycle()
    with pytest.raises(ReadConditionFailed):
        txn.read("y")


def test_client_update_transaction_validated_at_commit() -> None:
    server = Server(["x", "y"], "f-matrix")
    server.begin_cycle()
    client = Client(server)
    t1 = client.begin(read_only=False)
    t1.read("x")
    t1.write("y", 5)
    server.run(reads=[], writes={"x": 9})  # overwrites what t1 read
    with pytest.raises(ValidationFailed):
        t1.commit()
    t2 = client.begin(read_only=False)
    server.begin_cycle()
    assert t2.read("x") == 9
    t2.write("y", 5)
    t2.commit()
    assert server.current == [9, 5]


def test_cache_reuses_values_within_currency() -> None:
    server = Server(3, "f-matrix")
    client = Client(server, currency=2)
    server.begin_cycle()
    client.begin().read("ob1")
    server.run(reads=[], writes={"ob1": 7})
    server.begin_cycle()
    t = client.begin()
    assert t.read("ob1") == 0  # cached, one cycle old: still current enough
    assert client.cache_hits == 1
    server.begin_cycle()
    assert client.begin().read("ob1") == 7  # two cycles old: expired, read off the air


def test_algorithms_by_name() -> None:
    assert tuple(ALGORITHMS) == ALGORITHM_NAMES
    assert set(ALGORITHMS) == {"f-matrix", "r-matrix", "datacycle", "grouped", "f-matrix-no"}
    assert make_algorithm("grouped", 10, groups=5).control_entries() == 5
    assert make_algorithm("f-matrix", 10).control_entries() == 10
    assert make_algorithm("f-matrix-no", 10).control_entries() == 0
    with pytest.raises(TxStreamError, match="unknown algorithm 'g-matrix'"):
        make_algorithm("g-matrix", 10)


# -- bad input ---------------------------------------------------------------------------


def test_read_of_an_object_that_does_not_exist() -> None:
    server = Server(3, "f-matrix")
    server.begin_cycle()
    with pytest.raises(UnknownObjectError, match="'ob9' does not exist"):
        Client(server).begin().read("ob9")
    with pytest.raises(UnknownObjectError):
        server.run(reads=["nope"], writes={})
    with pytest.raises(UnknownObjectError, match="'ob3'"):
        c_matrix(parse_one("r1(ob3) w1(ob1) c1@1"), objects=["ob1", "ob2"])


def test_cycle_going_backwards() -> None:
    with pytest.raises(BroadcastError, match="cycle numbers go backwards"):
        c_matrix(parse_one("w1(x) c1@3 w2(y) c2@2"))
    with pytest.raises(BroadcastError, match="goes backwards"):
        m = CMatrix(2)
        m.commit([], [0], 3)
        m.commit([], [1], 2)


def test_other_bad_histories() -> None:
    with pytest.raises(BroadcastError, match="without a cycle"):
        c_matrix(parse_one("w1(x) c1"))
    with pytest.raises(BroadcastError, match="not conflict-serializable"):
        c_matrix(parse_one("r1(x) r2(y) w1(y) w2(x) c1@1 c2@1"))
    with pytest.raises(BroadcastError, match="commits after it"):
        c_matrix(parse_one("w1(x) r2(x) w2(y) c2@1 c1@1"))


def test_bad_engine_use() -> None:
    server = Server(2, "r-matrix")
    with pytest.raises(BroadcastError, match="nothing is on the air"):
        Client(server).begin().read("ob1")
    with pytest.raises(BroadcastError, match="cannot validate cached values"):
        Client(server, currency=2)
    with pytest.raises(BroadcastError, match="client transaction length"):
        simulate(SimParams(objects=3, client_txn_length=4))
    with pytest.raises(BroadcastError, match="groups must be between"):
        make_algorithm("grouped", 4, groups=9)


def test_grouped_spans_datacycle_to_f_matrix() -> None:
    # g = n is F-Matrix and g = 1 is Datacycle's vector: the same runs, read for read.
    def run(algorithm: str, groups: int | None = None) -> list[float]:
        p = _small(algorithm=algorithm, groups=groups, record=False, transactions=40)
        return simulate(p, seed=11).response_times

    assert run("grouped", 8) == run("f-matrix")
    assert run("grouped", 1) == run("datacycle")
    assert run("grouped", 1) != run("f-matrix")


def test_package_exports_load_lazily() -> None:
    import txstream.broadcast as pkg

    assert sorted(pkg.__all__) == sorted(pkg._WHERE)
    for name in pkg.__all__:
        assert getattr(pkg, name) is not None
    with pytest.raises(AttributeError):
        _ = pkg.NoSuchThing


def test_f_matrix_read_condition_is_exactly_approx() -> None:
    # Theorem 1: F-Matrix lets a read-only transaction commit iff S(t_R) is acyclic.
    # The server runs a lenient F-Matrix (same C, accepts every read); we evaluate the
    # real condition beside every read and compare with APPROX on the final history.
    rejected = 0
    for seed in range(40):
        rng = random.Random(seed)
        rec = HistoryRecorder()
        server = Server(5, _Lenient(5), recorder=rec)
        client = Client(server)
        accepted: dict[str, bool] = {}
        active: list[tuple[ClientTransaction, list[str]]] = []
        for _ in range(30):
            air = server.begin_cycle()
            if rng.random() < 0.5:
                t = client.begin()
                active.append((t, rng.sample(server.objects, 4)))
                accepted[t.id] = True
            for t, todo in list(active):
                if rng.random() < 0.6:
                    name = todo.pop(0)
                    j = server.obj(name)
                    ok = FMatrix.read_condition(
                        server.algorithm, t.reads, Read(j, air.cycle, air.column(j))
                    )
                    accepted[t.id] = accepted[t.id] and ok
                    t.read(name)
                    if not todo:
                        t.commit()
                        active.remove((t, todo))
            for _ in range(rng.randrange(3)):
                txn = server.begin()
                for _ in range(rng.randrange(1, 4)):
                    name = rng.choice(server.objects)
                    if rng.random() < 0.5:
                        txn.read(name)
                    else:
                        txn.write(name, txn.id)
                txn.commit()
        history = rec.history()
        rf = reads_from(history)
        for tid in history.committed() & set(accepted):
            sub = History([op for op in history.operations if op.txn in live(tid, rf)])
            assert accepted[tid] == (conflict_graph(sub).serial_order() is not None), (seed, tid)
            rejected += not accepted[tid]
    assert rejected > 20
