"""An append-only stream of events with an ordering attribute.

A stream is a set of events partially ordered by a special attribute (EDBT 2012
Section 2.1).  Its only update is an *append* - the arrival of an event, a write
in the page model - and a *read* returns its state: the events so far, or a
range of them.

Every event gets an id, its position in the stream.  Each slot also remembers
the commit timestamp of the transaction that appended it (``None`` while that
transaction runs), so a reader can see the stream as of a snapshot.  Undoing an
append removes the event: the stream is truncated when it was the last one,
otherwise the slot becomes a hole that reads skip (another transaction appended
after it), so ids stay stable.

Lock granularity (Section 4.5.1) decides which data items a read or an append
touches:

* ``"stream"`` - the whole stream is one item: every append conflicts with
  every read;
* ``"event"`` - each event is an item ``<stream>.<id>``: an append conflicts
  with nothing that came before it;
* ``"range"`` - events ``[k*n, (k+1)*n)`` share the item ``<stream>.r<k>``,
  ``n`` being ``range_size``: fewer locks than per-event for long reads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Final

from txstream.storage.base import OrderError, StorageError, check_name

GRANULARITIES: Final = ("stream", "event", "range")

OrderBy = str | int | Callable[[Any], Any] | None


def _is_id(value: object) -> bool:
    """Whether ``value`` can be an event id (an int, not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


class _Gone:
    """Marks the slot of an event whose append was undone."""

    def __repr__(self) -> str:
        return "GONE"


GONE: Final = _Gone()


class Stream:
    """Append-only events, an ordering attribute and a lock granularity.

    ``order_by`` names the ordering attribute: a mapping key or attribute name
    (``str``), a tuple index (``int``) or a function of the event; ``None`` means
    arrival order only.  With ``require_order=True`` an event whose ordering
    value is smaller than the last event's raises :class:`OrderError`.
    """

    kind = "stream"

    def __init__(
        self,
        name: str,
        order_by: OrderBy = None,
        require_order: bool = False,
        granularity: str = "stream",
        range_size: int = 64,
    ) -> None:
        self.name = check_name("stream", name)
        if granularity not in GRANULARITIES:
            raise StorageError(
                f"stream {name}: unknown lock granularity {granularity!r}; "
                f"choose one of: {', '.join(GRANULARITIES)}"
            )
        if not isinstance(range_size, int) or range_size < 1:
            raise StorageError(f"stream {name}: range_size must be a positive integer")
        if require_order and order_by is None:
            raise StorageError(f"stream {name}: require_order needs an ordering attribute")
        self.order_by = order_by
        self.require_order = require_order
        self.granularity = granularity
        self.range_size = range_size
        self._events: list[Any] = []
        self._ts: list[int | None] = []
        self._base = 0  # the id of _events[0]: ids below it were trimmed
        self._live = 0
        self._latch = threading.Lock()
        self.readers: dict[str, int] = {}
        """Registered readers and the id each has read up to (see :meth:`trim`)."""

    def __repr__(self) -> str:
        return f"Stream({self.name!r}, events={self._live}, granularity={self.granularity!r})"

    def __len__(self) -> int:
        """The next event id (slots, holes and trimmed events included)."""
        return self._base + len(self._events)

    @property
    def first(self) -> int:
        """The smallest id still kept (events below it were trimmed)."""
        return self._base

    @property
    def live(self) -> int:
        """Number of events present (holes excluded)."""
        return self._live

    # -- ordering ------------------------------------------------------------------

    def order_value(self, event: Any) -> Any:
        """The ordering attribute of ``event`` (``None`` without ``order_by``)."""
        spec = self.order_by
        if spec is None:
            return None
        try:
            if callable(spec):
                return spec(event)
            if isinstance(spec, int) or isinstance(event, Mapping):
                return event[spec]
            return getattr(event, spec)
        except (KeyError, IndexError, AttributeError, TypeError) as exc:
            raise StorageError(
                f"stream {self.name}: event {event!r} has no ordering attribute {spec!r} ({exc})"
            ) from None

    def last_order_value(self) -> Any:
        """The ordering value of the last present event, or ``None``."""
        events = self._events
        for i in range(len(events) - 1, -1, -1):
            if events[i] is not GONE:
                return self.order_value(events[i])
        return None

    def check_order(self, event: Any, after: Any = None) -> None:
        """Raise :class:`OrderError` if ``event`` may not follow the current last event.

        ``after`` is an extra ordering value the event must not precede (the
        last of a batch not yet appended).
        """
        if not self.require_order:
            return
        value = self.order_value(event)
        if value is None or value != value:  # NaN compares false to everything
            # NaN would pass every check and then let any later event pass too.
            raise OrderError(
                f"stream {self.name} requires order by {self.order_by!r}: event {event!r} has "
                f"no comparable ordering value ({value!r})"
            )
        last = after if after is not None else self.last_order_value()
        try:
            late = last is not None and value < last
        except TypeError:
            raise OrderError(
                f"stream {self.name} requires order by {self.order_by!r}: event {event!r} "
                f"({value!r}) cannot be compared with the last one ({last!r})"
            ) from None
        if late:
            raise OrderError(
                f"stream {self.name} requires order by {self.order_by!r}: event {event!r} "
                f"({value!r}) arrived after {last!r}"
            )

    # -- items ----------------------------------------------------------------------

    def item_of(self, event_id: int) -> str:
        """The data item that event ``event_id`` belongs to under this granularity."""
        if self.granularity == "stream":
            return self.name
        if self.granularity == "event":
            return f"{self.name}.{event_id}"
        return f"{self.name}.r{event_id // self.range_size}"

    def items_for_read(self, start: int, end: int) -> list[str]:
        """The items a read of ids ``[start, end)`` touches."""
        if self.granularity == "stream":
            return [self.name]
        if end <= start:
            return []
        if self.granularity == "event":
            return [f"{self.name}.{i}" for i in range(start, end)]
        size = self.range_size
        return [f"{self.name}.r{k}" for k in range((start // size), (end - 1) // size + 1)]

    def items_for_append(self) -> list[str]:
        """Items to lock *before* an append whose id is not yet known.

        Stream granularity: the stream.  Finer granularities return nothing: the
        new event's own item is locked once its id is assigned.
        """
        return [self.name] if self.granularity == "stream" else []

    # -- access ----------------------------------------------------------------------

    def append(self, event: Any) -> int:
        """Append ``event`` (uncommitted); return its id.  Safe to call from many threads."""
        with self._latch:
            self.check_order(event)
            self._events.append(event)
            self._ts.append(None)
            self._live += 1
            return self._base + len(self._events) - 1

    def bounds(self, start: int = 0, end: int | None = None) -> tuple[int, int]:
        """Clamp a requested id range to the stream's current (untrimmed) slots."""
        base = self._base
        n = base + len(self._events)
        if not _is_id(start) or (end is not None and not _is_id(end)):
            raise StorageError(
                f"stream {self.name}: a range of event ids is two integers, not {start!r}, {end!r}"
            )
        if start < 0:
            raise StorageError(f"stream {self.name}: negative start {start}")
        stop = n if end is None else min(end, n)
        lo = min(max(start, base), n)
        return lo, max(lo, stop)

    def _slots(self, start: int, end: int | None) -> tuple[int, list[Any], list[int | None]]:
        """A consistent copy of the slots in ``[start, end)``.

        Undoing an append may shorten the lists concurrently, so they are copied
        under the latch.
        """
        with self._latch:
            lo, hi = self.bounds(start, end)
            base = self._base
            return lo, self._events[lo - base : hi - base], self._ts[lo - base : hi - base]

    def read(self, start: int = 0, end: int | None = None) -> list[Any]:
        """The present events with ids in ``[start, end)``, committed or not."""
        _, events, _ = self._slots(start, end)
        return [e for e in events if e is not GONE]

    def read_with_ids(self, start: int = 0, end: int | None = None) -> list[tuple[int, Any]]:
        """Like :meth:`read`, with each event's id."""
        lo, events, _ = self._slots(start, end)
        return [(lo + i, e) for i, e in enumerate(events) if e is not GONE]

    def read_at(self, ts: int, start: int = 0, end: int | None = None) -> list[Any]:
        """The events committed at or before ``ts`` with ids in ``[start, end)``."""
        _, events, stamps = self._slots(start, end)
        return [
            e
            for e, s in zip(events, stamps, strict=True)
            if s is not None and s <= ts and e is not GONE
        ]

    def read_visible(self, start: int, end: int | None, own: set[int] | None) -> list[Any]:
        """Committed events in ``[start, end)`` plus the uncommitted ones in ``own``."""
        lo, events, stamps = self._slots(start, end)
        return [
            e
            for i, (e, s) in enumerate(zip(events, stamps, strict=True))
            if e is not GONE and (s is not None or (own is not None and lo + i in own))
        ]

    def committed_with_ids(self) -> list[tuple[int, Any]]:
        """Every committed event with its id, in id order."""
        lo, events, stamps = self._slots(0, None)
        return [
            (lo + i, e)
            for i, (e, s) in enumerate(zip(events, stamps, strict=True))
            if s is not None
        ]

    def committed(self) -> list[Any]:
        """Every committed event, in id order."""
        _, events, stamps = self._slots(0, None)
        return [e for e, s in zip(events, stamps, strict=True) if s is not None]

    def remove(self, event_id: int) -> None:
        """Undo the append of ``event_id``: truncate at the tail, else leave a hole."""
        with self._latch:
            events = self._events
            index = event_id - self._base
            if index < 0 or index >= len(events) or events[index] is GONE:
                return
            events[index] = GONE
            self._ts[index] = None
            self._live -= 1
            while events and events[-1] is GONE and self._ts[-1] is None:
                events.pop()
                self._ts.pop()

    def install(self, event_id: int, ts: int) -> None:
        """Mark event ``event_id`` committed at timestamp ``ts``."""
        with self._latch:  # a trim may shift the slots meanwhile
            self._ts[event_id - self._base] = ts

    def event(self, event_id: int) -> Any:
        """The event with id ``event_id`` (``GONE`` for a hole)."""
        with self._latch:
            index = event_id - self._base
            if index < 0:
                raise StorageError(f"stream {self.name}: event {event_id} was trimmed")
            return self._events[index]

    def start_at(self, first: int) -> None:
        """Let an empty stream start at id ``first`` (a trimmed stream's checkpoint)."""
        with self._latch:
            if self._events:
                raise StorageError(f"stream {self.name}: only an empty stream can move its start")
            self._base = first

    def place(self, event_id: int, event: Any, ts: int) -> None:
        """Put a committed event at a given id (log replay); earlier gaps become holes.

        The first event placed in an empty stream sets its first id, so a stream
        that was trimmed comes back from a checkpoint without its trimmed ids.
        """
        events, stamps = self._events, self._ts
        if not events:
            self._base = event_id
        elif event_id < self._base:
            # Log replay follows commit order, which may differ from id order.
            gap = self._base - event_id
            events[:0] = [GONE] * gap
            stamps[:0] = [None] * gap
            self._base = event_id
        index = event_id - self._base
        while len(events) < index:
            events.append(GONE)
            stamps.append(None)
        if index == len(events):
            events.append(event)
            stamps.append(ts)
        else:
            if events[index] is not GONE:
                raise StorageError(f"stream {self.name}: event id {event_id} is taken")
            events[index] = event
            stamps[index] = ts
        self._live += 1

    # -- retention ------------------------------------------------------------------

    def register_reader(self, name: str, position: int = 0) -> None:
        """Declare a reader that has read every event below id ``position``.

        :meth:`trim` never drops events a registered reader has not passed.
        """
        if isinstance(position, bool) or not isinstance(position, int) or position < 0:
            raise StorageError(f"stream {self.name}: reader position must be an id >= 0")
        with self._latch:
            self.readers[name] = position

    def advance_reader(self, name: str, position: int) -> None:
        """Record that reader ``name`` has read every event below id ``position``."""
        if name not in self.readers:
            raise StorageError(
                f"stream {self.name}: no reader {name!r}; register it with register_reader"
            )
        self.register_reader(name, position)

    def drop_reader(self, name: str) -> None:
        """Forget reader ``name`` (it no longer holds back trimming)."""
        with self._latch:
            self.readers.pop(name, None)

    def trim(self, offset: int) -> int:
        """Drop the events with ids below ``offset``; return how many slots went.

        Refused (:class:`StorageError`, nothing dropped) when a registered reader
        has not read that far or an event below ``offset`` is not committed yet.
        Ids stay stable: later events keep theirs, and reads of trimmed ids find
        nothing.  The newest committed event is always kept, because a stream
        recovered from a checkpoint continues its ids after it.
        """
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise StorageError(f"stream {self.name}: trim offset must be an id >= 0")
        with self._latch:
            events, stamps, base = self._events, self._ts, self._base
            if offset <= base:
                return 0
            n = base + len(events)
            if offset > n:
                raise StorageError(
                    f"stream {self.name}: cannot trim below {offset}: its next id is {n}"
                )
            behind = [(pos, who) for who, pos in self.readers.items() if pos < offset]
            if behind:
                pos, who = min(behind)
                raise StorageError(
                    f"stream {self.name}: cannot trim below {offset}: reader {who!r} has "
                    f"read only up to {pos}; advance it first (advance_reader)"
                )
            cut = offset - base
            for i in range(cut):
                if stamps[i] is None and events[i] is not GONE:
                    raise StorageError(
                        f"stream {self.name}: cannot trim below {offset}: event {base + i} "
                        "is not committed yet"
                    )
            newest = len(events) - 1
            while newest >= 0 and (stamps[newest] is None or events[newest] is GONE):
                newest -= 1
            cut = min(cut, max(newest, 0))
            self._live -= sum(1 for e in events[:cut] if e is not GONE)
            del events[:cut]
            del stamps[:cut]
            self._base = base + cut
            return cut

    def describe(self) -> dict[str, Hashable]:
        """The stream's settings as JSON-ready values (for the log's definitions)."""
        order_by = self.order_by if isinstance(self.order_by, (str, int)) else None
        return {
            "order_by": order_by,
            "require_order": self.require_order if order_by is not None else False,
            "granularity": self.granularity,
            "range_size": self.range_size,
        }
