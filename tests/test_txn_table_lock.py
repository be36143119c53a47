"""Whole-table shared locks (``LockManager.lock_table``) and writers' intention locks.

A reader that locks a table whole (``SparkCQ``'s ``s2pl`` per micro-batch)
must keep every writer of that table out until it ends, wait for the writers
already in, let writers of other tables and of each other go on, and show up
in the wait-for graph like any lock.
"""

from __future__ import annotations

import threading
import time

import pytest

from txstream.txn import DeadlockError, TransactionManager
from txstream.txn.base import EXCLUSIVE, INTENT_EXCLUSIVE, SHARED
from txstream.txn.locks import table_item


def loaded(**kw: object) -> TransactionManager:
    tm = TransactionManager("ss2pl", **kw)  # type: ignore[arg-type]
    for name in ("parts", "cats"):
        tm.table(name)
    with tm.begin() as t:
        for k in range(4):
            t.put("parts", k, {"price": k})
            t.put("cats", k, {"cat": k})
    return tm


def writer(tm: TransactionManager, table: str, key: int, log: list[str]) -> threading.Thread:
    """A writer of ``table``'s row ``key`` in another thread (started)."""

    def write() -> None:
        with tm.begin() as t:
            t.put(table, key, {"price": 100})
            log.append(f"wrote {table}.{key}")

    th = threading.Thread(target=write)
    th.start()
    return th


def wait_queued(tm: TransactionManager, th: threading.Thread, n: int = 1) -> None:
    while th.is_alive() and tm.locks.queued < n:
        time.sleep(0.001)


def test_a_writer_of_any_row_waits_for_the_whole_table_reader() -> None:
    tm = loaded(lock_timeout=600)
    reader = tm.begin(read_only=True)
    tm.protocol.lock_table(reader, "parts")  # type: ignore[attr-defined]
    assert tm.locks.holders(table_item("parts")) == {reader.hid: SHARED}
    log: list[str] = []
    th = writer(tm, "parts", 3, log)
    wait_queued(tm, th)
    # the writer holds its row but waits on the table: it has not written
    assert th.is_alive() and log == [] and tm.locks.queued == 1
    assert tm.table("parts").read(3) == {"price": 3}
    # a writer of another table is not held up
    other: list[str] = []
    writer(tm, "cats", 1, other).join(timeout=600)
    assert other == ["wrote cats.1"]
    reader.commit()
    th.join(timeout=600)
    assert log == ["wrote parts.3"] and tm.table("parts").read(3) == {"price": 100}
    tm.locks.check_idle()


def test_writers_of_a_guarded_table_share_its_intention_lock() -> None:
    # (nothing waits here when intention locks go together; if they did not, b's put
    # would wait for a in this one thread and end in a LockTimeoutError)
    tm = loaded(lock_timeout=5)
    tm.locks.guard("parts")
    a, b = tm.begin(), tm.begin()
    a.put("parts", 0, {"price": 9})
    b.put("parts", 1, {"price": 9})
    assert tm.locks.holders(table_item("parts")) == {
        a.hid: INTENT_EXCLUSIVE,
        b.hid: INTENT_EXCLUSIVE,
    }
    a.commit()
    b.commit()
    tm.locks.check_idle()


def test_the_table_lock_waits_for_a_writer_that_locked_its_row_before_the_guard() -> None:
    tm = loaded(lock_timeout=600)
    w = tm.begin()
    w.put("parts", 2, {"price": 50})  # no guard yet: the row's lock only
    assert tm.locks.holders(table_item("parts")) == {}
    reader = tm.begin(read_only=True)
    got: list[object] = []

    def read_all() -> None:
        tm.protocol.lock_table(reader, "parts")  # type: ignore[attr-defined]
        got.append(tm.table("parts").read(2))

    th = threading.Thread(target=read_all)
    th.start()
    wait_queued(tm, th)
    # the guard gave the writer its intention lock: the reader waits, it saw nothing
    assert th.is_alive() and got == []
    assert tm.locks.holders(table_item("parts"))[w.hid] == INTENT_EXCLUSIVE
    w.commit()
    th.join(timeout=600)
    assert got == [{"price": 50}]
    reader.commit()
    tm.locks.check_idle()


def test_a_whole_table_reader_that_writes_it_upgrades_to_exclusive() -> None:
    tm = loaded(lock_timeout=600)
    t = tm.begin()
    tm.protocol.lock_table(t, "parts")  # type: ignore[attr-defined]
    t.put("parts", 1, {"price": 7})
    assert tm.locks.holders(table_item("parts")) == {t.hid: EXCLUSIVE}
    t.commit()
    tm.locks.check_idle()


def test_deadlock_detection_sees_the_table_lock() -> None:
    """R holds a row of cats and waits for parts' table lock behind writer W; W wants R's row."""
    tm = loaded(lock_timeout=600)
    w = tm.begin()
    w.put("parts", 0, {"price": 1})  # W: the row, then (guarded below) nothing yet
    tm.locks.guard("parts")  # W is given its intention lock here
    r = tm.begin()
    r.read("cats", 1)  # R: a shared lock on cats.1
    errors: list[BaseException] = []

    def lock_parts() -> None:
        try:
            tm.protocol.lock_table(r, "parts")  # type: ignore[attr-defined]
        except BaseException as exc:
            errors.append(exc)

    th = threading.Thread(target=lock_parts)
    th.start()
    wait_queued(tm, th)
    assert th.is_alive() and tm.locks.queued == 1  # R waits for W's intention lock
    # W (older) asks for R's row: a cycle W -> R -> W; the younger, R, is the victim
    w.put("cats", 1, {"cat": 9})
    th.join(timeout=600)
    assert len(errors) == 1 and isinstance(errors[0], DeadlockError)
    assert r.status == "aborted" and tm.locks.deadlocks == 1
    w.commit()
    tm.locks.check_idle()


@pytest.mark.parametrize("first", ["reader", "writer"])
def test_writer_and_table_reader_never_overlap_under_threads(first: str) -> None:
    """Readers of the whole table see one committed state: two rows kept equal by writers."""
    tm = loaded(lock_timeout=600)
    with tm.begin() as t:
        t.put("parts", 0, {"price": 0})
        t.put("parts", 1, {"price": 0})
    stop = threading.Event()
    seen: list[tuple[object, object]] = []

    def write() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            with tm.begin() as t:
                t.put("parts", 0, {"price": n})
                time.sleep(0)  # let a reader in between the two rows, if it could
                t.put("parts", 1, {"price": n})

    def read() -> None:
        parts = tm.table("parts")
        for _ in range(200):
            r = tm.begin(read_only=True)
            tm.protocol.lock_table(r, "parts")  # type: ignore[attr-defined]
            a = parts.read(0)
            time.sleep(0)
            seen.append((a, parts.read(1)))
            r.commit()

    threads = [threading.Thread(target=write), threading.Thread(target=read)]
    if first == "reader":
        threads.reverse()
    for th in threads:
        th.start()
    threads[1 if first == "writer" else 0].join(timeout=600)  # the reader
    stop.set()
    for th in threads:
        th.join(timeout=600)
    assert len(seen) == 200 and all(a == b for a, b in seen)
    tm.locks.check_idle()
