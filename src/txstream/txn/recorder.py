"""The history recorder: any run can write down its history in the project notation.

Operations are appended as they take effect, so the recorded order of two
conflicting operations is the order in which they really touched the item:

* a read is recorded when it reads;
* a write is recorded when it becomes visible to others - at once under
  ``none`` (dirty reads are possible), at commit under the other protocols
  (under SS2PL moving a write to its commit changes no conflict order, because
  the exclusive lock keeps everyone else off the item until then);
* a snapshot transaction's reads are recorded *at its snapshot point*: its
  begin reserves a slot in the sequence, and reads are put into that slot, so
  they appear after every commit the snapshot includes and before every later
  one.

Appends to a Python list are atomic, so threads record without a lock of
their own; the callers provide the ordering guarantees described above.
"""

from __future__ import annotations

from txstream.model.history import History, Operation


class HistoryRecorder:
    """Collects operations (and arrival orders) into a :class:`History`."""

    def __init__(self) -> None:
        self._chunks: list[Operation | list[Operation]] = []
        self.arrivals: dict[str, list[str]] = {}

    def op(self, op: Operation) -> None:
        """Record one operation at the current end of the history."""
        self._chunks.append(op)

    def slot(self) -> list[Operation]:
        """Reserve a place at the current end; operations added to it appear there."""
        slot: list[Operation] = []
        self._chunks.append(slot)
        return slot

    def arrival(self, stream: str, txn: str) -> None:
        """Declare that ``txn`` is next in the arrival order of ``stream``."""
        self.arrivals.setdefault(stream, []).append(txn)

    def __len__(self) -> int:
        return sum(len(c) if isinstance(c, list) else 1 for c in list(self._chunks))

    def history(self, committed_only: bool = False) -> History:
        """The recorded history (only the committed transactions if asked)."""
        ops: list[Operation] = []
        for chunk in list(self._chunks):
            if isinstance(chunk, list):
                ops.extend(chunk)
            else:
                ops.append(chunk)
        history = History(ops, {s: list(t) for s, t in self.arrivals.items()})
        return history.committed_projection() if committed_only else history

    def clear(self) -> None:
        """Forget everything recorded so far."""
        self._chunks.clear()
        self.arrivals.clear()
