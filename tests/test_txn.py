"""The transaction manager: interface, protocols, rollback, deadlocks, orderings."""

import contextlib
import itertools
import sys
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txstream.errors import TransientError, TxStreamError, UnknownNameError
from txstream.model import check, format_history
from txstream.storage import OrderError
from txstream.txn import (
    DeadlockError,
    LockTimeoutError,
    TransactionError,
    TransactionManager,
    ValidationError,
    WoundedError,
    WriteConflictError,
    protocols,
)

ALL = ["ss2pl", "none", "snapshot", "optimistic"]


def make(protocol: str, **kw):
    tm = TransactionManager(protocol, record=True, **kw)
    acct = tm.table("acct")
    acct.load({"a": 100, "b": 50, "c": {"n": 1}})
    return tm, acct


@pytest.mark.parametrize("protocol", ALL)
def test_commit_and_rollback_restore_the_state(protocol) -> None:
    tm, acct = make(protocol)
    out = tm.stream("out")
    with tm.begin() as t:
        t.increment(acct, "a", -10)
        t.increment("acct", "b", 10)
        t.append(out, "moved")
        assert t.read(acct, "a") == 90
    before = (acct.rows(), out.read())
    with pytest.raises(RuntimeError), tm.begin() as t:
        t.increment(acct, "a", 10)
        t.insert(acct, "d", 1)
        t.delete(acct, "b")
        t.update(acct, "c", {"n": 2})
        t.increment(acct, "c", 5, field="n")
        t.append(out, "lost")
        assert t.read(acct, "d") == 1 and t.read(acct, "b") is None
        raise RuntimeError("boom")
    assert t.status == "aborted"
    assert (acct.rows(), out.read()) == before
    assert acct.snapshot() == {"a": 90, "b": 60, "c": {"n": 1}}
    assert check(tm.history(), "cs").holds
    tm.locks.check_idle()


def test_five_method_interface() -> None:
    tm, acct = make("ss2pl")
    t = tm.start_transaction()
    assert tm.read(t, acct, "a") == 100
    tm.write(t, acct, "a", 1)
    tm.commit(t)
    t2 = tm.begin()
    tm.write(t2, "acct", "a", 2)
    tm.abort(t2)
    assert acct.read("a") == 1
    # The arrival line lists the committed transactions in the order they began.
    assert format_history(tm.history()) == "arrival events: 1\nr1(acct.a) w1(acct.a) c1 a2"
    assert set(protocols()) == set(ALL)


def test_bad_input_gives_clear_errors() -> None:
    tm, acct = make("ss2pl")
    ordered = tm.stream("s", order_by="ts", require_order=True)
    with tm.begin() as t:
        t.append(ordered, {"ts": 5})
    t = tm.begin()
    with pytest.raises(UnknownNameError, match="unknown table 'nope'; choose one of: acct"):
        t.read("nope", 1)
    with pytest.raises(UnknownNameError, match="unknown stream"):
        t.append("nope", 1)
    with pytest.raises(OrderError, match="requires order"):
        t.append(ordered, {"ts": 4})
    t.commit()
    for op in (lambda: t.read(acct, "a"), lambda: t.put(acct, "a", 1), t.commit, t.abort):
        with pytest.raises(TransactionError, match="it is committed"):
            op()
    a = tm.begin()
    a.abort()
    with pytest.raises(TransactionError, match="it is aborted"):
        a.increment(acct, "a", 1)
    r = tm.begin(read_only=True)
    with pytest.raises(TransactionError, match="read-only"):
        r.put(acct, "a", 1)
    r.commit()
    with pytest.raises(UnknownNameError, match="unknown protocol"):
        TransactionManager("2pl")
    with pytest.raises(TxStreamError, match="predefined order"):
        TransactionManager("none", ordered=True)
    with pytest.raises(TransactionError, match="only an aborted one"):
        tm.begin(retry_of=t)
    with pytest.raises(TxStreamError, match="does not record"):
        TransactionManager().history()


def test_deadlock_is_detected_and_one_victim_retries() -> None:
    tm, acct = make("ss2pl")
    barrier = threading.Barrier(2)
    outcome: dict[str, str] = {}

    def worker(name: str, first: str, second: str) -> None:
        t = tm.begin()
        t.increment(acct, first, 1)
        barrier.wait()
        try:
            t.increment(acct, second, 1)
            t.commit()
            outcome[name] = "committed"
        except DeadlockError as exc:
            assert t.status == "aborted" and "deadlock" in str(exc)
            outcome[name] = "victim"
            tm.run(lambda t: (t.increment(acct, first, 1), t.increment(acct, second, 1)))

    threads = [
        threading.Thread(target=worker, args=("x", "a", "b")),
        threading.Thread(target=worker, args=("y", "b", "a")),
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=600)
    assert sorted(outcome.values()) == ["committed", "victim"]
    assert tm.stats()["deadlocks"] == 1
    assert acct.rows()["a"] == 102 and acct.rows()["b"] == 52
    assert check(tm.history(), "cs").holds
    tm.locks.check_idle()


def test_upgrade_deadlock_and_lock_timeout() -> None:
    # The deadlock on a manager whose lock waits cannot time out first however
    # slowly the threads are scheduled; the timeout on one of 0.2 s.
    tm, acct = make("ss2pl", lock_timeout=600)
    t1, t2 = tm.begin(), tm.begin()
    t1.read(acct, "a")
    t2.read(acct, "a")
    errors: list[Exception] = []

    def upgrade(t) -> None:
        try:
            t.put(acct, "a", 0)
            t.commit()
        except TransientError as exc:
            errors.append(exc)

    th = threading.Thread(target=upgrade, args=(t1,))
    th.start()
    while th.is_alive() and not tm.locks.queued:  # t1 waits for t2's read lock
        time.sleep(0.001)
    upgrade(t2)  # closes the cycle: t2 (the younger) is the victim, t1 proceeds
    th.join(timeout=600)
    assert [type(e) for e in errors] == [DeadlockError] and t1.status == "committed"
    tm, acct = make("ss2pl", lock_timeout=0.2)
    holder = tm.begin()
    holder.put(acct, "b", 1)
    waiter = tm.begin()
    start = time.perf_counter()
    with pytest.raises(LockTimeoutError, match=r"waited more than 0\.2 s"):
        waiter.read(acct, "b")
    # (no upper bound: how late a timeout fires depends on the machine's load)
    assert time.perf_counter() - start > 0.15 and waiter.status == "aborted"
    holder.commit()


def test_write_skew_under_snapshot_isolation() -> None:
    tm = TransactionManager("snapshot", record=True)
    doctors = tm.table("oncall")
    doctors.load({"alice": 1, "bob": 1})
    t1, t2 = tm.begin(), tm.begin()
    # Each checks that someone else stays on call, then goes off call.
    assert t1.read(doctors, "alice") + t1.read(doctors, "bob") == 2
    assert t2.read(doctors, "alice") + t2.read(doctors, "bob") == 2
    t1.put(doctors, "alice", 0)
    t2.put(doctors, "bob", 0)
    t1.commit()
    t2.commit()  # different items: first-committer-wins does not stop it
    assert doctors.snapshot() == {"alice": 0, "bob": 0}  # the constraint is broken
    verdict = check(tm.history(), "cs")
    assert not verdict.holds and len(verdict.evidence["cycle"]) == 2
    # The same schedule under optimistic validation: the second commit fails.
    tm = TransactionManager("optimistic", record=True)
    doctors = tm.table("oncall")
    doctors.load({"alice": 1, "bob": 1})
    t1, t2 = tm.begin(), tm.begin()
    for t in (t1, t2):
        t.read(doctors, "alice")
        t.read(doctors, "bob")
    t1.put(doctors, "alice", 0)
    t2.put(doctors, "bob", 0)
    t1.commit()
    with pytest.raises(ValidationError):
        t2.commit()
    assert doctors.snapshot() == {"alice": 0, "bob": 1}
    assert check(tm.history(), "cs").holds


def test_first_committer_wins_and_snapshot_reads() -> None:
    tm = TransactionManager("snapshot", record=True)
    x = tm.table("x")
    x.load({1: 0})
    reader = tm.begin(read_only=True)
    t1, t2 = tm.begin(), tm.begin()
    t1.increment(x, 1, 1)
    t2.increment(x, 1, 1)
    t1.commit()
    with pytest.raises(WriteConflictError, match="committed after its snapshot"):
        t2.commit()
    assert reader.read(x, 1) == 0  # still the snapshot as of its start
    reader.commit()
    assert x.snapshot() == {1: 1}
    history = tm.history()
    ops = format_history(history).splitlines()[1]
    assert ops.startswith("r1(x.1)")  # recorded at the snapshot point
    assert history.arrivals == {"events": ["1", "2"]}  # t2 (3) may still be retried
    assert check(history, "cs").holds


def test_none_is_not_serializable() -> None:
    tm, acct = make("none")
    t1, t2 = tm.begin(), tm.begin()
    t1.increment(acct, "a", -10)  # writers lock ...
    assert t2.read(acct, "a") == 90  # ... but readers see uncommitted data
    t2.increment(acct, "b", 1)
    assert t1.read(acct, "b") == 51
    t1.commit()
    t2.commit()
    verdict = check(tm.history(), "cs")
    assert not verdict.holds


def test_ordered_ss2pl_wounds_younger_and_commits_in_order() -> None:
    tm = TransactionManager("ss2pl", ordered=True, record=True)
    x = tm.table("x")
    x.load({1: 0, 2: 0})
    old, young = tm.begin(), tm.begin()
    young.increment(x, 1, 1)
    done = threading.Event()

    def run_old() -> None:
        old.put(x, 1, 100)  # conflicts with the younger holder: wounds it
        old.commit()
        done.set()

    th = threading.Thread(target=run_old)
    th.start()
    deadline = time.monotonic() + 600  # (a bound on a hang, not a speed requirement)
    with pytest.raises(WoundedError, match="wounded by older transaction 1"):
        while time.monotonic() < deadline:
            young.read(x, 2)
            time.sleep(0.01)
    th.join(timeout=600)
    assert done.is_set() and young.status == "aborted"
    retry = tm.begin(retry_of=young)
    retry.increment(x, 1, 1)
    retry.commit()
    assert x.snapshot() == {1: 101, 2: 0}
    history = tm.history()
    assert history.arrivals == {"events": ["1", "3"]}
    assert check(history, "csao").holds


def test_ordered_commits_wait_for_older_transactions() -> None:
    tm = TransactionManager("optimistic", ordered=True, record=True)
    x = tm.table("x")
    x.load({1: 0})
    first, second = tm.begin(), tm.begin()
    second.put(x, 1, 2)
    th = threading.Thread(target=second.commit)
    th.start()
    time.sleep(0.05)
    assert second.status == "active"  # waiting for its turn
    first.put(x, 1, 1)
    first.commit()
    th.join(timeout=600)
    assert second.status == "committed" and x.snapshot() == {1: 2}
    assert tm.history().arrivals == {"events": ["1", "2"]}


def test_stream_granularities_in_transactions() -> None:
    tm = TransactionManager("ss2pl", record=True)
    s = tm.stream("s", granularity="event")
    with tm.begin() as t:
        assert t.append(s, "e0") == 0
    t1, t2 = tm.begin(), tm.begin()
    t1.append(s, "e1")
    t2.append(s, "e2")  # event locks: appends do not conflict
    assert t2.scan(s, 0, 1) == ["e0"]
    t1.abort()
    t2.commit()
    with tm.begin() as t:
        assert t.scan(s) == ["e0", "e2"]
    assert check(tm.history(), "cs").holds
    tm2 = TransactionManager("optimistic", record=True)
    s2 = tm2.stream("s", granularity="range", range_size=2)
    t = tm2.begin()
    assert t.append(s2, "a") is None
    assert t.scan(s2) == ["a"]
    t.commit()
    assert s2.committed() == ["a"]


def test_concurrent_transfers_keep_the_total() -> None:
    def transfers(tm, acct, seed: int) -> None:
        for i in range(150):
            a, b = (seed + i) % 8, (seed * 3 + i * 5 + 1) % 8

            def move(t, a=a, b=b):
                if t.read(acct, a) >= 10:
                    t.increment(acct, a, -10)
                    t.increment(acct, b, 10)

            tm.run(move)

    for protocol in ("ss2pl", "optimistic", "snapshot"):
        tm = TransactionManager(protocol, record=True)
        acct = tm.table("acct")
        acct.load({i: 100 for i in range(8)})
        threads = [threading.Thread(target=transfers, args=(tm, acct, s)) for s in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=30)
        assert sum(acct.snapshot().values()) == 800
        assert check(tm.history(), "cs").holds, protocol


# -- a brute-force oracle on small cases -----------------------------------------------

OPS = st.lists(
    st.tuples(st.sampled_from("rwi"), st.integers(0, 2), st.integers(1, 9)), min_size=1, max_size=4
)


def serial_outcome(order, programs, initial):
    state = dict(initial)
    reads = {}
    for t in order:
        seen = []
        for op, key, val in programs[t]:
            if op == "r":
                seen.append(state[key])
            elif op == "w":
                state[key] = val
            else:
                state[key] += val
        reads[t] = seen
    return state, reads


@settings(max_examples=120, deadline=None)
@given(
    programs=st.lists(OPS, min_size=2, max_size=4),
    schedule=st.lists(st.integers(0, 3), max_size=24),
    protocol=st.sampled_from(["optimistic", "snapshot"]),
)
def test_committed_effects_match_a_serial_execution(programs, schedule, protocol) -> None:
    """Non-blocking protocols driven through any interleaving: what commits is serial."""
    initial = {0: 0, 1: 0, 2: 0}
    tm = TransactionManager(protocol, record=True, snapshot_updates="si")
    x = tm.table("x")
    x.load(initial)
    n = len(programs)
    txns = [None] * n
    pos = [0] * n
    seen: dict[int, list[int]] = {i: [] for i in range(n)}
    order = [s % n for s in schedule] + [i for i in range(n) for _ in range(5)]
    for i in order:
        if txns[i] is None:
            txns[i] = tm.begin()
        t = txns[i]
        if t.status != "active":
            continue
        if pos[i] == len(programs[i]):
            with contextlib.suppress(TransientError):
                t.commit()
            continue
        op, key, val = programs[i][pos[i]]
        pos[i] += 1
        if op == "r":
            seen[i].append(t.read(x, key))
        elif op == "w":
            t.put(x, key, val)
        else:
            t.increment(x, key, val)
    committed = [i for i in range(n) if txns[i].status == "committed"]
    final = x.snapshot()
    matches = []
    for perm in itertools.permutations(committed):
        state, reads = serial_outcome(perm, programs, initial)
        if state == final and all(reads[t] == seen[t] for t in committed):
            matches.append(perm)
    cs = check(tm.history(), "cs").holds
    if protocol == "optimistic":
        assert matches, "committed transactions are not equivalent to any serial order"
        assert cs
    elif cs:
        # Snapshot isolation may break serializability (write skew), but whenever the
        # recorded history is conflict-serializable the results must be serial ones.
        assert matches


# -- groups of events as transactions -------------------------------------------------


def test_groups_of_events_run_in_arrival_order_give_a_csao_history() -> None:
    # The transaction manager takes a group per transaction as its caller cuts them
    # (the runtime's boundaries, tx.boundary, are the project's one vocabulary).
    events = [{"ts": t, "v": i} for i, t in enumerate([1, 1, 2, 3, 3, 3, 7])]
    tm = TransactionManager("ss2pl", ordered=True, record=True)
    out = tm.stream("out", order_by="ts", require_order=True)
    groups = [list(g) for _, g in itertools.groupby(events, key=lambda e: e["ts"])]
    for group in groups:
        tm.run(lambda t, g=group: [t.append(out, e) for e in g])  # type: ignore[misc]
    assert len(groups) == 4 and out.committed() == events
    assert check(tm.history(), "csao").holds


def test_snapshot_readers_race_with_version_pruning_and_stream_undo() -> None:
    """Regression: readers walking version chains / stream slots while writers prune."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        tm = TransactionManager("snapshot")
        x = tm.table("x")
        x.load({k: 0 for k in range(4)})
        s = tm.stream("s", granularity="event")
        errors: list[BaseException] = []

        def writer(seed: int) -> None:
            for i in range(400):
                try:
                    tm.run(lambda t, i=i: (t.increment(x, (seed + i) % 4, 1), t.append(s, i)))
                except BaseException as exc:
                    errors.append(exc)

        def reader() -> None:
            for _ in range(800):
                try:
                    with tm.begin(read_only=True) as t:
                        rows = [t.read(x, k) for k in range(4)]
                        t.scan(s)
                        assert all(v is not None for v in rows)
                except BaseException as exc:
                    errors.append(exc)

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(3)]
        threads += [threading.Thread(target=reader) for _ in range(3)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=60)
        assert not errors, errors[:3]
        assert sum(x.snapshot().values()) == 1200 and len(s.committed()) == 1200
    finally:
        sys.setswitchinterval(old)


@settings(max_examples=60, deadline=None)
@given(
    programs=st.lists(OPS, min_size=2, max_size=4),
    protocol=st.sampled_from(["ss2pl", "ss2pl-ordered", "optimistic", "snapshot-locking"]),
)
def test_threaded_runs_match_a_serial_execution(programs, protocol) -> None:
    """Real threads and retries: the committed attempts equal a serial run (oracle)."""
    name, _, variant = protocol.partition("-")
    tm = TransactionManager(
        name, ordered=variant == "ordered", snapshot_updates="locking", lock_timeout=10
    )
    initial = {0: 0, 1: 0, 2: 0}
    x = tm.table("x")
    x.load(initial)
    seen: dict[int, list[int]] = {}
    order: dict[int, int] = {}

    def body(i: int, t) -> None:
        reads = []
        for op, key, val in programs[i]:
            if op == "r":
                reads.append(t.read(x, key))
            elif op == "w":
                t.put(x, key, val)
            else:
                t.increment(x, key, val)
            time.sleep(0)
        seen[i], order[i] = reads, t.order

    threads = [
        threading.Thread(target=lambda i=i: tm.run(lambda t: body(i, t), retries=1000))
        for i in range(len(programs))
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=30)
    assert len(seen) == len(programs)
    final = x.snapshot()
    perms = itertools.permutations(range(len(programs)))
    if variant == "ordered":
        perms = iter([tuple(sorted(range(len(programs)), key=order.__getitem__))])
    assert any(
        serial_outcome(perm, programs, initial) == (final, {t: seen[t] for t in perm})
        for perm in perms
    )
    tm.locks.check_idle()


def test_arrival_line_is_the_begin_order_with_retries_in_place() -> None:
    tm = TransactionManager("ss2pl", record=True)  # unordered: recorded all the same
    x = tm.table("x")
    x.load({1: 0})
    first = tm.begin()
    first.increment(x, 1, 1)
    first.abort(retry=True)  # will be retried: keeps its place
    second = tm.begin()
    second.increment(x, 1, 1)
    second.commit()
    dropped = tm.begin()
    dropped.abort(retry=True)
    tm.give_up(dropped)  # never retried: its place is released
    again = tm.begin(retry_of=first)
    again.increment(x, 1, 1)
    again.commit()
    last = tm.begin()
    last.read(x, 1)
    last.commit()
    history = tm.history(committed_only=True)
    assert history.arrivals == {"events": ["4", "2", "5"]}  # 4 took 1's place
    assert not check(history, "csao").holds  # 4 committed after 2, on the same row
    assert check(history, "cs").holds


@pytest.mark.parametrize("protocol", ALL)
def test_on_abort_runs_with_the_undo_log_only_when_the_transaction_aborts(protocol: str) -> None:
    tm, t = make(protocol)
    log: list[str] = []
    with tm.begin() as txn:
        txn.put(t, 1, "a")
        txn.on_abort(log.append, "kept")
    assert log == [] and t.read(1) == "a"
    txn = tm.begin()
    txn.on_abort(log.append, "first")
    txn.put(t, 1, "b")
    txn.on_abort(log.append, "second")
    txn.abort()
    assert log == ["second", "first"] and t.read(1) == "a"  # newest first, with the rows
    with pytest.raises(TransactionError, match="aborted"):
        txn.on_abort(log.append, "late")
    with pytest.raises(TransactionError, match="read-only"), tm.begin(read_only=True) as reader:
        reader.on_abort(log.append, "reader")
