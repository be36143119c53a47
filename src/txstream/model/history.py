"""Operations, transactions and histories of the unified transactional model.

A *history* is the interleaved sequence of operations that a run performed:
reads ``r`` and writes ``w`` on data items, and the terminal operations commit
``c`` and abort ``a`` (EDBT 2012, Definitions 1-2; Weikum & Vossen).  Streams,
tables, sub-windows and broadcast objects are all just *data items* here: an event
arriving on stream ``S`` is the write ``w(S)``, a continuous-query execution is a
read of its inputs followed by writes on its outputs.

The *committed projection* keeps only the operations of committed transactions;
every correctness criterion of the project is decided on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple


class Kind(StrEnum):
    """The four kinds of operation."""

    READ = "r"
    WRITE = "w"
    COMMIT = "c"
    ABORT = "a"


class Operation(NamedTuple):
    """One operation of a history.

    ``item`` is ``None`` for commit and abort.  ``cycle`` is the broadcast cycle a
    commit happened in (``c1@3``), else ``None``.  ``bracket`` only remembers
    whether the item was written ``w1[x]`` rather than ``w1(x)``, so that printing
    a parsed history gives back what was read.
    """

    kind: str
    txn: str
    item: str | None = None
    cycle: int | None = None
    bracket: bool = False

    @property
    def is_access(self) -> bool:
        """True for reads and writes, the operations that touch a data item."""
        return self.kind == "r" or self.kind == "w"

    def conflicts_with(self, other: Operation) -> bool:
        """Two accesses conflict when they touch one item and one of them writes.

        Operations of one transaction never conflict with each other here: the
        conflict relation of a history is between distinct transactions.
        """
        return (
            self.txn != other.txn
            and self.item is not None
            and self.item == other.item
            and (self.kind == "w" or other.kind == "w")
        )

    def __str__(self) -> str:
        if self.item is None:
            suffix = f"@{self.cycle}" if self.cycle is not None else ""
            return f"{self.kind}{self.txn}{suffix}"
        if self.bracket:
            return f"{self.kind}{self.txn}[{self.item}]"
        return f"{self.kind}{self.txn}({self.item})"


def read(txn: str | int, item: str | int) -> Operation:
    """Build ``r<txn>(<item>)``."""
    return Operation("r", str(txn), str(item))


def write(txn: str | int, item: str | int) -> Operation:
    """Build ``w<txn>(<item>)``."""
    return Operation("w", str(txn), str(item))


def commit(txn: str | int, cycle: int | None = None) -> Operation:
    """Build ``c<txn>`` (``c<txn>@<cycle>`` with a broadcast cycle)."""
    return Operation("c", str(txn), None, cycle)


def abort(txn: str | int) -> Operation:
    """Build ``a<txn>``."""
    return Operation("a", str(txn))


class HistoryInvariantError(ValueError):
    """A history breaks an invariant; says which operation (or arrival entry) does."""

    def __init__(self, message: str, position: int | None = None, arrival: str | None = None):
        super().__init__(message)
        self.position = position  # index of the offending operation
        self.arrival = arrival  # transaction named by the offending arrival entry


@dataclass
class History:
    """An interleaved sequence of operations plus declared arrival orders.

    ``arrivals`` maps a stream name to the transactions that events arriving on
    that stream generated, in arrival order (the ``arrival S: 1 2 3`` line of the
    notation); CSAO requires a serial order that respects every such list.

    Invariants (checked by :meth:`validate`, which the parser calls): a
    transaction ends at most once, with either a commit or an abort, and has no
    operation after its end.
    """

    operations: list[Operation] = field(default_factory=list)
    arrivals: dict[str, list[str]] = field(default_factory=dict)
    meta: dict[str, str] = field(default_factory=dict)
    """Annotations from the text: ``title`` (its first comment line), and the
    directives ``# expect: cs=true ...`` and ``# subwindows: N``."""

    def __iter__(self) -> Iterator[Operation]:
        return iter(self.operations)

    def __len__(self) -> int:
        return len(self.operations)

    def append(self, op: Operation) -> None:
        """Add one operation at the end (used by recorders)."""
        self.operations.append(op)

    def transactions(self) -> list[str]:
        """Transaction ids in order of first appearance."""
        return list(dict.fromkeys(op.txn for op in self.operations))

    def outcomes(self) -> dict[str, str]:
        """Map each ended transaction to ``"c"`` or ``"a"``; active ones are absent."""
        return {op.txn: op.kind for op in self.operations if op.kind == "c" or op.kind == "a"}

    def committed(self) -> set[str]:
        """Ids of the committed transactions."""
        return {op.txn for op in self.operations if op.kind == "c"}

    def commit_cycles(self) -> dict[str, int]:
        """Broadcast cycle of every commit that recorded one (``c1@3``)."""
        return {
            op.txn: op.cycle for op in self.operations if op.kind == "c" and op.cycle is not None
        }

    def committed_projection(self) -> History:
        """The history restricted to committed transactions (arrivals too)."""
        keep = self.committed()
        return History(
            [op for op in self.operations if op.txn in keep],
            {s: [t for t in ts if t in keep] for s, ts in self.arrivals.items()},
        )

    def of(self, txn: str) -> list[Operation]:
        """The operations of one transaction, in history order."""
        return [op for op in self.operations if op.txn == txn]

    def validate(self) -> None:
        """Raise :class:`HistoryInvariantError` naming the first operation breaking an invariant."""
        ended: dict[str, Operation] = {}
        for position, op in enumerate(self.operations):
            end = ended.get(op.txn)
            if end is not None:
                raise HistoryInvariantError(
                    f"operation {position + 1} ({op}) comes after {end}, which already "
                    f"ended transaction {op.txn}",
                    position=position,
                )
            if op.kind == "c" or op.kind == "a":
                ended[op.txn] = op
        present = set(ended) | {op.txn for op in self.operations}
        for stream, txns in self.arrivals.items():
            for txn in txns:
                if txn not in present:
                    raise HistoryInvariantError(
                        f"arrival order of stream {stream} names transaction {txn}, "
                        "which has no operation in the history",
                        arrival=txn,
                    )
            # A set, not list.count per entry: that was quadratic in the arrivals.
            seen: set[str] = set()
            twice: list[str] = []
            for txn in txns:
                if txn in seen:
                    twice.append(txn)
                seen.add(txn)
            if twice:
                raise HistoryInvariantError(
                    f"arrival order of stream {stream} names transaction {twice[0]} twice",
                    arrival=twice[0],
                )

    @classmethod
    def of_operations(
        cls, ops: Iterable[Operation], arrivals: dict[str, list[str]] | None = None
    ) -> History:
        """Build a history from operations, copying them into a fresh list."""
        return cls(list(ops), dict(arrivals or {}))
