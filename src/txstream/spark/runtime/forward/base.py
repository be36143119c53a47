"""The contract of forwarded phase 1: its constants, its items, its call order.

Call order, per batch, on the task's thread (:meth:`.scheduler.ForwardScheduler.run`)::

    part.announce(own events)       each hosted partition once, first, when the
                                    copies are announced (Spark); the lists that
                                    arrive go to part.heard / part.handed_here
    until every part.done():
        part.admit(limit)           only while part.admitting(); limit is
                                    ADMIT_CHUNK, or ADMIT_CHUNK_WAITING when hurried
        part.lend_ahead()           after admit, only if part.lends (P >= LEND_FROM)
        part.drain()                runs or starts what is first in line
        scheduler._pump()           sends part.out; part.receive_all(src, box) for
                                    what arrived, then part.drain()

and inside a partition: ``_enter`` (or ``_host`` / ``_lend`` on the fast path)
puts a transaction in its values' queues; ``_start`` runs it, or sends its
``up`` and waits for the ``back``; ``finish`` takes it off the queues, once.

Invariants:

* nothing is admitted before every other partition's list of copies came
  (``unheard`` is 0), since a copy may sort before any of the partition's own;
* per value, transactions run in the declared order: each waits in the queue
  of each of its values here (``locks``) and runs when first in all of them;
  lending ahead enters one early only when no earlier event not admitted yet
  touches its values here, and never past a global read or keyless fragment;
* a barrier (a keyless fragment, a global read's part not admitted past) runs
  when everything entered before it finished, and what is admitted meanwhile
  enters after it (``behind``, ``_unbar``); admission stops at it;
* a participant holds its values from its ``up`` until its home's ``back``;
  a home answers each participant once, after running the transaction once;
* every transaction entered finishes exactly once; ``done()`` once everything
  was admitted and finished.

The constants are read at call time as ``base.NAME`` (outside the per-event
loops): a test patches them here, not in the package, whose re-exports are copies.

Ownership: a :class:`~.scheduler.ForwardScheduler` runs on its task's thread, owns the
partitions it hosts for the batch (exclusive access, not preempted), and is the
only user of its transport.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from txstream.spark.runtime.base import JobSpec
from txstream.spark.runtime.boundaries import Event

if TYPE_CHECKING:
    from txstream.spark.runtime.executor import GroupRunner
    from txstream.spark.runtime.forward.scheduler import ForwardScheduler
    from txstream.spark.runtime.outcome import Outcome
    from txstream.spark.runtime.state import PartitionState

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


class _Shared:
    """What the parts of :class:`~.partition._Partition` share (declarations only).

    The partition's methods live in :mod:`.admission`, :mod:`.announce`,
    :mod:`.reads` and :mod:`.partition`; each part is a mixin of this class, so
    that mypy knows the attributes (set and documented in
    ``_Partition.__init__``) and the methods one part calls in another.
    """

    sched: ForwardScheduler
    job: JobSpec
    batch: int
    pid: int
    state: PartitionState
    outcome: Outcome
    runner: GroupRunner
    global_reads: dict[str, tuple[tuple[str, str | None], ...]]
    tables: list[str]
    one_flat: str | None
    record: bool
    mark: int
    pending: Iterator[Event]
    ahead: deque[Event | None]
    ahead_values: set[Any]
    ahead_stop: bool
    lends: bool
    unheard: int
    own: list[Event]
    copies: list[tuple[Any, ...]]
    copies_ran: tuple[float, int] | None
    stale: set[int]
    rows: dict[int, int]
    lists: dict[int, list[tuple[Any, ...]]]
    handed_in: dict[int, list[Event]]
    admitted_all: bool
    unfinished: int
    locks: dict[Any, list[Any]]
    inflight: int
    blocked: int
    barrier: _Item | None
    behind: deque[_Item]
    epoch: int
    readings: deque[_Item]
    earlier: list[int]
    side: int
    main: dict[str, Any]
    segments: dict[int, dict[str, Any]]
    logs: dict[int, tuple[list[Any], list[Any]]]
    ready: deque[_Item]
    waiting: dict[int, _Item | _Light]
    early: dict[int, list[tuple[int, tuple[Any, ...]]]]
    out: dict[int, list[tuple[Any, ...]]]

    if TYPE_CHECKING:  # (defined in one part, called in another)

        def send(self, dest: int, message: tuple[Any, ...]) -> None: ...
        def finish(self, item: _Item) -> None: ...
        def _start(self, item: _Item) -> None: ...
        def _heavy(self, light: _Light, home: bool) -> _Item: ...
        def _read_past(self, item: _Item) -> bool: ...
        def _side(self, epoch: int) -> None: ...
