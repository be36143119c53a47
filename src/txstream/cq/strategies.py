"""The CQ-processing strategies: how a continuous query's units run as transactions.

A unit is a window (or, without a window, an input event).  Each strategy is a
class that owns how its units run: :meth:`Strategy.transact` runs one unit's
``fill`` in a CQ-derived transaction (redoing it on a transient failure) and
the hooks it calls choose the transaction, commit it and say what the next
unit keeps.  A :class:`~txstream.cq.engine.CQEngine` makes one instance of its
strategy (``engine.strategy``) and hands it every unit; the strategy reads and
sets the engine's per-run state (the attempt counter, the clean clock, the
quiet shortcut) and nothing else of it.

* :class:`Naive` - no transaction: today's engines.
* :class:`TwoPhaseLock` (``s2pl``) - read locks to the commit; the next
  window's transaction takes over the locks of the rows it reads again.
* :class:`SnapshotStrategy` (``snapshot``) - a read-only snapshot transaction,
  kept open from unit to unit while nothing commits.
* :class:`Optimistic` - validation at commit, redo on failure, escalation to a
  snapshot after ``escalate_after`` failures in a row.

The hand-over between windows (``s2pl``, ``optimistic``: the next window's
transaction begun before this one commits, and what it keeps) is one
:class:`HandOver` object per strategy instance.
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from txstream.cq.base import CQError
from txstream.errors import TransientError, UnknownNameError
from txstream.txn import Transaction, TransactionManager
from txstream.txn.locks import LockManager

if TYPE_CHECKING:
    from txstream.cq.engine import CQEngine
    from txstream.cq.entries import Entry

Fill = Callable[[Transaction | None], Any]
"""A unit's work: what it produced, with the entries it used first (None: not complete)."""

Carry = Callable[[Any], "list[Entry]"]
"""The entries of a unit's output that the next window uses again."""

_NO_ENTRIES: list[Entry] = []  # (shared: never filled)


class HandOver:
    """The next window's transaction, begun before the current one commits, and what it keeps.

    ``s2pl`` and ``optimistic`` (see ``CQEngine.release_every``): a window's
    transaction either keeps every read for its successor (``kept_all``: the
    same object goes on, nothing moves) or hands on the reads of the entries
    the next window shares (``carried``), and the others are sorted out.
    """

    __slots__ = (
        "carried",
        "heir",
        "heir_of",
        "held",
        "keep_all",
        "kept_all",
        "kept_from",
        "waits_on",
    )

    def __init__(self) -> None:
        self.heir: Transaction | None = None  # the next window's transaction, begun early
        self.carried: list[Entry] = _NO_ENTRIES  # the entries whose reads it keeps
        self.heir_of = -2  # the attempt whose transaction began it
        self.keep_all = False  # windows may keep every read (set per run)
        self.kept_all = False  # the heir kept every read of its predecessor
        self.held = 0  # windows since the unneeded reads were last sorted out
        # the attempt whose transaction handed all its reads on to the current one
        self.kept_from = -2
        # s2pl: the lock manager, whose waiting requests make a window sort out the
        # reads kept over several windows at once rather than later
        self.waits_on: LockManager | None = None


class Strategy(ABC):
    """A CQ-processing strategy: the protocol its transactions run under, and how units run.

    The class attributes describe it (``name``, the transaction-manager
    ``protocol``, ``summary``); an instance runs one engine's units.
    """

    name: ClassVar[str]
    protocol: ClassVar[str]
    summary: ClassVar[str]
    transactional: ClassVar[bool] = True
    # How a read is made on the engine's direct path (no recorder, no order), which
    # the engine writes out inline (its hot path): under a read lock, noted for
    # validation, or from a snapshot.
    locks_reads: ClassVar[bool] = False
    validates_reads: ClassVar[bool] = False
    snapshot_reads: ClassVar[bool] = False

    def __init__(self, engine: CQEngine) -> None:
        self.engine = engine
        self.tm: TransactionManager = engine.tm
        self.hand = HandOver()

    # -- a run ---------------------------------------------------------------------

    def start(self, plain: bool) -> None:
        """A run begins; ``plain``: no callback runs in this thread between units.

        (Only then may a unit keep something open for the next one: a callback
        could update a kept row from this thread.)
        """
        self.hand.keep_all = False

    def stop(self) -> None:
        """The run stops: end the successor transaction kept for the next window."""
        hand = self.hand
        heir, hand.heir = hand.heir, None
        hand.carried = _NO_ENTRIES
        hand.kept_all = False
        hand.held = 0
        if heir is not None:
            self.tm.resume(heir)
            heir.abort()

    # -- a unit --------------------------------------------------------------------

    def transact(self, fill: Fill, carry: Carry | None = None) -> tuple[Any, int]:
        """Run ``fill`` in one CQ-derived transaction; redo it on a transient failure.

        ``fill`` returns what the unit produced, with the entries it used
        (``out[0]``), or None when its window is not complete yet: then the
        transaction aborts and the events wait in the redo queue.  Returns
        (what ``fill`` returned, attempts).  ``carry(out)`` names the entries
        the next window uses again (see :meth:`finish`).  A query without a
        commit operator runs no transaction (:meth:`outside`).
        """
        engine = self.engine
        if not engine._txn_per_unit:
            return self.outside(fill)
        tm, hand = self.tm, self.hand
        attempts = 0
        while True:
            attempts += 1
            engine._attempt += 1
            txn = hand.heir
            if txn is not None and hand.kept_all:
                # the common case first (a window after a window): the previous window's
                # transaction kept every read, nothing lost (never after a failed
                # attempt, which leaves no successor: never escalated)
                hand.heir = None
                hand.kept_all = False
                hand.kept_from = hand.heir_of
                hand.carried = _NO_ENTRIES
                escalated = False
            else:
                txn, escalated = self.take(attempts)
            snap = txn.snapshot_ts  # (what _quiet looks at, without the call)
            # one sample of the clock, after the transaction began and before its reads
            clock = tm.clock
            engine._quiet_now = (
                engine._fast
                and not escalated
                and ((snap if snap is not None else clock) == engine._clean)
            )
            engine._since = clock
            try:
                out = fill(txn)
                if out is None:
                    self.incomplete(txn)
                else:
                    clean = engine._clean
                    if (
                        hand.keep_all
                        and carry is not None
                        and not escalated
                        and hand.held < engine.release_every
                        and not (hand.waits_on is not None and hand.waits_on.queued)
                    ):
                        # Most windows of s2pl and optimistic (_HandsOn), here rather than
                        # in finish, whose call costs about as much as the rest: hold on to
                        # the rows the next window does not read a few windows more, rather
                        # than sort them out (see CQEngine.release_every).
                        if tm.commit_keeping_all_untimed(txn):
                            # committed with every read kept and no commit timestamp (no
                            # commit mutex: most of a window's commit cost): the clock did
                            # not move, so the engine's clean clock stays
                            hand.heir = txn
                            hand.kept_all = True
                            moved = False
                        else:
                            heir = hand.heir = tm.commit_keeping_all(txn)
                            hand.kept_all = heir is txn
                            if heir is not txn:  # (a hand-over after all, e.g. with a log)
                                hand.carried = carry(out)
                            moved = True
                        hand.held += 1
                        hand.heir_of = engine._attempt
                    else:
                        moved = self.finish(txn, out, carry, escalated)
                    if moved:
                        # our own commit moved the clock by one: nothing else did
                        engine._clean = clean + 1 if clean >= 0 and tm.clock == clean + 1 else -1
                return out, attempts
            except TransientError:
                # validation failed (or a deadlock victim): abort and redo the unit
                if txn.status == "active":
                    txn.abort()  # a lock request made without txn.read failed
                engine.stats.redos += 1
            except BaseException:
                # the query's own code failed (a predicate, a non-numeric value, ...):
                # the error goes to the caller, but the transaction must not stay open
                # with its read locks (updaters of those rows would wait forever), its
                # snapshot or its place in the optimistic write map
                if txn.status == "active":
                    txn.abort()
                raise

    def outside(self, fill: Fill, carry: Carry | None = None) -> tuple[Any, int]:
        """A unit with no CQ-derived transaction (``naive``, or no commit operator).

        With a recorder (``naive``), a read-only transaction only names the
        unit's reads in the history.
        """
        engine = self.engine
        engine._attempt += 1
        txn = self.tm.begin(read_only=True) if engine._record_naive else None
        try:
            out = fill(txn)
        except BaseException:
            if txn is not None:
                txn.abort()  # as in transact: no transaction stays open
            raise
        if txn is not None:
            if out is None:
                txn.abort()
            else:
                engine._name_reads(txn, out[0])
                txn.commit()
        return out, 1

    def take(self, attempts: int) -> tuple[Transaction, bool]:
        """The transaction of this attempt, and whether the unit escalated.

        The successor the previous window began (see :meth:`finish`; one that
        kept every read :meth:`transact` takes itself), else a new one
        (:meth:`begin_unit`).
        """
        hand = self.hand
        txn = hand.heir
        hand.heir = None
        hand.kept_all = False
        hand.kept_from = -2
        if txn is None:
            return self.begin_unit(), False
        self.take_over(txn)
        return txn, False

    def begin_unit(self) -> Transaction:
        """A new transaction for a unit (a reader)."""
        return self.tm.begin(read_only=True)

    def take_over(self, txn: Transaction) -> None:
        """``txn`` has the previous window's reads of the rows its carried entries read.

        Except those it lost (a lock someone waited for, or took meanwhile):
        the entries that read one of those re-read under the usual rules.
        """
        lost = self.tm.resume(txn)
        hand = self.hand
        # An entry the handing transaction checked, if this window uses it, is one of
        # the carried ones (the entries of that window from this one's start on)...
        hand.kept_from = hand.heir_of
        if lost:
            items = self.engine._items
            for entry in hand.carried:
                if not lost.isdisjoint(items((entry,))):
                    entry.checked = -1  # ... unless it lost a read: re-read it
        # (Only those marks may change here: a carried entry past this window's end,
        # which a re-evaluation can bring about, is not handed on again and must not
        # pass for checked by this transaction.)
        hand.carried = _NO_ENTRIES

    def incomplete(self, txn: Transaction) -> None:
        """The unit is not complete yet (its window waits for events): end ``txn``."""
        txn.abort()

    def finish(self, txn: Transaction, out: Any, carry: Carry | None, escalated: bool) -> bool:
        """Commit the unit's transaction; whether the engine's clean clock follows the commit."""
        txn.commit()
        return True

    def current_as_read(self, txn: Transaction, entry: Entry) -> bool:
        """Make an entry's reads ``txn``'s own when nothing committed since they were current.

        Returns whether the entry stands as it is (else it is re-read).
        """
        return False


class Naive(Strategy):
    """No concurrency control (today's engines)."""

    name = "naive"
    protocol = "none"
    summary = "no concurrency control: reads see whatever rows are current"
    transactional = False

    # No transaction: the synopsis is reused as it is.
    transact = Strategy.outside


class _HandsOn(Strategy):
    """``s2pl`` and ``optimistic``: the next window's transaction keeps this one's reads."""

    def start(self, plain: bool) -> None:
        """Windows may keep every read when nothing runs between them (see ``release_every``)."""
        self.hand.keep_all = self.engine._direct and plain

    def finish(self, txn: Transaction, out: Any, carry: Carry | None, escalated: bool) -> bool:
        """Commit so that the next window's transaction keeps the reads it shares.

        Most windows commit keeping every read, for up to ``release_every``
        windows (:meth:`Strategy.transact` does that itself, with
        :meth:`~txstream.txn.TransactionManager.commit_keeping_all_untimed`, no
        commit timestamp when that is safe, else
        :meth:`~txstream.txn.TransactionManager.commit_keeping_all`); the others
        come here.  With ``carry`` the transaction commits with
        :meth:`~txstream.txn.TransactionManager.commit_and_continue` (the reads
        of the carried entries kept, the others sorted out): the next window's
        transaction begins before this one commits, so it need not lock,
        re-read or re-validate them one by one.
        """
        if escalated or carry is None:
            # (an escalated unit: the next one begins afresh, and its transaction must
            # not inherit this one's snapshot)
            txn.commit()
            return True
        hand, engine = self.hand, self.engine
        if entries := carry(out):
            keep = engine._items(entries)
            # (the successor may be txn's own object, begun again)
            hand.heir = self.tm.commit_and_continue(txn, keep, reuse=True)
            hand.held = 0
            hand.carried = entries
            hand.heir_of = engine._attempt
        else:
            txn.commit()
        return True


class TwoPhaseLock(_HandsOn):
    """Read locks from the first reference until the commit operator."""

    name = "s2pl"
    protocol = "ss2pl"
    summary = "read locks held until the CQ-derived transaction commits"
    locks_reads = True

    def __init__(self, engine: CQEngine) -> None:
        super().__init__(engine)
        # an updater waits for a lock: release what the next window does not need
        self.hand.waits_on = self.tm.locks

    def current_as_read(self, txn: Transaction, entry: Entry) -> bool:
        """Lock the entry's rows; they stand if still nothing committed."""
        engine = self.engine
        lock = engine._lock
        for item in engine._items((entry,)):
            lock(txn, item)  # the read lock (the row itself is not needed again)
        if engine._quiet(txn):  # still nothing committed: the versions locked are those
            return True
        engine._quiet_now = False
        return False


class SnapshotStrategy(Strategy):
    """Reads the table version as of the transaction's start."""

    name = "snapshot"
    protocol = "snapshot"
    summary = "the transaction reads a snapshot taken at its start"
    snapshot_reads = True

    def __init__(self, engine: CQEngine) -> None:
        super().__init__(engine)
        # the previous unit's read-only transaction, kept open while nothing commits,
        # and whether this run may keep one (see start)
        self.open: Transaction | None = None
        self.reuse = False

    def start(self, plain: bool) -> None:
        """Units may share a transaction while nothing commits, without callbacks."""
        super().start(plain)
        self.reuse = self.engine._snap_direct and plain

    def stop(self) -> None:
        """Commit the transaction kept open (its units' results are out)."""
        snap, self.open = self.open, None
        if snap is not None:
            snap.commit()
        super().stop()

    def begin_unit(self) -> Transaction:
        """The previous unit's transaction while nothing committed since its snapshot."""
        txn = self.open
        self.open = None
        if txn is not None and self.tm.clock != txn.snapshot_ts:
            txn.commit()  # something committed since its snapshot: a new one
            txn = None
        if txn is None:
            txn = self.tm.begin(read_only=True)
        return txn

    def finish(self, txn: Transaction, out: Any, carry: Carry | None, escalated: bool) -> bool:
        """Keep the transaction open for the next unit, or commit it."""
        if self.reuse:
            # read-only: the next unit begun now would get this transaction's snapshot
            # as long as nothing commits, so it goes on in this one; the next unit
            # commits it and begins another as soon as the clock moved (the commit of
            # a read-only snapshot transaction writes nothing and cannot fail)
            self.open = txn
            return False  # (nothing committed: the clean clock stays)
        txn.commit()
        return True

    def current_as_read(self, txn: Transaction, entry: Entry) -> bool:
        """Its snapshot shows the versions the entry read."""
        return True


class Optimistic(_HandsOn):
    """Validate reads at commit; abort and redo on a conflict."""

    name = "optimistic"
    protocol = "optimistic"
    summary = "validate referenced-resource timestamps at commit, redo on failure"
    validates_reads = True

    def take(self, attempts: int) -> tuple[Transaction, bool]:
        """After ``escalate_after`` failed attempts in a row: a snapshot transaction."""
        if attempts > self.engine.escalate_after:
            # the unit failed its validation escalate_after times in a row: run it on
            # a snapshot, which a later write can neither change nor fail (after a
            # failed attempt there is no successor transaction to take over)
            assert self.hand.heir is None
            self.hand.kept_from = -2
            self.engine.stats.escalations += 1
            return self.tm.begin_snapshot(), True
        return super().take(attempts)

    def incomplete(self, txn: Transaction) -> None:
        """A window not complete yet stands only if the reads validate, else it is redone.

        (A handed-on read of a row updated since may have dropped an event.)
        """
        tm = self.tm
        with tm.commit_mutex:
            tm.protocol.validate(txn)
        txn.abort()

    def current_as_read(self, txn: Transaction, entry: Entry) -> bool:
        """Validated at commit as read at the instant they were found current.

        (This transaction started then or later: write-map pruning keeps every
        write after it.)
        """
        engine = self.engine
        txn.reads.update(dict.fromkeys(engine._items((entry,)), engine._clean))
        return True


STRATEGIES: dict[str, type[Strategy]] = {
    c.name: c for c in (Naive, TwoPhaseLock, SnapshotStrategy, Optimistic)
}


class UnknownStrategyError(UnknownNameError, CQError):
    """An unknown strategy name: a bad query like the others (a :class:`CQError`)."""


def get_strategy(name: str) -> type[Strategy]:
    """The strategy class called ``name``; :class:`UnknownStrategyError` otherwise."""
    try:
        return STRATEGIES[name]
    except (KeyError, TypeError):  # (TypeError: an unhashable name, e.g. a list)
        raise UnknownStrategyError("strategy", name, list(STRATEGIES)) from None


def make_manager(strategy: str, *, record: bool = False) -> TransactionManager:
    """A transaction manager with the protocol ``strategy`` needs."""
    return TransactionManager(protocol=get_strategy(strategy).protocol, record=record)


__all__ = [
    "STRATEGIES",
    "HandOver",
    "Naive",
    "Optimistic",
    "SnapshotStrategy",
    "Strategy",
    "TwoPhaseLock",
    "UnknownStrategyError",
    "get_strategy",
    "make_manager",
]
