"""The F-Matrix C of an update history, computed with the incremental rules.

Input is a history in the project notation whose update transactions carry
their commit cycles (``w1(ob1) w1(ob2) c1@1 r2(ob1) w2(ob1) c2@2``).  The
history is checked first, so that C is well defined:

* every committed update transaction has a commit cycle, and cycles never go
  backwards along the history;
* the committed update transactions are conflict-serializable;
* a transaction only reads from transactions that committed before it (the
  paper's server commits a transaction only after those it read from).

The transactions are then fed to :class:`~txstream.broadcast.algorithms.CMatrix`
in a conflict-equivalent serial order.  A transaction's read set holds the
objects it read from another transaction; a read after its own write depends on
nothing new.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from txstream.broadcast.algorithms import CMatrix
from txstream.broadcast.base import BroadcastError, UnknownObjectError
from txstream.model import History, conflict_graph


@dataclass
class CResult:
    """Objects in order and ``c[i][j]`` = C(objects[i], objects[j])."""

    objects: list[str]
    c: list[list[int]]

    def to_json(self) -> dict[str, object]:
        """``{"objects": [...], "C": [[...], ...]}``."""
        return {"objects": self.objects, "C": self.c}


def update_transactions(history: History) -> list[str]:
    """Committed transactions that write, in order of first appearance."""
    committed = history.committed()
    writers = {op.txn for op in history.operations if op.kind == "w"}
    return [t for t in history.transactions() if t in committed and t in writers]


MAX_CYCLE = 2**63 - 1
"""The largest commit cycle a C matrix holds (its entries are 64-bit integers)."""


def check_cycles(history: History) -> dict[str, int]:
    """Commit cycles of the update transactions; errors when missing or decreasing."""
    updates = set(update_transactions(history))
    last: tuple[str, int] | None = None
    cycles: dict[str, int] = {}
    for op in history.operations:
        if op.kind != "c":
            continue
        if op.cycle is None:
            if op.txn in updates:
                raise BroadcastError(
                    f"update transaction {op.txn} commits without a cycle: write c{op.txn}@K, "
                    "K being the broadcast cycle it committed in"
                )
            continue
        if op.cycle > MAX_CYCLE:  # the matrix holds cycles as 64-bit integers
            raise BroadcastError(
                f"cycle number of c{op.txn}@{op.cycle} is too large; the largest is {MAX_CYCLE}"
            )
        if last is not None and op.cycle < last[1]:
            raise BroadcastError(
                f"cycle numbers go backwards: c{op.txn}@{op.cycle} follows c{last[0]}@{last[1]}; "
                "commit cycles must not decrease along the history"
            )
        last = (op.txn, op.cycle)
        cycles[op.txn] = op.cycle
    return cycles


def serial_update_order(history: History) -> tuple[History, list[str]]:
    """The committed update sub-history and a conflict-equivalent serial order of it.

    Raises :class:`BroadcastError` when there is none, or when a transaction
    reads from one that commits after it.
    """
    keep = set(update_transactions(history))
    sub = History([op for op in history.operations if op.txn in keep])
    graph = conflict_graph(sub)
    order = graph.serial_order()
    if order is None:
        cycle = graph.cycle() or []
        raise BroadcastError(
            "the update transactions are not conflict-serializable (cycle "
            + " -> ".join([*cycle, *cycle[:1]])
            + "); C is defined only for a serializable update history"
        )
    commit_at = {op.txn: i for i, op in enumerate(sub.operations) if op.kind == "c"}
    last_writer: dict[str, str] = {}
    for op in sub.operations:
        if op.kind == "w" and op.item is not None:
            last_writer[op.item] = op.txn
        elif op.kind == "r" and op.item is not None:
            src = last_writer.get(op.item)
            if src is not None and src != op.txn and commit_at[src] > commit_at[op.txn]:
                raise BroadcastError(
                    f"transaction {op.txn} reads {op.item} from transaction {src}, which commits "
                    "after it; a transaction may only read from committed transactions"
                )
    return sub, order


def c_matrix(history: History, objects: Sequence[str] | None = None) -> CResult:
    """C for ``history``; ``objects`` (optional) declares the database's objects.

    Without ``objects`` the objects are those of the history in order of first
    appearance; with it, an access to any other object is an error.
    """
    seen = list(dict.fromkeys(op.item for op in history.operations if op.item is not None))
    if objects is not None:
        names = list(objects)
        known = set(names)
        for item in seen:
            if item not in known:
                raise UnknownObjectError(item, names)
    else:
        names = seen
    if not names:
        raise BroadcastError("the history accesses no object, so there is no C matrix")
    index = {name: i for i, name in enumerate(names)}
    cycles = check_cycles(history)
    sub, order = serial_update_order(history)
    per_txn: dict[str, tuple[list[int], list[int]]] = {t: ([], []) for t in order}
    for op in sub.operations:
        if op.item is None:
            continue
        rs, ws = per_txn[op.txn]
        j = index[op.item]
        if op.kind == "w":
            if j not in ws:
                ws.append(j)
        elif j not in ws and j not in rs:
            rs.append(j)
    matrix = CMatrix(len(names), ordered=False)
    for txn in order:
        rs, ws = per_txn[txn]
        matrix.commit(rs, ws, cycles[txn])
    return CResult(names, matrix.as_lists())
