"""A partition's admission: its transactions into the lock queues, in the declared order.

Admission (:meth:`_Admission.admit`), lending ahead
(:meth:`_Admission.lend_ahead`), the fast paths of a crossing transaction with
one value here (:meth:`_Admission._host`, :meth:`_Admission._lend`), and
entering the queues (:meth:`_Admission._enter`).  Part of
:class:`~.partition._Partition` (see :mod:`.base` for the call order).
"""

from __future__ import annotations

from typing import Any

from txstream.spark.runtime.boundaries import Event
from txstream.spark.runtime.forward import base
from txstream.spark.runtime.forward.base import (
    FRAGMENT,
    HOME,
    LOCAL,
    PART,
    _Item,
    _Light,
    _Shared,
)
from txstream.spark.runtime.forward.messages import _NONE, run_at_home, up_rows


def _distinct(values: list[Any]) -> list[Any]:
    if len(values) < 2:
        return list(values)
    return list(dict.fromkeys(values))


class _Admission(_Shared):
    """Admission, lending ahead and entering the queues (a part of ``_Partition``)."""

    def admit(self, limit: int) -> None:
        """Admit up to ``limit`` more transactions, in the declared order.

        Admission stops at a barrier (a keyless fragment, a global read's part)
        until it finished: nothing after it could run before, and transactions
        admitted later run on the fast path instead of waiting in line as items.
        """
        run_event, abort, batch = self.runner.run_event, self.sched.abort, self.batch
        pid, pending = self.pid, self.pending
        locks, enter = self.locks, self._enter
        ahead = self.ahead
        if self.readings:
            self._side(self.epoch)  # (all it admits is after the last read)
        for _ in range(limit):
            if self.barrier is not None:
                return
            if ahead:
                e = ahead.popleft()
                if e is None:
                    continue  # (lent ahead: it entered then)
            else:
                e = next(pending, None)
                if e is None:
                    self.admitted_all = True
                    return
            values, pids = e.values, e.pids
            if values:
                mine = pids.count(pid)
                if mine == len(pids):
                    if e.copy:
                        # The common case: all its values live here.  It runs now unless
                        # an earlier transaction still holds one of them.
                        if not locks or locks.keys().isdisjoint(values):
                            run_event(e, batch, abort)
                        else:
                            enter(_Item(e, LOCAL, _distinct(values)))
                        continue
                else:  # (a global read has no keys: it is classified below)
                    if mine == 1:
                        # One value here (the common case): when nothing holds it, a
                        # participant sends its rows now and a home waits for theirs,
                        # without going through the queues.
                        v = values[pids.index(pid)]
                        if v not in locks:
                            if not e.copy:
                                self._lend(e, v)
                                continue
                            if len(pids) == 2:
                                self._host(e, v, pids[1])
                                continue
                    enter(self._crossing(e, values, pids, mine))
                    continue
            enter(self._classify(e))

    def lend_ahead(self) -> None:
        """Enter crossing transactions this partition takes part in ahead of admission.

        Up to :data:`LEND_AHEAD` events past the admission point, a transaction
        whose home is elsewhere and whose values here no earlier event not
        admitted yet touches enters now (its rows go to its home this round),
        instead of when admission reaches it: per value it is still behind every
        earlier transaction (those entered already) and ahead of every later one
        (they meet it in the queues).  Nothing is lent past a global read or a
        keyless fragment not admitted yet (what it reads or writes would then
        see the lent transaction's changes), nor while a barrier waits.
        """
        ahead = self.ahead
        if not ahead:
            self.ahead_values.clear()
            self.ahead_stop = False
        if self.ahead_stop or self.barrier is not None:
            return
        pid, pending, seen = self.pid, self.pending, self.ahead_values
        most = base.LEND_AHEAD
        while len(ahead) < most:
            e = next(pending, None)
            if e is None:
                self.ahead_stop = True
                return
            ahead.append(e)
            values, pids = e.values, e.pids
            if not values:  # (a global read, a keyless fragment: they have no keys)
                self.ahead_stop = True
                return
            if pids[0] == pid:
                seen.update(values)  # (values elsewhere too: a superset does no harm)
                continue
            mine = pids.count(pid)
            if mine == 1:
                here = [values[pids.index(pid)]]
            else:
                here = [v for v, p in zip(values, pids, strict=True) if p == pid]
            if seen.isdisjoint(here):
                ahead[-1] = None
                self._enter(self._crossing(e, values, pids, mine))
            else:
                seen.update(here)

    def _host(self, e: Event, v: Any, other: int) -> None:
        """:meth:`_enter` and :meth:`_start` of a home with one free value and one peer."""
        # (a _Light, no item; no ups dict: its participant's rows go to run_at_home as
        # they come, see receive_all; receive makes an item when they must wait)
        light = (e, v, other, self.epoch)
        self.locks[v] = [light]
        self.inflight += 1
        self.unfinished += 1
        mid = e.order[2]
        early = self.early.pop(mid, None) if self.early else None
        if early is None:
            self.waiting[mid] = light
        elif len(early) == 1:  # (its participant's rows came first)
            run_at_home(self, light, *early[0])
        else:  # (more messages than one participant sends: run_at_home's general case)
            item = self._heavy(light, True)
            item.ups = dict(early)
            run_at_home(self, item)

    def _lend(self, e: Event, v: Any) -> None:
        """:meth:`_enter` and :meth:`_start` of a participant whose one value is free."""
        home = e.pids[0]
        light = (e, v, home, self.epoch)  # (a _Light, no item)
        self.locks[v] = [light]
        self.inflight += 1
        self.unfinished += 1
        mid = e.order[2]
        self.waiting[mid] = light
        table = self.one_flat
        if table is not None:  # (up_rows of one flat row, inlined)
            row = self.state.data.get(table, _NONE).get(v)
            up = (mid, v, None, None) if row is None else (mid, v, table, row)
        else:
            up = up_rows(self.state, self.tables, mid, [v], home in self.sched.hosted)
        box = self.out.get(home)  # (send, inlined)
        if box is None:
            self.out[home] = [up]
        else:
            box.append(up)

    def _heavy(self, light: _Light, home: bool) -> _Item:
        """The :class:`_Item` of ``light`` (at its home or a participant) for the general code."""
        e, v, peer, epoch = light
        item = _Item(e, HOME, [v], self.pid, (peer,), {}) if home else _Item(e, PART, [v], peer)
        item.epoch = epoch
        item.queued = True  # (heading its value's queue: finish takes the head off)
        return item

    def hurried(self) -> bool:
        """Whether a transaction here waits for a message while others wait for it.

        Behind it on a value (a hot value), or behind it as a barrier does (a
        keyless fragment, a global read's part): then round trips matter (see
        :data:`ADMIT_CHUNK_WAITING`).
        """
        if not self.waiting:
            return False
        blocked = self.blocked
        if blocked >= base.HURRY_BLOCKED and 8 * blocked >= self.inflight:
            return True
        return self.barrier is not None

    def admitting(self) -> bool:
        """Whether :meth:`admit` would admit anything now."""
        return not self.admitted_all and self.barrier is None and not self.unheard

    def _crossing(self, e: Event, values: list[Any], pids: list[int], mine: int) -> _Item:
        """The item of a transaction with values here and elsewhere (``mine`` of them here)."""
        pid = self.pid
        if mine == 1:
            here = [values[pids.index(pid)]]
        else:
            here = _distinct([v for v, p in zip(values, pids, strict=True) if p == pid])
        home = pids[0]
        if home != pid:
            return _Item(e, PART, here, home)
        if len(pids) == 2 and pids[1] != pid:  # (the common case: one other participant)
            parts: tuple[int, ...] = (pids[1],)
        else:
            parts = tuple(sorted({p for p in pids if p != pid}))
        return _Item(e, HOME, here, pid, parts, {})

    def _classify(self, e: Event) -> _Item:
        pid = self.pid
        if e.input in self.global_reads:
            if pid == 0:
                parts = tuple(range(1, self.sched.partitions))
                return _Item(e, HOME, [], 0, parts, {}, True)
            return _Item(e, PART, [], 0, barrier=True)
        values, pids = e.values, e.pids
        if not values:
            return _Item(e, FRAGMENT, [], barrier=True)
        return self._crossing(e, values, pids, pids.count(pid))

    def _enter(self, item: _Item) -> None:
        self.unfinished += 1
        if self.barrier is not None:
            self.behind.append(item)
            return
        if item.barrier:
            if self.inflight and item.kind is not FRAGMENT and self._read_past(item):
                return
            self.barrier = item
            if self.inflight == 0:
                self.ready.append(item)
            return
        item.epoch = self.epoch
        need = 0
        locks = self.locks
        for v in item.values:
            queue = locks.get(v)
            if queue is None:
                locks[v] = [item]
            else:
                queue.append(item)
                need += 1
        item.need = need
        item.queued = True
        self.inflight += 1
        if need == 0:
            self.ready.append(item)
        else:
            self.blocked += 1
