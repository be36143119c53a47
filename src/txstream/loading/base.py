"""The contracts of continuous loading: load transactions, loading methods, targets.

The pieces and how they meet (Luo et al. Sections 2-4)::

    operations --> Loader --(assign: session m)--> grouping per (session, relation)
                      |  every n operations on one relation of one session
                      v  form a LoadTransaction and hand it to the method
                  LoadingMethod.enqueue(txn)            Action 1
    session m:    txn = method.take(m)                  Action 3 (blocks)
                  TargetSession.execute(txn)            retried on TransientError
                  method.done(txn)                      Action 2

* A :class:`LoadingMethod` decides which session each operation goes through
  (:meth:`~LoadingMethod.assign`) and which queued transaction a free session
  runs next (:meth:`~LoadingMethod.take`).  ``naive`` assigns at random and
  runs each queue in order; ``partition`` hashes on the partitioning
  attributes; ``reorder`` also only starts *desirable* transactions.
* A :class:`Target` is the database: it creates the base relations and join
  views, opens one :class:`TargetSession` per loading session, and reports its
  committed state for verification.  Every target maintains the join views
  immediately, in the transaction that changes a base relation.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from txstream.errors import TransientError
from txstream.loading.ops import Key, Modification
from txstream.loading.schema import Schema


class DeadlockAbort(TransientError):
    """The target chose a load transaction as a deadlock victim and rolled it back."""


@dataclass
class LoadTransaction:
    """A group of operations on one relation, run through one session as one transaction.

    ``ident`` is ``(batch id, sequence number)`` when the load is part of an
    exactly-once stream: the target records it in the same database
    transaction and skips a transaction whose ident it has already committed.
    """

    seq: int
    session: int
    relation: str
    ops: list[Modification]
    ident: tuple[int, int] | None = None
    attempts: int = 0
    statements: int = 0
    enqueued_at: float = 0.0


@dataclass
class State:
    """The committed contents of a target: base rows by key and view rows.

    ``views[name]`` maps an output row (a tuple in output-column order) to its
    multiplicity for an ordinary view; for an aggregate view it maps the group
    tuple to the tuple of aggregate values (each group once).
    """

    base: dict[str, dict[Key, dict[str, Any]]]
    views: dict[str, dict[tuple[Any, ...], Any]] = field(default_factory=dict)


class TargetSession(ABC):
    """One connection to the target; used by one loading session (one thread).

    Call order: any number of :meth:`execute` calls, one at a time, then
    :meth:`close` once.
    """

    @abstractmethod
    def execute(self, txn: LoadTransaction, statements: list[Modification]) -> bool:
        """Apply ``statements`` (``txn``'s operations, possibly pre-aggregated) atomically.

        Runs them in order in one database transaction, maintaining every join
        view in the same transaction, and commits.  Returns ``False`` when
        ``txn.ident`` was already committed earlier (nothing is applied then),
        else ``True``.  On a deadlock it rolls back and raises
        :class:`DeadlockAbort`; on other retryable failures another
        :class:`~txstream.errors.TransientError`; the caller re-runs the same
        transaction.  After any exception nothing of ``txn`` is applied.
        """

    def execute_gated(
        self,
        txn: LoadTransaction,
        statements: list[Modification],
        gate: tuple[int, tuple[int, ...]],
        wait: bool,
    ) -> bool | None:
        """:meth:`execute`, once the transaction holds the locks ``gate`` names.

        ``gate`` is (an exclusive lock key, shared lock keys), held until the
        transaction ends: the reordering method's array J for sessions that
        share no process (:mod:`txstream.loading.sessions`).  Without ``wait``
        it returns None at once, nothing applied, when a lock is taken; with
        ``wait`` it waits for the locks in key order.
        """
        from txstream.errors import TxStreamError

        raise TxStreamError(
            f"{type(self).__name__} cannot coordinate sessions in separate processes; "
            "load with the postgres target"
        )

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the connection."""


class Target(ABC):
    """A database to load into, by :attr:`name`.

    Call order: :meth:`setup` once (creates relations, views and their
    maintenance; an existing target state is replaced), optionally
    :meth:`bulk_load`, then :meth:`connect` any number of times (one session
    per loading session) while loads run, :meth:`state` / :meth:`batch_done` /
    :meth:`mark_batch` at any time between loads, :meth:`close` once.
    """

    name: ClassVar[str]

    def __init__(self, schema: Schema) -> None:
        from txstream.errors import TxStreamError

        if not isinstance(schema, Schema):
            raise TxStreamError(f"a target needs a Schema of relations and views, not {schema!r}")
        self.schema = schema

    @abstractmethod
    def setup(self) -> None:
        """Create (or re-create, empty) the base relations, the views and their maintenance."""

    @abstractmethod
    def bulk_load(self, rows: dict[str, list[dict[str, Any]]]) -> None:
        """Insert initial rows outside the loader, then bring every view up to date."""

    @abstractmethod
    def connect(self, slot: int, slots: int) -> TargetSession:
        """A session for loading session ``slot`` of ``slots`` (0-based)."""

    @abstractmethod
    def state(self) -> State:
        """The committed base rows and view contents."""

    @abstractmethod
    def batch_done(self, batch_id: int) -> bool:
        """Whether stream batch ``batch_id`` has been completely loaded before."""

    @abstractmethod
    def mark_batch(self, batch_id: int) -> None:
        """Record that stream batch ``batch_id`` is completely loaded (its txns committed)."""

    def stats(self) -> dict[str, Any]:
        """Target-specific counters (e.g. deadlocks the server saw)."""
        return {}

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the target's resources."""


class LoadingMethod(ABC):
    """How operations are spread over sessions and when a queued transaction may start.

    Call order and invariants:

    1. :meth:`bind` once, before anything else.
    2. :meth:`assign` for each operation, from the feeding thread, in arrival
       order; it must return a session in ``range(k)``.  Methods that promise
       no base-relation deadlocks return the same session for every operation
       on one tuple.
    3. :meth:`enqueue` for each transaction formed (``txn.session`` is where its
       operations were assigned), from the feeding thread; concurrently,
    4. each session ``m`` loops ``txn = take(m)`` (blocks until a transaction
       of queue ``m`` may start, returns ``None`` once :meth:`close` was called
       and queue ``m`` is empty) and, after running it to commit,
       :meth:`done(txn) <done>` exactly once before its next ``take``;
    5. :meth:`close` once, when no more transactions will be enqueued.

    A transaction is returned by ``take`` exactly once.  Transactions of one
    queue on one relation start in enqueue order (so operations on one tuple
    keep their arrival order).  ``reorder`` further guarantees that no two
    started-but-not-done transactions modify conflicting relations (Rule 1).
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    avoids_conflicts: ClassVar[bool] = False

    def __init__(self) -> None:
        self.k = 1
        self.schema: Schema | None = None
        self._lock = threading.Lock()
        self._ready: list[threading.Condition] = []
        self._closed = False
        self.counters: dict[str, int] = {}

    def bind(self, schema: Schema, k: int, seed: int) -> None:
        """Set up for ``k`` sessions over ``schema``; ``seed`` drives any randomness."""
        self.schema = schema
        self.k = k
        self._ready = [threading.Condition(self._lock) for _ in range(k)]
        self._closed = False

    @abstractmethod
    def assign(self, op: Modification, partition_key: Key) -> int:
        """The session (0-based) that will run ``op``."""

    @abstractmethod
    def enqueue(self, txn: LoadTransaction) -> None:
        """Action 1: append a formed transaction to its session's queue."""

    @abstractmethod
    def take(self, session: int, timeout: float | None = None) -> LoadTransaction | None:
        """Action 3: the next transaction session ``session`` runs; blocks until one may.

        Returns ``None`` when the method is closed and the session's queue is
        empty, or when ``timeout`` seconds pass without one (then check again).
        """

    @abstractmethod
    def done(self, txn: LoadTransaction) -> None:
        """Action 2: ``txn`` committed and its session is free again."""

    @abstractmethod
    def drained(self, session: int) -> bool:
        """Whether :meth:`close` was called and queue ``session`` is empty."""

    def close(self) -> None:
        """No more transactions will be enqueued; wake every waiting session."""
        with self._lock:
            self._closed = True
            for cond in self._ready:
                cond.notify_all()

    def stats(self) -> dict[str, int]:
        """Method-specific counters (e.g. header transactions made)."""
        with self._lock:
            return dict(self.counters)


def stable_hash(values: tuple[Hashable, ...]) -> int:
    """A hash of key values that is the same in every process (unlike ``hash`` of str)."""
    import zlib

    return zlib.crc32(repr(values).encode())
