"""How a partition learns of the crossing transactions homed elsewhere (Spark).

Each partition announces to every other one the copies of its crossing
transactions that touch the other's values (:meth:`_Announce.announce`),
with its count of rows; once every list came (:meth:`_Announce.heard`), each
pair of partitions hands some transactions to the one with fewer rows
(:func:`handed`, :meth:`_Announce._hand_over`), and the partition merges its
order (:meth:`_Announce._merge`).  Part of :class:`~.partition._Partition`.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import repeat
from operator import attrgetter
from typing import Any

from txstream.spark.runtime.boundaries import Event
from txstream.spark.runtime.errors import ExchangeError
from txstream.spark.runtime.forward.base import _Shared

_NO_ROW: dict[str, Any] = {}
"""The row of every announced copy: a participant never reads it (only its home runs
the transaction); held copies have their rows copied and stored like any row."""
_order: Callable[[Event], tuple[float, int, int]] = attrgetter("order")


def handed(mine: int, theirs: int, partitions: int, candidates: int) -> list[int]:
    """Which of a partition's crossing transactions another participant runs instead.

    A transaction runs at the partition of its first key, so a partition with
    more of the batch's rows than another runs more transactions, and at P = 32
    the busiest of a 36,000-event batch had 1,195 where the mean was 1,125: the
    others reached the batch's end first and idle-waited for its last
    transactions (a serial share of 5.9% with lending ahead,
    ``txstream.bench.schedule``).  So per pair of partitions, the one with
    ``mine`` rows hands the one with ``theirs`` rows ``(mine - theirs) //
    partitions`` of its ``candidates`` (its transactions of two values, one on
    each of the two, in the declared order), spread evenly over them: summed over
    every peer that moves each partition's count to about the mean, and each
    pair decides from the two counts alone.  Returns the candidates' places.
    """
    k = min(candidates, max(0, mine - theirs) // partitions)
    return [(2 * j + 1) * candidates // (2 * k) for j in range(k)]


class _Announce(_Shared):
    """Announcing copies, handing transactions over, merging the order (of ``_Partition``)."""

    def announce(self, events: list[Event]) -> None:
        """Send every other partition the copies of the crossing transactions homed here.

        ``events``: the partition's own, in any order (its rows as Spark routed
        them: each transaction's at its home only).  Each other partition gets
        one list, empty or not, with the number of keyed rows here: it admits
        nothing before it has every list (:meth:`heard`), since a copy may come
        before any of its own events.  A copy is what the participant's
        admission reads of the transaction: its order, input, values and their
        partitions, as an :class:`Event` with an empty row and ``copy`` False,
        made at the participant.  (A global read has no keys: it reaches every
        partition and is no one's copy.)
        """
        pid, partitions = self.pid, self.sched.partitions
        lists: dict[int, list[tuple[Any, ...]]] = {q: [] for q in range(partitions) if q != pid}
        stale: set[int] = set()
        rows = 0
        # One list [pid, q] per other partition for the partitions of every two-value
        # copy it gets: pickled once per frame, unpickled as one list (pids are never
        # changed).  Micro (7,000 copies in one frame): 0.39 + 0.75 -> 0.27-0.34 + 0.57 us
        # per copy to pickle and unpickle, 43 -> 37 bytes.
        pairs = {q: [pid, q] for q in lists}
        for e in events:
            pids = e.pids
            if len(pids) < 2:
                if e.copy and e.values:
                    rows += 1
                continue
            if not e.copy:  # (a copy held by a batch of an earlier version: see heard)
                stale.add(e.order[2])
                continue
            rows += 1
            if len(pids) == 2:  # (the common case: two values)
                q = pids[1]
                if q != pid:
                    if pids[0] == pid:  # (always: a copy is at its home, pids[0])
                        pids = pairs[q]
                    lists[q].append((e.order, e.input, _NO_ROW, e.values, pids, False))
                continue
            entry = (e.order, e.input, _NO_ROW, e.values, pids, False)
            for q in dict.fromkeys(pids):
                if q != pid:
                    lists[q].append(entry)
        self.own = events
        self.unheard = partitions - 1
        self.stale = stale
        self.rows = {pid: rows}
        for q, entries in lists.items():
            self.send(q, (None, entries, rows))
        if not self.unheard:
            self._merge()

    def heard(self, src: int, entries: list[tuple[Any, ...]], rows: int) -> None:
        """Partition ``src``'s copies and count of rows arrived; with the last, hand over.

        Then (:meth:`_hand_over`) each pair of partitions moves some crossing
        transactions from the one with more rows to the other (:func:`handed`),
        and the order is complete once the rows of those handed here came.
        """
        if src in self.rows or self.unheard <= 0:
            raise ExchangeError(f"partition {self.pid} got copies twice (from {src})")
        self.rows[src] = rows
        if rows - self.rows[self.pid] >= self.sched.partitions:  # (see handed)
            self.lists[src] = entries  # (it may hand some of them here)
        self.copies.extend(entries)
        self.unheard -= 1
        if not self.unheard:
            self._hand_over()

    def _hand_over(self) -> None:
        """Every list came: send the rows of those handed away; await those handed here.

        The partition with more rows picks (:func:`handed`, from the two counts
        and its own events of two values whose other one lives on the peer, in
        the declared order) and sends them; the peer works out from the same
        counts only that a list is owed, and runs what it holds.  A handed
        transaction's values and partitions swap places, so its home (the first)
        is the peer's; the row goes with it.
        """
        pid, rows, partitions = self.pid, self.rows, self.sched.partitions
        mine = rows[pid]
        ours: dict[int, list[Event]] = {}
        for q, theirs in rows.items():
            if mine - theirs >= partitions:
                ours[q] = []
        if ours:
            for e in self.own:
                pids = e.pids
                if len(pids) == 2 and e.copy and pids[0] == pid and pids[1] in ours:
                    ours[pids[1]].append(e)
            away: dict[int, Event] = {}
            for q, candidates in ours.items():
                candidates.sort(key=_order)
                picked = [candidates[j] for j in handed(mine, rows[q], partitions, len(candidates))]
                if picked:
                    swapped = [
                        Event(e.order, e.input, e.row, e.values[::-1], e.pids[::-1], True)
                        for e in picked
                    ]
                    self.send(q, (None, None, swapped))
                    for e in swapped:
                        away[e.order[2]] = Event(e.order, e.input, _NO_ROW, e.values, e.pids, False)
            if away:
                self.own = [away.get(e.order[2], e) if e.copy else e for e in self.own]
        owed = 0
        for src, entries in self.lists.items():
            offered = sum(1 for c in entries if len(c[4]) == 2 and c[4][0] == src)
            if handed(rows[src], mine, partitions, offered):
                owed += 1
        self.lists = {}
        self.unheard = owed - len(self.handed_in)
        if not self.unheard:
            self._merge()

    def handed_here(self, src: int, events: list[Event]) -> None:
        """Partition ``src`` handed these transactions here (their rows, this one first)."""
        if src in self.handed_in:
            raise ExchangeError(f"partition {self.pid} got handed rows twice (from {src})")
        self.handed_in[src] = events
        if len(self.rows) == self.sched.partitions:  # (every list came: they were owed)
            self.unheard -= 1
            if not self.unheard:
                self._merge()

    def _merge(self) -> None:
        """The partition's order: its own events and the copies announced to it."""
        copies = list(map(tuple.__new__, repeat(Event), self.copies))
        own = self.own
        if self.handed_in:
            got = {e.order[2]: e for events in self.handed_in.values() for e in events}
            copies = [got.get(c.order[2], c) for c in copies]
            if self.stale:  # (an old copy of one handed here goes: the handed one replaces it)
                own = [e for e in own if e.copy or e.order[2] not in got]
            self.handed_in = {}
        if self.stale:  # (held before copies were announced: they came both ways)
            copies = [c for c in copies if c.copy or c.order[2] not in self.stale]
        if copies:  # (the largest order's first two: the largest (order value, input))
            self.copies_ran = max(map(_order, copies))[:2]
        events = own + copies
        events.sort(key=_order)  # (sorted runs, merged)
        self.own, self.copies, self.pending = [], [], iter(events)
