"""commit_and_continue(reuse=True): the successor is the committed reader's own object.

On the short paths (no log, recorder or order) the reader is begun again in
place: a new id, ``hid`` and place in the order, as a transaction begun at the
call, and its locks (ss2pl) or reads (optimistic) on the kept items stay where
they are.  Everything else is as with a new successor object: a writer of a
kept row waits for the successor, a lock someone waits for is released, the kept
locks are revocable until resume(), a kept read changed later fails the
successor's validation, and a chain of such readers under concurrent writers
sees consistent states (the ss2pl history, logged under the locks, is CS).
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txstream.errors import TransientError
from txstream.model.check import check
from txstream.model.history import History, Operation
from txstream.txn import LockTimeoutError, TransactionError, TransactionManager, ValidationError
from txstream.txn.base import EXCLUSIVE, SHARED

ROWS = 6


def loaded(protocol: str, **kw: object) -> TransactionManager:
    tm = TransactionManager(protocol, **kw)  # type: ignore[arg-type]
    tm.table("parts")
    with tm.begin() as t:
        for k in range(ROWS):
            t.put("parts", k, 100)
    return tm


def write(tm: TransactionManager, key: int, value: int) -> None:
    with tm.begin() as t:
        t.put("parts", key, value)


@settings(max_examples=40, deadline=None)
@given(
    read=st.sets(st.integers(0, ROWS - 1), min_size=1),
    keep=st.lists(st.integers(0, ROWS - 1)),
    before=st.sets(st.integers(0, ROWS - 1), max_size=2),
    after=st.integers(0, ROWS - 1),
)
def test_ss2pl_reused_successor_keeps_its_locks_as_a_new_one_would(
    read: set[int], keep: list[int], before: set[int], after: int
) -> None:
    tm = loaded("ss2pl", lock_timeout=0.05)
    parts = tm.table("parts")
    txn = tm.begin(read_only=True)
    for k in sorted(read):
        txn.read(parts, k)
    old_id, committed = txn.id, tm.committed
    other = tm.begin()  # begun before the call: older than the successor
    heir = tm.commit_and_continue(txn, [parts.item(k) for k in keep], reuse=True)
    assert heir is txn and heir.status == "active" and tm.committed == committed + 1
    assert heir.id > other.id > old_id and heir.hid == str(heir.id)
    other.abort()
    for k in sorted(before):  # writers take the kept locks before resume, never wait
        write(tm, k, 200 + k)
    lost = tm.resume(heir)
    held = (read & set(keep)) - before
    assert {parts.item(k) for k in keep} - lost == {parts.item(k) for k in held}
    assert set(heir.locks) == {parts.item(k) for k in held}
    for k in range(ROWS):  # released: nobody else holds anything
        assert tm.locks.holders(parts.item(k)) == ({heir.hid: 1} if k in held else {})
    if after in held:  # resumed: a writer of a row it holds waits (here: times out)
        with pytest.raises(LockTimeoutError):
            write(tm, after, -1)
    else:
        write(tm, after, -1)
    heir.commit()
    tm.locks.check_idle()


def test_ss2pl_reused_successor_releases_a_lock_someone_waits_for() -> None:
    tm = loaded("ss2pl")
    parts = tm.table("parts")
    txn = tm.begin(read_only=True)
    for k in (0, 1, 2):
        txn.read(parts, k)
    done = threading.Event()

    def update() -> None:
        write(tm, 0, 50)
        done.set()

    writer = threading.Thread(target=update)
    writer.start()
    while not tm.locks.queued:  # the writer queues behind txn's read lock
        threading.Event().wait(0.001)
    heir = tm.commit_and_continue(txn, [parts.item(0), parts.item(1)], reuse=True)
    assert done.wait(5)  # granted at the commit, as without a successor
    writer.join()
    assert tm.resume(heir) == {parts.item(0)}
    assert set(heir.locks) == {parts.item(1)}
    heir.commit()
    tm.locks.check_idle()
    assert tm.locks.queued == 0


@settings(max_examples=40, deadline=None)
@given(
    read=st.sets(st.integers(0, ROWS - 1), min_size=1),
    keep=st.sets(st.integers(0, ROWS - 1)),
    writes=st.lists(st.integers(0, ROWS - 1), max_size=3),
    early=st.booleans(),
)
def test_optimistic_reused_successor_validates_its_kept_reads(
    read: set[int], keep: set[int], writes: list[int], early: bool
) -> None:
    tm = loaded("optimistic")
    parts = tm.table("parts")
    txn = tm.begin(read_only=True)
    for k in sorted(read):
        txn.read(parts, k)
    old_id = txn.id
    heir = tm.commit_and_continue(txn, [parts.item(k) for k in sorted(keep)], reuse=True)
    assert heir is txn and heir.status == "active" and heir.id > old_id
    assert list(tm.active_since) == [heir.id]
    if early:
        for k in writes:
            write(tm, k, 200 + k)
    assert tm.resume(heir) == {parts.item(k) for k in keep - read}
    assert set(heir.reads) == {parts.item(k) for k in keep & read}
    if not early:
        for k in writes:
            write(tm, k, 200 + k)
    if set(writes) & read & keep:
        with pytest.raises(ValidationError):
            heir.commit()
    else:
        heir.commit()
    assert not tm.active_since


def test_optimistic_reuse_a_failing_commit_ends_the_successor_too() -> None:
    tm = loaded("optimistic")
    parts = tm.table("parts")
    txn = tm.begin(read_only=True)
    txn.read(parts, 0)
    write(tm, 0, 7)
    aborted = tm.aborted
    with pytest.raises(ValidationError):
        tm.commit_and_continue(txn, [parts.item(0)], reuse=True)
    assert txn.status == "aborted" and not tm.active_since
    assert tm.aborted == aborted + 2  # txn and its successor, as without reuse


def test_reuse_off_the_short_paths_gives_a_new_successor() -> None:
    tm = loaded("ss2pl", record=True)
    txn = tm.begin(read_only=True)
    txn.read("parts", 0)
    heir = tm.commit_and_continue(txn, ["parts.0"], reuse=True)
    assert heir is not txn and txn.status == "committed"
    assert tm.resume(heir) == set()
    heir.commit()


def transfers(tm: TransactionManager, log: Any, seed: int, n: int, stop: threading.Event) -> None:
    """Move amounts between two rows: the rows' total never changes."""
    rng = random.Random(seed)
    parts = tm.table("parts")
    for _ in range(n):
        a, b = rng.sample(range(ROWS), 2)
        amount = rng.randint(1, 5)
        while not stop.is_set():
            t = tm.begin()
            try:
                for key, delta in ((a, -amount), (b, amount)):
                    value = t.read(parts, key)
                    if log is not None:
                        log(Operation("r", t.hid, parts.item(key)))
                    t.put(parts, key, value + delta)
                    if log is not None:
                        log(Operation("w", t.hid, parts.item(key)))
                t.commit()
            except TransientError:
                if log is not None:
                    log(Operation("a", t.hid))
                continue
            if log is not None:
                log(Operation("c", t.hid))
            break
        if stop.is_set():
            return


@pytest.mark.parametrize("protocol", ["ss2pl", "optimistic"])
def test_a_chain_of_reused_readers_sees_the_total_while_writers_transfer(protocol: str) -> None:
    tm = loaded(protocol, lock_timeout=10)
    parts = tm.table("parts")
    ops: list[Operation] = []
    mutex = threading.Lock()

    def log(op: Operation) -> None:
        with mutex:
            ops.append(op)

    logged = log if protocol == "ss2pl" else None
    stop = threading.Event()
    writers = [
        threading.Thread(target=transfers, args=(tm, logged, k, 300, stop)) for k in range(2)
    ]
    for th in writers:
        th.start()
    rng = random.Random(11)
    txn = tm.begin(read_only=True)
    held: dict[int, int] = {}
    windows = 0
    try:
        while any(th.is_alive() for th in writers) or windows < 50:
            hid = txn.hid
            try:
                for key in range(ROWS):
                    if key not in held:
                        held[key] = txn.read(parts, key)
                        if logged is not None:
                            logged(Operation("r", hid, parts.item(key)))
                seen = sum(held.values())
                keep = sorted(rng.sample(range(ROWS), rng.randint(0, ROWS)))
                heir = tm.commit_and_continue(txn, [parts.item(k) for k in keep], reuse=True)
            except TransientError:
                if logged is not None:
                    logged(Operation("a", hid))
                txn, held = tm.begin(read_only=True), {}
                continue
            assert heir is txn and heir.hid != hid
            assert seen == 100 * ROWS
            if logged is not None:
                logged(Operation("c", hid))
            time.sleep(0)  # let writers in: they may revoke kept locks until resume
            lost = tm.resume(heir)
            held = {k: held[k] for k in keep if parts.item(k) not in lost}
            if logged is not None:  # its reads of the kept rows: under locks held since
                for k in held:
                    logged(Operation("r", heir.hid, parts.item(k)))
            windows += 1
        txn.commit()
    finally:
        if txn.status == "active":
            txn.abort()
        stop.set()
        for th in writers:
            th.join()
    with tm.begin(read_only=True) as t:
        assert sum(t.read(parts, k) for k in range(ROWS)) == 100 * ROWS
    if protocol == "ss2pl":
        tm.locks.check_idle()
        assert tm.locks.queued == 0
        assert check(History.of_operations(ops), "cs").holds
    else:
        assert not tm.active_since


# -- commit_keeping_all: the successor keeps every read -------------------------------


def test_ss2pl_keeping_all_commits_and_keeps_every_lock_in_place() -> None:
    tm = loaded("ss2pl", lock_timeout=0.05)
    parts = tm.table("parts")
    txn = tm.begin(read_only=True)
    for k in (0, 1, 2):
        txn.read(parts, k)
    clock, committed = tm.clock, tm.committed
    heir = tm.commit_keeping_all(txn)
    assert heir is txn and heir.status == "active"
    assert tm.clock == clock + 1 and tm.committed == committed + 1
    assert set(heir.locks) == {parts.item(k) for k in (0, 1, 2)}
    with pytest.raises(LockTimeoutError):  # not revocable: a writer waits
        write(tm, 1, -1)
    write(tm, 3, -1)  # a row it never read
    heir.commit()
    tm.locks.check_idle()


def test_optimistic_keeping_all_validates_every_read_and_keeps_them() -> None:
    tm = loaded("optimistic")
    parts = tm.table("parts")
    txn = tm.begin(read_only=True)
    for k in (0, 1):
        txn.read(parts, k)
    heir = tm.commit_keeping_all(txn)
    assert heir is txn and set(heir.reads) == {parts.item(0), parts.item(1)}
    write(tm, 1, 7)  # after the commit: the successor's read of row 1 is stale
    aborted = tm.aborted
    with pytest.raises(ValidationError):
        tm.commit_keeping_all(heir)
    assert heir.status == "aborted" and tm.aborted == aborted + 1 and not tm.active_since


def test_ss2pl_untimed_keeping_all_commits_off_the_clock_and_keeps_every_lock() -> None:
    tm = loaded("ss2pl", lock_timeout=0.05)
    parts = tm.table("parts")
    txn = tm.begin(read_only=True)
    for k in (0, 1):
        txn.read(parts, k)
    clock, committed = tm.clock, tm.committed
    assert tm.commit_keeping_all_untimed(txn)
    assert tm.clock == clock and tm.committed == committed + 1 and txn.status == "active"
    assert set(txn.locks) == {parts.item(0), parts.item(1)}
    with pytest.raises(LockTimeoutError):  # its locks still keep what it read current
        write(tm, 0, -1)
    write(tm, 3, -1)  # a row it never read: timed, as ever
    assert tm.clock == clock + 1
    assert tm.commit_keeping_all_untimed(txn)  # (locks, not the clock, protect its reads)
    txn.commit()
    tm.locks.check_idle()


def test_optimistic_untimed_keeping_all_only_when_nothing_was_written_since_validation() -> None:
    tm = loaded("optimistic")
    parts = tm.table("parts")
    txn = tm.begin(read_only=True)
    txn.read(parts, 0)
    txn.read(parts, 1)
    assert not tm.commit_keeping_all_untimed(txn)  # never validated, the load wrote since
    assert tm.commit_keeping_all(txn) is txn  # validated, timed
    clock, committed = tm.clock, tm.committed
    assert tm.commit_keeping_all_untimed(txn)  # nothing written since: valid as it is
    assert tm.clock == clock and tm.committed == committed + 1 and txn.status == "active"
    with tm.commit_mutex:  # a commit in progress may have put in a version it read
        assert not tm.commit_keeping_all_untimed(txn)
    write(tm, 5, 7)  # a row it never read: still, a write since the validation
    assert not tm.commit_keeping_all_untimed(txn)
    assert tm.commit_keeping_all(txn) is txn  # validated item by item: nothing it read changed
    write(tm, 1, 7)  # a row it read
    assert not tm.commit_keeping_all_untimed(txn)
    with pytest.raises(ValidationError):
        tm.commit_keeping_all(txn)
    assert txn.status == "aborted" and not tm.active_since


def test_untimed_keeping_all_is_refused_off_the_short_paths() -> None:
    for tm in (loaded("ss2pl", record=True), loaded("snapshot")):
        txn = tm.begin(read_only=True)
        txn.read("parts", 0)
        clock, committed = tm.clock, tm.committed
        assert not tm.commit_keeping_all_untimed(txn)
        assert (tm.clock, tm.committed, txn.status) == (clock, committed, "active")
        txn.commit()
    tm = loaded("ss2pl")
    writer = tm.begin()
    assert not tm.commit_keeping_all_untimed(writer)  # a writer must take a timestamp
    writer.abort()
    assert not tm.commit_keeping_all_untimed(loaded("ss2pl").begin(read_only=True))


def test_keeping_all_off_the_short_paths_hands_everything_on() -> None:
    tm = loaded("ss2pl", record=True)
    txn = tm.begin(read_only=True)
    txn.read("parts", 0)
    txn.read("parts", 1)
    heir = tm.commit_keeping_all(txn)
    assert heir is not txn and txn.status == "committed"
    assert tm.resume(heir) == set() and set(heir.locks) == {"parts.0", "parts.1"}
    heir.commit()
    tm.locks.check_idle()


def test_keeping_all_refuses_a_writer_and_a_stranger() -> None:
    tm = loaded("ss2pl")
    writer = tm.begin()
    with pytest.raises(TransactionError, match="not read-only"):
        tm.commit_keeping_all(writer)
    writer.abort()
    with pytest.raises(TransactionError, match="this manager's begin"):
        tm.commit_keeping_all(loaded("ss2pl").begin(read_only=True))


def test_ss2pl_reused_successor_leaves_another_readers_locks_on_released_rows() -> None:
    """The release of the items not kept drops only the renewed reader's lock: a row
    another reader shares stays locked for it (a writer still waits)."""
    tm = loaded("ss2pl", lock_timeout=0.05)
    parts = tm.table("parts")
    txn, other = tm.begin(read_only=True), tm.begin(read_only=True)
    for k in range(3):
        txn.read(parts, k)
    other.read(parts, 1)
    heir = tm.commit_and_continue(txn, [parts.item(2)], reuse=True)
    assert tm.resume(heir) == set()
    assert tm.locks.holders(parts.item(0)) == {}
    assert tm.locks.holders(parts.item(1)) == {other.hid: 1}
    assert set(heir.locks) == {parts.item(2)}
    with pytest.raises(LockTimeoutError):
        write(tm, 1, 0)
    other.commit()
    heir.commit()
    write(tm, 1, 0)
    tm.locks.check_idle()


def test_ss2pl_reused_successor_never_takes_a_shared_rows_record_out_of_the_lock_table() -> None:
    """keep_only must not take out, even for a moment, the record of a row another
    transaction holds too: a lock-free fast path that runs then (another thread, at
    any bytecode) finds the row free and takes it, and putting the record back drops
    that lock from the table.  The fast path is run from inside the table's removal,
    which is such a moment."""
    tm = loaded("ss2pl", lock_timeout=0.05)
    parts = tm.table("parts")
    row = parts.item(1)
    writer = tm.begin()
    watching = False

    class Watched(dict):  # type: ignore[type-arg]
        def _gone(self, item: object) -> None:
            if watching and item == row:  # a writer's request comes in right now, lock-free
                tm.locks.acquire(writer, row, EXCLUSIVE)

        def pop(self, item: Any, *default: Any) -> Any:
            rcb = super().pop(item, *default)
            self._gone(item)
            return rcb

        def __delitem__(self, item: Any) -> None:
            super().__delitem__(item)
            self._gone(item)

    assert not tm.locks.table
    tm.locks.table = tm.protocol._table = Watched()  # type: ignore[attr-defined]
    txn, other = tm.begin(read_only=True), tm.begin(read_only=True)
    for k in range(3):
        txn.read(parts, k)
    other.read(parts, 1)
    watching = True
    heir = tm.commit_and_continue(txn, [parts.item(2)], reuse=True)
    watching = False
    # the writer got no exclusive lock on a row another reader holds shared
    assert row not in writer.locks
    assert tm.locks.holders(row) == {other.hid: SHARED}
    with pytest.raises(LockTimeoutError):
        tm.locks.acquire(writer, row, EXCLUSIVE)
    writer.abort()
    other.commit()
    assert tm.resume(heir) == set()
    heir.commit()
    tm.locks.check_idle()


def test_ss2pl_reused_successor_a_kept_lock_revoked_the_moment_the_mutex_is_free() -> None:
    """keep_only gives txn a new dict of the locks it keeps: it must be txn's, and
    txn.lost set, before the lock manager's mutex is free again.  A writer's request
    for a kept row from another thread right then revokes that lock (the successor is
    not resumed yet); it must leave txn's locks, and a dropped row must be free."""
    tm = loaded("ss2pl", lock_timeout=0.05)
    parts = tm.table("parts")
    kept, dropped = parts.item(1), parts.item(3)
    writer = tm.begin()
    errors: list[BaseException] = []
    real = tm.locks.mutex
    armed = False

    def request() -> None:
        try:
            tm.locks.acquire(writer, kept, EXCLUSIVE)  # revokes the successor's kept lock
            tm.locks.acquire(writer, dropped, EXCLUSIVE)  # released: granted at once
        except BaseException as exc:  # (reported by the main thread)
            errors.append(exc)

    class Watched:  # the mutex, with a writer run in another thread as it is let go
        def __enter__(self) -> bool:
            return real.__enter__()

        def __exit__(self, *exc: object) -> None:
            nonlocal armed
            real.__exit__(*exc)
            if armed:
                armed = False
                t = threading.Thread(target=request)
                t.start()
                t.join(5)

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

    txn = tm.begin(read_only=True)
    for k in range(4):
        txn.read(parts, k)
    tm.locks.mutex = Watched()  # type: ignore[assignment]
    armed = True
    heir = tm.commit_and_continue(txn, {kept, parts.item(2)}, reuse=True)
    tm.locks.mutex = real
    assert not errors, errors
    assert heir is txn
    assert tm.resume(heir) == {kept}
    assert heir.locks == {parts.item(2): SHARED}
    assert tm.locks.holders(kept) == {writer.hid: EXCLUSIVE}
    assert tm.locks.holders(dropped) == {writer.hid: EXCLUSIVE}
    assert tm.locks.holders(parts.item(2)) == {heir.hid: SHARED}
    writer.commit()
    heir.commit()
    tm.locks.check_idle()
