"""The lock manager's shared record for an item one reader alone holds (``locks.Solo``).

A reader's uncontended shared lock puts its transaction's one ``Solo`` record
in the lock table instead of a new RCB per item.  These tests hold it to what
an RCB per lock gave: a writer never gets a row a reader holds that way, a
second reader shares it without touching the first one's other rows, upgrades,
hand-overs, revocations and releases see through it, and nothing ever changes
the shared record in place.
"""

from __future__ import annotations

import threading
import time

import pytest

from txstream.txn import LockTimeoutError, TransactionError, TransactionManager
from txstream.txn.base import EXCLUSIVE, SHARED
from txstream.txn.locks import RCB, LockManager, Solo


def loaded(**kw: object) -> TransactionManager:
    tm = TransactionManager("ss2pl", **kw)  # type: ignore[arg-type]
    tm.table("parts")
    with tm.begin() as t:
        for k in range(4):
            t.put("parts", k, {"price": k})
    return tm


def queued_writer(tm: TransactionManager, key: int) -> tuple[threading.Thread, list[str]]:
    """A writer of ``key`` in another thread, started once it waits in the queue."""
    done: list[str] = []

    def write() -> None:
        with tm.begin() as t:
            t.put("parts", key, {"price": 100})
            done.append("wrote")

    th = threading.Thread(target=write)
    th.start()
    while th.is_alive() and not tm.locks.queued:
        time.sleep(0.001)
    return th, done


def test_a_writer_waits_for_a_reader_holding_the_row_on_the_cheap_path() -> None:
    tm = loaded(lock_timeout=600)
    parts = tm.table("parts")
    reader = tm.begin(read_only=True)
    reader.read(parts, 1)
    reader.read(parts, 2)
    record = tm.locks.table[parts.item(1)]
    assert record.__class__ is Solo and tm.locks.table[parts.item(2)] is record
    th, done = queued_writer(tm, 1)
    # the writer waits: it neither wrote nor changed the reader's shared record
    assert th.is_alive() and done == [] and tm.locks.queued == 1
    assert tm.locks.holders(parts.item(1)) == {reader.hid: SHARED}
    assert dict(record) == {reader: SHARED} and tm.locks.table[parts.item(2)] is record
    assert parts.read(1) == {"price": 1}
    reader.commit()
    th.join(timeout=600)
    assert done == ["wrote"] and parts.read(1) == {"price": 100}
    tm.locks.check_idle()


def test_a_writer_times_out_on_a_row_a_reader_holds_on_the_cheap_path() -> None:
    # the same on the lock manager itself, without threads: the request cannot be granted
    lm = LockManager(timeout=0.05)
    tm = loaded()
    reader, writer = tm.begin(read_only=True), tm.begin()
    lm.acquire(reader, "parts.0", SHARED)
    assert lm.table["parts.0"].__class__ is Solo
    with pytest.raises(LockTimeoutError):
        lm.acquire(writer, "parts.0", EXCLUSIVE)
    assert lm.holders("parts.0") == {reader.hid: SHARED} and "parts.0" not in writer.locks
    lm.release_all(reader)
    lm.acquire(writer, "parts.0", EXCLUSIVE)
    assert lm.holders("parts.0") == {writer.hid: EXCLUSIVE}


def test_a_second_reader_shares_a_private_copy_and_the_first_keeps_its_other_rows() -> None:
    tm = loaded(lock_timeout=600)
    parts = tm.table("parts")
    first, second = tm.begin(read_only=True), tm.begin(read_only=True)
    first.read(parts, 0)
    first.read(parts, 1)
    solo = first.solo
    second.read(parts, 0)
    shared = tm.locks.table[parts.item(0)]
    assert shared.__class__ is RCB and dict(shared) == {first: SHARED, second: SHARED}
    assert dict(solo) == {first: SHARED} and tm.locks.table[parts.item(1)] is solo  # type: ignore[arg-type]
    first.commit()  # the shared row stays held by the second reader: a writer waits
    assert tm.locks.holders(parts.item(0)) == {second.hid: SHARED}
    assert parts.item(1) not in tm.locks.table
    th, done = queued_writer(tm, 0)
    assert th.is_alive() and done == []
    second.commit()
    th.join(timeout=600)
    assert done == ["wrote"]
    tm.locks.check_idle()


def test_a_reader_upgrades_one_row_and_keeps_the_others_shared() -> None:
    tm = loaded(lock_timeout=0.05)
    parts = tm.table("parts")
    txn = tm.begin()
    txn.read(parts, 0)
    txn.read(parts, 1)
    solo = txn.solo
    txn.put(parts, 0, {"price": 7})
    assert tm.locks.holders(parts.item(0)) == {txn.hid: EXCLUSIVE}
    assert tm.locks.table[parts.item(1)] is solo and dict(solo) == {txn: SHARED}  # type: ignore[arg-type]
    other = tm.begin()
    with pytest.raises(LockTimeoutError):
        other.put(parts, 1, {"price": 9})  # still read-locked by txn
    txn.commit()
    assert txn.solo is None  # (the cycle txn <-> its record is cut at the release)
    tm.locks.check_idle()


def test_hand_overs_move_cheap_locks_to_the_successor_and_a_writer_still_waits() -> None:
    tm = loaded(lock_timeout=0.05)
    parts = tm.table("parts")
    items = [parts.item(k) for k in range(4)]
    for reuse in (False, True):
        txn = tm.begin(read_only=True)
        for k in range(4):
            txn.read(parts, k)
        heir = tm.commit_and_continue(txn, items[:2], reuse=reuse)
        assert tm.resume(heir) == set()
        assert set(heir.locks) == set(items[:2]) and set(tm.locks.table) == set(items[:2])
        for item in items[:2]:
            assert tm.locks.holders(item) == {heir.hid: SHARED}
        for k in (0, 1):
            with pytest.raises(LockTimeoutError), tm.begin() as w:
                w.put(parts, k, {"price": 50})
        with tm.begin() as w:  # the rows not kept are free
            w.put(parts, 3, {"price": 50})
        heir.abort()
        tm.locks.check_idle()


def test_a_revocable_heir_loses_one_cheap_lock_and_keeps_the_rest() -> None:
    tm = loaded(lock_timeout=0.05)
    parts = tm.table("parts")
    txn = tm.begin(read_only=True)
    for k in range(3):
        txn.read(parts, k)
    heir = tm.commit_and_continue(txn, [parts.item(k) for k in range(3)], reuse=True)
    with tm.begin() as w:  # before resume: the writer takes the lock from the heir
        w.put(parts, 1, {"price": 70})
    assert tm.resume(heir) == {parts.item(1)}
    assert set(heir.locks) == {parts.item(0), parts.item(2)}
    for k in (0, 2):
        assert tm.locks.holders(parts.item(k)) == {heir.hid: SHARED}
        with pytest.raises(LockTimeoutError), tm.begin() as w:
            w.put(parts, k, {"price": 50})
    heir.commit()
    tm.locks.check_idle()


def test_the_shared_record_refuses_every_change() -> None:
    tm = loaded()
    txn = tm.begin(read_only=True)
    txn.read(tm.table("parts"), 0)
    solo = txn.solo
    assert solo is not None
    other = tm.begin()
    for change in (
        lambda: solo.__setitem__(other, SHARED),
        lambda: solo.__delitem__(txn),
        lambda: solo.pop(txn),
        lambda: solo.update({other: SHARED}),
        lambda: solo.setdefault(other, SHARED),
        lambda: solo.clear(),
        lambda: solo.popitem(),
        lambda: setattr(solo, "waiters", None),
    ):
        with pytest.raises(TransactionError, match="never changed"):
            change()
    assert dict(solo) == {txn: SHARED}
    txn.commit()
