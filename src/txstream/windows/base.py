"""The contract of the sliding-window engine: errors, tuples, the scheduler interface.

Golab et al. (Section 2.3) model a periodically sliding window of ``n``
sub-windows with two kinds of transaction:

* a **window update** (slide) ``T_j = {w_j[j mod n]}``: write-only, executed as
  soon as its buffer is full, replacing the oldest sub-window;
* a **query execution** ``T_Qk``: read-only, reading each sub-window it needs
  exactly once (one execution of a group of long-running queries, or a snapshot
  query).

A :class:`Scheduler` decides, for the engine that runs the paper's Algorithm
loop (:class:`txstream.windows.engine.WindowEngine`), three things:

1. whether a running query *locks* the window (slides wait for it: ``serial``);
2. which of a query's unread sub-windows it reads next (:meth:`Scheduler.next_read`);
3. what happens when a slide overwrites a sub-window that a running query has
   already read (:meth:`Scheduler.on_conflict`): abort the query (Algorithm 1 and
   2), re-scan the expired copy and read the new one (the variant of Section 4.2),
   or nothing, because the query reads the window as of its start (``ws``).

Call order per query: the engine calls ``next_read`` before every read; it
calls ``on_conflict`` right after a slide commits, for each running query whose
bit ``B[j mod n]`` is set.  Schedulers keep no state of their own: everything
lives in the engine's transactions, so one instance can serve many engines.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from txstream.errors import TxStreamError

if TYPE_CHECKING:
    from txstream.windows.engine import QueryTxn
    from txstream.windows.window import SlidingWindow

Row = tuple[Any, ...]
"""A stream tuple; its fields are named by the window's ``fields``."""

PACKET_FIELDS: tuple[str, ...] = ("ts", "src", "dst", "size")
"""The simulated IP packet header of Section 5: arrival time, addresses, bytes."""

ConflictAction = Literal["abort", "rescan", "ignore"]


class WindowError(TxStreamError, ValueError):
    """A window, query or scheduler setting is invalid (n < 2, t <= 0, ...)."""


class Scheduler(ABC):
    """How queries and window slides interleave; one subclass per scheduler name."""

    name: ClassVar[str]
    summary: ClassVar[str]
    locks_window: ClassVar[bool] = False
    """A running query holds the window: slides wait until it commits (``serial``)."""
    reads_start_state: ClassVar[bool] = False
    """Queries read the window as of their start from retained copies (``ws``)."""
    guarantees: ClassVar[str] = "lws"
    """The strongest criterion its committed histories satisfy (``ws`` or ``lws``)."""

    @abstractmethod
    def next_read(self, txn: QueryTxn, unread: Sequence[int], window: SlidingWindow) -> int:
        """The sub-window ``txn`` reads next, one of ``unread`` (never empty)."""

    @abstractmethod
    def on_conflict(self, txn: QueryTxn, index: int) -> ConflictAction:
        """A slide overwrote sub-window ``index``, which ``txn`` has already read."""
