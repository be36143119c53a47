"""The commit path of a :class:`~txstream.txn.manager.TransactionManager`, and its snapshots.

:class:`CommitPath` is the manager's base class that makes a transaction's
effects visible: validation, the log record, the new versions, the recorded
history, the write map of the optimistic protocols, automatic checkpoints; and
the open snapshots whose versions the tables keep.  Its methods run in the
committing transaction's thread; what they change under ``commit_mutex`` (the
clock, the versions, the log order) is changed by one committer at a time.
"""

from __future__ import annotations

import bisect
import logging
import threading
from typing import Any

from txstream.errors import TransientError, TxStreamError
from txstream.model.history import Operation
from txstream.storage import ABSENT, Store, Stream
from txstream.txn.base import (
    ABORTED,
    ACTIVE,
    COMMITTED,
    COMMITTING,
    ConcurrencyControl,
)
from txstream.txn.locks import LockManager
from txstream.txn.recorder import HistoryRecorder
from txstream.txn.transaction import Transaction

log = logging.getLogger("txstream.txn")

_PRUNE_MIN = 4096
"""Write-map size below which the write map is not pruned."""


class CommitPath:
    """A manager's commit and snapshots (the manager's ``__init__`` sets this state)."""

    store: Store
    ordered: bool
    locks: LockManager
    recorder: HistoryRecorder | None
    commit_mutex: threading.Lock
    clock: int
    last_write: dict[str, int]
    write_ts: int
    active_since: dict[int, int]
    _prune_at: int
    snapshots: dict[int, int]
    _open_snapshots: list[int]
    protocol: ConcurrencyControl
    _validates: bool
    _plain: bool
    committed: int
    aborted: int
    failures: dict[str, int]
    checkpoint_every_bytes: int | None
    checkpoints: int
    checkpoint_failures: int
    _last_lsn: int
    _checkpoint_lsn: int

    # -- snapshots ---------------------------------------------------------------------

    def take_snapshot(self, txn: Transaction) -> None:
        """Give ``txn`` a snapshot of everything committed so far (and its history slot)."""
        with self.commit_mutex:
            txn.snapshot_ts = self.clock
            self.snapshots[txn.id] = self.clock
            # The clock never goes back, so appending keeps the list sorted.
            self._open_snapshots.append(self.clock)
            if self.recorder is not None:
                txn.slot = self.recorder.slot()

    def _end_snapshot(self, txn: Transaction) -> None:
        with self.commit_mutex:
            ts = self.snapshots.pop(txn.id, None)
            if ts is not None:
                snaps = self._open_snapshots
                del snaps[bisect.bisect_left(snaps, ts)]

    # -- commit --------------------------------------------------------------------------

    def _commit(self, txn: Transaction) -> None:
        if self._plain and not txn.wevents and self.store.wal is None:
            # The common case of in-place protocols without a log, recorder or
            # ordering: install the versions, release the locks.
            txn.state = COMMITTING
            with self.commit_mutex:
                ts = self.clock + 1
                keep = self._open_snapshots or None
                for tbl, key in txn.wrows:
                    tbl.install(key, ts, None, keep)
                if txn.offsets:
                    self.store.offsets.update(txn.offsets)
                self.clock = ts
            txn.state = COMMITTED
            self.protocol.release(txn)
            self.committed += 1
            return
        try:
            if txn.doomed is not None:
                raise txn.doomed
            if self.ordered:
                # Only ordered managers wound; the check and the state change must be
                # atomic with respect to wounds.
                self.locks.wait_turn(txn)
                self.locks.start_commit(txn, COMMITTING)
            else:
                txn.state = COMMITTING
        except TransientError as exc:
            txn._fail(exc)
        failure: BaseException | None = None
        lsn = 0
        with self.commit_mutex:
            try:
                if self._validates:
                    self.protocol.validate(txn)
                ts = self.clock + 1
                lsn = self._publish(txn, ts)
                self.clock = ts
                if lsn:
                    self._last_lsn = lsn
            except BaseException as exc:
                failure = exc
        if failure is not None:
            self._commit_failed(txn, failure)
            raise failure
        if lsn:
            try:
                self.store.sync(lsn)
            except BaseException:
                # The record could not be made durable (an fsync failed, the
                # store has failed and cut the record off): the transaction did
                # not commit.  It must not stay "committing" with its locks, or
                # every transaction touching its rows would wait forever.  Its
                # effects stay in memory, which is no longer authoritative: the
                # store refuses every later commit until it is reopened.
                txn.state = ABORTED
                self._ended(txn, committed=False, keep_order=False)
                raise
        txn.state = COMMITTED
        self._ended(txn, committed=True, keep_order=False)
        every = self.checkpoint_every_bytes
        if every is not None and lsn - self._checkpoint_lsn >= every:
            self._auto_checkpoint(every)

    def _commit_failed(self, txn: Transaction, failure: BaseException) -> None:
        """Abort ``txn``, whose commit failed before it was published.

        A transient failure is counted, and ``txn`` keeps its place in a predefined
        order (its retry takes it); any other failure gives the place up.
        """
        txn.state = ACTIVE
        transient = isinstance(failure, TransientError)
        txn._abort(keep_order=transient)
        if transient:
            self._count(type(failure).__name__)

    def _auto_checkpoint(self, every: int) -> None:
        """Checkpoint because the log grew by ``every`` bytes (after a commit is done).

        The commit that triggers it has completed, so a failure here is logged
        and counted, not raised to its caller; the next attempt comes after
        another ``every`` bytes.
        """
        with self.commit_mutex:
            if self._last_lsn - self._checkpoint_lsn < every:
                return  # another committer took it
            self._checkpoint_lsn = self._last_lsn
            try:
                self.store.checkpoint(self.clock)
            except (OSError, TxStreamError) as exc:
                self.checkpoint_failures += 1
                log.warning("automatic checkpoint failed (will retry later): %s", exc)
                return
            self.checkpoints += 1

    def _publish(self, txn: Transaction, ts: int) -> int:
        """Log, install and record the effects of ``txn`` at timestamp ``ts`` (mutex held)."""
        store = self.store
        keep = self._open_snapshots or None
        items: list[str]
        if txn.deferred and not (txn.wset or txn.wappends) and store.wal is None:
            # nothing written (a reader) and nothing to log: only offsets to publish
            lsn = store.log_commit(ts, [], [], txn.offsets) if txn.offsets else 0
            items = []
        elif txn.deferred:
            appended: list[tuple[Stream, int, Any]] = []
            try:
                for s, ev in txn.wappends:
                    appended.append((s, s.append(ev), ev))
                rows = [(tbl, key, row) for (tbl, key), row in txn.wset.items()]
                lsn = store.log_commit(ts, rows, appended, txn.offsets)
            except BaseException:
                for s, event_id, _ in appended:
                    s.remove(event_id)
                raise
            for tbl, key, row in rows:
                tbl.apply(key, row, ts, None, keep)
            for s, event_id, _ in appended:
                s.install(event_id, ts)
            items = [tbl.item(key) for tbl, key, _ in rows]
            items.extend(s.item_of(event_id) for s, event_id, _ in appended)
        else:
            wrows = txn.wrows
            if store.wal is not None:
                rows = [(tbl, key, tbl.read(key, ABSENT)) for tbl, key in wrows]
                events = [(s, i, s.event(i)) for s, i in txn.wevents]
                lsn = store.log_commit(ts, rows, events, txn.offsets)
            else:
                lsn = store.log_commit(ts, [], [], txn.offsets) if txn.offsets else 0
            for tbl, key in wrows:
                tbl.install(key, ts, None, keep)
            if txn.wevents:
                for s, event_id in txn.wevents:
                    s.install(event_id, ts)
                items = list(wrows.values())
                items.extend(s.item_of(i) for s, i in txn.wevents)
            else:
                items = list(wrows.values())
        rec = self.recorder
        if rec is not None:
            hid = txn.hid
            if self.protocol.records_writes_at_commit:
                for item in dict.fromkeys(items):
                    rec.op(Operation("w", hid, item))
            rec.op(Operation("c", hid))
        if self.protocol.tracks_writes:
            last = self.last_write
            for item in items:
                last[item] = ts
            if items:
                self.write_ts = ts
            if len(last) > self._prune_at:
                self._prune_last_write()
        return lsn

    def _prune_last_write(self) -> None:
        """Drop write-map entries older than every active transaction (mutex held).

        Validation asks "was the item written after time t?", where t is a
        snapshot or a read of an active transaction, never older than the
        watermark; an entry at or before the watermark answers "no" exactly as a
        missing one does.  Runs when the map has doubled since the last pruning,
        so its cost is amortized O(1) per write.
        """
        mark = self.clock
        if self._open_snapshots:
            mark = min(mark, self._open_snapshots[0])
        active = list(self.active_since.values())
        if active:
            mark = min(mark, min(active))
        last = self.last_write
        for item in [item for item, ts in last.items() if ts <= mark]:
            del last[item]
        self._prune_at = max(_PRUNE_MIN, 2 * len(last))

    def _ended(self, txn: Transaction, committed: bool, keep_order: bool) -> None:
        self.protocol.release(txn)
        if txn.snapshot_ts is not None:
            self._end_snapshot(txn)
        rec = self.recorder
        if rec is not None:
            if txn.slot is not None:
                txn.slot.done = True
            # The arrival line follows the input (begin) order, not the commit order.
            if committed:
                rec.settle(txn.order, txn.hid)
            elif not keep_order:
                rec.settle(txn.order, None)
        if committed:
            self.committed += 1
        else:
            self.aborted += 1
        if self.ordered and not keep_order:
            self.locks.finish_order(txn.order)

    def _count(self, name: str) -> None:
        self.failures[name] = self.failures.get(name, 0) + 1
