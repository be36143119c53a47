"""Multi-partition transactions in phase 1, in parallel: rows forwarded to a home partition.

Calvin (Thomson et al., SIGMOD 2012) fixes the order of a batch's transactions
before executing them; every partition then executes its part of a
multi-partition transaction at the transaction's place in its own order and
forwards its local reads to the other participants: no locks across
partitions, no two-phase commit, no aborts for conflicts.  Here the order is the
declared one, fixed before the batch runs, and one participant executes the
transaction, its *home*: the partition of its first partition value (partition
0 for a global read).  Every other participant, when the transaction is first
in line for all of its values there, forwards those values' rows (an ``up``
message); the home runs the function once over its own rows and the forwarded
ones and sends each participant back what changed of its values (``back``),
with the operations on them when the history is recorded.  A transaction that
raises is rolled back at its home, the only place it ran.

Per partition a deterministic lock manager in the declared order (Calvin's):
each transaction waits in the queue of each of its values on this partition
and runs when it is first in all of them.  A transaction waiting for a message
holds only its own values, so the partition runs later transactions on other
values meanwhile and idles only when nothing of its own is ready.  Per value,
transactions therefore run in the declared order, and since a transaction
touches only rows of its declared values, the history is conflict-serializable
in arrival order.  A keyless fragment touches every row of the partition: it
waits until everything before it on the partition finished, and everything
after it waits for it (a barrier of that partition only).  A global read's
part reads every row but is no barrier (:meth:`_Partition._read_past`).

A global read (an input declared with ``global_reads``): every partition, at
the read's place, takes its partial totals (its reads) and forwards them to
partition 0, which runs the function over them.  The read writes no rows,
sees nothing but the totals and emits at partition 0 only, so every
partition, partition 0 included, goes on at once once it took its totals;
partition 0 runs the function when the others' totals are there.

How a participant learns of a crossing transaction: on Spark, each transaction's
row reaches its home partition only; at the start of phase 1 every partition
sends every other one its *copies*, the list of (order, input, values,
partitions) of the crossing transactions it homes that touch the other's values
(:meth:`_Partition.announce`), and a partition admits nothing before it heard
from every other one, then merges the copies into its order.  (Until session 23
Spark exploded each crossing transaction's whole row to every participant: the
copy rows went through the shuffle and were converted and made into events like
any other.)  With the lists go the partitions' counts of rows, from which each
pair of partitions moves some crossing transactions to the one with fewer
(:func:`handed`, :meth:`_Partition._hand_over`): their home is then the other
participant.  A caller that hands every partition its copies itself (the tests)
runs without the lists.

Messages go out once per admission round (:data:`ADMIT_CHUNK` transactions
per partition, :data:`ADMIT_CHUNK_WAITING` while a partition is hurried: a
transaction waits for a message with others behind it, see
:meth:`_Partition.hurried`), one list per pair of partitions, not one message
per transaction.  From :data:`LEND_FROM` partitions on, a participant also sends
a crossing transaction's rows ahead of its admission when nothing earlier not yet
admitted there touches its values (:meth:`_Partition.lend_ahead`).

This runs for the per-event boundary, whose transactions have the same id on
every partition; a boundary that groups events cuts each partition's events on
its own, so its multi-partition transactions are deferred (phases 2 and 3).

Ownership: a :class:`ForwardScheduler` runs on its task's thread, owns the
partitions it hosts for the batch (exclusive access, not preempted), and is the
only user of its transport.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import repeat
from operator import attrgetter
from typing import Any

from txstream.spark.runtime.base import JobSpec, Row
from txstream.spark.runtime.boundaries import Event, Group, event_gid
from txstream.spark.runtime.errors import ExchangeError as ExchangeError  # (re-exported)
from txstream.spark.runtime.executor import GroupRunner, Outcome, table_item
from txstream.spark.runtime.forward_messages import _NONE, run_at_home, take_back, up_rows
from txstream.spark.runtime.state import PartitionState
from txstream.spark.runtime.totals import add_totals, keep, not_a_number, partial_totals
from txstream.spark.runtime.transport import Message
from txstream.spark.runtime.transport import SocketTransport as SocketTransport  # (re-exported)
from txstream.spark.runtime.transport import new_exchange as new_exchange  # (re-exported)

EXCHANGE_TIMEOUT_S = 600.0
"""How long a partition waits for a message from another task before giving up (the
transport has its own, :data:`.transport.EXCHANGE_TIMEOUT_S`, for its connections)."""

ADMIT_CHUNK = 128
"""Transactions admitted per partition between looks at the messages that arrived (and
sending what is queued), while none of the partition's transactions waits for a
message: each round costs a few system calls."""
ADMIT_CHUNK_WAITING = 32
"""The same while the task is *hurried*: one of its transactions waits for a
message while others wait behind it (see :meth:`_Partition.hurried`), or a
hurried partition of another task said so in its last messages.  A crossing transaction's round trip
takes about two rounds (its rows out, the answer back), and a hot value's
crossing transactions follow each other one round trip apart: with rounds of
128, Zipf-skewed transfers on ``local[2]`` ran at a median of 20,295 txn/s
against 28,492 with rounds of 32 (four alternated runs each; docs/benchmarks.md).
Without a hot value nothing waits for a round trip but the transaction itself,
and each round costs a frame out and in: on two tasks at uniform transfers in
rounds of 32, the sends and polls took about 1.6 us of each task's ~11 us of
CPU per event, the pickling 0.85 more (scripts/runtime-mp-tasks.py), so rounds
stay long."""
HURRY_BLOCKED = 16
"""Transactions waiting behind others on a value that make a partition hurried
while one of its transactions waits for a message, if they are also an eighth
of its transactions in flight.  Not any: at uniform transfers over 100,000
accounts hundreds of crossing transactions are in flight (thousands when the
other task is descheduled on a loaded host) and some value is nearly always
taken twice (in 25-95% of the rounds on two tasks), a share that stays small;
a hot value's queue grows past both within a few rounds."""
HURRY_ROUNDS = 4
"""Rounds a task stays hurried after a message from a hurried task."""
SILENT_ROUNDS = 8
"""Rounds in a row without a message from another task after which a task's own
hurry no longer shortens its rounds (until a message comes).  Short rounds speed
a hot value's round trips only while the peer answers; a silent peer is not
running (on a loaded host, or where Spark's JVM and driver share the task's
cores), and meanwhile each short round is a frame and a poll more for nothing:
on ``local[2]`` with the host loaded a task whose peer was descheduled ran
1,009-1,252 rounds and 1,229-1,570 frames per batch instead of about 300
(docs/benchmarks-history.md, session 22)."""

READS_PAST = 16
"""Global reads a partition admits past at a time (see :meth:`_Partition._read_past`).

With one, a partition of 32 that meets an audit every 53 of its transactions
(an audit every 1,000 events) met the next one while the last one still
waited, and that one stopped admission: about half the reads were barriers
(``txstream.bench.schedule``: a serial share of 77% at P = 32).  Sixteen is
about what an admission round can hold at that rate; each read waiting
costs a copy of the partials of the tables read and a pass over the reads
waiting per finished transaction."""

LEND_AHEAD = 128
"""How far past its admission point a participant looks for crossing transactions
whose rows it may send early (see :meth:`_Partition.lend_ahead`).

A partition reaches a crossing transaction it only takes part in when its own
admission gets there, so the home may wait while the participant is busy with
its own work: at P = 32, uniform transfers over 100,000 accounts, that made the
serial share 5.7% (``txstream.bench.schedule``).  Looking 128 further ahead
brings it to 4.0%; further ahead it rises again (256: 4.7%), since each value
lent early stays held until its home, which may be far behind, answers."""

LEND_FROM = 8
"""Partitions from which participants lend ahead.  At P = 2 the serial share is
0.1% without it, and the look-ahead costs every event a second look."""


def handed(mine: int, theirs: int, partitions: int, candidates: int) -> list[int]:
    """Which of a partition's crossing transactions another participant runs instead.

    A transaction runs at the partition of its first key, so a partition with
    more of the batch's rows than another runs more transactions, and at P = 32
    the busiest of a 36,000-event batch had 1,195 where the mean was 1,125: the
    others reached the batch's end first and idle-waited for its last
    transactions (a serial share of 5.9% with lending ahead,
    ``txstream.bench.schedule``).  So per pair of partitions, the one with
    ``mine`` rows hands the one with ``theirs`` rows ``(mine - theirs) //
    partitions`` of its ``candidates`` (its transactions whose values live on
    the two only, in the declared order), spread evenly over them: summed over
    every peer that moves each partition's count to about the mean, and each
    pair decides from the two counts alone.  Returns the candidates' places.
    """
    k = min(candidates, max(0, mine - theirs) // partitions)
    return [(2 * j + 1) * candidates // (2 * k) for j in range(k)]


MAIN = -1
"""The changes and history of what runs before every read admitted past."""

LOCAL, FRAGMENT, HOME, PART = "local", "fragment", "home", "part"
"""The kinds of :class:`_Item` (compared by identity)."""

_Light = tuple[Event, Any, int, int]
"""A crossing transaction's part on a partition where its one value was free when it
entered and it has one other participant: (event, the value, the other participant,
epoch), made by :meth:`_Partition._host` and :meth:`_Partition._lend` instead of an
:class:`_Item` (which costs about 2,900 machine instructions to make against 350 for
the tuple, and two were made per crossing transaction).  It waits in ``waiting`` and
heads its value's queue like an item; where the general code needs one (a message
that :meth:`_Partition.receive` takes, a finish with others behind it or a read
waiting) :meth:`_Partition._heavy` makes it."""


def forwarding(job: JobSpec) -> bool:
    """Whether ``job``'s multi-partition transactions run forwarded in phase 1.

    With ``crossPartition="forward"`` (the default) and the per-event boundary;
    otherwise they are deferred to phases 2 and 3 (see the module docstring).
    """
    boundary = job.boundary
    return job.cross_partition == "forward" and not getattr(boundary, "may_span", True)


class _Item:
    """One transaction's part on one partition, from admission until it finished.

    A plain class with slots, made with positional arguments: two are made per
    crossing transaction, and a dataclass's keyword defaults cost twice as much.
    """

    __slots__ = (
        "barrier",
        "epoch",
        "event",
        "home",
        "kind",
        "need",
        "parts",
        "queued",
        "totals",
        "ups",
        "values",
    )

    def __init__(
        self,
        event: Event,
        kind: str,
        values: list[Any],
        home: int = -1,
        parts: tuple[int, ...] = (),
        ups: dict[int, Any] | None = None,
        barrier: bool = False,
    ) -> None:
        self.event = event
        self.kind = kind
        """:data:`LOCAL`, :data:`FRAGMENT` (a keyless event's part), :data:`HOME`, :data:`PART`."""
        self.values = values
        """Its partition values on this partition (distinct)."""
        self.home = home
        self.parts = parts
        """At the home: the other participants."""
        self.ups = ups
        """At the home: each participant's ``up`` message (its rows, or its totals)."""
        self.barrier = barrier
        self.need = 0
        """Queues of its values in which it is not first yet."""
        self.epoch = 0
        """The partition's global reads admitted before it (see :meth:`_Partition._read_past`)."""
        self.queued = False
        self.totals: Any = None
        """At a global read's home: its own partial totals, taken at its place."""


class _Partition:
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
        path's rows then go as one row, bare (see :mod:`.forward_messages`)."""
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
        self.lends = sched.partitions >= LEND_FROM
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
        """Messages to send, per destination partition (laid out as :mod:`.forward_messages`
        says)."""

    # -- admission ------------------------------------------------------------------
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
        while len(ahead) < LEND_AHEAD:
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

        Both partitions of a pair pick the same transactions (:func:`handed`, from
        the two counts and the candidates in the declared order): here, its own
        events of two values whose other one lives on the peer; there, the same
        from this partition's list.  A handed transaction's values and partitions
        swap places, so its home (the first) is the peer's; the row goes with it.
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

    def hurried(self) -> bool:
        """Whether a transaction here waits for a message while others wait for it.

        Behind it on a value (a hot value), or behind it as a barrier does (a
        keyless fragment, a global read's part): then round trips matter (see
        :data:`ADMIT_CHUNK_WAITING`).
        """
        if not self.waiting:
            return False
        blocked = self.blocked
        if blocked >= HURRY_BLOCKED and 8 * blocked >= self.inflight:
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

    def _totals(self, item: _Item) -> Any:
        """A global read's reads on this partition: its partial totals, read now."""
        reads = self.global_reads[item.event.input]
        if self.record:  # (the reads happen now; dropped if it aborts)
            self._record_global_read(item.event, event_gid(self.batch, item.event))
        state = self.state
        try:
            return partial_totals(state.data, reads, state.tracked, state.flat)
        except TypeError:
            # A value that is not a number: the read fails in its transaction at
            # partition 0, as where every row is read at once (raised here, outside
            # any transaction, it ended the whole run with a traceback).
            return {what: not_a_number(state, what) for what in reads}

    def receive(self, src: int, message: tuple[Any, ...]) -> None:
        """A message from partition ``src``; :meth:`drain` runs what it freed."""
        mid = message[0]
        if mid is None:  # (a partition's copies, or those it hands here: see announce)
            if message[1] is None:
                self.handed_here(src, message[2])
            else:
                self.heard(src, message[1], message[2])
            return
        back = mid < 0  # (a home's answer names its transaction ~mid: see .forward_messages)
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

    def _execute_global(self, item: _Item) -> None:
        """At partition 0: a global read over this partition's totals and everyone's."""
        event, runner = item.event, self.runner
        ups = item.ups
        assert ups is not None
        aggregates = item.totals  # (taken at its place: see _start)
        for message in ups.values():
            add_totals(aggregates, message[1])
        runner.aggregates = aggregates
        try:
            runner.run(Group(event_gid(self.batch, event), [event]), self.sched.abort)
        finally:
            runner.aggregates = None
        self.outcome.forwarded += 1
        # (its parts finished when they sent their totals: nothing goes back)
        self.finish(item)

    def _record_global_read(self, event: Event, gid: str) -> None:
        """A committed global read's reads here: one operation per table (see table_item)."""
        tables = dict.fromkeys(table for table, _ in self.global_reads[event.input])
        self.outcome.history.extend(f"r{gid}({table_item(table)})" for table in tables)

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

    # -- a global read admitted past -------------------------------------------------
    def _read_past(self, item: _Item) -> bool:
        """Admit past global read ``item`` while the items before it run; whether it can.

        Its reads are totals, so nothing after it needs to wait for it: what runs
        after it keeps its changes to the partials the read takes apart (and its
        history apart: recorded after the read), until the items before it
        finished; then the read takes the partials (:meth:`_read_now`) and the
        changes after it are added in.  Per value the queues keep the declared
        order, so the items after it that ran meanwhile touched values none before
        it was still to touch: the history, the read recorded between the two,
        is the one of an execution in the declared order.  Up to
        :data:`READS_PAST` reads wait at a time, each with the changes between it
        and the next apart; they read in their order.
        """
        if len(self.readings) >= READS_PAST or self.barrier is not None:
            return False
        state = self.state
        reads = self.global_reads[item.event.input]
        if not keep(state.data, reads, state.tracked, state.flat):
            return False  # (a value that is not a number: it reads at its place)
        main, tracked = self.main, state.tracked
        for table in dict.fromkeys(table for table, _ in reads):
            if table not in main:  # (not split yet: tracked holds its main partials)
                main[table] = tracked[table]
        self.epoch += 1
        item.epoch = self.epoch
        self.segments[self.epoch] = {
            table: [(column, [0] * len(p)) for column, p in partials]
            for table, partials in main.items()
        }
        self.logs[self.epoch] = ([], [])
        self.readings.append(item)
        self.earlier.append(self.inflight)
        self._side(self.epoch)
        return True

    def _side(self, epoch: int) -> None:
        """Send changes of the partials and history where what runs at ``epoch`` belongs."""
        self._route(epoch if epoch >= self.readings[0].epoch else MAIN)

    def _route(self, side: int) -> None:
        if side == self.side:
            return
        outcome = self.outcome
        self.logs[self.side] = (outcome.history, outcome.orders)
        outcome.history, outcome.orders = self.logs.pop(side)
        self.side = side
        tracked, segment = self.state.tracked, self.segments.get(side)
        for table, partials in self.main.items():
            tracked[table] = partials if segment is None else segment.get(table, partials)

    def _finished_before(self, epoch: int) -> None:
        """An item of ``epoch`` finished: the reads after it wait for one item less."""
        earlier = self.earlier
        for i, read in enumerate(self.readings):
            if read.epoch > epoch:
                earlier[i] -= 1
        if earlier[0] == 0:
            self._read_now()

    def _read_now(self) -> None:
        """Every item before the oldest read finished: it reads; what ran after it comes in.

        The next read then waits only for what ran between the two (it may read at once).
        Only an item before the oldest read brings this about as it finishes, and
        such an item runs on :data:`MAIN`: what runs next is routed there too.
        """
        readings, earlier, outcome = self.readings, self.earlier, self.outcome
        while readings and earlier[0] == 0:
            item = readings.popleft()
            del earlier[0]
            self._route(MAIN)
            self._start(item)  # (its totals and history, at its place)
            main = self.main
            for table, after in self.segments.pop(item.epoch).items():
                for (_, partial), (_, more) in zip(main[table], after, strict=True):
                    for i, x in enumerate(more):
                        partial[i] += x
            history, orders = self.logs.pop(item.epoch)
            outcome.history.extend(history)
            outcome.orders.extend(orders)
        if not readings:
            self.main = {}

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


_NO_ROW: dict[str, Any] = {}
"""The row of every announced copy: a participant never reads it (only its home runs
the transaction); held copies have their rows copied and stored like any row."""
_order: Callable[[Event], tuple[float, int, int]] = attrgetter("order")


def _distinct(values: list[Any]) -> list[Any]:
    if len(values) < 2:
        return list(values)
    return list(dict.fromkeys(values))


class ForwardScheduler:
    """Runs the batch on the partitions one task hosts, exchanging messages with the rest.

    ``hosted``: partition -> (its state, begun for the batch; its events in the
    declared order, one transaction each: the per-event boundary).  ``transport``
    carries messages to partitions hosted by other tasks (``task_of`` says
    which); None when every partition is here.
    """

    def __init__(
        self,
        job: JobSpec,
        batch: int,
        partitions: int,
        hosted: Mapping[int, tuple[PartitionState, Iterable[Event]]],
        abort: Mapping[str, Mapping[str, Any]],
        arrival: Callable[[Row], float | None] | None = None,
        transport: SocketTransport | None = None,
        task_of: Callable[[int], int] | None = None,
        announce: bool = False,
    ) -> None:
        self.job = job
        self.batch = batch
        self.partitions = partitions
        self.abort = abort
        self.arrival = arrival
        self.transport = transport
        self.task_of = task_of
        self.hosted = {
            pid: _Partition(self, pid, state, iter(() if announce else events))
            for pid, (state, events) in sorted(hosted.items())
        }
        self.announced = (
            {pid: list(events) for pid, (_, events) in hosted.items()} if announce else None
        )
        """(``announce``) Each hosted partition's own events, without the copies of
        transactions homed elsewhere: their homes announce them (see
        :meth:`_Partition.announce`); every partition must be hosted by some task."""
        self.mailbox: deque[Message] = deque()
        self.hurry = False
        """Whether rounds are short and answers go out at once (see :data:`ADMIT_CHUNK_WAITING`)."""
        self.hurried_by_peer = 0
        """Rounds left that another task's hurry keeps this one hurried."""
        self.silent = 0
        """Polls in a row that brought no message from another task (see :data:`SILENT_ROUNDS`)."""
        self.rounds = 0
        """Admission rounds run (a measure: see scripts/runtime-mp-tasks.py)."""
        self.waits = 0
        """Times the task blocked for another task's message with nothing to run."""
        self.waited = 0.0
        """Seconds it spent so (wall time)."""

    def _names(self, mids: Iterable[int]) -> list[str]:
        """The ids of the transactions of these events (for an error: the first three)."""
        return [f"b{self.batch}_{mid}" for mid in sorted(mids)[:3]]

    def run(self) -> dict[int, Outcome]:
        """Run every hosted partition's transactions to the end; their outcomes."""
        parts = list(self.hosted.values())
        if self.announced is not None:
            for part in parts:
                part.announce(self.announced.pop(part.pid))
        deadline = time.monotonic() + EXCHANGE_TIMEOUT_S
        waited = 0.0
        while not all(p.done() for p in parts):
            admitted = False
            hurry = self.hurried_by_peer > 0
            if hurry:
                self.hurried_by_peer -= 1
            if self.silent < SILENT_ROUNDS:
                for part in parts:
                    if part.hurried():
                        hurry = True
            self.hurry = hurry
            for part in parts:
                if part.admitting():
                    part.admit(ADMIT_CHUNK_WAITING if hurry and part.waiting else ADMIT_CHUNK)
                    if part.lends:
                        part.lend_ahead()
                    part.drain()
                    admitted = True
            if admitted:
                self.rounds += 1
                self._pump(block=False)
                continue
            # Nothing to admit here: wait for what the other tasks send.
            began = time.monotonic()
            got = self._pump(block=True)
            now = time.monotonic()
            waited += now - began
            self.waits += 1
            if got:
                deadline = now + EXCHANGE_TIMEOUT_S
            elif now > deadline:
                waiting = self._names(m for p in parts for m in p.waiting)
                raise ExchangeError(
                    f"no message from the other tasks in {EXCHANGE_TIMEOUT_S:.0f} s; "
                    f"waiting for transactions {waiting}"
                )
        for part in parts:
            if part.early:
                raise ExchangeError(
                    f"partition {part.pid} got messages for transactions it never ran: "
                    f"{self._names(part.early)} (the partitions disagree on the batch)"
                )
        first = parts[0].outcome if parts else None
        if first is not None:
            # The time the task spent waiting for other tasks with nothing to admit.
            first.wait_ms += round(waited * 1000)
        self.waited = waited
        if self.transport is not None:
            self._collect()  # (the last answers to other tasks)
            self.transport.flush(wait=True)
            if first is not None:
                first.message_bytes += self.transport.bytes_sent
        return {pid: p.outcome for pid, p in self.hosted.items()}

    def _collect(self) -> None:
        """Hand over what the hosted partitions sent: here to the mailbox, else to the transport."""
        hosted, mailbox = self.hosted, self.mailbox
        for src, part in hosted.items():
            if not part.out:
                continue
            out, part.out = part.out, {}
            # A hurried partition says so to the other tasks (its source as ~src):
            # they answer at once and keep their rounds short for a while.
            sender = ~src if part.hurried() else src
            for dest, box in out.items():
                part.outcome.messages += len(box)
                if dest in hosted:
                    mailbox.append((dest, src, box))
                elif self.transport is None or self.task_of is None:
                    raise ExchangeError(
                        f"partition {dest} is not hosted here and there is no transport"
                    )
                else:
                    self.transport.send(self.task_of(dest), (dest, sender, box))

    def _deliver(self, messages: Iterable[Message]) -> bool:
        """Give each partition its messages, then run what they freed; whether there were any."""
        got = False
        hosted = self.hosted
        touched = set()
        for dest, src, box in messages:
            if src < 0:  # (from a hurried partition: see _collect)
                src = ~src
                self.hurried_by_peer = HURRY_ROUNDS
                self.hurry = True
            hosted[dest].receive_all(src, box)
            touched.add(dest)
            got = True
        for dest in touched:
            hosted[dest].drain()
        return got

    def _pump(self, block: bool) -> bool:
        """Send what is queued; deliver what arrived (``block``: wait for something).

        Returns whether anything arrived.
        """
        got = False
        self._collect()
        mailbox = self.mailbox
        while mailbox:
            messages = list(mailbox)
            mailbox.clear()
            got = self._deliver(messages) or got
            self._collect()  # (the answers, to partitions here: delivered in this loop)
        if self.transport is None:
            if block and not got:
                raise ExchangeError(
                    "the batch's partitions wait for each other with nothing in flight "
                    "(a transaction's participants disagree on it)"
                )
            return got
        self.transport.flush()
        arrived = self.transport.poll(0.0 if (got or not block) else 0.05)
        self.silent = 0 if arrived else self.silent + 1
        if not self._deliver(arrived):
            return got
        if self.hurry or block:
            # The answers to what arrived go out now, not after the next round (which,
            # unhurried, is long: they then go with its messages, in one frame).
            self._collect()
            self.transport.flush()
        return True
