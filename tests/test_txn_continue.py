"""The short paths of commit_and_continue (no log, recorder or order) under load.

Without a recorder, an ``ss2pl`` reader's hand-over runs through
``LockManager.pass_on`` (the kept locks move and the others are released under
one mutex acquisition; with nobody waiting anywhere, a shorter loop) and an
``optimistic`` reader's through a validation that skips the item-by-item look
when nothing was written since its earliest read.  The manager records no
history there, so these tests keep their own: every operation is logged while
the lock that orders it is held, and the history is checked with the project's
checker.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

from txstream.errors import TransientError
from txstream.model.check import check
from txstream.model.history import History, Operation
from txstream.txn import TransactionManager

ROWS = 8
TOTAL = 100 * ROWS


def loaded(protocol: str) -> TransactionManager:
    tm = TransactionManager(protocol)
    tm.table("parts")
    with tm.begin() as t:
        for k in range(ROWS):
            t.put("parts", k, 100)
    return tm


def test_pass_on_moves_kept_locks_releases_the_rest_and_reports_lost() -> None:
    tm = loaded("ss2pl")
    parts = tm.table("parts")
    calls: list[int] = []
    pass_on = tm.locks.pass_on
    tm.locks.pass_on = lambda *a: (calls.append(1), pass_on(*a))[1]  # type: ignore[method-assign]
    txn = tm.begin(read_only=True)
    for k in range(4):
        txn.read(parts, k)
    heir = tm.commit_and_continue(txn, [parts.item(k) for k in (1, 2, 3, 2, 7)])
    assert calls == [1] and txn.status == "committed" and not txn.locks
    assert tm.locks.holders(parts.item(0)) == {}  # released
    assert tm.locks.holders(parts.item(1)) == {heir.hid: 1}  # moved, not released
    assert tm.resume(heir) == {parts.item(7)}  # never read by txn: not vouched for
    assert set(heir.locks) == {parts.item(k) for k in (1, 2, 3)}
    heir.commit()
    tm.locks.check_idle()
    assert tm.locks.queued == 0


def test_pass_on_with_a_waiting_writer_releases_that_lock_to_it() -> None:
    tm = loaded("ss2pl")
    parts = tm.table("parts")
    txn = tm.begin(read_only=True)
    txn.read(parts, 0)
    txn.read(parts, 1)
    done = threading.Event()

    def writer() -> None:
        with tm.begin() as t:
            t.put(parts, 0, 50)
        done.set()

    th = threading.Thread(target=writer)
    th.start()
    while tm.locks.queued == 0:  # the writer queues behind txn's read lock
        threading.Event().wait(0.001)
    heir = tm.commit_and_continue(txn, [parts.item(0), parts.item(1)])
    assert done.wait(5)
    th.join()
    assert tm.resume(heir) == {parts.item(0)}
    assert set(heir.locks) == {parts.item(1)}
    heir.commit()
    tm.locks.check_idle()
    assert tm.locks.queued == 0


class Log:
    """Operations in the order they were made, each logged under the lock ordering it."""

    def __init__(self) -> None:
        self.ops: list[Operation] = []
        self.mutex = threading.Lock()

    def add(self, kind: str, txn: Any, item: str | None = None) -> None:
        with self.mutex:
            self.ops.append(Operation(kind, txn.hid, item))


def transfers(
    tm: TransactionManager, log: Log | None, seed: int, n: int, stop: threading.Event
) -> None:
    """Move amounts between two rows: the rows' total never changes."""
    rng = random.Random(seed)
    parts = tm.table("parts")
    for _ in range(n):
        if stop.is_set():
            return
        a, b = rng.sample(range(ROWS), 2)
        amount = rng.randint(1, 5)
        while not stop.is_set():
            t = tm.begin()
            try:
                for key, delta in ((a, -amount), (b, amount)):
                    value = t.read(parts, key)
                    if log is not None:
                        log.add("r", t, parts.item(key))
                    t.put(parts, key, value + delta)
                    if log is not None:
                        log.add("w", t, parts.item(key))
                t.commit()
            except TransientError:
                if log is not None:
                    log.add("a", t)
                continue
            if log is not None:
                log.add("c", t)
            break


@pytest.mark.parametrize("protocol", ["ss2pl", "optimistic"])
def test_a_reader_chain_sees_the_total_while_writers_transfer(protocol: str) -> None:
    """Each window reads every row: those kept from the previous window it does not
    read again (their reads were handed on), the others it reads now; the sum it
    sees is always the total, and under ss2pl the logged history is conflict
    serializable."""
    tm = TransactionManager(protocol, lock_timeout=10)
    tm.table("parts")
    with tm.begin() as t:
        for k in range(ROWS):
            t.put("parts", k, 100)
    parts = tm.table("parts")
    log = Log() if protocol == "ss2pl" else None
    stop = threading.Event()
    writers = [threading.Thread(target=transfers, args=(tm, log, k, 300, stop)) for k in range(2)]
    for th in writers:
        th.start()
    rng = random.Random(7)
    txn = tm.begin(read_only=True)
    held: dict[int, int] = {}
    windows = 0
    try:
        while any(th.is_alive() for th in writers) or windows < 50:
            try:
                for key in range(ROWS):
                    if key not in held:
                        held[key] = txn.read(parts, key)
                        if log is not None:
                            log.add("r", txn, parts.item(key))
                seen = sum(held.values())
                keep = sorted(rng.sample(range(ROWS), rng.randint(0, ROWS)))
                heir = tm.commit_and_continue(txn, [parts.item(k) for k in keep])
            except TransientError:  # a deadlock victim, or a failed validation
                if log is not None:
                    log.add("a", txn)
                txn, held = tm.begin(read_only=True), {}
                continue
            assert seen == TOTAL  # (optimistic: what a window that committed saw)
            if log is not None:
                log.add("c", txn)
            time.sleep(0)  # let writers in: they may revoke kept locks until resume
            lost = tm.resume(heir)
            time.sleep(0)  # and write what it did not keep before it reads again
            held = {k: held[k] for k in keep if parts.item(k) not in lost}
            if log is not None:  # its reads of the kept rows: under locks held since
                for k in held:
                    log.add("r", heir, parts.item(k))
            txn = heir
            windows += 1
        txn.commit()
    finally:
        if txn.status == "active":
            txn.abort()  # a failed check must not leave the writers waiting for its locks
        stop.set()
        for th in writers:
            th.join()
    with tm.begin(read_only=True) as t:
        assert sum(t.read(parts, k) for k in range(ROWS)) == TOTAL
    if log is not None:
        tm.locks.check_idle()
        assert tm.locks.queued == 0
        assert check(History.of_operations(log.ops), "cs").holds
    else:
        assert not tm.active_since


class _CountedReads(dict[str, int]):
    """A read set that counts the passes made over it (``values()``, ``items()``)."""

    walks = 0

    def values(self) -> Any:
        self.walks += 1
        return super().values()

    def items(self) -> Any:
        self.walks += 1
        return super().items()


def test_a_kept_read_set_is_validated_without_a_walk_when_nothing_was_written_since() -> None:
    """``optimistic``: after a validating ``commit_keeping_all``, the next commit of the
    same read set looks at no item when no commit wrote anything since, even if a
    write came between the earliest read and that commit; one after it still fails."""
    tm = loaded("optimistic")
    parts = tm.table("parts")
    txn = tm.begin(read_only=True)
    txn.reads = _CountedReads()
    for k in range(4):
        txn.read(parts, k)
    with tm.begin() as w:  # a write after the reads, to a row the reader did not read
        w.put(parts, 7, 1)
    assert tm.commit_keeping_all(txn) is txn  # validated item by item: nothing read changed
    txn.read(parts, 5)
    before = txn.reads.walks  # type: ignore[attr-defined]
    assert tm.commit_keeping_all(txn) is txn
    assert txn.reads.walks == before  # type: ignore[attr-defined]
    with tm.begin() as w:  # now a write to a row of the kept read set
        w.put(parts, 2, 1)
    txn.read(parts, 6)
    with pytest.raises(TransientError, match=r"parts\.2 changed after it was read"):
        tm.commit_keeping_all(txn)
    assert txn.status == "aborted"


def test_a_read_set_handed_on_is_validated_from_its_reads_again() -> None:
    """``commit_and_continue(reuse=True)`` gives the object a new read set: a write
    between its commit and the successor's reads is judged by those reads' clocks."""
    tm = loaded("optimistic")
    parts = tm.table("parts")
    txn = tm.begin(read_only=True)
    for k in range(4):
        txn.read(parts, k)
    assert tm.commit_keeping_all(txn) is txn
    heir = tm.commit_and_continue(txn, [parts.item(1)], reuse=True)
    assert heir is txn
    tm.resume(heir)
    with tm.begin() as w:
        w.put(parts, 1, 1)
    with pytest.raises(TransientError, match=r"parts\.1 changed after it was read"):
        heir.commit()


def test_the_manager_asks_the_protocol_not_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """A protocol derived from ``ss2pl`` or ``optimistic`` under another name gets the
    readers' short paths and ``begin_snapshot`` through the protocol's hooks."""
    from txstream.txn.protocols import PROTOCOLS, SS2PL, Optimistic

    class AuditedLocks(SS2PL):
        name = "ss2pl-audited"

    class AuditedOptimistic(Optimistic):
        name = "optimistic-audited"

    for cls in (AuditedLocks, AuditedOptimistic):
        monkeypatch.setitem(PROTOCOLS, cls.name, cls)
        tm = loaded(cls.name)
        parts = tm.table("parts")
        txn = tm.begin(read_only=True)
        txn.read(parts, 0)
        assert tm.commit_keeping_all(txn) is txn  # the short path: nothing moved
        assert tm.commit_and_continue(txn, [parts.item(0)], reuse=True) is txn
        assert tm.resume(txn) == set()
        txn.commit()
    snap = tm.begin_snapshot()  # (the last one: optimistic-audited)
    assert snap.snapshot_ts == tm.clock
    snap.commit()
