"""What a task's run of a batch produced (:class:`Outcome`), and how rows and orders are written.

The outcome goes back to the driver: outputs as JSON lines (:data:`_json_line`),
the history, failures and counts, arrival times as a histogram that the driver
turns into latencies (:func:`latencies`) when the batch commits.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import mul
from typing import Any

from txstream.spark.runtime.base import Row
from txstream.spark.runtime.boundaries import Event, Group
from txstream.spark.runtime.rows import json_value


@dataclass
class Outcome:
    """What one task did: outputs, history, failures and counts, for the driver."""

    outputs: dict[str, list[str]] = field(default_factory=dict)
    history: list[Any] = field(default_factory=list)
    """Operations and commits in the order they happened, in the compact form of
    :mod:`.recorded`."""
    orders: list[tuple[float, int, int]] = field(default_factory=list)
    """The orders of the plain commit marks in ``history``, one per mark (see :mod:`.recorded`)."""
    txns: list[str] = field(default_factory=list)
    """``T <gid> a <order>`` lines: the aborted transactions (a commit is in ``history``)."""
    failures: list[dict[str, Any]] = field(default_factory=list)
    everywhere: list[str] = field(default_factory=list)
    """Failed transactions with an event that reached every partition (a keyless or
    broadcast event's fragment): its fragments elsewhere may have committed, so
    the batch runs again with it aborted everywhere (``tasks.run_batch``)."""
    events: int = 0
    committed: int = 0
    aborted: int = 0
    deferred: int = 0
    forwarded: int = 0
    """Multi-partition transactions this task ran at their home with forwarded rows."""
    messages: int = 0
    """Messages this task's partitions sent to other partitions (see :mod:`.forward`)."""
    message_bytes: int = 0
    """Bytes of the messages that went to another task (over a socket)."""
    wait_ms: int = 0
    """Milliseconds a task waited for another task's message with nothing to run (forward/)."""
    sent: list[float] = field(default_factory=list)
    """Arrival times (``arrivalTime`` column) of the committed transactions' events."""
    inputs: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    """Committed transactions per input index (a transaction counts for each of its
    events' inputs): the driver's all-fail rule (see :mod:`.failures`)."""

    def committed_txn(self, events: Sequence[Event]) -> None:
        """Count a committed transaction of ``events``."""
        self.committed += 1
        counts = self.inputs
        first = events[0].order[1]
        counts[first] = counts.get(first, 0) + 1
        if len(events) > 1:
            for index in {e.order[1] for e in events} - {first}:
                counts[index] = counts.get(index, 0) + 1

    def failed(
        self,
        group: Group,
        kind: str,
        error: str,
        position: str | None = None,
        at: Sequence[Any] | None = None,
    ) -> None:
        """Count ``group`` aborted and report it.

        ``kind``: ``abort`` (``tx.abort``), ``error`` (the function raised) or
        ``late``; ``position`` and ``at``: the failing event's position and
        declared order (default: the transaction's first event).  Of the parts of
        a transaction that failed on several partitions, the one whose event
        comes first is reported (see ``results.one_per_transaction``).
        """
        self.aborted += 1
        if not all(e.values for e in group.events):
            self.everywhere.append(group.gid)
        self.failures.append(
            {
                "txn": group.gid,
                "kind": kind,
                "position": position or group.events[0].position,
                "order": list(group.order),
                "at": list(at or group.order),
                "error": error,
            }
        )

    def stats(self) -> dict[str, Any]:
        """The counters and failures, JSON-ready."""
        return {
            "events": self.events,
            "committed": self.committed,
            "aborted": self.aborted,
            "deferred": self.deferred,
            "forwarded": self.forwarded,
            "messages": self.messages,
            "message_bytes": self.message_bytes,
            "wait_ms": self.wait_ms,
            "failures": self.failures,
            **({"everywhere": self.everywhere} if self.everywhere else {}),
            "committed_inputs": dict(self.inputs),
            "latency": _histogram(self.sent),
        }


def _histogram(sent: list[float]) -> dict[str, int]:
    """Arrival times counted per millisecond (compact, mergeable).

    The driver turns them into latencies when the batch commits, the moment the
    effects become visible.
    """
    counts = Counter(map(int, map(mul, sent, repeat(1000))))  # int(s * 1000) per s, in C
    return {str(ms): n for ms, n in counts.items()}


def latencies(arrivals: dict[str, int], committed_at: float) -> dict[str, int]:
    """Turn an arrival histogram into a latency histogram (ms) for a commit at ``committed_at``."""
    now = int(committed_at * 1000)
    out: dict[str, int] = {}
    for sent, count in arrivals.items():
        key = str(max(0, now - int(sent)))
        out[key] = out.get(key, 0) + count
    return out


def _json_encoder() -> Callable[[Row], str]:
    """``json.dumps(row, default=json_value)``, without building an encoder per row."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator (not CPython): the same output, slower
        return json.JSONEncoder(default=json_value).encode
    # No markers dict: one shared by all rows would keep stale ids after a failed
    # row; a self-referencing row still fails (RecursionError) instead of looping.
    encode = make(
        None, json_value, json.encoder.encode_basestring_ascii, None, ": ", ", ", False, False, True
    )

    def line(row: Row) -> str:
        return "".join(encode(row, 0))

    return line


_json_line = _json_encoder()
"""An output row as its JSON line (one per emitted row: this is on the hot path)."""


def _order_head(order: tuple[float, int, int]) -> str | None:
    """``, "__order": [v, i, m, `` for an emit of a transaction at ``order`` (None: not plain)."""
    value, index, mid = order
    if type(value) is float and value - value == 0.0 and type(index) is int and type(mid) is int:
        return f', "__order": [{value!r}, {index}, {mid}, '
    return None


def _order_text(order: tuple[float, int, int]) -> str:
    return f"{order[0]!r} {order[1]} {order[2]}"
