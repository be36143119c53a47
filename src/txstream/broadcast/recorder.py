"""Record a broadcast run as a history in the project notation (``c1@3``).

A client reads the value that was committed when the cycle *began*, although it
reads it some time later.  So that the history says what really happened, the
recorder keeps two lists per cycle k: the reads of cycle k's broadcast (and the
ends of read-only transactions during cycle k), then the server's operations
during cycle k.  The history is the concatenation over cycles: a read of cycle
k's value follows every write committed before cycle k and precedes every write
committed in cycle k or later, exactly the writes it did and did not see.
Update transactions' writes are recorded when they are installed, right before
their commit.
"""

from __future__ import annotations

from collections import defaultdict

from txstream.model import History, Operation


class HistoryRecorder:
    """Collects operations by cycle; :meth:`history` assembles them."""

    def __init__(self) -> None:
        self._air: defaultdict[int, list[Operation]] = defaultdict(list)
        self._server: defaultdict[int, list[Operation]] = defaultdict(list)

    def air_read(self, txn: str, obj: str, cycle: int) -> None:
        """``txn`` read the value of ``obj`` broadcast in ``cycle``."""
        self._air[cycle].append(Operation("r", txn, obj))

    def client_end(self, txn: str, committed: bool, cycle: int) -> None:
        """A read-only transaction committed (``c@cycle``) or aborted during ``cycle``."""
        op = Operation("c", txn, None, cycle) if committed else Operation("a", txn)
        self._air[cycle].append(op)

    def server_op(self, op: Operation, cycle: int) -> None:
        """An operation the server performed (or installed) during ``cycle``."""
        self._server[cycle].append(op)

    def history(self) -> History:
        """The run so far as one history."""
        ops: list[Operation] = []
        for cycle in sorted(set(self._air) | set(self._server)):
            ops.extend(self._air.get(cycle, ()))
            ops.extend(self._server.get(cycle, ()))
        return History(ops)
