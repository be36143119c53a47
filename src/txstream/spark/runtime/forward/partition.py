"""One partition's transactions of the batch: its queues, execution and messages.

:class:`_Partition` is built from its parts: :mod:`.admission`,
:mod:`.announce` and :mod:`.reads` (mixins of :class:`~.base._Shared`); here
its state, running what is first in line (:meth:`_Partition.drain`), what it
receives, and finishing.  See :mod:`.base` for the call order and invariants.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from txstream.spark.runtime.boundaries import Event, Group, event_gid
from txstream.spark.runtime.executor import GroupRunner
from txstream.spark.runtime.forward import base
from txstream.spark.runtime.forward.admission import _Admission
from txstream.spark.runtime.forward.announce import _Announce
from txstream.spark.runtime.forward.base import (
    FRAGMENT,
    HOME,
    LOCAL,
    MAIN,
    PART,
    _Item,
    _Light,
)
from txstream.spark.runtime.forward.messages import run_at_home, take_back, up_rows
from txstream.spark.runtime.forward.reads import _Reads
from txstream.spark.runtime.outcome import Outcome
from txstream.spark.runtime.state import PartitionState

if TYPE_CHECKING:
    from txstream.spark.runtime.forward.scheduler import ForwardScheduler


class _Partition(_Admission, _Announce, _Reads):
    """One partition's transactions of the batch: admission, queues, execution.

    Messages name a transaction by its event's place in the batch (``mid``, an
    int: cheaper to hash and to send than its id); a :class:`Group` (with the
    id) is made only where a transaction runs, and only when it crosses.  What
    a partition sends goes to :attr:`out`, one list per destination, which the
    scheduler hands over once per round (see :meth:`ForwardScheduler._pump`).
    """

    def __init__(
        self,
        sched: ForwardScheduler,
        pid: int,
        state: PartitionState,
        events: Iterator[Event],
    ) -> None:
        self.sched = sched
        self.job = sched.job
        self.batch = sched.batch
        self.pid = pid
        self.state = state
        self.outcome = Outcome()
        self.runner = GroupRunner(sched.job, state, self.outcome, sched.arrival, sched.partitions)
        self.global_reads = self.runner.global_reads
        self.tables = list(sched.job.tables)
        self.one_flat = self.tables[0] if len(self.tables) == 1 else None
        """The job's one table when it has one and it is flat (rows by key: see
        ``PartitionState.flat``, set by the runner's Tx), else None: the crossing
        path's rows then go as one row, bare (see :mod:`.messages`)."""
        if self.one_flat not in state.flat:
            self.one_flat = None
        self.record = sched.job.record_history
        self.mark = self.runner.tx._stride - 1
        """The plain commit mark of a transaction that ran through its home (see
        ``GroupRunner.record_remote``)."""
        self.pending = events
        self.ahead: deque[Event | None] = deque()
        """Events taken from :attr:`pending` by :meth:`lend_ahead`, not admitted yet
        (None where it lent one: that one entered already)."""
        self.ahead_values: set[Any] = set()
        """Values of the events in :attr:`ahead` that were not lent (or a superset)."""
        self.ahead_stop = False
        """Whether :attr:`ahead` ends with an event nothing may be lent past."""
        self.lends = sched.partitions >= base.LEND_FROM
        self.unheard = 0
        """(With copies announced) Partitions whose list of copies has not arrived yet:
        nothing is admitted before (see :meth:`announce`)."""
        self.own: list[Event] = []
        """(Until :attr:`unheard` is 0) the partition's own events."""
        self.copies: list[tuple[Any, ...]] = []
        """(Until :attr:`unheard` is 0) the copies announced to it so far."""
        self.copies_ran: tuple[float, int] | None = None
        """The largest (order value, input) of the copies announced to it (see tasks.release)."""
        self.stale: set[int] = set()
        """Places of copies among its own events (see :meth:`heard`)."""
        self.rows: dict[int, int] = {}
        """(While copies are announced) Per partition heard from, its keyed rows (see
        :func:`handed`)."""
        self.lists: dict[int, list[tuple[Any, ...]]] = {}
        """(Until every list came) The lists of partitions that may hand transactions here."""
        self.handed_in: dict[int, list[Event]] = {}
        """(Until :attr:`unheard` is 0) Per partition, the transactions it handed here."""
        self.admitted_all = False
        self.unfinished = 0
        self.locks: dict[Any, list[Any]] = {}
        """Per value here, the transactions that wait for it (:class:`_Item`), the one
        holding it first (there, also a :data:`_Light`)."""
        self.inflight = 0
        """Items in the lock queues, not finished (a barrier waits for none)."""
        self.blocked = 0
        """Items in the lock queues behind another item on one of their values."""
        self.barrier: _Item | None = None
        self.behind: deque[_Item] = deque()
        """Items admitted while a barrier is unfinished: they enter after it."""
        self.epoch = 0
        """Global reads admitted past so far (see :meth:`_read_past`)."""
        self.readings: deque[_Item] = deque()
        """Global reads admitted past, oldest first: their totals wait for the items before them."""
        self.earlier: list[int] = []
        """Per read of :attr:`readings`, the items admitted before it not finished yet."""
        self.side = MAIN
        """Where the changes and history of what runs now go: :data:`MAIN`, or the
        epoch of the last read before it (while that one waits)."""
        self.main: dict[str, Any] = {}
        """While reads wait, per table one of them reads: the partials the oldest takes."""
        self.segments: dict[int, dict[str, Any]] = {}
        """Per read waiting (by epoch): the partials of the changes after it and
        before the next one (a table read only by later reads has none: its
        changes go to :attr:`main`, which those reads take)."""
        self.logs: dict[int, tuple[list[Any], list[Any]]] = {}
        """The history and plain marks' orders of each side but the one running now."""
        self.ready: deque[_Item] = deque()
        self.waiting: dict[int, _Item | _Light] = {}
        self.early: dict[int, list[tuple[int, tuple[Any, ...]]]] = {}
        """Messages that arrived before their transaction was first in line here (with
        their source partition)."""
        self.out: dict[int, list[tuple[Any, ...]]] = {}
        """Messages to send, per destination partition (laid out as :mod:`.messages`
        says)."""

    # -- execution ------------------------------------------------------------------
    def drain(self) -> None:
        """Run or start every transaction that is first in line."""
        ready = self.ready
        while ready:
            item = ready.popleft()
            if self.readings:
                self._side(item.epoch)
            self._start(item)

    def send(self, dest: int, message: tuple[Any, ...]) -> None:
        """Queue a message for partition ``dest`` (the scheduler sends it this round)."""
        box = self.out.get(dest)
        if box is None:
            self.out[dest] = [message]
        else:
            box.append(message)

    def _start(self, item: _Item) -> None:
        kind = item.kind
        if kind is LOCAL:
            self.runner.run_event(item.event, self.batch, self.sched.abort)
            self.finish(item)
            return
        if kind is FRAGMENT:
            group = Group(event_gid(self.batch, item.event), [item.event])
            self.runner.run(group, self.sched.abort)
            self.finish(item)
            return
        mid = item.event.order[2]
        if kind is PART:
            if item.barrier:
                # A global read's part: its reads are its totals, taken now.  The read
                # writes nothing and emits only at its home, so nothing comes back: the
                # partition goes on at once instead of pausing until the home ran it.
                self.send(item.home, (mid, self._totals(item)))
                self.finish(item)
                return
            self.waiting[mid] = item
            copy = item.home in self.sched.hosted  # (see up_rows)
            self.send(item.home, up_rows(self.state, self.tables, mid, item.values, copy))
            if self.early:  # (a back cannot come before the up: a confused peer)
                for src, message in self.early.pop(mid, ()):
                    self.receive(src, message)
            return
        ups = item.ups
        assert ups is not None
        if item.barrier:
            # A global read at partition 0: its reads here are this partition's totals at
            # its place, taken now as its parts take theirs.  It writes nothing and its
            # function sees totals only, so the partition goes on at once, and the
            # function runs when every part's totals are here.
            item.totals = self._totals(item)
            self._unbar(item)
        if self.early:
            for src, message in self.early.pop(mid, ()):
                ups[src] = message
        if len(ups) == len(item.parts):
            self._execute(item)
        else:
            self.waiting[mid] = item

    def receive(self, src: int, message: tuple[Any, ...]) -> None:
        """A message from partition ``src``; :meth:`drain` runs what it freed."""
        mid = message[0]
        if mid is None:  # (a partition's copies, or those it hands here: see announce)
            if message[1] is None:
                self.handed_here(src, message[2])
            else:
                self.heard(src, message[1], message[2])
            return
        back = mid < 0  # (a home's answer names its transaction ~mid: see .messages)
        if back:
            mid = ~mid
        item = self.waiting.get(mid)
        if item is None:
            self.early.setdefault(mid, []).append((src, message))
            return
        if isinstance(item, tuple):
            item = self.waiting[mid] = self._heavy(item, not back)
        if self.readings:
            self._side(item.epoch)
        if not back:
            ups = item.ups
            if ups is None and item.kind is HOME:  # (a home made by _host: see there)
                ups = item.ups = {}
            assert ups is not None
            ups[src] = message
            if len(ups) == len(item.parts):
                del self.waiting[mid]
                if item.barrier:
                    self._execute_global(item)
                else:
                    run_at_home(self, item)
        else:
            del self.waiting[mid]
            take_back(self, item, message)

    def receive_all(self, src: int, box: list[tuple[Any, ...]]) -> None:
        """:meth:`receive` of each of ``src``'s messages, their common cases inline.

        A home's answer, or a lone participant's rows for a home that waits for
        them, goes straight to :func:`take_back` or :func:`run_at_home`: no call
        per message of its own, nor the ``ups`` dict.
        """
        waiting = self.waiting
        for message in box:
            mid = message[0]
            if self.readings or mid is None:  # (None: a partition's copies, see announce)
                self.receive(src, message)
            elif mid < 0:
                item = waiting.pop(~mid, None)
                if item is None:
                    self.early.setdefault(~mid, []).append((src, message))
                else:
                    take_back(self, item, message)
            else:
                item = waiting.get(mid)
                if item is not None and (
                    isinstance(item, tuple) or (len(item.parts) == 1 and not item.barrier)
                ):
                    del waiting[mid]
                    run_at_home(self, item, src, message)
                else:
                    self.receive(src, message)

    def _execute(self, item: _Item) -> None:
        """At the home: run the transaction over its own and the forwarded rows; answer."""
        if item.barrier:
            self._execute_global(item)
        else:
            run_at_home(self, item)

    def finish(self, item: _Item) -> None:
        """``item`` is done here: the next in line on its values may run."""
        self.unfinished -= 1
        if item.queued:
            locks, ready = self.locks, self.ready
            for v in item.values:
                queue = locks[v]
                if len(queue) == 1:
                    del locks[v]
                    continue
                del queue[0]  # (short lists: cheaper to make than deques)
                nxt = queue[0]
                nxt.need -= 1
                if nxt.need == 0:
                    ready.append(nxt)
                    self.blocked -= 1
            self.inflight -= 1
            if self.readings:
                self._finished_before(item.epoch)
            barrier = self.barrier
            if self.inflight == 0 and barrier is not None and barrier is not item:
                ready.append(barrier)
        if item.barrier and self.barrier is item:
            self._unbar(item)

    def _unbar(self, item: _Item) -> None:
        """Barrier ``item`` is done here: the items admitted behind it enter."""
        if self.barrier is item:
            self.barrier = None
        behind = self.behind
        while behind and self.barrier is None:
            self.unfinished -= 1  # (_enter counts it again)
            self._enter(behind.popleft())

    def done(self) -> bool:
        """Whether every transaction of the batch finished here."""
        return self.admitted_all and self.unfinished == 0
