"""The protocol interface of the transaction manager, its errors and states.

A concurrency-control protocol decides *when* a transaction may touch a data
item and *whether* it may commit; the manager (:mod:`txstream.txn.manager`)
does the data access, the undo log, the write-ahead log and history recording.

Call order, for every transaction ``t`` (enforced by the manager)::

    begin(t)
    (before_read(t, item) | before_write(t, item))*     any number, any order
    validate(t)                                         only when t commits,
                                                        with the commit mutex held
    release(t)                                          exactly once, at the end

Invariants a protocol relies on and keeps:

* ``before_read`` / ``before_write`` run *before* the manager reads or changes
  the item; a protocol that blocks does it there, and may raise a
  :class:`~txstream.errors.TransientError` (deadlock victim, lock-wait timeout,
  wounded by an older transaction), after which the manager aborts ``t``;
* ``begin`` sets how ``t`` sees data: ``t.snapshot_ts`` (read committed versions
  as of that timestamp) and ``t.deferred`` (buffer writes until commit instead of
  changing rows in place under an undo log);
* ``validate`` raises a :class:`~txstream.errors.TransientError` to refuse a
  commit; nothing has been made visible then;
* ``release`` runs after the commit is complete (or the undo log has run) and
  frees whatever the protocol held: after it, no lock of ``t`` remains.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar

from txstream.errors import TransientError, TxStreamError

if TYPE_CHECKING:
    from txstream.txn.manager import Transaction, TransactionManager

ACTIVE = 0
COMMITTING = 1
COMMITTED = 2
ABORTED = 3
STATE_NAMES = {
    ACTIVE: "active",
    COMMITTING: "committing",
    COMMITTED: "committed",
    ABORTED: "aborted",
}

SHARED = 1
EXCLUSIVE = 2
INTENT_EXCLUSIVE = 3
"""A writer's mode on a whole table's item (see ``LockManager.guard``).

Compatible with itself (writers of different rows go on together), not with
a whole-table ``SHARED`` lock nor with ``EXCLUSIVE``.  Held next to the row's
``EXCLUSIVE`` lock, never instead of it."""


class TransactionError(TxStreamError):
    """A transaction was used wrongly, e.g. an operation after its commit or abort."""


class DeadlockError(TransientError):
    """Raised in the transaction chosen as the victim to break a deadlock; retry it."""


class LockTimeoutError(TransientError):
    """A lock was not granted within the manager's lock-wait timeout; retry."""


class WoundedError(TransientError):
    """An older transaction needed a lock this one held (predefined ordering); retry."""


class ValidationError(TransientError):
    """Optimistic backward validation failed: an item read was changed since; retry."""


class WriteConflictError(TransientError):
    """Snapshot isolation: another transaction committed a write to the same item first."""


class ConcurrencyControl(ABC):
    """A concurrency-control protocol, chosen by :attr:`name` (``ss2pl``, ``optimistic`` ...).

    (An abstract base class, not a :class:`typing.Protocol`; it was called
    ``Protocol``, a name kept as an alias.)

    One instance serves one :class:`~txstream.txn.manager.TransactionManager`
    and is called from many threads at once; see the module docstring for the
    call order and the invariants.
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    serializable: ClassVar[bool] = True
    """Whether its histories are conflict-serializable (the ``none`` baseline is not)."""
    supports_ordering: ClassVar[bool] = False
    """Whether it can enforce a predefined (arrival) order of conflicting operations."""
    tracks_writes: ClassVar[bool] = False
    """Whether the manager must keep the commit timestamp of the last write per item."""
    records_writes_at_commit: ClassVar[bool] = True
    """Whether a write is recorded in the history when its transaction commits (it
    becomes visible then) rather than when it is executed (``none``: at once)."""

    def __init__(self, manager: TransactionManager) -> None:
        self.manager = manager

    @abstractmethod
    def begin(self, txn: Transaction) -> None:
        """Set up ``txn``: its read view (``snapshot_ts``) and write mode (``deferred``)."""

    @abstractmethod
    def before_read(self, txn: Transaction, item: str) -> None:
        """Called before ``txn`` reads ``item``; may block or raise a TransientError."""

    @abstractmethod
    def before_write(self, txn: Transaction, item: str) -> None:
        """Called before ``txn`` writes ``item``; may block or raise a TransientError."""

    def validate(self, txn: Transaction) -> None:  # noqa: B027 - optional hook
        """Called with the commit mutex held; raise a TransientError to refuse the commit."""

    @abstractmethod
    def release(self, txn: Transaction) -> None:
        """Free everything ``txn`` holds; called exactly once when it has ended."""

    # -- readers that go on (continuous queries' windows) ------------------------------
    # The manager asks these instead of looking at the protocol's name: see
    # TransactionManager.begin_snapshot, commit_and_continue, commit_keeping_all, resume.

    snapshot_readers: ClassVar[bool] = False
    """Whether :meth:`~txstream.txn.TransactionManager.begin_snapshot` serves readers
    under it (a read-only transaction that reads the state committed at its start)."""

    continues_readers: ClassVar[bool] = False
    """Whether a reader's ``commit_and_continue`` and ``commit_keeping_all`` have short
    paths under it (:meth:`continue_reader`, :meth:`commit_reader`); the manager
    takes them only without a recorder or a predefined order."""

    untimed_readers: ClassVar[str] = ""
    """When a reader that keeps every read may commit without a commit timestamp
    (:meth:`~txstream.txn.TransactionManager.commit_keeping_all_untimed`): ``"always"``
    (its locks keep what it read current until it releases them), ``"unwritten"``
    (nothing was written since its read set was last validated), ``""`` never."""

    def snapshot_reader(self, txn: Transaction) -> None:  # noqa: B027 - optional hook
        """Give read-only ``txn``, just begun, its snapshot (when :attr:`snapshot_readers`)."""

    def hand_over(self, txn: Transaction, heir: Transaction, keep: Iterable[str]) -> list[str]:
        """``commit_and_continue``'s general path, before reader ``txn`` commits.

        Gives ``heir`` what it keeps of ``txn``'s reads of ``keep`` and sets
        ``heir.lost`` to the kept items it does not get; returns the items to
        join ``heir``'s read set as read at the clock sampled before the commit.
        By default nothing is kept.
        """
        heir.lost = set(keep)
        return []

    def continue_reader(
        self, txn: Transaction, keep: Iterable[str], reuse: bool
    ) -> Transaction | None:
        """``commit_and_continue``'s short path: commit reader ``txn``; its successor.

        Called only when :attr:`continues_readers`, without a recorder, order or
        log, and with ``txn`` active and not doomed.  ``None``: take the general path.
        """
        return None

    def commit_reader(self, txn: Transaction) -> None:
        """``commit_keeping_all``'s short path: commit reader ``txn``, which goes on.

        Called under the conditions of :meth:`continue_reader`; a failure is
        raised with ``txn`` aborted.
        """
        raise TransactionError(f"protocol {self.name} has no short path for a reader's commit")

    def resume(self, heir: Transaction) -> set[str]:
        """The successor of ``commit_and_continue`` starts: the kept items it lost."""
        lost = heir.lost
        heir.lost = None
        return lost if lost is not None else set()

    def stats(self) -> dict[str, int]:
        """Counters worth reporting (deadlocks, timeouts, ...)."""
        return {}


Protocol = ConcurrencyControl
"""The old name of :class:`ConcurrencyControl`, kept for code that imports it."""
