"""The transaction manager: the paper's five methods, transactions, commit and rollback.

:class:`TransactionManager` sits between the code that processes events and
the storage (EDBT 2012 Figure 2).  It offers the five methods of Section 4.2 -
:meth:`~TransactionManager.start_transaction`, :meth:`~TransactionManager.read`,
:meth:`~TransactionManager.write`, :meth:`~TransactionManager.commit`,
:meth:`~TransactionManager.abort` - and, more conveniently, transaction objects
used as context managers::

    tm = TransactionManager(protocol="ss2pl")
    accounts = tm.table("accounts")
    with tm.begin() as t:                 # commits on a clean exit,
        t.increment(accounts, "a", -10)   # aborts on an exception
        t.increment(accounts, "b", +10)

Thread-safe: any number of threads may run transactions at once, each
transaction being used by one thread.  The protocol, chosen by name, decides
when a transaction may touch an item and whether it may commit
(:mod:`txstream.txn.protocols`).

Rollback uses an *undo log of inverse operations*: every in-place change
pushes its inverse (an increment by ``d`` is undone by an increment by ``-d``,
an insert by a delete, an append by removing the event); an abort runs them
newest first, so the state after the abort is the state before the
transaction.  Protocols that buffer writes until commit (``snapshot``,
``optimistic``) have nothing to undo.

A transaction that fails with a :class:`~txstream.errors.TransientError`
(deadlock victim, failed validation, lock-wait timeout, wound) is aborted
before the error reaches the caller; run it again, e.g. with
:meth:`TransactionManager.run`.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import re
import threading
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from txstream.errors import TransientError, TxStreamError
from txstream.model.history import History
from txstream.storage import Store, Stream, Table
from txstream.storage.base import StorageError
from txstream.storage.stream import OrderBy
from txstream.txn.base import (
    ABORTED,
    ACTIVE,
    COMMITTED,
    COMMITTING,
    ConcurrencyControl,
    TransactionError,
)
from txstream.txn.commit import _PRUNE_MIN, CommitPath
from txstream.txn.locks import LockManager
from txstream.txn.recorder import DEFAULT_LIMIT, HistoryRecorder
from txstream.txn.transaction import StreamRef, TableRef, Transaction

log = logging.getLogger("txstream.txn")

T = TypeVar("T")

_STREAM_NAME = re.compile(r"[A-Za-z0-9_.:\-]+")


def _seconds(name: str, value: object, zero: bool) -> float:
    """A finite number of seconds from a setting; :class:`TxStreamError` otherwise.

    NaN and infinity would reach ``threading`` waits, which raise ``ValueError``
    or ``OverflowError`` at the first wait instead of at creation.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TxStreamError(f"{name} must be a number of seconds, not {value!r}")
    seconds = float(value)
    limit = threading.TIMEOUT_MAX
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not zero):
        kind = "a non-negative" if zero else "a positive"
        raise TxStreamError(f"{name} must be {kind}, finite number of seconds, not {value!r}")
    if seconds > limit:
        raise TxStreamError(f"{name} must be at most {limit:.0f} seconds, not {value!r}")
    return seconds


class TransactionManager(CommitPath):
    """Runs transactions over a :class:`~txstream.storage.Store` under a protocol.

    ``protocol``: ``ss2pl`` (default), ``snapshot``, ``optimistic`` or ``none``.
    ``path``: a directory for the write-ahead log (``None``: in memory only);
    ``sync``: ``commit``, ``group`` or ``off``.  ``ordered``: enforce the
    predefined order of transactions (their start order, kept across retries)
    on conflicting operations and commits.  ``lock_timeout``: seconds a lock
    request may wait.  ``record``: keep the history of the run.
    ``snapshot_updates``: under ``snapshot``, ``"si"`` (update transactions run
    on snapshots with first-committer-wins) or ``"locking"`` (only read-only
    transactions use snapshots; update transactions use SS2PL).  ``on_damage``:
    what recovery does with a damaged log record that has good ones after it,
    ``"stop"`` or ``"truncate"`` (see :class:`~txstream.storage.Store`).
    """

    def __init__(
        self,
        protocol: str = "ss2pl",
        *,
        path: str | Path | None = None,
        sync: str = "commit",
        group_delay: float = 0.0,
        ordered: bool = False,
        lock_timeout: float | None = None,
        record: bool | str | os.PathLike[str] = False,
        record_limit: int = DEFAULT_LIMIT,
        checkpoint_every_bytes: int | None = None,
        snapshot_updates: str = "si",
        arrival_stream: str = "events",
        store: Store | None = None,
        on_damage: str = "stop",
    ) -> None:
        from txstream.txn.protocols import get_protocol

        cls = get_protocol(protocol)
        if ordered and not cls.supports_ordering:
            raise TxStreamError(
                f"protocol {protocol} cannot enforce a predefined order; use ss2pl or optimistic"
            )
        if snapshot_updates not in ("si", "locking"):
            raise TxStreamError(
                f"unknown snapshot_updates {snapshot_updates!r}; choose one of: locking, si"
            )
        if lock_timeout is not None:
            lock_timeout = _seconds("lock_timeout", lock_timeout, zero=False)
        group_delay = _seconds("group_delay", group_delay, zero=True)
        if not isinstance(arrival_stream, str) or not _STREAM_NAME.fullmatch(arrival_stream):
            # The recorded arrival line must parse back: 'arrival <name>: 1 2 3'.
            raise TxStreamError(
                f"arrival_stream must be a name of letters, digits and _.:- , not "
                f"{arrival_stream!r}"
            )
        if checkpoint_every_bytes is not None:
            if (
                isinstance(checkpoint_every_bytes, bool)
                or not isinstance(checkpoint_every_bytes, int)
                or checkpoint_every_bytes < 1
            ):
                raise TxStreamError(
                    "checkpoint_every_bytes must be a positive number of bytes, not "
                    f"{checkpoint_every_bytes!r}"
                )
            if path is None and (store is None or not store.durable):
                raise TxStreamError(
                    "checkpoint_every_bytes needs a durable store: give path=DIRECTORY"
                )
        self.store = store if store is not None else Store(path, sync, group_delay, on_damage)
        self.ordered = ordered
        self.snapshot_updates = snapshot_updates
        self.arrival_stream = arrival_stream
        self.locks = LockManager(timeout=lock_timeout, ordered=ordered)
        self.recorder: HistoryRecorder | None = None
        if record is not False and record is not None:
            if record is not True and (
                not isinstance(record, str | os.PathLike) or not os.fspath(record)
            ):
                raise TxStreamError(
                    "record must be True, False or the history file (or folder) to write, "
                    f"not {record!r}"
                )
            self.recorder = HistoryRecorder(
                None if record is True else record, limit=record_limit, stream=arrival_stream
            )
        self.commit_mutex = threading.Lock()
        self.clock = self.store.last_ts
        # Optimistic and snapshot protocols: the commit timestamp of the last write
        # per item, pruned of entries no active transaction can be validated
        # against (see _prune_last_write); the start clock of each active
        # optimistic transaction bounds that pruning.
        self.last_write: dict[str, int] = {}
        # the commit timestamp of the newest commit that wrote an item (0: none yet),
        # kept with last_write: nothing read at a later clock can have been overwritten
        self.write_ts = 0
        self.active_since: dict[int, int] = {}
        self._prune_at = _PRUNE_MIN
        self.snapshots: dict[int, int] = {}
        # The open snapshots' timestamps, oldest first (changed under the commit
        # mutex): commits pass them to the tables to prune versions.
        self._open_snapshots: list[int] = []
        self._ids = itertools.count(1)
        self._orders = itertools.count(0)
        self.protocol: ConcurrencyControl = cls(self)
        self._validates = cls.validate is not ConcurrencyControl.validate
        # In-place protocol, no validation, no recorder, no ordering: commit is short.
        # (snapshot: tracks writes)
        self._plain = not (
            ordered or self.recorder is not None or self._validates or cls.tracks_writes
        )
        # commit_and_continue without a log, recorder or order (checked per call: a
        # store's log): the protocol's short paths for readers
        self._fast_continue = not ordered and self.recorder is None and cls.continues_readers
        # commit_keeping_all_untimed: the protocol's rule, on the short paths only
        self._untimed = cls.untimed_readers if self._fast_continue else ""
        self.latch: threading.Lock | None = (
            threading.Lock()
            if self.recorder is not None and not self.protocol.records_writes_at_commit
            else None
        )
        self.committed = 0
        self.aborted = 0
        self.failures: dict[str, int] = {}
        # Automatic checkpoints: log positions (LSNs) of the newest commit record
        # and of the newest commit already covered by a checkpoint.
        self.checkpoint_every_bytes = checkpoint_every_bytes
        self.checkpoints = 0
        self.checkpoint_failures = 0
        self._last_lsn = 0
        self._checkpoint_lsn = 0

    def __repr__(self) -> str:
        return f"TransactionManager(protocol={self.protocol.name!r})"

    # -- catalog --------------------------------------------------------------------

    def table(self, name: str) -> Table:
        """The table called ``name`` (created if new)."""
        return self.store.table(name)

    def stream(
        self,
        name: str,
        order_by: OrderBy = None,
        require_order: bool = False,
        granularity: str = "stream",
        range_size: int = 64,
    ) -> Stream:
        """The stream called ``name`` (created if new); see :class:`~txstream.storage.Stream`."""
        return self.store.stream(name, order_by, require_order, granularity, range_size)

    def offset(self, source: str, default: Any = None) -> Any:
        """The last committed offset of stream source ``source``."""
        return self.store.offset(source, default)

    @property
    def recovery(self) -> Any:
        """The :class:`~txstream.storage.RecoveryReport` of a durable store (else ``None``)."""
        return self.store.recovery

    # -- the five methods -----------------------------------------------------------------

    def begin(self, read_only: bool = False, retry_of: Transaction | None = None) -> Transaction:
        """Start a transaction (``startTransaction`` of the paper).

        ``retry_of``: the aborted transaction this one repeats; it keeps that
        one's place in the predefined order.
        """
        tid = next(self._ids)
        if retry_of is not None:
            self._own(retry_of, "retry")
            if retry_of.state != ABORTED:
                raise TransactionError(
                    f"transaction {retry_of.hid} is {retry_of.status}; only an aborted one "
                    "can be retried"
                )
            order = retry_of.order
        else:
            order = next(self._orders)
        txn = Transaction(self, tid, order, read_only)
        if self.ordered:
            self.locks.register_order(txn)
        self.protocol.begin(txn)
        return txn

    start_transaction = begin

    def begin_snapshot(self) -> Transaction:
        """A read-only transaction that reads the committed state as of its start.

        Under ``optimistic``: it reads the versions committed at or before its
        start (the manager keeps them while it is open), so a write committed
        meanwhile neither changes what it reads nor fails its commit: it never
        waits and always commits (it is serialized at its start).  What a reader
        that keeps failing its validation falls back to (``txstream.cq``'s
        ``optimistic`` escalation).  Under ``snapshot`` it is ``begin(read_only=True)``.
        Other protocols: :class:`TransactionError` (their readers lock).
        """
        if not self.protocol.snapshot_readers:
            raise TransactionError(
                "begin_snapshot needs the optimistic or snapshot protocol, not "
                f"{self.protocol.name!r}"
            )
        txn = self.begin(read_only=True)
        self.protocol.snapshot_reader(txn)
        return txn

    def read(self, txn: Transaction, table: TableRef, key: Hashable, default: Any = None) -> Any:
        """Read the row ``key`` of ``table`` in ``txn``."""
        return self._own(txn, "read in").read(table, key, default)

    def write(self, txn: Transaction, table: TableRef, key: Hashable, row: Any) -> None:
        """Write (insert or replace) the row ``key`` of ``table`` in ``txn``."""
        self._own(txn, "write in").put(table, key, row)

    def commit(self, txn: Transaction) -> None:
        """Commit ``txn``."""
        self._own(txn, "commit").commit()

    def abort(self, txn: Transaction) -> None:
        """Abort ``txn``, undoing its changes."""
        self._own(txn, "abort").abort()

    def _own(self, txn: Any, what: str) -> Transaction:
        """``txn`` if it is a transaction of this manager; :class:`TransactionError` if not."""
        if not isinstance(txn, Transaction) or txn.manager is not self:
            where = "another manager's transaction" if isinstance(txn, Transaction) else repr(txn)
            raise TransactionError(
                f"cannot {what} {where}: give a transaction this manager's begin() returned"
            )
        return txn

    def give_up(self, txn: Transaction) -> None:
        """Declare that aborted ``txn`` will not be retried (frees its place in the order)."""
        self._own(txn, "give up")
        if txn.state != ABORTED:
            raise TransactionError(f"transaction {txn.hid} is {txn.status}, not aborted")
        if self.ordered:
            self.locks.finish_order(txn.order)
        if self.recorder is not None:
            self.recorder.settle(txn.order, None)

    def run(
        self,
        work: Callable[[Transaction], T],
        *,
        read_only: bool = False,
        retries: int = 100,
        on_retry: Callable[[TransientError], None] | None = None,
    ) -> T:
        """Run ``work(txn)`` in a transaction and commit; retry on transient failures.

        ``retries`` (an integer >= 0) is how many times a failed attempt is run
        again; the last failure is raised.
        """
        if not callable(work):
            raise TxStreamError(f"run needs a function of the transaction, not {work!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise TxStreamError(f"retries must be an integer >= 0, not {retries!r}")
        previous: Transaction | None = None
        for attempt in range(retries + 1):
            txn = self.begin(read_only=read_only, retry_of=previous)
            try:
                with txn:
                    result = work(txn)
                return result
            except TransientError as exc:
                previous = txn
                if attempt == retries:
                    self.give_up(txn)
                    raise
                if on_retry is not None:
                    on_retry(exc)
        raise AssertionError("unreachable")  # pragma: no cover

    def commit_and_continue(
        self, txn: Transaction, keep: Iterable[str], *, reuse: bool = False
    ) -> Transaction:
        """Commit read-only ``txn``; a read-only successor that keeps its reads of ``keep``.

        For a reader that goes on reading the same rows in its next transaction
        (a continuous query's overlapping windows): the successor begins before
        ``txn`` commits and its reads of the items ``keep`` lists count as made
        before that commit, so it need not repeat them to have them protected:

        * ``ss2pl``: ``txn``'s shared locks on them pass to the successor without
          being released (:meth:`LockManager.hand_over`): the rows cannot change
          in between.  A lock someone waits for is released instead (the waiter
          gets it, as it would have).
        * ``optimistic``: they join the successor's read set as read at the
          instant before ``txn``'s commit, whose validation found them unchanged
          since ``txn`` read them; the successor's own validation covers the rest.
        * other protocols, and any under a predefined order, keep nothing.

        Call :meth:`resume` before the successor's first operation: it says which
        kept items the successor lost (never held, or taken meanwhile by a
        conflicting request: a lock handed over stays revocable until then, so
        work done between the two calls, e.g. an update of a kept row by the same
        thread, never waits for the successor).  The successor must re-read
        those.  If the commit fails the successor is aborted and the error raised.

        ``reuse=True``: the successor may be ``txn``'s own object, begun again
        (on the short paths: no log, recorder or order).  It gets a new id,
        ``hid`` and place in the order, as a transaction begun now does (so it is
        the youngest, e.g. for the choice of a deadlock victim), and keeps the
        locks or reads on ``keep`` where they are instead of moving them.  The
        committed transaction then has no object of its own: the caller must not
        use ``txn`` as that one afterwards (its ``hid``, ``status``, ...); take what
        it needs of it before the call.
        """
        self._own(txn, "commit and continue")
        if keep.__class__ is not set and (isinstance(keep, str) or not isinstance(keep, Iterable)):
            raise TransactionError(
                f"keep lists the items to keep (e.g. [table.item(key)]), not {keep!r}"
            )
        if not txn.read_only:
            raise TransactionError(
                f"transaction {txn.hid} is not read-only: only a reader hands its reads on"
            )
        if (
            self._fast_continue
            and txn.state == ACTIVE
            and txn.doomed is None
            and not txn.offsets
            and self.store.wal is None
        ):
            short = self.protocol.continue_reader(txn, keep, reuse)
            if short is not None:
                return short
        heir = self.begin(read_only=True)
        # clock read after the heir's start (which bounds optimistic's write-map
        # pruning at or below it, so no write after it is forgotten)
        seen = self.clock
        try:
            kept = self.protocol.hand_over(txn, heir, keep)
            txn.commit()
        except BaseException:
            heir.abort()
            raise
        if kept:
            heir.reads.update(dict.fromkeys(kept, seen))
        return heir

    def _continue_ss2pl(self, txn: Transaction, keep: Iterable[str]) -> Transaction:
        """:meth:`commit_and_continue` under ``ss2pl`` with no log, recorder or order.

        The plain commit of a reader (the clock moves on by one), then the locks
        on ``keep`` move to the successor and the others are released, under one
        acquisition of the lock manager's mutex
        (:meth:`~txstream.txn.locks.LockManager.pass_on`): every lock is held
        until after the commit, as a commit releases them.
        """
        # begin(read_only=True) without a predefined order: ss2pl's begin does nothing
        heir = Transaction(self, next(self._ids), next(self._orders), True)
        heir.lost = set()  # revocable from the moment its first lock is visible
        txn.state = COMMITTING
        with self.commit_mutex:
            self.clock += 1
        txn.state = COMMITTED
        self.locks.pass_on(txn, heir, keep)
        self.committed += 1
        return heir

    def _renew_ss2pl(self, txn: Transaction, keep: Iterable[str]) -> Transaction:
        """:meth:`_continue_ss2pl` with the successor in ``txn``'s own object (``reuse``).

        The plain commit of a reader, then ``txn`` is begun again as its
        successor (a new id and place in the order: ss2pl's begin does nothing
        else) and, under one acquisition of the lock manager's mutex
        (:meth:`~txstream.txn.locks.LockManager.keep_only`), keeps its locks on
        ``keep`` (revocable until :meth:`resume`, as handed-over ones) and
        releases the others.  The locks are held until after the commit, as a
        commit releases them; a kept lock never changes hands, so nobody can see
        it free in between.  (The id changes while no lock of ``txn`` is awaited
        by ``txn`` itself: only a waiting transaction is looked at on a wait-for
        cycle, so no deadlock search can see the change half done.)
        """
        txn.state = COMMITTING
        with self.commit_mutex:
            self.clock += 1
        txn.state = COMMITTED
        self.committed += 1
        tid = next(self._ids)
        txn.id = tid
        txn.hid = str(tid)
        txn.order = next(self._orders)
        txn.state = ACTIVE
        self.locks.keep_only(txn, keep)
        return txn

    def _continue_optimistic(
        self, txn: Transaction, keep: Iterable[str], reuse: bool = False
    ) -> Transaction:
        """:meth:`commit_and_continue` of an ``optimistic`` reader, no log, recorder or order.

        What the general path does, short: validate and take the commit
        timestamp under the commit mutex (a reader writes nothing to publish),
        then the kept reads join the successor's read set as of the clock
        before the commit.  ``reuse``: the successor is ``txn``'s own object,
        begun again after the commit (its id, which bounds write-map pruning
        from the successor's start, is taken before the commit, as a new
        transaction's would be).
        """
        heir: Transaction | None = None
        if reuse:
            tid = next(self._ids)
            self.active_since[tid] = self.clock  # the successor's begin (see Optimistic.begin)
        else:
            heir = Transaction(self, next(self._ids), next(self._orders), True)  # begin(...)
            self.protocol.begin(heir)
        seen = self.clock  # after the heir's start: see commit_and_continue
        reads = txn.reads
        keep = keep if isinstance(keep, list) else list(keep)
        # the kept items txn read (those it vouches for), as read at ``seen``
        kept = dict.fromkeys(keep, seen)
        lost: set[str] = set()
        if not kept.keys() <= reads.keys():
            lost = set(kept).difference(reads)
            for item in lost:
                del kept[item]
        txn.state = COMMITTING
        failure = self._commit_validated(txn)
        if failure is not None:
            if heir is not None:
                heir.abort()
            else:  # what the successor's abort does: it ends, never used
                self.active_since.pop(tid, None)
                self.aborted += 1
            raise failure
        txn.state = COMMITTED
        self.active_since.pop(txn.id, None)
        self.committed += 1
        if heir is None:  # begin txn again as its successor (begin(read_only=True))
            heir = txn
            txn.id = tid
            txn.hid = str(tid)
            txn.order = next(self._orders)
            txn.state = ACTIVE
        heir.lost = lost
        heir.reads = kept  # (its begin gave it an empty read set)
        heir.valid_to = 0  # (a new read set: validated from its reads' clocks)
        return heir

    def commit_keeping_all(self, txn: Transaction) -> Transaction:
        """Commit read-only ``txn``; its own object goes on as the successor, keeping every read.

        :meth:`commit_and_continue` with ``keep`` = every item ``txn`` read, for
        a reader whose successor needs most of them and can hold the rest a
        little longer (a continuous query's overlapping windows): nothing
        moves and nothing is released.  A read lock held, or a read validated,
        longer than a reader needs it is never less safe, only less concurrent;
        the caller bounds how long (its next :meth:`commit_and_continue`
        releases what that one does not keep).

        * ``ss2pl``: the commit of a reader (the clock moves on by one); the
          locks stay held, so the successor's reads of those rows count as made
          before this commit.
        * ``optimistic``: the validating commit (a :class:`ValidationError` aborts
          ``txn`` and is raised); the read set stays, each item as read at its
          clock, which this commit validated up to now: a later write fails the
          successor's validation, as it must.
        * anything else (a log, a recorder, a predefined order, another
          protocol): :meth:`commit_and_continue` keeping everything, which may
          return another object.

        Nothing is revocable (unlike a hand-over): a request that conflicts with
        a kept lock waits for the successor, so the caller must not update a
        kept row in this thread before the successor ends, and should call
        :meth:`commit_and_continue` instead when someone waits for a lock
        (``locks.queued``).
        """
        if not (
            txn.__class__ is Transaction
            and txn.manager is self
            and txn.read_only  # (so it has no writes)
            and self._fast_continue
            and txn.state == ACTIVE
            and txn.doomed is None
            and not txn.offsets
            and self.store.wal is None
        ):
            self._own(txn, "commit and continue")
            if not txn.read_only:
                raise TransactionError(
                    f"transaction {txn.hid} is not read-only: only a reader hands its reads on"
                )
            return self.commit_and_continue(txn, set(txn.locks) | set(txn.reads), reuse=True)
        self.protocol.commit_reader(txn)
        self.committed += 1
        return txn

    def commit_keeping_all_untimed(self, txn: Transaction) -> bool:
        """:meth:`commit_keeping_all` without a commit timestamp, when that is safe now.

        A reader that keeps every read writes nothing and releases nothing, so
        its commit needs no place on the commit clock when its reads are known
        current at this instant; then it commits without the commit mutex: the
        clock stays where it is and ``committed`` counts it (True).  False, and
        nothing done, otherwise (call :meth:`commit_keeping_all`):

        * ``ss2pl`` (:attr:`~txstream.txn.base.ConcurrencyControl.untimed_readers`
          ``"always"``): always on the short paths; the locks it keeps hold every
          row it read at the version read until they are released, after a later
          commit of the successor that takes a timestamp.
        * ``optimistic`` (``"unwritten"``): when no commit is in progress (the
          commit mutex is free) and none wrote anything since the read set was
          last validated (the manager's ``write_ts`` at or before the transaction's
          ``valid_to``), every read is still current; ``valid_to`` stays, so a
          later write is caught by the next validation.
        * anything else, off the short paths (a log, a recorder, an order), or a
          transaction that is not an active reader of this manager: False.

        A continuous query's windows use it between the commits that sort out
        their reads; it saves the commit mutex, the costliest part of their commit.
        """
        kind = self._untimed
        if not (
            kind
            and txn.__class__ is Transaction
            and txn.manager is self
            and txn.read_only
            and txn.state == ACTIVE
            and txn.doomed is None
            and not txn.offsets
            and self.store.wal is None
        ):
            return False
        if kind == "unwritten" and (
            txn.snapshot_ts is not None
            # a writer inside its commit may have put in a version txn read before it
            # sets write_ts: then only the validation under the mutex may judge
            or self.commit_mutex.locked()
            # (read after the mutex was found free: a commit that ended before has
            # set it; one that begins after puts in versions txn's reads did not see)
            or self.write_ts > txn.valid_to
        ):
            return False
        self.committed += 1
        return True

    def _commit_validated(self, txn: Transaction) -> BaseException | None:
        """A reader's validating commit (no writes to publish): the clock moves on by one.

        On a failure ``txn`` is aborted (and a transient one counted), as
        :meth:`_commit` does, and the failure returned for the caller to raise
        once it has ended whatever else it began.
        """
        failure: BaseException | None = None
        with self.commit_mutex:
            try:
                self.protocol.validate(txn)
            except BaseException as exc:
                failure = exc
            else:
                self.clock += 1
                # every read in txn's read set is unchanged up to its own commit
                txn.valid_to = self.clock
        if failure is not None:
            self._commit_failed(txn, failure)
        return failure

    def resume(self, heir: Transaction) -> set[str]:
        """The successor of :meth:`commit_and_continue` starts: the kept items it lost."""
        return self.protocol.resume(heir)

    # -- results -------------------------------------------------------------------------

    def history(self, committed_only: bool = False) -> History:
        """The recorded history; :class:`TxStreamError` if recording is off."""
        if self.recorder is None:
            raise TxStreamError("this transaction manager does not record (use record=True)")
        return self.recorder.history(committed_only)

    def stats(self) -> dict[str, int]:
        """Counters: committed, aborted, deadlocks, lock waits, wounds, timeouts, ..."""
        lm = self.locks
        out = {
            "committed": self.committed,
            "aborted": self.aborted,
            "deadlocks": lm.deadlocks,
            "lock_waits": lm.waits,
            "wounds": lm.wounds,
            "timeouts": lm.timeouts,
            "checkpoints": self.checkpoints,
        }
        out.update(self.protocol.stats())
        return out

    def checkpoint(self) -> int:
        """Write the committed state to ``checkpoint.json`` and start a new log.

        Commits wait while it runs; running transactions go on.  Returns the
        checkpoint's size in bytes.
        """
        with self.commit_mutex:
            size = self.store.checkpoint(self.clock)
            self._checkpoint_lsn = self._last_lsn
            return size

    def close(self) -> None:
        """Close the write-ahead log and write out the recorded history."""
        if self.recorder is not None:
            self.recorder.close()
        self.store.close()

    def __enter__(self) -> TransactionManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["StorageError", "StreamRef", "TableRef", "Transaction", "TransactionManager"]
