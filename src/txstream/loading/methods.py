"""The loading methods by name: ``naive``, ``partition`` and ``reorder``.

* ``naive`` spreads operations over the k sessions at random; each session runs
  its queue in order.  Two sessions may change one tuple at once, and through
  join-view maintenance transactions on different relations lock each other's
  tuples: deadlocks.
* ``partition`` (Section 2.3) hashes each operation's partitioning attributes,
  so every operation on one tuple goes through one session; with no join views
  this is deadlock-free, with them it is not (Section 3.1).
* ``reorder`` (Section 3.2) partitions and, in addition, starts a transaction
  only when it is *desirable*: no running transaction modifies a conflicting
  relation.  The array ``J`` counts running transactions per relation; a free
  session searches its queue front to back for a desirable transaction
  (Action 3); when a relation's count drops to zero the other free sessions
  search again (Action 2).  Starvation prevention: a pointer ``r`` walks the
  non-empty queues; if it stays at queue ``v`` longer than ``TS`` seconds, the
  first transaction of ``Q_v`` becomes the *header transaction*, and while it
  waits only transactions that do not conflict with it may start.
"""

from __future__ import annotations

import random
import time
from collections import deque
from typing import ClassVar

from txstream.errors import TxStreamError, UnknownNameError
from txstream.loading.base import LoadingMethod, LoadTransaction, stable_hash
from txstream.loading.ops import Key, Modification
from txstream.loading.schema import Schema


class QueueMethod(LoadingMethod):
    """A FIFO queue ``Q_m`` per session; ``take`` runs the head of the queue."""

    def bind(self, schema: Schema, k: int, seed: int) -> None:
        """Set up empty queues."""
        super().bind(schema, k, seed)
        self.queues: list[deque[LoadTransaction]] = [deque() for _ in range(k)]
        self.running: dict[int, LoadTransaction] = {}

    def enqueue(self, txn: LoadTransaction) -> None:
        """Action 1: append to ``Q_m`` and wake session ``m``."""
        with self._lock:
            if self._closed:
                raise TxStreamError(f"loading method {self.name} is closed")
            txn.enqueued_at = time.monotonic()
            self.queues[txn.session].append(txn)
            self._after_enqueue(txn.session)
            self._ready[txn.session].notify()

    def _after_enqueue(self, m: int) -> None:
        """Hook run with the lock held after a transaction joined ``Q_m``."""

    def _pick(self, m: int) -> LoadTransaction | None:
        """The transaction of ``Q_m`` to start now, removed from the queue (lock held)."""
        q = self.queues[m]
        return q.popleft() if q else None

    def _wait_time(self) -> float | None:
        """How long a session may sleep before it must look again (lock held)."""
        return None

    def take(self, session: int, timeout: float | None = None) -> LoadTransaction | None:
        """Block until a transaction of ``Q_session`` may start; see the base class."""
        deadline = None if timeout is None else time.monotonic() + timeout
        cond = self._ready[session]
        with self._lock:
            while True:
                txn = self._pick(session)
                if txn is not None:
                    self.running[session] = txn
                    return txn
                if self._closed and not self.queues[session]:
                    return None
                wait = self._wait_time()
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    wait = left if wait is None else min(wait, left)
                cond.wait(wait)

    def drained(self, session: int) -> bool:
        """Closed, and nothing left in ``Q_session``."""
        with self._lock:
            return self._closed and not self.queues[session]

    def done(self, txn: LoadTransaction) -> None:
        """Action 2: the session is free again."""
        with self._lock:
            if self.running.get(txn.session) is not txn:
                raise TxStreamError(
                    f"transaction {txn.seq} is not running in session {txn.session}"
                )
            del self.running[txn.session]
            self._after_done(txn)

    def _after_done(self, txn: LoadTransaction) -> None:
        """Hook run with the lock held after ``txn`` finished."""


class Naive(QueueMethod):
    """Operations spread over sessions at random; queues run in order."""

    name: ClassVar[str] = "naive"
    summary: ClassVar[str] = "random sessions, FIFO queues: deadlocks retried until commit"

    def bind(self, schema: Schema, k: int, seed: int) -> None:
        """Seed the random assignment."""
        super().bind(schema, k, seed)
        self._rng = random.Random(seed)

    def assign(self, op: Modification, partition_key: Key) -> int:
        """A session at random."""
        return self._rng.randrange(self.k)


class Partition(QueueMethod):
    """Operations hashed on their partitioning attributes (Section 2.3)."""

    name: ClassVar[str] = "partition"
    summary: ClassVar[str] = "hash on the partitioning attributes: one session per tuple"

    def assign(self, op: Modification, partition_key: Key) -> int:
        """``hash(relation, partitioning values) mod k``."""
        return stable_hash((op.relation, *partition_key)) % self.k


class Reorder(Partition):
    """Partitioning plus the reordering method with starvation prevention (Section 3.2)."""

    name: ClassVar[str] = "reorder"
    summary: ClassVar[str] = "partition + only desirable transactions run (J array, header txn)"
    avoids_conflicts: ClassVar[bool] = True

    def __init__(self, starvation_ts: float = 1.0) -> None:
        super().__init__()
        if starvation_ts <= 0:
            raise TxStreamError("the starvation threshold TS must be a positive number of seconds")
        self.starvation_ts = starvation_ts

    def bind(self, schema: Schema, k: int, seed: int) -> None:
        """Zero the array J, empty the queues, r = 0."""
        super().bind(schema, k, seed)
        self.J: dict[str, int] = dict.fromkeys(schema.relations, 0)
        self.conflicts = {r: schema.conflicts(r) for r in schema.relations}
        self.r = -1  # the paper's r = 0: every queue is empty (sessions are 0-based here)
        self.r_since = time.monotonic()
        self.counters = {"headers": 0, "skipped_for_header": 0, "reordered": 0}
        self._last_header: LoadTransaction | None = None

    # -- the pointer r and the header transaction ----------------------------------------

    def _after_enqueue(self, m: int) -> None:
        if self.r < 0:
            self._move_r(m)

    def _move_r(self, value: int) -> None:
        self.r = value
        self.r_since = time.monotonic()

    def _advance_r(self) -> None:
        """Move r to the next non-empty queue after r (cyclically), or to 'none'."""
        k = self.k
        for step in range(1, k + 1):
            cand = (self.r + step) % k
            if self.queues[cand]:
                self._move_r(cand)
                return
        self._move_r(-1)

    def header(self) -> LoadTransaction | None:
        """The header transaction, if r has stayed at one queue longer than TS (lock held)."""
        if self.r < 0 or not self.queues[self.r]:
            return None
        if time.monotonic() - self.r_since <= self.starvation_ts:
            return None
        head = self.queues[self.r][0]
        if head is not self._last_header:
            self._last_header = head
            self.counters["headers"] += 1
        return head

    def _wait_time(self) -> float | None:
        if self.r < 0:
            return None
        left = self.starvation_ts - (time.monotonic() - self.r_since)
        return max(0.005, left + 0.001) if left > 0 else None

    # -- Actions 2 and 3 ----------------------------------------------------------------

    def desirable(self, txn: LoadTransaction, header: LoadTransaction | None) -> bool:
        """No running transaction conflicts with ``txn``, nor does the header (lock held)."""
        J = self.J
        for other in self.conflicts[txn.relation]:
            if J[other]:
                return False
        if (
            header is not None
            and txn is not header
            and header.relation in self.conflicts[txn.relation]
        ):
            self.counters["skipped_for_header"] += 1
            return False
        return True

    def _pick(self, m: int) -> LoadTransaction | None:
        """Action 3: scan Q_m front to back for the first desirable transaction."""
        q = self.queues[m]
        if not q:
            return None
        header = self.header()
        blocked: set[str] = set()
        for i, txn in enumerate(q):
            if txn.relation in blocked:
                continue  # same answer as an earlier transaction on this relation
            if self.desirable(txn, header):
                del q[i]
                if i:
                    self.counters["reordered"] += 1
                self.J[txn.relation] += 1
                if m == self.r and i == 0:
                    self._advance_r()
                return txn
            blocked.add(txn.relation)
        return None

    def _after_done(self, txn: LoadTransaction) -> None:
        """Action 2: decrement J_i; if it reached zero, free sessions search again."""
        rel = txn.relation
        self.J[rel] -= 1
        self._ready[txn.session].notify()
        if self.J[rel] == 0:
            for g, cond in enumerate(self._ready):
                if g != txn.session and g not in self.running and self.queues[g]:
                    cond.notify()


METHODS: dict[str, type[LoadingMethod]] = {cls.name: cls for cls in (Naive, Partition, Reorder)}


def get_method(name: str, starvation_ts: float = 1.0) -> LoadingMethod:
    """A fresh loading method called ``name``."""
    if name not in METHODS:
        raise UnknownNameError("loading method", name, list(METHODS))
    if name == "reorder":
        return Reorder(starvation_ts)
    return METHODS[name]()
