"""The broadcast server: the database, update transactions and the cycles on the air.

Per object the server keeps two versions: the one on the air (the latest value
committed when the current cycle began) and the last written one (the newest
committed value, which update transactions read and overwrite).  A transaction's
uncommitted writes stay in its own workspace until commit.

Update transactions - the server's own (:meth:`Server.begin`) and clients'
submitted at commit (:meth:`Server.submit`) - are validated at commit: each
object read must not have been overwritten since it was read.  Every committed
update transaction is therefore equivalent to running alone at its commit, and
the update transactions are conflict-serializable in commit order, which is the
order in which the control information is updated.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from txstream.broadcast.algorithms import make_algorithm
from txstream.broadcast.base import (
    BroadcastError,
    Column,
    ControlAlgorithm,
    UnknownObjectError,
    ValidationFailed,
)
from txstream.broadcast.recorder import HistoryRecorder
from txstream.model import Operation


@dataclass(frozen=True)
class Broadcast:
    """What one cycle puts on the air: every object's value and the control information."""

    cycle: int
    values: tuple[Any, ...]
    control: Any
    algorithm: ControlAlgorithm

    def column(self, obj: int) -> Column:
        """The control information sent with object number ``obj``."""
        return self.algorithm.column(self.control, obj)


class Server:
    """A broadcast database of named objects (``ob1`` ... ``obN`` when given a count).

    Call :meth:`begin_cycle` to put cycle 1, 2, ... on the air; update
    transactions may commit at any time and count in the current cycle (cycle 0
    before the first broadcast).
    """

    def __init__(
        self,
        objects: int | Sequence[str],
        algorithm: str | ControlAlgorithm = "f-matrix",
        *,
        groups: int | None = None,
        initial: Any = 0,
        recorder: HistoryRecorder | None = None,
    ) -> None:
        if isinstance(objects, int):
            names = [f"ob{i}" for i in range(1, objects + 1)]
        else:
            names = list(objects)
        if len(set(names)) != len(names):
            raise BroadcastError("object names must be distinct")
        if not names:
            raise BroadcastError("the database needs at least one object")
        self.objects = names
        self.index = {name: i for i, name in enumerate(names)}
        n = len(names)
        if isinstance(algorithm, str):
            self.algorithm = make_algorithm(algorithm, n, groups)
        else:
            if algorithm.n != n:
                raise BroadcastError(f"the algorithm was built for {algorithm.n} objects, not {n}")
            self.algorithm = algorithm
        self.current: list[Any] = [initial] * n
        self.write_cycle = [0] * n
        self.version = [0] * n
        self.cycle = 0
        self.recorder = recorder
        self.on_air: Broadcast | None = None
        self.commits = 0
        self.aborts = 0
        self._next_txn = 0

    # -- names -----------------------------------------------------------------
    def obj(self, name: str) -> int:
        """The number of object ``name``; :class:`UnknownObjectError` if there is none."""
        try:
            return self.index[name]
        except KeyError:
            raise UnknownObjectError(name, self.objects) from None

    def new_txn_id(self) -> str:
        """A fresh transaction id for the history (server and clients share the sequence)."""
        self._next_txn += 1
        return str(self._next_txn)

    # -- cycles ----------------------------------------------------------------
    def begin_cycle(self) -> Broadcast:
        """Start the next cycle: freeze the committed values and the control information."""
        self.cycle += 1
        self.on_air = Broadcast(
            self.cycle, tuple(self.current), self.algorithm.snapshot(self.cycle), self.algorithm
        )
        return self.on_air

    def air(self) -> Broadcast:
        """The cycle on the air; an error before :meth:`begin_cycle` was first called."""
        if self.on_air is None:
            raise BroadcastError("nothing is on the air yet: call begin_cycle() first")
        return self.on_air

    # -- update transactions ---------------------------------------------------
    def begin(self) -> ServerTransaction:
        """Start one of the server's own update transactions."""
        return ServerTransaction(self, self.new_txn_id())

    def run(self, reads: Iterable[str], writes: Mapping[str, Any]) -> str:
        """Run a server transaction that reads ``reads`` and then writes ``writes``."""
        txn = self.begin()
        for name in reads:
            txn.read(name)
        for name, value in writes.items():
            txn.write(name, value)
        txn.commit()
        return txn.id

    def submit(self, txn: str, reads: Sequence[tuple[str, int]], writes: Mapping[str, Any]) -> None:
        """Commit a client's update transaction, or raise :class:`ValidationFailed`.

        ``reads`` are (object, cycle) pairs: the client read the value broadcast in
        that cycle.  The transaction commits iff none of those objects was
        overwritten by a commit in that cycle or later.
        """
        rs: list[int] = []
        for name, cycle in reads:
            j = self.obj(name)
            if not 1 <= cycle <= self.cycle:
                raise BroadcastError(
                    f"transaction {txn} claims to have read {name} in cycle {cycle}, but cycles "
                    f"1-{self.cycle} have been broadcast so far"
                )
            if self.write_cycle[j] >= cycle:
                self._end(txn, committed=False)
                raise ValidationFailed(
                    f"transaction {txn} read {name} in cycle {cycle}, but it was overwritten "
                    f"in cycle {self.write_cycle[j]}: restart the transaction"
                )
            rs.append(j)
        ws = {self.obj(name): value for name, value in writes.items()}
        self._install(txn, rs, ws)

    def _install(
        self,
        txn: str,
        reads: Sequence[int],
        writes: Mapping[int, Any],
        own_reads: Sequence[int] = (),
    ) -> None:
        """Install ``writes`` and update the control information.

        The history gets the writes here, then ``own_reads`` (reads of the
        transaction's own writes, which only now have a place after them).
        """
        cycle = self.cycle
        rec = self.recorder
        for j, value in writes.items():
            self.current[j] = value
            self.write_cycle[j] = cycle
            self.version[j] += 1
            if rec is not None:
                rec.server_op(Operation("w", txn, self.objects[j]), cycle)
        if rec is not None:
            for j in own_reads:
                rec.server_op(Operation("r", txn, self.objects[j]), cycle)
        self.algorithm.on_commit(reads, list(writes), cycle)
        self.commits += 1
        if rec is not None:
            rec.server_op(Operation("c", txn, None, cycle), cycle)

    def _end(self, txn: str, committed: bool) -> None:
        self.aborts += 0 if committed else 1
        if self.recorder is not None and not committed:
            self.recorder.server_op(Operation("a", txn), self.cycle)


class ServerTransaction:
    """An update transaction run at the server: reads see the last written values.

    Writes stay in the transaction until :meth:`commit`, which validates that
    nothing read has been overwritten meanwhile (then installs the writes and
    updates the control information) or aborts with :class:`ValidationFailed`.
    """

    def __init__(self, server: Server, txn_id: str) -> None:
        self.server = server
        self.id = txn_id
        self.read_versions: dict[int, int] = {}
        self.writes: dict[int, Any] = {}
        self.own_reads: list[int] = []
        self.done = False

    def read(self, name: str) -> Any:
        """The last written value of ``name`` (or this transaction's own write)."""
        self._active()
        s = self.server
        j = s.obj(name)
        if j in self.writes:
            self.own_reads.append(j)
            return self.writes[j]
        if s.recorder is not None:
            s.recorder.server_op(Operation("r", self.id, name), s.cycle)
        self.read_versions.setdefault(j, s.version[j])
        return s.current[j]

    def write(self, name: str, value: Any) -> None:
        """Write ``value`` into the transaction's workspace."""
        self._active()
        self.writes[self.server.obj(name)] = value

    def commit(self) -> None:
        """Validate and install, or abort with :class:`ValidationFailed`."""
        self._active()
        s = self.server
        self.done = True
        for j, seen in self.read_versions.items():
            if s.version[j] != seen:
                s._end(self.id, committed=False)
                raise ValidationFailed(
                    f"server transaction {self.id}: {s.objects[j]} was overwritten after it "
                    "was read; restart the transaction"
                )
        s._install(self.id, list(self.read_versions), self.writes, self.own_reads)

    def abort(self) -> None:
        """Drop the workspace."""
        self._active()
        self.done = True
        self.server._end(self.id, committed=False)

    def _active(self) -> None:
        if self.done:
            raise BroadcastError(f"transaction {self.id} has already ended")
