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

from dataclasses import dataclass, field

from txstream.model.graph import find_cycle, topological_order
from txstream.model.history import History, Operation


@dataclass(frozen=True)
class Witness:
    """Why an edge exists: the first pair of conflicting operations found."""

    item: str
    first: Operation
    second: Operation

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


def conflict_graph(history: History, committed_only: bool = True) -> ConflictGraph:
    """The conflict graph of ``history``'s committed projection (or of all of it)."""
    keep = history.committed() if committed_only else None
    graph = ConflictGraph()
    succ = graph.succ
    nodes = graph.nodes
    # Per item: (last writing operation, {txn: first read of it since that write}).
    last_write: dict[str, Operation] = {}
    readers: dict[str, dict[str, Operation]] = {}
    for op in history.operations:
        txn = op.txn
        if keep is not None and txn not in keep:
            continue
        if txn not in succ:
            succ[txn] = {}
            nodes.append(txn)
        item = op.item
        if item is None:
            continue
        w = last_write.get(item)
        if op.kind == "r":
            if w is not None and w.txn != txn and txn not in succ[w.txn]:
                succ[w.txn][txn] = Witness(item, w, op)
            rs = readers.get(item)
            if rs is None:
                readers[item] = {txn: op}
            elif txn not in rs:
                rs[txn] = op
        else:
            if w is not None and w.txn != txn and txn not in succ[w.txn]:
                succ[w.txn][txn] = Witness(item, w, op)
            rs = readers.pop(item, None)
            if rs:
                for rtxn, rop in rs.items():
                    if rtxn != txn and txn not in succ[rtxn]:
                        succ[rtxn][txn] = Witness(item, rop, op)
            last_write[item] = op
    return graph
