"""commit_and_continue / resume: a reader's successor keeps its reads of chosen rows.

Under ss2pl the shared locks pass to the successor without a gap (a writer of a
kept row still waits, now for the successor), except where a writer already
waits; until resume() a conflicting request revokes them instead of waiting.
Under optimistic the kept reads are validated again at the successor's commit.
"""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txstream.txn import LockTimeoutError, TransactionError, TransactionManager, ValidationError

ROWS = 6


def loaded(protocol: str, **kw: object) -> TransactionManager:
    tm = TransactionManager(protocol, **kw)  # type: ignore[arg-type]
    tm.table("parts")
    with tm.begin() as t:
        for k in range(ROWS):
            t.put("parts", k, {"price": k})
    return tm


def write(tm: TransactionManager, key: int, price: int) -> None:
    with tm.begin() as t:
        t.put("parts", key, {"price": price})


@settings(max_examples=40, deadline=None)
@given(
    read=st.sets(st.integers(0, ROWS - 1), min_size=1),
    keep=st.sets(st.integers(0, ROWS - 1)),
    before=st.sets(st.integers(0, ROWS - 1), max_size=2),
    after=st.integers(0, ROWS - 1),
)
def test_ss2pl_a_writer_of_a_kept_row_waits_for_the_successor(
    read: set[int], keep: set[int], before: set[int], after: int
) -> None:
    tm = loaded("ss2pl", lock_timeout=0.05)
    parts = tm.table("parts")
    txn = tm.begin(read_only=True)
    for k in sorted(read):
        txn.read(parts, k)
    heir = tm.commit_and_continue(txn, [parts.item(k) for k in sorted(keep)])
    assert txn.status == "committed"
    # between the two: writers never wait for the successor, they take its locks
    for k in sorted(before):
        write(tm, k, 100 + k)
    lost = tm.resume(heir)
    held = (read & keep) - before
    assert {parts.item(k) for k in keep} - lost == {parts.item(k) for k in held}
    assert set(heir.locks) == {parts.item(k) for k in held}
    # once resumed, a writer of a row it still holds waits (here: times out) ...
    if after in held:
        with pytest.raises(LockTimeoutError):
            write(tm, after, -1)
        assert parts.read(after) == {"price": after}
    else:  # ... and of any other row does not
        write(tm, after, -1)
    heir.commit()
    tm.locks.check_idle()


def test_ss2pl_a_lock_someone_waits_for_is_released_not_handed_over() -> None:
    tm = loaded("ss2pl")
    parts = tm.table("parts")
    txn = tm.begin(read_only=True)
    txn.read(parts, 0)
    txn.read(parts, 1)
    done = threading.Event()
    writer = threading.Thread(target=lambda: (write(tm, 0, 50), done.set()))
    writer.start()
    while not tm.locks.table[parts.item(0)].waiters:  # the writer queues behind txn
        threading.Event().wait(0.001)
    heir = tm.commit_and_continue(txn, [parts.item(0), parts.item(1)])
    assert done.wait(5)  # granted at txn's commit, as without a successor
    writer.join()
    assert tm.resume(heir) == {parts.item(0)}
    assert set(heir.locks) == {parts.item(1)}
    heir.commit()
    tm.locks.check_idle()


@settings(max_examples=40, deadline=None)
@given(
    read=st.sets(st.integers(0, ROWS - 1), min_size=1),
    keep=st.sets(st.integers(0, ROWS - 1)),
    writes=st.lists(st.integers(0, ROWS - 1), max_size=3),
    early=st.booleans(),
)
def test_optimistic_a_kept_read_changed_after_the_hand_over_fails_validation(
    read: set[int], keep: set[int], writes: list[int], early: bool
) -> None:
    tm = loaded("optimistic")
    parts = tm.table("parts")
    txn = tm.begin(read_only=True)
    for k in sorted(read):
        txn.read(parts, k)
    heir = tm.commit_and_continue(txn, [parts.item(k) for k in sorted(keep)])
    if early:  # before resume: nothing to revoke, validation finds it
        for k in writes:
            write(tm, k, 100 + k)
    lost = tm.resume(heir)
    assert lost == {parts.item(k) for k in keep - read}  # only what txn read is vouched for
    if not early:
        for k in writes:
            write(tm, k, 100 + k)
    if set(writes) & read & keep:
        with pytest.raises(ValidationError):
            heir.commit()
        assert heir.status == "aborted"
    else:
        heir.commit()
    assert not tm.active_since


def test_a_failing_commit_aborts_the_successor_and_writers_cannot_hand_on() -> None:
    tm = loaded("optimistic")
    parts = tm.table("parts")
    txn = tm.begin(read_only=True)
    txn.read(parts, 0)
    write(tm, 0, 7)
    with pytest.raises(ValidationError):
        tm.commit_and_continue(txn, [parts.item(0)])
    assert not tm.active_since  # the successor was aborted too
    with pytest.raises(TransactionError, match="not read-only"):
        tm.commit_and_continue(tm.begin(), [])
    snap = loaded("snapshot")
    t = snap.begin(read_only=True)
    t.read("parts", 1)
    heir = snap.commit_and_continue(t, ["parts.1"])
    assert snap.resume(heir) == {"parts.1"}  # snapshot keeps nothing
    heir.commit()
