"""Transaction boundaries by name (EDBT 2012 Section 3.2 and Table 3).

A boundary turns the events of one partition, in the declared order, into
transactions (*groups*).  A group's id is the same in every partition that holds
part of it (a timestamp's events on several partitions form one transaction), so
the runtime can tell one transaction's parts apart from another's.

========================  =================  ===================================
name                      system (Table 3)   one transaction per
========================  =================  ===================================
``event``                 StreamBase         event
``timestamp``             STREAM             distinct order value, all inputs
``timeslice``             Coral8             slice of ``seconds`` of one input
                                             (``of``, delivered to every
                                             partition); a late event is aborted
``punctuation``           StreamInsight      run of events closed by a CTI event
                                             of the input ``of`` (delivered to
                                             every partition)
``seconds``               (n s of time)      ``seconds``-long slice of event time
``batch``                 (micro-batch)      micro-batch
``by``                    (custom)           run of consecutive events with the
                                             same ``group(event)`` value (one
                                             run per value and batch, checked)
========================  =================  ===================================
"""

from __future__ import annotations

import inspect
import math
import re
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

from txstream.errors import UnknownNameError
from txstream.spark.runtime.base import Row, RuntimeJobError
from txstream.spark.runtime.errors import GroupOrderError as GroupOrderError  # (re-exported)


class Event(NamedTuple):
    """One input event inside a partition.

    ``order`` is the declared order within the batch: (order value, input index,
    source position); ``values`` are its declared partition values and ``pids``
    their partitions; ``copy`` is False for the marker copies a multi-partition
    event leaves on its other partitions.

    A named tuple (never changed once made), so that a task can make a batch's
    events in C: ``map(tuple.__new__, repeat(Event), zip(orders, ...))`` runs no
    Python code per event (see ``query._phase1_outputs``).
    """

    order: tuple[float, int, int]
    input: str
    row: Row
    values: list[Any]
    pids: list[int]
    copy: bool = True

    @property
    def position(self) -> str:
        """The input position, for error messages (see :func:`position`)."""
        return position(self.input, self.order[2])

    @property
    def counted(self) -> bool:
        """Whether this copy counts the event in the progress (once over all partitions).

        The owner's copy of an event with keys; partition 0's of one that reaches
        every partition (each of its copies runs a fragment, so each is a ``copy``).
        """
        return self.copy and (bool(self.values) or self.pids[0] == 0)


MID_BITS = 64
"""An event's source position is ``batch << MID_BITS`` plus its place in the batch,
unique across batches (held events from earlier batches meet new ones).  On
Spark the place is ``monotonically_increasing_id()``: the input split's index
times 2**33 plus the row's place in the split, up to 2**63 (with 40 bits, as
before, a batch of more than 128 input splits ran into the next batch's ids)."""
_SPLIT_BITS = 33


def position(input_name: str, mid: int) -> str:
    """An event's input position, for error messages.

    ``input#<row>``, after ``b<batch>+`` from batch 1 on and ``p<split>.`` for a
    row of a Spark input split other than the batch's first: e.g.
    ``readings#b3+p1.17`` is row 17 of the second split of batch 3.
    """
    batch, place = mid >> MID_BITS, mid & ((1 << MID_BITS) - 1)
    split, row = place >> _SPLIT_BITS, place & ((1 << _SPLIT_BITS) - 1)
    where = f"p{split}.{row}" if split else str(row)
    return f"{input_name}#{where}" if batch == 0 else f"{input_name}#b{batch}+{where}"


@dataclass(slots=True)
class Group:
    """A transaction: its id, its events (in order) and why it aborts, if it must."""

    gid: str
    events: list[Event] = field(default_factory=list)
    late: str | None = None

    @property
    def order(self) -> tuple[float, int, int]:
        """The group's place in the declared order: that of its first event."""
        return self.events[0].order


_NUMBER_TAG = re.compile(r"m?[0-9]")


def _tag(value: Any) -> str:
    """``value`` as characters allowed in a transaction id (ASCII letters, digits, ``_``).

    Distinct values get distinct tags: when spelling the value's text in those
    characters loses information (``"a b"`` and ``"a_b"``, non-ASCII letters, a
    tuple), a checksum of its ``repr`` is appended.
    """
    text = repr(value) if isinstance(value, float) else str(value)
    tag = "".join(
        c if c.isascii() and c.isalnum() else {".": "d", "-": "m"}.get(c, "_") for c in text
    )
    plain = isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(value, str):  # kept as it is unless it reads like a number's tag
        plain = tag == text and _NUMBER_TAG.match(text) is None
    if not plain:
        tag += f"_{zlib.crc32(repr(value).encode('utf-8', 'surrogatepass')):08x}"
    return tag


class Boundary(ABC):
    """Cuts one partition's ordered events of batch ``batch`` into groups.

    The boundaries by name are :data:`BOUNDARIES` (``tx.BOUNDARIES``):

    >>> import txstream as tx
    >>> for name, cls in sorted(tx.BOUNDARIES.items()):
    ...     print(f"{name:12} {cls.summary}")
    batch        one transaction per micro-batch
    by           one transaction per run of events with the same group(event) value
    event        one transaction per event (StreamBase)
    punctuation  one transaction per run of events closed by a CTI/punctuation (StreamInsight)
    seconds      one transaction per n seconds of event time
    timeslice    one transaction per timeslice of one input; late events aborted (Coral8)
    timestamp    one transaction per timestamp across all inputs (STREAM)
    >>> isinstance(tx.boundary("event"), tx.Boundary), tx.boundary("event").may_span
    (True, False)
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    may_span: ClassVar[bool] = True
    """Whether a group can have parts on several partitions (not for ``event``)."""
    checks_runs: ClassVar[bool] = False
    """Whether the driver checks that the groups' events do not interleave (``by``)."""

    def validate(self, inputs: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Raise :class:`RuntimeJobError` when the boundary does not fit the job's inputs."""

    @abstractmethod
    def groups(self, batch: int, events: list[Event], meta: dict[str, Any]) -> Iterator[Group]:
        """The groups of ``events``; ``meta`` is the partition's durable boundary state."""

    def complete(self, events: list[Event], upto: float, meta: dict[str, Any]) -> int:
        """Event-time merge: how many of ``events`` (in order) make whole transactions.

        ``events`` are the ones the merge releases (no later event comes before
        them); events up to the frontier ``upto`` may follow.  The rest of the
        list belongs to a transaction that those may still join: it is held for
        a later batch, so that a transaction does not depend on how the sources
        cut the input into micro-batches.  Every partition must decide alike (by
        order values, or by events that reach every partition).  The default
        holds nothing: a transaction per event, per micro-batch or per ``by``
        run of a micro-batch.
        """
        return len(events)

    def closed(self, upto: float) -> float | None:
        """Event-time merge: the order value below which every group is whole once ``upto`` passed.

        A later event below it cannot join its group, which ran without it on
        every partition: the runtime counts it as late (a partition's own
        order alone would not see it when that partition ran nothing of the
        group).  ``None``: groups do not span partitions by order value (one
        transaction per event, per micro-batch, per ``by`` run).
        """
        return None

    def closed_by(self, value: float) -> float | None:
        """The :meth:`closed` value once every input is quiet or ended after ``value`` ran.

        The group of the last event released (order value ``value``) ran then,
        though later events could have joined it: the order value below which
        every group that ran is whole.  ``None``, as :meth:`closed`.
        """
        return None


class PerEvent(Boundary):
    """One transaction per event (StreamBase)."""

    name = "event"
    summary = "one transaction per event (StreamBase)"
    may_span = False

    def groups(self, batch: int, events: list[Event], meta: dict[str, Any]) -> Iterator[Group]:
        """See :meth:`Boundary.groups`."""
        for event in events:
            yield Group(event_gid(batch, event), [event])


def event_gid(batch: int, event: Event) -> str:
    """The id of the transaction of one event of batch ``batch`` (the ``event`` boundary's)."""
    return f"b{batch}_{event.order[2]}"


class _ByValue(Boundary):
    """Consecutive events with the same ``value(event)`` form one group."""

    tag: ClassVar[str]

    @abstractmethod
    def value(self, event: Event) -> Any:
        """The value that identifies the event's group within the batch."""

    def groups(self, batch: int, events: list[Event], meta: dict[str, Any]) -> Iterator[Group]:
        """See :meth:`Boundary.groups` (the value is a function of the order value here)."""
        current: Group | None = None
        current_value: Any = None
        for event in events:
            value = self.value(event)
            if current is None or value != current_value:
                if current is not None:
                    yield current
                current = Group(f"b{batch}_{self.tag}{_tag(value)}")
                current_value = value
            current.events.append(event)
        if current is not None:
            yield current


class PerTimestamp(_ByValue):
    """One transaction per distinct order value across all inputs (STREAM)."""

    name = "timestamp"
    summary = "one transaction per timestamp across all inputs (STREAM)"
    tag = "t"

    def validate(self, inputs: dict[str, Any]) -> None:
        """See :meth:`Boundary.validate`."""
        _need_order(self.name, inputs)

    def value(self, event: Event) -> Any:
        """See :meth:`_ByValue.value`."""
        return event.order[0]

    def complete(self, events: list[Event], upto: float, meta: dict[str, Any]) -> int:
        """See :meth:`Boundary.complete`: events at the frontier's order value wait."""
        return _before(events, upto)

    def closed(self, upto: float) -> float | None:
        """See :meth:`Boundary.closed`: every order value below the frontier's."""
        return upto

    def closed_by(self, value: float) -> float | None:
        """See :meth:`Boundary.closed_by`: ``value`` itself, and below."""
        return math.nextafter(value, math.inf)


class PerSeconds(_ByValue):
    """One transaction per ``seconds`` of event time (the order value)."""

    name = "seconds"
    summary = "one transaction per n seconds of event time"
    tag = "s"

    def __init__(self, seconds: float) -> None:
        self.seconds = _positive("seconds", seconds)

    def validate(self, inputs: dict[str, Any]) -> None:
        """See :meth:`Boundary.validate`."""
        _need_order(self.name, inputs)

    def value(self, event: Event) -> Any:
        """See :meth:`_ByValue.value`."""
        return math.floor(event.order[0] / self.seconds)

    def complete(self, events: list[Event], upto: float, meta: dict[str, Any]) -> int:
        """See :meth:`Boundary.complete`: the events of the frontier's slice wait."""
        return _before(events, math.floor(upto / self.seconds) * self.seconds)

    def closed(self, upto: float) -> float | None:
        """See :meth:`Boundary.closed`: the slices before the frontier's."""
        return math.floor(upto / self.seconds) * self.seconds if math.isfinite(upto) else upto

    def closed_by(self, value: float) -> float | None:
        """See :meth:`Boundary.closed_by`: ``value``'s slice, and those before it."""
        return (math.floor(value / self.seconds) + 1) * self.seconds


class PerBatch(_ByValue):
    """One transaction per micro-batch."""

    name = "batch"
    summary = "one transaction per micro-batch"
    tag = "all"

    def value(self, event: Event) -> Any:
        """See :meth:`_ByValue.value`."""
        return 0


class PerGroupValue(_ByValue):
    """A run of consecutive events with the same ``group(row)`` value (a custom boundary).

    Each value must have one run per batch, consecutive in the declared order
    across all inputs and partitions: a partition sees only its own events, so
    the driver checks the runs of all partitions (:func:`check_runs`) before the
    batch commits, and refuses a batch where two values' runs interleave.
    """

    name = "by"
    summary = "one transaction per run of events with the same group(event) value"
    tag = "u"
    checks_runs = True

    def __init__(self, group: Callable[[Row], Any]) -> None:
        if not callable(group):
            raise RuntimeJobError("boundary 'by' needs group=a function of the event row")
        self.group = group

    def value(self, event: Event) -> Any:
        """See :meth:`_ByValue.value`."""
        return self.group(event.row)

    def groups(self, batch: int, events: list[Event], meta: dict[str, Any]) -> Iterator[Group]:
        """See :meth:`Boundary.groups`.

        The id depends on the value only (``1``, ``1.0`` and ``True`` are one
        value, as ``==`` says), so a run's parts on several partitions share it,
        and a value that comes back on a partition gets its earlier run's id:
        :func:`check_runs` then sees the runs interleave.
        """
        group = self.group
        current: _ValueGroup | None = None
        current_value: Any = None
        for event in events:
            try:
                value = group(event.row)
            except Exception as exc:
                raise RuntimeJobError(
                    f"{event.position}: boundary 'by': group(row) raised "
                    f"{type(exc).__name__}: {exc}"
                ) from None
            if current is None or value != current_value:
                gid = f"b{batch}_u{_tag(_plain(value))}"
                if current is not None:
                    if gid == current.gid:  # equal ids, unequal values (NaN): one run
                        current.events.append(event)
                        continue
                    yield current
                current = _ValueGroup(gid, value=value)
                current_value = value
            current.events.append(event)
        if current is not None:
            yield current


@dataclass(slots=True)
class _ValueGroup(Group):
    """A group of the ``by`` boundary, with its value (for :func:`check_runs`' message)."""

    value: Any = None


def _plain(value: Any) -> Any:
    """``value`` with equal numbers spelled alike (``True``, ``1.0`` -> ``1``), for its id."""
    kind = type(value)
    if kind is bool:
        return int(value)
    if kind is float and value.is_integer():
        return int(value)
    if kind is tuple or kind is list:
        return kind(map(_plain, value))
    return value


Run = list[Any]
"""A ``by`` group's events on one partition: ``[first order, its input, last order, its
input, the value's repr]`` (lists, so that the driver gets them through pickle or JSON)."""


def track_runs(groups: Iterable[Group], runs: dict[str, Run]) -> Iterator[Group]:
    """``groups``, recording in ``runs`` where each id's events start and end (for ``by``)."""
    for group in groups:
        first, last = group.events[0], group.events[-1]
        run = runs.get(group.gid)
        if run is None:
            shown = repr(getattr(group, "value", None))
            if len(shown) > 60:
                shown = shown[:57] + "..."
            runs[group.gid] = [list(first.order), first.input, list(last.order), last.input, shown]
        else:  # the value came back on this partition: one interval, which check_runs refuses
            run[2], run[3] = list(last.order), last.input
        yield group


def check_runs(batch: int, parts: Iterable[dict[str, Run]]) -> None:
    """Refuse batch ``batch`` when the ``by`` runs of two values interleave in the declared order.

    ``parts``: each partition's :func:`track_runs`.  A value's events on all
    partitions span one interval of the order; two intervals that overlap mean
    that some partition would group differently than another (or than one
    partition would), so the transactions would depend on the partition count.
    """
    merged: dict[str, Run] = {}
    for runs in parts:
        for gid, run in runs.items():
            seen = merged.get(gid)
            if seen is None:
                merged[gid] = list(run)
                continue
            if run[0] < seen[0]:
                seen[0], seen[1] = run[0], run[1]
            if run[2] > seen[2]:
                seen[2], seen[3] = run[2], run[3]
    widest: Run | None = None  # of the runs so far, the one that ends last
    for run in sorted(merged.values(), key=lambda r: r[0]):
        if widest is not None and run[0] < widest[2]:
            raise GroupOrderError(
                f"batch {batch}: boundary 'by': the events of group {widest[4]} (from "
                f"{position(widest[1], widest[0][2])} to {position(widest[3], widest[2][2])}) "
                f"and of group {run[4]} (from {position(run[1], run[0][2])}) interleave; 'by' "
                "needs each value's events consecutive in the declared order across all inputs "
                "(e.g. a function of event time), otherwise the transactions would depend on "
                "the partition count"
            )
        if widest is None or run[2] > widest[2]:
            widest = run


def _unkeyed_input(inputs: dict[str, Any], of: str, kind: str, why: str) -> Any:
    """Input ``of`` of a ``kind`` boundary, which every partition must see (no keys).

    ``why``: what every partition must see of it, for the error's message.
    """
    spec = inputs.get(of)
    if spec is None:
        raise RuntimeJobError(
            f"boundary {kind} of={of!r} names no input; inputs: {', '.join(inputs)}"
        )
    if spec.keys:
        raise RuntimeJobError(
            f"the {kind} input {of!r} must have keys=() so that every partition {why}"
        )
    return spec


class PerTimeslice(Boundary):
    """One transaction per ``seconds``-long slice of input ``of`` (Coral8).

    Events of other inputs join the slice that is open when they arrive.  An
    event of ``of`` whose slice is older than the newest slice already seen is
    *late*: its transaction is aborted (Coral8 drops it).  The input ``of`` has
    no keys: each of its events reaches every partition, at the same place in
    the order, so every partition keeps the same slice clock and a slice's parts
    share one id (as for ``punctuation``).
    """

    name = "timeslice"
    summary = "one transaction per timeslice of one input; late events aborted (Coral8)"

    def __init__(self, seconds: float, of: str) -> None:
        self.seconds = _positive("seconds", seconds)
        self.of = of

    def validate(self, inputs: dict[str, Any]) -> None:
        """See :meth:`Boundary.validate`."""
        spec = _unkeyed_input(
            inputs,
            self.of,
            "timeslice",
            "sees its events (one slice clock); put keyed events in another input",
        )
        if spec.order is None:
            raise RuntimeJobError(
                f"boundary 'timeslice' needs an order column on its input {self.of!r}; "
                "add order=..."
            )

    def complete(self, events: list[Event], upto: float, meta: dict[str, Any]) -> int:
        """See :meth:`Boundary.complete`: the open slice waits for the next one to open."""
        newest = meta.get("timeslice")
        opened = 0
        for i, event in enumerate(events):
            if event.input == self.of:
                slice_ = math.floor(event.order[0] / self.seconds)
                if newest is None or slice_ > newest:
                    opened, newest = i, slice_
        return opened

    def groups(self, batch: int, events: list[Event], meta: dict[str, Any]) -> Iterator[Group]:
        """See :meth:`Boundary.groups`."""
        newest = meta.get("timeslice")
        current: Group | None = None
        for event in events:
            if event.input == self.of:
                slice_ = math.floor(event.order[0] / self.seconds)
                if newest is not None and slice_ < newest:
                    late = Group(f"b{batch}_late{event.order[2]}", [event])
                    late.late = f"late event: slice {slice_} is before the open slice {newest}"
                    yield late
                    continue
                if current is None or slice_ != newest:
                    if current is not None:
                        yield current
                    current = Group(f"b{batch}_ts{_tag(slice_)}")
                newest = slice_
            elif current is None:
                current = Group(f"b{batch}_ts{_tag(newest)}")
            current.events.append(event)
        if current is not None:
            yield current
        meta["timeslice"] = newest


class PerPunctuation(Boundary):
    """A transaction closes at each CTI event of input ``of`` (StreamInsight).

    The punctuation input has no keys: each CTI reaches every partition, at the
    same place in the order, so every partition cuts its events at the same
    points and a group's parts share one id.
    """

    name = "punctuation"
    summary = "one transaction per run of events closed by a CTI/punctuation (StreamInsight)"

    def __init__(self, of: str) -> None:
        self.of = of

    def validate(self, inputs: dict[str, Any]) -> None:
        """See :meth:`Boundary.validate`."""
        _unkeyed_input(inputs, self.of, "punctuation", "sees each CTI")

    def complete(self, events: list[Event], upto: float, meta: dict[str, Any]) -> int:
        """See :meth:`Boundary.complete`: the events after the last CTI wait for the next."""
        for i in range(len(events) - 1, -1, -1):
            if events[i].input == self.of:
                return i + 1
        return 0

    def groups(self, batch: int, events: list[Event], meta: dict[str, Any]) -> Iterator[Group]:
        """See :meth:`Boundary.groups`."""
        current: Group | None = None
        for event in events:
            if current is None:
                current = Group("")
            current.events.append(event)
            if event.input == self.of:
                current.gid = f"b{batch}_c{event.order[2]}"
                yield current
                current = None
        if current is not None:
            current.gid = f"b{batch}_open"
            yield current


BOUNDARIES: dict[str, type[Boundary]] = {
    cls.name: cls
    for cls in (
        PerEvent,
        PerTimestamp,
        PerTimeslice,
        PerPunctuation,
        PerSeconds,
        PerBatch,
        PerGroupValue,
    )
}


def boundary(name: str | Boundary, **options: Any) -> Boundary:
    """The boundary called ``name`` with its options (e.g. ``boundary("seconds", seconds=2)``).

    >>> import txstream as tx
    >>> tx.boundary("seconds", seconds=2).name
    'seconds'
    >>> tx.boundary("second")
    Traceback (most recent call last):
    txstream.errors.UnknownNameError: unknown boundary 'second'; choose one of: batch, by, event,
    punctuation, seconds, timeslice, timestamp
    >>> tx.boundary("seconds")
    Traceback (most recent call last):
    txstream.spark.runtime.errors.RuntimeJobError: boundary 'seconds': missing option 'seconds'; it
    takes: seconds
    """
    if isinstance(name, Boundary):
        return name
    cls = BOUNDARIES.get(name)
    if cls is None:
        raise UnknownNameError("boundary", name, list(BOUNDARIES))
    params = inspect.signature(cls.__init__).parameters
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    allowed = [p for p, v in params.items() if p != "self" and v.kind in named]
    unknown = sorted(set(options) - set(allowed))
    missing = [p for p in allowed if params[p].default is params[p].empty and p not in options]
    if unknown or missing:
        what = f"unknown option {unknown[0]!r}" if unknown else f"missing option {missing[0]!r}"
        takes = ", ".join(allowed) or "no options"
        raise RuntimeJobError(f"boundary {name!r}: {what}; it takes: {takes}")
    return cls(**options)


def _before(events: list[Event], value: float) -> int:
    """How many of ``events`` (in order) have an order value below ``value``."""
    n = 0
    for event in events:
        if event.order[0] >= value:
            break
        n += 1
    return n


def _positive(what: str, value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise RuntimeJobError(f"{what} must be a positive finite number, not {value!r}")
    return float(value)


def _need_order(name: str, inputs: dict[str, Any]) -> None:
    missing = [n for n, spec in inputs.items() if spec.order is None and spec.keys]
    if missing:
        raise RuntimeJobError(
            f"boundary {name!r} needs an order column on every input; add order=... to "
            f"{', '.join(missing)}"
        )
