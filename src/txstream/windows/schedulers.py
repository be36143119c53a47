"""The schedulers, by name: ``serial``, ``ws``, ``lws``, ``ttu`` and the re-scan variants.

* ``serial`` - today's engines: a query locks the window, so a slide whose
  buffer is full waits until the running query commits; no aborts, and a
  snapshot query cannot suspend a running long query.
* ``ws`` - window-serializable: slides run at once; a query reads the window as
  of its start (expired sub-windows it still needs are retained), so it never
  aborts but its answer reflects none of the slides that ran during it.
* ``lws`` - Algorithm 1: slides run at once; a query reads its sub-windows in
  a fixed order (index order) and is aborted when a slide overwrites a
  sub-window it has already read (serialization graph testing with a bit array
  per query).
* ``ttu`` - Algorithm 2: as ``lws``, but a query always reads next the unread
  sub-window with the highest time-to-update (TTU, the number of slides until it
  is overwritten), so the sub-window about to expire is read last; optimal in
  aborts (Theorem 4).
* ``lws-rescan``, ``ttu-rescan`` - Section 4.2: expired sub-windows are kept
  while a query needs them; on a conflict the query re-scans the expired copy
  to remove its contribution and later reads the new copy, instead of aborting.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from txstream.errors import UnknownNameError
from txstream.windows.base import ConflictAction, Scheduler

if TYPE_CHECKING:
    from txstream.windows.engine import QueryTxn
    from txstream.windows.window import SlidingWindow


class _IndexOrder(Scheduler):
    """Reads in a fixed order: lowest sub-window index first (Algorithm 1's "next")."""

    def next_read(self, txn: QueryTxn, unread: Sequence[int], window: SlidingWindow) -> int:
        """The lowest unread index."""
        return min(unread)


class _TTUOrder(Scheduler):
    """Reads the unread sub-window with the highest time-to-update first (Algorithm 2)."""

    def next_read(self, txn: QueryTxn, unread: Sequence[int], window: SlidingWindow) -> int:
        """``argmax`` of TTU over the unread sub-windows."""
        return max(unread, key=window.ttu)


class Serial(_IndexOrder):
    """Queries lock the window; slides wait (no concurrency between them)."""

    name: ClassVar[str] = "serial"
    summary: ClassVar[str] = "queries lock the window: slides wait, no preemption"
    locks_window: ClassVar[bool] = True

    def on_conflict(self, txn: QueryTxn, index: int) -> ConflictAction:
        """Cannot happen: no slide runs while a query holds the window."""
        raise AssertionError("serial scheduler saw a slide during a scan")


class WindowSerializable(_IndexOrder):
    """Slides run at once; queries read the window as of their start."""

    name: ClassVar[str] = "ws"
    summary: ClassVar[str] = "window-serializable: queries read the window as of their start"
    reads_start_state: ClassVar[bool] = True
    guarantees: ClassVar[str] = "ws"

    def on_conflict(self, txn: QueryTxn, index: int) -> ConflictAction:
        """The query keeps reading its start state; nothing to do."""
        return "ignore"


class LatestWindow(_IndexOrder):
    """Algorithm 1: abort a query whose already-read sub-window is overwritten."""

    name: ClassVar[str] = "lws"
    summary: ClassVar[str] = "Algorithm 1: index-order reads, abort on an LWS conflict"

    def on_conflict(self, txn: QueryTxn, index: int) -> ConflictAction:
        """Abort (the query restarts)."""
        return "abort"


class TimeToUpdate(_TTUOrder):
    """Algorithm 2: highest-TTU-first reads, abort on an LWS conflict."""

    name: ClassVar[str] = "ttu"
    summary: ClassVar[str] = "Algorithm 2: read the highest time-to-update first"

    def on_conflict(self, txn: QueryTxn, index: int) -> ConflictAction:
        """Abort (rare: the sub-window about to expire is read last)."""
        return "abort"


class LatestWindowRescan(_IndexOrder):
    """Algorithm 1 with retained expired sub-windows: re-scan instead of aborting."""

    name: ClassVar[str] = "lws-rescan"
    summary: ClassVar[str] = "Algorithm 1, re-scanning expired copies instead of aborting"

    def on_conflict(self, txn: QueryTxn, index: int) -> ConflictAction:
        """Undo the expired copy's contribution, then read the new copy."""
        return "rescan"


class TimeToUpdateRescan(_TTUOrder):
    """Algorithm 2 with retained expired sub-windows (Section 4.2): minimal re-scans."""

    name: ClassVar[str] = "ttu-rescan"
    summary: ClassVar[str] = "Algorithm 2, re-scanning expired copies instead of aborting"

    def on_conflict(self, txn: QueryTxn, index: int) -> ConflictAction:
        """Undo the expired copy's contribution, then read the new copy."""
        return "rescan"


SCHEDULERS: dict[str, type[Scheduler]] = {
    cls.name: cls
    for cls in (
        Serial,
        WindowSerializable,
        LatestWindow,
        TimeToUpdate,
        LatestWindowRescan,
        TimeToUpdateRescan,
    )
}


def get_scheduler(name: str) -> Scheduler:
    """A scheduler instance by name; :class:`UnknownNameError` otherwise."""
    cls = SCHEDULERS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise UnknownNameError("scheduler", str(name), list(SCHEDULERS))
    return cls()
