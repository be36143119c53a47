"""The concurrency-control protocols, chosen by name.

* ``ss2pl`` - strong strict two-phase locking (EDBT 2012 Section 4.1): a shared
  lock before every read, an exclusive lock before every write, all released
  at commit or abort.  Conflict-serializable and recoverable; with the
  manager's ``ordered`` setting, CSAO.
* ``none`` - the NOT SERIALIZABLE baseline of the paper's experiments: writers
  take exclusive locks on what they modify (so two writers never interleave on
  one item), readers take none and see whatever is there, uncommitted data
  included.
* ``snapshot`` - multi-version snapshots: a transaction reads the committed
  state as of its start; writes are buffered and validated at commit,
  first-committer-wins (a write to an item someone committed since the
  snapshot aborts).  That is snapshot isolation, which allows write skew; with
  ``snapshot_updates="locking"`` only read-only transactions use snapshots and
  update transactions run under SS2PL, which is serializable.
* ``optimistic`` - optimistic concurrency control with backward validation:
  reads see the latest committed state and remember the commit timestamp of
  the version they saw; writes are buffered; commit fails if any item read has
  been overwritten since.  Serializable in commit order (and CSAO with
  ``ordered``, which makes commits follow the predefined order).
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import repeat
from operator import gt
from typing import TYPE_CHECKING, ClassVar

from txstream.errors import TransientError, UnknownNameError
from txstream.txn.base import (
    EXCLUSIVE,
    SHARED,
    ConcurrencyControl,
    ValidationError,
    WriteConflictError,
)
from txstream.txn.locks import solo_of

if TYPE_CHECKING:
    from txstream.txn.manager import Transaction, TransactionManager


class _Locking(ConcurrencyControl):
    """Shared plumbing of the protocols that take locks: bound lock-manager calls.

    Binding ``acquire``/``release_all`` once keeps the per-operation path to one
    attribute load, which the single-threaded throughput goal depends on.
    """

    def __init__(self, manager: TransactionManager) -> None:
        super().__init__(manager)
        self._acquire = manager.locks.acquire
        self._release = manager.locks.release_all
        self._table = manager.locks.table
        self._locks = manager.locks

    def release(self, txn: Transaction) -> None:
        """Release every lock in the transaction's control block (TCB)."""
        if txn.locks:
            self._release(txn)


class SS2PL(_Locking):
    """Strong strict two-phase locking over the manager's lock manager."""

    name: ClassVar[str] = "ss2pl"
    summary: ClassVar[str] = "strong strict 2PL: S/X locks held to the end, deadlock detection"
    supports_ordering: ClassVar[bool] = True

    def begin(self, txn: Transaction) -> None:
        """Nothing to set up: reads and writes go to the current rows under locks."""

    def before_read(self, txn: Transaction, item: str) -> None:
        """Take a shared lock.

        The lock manager's fast path for an item nobody has locked (publish
        ``txn``'s :class:`~txstream.txn.locks.Solo` record with the atomic
        ``dict.setdefault``, see :meth:`~txstream.txn.locks.LockManager.acquire`)
        is inlined here: a reader's uncontended lock costs no further call.
        """
        locks = txn.locks
        if item not in locks:
            solo = txn.solo or solo_of(txn)
            if self._table.setdefault(item, solo) is solo:
                locks[item] = SHARED
            else:
                self._acquire(txn, item, SHARED, 0)

    def before_write(self, txn: Transaction, item: str) -> None:
        """Take an exclusive lock (upgrading a shared one).

        On a row of a table some reader locks whole (``LockManager.guard``),
        also the intention lock on the table, after the row's lock.
        """
        held = txn.locks.get(item, 0)
        if held != EXCLUSIVE:
            self._acquire(txn, item, EXCLUSIVE, held)
            if self._locks.guarded:  # (read after the row's lock is in: see guard)
                self._locks.intend(txn, item)

    def lock_table(self, txn: Transaction, table: str) -> None:
        """A shared lock on every row of ``table`` at once (``LockManager.lock_table``)."""
        try:
            self._locks.lock_table(txn, table)
        except TransientError as exc:
            txn._fail(exc)

    continues_readers: ClassVar[bool] = True
    # a reader that keeps every lock needs no commit timestamp: nobody can write what it
    # read before it releases the locks
    untimed_readers: ClassVar[str] = "always"

    def hand_over(self, txn: Transaction, heir: Transaction, keep: Iterable[str]) -> list[str]:
        """The shared locks on ``keep`` move to ``heir`` without being released."""
        self.manager.locks.hand_over(txn, heir, keep)
        return []

    def continue_reader(
        self, txn: Transaction, keep: Iterable[str], reuse: bool
    ) -> Transaction | None:
        """A reader's plain commit; its locks on ``keep`` stay or move, the others go."""
        if reuse:
            return self.manager._renew_ss2pl(txn, keep)
        return self.manager._continue_ss2pl(txn, keep)

    def commit_reader(self, txn: Transaction) -> None:
        """A reader's plain commit (the clock moves on by one); its locks stay held."""
        manager = self.manager
        with manager.commit_mutex:
            manager.clock += 1

    def resume(self, heir: Transaction) -> set[str]:
        """The handed-over locks stop being revocable (see ``LockManager.resume``)."""
        return self.manager.locks.resume(heir)

    def stats(self) -> dict[str, int]:
        """Deadlocks found and broken."""
        return {}


class NoControl(_Locking):
    """No isolation for readers; exclusive locks for writers only."""

    name: ClassVar[str] = "none"
    summary: ClassVar[str] = "baseline: writers lock, readers read anything (not serializable)"
    serializable: ClassVar[bool] = False
    records_writes_at_commit: ClassVar[bool] = False

    def begin(self, txn: Transaction) -> None:
        """Nothing to set up."""

    def before_read(self, txn: Transaction, item: str) -> None:
        """Readers take no lock."""

    def before_write(self, txn: Transaction, item: str) -> None:
        """Writers take an exclusive lock, held to the end."""
        if txn.locks.get(item) != EXCLUSIVE:
            self._acquire(txn, item, EXCLUSIVE)


class SnapshotIsolation(_Locking):
    """Snapshot reads; first-committer-wins writes (or SS2PL updates, by setting)."""

    name: ClassVar[str] = "snapshot"
    summary: ClassVar[str] = "multi-version snapshot reads, first-committer-wins writes"
    tracks_writes: ClassVar[bool] = True

    def __init__(self, manager: TransactionManager) -> None:
        super().__init__(manager)
        self._locking_updates = manager.snapshot_updates == "locking"
        self.write_conflicts = 0

    def begin(self, txn: Transaction) -> None:
        """Read-only transactions (and, under ``si``, all) get a snapshot."""
        if txn.read_only or not self._locking_updates:
            self.manager.take_snapshot(txn)
            txn.deferred = not txn.read_only
            if txn.deferred:
                txn.buffers()

    def before_read(self, txn: Transaction, item: str) -> None:
        """Snapshot readers need nothing; locking updaters take a shared lock."""
        if txn.snapshot_ts is None and item not in txn.locks:
            self._acquire(txn, item, SHARED)

    def before_write(self, txn: Transaction, item: str) -> None:
        """Locking updaters take an exclusive lock; snapshot writers buffer."""
        if txn.snapshot_ts is None and txn.locks.get(item) != EXCLUSIVE:
            self._acquire(txn, item, EXCLUSIVE)

    def validate(self, txn: Transaction) -> None:
        """First committer wins: no item written may have a commit after the snapshot."""
        snap = txn.snapshot_ts
        if snap is None or not txn.deferred:
            return
        last = self.manager.last_write
        items = [tbl.item(key) for tbl, key in txn.wset]
        items.extend(item for s, _ in txn.wappends for item in s.items_for_append())
        for item in items:
            if last.get(item, 0) > snap:
                self.write_conflicts += 1
                raise WriteConflictError(
                    f"transaction {txn.hid}: {item} was changed by a transaction that "
                    f"committed after its snapshot ({snap}); retry it"
                )

    snapshot_readers: ClassVar[bool] = True  # (its begin gives a reader its snapshot)

    def stats(self) -> dict[str, int]:
        """Write conflicts (first-committer-wins aborts)."""
        return {"write_conflicts": self.write_conflicts}


class Optimistic(ConcurrencyControl):
    """Optimistic concurrency control with backward validation at commit."""

    name: ClassVar[str] = "optimistic"
    summary: ClassVar[str] = "optimistic: buffered writes, backward validation of reads"
    supports_ordering: ClassVar[bool] = True
    tracks_writes: ClassVar[bool] = True

    def __init__(self, manager: TransactionManager) -> None:
        super().__init__(manager)
        self._last = manager.last_write
        self._active = manager.active_since
        self.validation_failures = 0

    def begin(self, txn: Transaction) -> None:
        """Writes are buffered until commit; the start time bounds write-map pruning."""
        txn.deferred = True
        if txn.read_only:
            txn.reads = {}  # it cannot write: the shared empty write buffers stay empty
        else:
            txn.buffers()
        self._active[txn.id] = self.manager.clock

    def before_read(self, txn: Transaction, item: str) -> None:
        """Remember the commit clock at the read: any later write to the item is newer.

        (Not the timestamp of the version read: the manager prunes the write map
        of entries older than every active transaction, and a pruned entry must
        mean "not written since", which a clock comparison gives.)
        """
        reads = txn.reads
        if item not in reads:
            reads[item] = self.manager.clock

    def before_write(self, txn: Transaction, item: str) -> None:
        """Nothing: the write is buffered."""

    def validate(self, txn: Transaction) -> None:
        """Fail if an item read was overwritten by a commit since it was read.

        A read-only transaction with a snapshot (``begin_snapshot``) is never
        refused: it read the versions committed at its start.

        Nothing to look at item by item when no commit wrote anything after the
        earliest read (the manager's ``write_ts``, the newest commit with writes,
        is no later than every read's clock), nor after ``txn.valid_to``: a
        reader that goes on after a validating commit with its read set
        (:meth:`~txstream.txn.TransactionManager.commit_keeping_all`) had all of
        it found unchanged up to that commit, and reads since are at later clocks.
        """
        last = self._last
        reads = txn.reads
        write_ts = self.manager.write_ts
        if not reads or write_ts <= txn.valid_to or write_ts <= min(reads.values()):
            return
        if txn.snapshot_ts is not None:
            # a snapshot reader (TransactionManager.begin_snapshot) read the versions
            # committed at its start, which later writes do not change
            return
        # one pass in C over the read set (last write, or 0, against the read's clock);
        # the item is looked for only to name it when the validation fails
        if not any(map(gt, map(last.get, reads, repeat(0)), reads.values())):
            return
        for item, seen in reads.items():
            if last.get(item, 0) > seen:
                self.validation_failures += 1
                raise ValidationError(
                    f"transaction {txn.hid}: {item} changed after it was read; retry it"
                )

    def release(self, txn: Transaction) -> None:
        """Nothing is held; the transaction no longer bounds write-map pruning."""
        self._active.pop(txn.id, None)

    snapshot_readers: ClassVar[bool] = True
    continues_readers: ClassVar[bool] = True
    # a reader whose read set nothing overwrote since its last validation is valid now
    untimed_readers: ClassVar[str] = "unwritten"

    def snapshot_reader(self, txn: Transaction) -> None:
        """A snapshot as of now: the reader reads committed versions and never fails."""
        self.manager.take_snapshot(txn)

    def hand_over(self, txn: Transaction, heir: Transaction, keep: Iterable[str]) -> list[str]:
        """The items of ``keep`` that ``txn`` read join ``heir``'s read set.

        (As read at the clock the manager sampled after ``heir`` began: its start
        bounds write-map pruning at or below that clock, so no later write is
        forgotten.)  Under a predefined order nothing is kept.
        """
        if self.manager.ordered:
            return super().hand_over(txn, heir, keep)
        kept = list(keep)
        lost = set(kept).difference(txn.reads)  # never read by txn: not vouched for
        if lost:
            kept = [item for item in kept if item not in lost]
        heir.lost = lost
        return kept

    def continue_reader(
        self, txn: Transaction, keep: Iterable[str], reuse: bool
    ) -> Transaction | None:
        """A reader's validating commit; the kept reads join the successor's read set."""
        if txn.wset or txn.wappends:
            return None
        return self.manager._continue_optimistic(txn, keep, reuse)

    def commit_reader(self, txn: Transaction) -> None:
        """A reader's validating commit; its read set stays, validated up to it."""
        failure = self.manager._commit_validated(txn)
        if failure is not None:
            raise failure

    def stats(self) -> dict[str, int]:
        """Validation failures."""
        return {"validation_failures": self.validation_failures}


PROTOCOLS: dict[str, type[ConcurrencyControl]] = {
    cls.name: cls for cls in (SS2PL, SnapshotIsolation, Optimistic, NoControl)
}


def get_protocol(name: str) -> type[ConcurrencyControl]:
    """The protocol class called ``name``; :class:`UnknownNameError` otherwise."""
    cls = PROTOCOLS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise UnknownNameError("protocol", str(name), list(PROTOCOLS))
    return cls


def protocols() -> dict[str, str]:
    """Every protocol name with its one-line summary."""
    return {name: cls.summary for name, cls in PROTOCOLS.items()}
