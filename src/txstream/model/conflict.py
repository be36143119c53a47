"""The conflict graph of a history (serialization graph).

Nodes are committed transactions; an edge ``Ti -> Tj`` says some operation of
``Ti`` precedes a conflicting operation of ``Tj`` (same item, at least one a
write).  A history is conflict-serializable iff this graph is acyclic, and every
topological order of it is a conflict-equivalent serial order.

Building every conflicting pair costs O(n^2) on hot items.  We keep, per item,
only the last writer and the readers since that write, and add edges from those:
each added edge is a real conflict, and every other conflict is implied by a path
of added edges (the writes of an item are totally ordered), so the graph has the
same transitive closure, the same cycles and the same topological orders.  That
keeps construction linear in the history.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple

from txstream.model.graph import find_cycle, topological_order
from txstream.model.history import History, Operation


class Witness(NamedTuple):
    """Why an edge exists: the first pair of conflicting operations found."""

    first: Operation
    second: Operation

    @property
    def item(self) -> str:
        """The data item both operations access."""
        return self.first.item or ""

    def describe(self) -> str:
        """``w1(x) < r2(x)`` style text."""
        return f"{self.first} < {self.second}"


@dataclass
class ConflictGraph:
    """Transactions and the conflict edges between them, with a witness per edge."""

    nodes: list[str] = field(default_factory=list)
    succ: dict[str, dict[str, Witness]] = field(default_factory=dict)

    def add_edge(self, a: str, b: str, witness: Witness) -> None:
        """Add ``a -> b`` unless present (the first witness is kept)."""
        out = self.succ[a]
        if b not in out:
            out[b] = witness

    def edge_count(self) -> int:
        """Number of distinct edges."""
        return sum(len(out) for out in self.succ.values())

    def serial_order(self) -> list[str] | None:
        """A conflict-equivalent serial order, or ``None`` if there is none."""
        return topological_order(self.nodes, self.succ)

    def cycle(self) -> list[str] | None:
        """Transactions on one cycle, or ``None``."""
        return find_cycle(self.nodes, self.succ)


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while building large acyclic structures.

    Building a graph of a million edges allocates millions of small objects, none
    of them in reference cycles; the collector would rescan them again and again
    (it doubled the build time in the checker benchmark).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def conflict_graph(history: History, committed_only: bool = True) -> ConflictGraph:
    """The conflict graph of ``history``'s committed projection (or of all of it)."""
    with no_gc():
        return _build(history, committed_only)


def _build(history: History, committed_only: bool) -> ConflictGraph:
    keep = history.committed() if committed_only else None
    graph = ConflictGraph()
    succ = graph.succ
    nodes = graph.nodes
    # Per item: (last writing operation, {txn: first read of it since that write}).
    last_write: dict[str, Operation] = {}
    readers: dict[str, dict[str, Operation]] = {}
    # Tuple unpacking beats NamedTuple attribute access in this hot loop.
    for op in history.operations:
        kind, txn, item, _, _ = op
        if keep is not None and txn not in keep:
            continue
        out = succ.get(txn)
        if out is None:
            succ[txn] = {}
            nodes.append(txn)
        if item is None:
            continue
        w = last_write.get(item)
        if w is not None:
            wtxn = w[1]
            if wtxn != txn:
                wout = succ[wtxn]
                if txn not in wout:
                    wout[txn] = Witness(w, op)
        if kind == "r":
            rs = readers.get(item)
            if rs is None:
                readers[item] = {txn: op}
            elif txn not in rs:
                rs[txn] = op
        else:
            rs = readers.pop(item, None)
            if rs:
                for rtxn, rop in rs.items():
                    if rtxn != txn:
                        rout = succ[rtxn]
                        if txn not in rout:
                            rout[txn] = Witness(rop, op)
            last_write[item] = op
    return graph
