"""A keyed, multi-version table.

A :class:`Table` keeps two views of its rows:

* the *current* row of each key - what transactions that write in place
  (``ss2pl``, ``none``) change directly; it may hold uncommitted values, which
  the transaction manager's locks keep others from seeing;
* a *version chain* of committed values per key, each tagged with the commit
  timestamp that made it visible, so a reader can see the table as of any
  timestamp (a snapshot) without locks.

Mutators return an *undo record*: the inverse operation that takes the current
row back to what it was (an insert is undone by a delete, an increment by ``d``
by an increment by ``-d``, an update or delete by restoring the old row).  The
transaction manager keeps these records in its undo log and runs them, newest
first, when a transaction aborts.

The table itself does no locking; it is safe for the access patterns the
transaction manager guarantees (one writer per key at a time, readers of
versions concurrent with writers).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Hashable, Iterator, Sequence
from operator import itemgetter
from typing import Any

from txstream.storage.base import (
    ABSENT,
    DuplicateKeyError,
    MissingRowError,
    StorageError,
    check_name,
    item_name,
)

_version_ts = itemgetter(0)

Undo = tuple[Any, ...]
"""An inverse operation: ``("delete", key)``, ``("restore", key, row)`` or
``("increment", key, delta, field)``; run it with :meth:`Table.undo`."""


class Table:
    """Keyed rows with insert, delete, update, increment and snapshot reads."""

    kind = "table"

    def __init__(self, name: str) -> None:
        self.name = check_name("table", name)
        self._current: dict[Hashable, Any] = {}
        self._versions: dict[Hashable, list[tuple[int, Any]]] = {}
        self._items: dict[Hashable, str] = {}
        self._sweep_at: dict[Hashable, int] = {}
        self.chain_steps = 0
        """Versions looked at while installing (a cost counter for tests)."""
        self._watchers: list[dict[Hashable, int]] = []

    def __repr__(self) -> str:
        return f"Table({self.name!r}, rows={len(self._current)})"

    def __len__(self) -> int:
        return len(self._current)

    # -- page-model items ---------------------------------------------------

    def item(self, key: Hashable) -> str:
        """The data item of row ``key`` (``<table>.<key>``) as the notation prints it.

        Kept per key once made: readers that name the items they read (locks,
        read sets) get the same string object each time, its hash computed once.
        """
        try:
            name = self._items.get(key)
        except TypeError:
            raise StorageError(
                f"table {self.name}: a key must be hashable (a number, string or tuple of "
                f"them), not {type(key).__name__} {key!r}"
            ) from None
        if name is None:
            name = f"{self.name}.{key}" if key.__class__ is int else item_name(self.name, key)
            self._items[key] = name
        return name

    # -- reads ----------------------------------------------------------------

    def read(self, key: Hashable, default: Any = None) -> Any:
        """The current row of ``key`` (uncommitted changes included), or ``default``."""
        return self._current.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._current

    def keys(self) -> Iterator[Hashable]:
        """The keys that currently have a row."""
        return iter(list(self._current))

    def rows(self) -> dict[Hashable, Any]:
        """A copy of every current row."""
        return dict(self._current)

    def read_at(self, key: Hashable, ts: int, default: Any = None) -> Any:
        """The row of ``key`` as committed at or before timestamp ``ts``, or ``default``."""
        chain = self._versions.get(key)
        if chain is None:
            return default
        vts, value = chain[-1]
        if vts <= ts:
            return default if value is ABSENT else value
        # A binary search over a list that a commit may append to meanwhile: it sees
        # the versions present when it ran, which hold the one visible at ``ts``.
        i = bisect_right(chain, ts, key=_version_ts) - 1
        if i < 0:
            return default
        value = chain[i][1]
        return default if value is ABSENT else value

    def latest(self, key: Hashable) -> tuple[int, Any]:
        """``(commit timestamp, row)`` of the newest committed version; ``(0, ABSENT)`` if none."""
        chain = self._versions.get(key)
        if not chain:
            return (0, ABSENT)
        return chain[-1]

    def snapshot(self, ts: int | None = None) -> dict[Hashable, Any]:
        """Every row as committed at ``ts`` (default: the newest committed versions)."""
        out: dict[Hashable, Any] = {}
        for key, chain in list(self._versions.items()):
            if ts is None:
                value = chain[-1][1] if chain else ABSENT
            else:
                value = self.read_at(key, ts, ABSENT)
            if value is not ABSENT:
                out[key] = value
        return out

    def versions(self, key: Hashable) -> list[tuple[int, Any]]:
        """The committed version chain of ``key``, oldest first (for tests and tools)."""
        return list(self._versions.get(key, ()))

    def committed(
        self, ts: int | None = None, deleted: bool = False
    ) -> Iterator[tuple[Hashable, int, Any]]:
        """``(key, version timestamp, row)`` of every row as committed at ``ts`` (default: now).

        What a reader that ships a whole table version elsewhere needs: each row
        with the commit timestamp of the version it is (deleted rows left out,
        unless ``deleted``: then a deleted key comes with its deletion's
        timestamp and :data:`ABSENT`).
        """
        for key, chain in list(self._versions.items()):
            if not chain:
                continue
            vts, value = chain[-1]
            if ts is not None and vts > ts:
                i = bisect_right(chain, ts, key=_version_ts) - 1
                if i < 0:
                    continue
                vts, value = chain[i]
            if value is not ABSENT or deleted:
                yield key, vts, value

    def superseded_at(self, key: Hashable, version: int) -> int | None:
        """The commit timestamp of the version of ``key`` after ``version``; None if current.

        Raises :class:`StorageError` when the chain no longer holds ``version``
        (pruned), so that a caller never mistakes a pruned version for current.
        """
        chain = self._versions.get(key, ())
        i = bisect_right(chain, version, key=_version_ts)
        if i == 0 or chain[i - 1][0] != version:
            raise StorageError(f"table {self.name}: no version {version} of {key!r} is kept")
        return chain[i][0] if i < len(chain) else None

    def version_at(self, key: Hashable, ts: int) -> int:
        """The commit timestamp of the version of ``key`` visible at ``ts``; 0 if none.

        A deletion is a version too: a key deleted at ``d`` is absent from ``d`` on.
        """
        chain = self._versions.get(key, ())
        i = bisect_right(chain, ts, key=_version_ts)
        return chain[i - 1][0] if i else 0

    def changed_after(self, key: Hashable, ts: int) -> int | None:
        """The commit timestamp of the first version of ``key`` after ``ts``; None if none."""
        chain = self._versions.get(key, ())
        i = bisect_right(chain, ts, key=_version_ts)
        return chain[i][0] if i < len(chain) else None

    # -- change watchers ------------------------------------------------------------

    def watch(self) -> dict[Hashable, int]:
        """A dict that every later commit to this table records in: key -> commit timestamp.

        Each key keeps the timestamp of its first change since the caller last
        cleared it (``setdefault``), so a reader that drains it under the
        transaction manager's ``commit_mutex`` learns exactly which keys changed
        since its previous drain, and when each changed first, without walking
        the table.  :meth:`unwatch` stops it.
        """
        changes: dict[Hashable, int] = {}
        self._watchers = [*self._watchers, changes]  # readers may iterate the old list
        return changes

    def unwatch(self, changes: dict[Hashable, int]) -> None:
        """Stop recording into ``changes`` (a dict :meth:`watch` returned)."""
        self._watchers = [w for w in self._watchers if w is not changes]

    def _changed(self, key: Hashable, ts: int) -> None:
        for changes in self._watchers:
            changes.setdefault(key, ts)

    # -- writes on the current rows ---------------------------------------------

    def insert(self, key: Hashable, row: Any) -> Undo:
        """Add a row; :class:`DuplicateKeyError` if ``key`` already has one."""
        if key in self._current:
            raise DuplicateKeyError(f"table {self.name}: key {key!r} already exists")
        self._current[key] = row
        return ("delete", key)

    def update(self, key: Hashable, row: Any) -> Undo:
        """Replace an existing row; :class:`MissingRowError` if there is none."""
        current = self._current
        if key not in current:
            raise MissingRowError(f"table {self.name}: no row with key {key!r} to update")
        old = current[key]
        current[key] = row
        return ("restore", key, old)

    def put(self, key: Hashable, row: Any) -> Undo:
        """Insert or replace the row of ``key``."""
        current = self._current
        old = current.get(key, ABSENT)
        current[key] = row
        return ("restore", key, old)

    def delete(self, key: Hashable) -> Undo:
        """Remove a row; :class:`MissingRowError` if there is none."""
        try:
            old = self._current.pop(key)
        except KeyError:
            raise MissingRowError(f"table {self.name}: no row with key {key!r} to delete") from None
        return ("restore", key, old)

    def increment(self, key: Hashable, delta: Any, field: Hashable | None = None) -> Undo:
        """Add ``delta`` to a numeric row (or to ``row[field]`` of a dict row).

        The undo record is the increment by ``-delta``, as in the paper: only this
        change is taken back, whatever else happened to the row.
        """
        current = self._current
        if key not in current:
            raise MissingRowError(f"table {self.name}: no row with key {key!r} to increment")
        row = current[key]
        try:
            if field is None:
                current[key] = row + delta
            else:
                if not isinstance(row, dict):
                    raise StorageError(
                        f"table {self.name}: row {key!r} is not a dict, cannot increment "
                        f"field {field!r}"
                    )
                new = dict(row)
                new[field] = new[field] + delta
                current[key] = new
        except (TypeError, KeyError) as exc:
            raise StorageError(
                f"table {self.name}: cannot increment row {key!r} by {delta!r}: {exc}"
            ) from None
        return ("increment", key, -delta, field)

    def undo(self, record: Undo) -> None:
        """Execute an undo record returned by a mutator."""
        op, key = record[0], record[1]
        if op == "delete":
            self._current.pop(key, None)
        elif op == "restore":
            if record[2] is ABSENT:
                self._current.pop(key, None)
            else:
                self._current[key] = record[2]
        elif op == "increment":
            self.increment(key, record[2], record[3])
        else:  # pragma: no cover - records come from this class only
            raise StorageError(f"unknown undo record {record!r}")

    # -- versions -----------------------------------------------------------------
    #
    # ``keep`` is the sorted list of the timestamps of the open snapshots (``None``:
    # none is open).  A version must be kept while it is the newest one, or the
    # newest one at or before some open snapshot; every other version is garbage.
    # Commits touch a chain in O(log n) amortized: the newest version is replaced
    # in place when no snapshot can see it, the head is cut with a binary search,
    # and a full sweep runs only when the chain has doubled since the last one, so
    # an old snapshot left open costs memory for the versions it needs and nothing
    # per commit beyond that.  ``chain_steps`` counts the versions looked at, so
    # tests can tell a linear scan from this.

    def install(
        self,
        key: Hashable,
        ts: int,
        keep_since: int | None = None,
        keep: Sequence[int] | None = None,
    ) -> None:
        """Make the current row of ``key`` its committed version at timestamp ``ts``.

        ``keep`` holds the timestamps of the open snapshots, oldest first (``None``:
        no snapshot is open); versions no reader can need any more are dropped.
        ``keep_since`` (instead of ``keep``): keep every version visible at or after
        that timestamp.
        """
        if self._watchers:
            self._changed(key, ts)
        row = self._current.get(key, ABSENT)
        if keep is None and keep_since is None:
            chain = self._versions.get(key)
            if chain is not None and len(chain) == 1:
                chain[0] = (ts, row)
                return
        self.install_value(key, ts, row, keep_since, keep)

    def install_value(
        self,
        key: Hashable,
        ts: int,
        row: Any,
        keep_since: int | None = None,
        keep: Sequence[int] | None = None,
    ) -> None:
        """Add ``row`` (or :data:`ABSENT`) as the committed version of ``key`` at ``ts``."""
        chain = self._versions.get(key)
        if chain is None:
            self._versions[key] = [(ts, row)]
            return
        # Readers may be walking a chain while this runs: a chain is only ever
        # appended to, replaced whole, or has an element replaced that no open
        # snapshot can read; it is never shortened in place.
        if not keep and keep_since is None:
            # No snapshot open: only the newest version can ever be read.
            if len(chain) == 1:
                chain[0] = (ts, row)
            else:
                self._versions[key] = [(ts, row)]
                self._sweep_at.pop(key, None)
            return
        self.chain_steps += 1
        # Snapshots are taken at the commit clock, so every open one is older than
        # ``ts``: the newest version is needed only by a snapshot taken since it.
        if keep and keep[-1] < chain[-1][0]:
            chain[-1] = (ts, row)
            return
        chain.append((ts, row))
        n = len(chain)
        if n <= 4:
            return
        if keep:
            if n >= self._sweep_at.get(key, 8):
                self._sweep(key, chain, keep)
                return
            keep_since = keep[0]
        # Keep the newest version visible at the oldest snapshot and all later ones;
        # cut only when at least half the chain goes, so copies stay amortized O(1).
        cut = bisect_right(chain, keep_since, key=_version_ts) - 1
        self.chain_steps += max(1, n.bit_length())
        if cut > 0 and 2 * cut >= n:
            self._versions[key] = chain[cut:]

    def _sweep(self, key: Hashable, chain: list[tuple[int, Any]], keep: Sequence[int]) -> None:
        """Drop every version of ``chain`` that no open snapshot can read."""
        last = len(chain) - 1
        kept = []
        j = 0
        for i, version in enumerate(chain):
            if i == last:
                kept.append(version)
                break
            # needed iff an open snapshot lies in [its ts, the next version's ts)
            j = bisect_left(keep, version[0], j)
            if j < len(keep) and keep[j] < chain[i + 1][0]:
                kept.append(version)
        self.chain_steps += len(chain)
        self._versions[key] = kept
        self._sweep_at[key] = max(8, 2 * len(kept))

    def apply(
        self,
        key: Hashable,
        row: Any,
        ts: int,
        keep_since: int | None = None,
        keep: Sequence[int] | None = None,
    ) -> None:
        """Set the current row and its committed version at once (deferred writes, replay)."""
        if self._watchers:
            self._changed(key, ts)
        if row is ABSENT:
            self._current.pop(key, None)
        else:
            self._current[key] = row
        self.install_value(key, ts, row, keep_since, keep)

    def load(self, rows: dict[Hashable, Any], ts: int = 0) -> None:
        """Bulk-load committed rows outside any transaction (initial data)."""
        for key, row in rows.items():
            self.apply(key, row, ts)
