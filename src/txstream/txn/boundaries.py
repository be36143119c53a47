"""Transaction boundaries: which events of a stream form one transaction.

Continuous queries have no natural transaction boundaries (EDBT 2012 Sections
3.2 and 4.3), so the application chooses them.  Each helper here turns an
iterable of events into an iterator of *groups* (lists of events), one group per
transaction:

* :func:`per_event` - every event is a transaction of its own;
* :func:`per_count` - every ``n`` events;
* :func:`per_timestamp` - consecutive events with the same timestamp (the
  CQL-style "each new timestamp triggers an execution");
* :func:`per_time_slice` - events whose timestamps fall into the same slice of
  ``seconds`` (per n seconds);
* :func:`per_punctuation` - up to a punctuation marker carried in the stream
  (the paper's implementation injects such punctuations).

:func:`grouping` builds one of these from a short spec, and :func:`run_groups`
runs a function over each group in a transaction of its own, in arrival order
(with an ``ordered`` manager the commits follow that order).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from txstream.errors import TxStreamError

if TYPE_CHECKING:
    from txstream.txn.manager import Transaction, TransactionManager

Group = list[Any]
Grouping = Callable[[Iterable[Any]], Iterator[Group]]


def _key_fn(key: str | int | Callable[[Any], Any]) -> Callable[[Any], Any]:
    if callable(key):
        return key
    return lambda event: event[key]


def per_event(events: Iterable[Any]) -> Iterator[Group]:
    """One transaction per event."""
    for event in events:
        yield [event]


def per_count(events: Iterable[Any], n: int) -> Iterator[Group]:
    """One transaction per ``n`` events (the last group may be smaller)."""
    if not isinstance(n, int) or n < 1:
        raise TxStreamError(f"per_count needs a positive number of events, not {n!r}")
    group: Group = []
    for event in events:
        group.append(event)
        if len(group) == n:
            yield group
            group = []
    if group:
        yield group


def per_timestamp(
    events: Iterable[Any], key: str | int | Callable[[Any], Any] = "ts"
) -> Iterator[Group]:
    """One transaction per run of consecutive events with the same timestamp."""
    get = _key_fn(key)
    group: Group = []
    current: Any = None
    for event in events:
        ts = get(event)
        if group and ts != current:
            yield group
            group = []
        current = ts
        group.append(event)
    if group:
        yield group


def per_time_slice(
    events: Iterable[Any], seconds: float, key: str | int | Callable[[Any], Any] = "ts"
) -> Iterator[Group]:
    """One transaction per slice ``[k*seconds, (k+1)*seconds)`` of event time."""
    if not seconds > 0:
        raise TxStreamError(f"per_time_slice needs a positive slice length, not {seconds!r}")
    get = _key_fn(key)
    group: Group = []
    current: int | None = None
    for event in events:
        slice_no = int(get(event) // seconds)
        if group and slice_no != current:
            yield group
            group = []
        current = slice_no
        group.append(event)
    if group:
        yield group


def per_punctuation(
    events: Iterable[Any], is_punctuation: Callable[[Any], bool], keep: bool = False
) -> Iterator[Group]:
    """One transaction per stretch of events ended by a punctuation marker.

    The marker itself is dropped unless ``keep``; events after the last marker
    form a final group.
    """
    group: Group = []
    for event in events:
        if is_punctuation(event):
            if keep:
                group.append(event)
            if group:
                yield group
            group = []
        else:
            group.append(event)
    if group:
        yield group


def grouping(spec: str | tuple[str, Any], key: str | int | Callable[[Any], Any] = "ts") -> Grouping:
    """A grouping function from a spec.

    ``"event"``, ``"timestamp"``, ``("count", n)``, ``("time", seconds)`` or
    ``("punctuation", predicate)``; ``key`` is the timestamp attribute.
    """
    arg: Any = None
    if isinstance(spec, str):
        name = spec
    else:
        name, arg = spec
    if name == "event":
        return per_event
    if name == "timestamp":
        return lambda events: per_timestamp(events, key)
    if name == "count":
        return lambda events: per_count(events, int(arg))
    if name == "time":
        return lambda events: per_time_slice(events, float(arg), key)
    if name == "punctuation":
        if not callable(arg):
            raise TxStreamError("punctuation boundaries need a predicate on events")
        return lambda events: per_punctuation(events, arg)
    raise TxStreamError(
        f"unknown transaction boundary {name!r}; choose one of: count, event, punctuation, "
        "time, timestamp"
    )


def run_groups(
    tm: TransactionManager,
    groups: Iterable[Group],
    work: Callable[[Transaction, Group], Any],
    retries: int = 100,
) -> int:
    """Run ``work(txn, group)`` for each group in its own transaction; return the count."""
    count = 0
    for group in groups:
        tm.run(lambda txn, g=group: work(txn, g), retries=retries)  # type: ignore[misc]
        count += 1
    return count
