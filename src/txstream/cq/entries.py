"""What a continuous query's engine keeps per run: its statistics, redo-queue entries, results.

Shared by :mod:`txstream.cq.engine` (which fills them), :mod:`txstream.cq.units`
(the units that read them) and :mod:`txstream.cq.strategies` (which hand
entries on from window to window).
"""

from __future__ import annotations

from dataclasses import dataclass

from txstream.cq.base import Event, Operator, Read, Row, Source
from txstream.model.history import Operation


@dataclass
class RunStats:
    """What a run did besides its results."""

    redos: int = 0
    windows: int = 0  # windows whose transaction committed
    reads: int = 0
    reevaluated: int = 0  # events re-input from a redo queue because a row they read changed
    max_redo_queue: int = 0
    # optimistic: units that failed their validation escalate_after times in a row and
    # were run once more on a snapshot, which always commits (see CQEngine.escalate_after)
    escalations: int = 0


class Entry:
    """An input event in its branch's redo queue: what entered the queue, its reads, its output."""

    __slots__ = ("branch", "checked", "out", "queued", "reads", "slots", "ts")

    def __init__(self, ts: int, branch: int) -> None:
        self.ts = ts
        self.branch = branch
        self.queued: Event | None = None  # the event at the input of the queue's operator
        self.reads: tuple[Read, ...] = ()
        self.out: Event | None = None  # what the branch outputs for it (None: dropped)
        self.checked = -1  # the transaction attempt that last re-read its rows
        self.slots: list[list[Operation]] = []  # naive + recording: history places of its reads


@dataclass
class Branch:
    """A source's chain: the operators below its redo queue, and those from it up."""

    source: Source
    index: int
    before: list[Operator]  # stateless operators below the redo queue (run once)
    after: list[Operator]  # from the redo queue's operator up (re-run on redo)
    time_column: str | None


@dataclass
class Pending:
    """A result computed inside a transaction, emitted once it commits."""

    row: Row | None
    reads: tuple[Read, ...]
    state: tuple[int, int]
    window: int
    lwm: int


__all__ = ["Branch", "Entry", "Pending", "RunStats"]
