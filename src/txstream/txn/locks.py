"""The lock manager: a Resource Control Block per item, deadlock detection, orderings.

Data structures (EDBT 2012 Section 4.1, after Weikum & Vossen):

* an :class:`RCB` per locked item: the transactions holding it with their
  modes, and a FIFO queue of waiting requests;
* the *Transaction Control Block* is the transaction itself: its ``locks`` dict
  (item -> mode) lists everything to release at the end;
* a hash table (``dict``) maps each item to its RCB; an RCB is dropped when its
  last holder leaves and no one waits;
* an item that one transaction alone holds in shared mode, with nobody
  waiting, maps to that transaction's :class:`Solo` record: one RCB per
  transaction, shared by all such items, never changed in place.  A reader's
  uncontended lock then allocates nothing (a record per lock costs about as
  much again as the lock's two dict insertions, and under the garbage
  collector each record is one more object to track); the first request of
  another party replaces it by a private copy (copy-on-write, under the mutex).

Shared (S) locks are compatible with each other, exclusive (X) locks with
nothing.  A holder of S that asks for X *upgrades*: it is granted at once when
it is the only holder, else it waits at the head of the queue.  New requests
respect the queue (no overtaking), so writers do not starve.

A request that must wait adds edges to the *wait-for graph* (to each
incompatible holder and each incompatible request ahead of it in the queue);
the graph is searched at once for a cycle through the requester.  If there is
one, the youngest transaction on it is the victim: its wait ends with
:class:`~txstream.txn.base.DeadlockError`, a retryable error, and it is aborted.
An optional ``timeout`` bounds every wait (:class:`LockTimeoutError`).

**Whole-table read locks** (:meth:`LockManager.guard`, multiple granularity
after Gray et al.): a reader that reads most rows of a table may lock the
table's item (:func:`table_item`) in shared mode once instead of each row.
Once a table is guarded, every writer of one of its rows also holds an
``INTENT_EXCLUSIVE`` lock on the table's item, taken right after the row's
lock; intention locks are compatible with each other and not with the
table's shared lock, so a writer waits for the whole-table reader (and the
reader for the writers before it) like any other conflict, in the same
queues and the same wait-for graph.

With ``ordered=True`` the manager enforces a *predefined order* (Section 4.3):
each transaction carries a sequence number (its arrival position), conflicting
operations must follow that order, and commits happen in it.  A request that
conflicts with a *younger* holder wounds it (wound-wait): the younger
transaction is aborted with :class:`WoundedError` and retried later under the
same sequence number; a younger one simply waits for an older one.  Since
every wait then goes from younger to older, no deadlock can arise, and every
conflict between committed transactions follows sequence order, so the
histories are CSAO, not just CS.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

from txstream.txn.base import (
    ABORTED,
    ACTIVE,
    EXCLUSIVE,
    INTENT_EXCLUSIVE,
    SHARED,
    STATE_NAMES,
    DeadlockError,
    LockTimeoutError,
    TransactionError,
    WoundedError,
)

if TYPE_CHECKING:
    from txstream.txn.manager import Transaction


class Waiter:
    """A queued lock request; its thread sleeps on ``gate`` until it is decided."""

    __slots__ = ("error", "gate", "granted", "item", "mode", "rcb", "txn")

    def __init__(self, txn: Transaction, item: str, mode: int, rcb: RCB) -> None:
        self.txn = txn
        self.item = item
        self.mode = mode
        self.rcb = rcb
        self.gate = threading.Lock()
        self.gate.acquire()
        self.granted = False
        self.error: Exception | None = None


class RCB(dict["Transaction", int]):
    """Resource Control Block: who holds an item, in which mode, and who waits.

    The RCB is itself the dict of holders (transaction -> mode), so that the
    uncontended paths create and change it with C-level dict operations only
    (an empty RCB is false: nobody holds the item).
    """

    # the FIFO queue of waiting requests, created at the first wait (an instance
    # attribute then; until then this class attribute answers)
    waiters: deque[Waiter] | None = None


class Solo(RCB):
    """The RCB of every item one transaction alone holds in shared mode, nobody waiting.

    ``{txn: SHARED}``, made once per transaction (:func:`solo_of`) and shared
    by all those items of the lock table, so a reader's uncontended lock
    (``table.setdefault(item, solo)``) makes no object.  It is read like any
    RCB (its holders, their modes, no waiters) but never changed: whoever must
    change an item's record (add a holder, queue a waiter, move or revoke the
    lock) first puts a private copy in the table, under the mutex
    (:meth:`LockManager._private`).  Changing it raises, so that a missed copy
    is a loud bug, not a lock silently granted or dropped on every item.
    """

    def _shared(self, *args: object, **kwargs: object) -> None:
        raise TransactionError("internal: a Solo lock record is shared and never changed")

    __setitem__ = __delitem__ = pop = popitem = clear = update = setdefault = _shared  # type: ignore[assignment]
    __setattr__ = _shared


def solo_of(txn: Transaction) -> Solo:
    """``txn``'s :class:`Solo` record, made at its first use.

    (It refers to ``txn`` and ``txn`` to it: :meth:`LockManager.release_all`
    drops the link when the transaction's locks go, so that an ended
    transaction is freed by reference counting, not left to the collector.)
    """
    solo = txn.solo
    if solo is None:
        solo = txn.solo = Solo({txn: SHARED})
    return solo


def _compatible(rcb: RCB, txn: Transaction, mode: int) -> bool:
    """Whether ``txn`` could hold ``mode`` next to the other holders of ``rcb``.

    Two modes go together only when they are equal and not ``EXCLUSIVE``
    (shared with shared, intention with intention).
    """
    for other, held in rcb.items():
        if other is not txn and (mode != held or mode == EXCLUSIVE):
            return False
    return True


def table_item(table: str) -> str:
    """The item a whole-table lock of ``table`` locks (``<table>.*``).

    No row's item can be it: a row's is ``<table>.<key>`` with the key's
    characters outside ``[A-Za-z0-9_.:-]`` replaced (``storage.base.item_name``).
    """
    return table + ".*"


class LockManager:
    """Shared/exclusive locks with FIFO queues, upgrades and deadlock detection."""

    def __init__(self, timeout: float | None = None, ordered: bool = False) -> None:
        self.timeout = timeout
        self.ordered = ordered
        self.mutex = threading.Lock()
        self.turn = threading.Condition(self.mutex)
        self.table: dict[str, RCB] = {}
        self.deadlocks = 0
        self.timeouts = 0
        self.wounds = 0
        # tables locked whole by some reader once (see guard): their writers also take
        # an intention lock on the table's item (replaced, never changed in place)
        self.guarded: frozenset[str] = frozenset()
        self.waits = 0
        self.queued = 0  # requests waiting in all the queues now (changed under the mutex)
        # predefined ordering: sequence numbers finished and the lowest unfinished one
        self._next_seq = 0
        self._finished: set[int] = set()
        # the latest attempt holding each unfinished sequence number, so that a
        # transaction that waits too long for its turn can name the one it waits for
        self._holders: dict[int, Transaction] = {}

    # -- acquiring -----------------------------------------------------------------------

    def acquire(self, txn: Transaction, item: str, mode: int, held: int | None = None) -> None:
        """Grant ``txn`` a lock of ``mode`` on ``item``, waiting if need be.

        ``held`` is the mode ``txn`` already holds on ``item`` (0: none), when the
        caller has looked it up already.
        """
        if held is None:
            held = txn.locks.get(item, 0)
        if held:
            if held in (mode, EXCLUSIVE):
                return
            # an upgrade: S to X, or S and IX on one table's item (a whole-table reader
            # that writes it, or the reverse), which X covers (less concurrent than a
            # shared-and-intention mode, never less safe)
            mode = EXCLUSIVE
        table = self.table
        if not held:
            # Fast path for an item nobody has locked: publish an RCB with
            # ``dict.setdefault``, which is atomic under the GIL, so no mutex is
            # needed (a shared lock: txn's Solo record, made once).  Everything else
            # about an RCB changes under the mutex, and an RCB is only removed from
            # the table under it.
            fresh: RCB
            if mode == SHARED:
                fresh = txn.solo or solo_of(txn)
            else:
                fresh = RCB()
                fresh[txn] = mode
            if table.setdefault(item, fresh) is fresh:
                txn.locks[item] = mode
                return
        with self.mutex:
            if txn.doomed is not None:
                raise txn.doomed
            rcb = table.get(item)
            if rcb is None:
                fresh = RCB()
                fresh[txn] = mode
                rcb = table.setdefault(item, fresh)  # a fast path may race us here
                if rcb is fresh:
                    txn.locks[item] = mode
                    return
            if rcb.__class__ is Solo:
                rcb = self._private(item, rcb)  # changed below (a holder, a waiter)
            if (held or not rcb.waiters) and _compatible(rcb, txn, mode):
                rcb[txn] = mode
                txn.locks[item] = mode
                return
            if (
                self._revoke(rcb, item, txn, mode)
                and (held or not rcb.waiters)
                and _compatible(rcb, txn, mode)
            ):
                # (a lock is handed over only where nobody waits, and a conflicting
                # request revokes before it queues: no waiter is ever behind a
                # revocable holder, so none can be left ungranted here)
                rcb[txn] = mode
                txn.locks[item] = mode
                return
            waiter = Waiter(txn, item, mode, rcb)
            self._enqueue(rcb, waiter, upgrade=bool(held))
            if rcb.waiters and rcb.waiters[0] is waiter:
                # Queued at the head (an older transaction, or an upgrade): it may be
                # grantable right away.
                self._grant(item, rcb)
                if waiter.granted:
                    return
            txn.waiting = waiter
            self.waits += 1
            if self.ordered:
                self._wound_younger(waiter)
            else:
                # The new edges may close several cycles; break them one by one.
                while self._detect(waiter) and waiter.error is None:
                    pass
        self._wait(waiter)

    # -- whole-table locks ----------------------------------------------------------------

    def guard(self, table: str) -> None:
        """Make every writer of a row of ``table`` hold an intention lock on :func:`table_item`.

        Called before a whole-table shared lock is first requested (see
        :meth:`lock_table`); for good (a guarded table costs each of its writers
        one more lock).  A writer checks :attr:`guarded` right *after* its row's
        lock is in the table, and this call sets it *before* it looks at the
        table: so either the writer sees the guard and asks for its intention
        lock, or its row lock is found here and it is given the intention lock
        at once (nobody holds the table's shared lock yet: it is granted only
        after this returns).
        """
        with self.mutex:
            if table in self.guarded:
                return
            self.guarded = self.guarded | {table}
            whole = table_item(table)
            prefix = table + "."
            # (a copy made in one C call, under the GIL: lock-free paths may add items)
            for item, rcb in list(self.table.items()):
                if not item.startswith(prefix) or item == whole:
                    continue
                for txn, mode in list(rcb.items()):
                    if mode == EXCLUSIVE and whole not in txn.locks:
                        own = self.table.get(whole)
                        if own is None:
                            own = self.table[whole] = RCB()
                        own[txn] = INTENT_EXCLUSIVE
                        txn.locks[whole] = INTENT_EXCLUSIVE

    def intend(self, txn: Transaction, item: str) -> None:
        """A writer that just locked row ``item`` exclusively: the intention lock, if guarded.

        Only for tables in :attr:`guarded` (the caller checked it is not empty).
        """
        table = item.partition(".")[0]
        if table in self.guarded:
            whole = table_item(table)
            self.acquire(txn, whole, INTENT_EXCLUSIVE, txn.locks.get(whole, 0))

    def lock_table(self, txn: Transaction, table: str) -> None:
        """A shared lock on all of ``table``'s rows at once, held like any lock until the end.

        Waits for the writers that hold a row of it; writers that come later
        wait for ``txn`` (see :meth:`guard`).  Rows ``txn`` reads need no lock of
        their own then.
        """
        self.guard(table)
        self.acquire(txn, table_item(table), SHARED)

    def _private(self, item: str, rcb: RCB) -> RCB:
        """A private copy of the shared :class:`Solo` record ``rcb``, in the table for ``item``.

        Mutex held; every path that changes an item's record calls it first.
        """
        own = self.table[item] = RCB(rcb)
        return own

    def _revoke(self, rcb: RCB, item: str, txn: Transaction, mode: int) -> bool:
        """Take handed-over locks that conflict with ``txn``'s request from their heirs.

        A lock handed over by :meth:`hand_over` stays revocable until its heir
        resumes (:meth:`resume`): the heir has not used it yet, so nobody waits for
        it; the heir learns the item is lost and reads it afresh.  Mutex held.
        Returns whether anything was revoked.
        """
        revoked = False
        holders = rcb
        for other in [t for t in rcb if t.lost is not None and t is not txn]:
            if mode != holders[other] or mode == EXCLUSIVE:
                del holders[other]
                del other.locks[item]
                other.lost.add(item)  # type: ignore[union-attr]
                revoked = True
        return revoked

    def _enqueue(self, rcb: RCB, waiter: Waiter, upgrade: bool) -> None:
        queue = rcb.waiters
        if queue is None:
            queue = rcb.waiters = deque()
        if self.ordered:
            # Older transactions (smaller sequence numbers) go first.
            seq = waiter.txn.order
            pos = len(queue)
            while pos and queue[pos - 1].txn.order > seq:
                pos -= 1
            queue.insert(pos, waiter)
        elif upgrade:
            queue.appendleft(waiter)
        else:
            queue.append(waiter)
        self.queued += 1

    def _wait(self, waiter: Waiter) -> None:
        txn = waiter.txn
        if not waiter.gate.acquire(timeout=-1 if self.timeout is None else self.timeout):
            with self.mutex:
                if not waiter.granted and waiter.error is None:
                    blockers = ", ".join(t.hid for t in self._blockers(waiter)) or "nobody"
                    self._dequeue(waiter)
                    self.timeouts += 1
                    waiter.error = LockTimeoutError(
                        f"transaction {txn.hid} waited more than {self.timeout} s for a "
                        f"lock on {waiter.item} (held or requested first by transaction "
                        f"{blockers}); retry it"
                    )
        txn.waiting = None
        if waiter.error is not None:
            raise waiter.error

    def _dequeue(self, waiter: Waiter) -> None:
        """Take a waiting request out of its queue (mutex held) and wake whoever can go."""
        try:
            waiter.rcb.waiters.remove(waiter)  # type: ignore[union-attr]
        except (ValueError, AttributeError):
            return
        self.queued -= 1
        waiter.txn.waiting = None
        self._grant(waiter.item, waiter.rcb)

    def _cancel(self, waiter: Waiter, error: Exception) -> None:
        """End a wait with ``error`` (mutex held)."""
        if waiter.granted or waiter.error is not None:
            return
        waiter.error = error
        self._dequeue(waiter)
        waiter.gate.release()

    # -- deadlocks ------------------------------------------------------------------

    def _blockers(self, waiter: Waiter) -> list[Transaction]:
        """The transactions ``waiter`` waits for: wait-for edges out of its transaction."""
        txn, mode, rcb = waiter.txn, waiter.mode, waiter.rcb
        out = [
            other
            for other, held in rcb.items()
            if other is not txn and (mode != held or mode == EXCLUSIVE)
        ]
        for ahead in rcb.waiters or ():
            if ahead is waiter:
                break
            if ahead.txn is not txn and (mode != ahead.mode or mode == EXCLUSIVE):
                out.append(ahead.txn)
        return out

    def _detect(self, waiter: Waiter) -> bool:
        """Search the wait-for graph for a cycle through ``waiter.txn``; break it.

        Returns whether a cycle was found (there may be more: search again).
        """
        start = waiter.txn
        path: list[Transaction] = [start]
        seen: set[int] = {start.id}
        stack = [iter(self._blockers(waiter))]
        cycle: list[Transaction] | None = None
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                path.pop()
                continue
            if nxt is start:
                cycle = list(path)
                break
            if nxt.id in seen:
                continue
            pending = nxt.waiting
            if pending is None or pending.granted or pending.error is not None:
                continue
            seen.add(nxt.id)
            path.append(nxt)
            stack.append(iter(self._blockers(pending)))
        if cycle is None:
            return False
        victim = max(cycle, key=lambda t: t.id)
        self.deadlocks += 1
        names = " -> ".join(t.hid for t in [*cycle, cycle[0]])
        victim_waiter = victim.waiting
        assert victim_waiter is not None
        self._cancel(
            victim_waiter,
            DeadlockError(
                f"transaction {victim.hid} aborted to break the deadlock {names}; retry it"
            ),
        )
        return True

    # -- predefined ordering -------------------------------------------------------

    def _wound_younger(self, waiter: Waiter) -> None:
        """Wound every younger transaction that ``waiter`` would wait for."""
        me = waiter.txn
        for other in self._blockers(waiter):
            if other.order > me.order:
                self.wound(other, f"wounded by older transaction {me.hid} on {waiter.item}")

    def wound(self, txn: Transaction, reason: str) -> None:
        """Doom ``txn`` (mutex held): it aborts at its next call into the manager."""
        if txn.doomed is not None or txn.state != ACTIVE:
            return
        self.wounds += 1
        txn.doomed = WoundedError(f"transaction {txn.hid} {reason}; retry it")
        if txn.waiting is not None:
            self._cancel(txn.waiting, txn.doomed)
        self.turn.notify_all()

    def register_order(self, txn: Transaction) -> None:
        """Note that ``txn`` (a new transaction or a retry) now holds its sequence number."""
        self._holders[txn.order] = txn

    def wait_turn(self, txn: Transaction) -> None:
        """Block until every transaction ordered before ``txn`` has finished.

        The wait is bounded by the lock timeout like every other wait: an earlier
        transaction left open must not stop every later commit forever.
        """
        timeout = self.timeout
        with self.mutex:
            if timeout is None:
                while self._next_seq < txn.order and txn.doomed is None:
                    self.turn.wait()
            else:
                deadline = time.monotonic() + timeout
                while self._next_seq < txn.order and txn.doomed is None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self.timeouts += 1
                        raise LockTimeoutError(self._turn_timeout(txn))
                    self.turn.wait(left)
            if txn.doomed is not None:
                raise txn.doomed

    def _turn_timeout(self, txn: Transaction) -> str:
        """Why ``txn`` waited too long for its turn: the first unfinished one before it."""
        seq = self._next_seq
        blocker = self._holders.get(seq)
        if blocker is None:
            who = f"the transaction at position {seq} of the order"
        else:
            state = STATE_NAMES[blocker.state]
            who = f"transaction {blocker.hid} (position {seq}, {state})"
            if blocker.state == ABORTED:
                who += ", aborted but neither retried nor given up (tm.give_up)"
        return (
            f"transaction {txn.hid} waited more than {self.timeout} s for its turn in the "
            f"predefined order: {who} has not finished; commit or abort it, then retry"
        )

    def finish_order(self, seq: int) -> None:
        """Sequence number ``seq`` is done (committed, or abandoned for good)."""
        with self.mutex:
            self._holders.pop(seq, None)
            self._finished.add(seq)
            while self._next_seq in self._finished:
                self._finished.discard(self._next_seq)
                self._next_seq += 1
            self.turn.notify_all()

    # -- ending ------------------------------------------------------------------------

    def start_commit(self, txn: Transaction, committing: int) -> None:
        """Check ``txn`` was not doomed and mark it committing, atomically."""
        with self.mutex:
            if txn.doomed is not None:
                raise txn.doomed
            txn.state = committing

    def release_all(self, txn: Transaction) -> None:
        """Release every lock of ``txn`` (its TCB) and grant what can be granted."""
        txn.solo = None  # (no item refers to it once released: see solo_of)
        locks = txn.locks
        if not locks:
            return
        with self.mutex:
            self._release(txn, locks)
        locks.clear()

    def _release(self, txn: Transaction, items: Iterable[str]) -> None:
        """Drop ``txn`` from the holders of ``items`` and grant what waits (the mutex held)."""
        table = self.table
        for item in items:
            rcb = table.get(item)
            if rcb is None:  # pragma: no cover - defensive
                continue
            if rcb.__class__ is Solo:
                if txn in rcb:  # (txn's own: it alone held the item, nobody waits)
                    del table[item]
                continue
            rcb.pop(txn, None)
            if rcb.waiters:
                self._grant(item, rcb)
            elif not rcb:
                del table[item]

    def hand_over(self, txn: Transaction, heir: Transaction, items: Iterable[str]) -> None:
        """Move ``txn``'s shared locks on ``items`` to ``heir`` without releasing them.

        For a transaction about to commit whose successor reads the same rows
        again: the rows cannot change in between.  A lock is moved only when no
        request waits for it (a waiting writer gets it at ``txn``'s release, as
        it would have); items not moved, and those revoked later, are collected
        in ``heir.lost``.  Until :meth:`resume` the moved locks are *revocable*:
        a conflicting request takes them from ``heir`` instead of waiting (the
        heir has not used them yet; its thread may be the one asking).  Under a
        predefined order nothing is moved (wound-wait would need the heir's
        position).
        """
        lost: set[str] = set()
        heir.lost = lost  # revocable from now on, before any lock is visible as the heir's
        if self.ordered:
            lost.update(items)
            return
        table = self.table
        mine, theirs = txn.locks, heir.locks
        with self.mutex:
            for item in items:
                if item in theirs:
                    continue  # listed twice
                rcb = table.get(item)
                if mine.get(item) != SHARED or rcb is None or rcb.waiters:
                    lost.add(item)
                    continue
                if rcb.__class__ is Solo:
                    table[item] = heir.solo or solo_of(heir)
                else:
                    del rcb[txn]
                    rcb[heir] = SHARED
                del mine[item]
                theirs[item] = SHARED

    def pass_on(self, txn: Transaction, heir: Transaction, items: Iterable[str]) -> None:
        """:meth:`hand_over` and :meth:`release_all` at once, for a ``txn`` that committed.

        Moves ``txn``'s shared locks on ``items`` to ``heir`` where nobody waits
        for them (the others go to ``heir.lost``, which the caller has set, as
        :meth:`hand_over` does it), then releases every other lock of ``txn``,
        all under one acquisition of the mutex.  ``txn`` held every lock until
        now, so its locks never have a gap; the moved ones are revocable until
        :meth:`resume`.  Not under a predefined order (use :meth:`hand_over`).
        """
        lost = heir.lost
        assert lost is not None and not self.ordered
        table = self.table
        mine, theirs = txn.locks, heir.locks
        with self.mutex:
            if not self.queued:
                # Nobody waits for any lock (so for none of these): the same, short.
                # (A reader holds only shared locks: an item it holds moves.)
                solo = heir.solo or solo_of(heir)
                for item in items:
                    if item in mine:
                        rcb = table[item]
                        if rcb.__class__ is Solo:
                            table[item] = solo
                        else:
                            del rcb[txn]
                            rcb[heir] = SHARED
                        del mine[item]
                        theirs[item] = SHARED
                    elif item not in theirs:
                        lost.add(item)
                for item in mine:
                    rcb = table[item]
                    if rcb.__class__ is Solo:
                        del table[item]
                        continue
                    del rcb[txn]
                    if not rcb:
                        del table[item]
                mine.clear()
                txn.solo = None
                return
            for item in items:
                held = table.get(item)
                if held is None or held.waiters or mine.get(item) != SHARED:
                    if item not in theirs:
                        lost.add(item)
                    continue
                if held.__class__ is Solo:
                    table[item] = heir.solo or solo_of(heir)
                else:
                    del held[txn]
                    held[heir] = SHARED
                del mine[item]
                theirs[item] = SHARED
            self._release(txn, mine)
        mine.clear()
        txn.solo = None

    def keep_only(self, txn: Transaction, items: Iterable[str]) -> None:
        """:meth:`pass_on` for a ``txn`` that committed and goes on as its own successor.

        ``txn``'s shared locks on ``items`` stay where they are, except those a
        request waits for, which are released (the waiter gets it, as it would
        have); those and the ``items`` ``txn`` did not hold go to ``txn.lost``.
        Every other lock of ``txn`` is released.  All under one acquisition of the
        mutex; the kept locks are revocable (``txn.lost`` is set) until
        :meth:`resume`.  Not under a predefined order (use :meth:`hand_over`).
        """
        assert not self.ordered
        keep = items if items.__class__ is set else set(items)
        mine = txn.locks
        table = self.table
        with self.mutex:
            if not self.queued:
                # Nobody waits for any lock: release what is not kept, short.  The kept
                # locks move to a new dict of txn's (usually far fewer than those
                # dropped), so that the old one holds exactly the dropped items: no set
                # of them is built, and the old dict is freed in one go.  (Other threads
                # look at txn.locks only under the mutex, held here.)
                kept: dict[str, int] = {}
                lost: set[str] = set()
                take = mine.pop
                for item in keep:
                    mode = take(item, 0)
                    if mode:
                        kept[item] = mode
                    else:
                        lost.add(item)  # never held: not vouched for
                txn.lost = lost
                txn.locks = kept
                # the dropped items' records in one pass in C; when txn alone holds each
                # (every one equal to {txn: SHARED}, its Solo record being that), they
                # leave the table in another.  A record someone else holds too must
                # never leave it, not even for a moment: a lock-free fast path
                # (acquire's setdefault, in another thread) would find the row free and
                # take it, and the record put back would drop that lock.  (Nothing
                # changes them in between: the mutex is held, and a fast path only adds
                # items that are absent.)
                rcbs = list(map(table.__getitem__, mine))
                solo = txn.solo
                if solo is not None and rcbs.count(solo) == len(rcbs):
                    deque(map(table.pop, mine), maxlen=0)
                else:
                    for item, rcb in zip(mine, rcbs, strict=True):
                        if len(rcb) == 1:
                            del table[item]
                        else:
                            del rcb[txn]
                return
            # the kept items txn does not hold (never held: not vouched for)
            lost = keep - mine.keys()
            txn.lost = lost
            awaited = [item for item in mine if item not in keep or table[item].waiters]
            for item in awaited:
                if item in keep:
                    lost.add(item)
                del mine[item]
            self._release(txn, awaited)

    def resume(self, heir: Transaction) -> set[str]:
        """End the revocable state of ``heir``'s handed-over locks; the items it lost."""
        with self.mutex:
            lost = heir.lost
            heir.lost = None
        return lost if lost is not None else set()

    def _grant(self, item: str, rcb: RCB) -> None:
        """Grant queued requests from the head while they are compatible (mutex held)."""
        queue = rcb.waiters
        while queue:
            waiter = queue[0]
            if not _compatible(rcb, waiter.txn, waiter.mode):
                break
            queue.popleft()
            self.queued -= 1
            rcb[waiter.txn] = waiter.mode
            waiter.txn.locks[item] = waiter.mode
            waiter.granted = True
            waiter.txn.waiting = None
            waiter.gate.release()
        if not queue and not rcb and self.table.get(item) is rcb:
            del self.table[item]

    def holders(self, item: str) -> dict[str, int]:
        """Who holds ``item`` and in which mode (for tests and tools)."""
        with self.mutex:
            rcb = self.table.get(item)
            return {} if rcb is None else {t.hid: m for t, m in rcb.items()}

    def check_idle(self) -> None:
        """Raise :class:`TransactionError` if any lock is still held (for tests)."""
        with self.mutex:
            if self.table:
                raise TransactionError(f"locks still held on {sorted(self.table)[:5]}")


__all__ = [
    "EXCLUSIVE",
    "INTENT_EXCLUSIVE",
    "RCB",
    "SHARED",
    "LockManager",
    "Solo",
    "Waiter",
    "solo_of",
    "table_item",
]
