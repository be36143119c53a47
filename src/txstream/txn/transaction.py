"""A transaction: its control block (TCB) and the operations on it.

:class:`Transaction` objects are made by
:meth:`~txstream.txn.TransactionManager.begin` (and re-exported by
:mod:`txstream.txn.manager` and :mod:`txstream.txn`); the manager runs their
commits, the protocol decides when they may touch an item.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from txstream.errors import TransientError
from txstream.model.history import Operation
from txstream.storage import ABSENT, DuplicateKeyError, MissingRowError, Stream, Table
from txstream.txn.base import ABORTED, ACTIVE, COMMITTED, STATE_NAMES, TransactionError
from txstream.txn.locks import Solo, Waiter
from txstream.txn.recorder import Slot

if TYPE_CHECKING:
    from txstream.txn.manager import TransactionManager

TableRef = Table | str
StreamRef = Stream | str


_NO_LIST: list[Any] = []
_NO_DICT: dict[Any, Any] = {}


class Transaction:
    """One transaction: its Transaction Control Block and the operations on it.

    Created by :meth:`TransactionManager.begin`.  ``id`` grows with start time
    (younger = larger); ``hid`` is its name in recorded histories; ``order`` is
    its position in the predefined order (kept across retries).

    Its tables are key/value stores: every verb names the key, and a value is
    any object (``t.insert(accounts, 1, 100)``).  A job's transaction function
    gets ``tx.Tx`` instead, over declared tables whose rows name their own key
    (``t.insert("accounts", {"acct": 1, "balance": 100})``); the driver engine
    builds that on this.  The two verb sets side by side: docs/txn.md,
    "``Transaction`` and ``tx.Tx``: two layers, two shapes".
    """

    __slots__ = (
        "deferred",
        "doomed",
        "hid",
        "id",
        "locks",
        "lost",
        "manager",
        "offsets",
        "order",
        "own_events",
        "read_only",
        "reads",
        "slot",
        "snapshot_ts",
        "solo",
        "state",
        "undo_log",
        "valid_to",
        "waiting",
        "wappends",
        "wevents",
        "wrows",
        "wset",
    )

    def __init__(self, manager: TransactionManager, tid: int, order: int, read_only: bool) -> None:
        self.manager = manager
        self.id = tid
        self.hid = str(tid)
        self.order = order
        self.read_only = read_only
        self.state = ACTIVE
        self.locks: dict[str, int] = {}
        # the lock record of the items it alone holds in shared mode (see locks.Solo)
        self.solo: Solo | None = None
        # A successor of commit_and_continue until resumed: the kept items it lost
        self.lost: set[str] | None = None
        self.waiting: Waiter | None = None
        self.doomed: TransientError | None = None
        self.snapshot_ts: int | None = None
        self.deferred = False
        self.slot: Slot | None = None
        # (a reader never changes a row in place: it keeps the shared empty ones)
        self.undo_log: list[tuple[Callable[[Any], Any], Any]] = _NO_LIST if read_only else []
        self.wrows: dict[tuple[Table, Hashable], str] = _NO_DICT if read_only else {}
        # Containers most transactions never fill start as shared empty ones;
        # they are replaced by fresh ones before the first insertion (see
        # ``buffers`` and the methods that fill them).
        self.wevents: list[tuple[Stream, int]] = _NO_LIST
        self.own_events: set[int] | None = None
        self.wset: dict[tuple[Table, Hashable], Any] = _NO_DICT
        self.wappends: list[tuple[Stream, Any]] = _NO_LIST
        self.reads: dict[str, int] = _NO_DICT
        # optimistic: a validating commit that keeps this read set (commit_keeping_all)
        # found none of it overwritten up to this clock (0: none did)
        self.valid_to = 0
        self.offsets: dict[str, Any] = _NO_DICT

    def __repr__(self) -> str:
        return f"Transaction({self.hid}, {STATE_NAMES[self.state]})"

    def buffers(self) -> None:
        """Give this transaction private write and read sets (deferred protocols)."""
        self.wset = {}
        self.wappends = []
        self.reads = {}

    @property
    def status(self) -> str:
        """``"active"``, ``"committing"``, ``"committed"`` or ``"aborted"``."""
        return STATE_NAMES[self.state]

    # -- context manager ------------------------------------------------------------

    def __enter__(self) -> Transaction:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.state != ACTIVE:
            return
        if exc_type is None:
            self.commit()
        else:
            self._abort(keep_order=isinstance(exc, TransientError))

    # -- helpers ----------------------------------------------------------------------

    def _inactive(self, what: str) -> TransactionError:
        return TransactionError(
            f"cannot {what} in transaction {self.hid}: it is {STATE_NAMES[self.state]}"
        )

    def _guard(self, what: str) -> None:
        if self.state != ACTIVE:
            raise self._inactive(what)
        if self.doomed is not None:
            self._fail(self.doomed)

    def _fail(self, error: TransientError) -> None:
        """Abort after a retryable failure and raise it."""
        self.manager._count(type(error).__name__)
        self._abort(keep_order=True)
        raise error

    def _no_writes(self) -> None:
        if self.read_only:
            raise TransactionError(f"transaction {self.hid} is read-only and cannot write")

    def _read_item(self, item: str) -> None:
        try:
            self.manager.protocol.before_read(self, item)
        except TransientError as exc:
            self._fail(exc)

    def _write_item(self, item: str) -> None:
        try:
            self.manager.protocol.before_write(self, item)
        except TransientError as exc:
            self._fail(exc)

    def _record_read(self, item: str) -> None:
        rec = self.manager.recorder
        if rec is not None:
            op = Operation("r", self.hid, item)
            if self.slot is not None:
                self.slot.append(op)
            else:
                rec.op(op)

    # -- table operations -----------------------------------------------------------

    def read(self, table: TableRef, key: Hashable, default: Any = None) -> Any:
        """The row of ``key`` as this transaction may see it, or ``default``."""
        if self.state != ACTIVE or self.doomed is not None:
            self._guard("read")
        mgr = self.manager
        tbl = table if table.__class__ is Table else mgr.store.get_table(table)  # type: ignore[arg-type]
        item = tbl.item(key)
        try:
            mgr.protocol.before_read(self, item)
        except TransientError as exc:
            self._fail(exc)
        snap = self.snapshot_ts
        if self.deferred or snap is not None:
            value = self.wset.get((tbl, key), self) if self.wset else self
            if value is self:
                if snap is not None:
                    value = tbl.read_at(key, snap, ABSENT)
                else:
                    value = tbl.read(key, ABSENT)
            self._record_read(item)
            return default if value is ABSENT else value
        latch = mgr.latch
        if latch is not None:
            with latch:
                value = tbl.read(key, default)
                self._record_read(item)
            return value
        value = tbl.read(key, default)
        if mgr.recorder is not None:
            self._record_read(item)
        return value

    def _visible(self, tbl: Table, key: Hashable, item: str) -> Any:
        """Deferred mode: the row this transaction sees (own writes first); counts as a read."""
        self._read_item(item)
        self._record_read(item)
        value = self.wset.get((tbl, key), self)
        if value is self:
            snap = self.snapshot_ts
            value = tbl.read_at(key, snap, ABSENT) if snap is not None else tbl.read(key, ABSENT)
        return value

    def _change(self, table: TableRef, key: Hashable, op: str, arg: Any, field: Any = None) -> None:
        if self.state != ACTIVE or self.doomed is not None:
            self._guard(op)
        if self.read_only:
            self._no_writes()
        mgr = self.manager
        tbl = table if table.__class__ is Table else mgr.store.get_table(table)  # type: ignore[arg-type]
        item = tbl.item(key)
        if self.deferred:
            self._change_deferred(tbl, key, item, op, arg, field)
            return
        try:
            mgr.protocol.before_write(self, item)
        except TransientError as exc:
            self._fail(exc)
        latch = mgr.latch
        if latch is not None:
            with latch:
                self._apply(tbl, key, op, arg, field)
                mgr.recorder.op(Operation("w", self.hid, item))  # type: ignore[union-attr]
        else:
            self._apply(tbl, key, op, arg, field)
        self.wrows[(tbl, key)] = item

    def _apply(self, tbl: Table, key: Hashable, op: str, arg: Any, field: Any) -> None:
        if op == "put":
            undo = tbl.put(key, arg)
        elif op == "increment":
            undo = tbl.increment(key, arg, field)
        elif op == "insert":
            undo = tbl.insert(key, arg)
        elif op == "update":
            undo = tbl.update(key, arg)
        else:
            undo = tbl.delete(key)
        self.undo_log.append((tbl.undo, undo))

    def _change_deferred(
        self, tbl: Table, key: Hashable, item: str, op: str, arg: Any, field: Any
    ) -> None:
        self._write_item(item)
        if op == "put":
            self.wset[(tbl, key)] = arg
            return
        old = self._visible(tbl, key, item)
        if op == "insert":
            if old is not ABSENT:
                raise DuplicateKeyError(f"table {tbl.name}: key {key!r} already exists")
            new = arg
        elif op == "delete":
            if old is ABSENT:
                raise MissingRowError(f"table {tbl.name}: no row with key {key!r} to delete")
            new = ABSENT
        elif op == "update":
            if old is ABSENT:
                raise MissingRowError(f"table {tbl.name}: no row with key {key!r} to update")
            new = arg
        else:
            if old is ABSENT:
                raise MissingRowError(f"table {tbl.name}: no row with key {key!r} to increment")
            scratch = Table(tbl.name)
            scratch.put(key, old)
            scratch.increment(key, arg, field)
            new = scratch.read(key)
        self.wset[(tbl, key)] = new

    def put(self, table: TableRef, key: Hashable, row: Any) -> None:
        """Insert or replace the row of ``key``."""
        self._change(table, key, "put", row)

    def insert(self, table: TableRef, key: Hashable, row: Any) -> None:
        """Insert ``row`` as the new value of ``key``.

        :class:`~txstream.storage.DuplicateKeyError` if ``key`` has one.  The key
        is given, not taken from the row (see the class's docstring).
        """
        self._change(table, key, "insert", row)

    def update(self, table: TableRef, key: Hashable, row: Any) -> None:
        """Replace an existing row (:class:`~txstream.storage.MissingRowError` if none)."""
        self._change(table, key, "update", row)

    def delete(self, table: TableRef, key: Hashable) -> None:
        """Delete an existing row (:class:`~txstream.storage.MissingRowError` if none)."""
        self._change(table, key, "delete", None)

    def increment(
        self, table: TableRef, key: Hashable, delta: Any, field: Hashable | None = None
    ) -> None:
        """``row += delta`` (or ``row[field] += delta``), undone by the opposite increment."""
        self._change(table, key, "increment", delta, field)

    def on_abort(self, undo: Callable[[Any], Any], arg: Any) -> None:
        """Run ``undo(arg)`` if this transaction aborts, in its undo log (newest first).

        For state kept beside the manager's tables (e.g. an index of their keys)
        that a change in this transaction updated in place: it then rolls back
        with the rows, whatever ends the transaction (its work raising, a
        retryable failure, a failed commit).
        """
        if self.state != ACTIVE:
            raise self._inactive("register an undo action")
        if self.read_only:
            self._no_writes()
        self.undo_log.append((undo, arg))

    # -- stream operations ------------------------------------------------------------

    def append(self, stream: StreamRef, event: Any) -> int | None:
        """Append ``event`` to ``stream`` (an event arrival, a write).

        Returns the event's id; ``None`` under protocols that buffer writes, where
        the id is assigned at commit.
        """
        if self.state != ACTIVE or self.doomed is not None:
            self._guard("append")
        if self.read_only:
            self._no_writes()
        mgr = self.manager
        s = stream if stream.__class__ is Stream else mgr.store.get_stream(stream)  # type: ignore[arg-type]
        assert isinstance(s, Stream)
        if self.deferred:
            after = None
            for other, ev in reversed(self.wappends):
                if other is s:
                    after = s.order_value(ev)
                    break
            s.check_order(event, after)
            for item in s.items_for_append():
                self._write_item(item)
            self.wappends.append((s, event))
            return None
        for item in s.items_for_append():
            self._write_item(item)
        latch = mgr.latch
        if latch is not None:
            latch.acquire()
        try:
            event_id = s.append(event)
            self.undo_log.append((s.remove, event_id))
            item = s.item_of(event_id)
            if latch is not None:
                mgr.recorder.op(Operation("w", self.hid, item))  # type: ignore[union-attr]
        finally:
            if latch is not None:
                latch.release()
        if self.wevents is _NO_LIST:
            self.wevents = []
        self.wevents.append((s, event_id))
        if self.own_events is None:
            self.own_events = set()
        self.own_events.add(event_id)
        if s.granularity != "stream":
            self._write_item(item)
        return event_id

    def scan(self, stream: StreamRef, start: int = 0, end: int | None = None) -> list[Any]:
        """Read the stream's state: its events with ids in ``[start, end)`` (a read)."""
        if self.state != ACTIVE or self.doomed is not None:
            self._guard("read")
        mgr = self.manager
        s = stream if stream.__class__ is Stream else mgr.store.get_stream(stream)  # type: ignore[arg-type]
        assert isinstance(s, Stream)
        lo, hi = s.bounds(start, end)
        items = s.items_for_read(lo, hi)
        for item in items:
            self._read_item(item)
        snap = self.snapshot_ts
        if snap is not None or self.deferred:
            events = s.read_at(snap, lo, hi) if snap is not None else s.read_visible(lo, hi, None)
            events.extend(ev for other, ev in self.wappends if other is s)
        elif mgr.latch is not None:
            with mgr.latch:
                events = s.read(lo, hi)
                for item in items:
                    self._record_read(item)
            return events
        else:
            events = s.read_visible(lo, hi, self.own_events)
        for item in items:
            self._record_read(item)
        return events

    def commit_offset(self, source: str, offset: Any) -> None:
        """Commit ``offset`` for stream source ``source`` atomically with this transaction."""
        if self.state != ACTIVE:
            raise self._inactive("commit an offset")
        if not isinstance(source, str):
            raise TransactionError(
                f"a source offset is named by a string, not {type(source).__name__} {source!r}"
            )
        if self.offsets is _NO_DICT:
            self.offsets = {}
        self.offsets[source] = offset

    # -- ending -------------------------------------------------------------------------

    def commit(self) -> None:
        """Commit: make the effects visible (and durable); release the locks."""
        if self.state != ACTIVE:
            raise self._inactive("commit")
        self.manager._commit(self)

    def abort(self, retry: bool = False) -> None:
        """Abort: undo every change, release the locks; a no-op if already aborted.

        ``retry=True``: the caller will run the work again with
        ``begin(retry_of=this)``, so an ordered manager keeps this transaction's
        place in the predefined order instead of letting younger ones pass.
        """
        if self.state == ABORTED:
            return
        if self.state != ACTIVE:
            raise self._inactive("abort")
        self._abort(keep_order=retry)

    def _abort(self, keep_order: bool) -> None:
        if self.state == ABORTED or self.state == COMMITTED:
            return
        mgr = self.manager
        undo = self.undo_log
        latch = mgr.latch
        if latch is not None:
            latch.acquire()
        try:
            while undo:
                fn, arg = undo.pop()
                fn(arg)
            self.state = ABORTED
            if mgr.recorder is not None:
                mgr.recorder.op(Operation("a", self.hid))
        finally:
            if latch is not None:
                latch.release()
        mgr._ended(self, committed=False, keep_order=keep_order)


__all__ = ["StreamRef", "TableRef", "Transaction"]
