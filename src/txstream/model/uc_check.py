"""Update consistency (uc) decided by APPROX.

Source: Shanmugasundaram, Nithrakashyap, Sivasankaran and Ramamritham,
*Efficient Concurrency Control for Broadcast Environments* (SIGMOD 1999),
Sections 2.3 and 3.1.  Update consistency asks for less than serializability:
the update transactions must be serializable among themselves, and each
read-only transaction must be serializable together with just the update
transactions whose values it saw, directly or through other transactions.
Two read-only transactions may therefore see the update transactions in
different orders, as long as each one sees a consistent state.  Deciding update
consistency exactly is NP-complete, so the paper uses a polynomial
approximation, APPROX, which accepts only update consistent histories (and
accepts every conflict-serializable one).  The checker decides APPROX.

Definitions, on the committed projection of the history (as every criterion of
the project):

* ``t`` *reads from* ``t'`` when some read of ``t`` on item ``x`` returns the
  value written by ``t'``: the last write of ``x`` before that read is by
  ``t' != t``.  A read that sees the transaction's own write, or no write at all
  (the initial value), reads from nobody.
* ``LIVE(t)`` is the smallest set that contains ``t`` and, with any member,
  every transaction that member reads from: ``t`` and everything it reads from,
  directly or transitively.
* The *update transactions* are the committed transactions with at least one
  write; the others are *read-only*.

APPROX holds iff

1. the update sub-history (the operations of the update transactions) is
   conflict-serializable, and
2. for every read-only transaction ``t``, the serialization graph of the history
   restricted to the transactions of ``LIVE(t)`` is acyclic.

How condition 2 is decided without a graph per read-only transaction.  Every
member of ``LIVE(t)`` other than ``t`` was read from, so it is an update
transaction, and it reaches ``t`` inside ``LIVE(t)`` along its chain of
reads-from edges (a write followed by a read of the written value is a
conflict).  Once condition 1 holds, the graph on the update members is acyclic,
so a cycle of ``LIVE(t)`` must pass through ``t``; and since every member
reaches ``t``, there is one iff ``t`` has an edge to some member ``u``.  As
``t`` only reads, that edge means: ``u`` writes an item after ``t`` read it.
So condition 2 fails for ``t`` iff some member of ``LIVE(t)`` overwrites an
item after ``t`` read it (the F-Matrix read-condition of the paper's
Section 3.2, stated on the whole history), and when it holds ``t`` can be
serialized after the members of its ``LIVE`` set.

The ``LIVE`` sets are bitsets (Python ints) over the update transactions,
indexed by their position in a serial order ``S`` of the update sub-history;
each update transaction's set is built once, from those of the transactions
it reads from, which come earlier in ``S``, and dropped once its last reader
has used it.  The writers of an item then also follow ``S`` in the order of
their writes, so for each item a read-only transaction read only the writers
after that read and up to its highest ``LIVE`` member need a look.  When
there are more than :data:`WALK_LIMIT` of those, they are not looked at one by
one (a history where many read-only transactions read an item before many
overwrites was quadratic): the item keeps a bitset of its writers, built on
first need, and one ``and`` with the ``LIVE`` set answers.

Evidence, besides the counts: when condition 1 fails, ``update_cycle`` (a cycle
of update transactions; condition 2 is then not examined).  Otherwise
``serial_order`` is a serial order ``S`` of the update transactions and, when
APPROX holds, ``live_orders`` maps each read-only transaction ``t`` to a serial
order of ``LIVE(t)``: its update members in the order of ``S``, then ``t``
(replaced by ``live_sizes`` when the lists would exceed
:data:`MAX_ORDER_ENTRIES` entries).  When condition 2 fails, ``violations``
describes the first :data:`MAX_VIOLATIONS` violating read-only transactions
(their ``LIVE`` set and a cycle ``t -> u -> ... -> t`` whose first edge is the
overwritten read) and ``violating_transactions`` counts them all.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Any

from txstream.model.check import (
    CheckOptions,
    Verdict,
    cycle_evidence,
    edge_evidence,
    register,
)
from txstream.model.conflict import Witness, conflict_graph
from txstream.model.history import History, Operation

MAX_VIOLATIONS = 10
"""Violations described in full; the rest are only counted."""
MAX_LIVE_LISTED = 50
"""Members of a violating transaction's ``LIVE`` set listed in its evidence."""
MAX_ORDER_ENTRIES = 10_000
"""Total length of the per-read-only-transaction orders before they are left out."""
WALK_LIMIT = 32
"""Writers of an item looked at one by one for a read; more are tested as a bitset."""


class _Writers:
    """The committed writes of one item, grouped by writer in history order.

    Under condition 1 each writer's writes of an item are contiguous among the
    writers (interleaving them would be a cycle), so the groups follow ``S``:
    ``indexes`` increases.
    """

    __slots__ = ("_mask", "indexes", "ops", "positions", "txns")

    def __init__(self) -> None:
        self.positions: list[int] = []
        """Position of each group's last write."""
        self.txns: list[str] = []
        self.indexes: list[int] = []
        """Each group's writer's position in ``S``."""
        self.ops: list[Operation] = []
        """Each group's last write."""
        self._mask: int | None = None

    def add(self, position: int, op: Operation, index: int) -> None:
        if self.txns and self.txns[-1] == op.txn:
            self.positions[-1] = position
            self.ops[-1] = op
        else:
            self.positions.append(position)
            self.txns.append(op.txn)
            self.indexes.append(index)
            self.ops.append(op)

    def mask(self) -> int:
        """The writers as a bitset over ``S`` (built once, on first need)."""
        if self._mask is None:
            # Set in a byte array: or-ing one bit at a time into an int copies it each time.
            buf = bytearray(self.indexes[-1] // 8 + 1)
            for j in self.indexes:
                buf[j >> 3] |= 1 << (j & 7)
            self._mask = int.from_bytes(buf, "little")
        return self._mask


def _members(bits: int, order: list[str], limit: int | None = None) -> list[str]:
    """The transactions whose bits are set, in ``order``; at most ``limit`` of them."""
    found: list[str] = []
    digits = bin(bits)[:1:-1]  # least significant bit first
    j = digits.find("1")
    while j >= 0 and (limit is None or len(found) < limit):
        found.append(order[j])
        j = digits.find("1", j + 1)
    return found


@register("uc", "update consistency decided by APPROX (Shanmugasundaram et al., SIGMOD 1999)")
def check_uc(history: History, options: CheckOptions) -> Verdict:
    """APPROX: a serializable update sub-history and an acyclic graph per ``LIVE(t)``."""
    ops = history.operations
    committed = history.committed()
    update = {op.txn for op in ops if op.kind == "w" and op.txn in committed}
    everyone = history.transactions()
    read_only = [t for t in everyone if t in committed and t not in update]
    evidence: dict[str, Any] = {
        "operations": len(ops),
        "transactions": len(everyone),
        "committed": len(committed),
        "update_transactions": len(update),
        "read_only_transactions": len(read_only),
    }

    # Condition 1: the update sub-history is conflict-serializable.
    graph = conflict_graph(History([op for op in ops if op.txn in update]))
    order = graph.serial_order()
    if order is None:
        return Verdict("uc", False, {**evidence, "update_cycle": cycle_evidence(graph)})

    index = {u: i for i, u in enumerate(order)}
    # Reads-from, first reads of read-only transactions, writers per item.
    sources: dict[str, dict[str, Witness]] = {}
    first_reads: dict[str, dict[str, tuple[int, Operation]]] = {}
    writers: dict[str, _Writers] = {}
    last_write: dict[str, Operation] = {}
    for position, op in enumerate(ops):
        kind, txn, item = op[0], op[1], op[2]
        if item is None or txn not in committed:
            continue
        if kind == "r":
            w = last_write.get(item)
            if w is not None and w[1] != txn:
                srcs = sources.get(txn)
                if srcs is None:
                    sources[txn] = {w[1]: Witness(w, op)}
                elif w[1] not in srcs:
                    srcs[w[1]] = Witness(w, op)
            if txn not in update:
                reads = first_reads.get(txn)
                if reads is None:
                    first_reads[txn] = {item: (position, op)}
                elif item not in reads:
                    reads[item] = (position, op)
        else:
            last_write[item] = op
            group = writers.get(item)
            if group is None:
                group = writers[item] = _Writers()
            group.add(position, op, index[txn])

    readers_left: dict[str, int] = dict.fromkeys(order, 0)
    for srcs in sources.values():
        for s in srcs:
            readers_left[s] += 1
    # A read-only transaction is examined right after its last source in S.
    due: dict[int, list[str]] = {}
    for t in read_only:
        srcs = sources.get(t)
        due.setdefault(max(index[s] for s in srcs) if srcs else -1, []).append(t)

    live_of: dict[str, int] = {}

    def live_from(srcs: dict[str, Witness] | None, bits: int) -> int:
        for s in srcs or ():
            bits |= live_of[s]
            readers_left[s] -= 1
            if readers_left[s] == 0:
                del live_of[s]
        return bits

    violations: list[dict[str, Any]] = []
    violating = 0
    orders: dict[str, list[str]] | None = {}
    budget = MAX_ORDER_ENTRIES
    live_sizes: dict[str, int] = {}

    def examine(t: str) -> None:
        nonlocal violating, orders, budget
        live = live_from(sources.get(t), 0)
        found = _overwritten_read(t, live)
        if found is None:
            live_sizes[t] = live.bit_count() + 1
            budget -= live_sizes[t]
            if budget < 0:
                orders = None  # too long to list: only the sizes are given
            elif orders is not None:
                orders[t] = [*_members(live, order), t]
            return
        violating += 1
        if len(violations) < MAX_VIOLATIONS:
            violations.append(_violation(t, live, found))

    def _overwritten_read(t: str, live: int) -> tuple[Operation, Operation] | None:
        """A read of ``t`` and a later write of its item by a member of ``LIVE(t)``."""
        if not live:
            return None
        top = live.bit_length() - 1
        for item, (position, rop) in first_reads.get(t, {}).items():
            group = writers.get(item)
            if group is None:
                continue
            # Groups k .. end-1 overwrote the read and are not after LIVE's last member.
            k = bisect_right(group.positions, position)
            end = bisect_right(group.indexes, top, k)
            if end - k > WALK_LIMIT:
                hits = (live & group.mask()) >> group.indexes[k]
                if hits:
                    j = group.indexes[k] + (hits & -hits).bit_length() - 1
                    return rop, group.ops[bisect_left(group.indexes, j, k, end)]
                continue
            for m in range(k, end):
                if live >> group.indexes[m] & 1:
                    return rop, group.ops[m]
        return None

    def _violation(t: str, live: int, found: tuple[Operation, Operation]) -> dict[str, Any]:
        rop, wop = found
        u = wop.txn
        # The reads-from chain from u back to t closes the cycle t -> u -> ... -> t.
        parent: dict[str, str] = {t: t}
        frontier = [t]
        while u not in parent:
            nxt: list[str] = []
            for n in frontier:
                for s in sources.get(n, {}):
                    if s not in parent:
                        parent[s] = n
                        nxt.append(s)
            assert nxt, "every member of LIVE(t) reaches t by reads-from"
            frontier = nxt
        edges = [edge_evidence(t, u, Witness(rop, wop))]
        n = u
        while n != t:
            p = parent[n]
            edges.append(edge_evidence(n, p, sources[p][n]))
            n = p
        size = live.bit_count() + 1
        entry: dict[str, Any] = {
            "txn": t,
            "live": [t, *_members(live, order, MAX_LIVE_LISTED - 1)],
            "cycle": edges,
        }
        if size > MAX_LIVE_LISTED:
            entry["live_size"] = size
        return entry

    for t in due.get(-1, ()):
        examine(t)
    for i, u in enumerate(order):
        bits = live_from(sources.get(u), 1 << i)
        if readers_left[u]:
            live_of[u] = bits
        for t in due.get(i, ()):
            examine(t)

    if violating:
        return Verdict(
            "uc",
            False,
            {
                **evidence,
                "serial_order": order,
                "violating_transactions": violating,
                "violations": violations,
            },
        )
    if orders is not None:
        return Verdict("uc", True, {**evidence, "serial_order": order, "live_orders": orders})
    return Verdict("uc", True, {**evidence, "serial_order": order, "live_sizes": live_sizes})
