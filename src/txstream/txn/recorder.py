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

**Arrival order.**  The ``arrival`` line is the *input* order, never the commit
order (which would make a CSAO check of the run circular): every transaction
gets a position when it begins (a retry keeps the position of the attempt it
repeats), and the line lists, position by position, the attempt that
committed.  :meth:`HistoryRecorder.settle` is told when a position is decided
(committed, or abandoned for good).  A position that stays undecided while
:data:`ARRIVAL_BACKLOG` later ones are decided is left out of the line (the
transaction is then unconstrained by it), so that one transaction left open
does not hold the line back forever.

**Retention.**  With a ``path`` the recorder appends the history to that file
in the notation, in batches of ``flush_every`` operations, each written with
one ``write`` and flushed to the operating system, so the file is always a
valid history (a killed process loses at most the last batch; a later run
appending to the same file starts a new history after a ``---`` line).  In
memory, at most ``limit`` operations are kept; older ones are spilled to an
anonymous temporary file, from which :meth:`HistoryRecorder.history` reads
them back.  Either way memory holds only the batch being gathered, except that
the reads of a snapshot transaction still running, and everything recorded
after them, stay in memory until it ends (they must be written at its
snapshot point).

Appends to a Python list are atomic, so threads record operations without a
lock of their own; the callers provide the ordering guarantees described
above.  Draining to the file and settling arrival positions take the
recorder's lock.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections import deque
from pathlib import Path
from typing import IO

from txstream.errors import TxStreamError
from txstream.model.history import History, Operation

DEFAULT_LIMIT = 500_000
"""Operations an in-memory recorder keeps before spilling the oldest to disk."""

DEFAULT_FLUSH_EVERY = 1024
"""Operations a file recorder gathers before appending them to its file."""

ARRIVAL_BACKLOG = 10_000
"""Later arrival positions decided while an earlier one stays open before the
recorder gives up on placing it."""

_PER_LINE = 16
_PIECE = 8192  # chunks formatted and written at a time


class Slot(list[Operation]):
    """The reads of one snapshot transaction, written where its snapshot was taken."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        super().__init__()
        self.done = False


class HistoryRecorder:
    """Collects operations (and the arrival order) into a :class:`History`.

    ``path``: append the history to this file (a directory gets ``history.txt``
    in it); ``None`` keeps it in memory, spilling beyond ``limit`` operations to
    a temporary file.  ``stream`` names the arrival order's stream.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        limit: int = DEFAULT_LIMIT,
        flush_every: int = DEFAULT_FLUSH_EVERY,
        stream: str = "events",
    ) -> None:
        for name, value in (("limit", limit), ("flush_every", flush_every)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TxStreamError(f"record {name} must be a positive integer, not {value!r}")
        self._chunks: list[Operation | Slot] = []
        self.arrivals: dict[str, list[str]] = {}
        """Arrival orders declared directly with :meth:`arrival`."""
        self.stream = stream
        self._lock = threading.Lock()
        self._file: IO[bytes] | None = None
        self._start = 0  # where this run's history starts in the file
        self.path: Path | None = None
        self.spilled = 0
        """Operations written to the file (or spilled to the temporary file)."""
        self.skipped = 0
        """Arrival positions left out of the arrival line (see the module doc)."""
        self._base = 0  # chunks drained from the front of ``_chunks``
        self._next = 0  # the first undecided arrival position
        self._decided: dict[int, str | None] = {}
        self._order: list[str] = []  # in memory: the committed arrivals in order
        self._ready: deque[tuple[int, str]] = deque()  # to write once their commit is
        if path is not None:
            self._open(Path(path))
            self._high = flush_every
        else:
            self._high = limit

    # -- recording -------------------------------------------------------------------

    def op(self, op: Operation) -> None:
        """Record one operation at the current end of the history."""
        chunks = self._chunks
        chunks.append(op)
        if len(chunks) >= self._high:
            self.drain()

    def slot(self) -> Slot:
        """Reserve a place at the current end; operations added to it appear there.

        Set ``done`` on it when its transaction ends, so it can be written out.
        """
        slot = Slot()
        self._chunks.append(slot)
        return slot

    def arrival(self, stream: str, txn: str) -> None:
        """Declare that ``txn`` is next in the arrival order of ``stream`` (in memory)."""
        self.arrivals.setdefault(stream, []).append(txn)

    def settle(self, position: int, txn: str | None) -> None:
        """Arrival ``position`` is decided: ``txn`` committed it (``None``: nobody will)."""
        with self._lock:
            if position < self._next:
                # Given up on earlier (ARRIVAL_BACKLOG) or settled twice.
                if txn is not None:
                    self.skipped += 1
                return
            decided = self._decided
            decided[position] = txn
            if position != self._next:
                if len(decided) <= ARRIVAL_BACKLOG:
                    return
                # The first open position has waited too long: leave it out.
                self.skipped += min(decided) - self._next
                self._next = min(decided)
            mark = self._base + len(self._chunks)
            while self._next in decided:
                hid = decided.pop(self._next)
                self._next += 1
                if hid is not None:
                    if self._file is not None or self.path is not None:
                        self._ready.append((mark, hid))
                    else:
                        self._order.append(hid)

    # -- retention ---------------------------------------------------------------------

    def _open(self, path: Path) -> None:
        if path.is_dir():
            path = path / "history.txt"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fh = path.open("ab", buffering=0)
            fh.seek(0, os.SEEK_END)
        except OSError as exc:
            raise TxStreamError(f"cannot record the history to {path}: {exc}") from None
        self.path = path
        if fh.tell() > 0:
            self._write(fh, "---\n")
        self._start = fh.tell()
        self._file = fh

    def drain(self) -> None:
        """Write every finished operation recorded so far to the file (or spill it)."""
        with self._lock:
            self._drain()

    def _drain(self) -> None:
        chunks = self._chunks
        n = len(chunks)
        k = 0
        while k < n:
            chunk = chunks[k]
            if chunk.__class__ is Slot and not chunk.done:
                break
            k += 1
        if k == 0 and not self._ready:
            return
        fh = self._file
        if fh is None and self.path is not None:
            # Recording after close(): append to the same history.
            fh = self._file = self.path.open("ab", buffering=0)
        elif fh is None:
            # In memory: spill to an anonymous temporary file, read back by history().
            fh = self._file = tempfile.TemporaryFile("w+b", buffering=0)  # noqa: SIM115
            # Committed arrivals so far follow the operations they name to the file.
            mark = self._base + n
            self._ready.extend((mark, hid) for hid in self._order)
            self._order.clear()
        # Pieces of whole lines, each one write: the file never ends inside a line,
        # and a large drain needs little memory beyond the operations themselves.
        for lo in range(0, k, _PIECE):
            words: list[str] = []
            for chunk in chunks[lo : min(k, lo + _PIECE)]:
                if chunk.__class__ is Slot:
                    words.extend(str(op) for op in chunk)
                else:
                    words.append(str(chunk))
            self.spilled += len(words)
            self._write(
                fh,
                "".join(
                    " ".join(words[i : i + _PER_LINE]) + "\n"
                    for i in range(0, len(words), _PER_LINE)
                ),
            )
        del chunks[:k]
        self._base += k
        ready = self._ready
        arrivals: list[str] = []
        while ready and ready[0][0] <= self._base:
            arrivals.append(ready.popleft()[1])
        if arrivals:
            self._write(fh, f"arrival {self.stream}: {' '.join(arrivals)}\n")

    def _write(self, fh: IO[bytes], text: str) -> None:
        """Append ``text`` with unbuffered writes (the OS has it when this returns)."""
        data = memoryview(text.encode())
        try:
            while data:
                written = fh.write(data)
                data = data[written or 0 :]
        except OSError as exc:
            raise TxStreamError(f"cannot record the history to {self.path}: {exc}") from None

    def close(self) -> None:
        """Write everything (snapshot transactions still running included) and close."""
        with self._lock:
            if self._file is None or self.path is None:
                return
            for chunk in self._chunks:
                if chunk.__class__ is Slot:
                    chunk.done = True
            self._drain()
            self._file.close()
            self._file = None

    def __len__(self) -> int:
        with self._lock:
            held = sum(len(c) if c.__class__ is Slot else 1 for c in list(self._chunks))
            return self.spilled + held

    # -- reading back ----------------------------------------------------------------

    def history(self, committed_only: bool = False) -> History:
        """The recorded history (only the committed transactions if asked)."""
        from txstream.model.notation import parse

        with self._lock:
            ops: list[Operation] = []
            arrivals: list[str] = []
            fh = self._file
            data = b""
            if self.path is not None:
                with self.path.open("rb") as reader:
                    reader.seek(self._start)
                    data = reader.read()
            elif fh is not None:
                fh.seek(0)
                data = fh.read()
                fh.seek(0, os.SEEK_END)
            text = data.decode()
            if text.strip():
                (done,) = parse(text, str(self.path or "spilled history"))
                ops = done.operations
                arrivals = done.arrivals.get(self.stream, [])
            for chunk in list(self._chunks):
                if isinstance(chunk, Slot):
                    ops.extend(chunk)
                else:
                    ops.append(chunk)
            arrivals.extend(self._order)
            arrivals.extend(hid for _, hid in self._ready)
            arrivals.extend(h for _, h in sorted(self._decided.items()) if h is not None)
        declared = {s: list(t) for s, t in self.arrivals.items()}
        if arrivals:
            declared.setdefault(self.stream, [])
            declared[self.stream] = arrivals + declared[self.stream]
        history = History(ops, declared)
        return history.committed_projection() if committed_only else history

    def clear(self) -> None:
        """Forget everything recorded in memory so far (the file keeps what it has)."""
        with self._lock:
            self._chunks.clear()
            self.arrivals.clear()
            self._order.clear()
            self._ready.clear()
            self._decided.clear()
