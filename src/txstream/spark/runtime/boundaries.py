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
                                             (``of``); a late event is aborted
``punctuation``           StreamInsight      run of events closed by a CTI event
                                             of the input ``of`` (delivered to
                                             every partition)
``seconds``               (n s of time)      ``seconds``-long slice of event time
``batch``                 (micro-batch)      micro-batch
``by``                    (custom)           run of consecutive events with the
                                             same ``group(event)`` value
========================  =================  ===================================
"""

from __future__ import annotations

import math
import re
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from txstream.errors import UnknownNameError
from txstream.spark.runtime.base import Row, RuntimeJobError


@dataclass(slots=True)
class Event:
    """One input event inside a partition.

    ``order`` is the declared order within the batch: (order value, input index,
    source position); ``values`` are its declared partition values and ``pids``
    their partitions; ``copy`` is False for the marker copies a multi-partition
    event leaves on its other partitions.
    """

    order: tuple[float, int, int]
    input: str
    row: Row
    values: list[Any]
    pids: list[int]
    copy: bool = True

    @property
    def position(self) -> str:
        """The input position, for error messages.

        ``input#position`` in batch 0, else ``input#b<batch>+<position>``.
        """
        batch, place = self.order[2] >> 40, self.order[2] & ((1 << 40) - 1)
        return f"{self.input}#{place}" if batch == 0 else f"{self.input}#b{batch}+{place}"


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
    """Cuts one partition's ordered events of batch ``batch`` into groups."""

    name: ClassVar[str]
    summary: ClassVar[str]
    may_span: ClassVar[bool] = True
    """Whether a group can have parts on several partitions (not for ``event``)."""

    def validate(self, inputs: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Raise :class:`RuntimeJobError` when the boundary does not fit the job's inputs."""

    @abstractmethod
    def groups(self, batch: int, events: list[Event], meta: dict[str, Any]) -> Iterator[Group]:
        """The groups of ``events``; ``meta`` is the partition's durable boundary state."""


class PerEvent(Boundary):
    """One transaction per event (StreamBase)."""

    name = "event"
    summary = "one transaction per event (StreamBase)"
    may_span = False

    def groups(self, batch: int, events: list[Event], meta: dict[str, Any]) -> Iterator[Group]:
        """See :meth:`Boundary.groups`."""
        for event in events:
            yield Group(f"b{batch}_{event.order[2]}", [event])


class _ByValue(Boundary):
    """Consecutive events with the same ``value(event)`` form one group."""

    tag: ClassVar[str]

    @abstractmethod
    def value(self, event: Event) -> Any:
        """The value that identifies the event's group within the batch."""

    def groups(self, batch: int, events: list[Event], meta: dict[str, Any]) -> Iterator[Group]:
        """See :meth:`Boundary.groups`.

        A value that comes back after another one starts a transaction of its own
        (its id names its first event), never a second part of the earlier one.
        """
        current: Group | None = None
        current_value: Any = None
        used: set[str] = set()
        for event in events:
            value = self.value(event)
            if current is None or value != current_value:
                if current is not None:
                    yield current
                gid = f"b{batch}_{self.tag}{_tag(value)}"
                if gid in used:
                    gid += f"_r{event.order[2]}"
                used.add(gid)
                current = Group(gid)
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


class PerBatch(_ByValue):
    """One transaction per micro-batch."""

    name = "batch"
    summary = "one transaction per micro-batch"
    tag = "all"

    def value(self, event: Event) -> Any:
        """See :meth:`_ByValue.value`."""
        return 0


class PerGroupValue(_ByValue):
    """A run of consecutive events with the same ``group(row)`` value (a custom boundary)."""

    name = "by"
    summary = "one transaction per run of events with the same group(event) value"
    tag = "u"

    def __init__(self, group: Callable[[Row], Any]) -> None:
        if not callable(group):
            raise RuntimeJobError("boundary 'by' needs group=a function of the event row")
        self.group = group

    def value(self, event: Event) -> Any:
        """See :meth:`_ByValue.value`."""
        return self.group(event.row)


class PerTimeslice(Boundary):
    """One transaction per ``seconds``-long slice of input ``of`` (Coral8).

    Events of other inputs join the slice that is open when they arrive.  An
    event of ``of`` whose slice is older than the newest slice this partition
    has already seen is *late*: its transaction is aborted (Coral8 drops it).
    """

    name = "timeslice"
    summary = "one transaction per timeslice of one input; late events aborted (Coral8)"

    def __init__(self, seconds: float, of: str) -> None:
        self.seconds = _positive("seconds", seconds)
        self.of = of

    def validate(self, inputs: dict[str, Any]) -> None:
        """See :meth:`Boundary.validate`."""
        if self.of not in inputs:
            raise RuntimeJobError(
                f"boundary timeslice of={self.of!r} names no input; inputs: {', '.join(inputs)}"
            )
        _need_order(self.name, {self.of: inputs[self.of]})

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
        spec = inputs.get(self.of)
        if spec is None:
            raise RuntimeJobError(
                f"boundary punctuation of={self.of!r} names no input; inputs: {', '.join(inputs)}"
            )
        if spec.keys:
            raise RuntimeJobError(
                f"the punctuation input {self.of!r} must have keys=() so that every "
                "partition sees each CTI"
            )

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
    """The boundary called ``name`` with its options (e.g. ``boundary("seconds", seconds=2)``)."""
    if isinstance(name, Boundary):
        return name
    cls = BOUNDARIES.get(name)
    if cls is None:
        raise UnknownNameError("boundary", name, list(BOUNDARIES))
    try:
        return cls(**options)
    except TypeError as exc:
        raise RuntimeJobError(f"boundary {name!r}: {exc}") from None


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
