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

from collections.abc import Hashable, Iterator
from typing import Any

from txstream.storage.base import (
    ABSENT,
    DuplicateKeyError,
    MissingKeyError,
    StorageError,
    check_name,
    item_name,
)

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

    def __repr__(self) -> str:
        return f"Table({self.name!r}, rows={len(self._current)})"

    def __len__(self) -> int:
        return len(self._current)

    # -- page-model items ---------------------------------------------------

    def item(self, key: Hashable) -> str:
        """The data item of row ``key`` (``<table>.<key>``) as the notation prints it."""
        if key.__class__ is int:
            return f"{self.name}.{key}"
        name = self._items.get(key)
        if name is None:
            name = self._items[key] = item_name(self.name, key)
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
        for i in range(len(chain) - 1, -1, -1):
            vts, value = chain[i]
            if vts <= ts:
                return default if value is ABSENT else value
        return default

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

    # -- writes on the current rows ---------------------------------------------

    def insert(self, key: Hashable, row: Any) -> Undo:
        """Add a row; :class:`DuplicateKeyError` if ``key`` already has one."""
        if key in self._current:
            raise DuplicateKeyError(f"table {self.name}: key {key!r} already exists")
        self._current[key] = row
        return ("delete", key)

    def update(self, key: Hashable, row: Any) -> Undo:
        """Replace an existing row; :class:`MissingKeyError` if there is none."""
        current = self._current
        if key not in current:
            raise MissingKeyError(f"table {self.name}: no row with key {key!r} to update")
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
        """Remove a row; :class:`MissingKeyError` if there is none."""
        try:
            old = self._current.pop(key)
        except KeyError:
            raise MissingKeyError(f"table {self.name}: no row with key {key!r} to delete") from None
        return ("restore", key, old)

    def increment(self, key: Hashable, delta: Any, field: Hashable | None = None) -> Undo:
        """Add ``delta`` to a numeric row (or to ``row[field]`` of a dict row).

        The undo record is the increment by ``-delta``, as in the paper: only this
        change is taken back, whatever else happened to the row.
        """
        current = self._current
        if key not in current:
            raise MissingKeyError(f"table {self.name}: no row with key {key!r} to increment")
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

    def install(self, key: Hashable, ts: int, keep_since: int | None = None) -> None:
        """Make the current row of ``key`` its committed version at timestamp ``ts``.

        ``keep_since`` is the oldest snapshot timestamp still in use (``None``:
        no snapshot is open); versions no reader can need any more are dropped.
        """
        row = self._current.get(key, ABSENT)
        if keep_since is None:
            chain = self._versions.get(key)
            if chain is not None and len(chain) == 1:
                chain[0] = (ts, row)
                return
        self.install_value(key, ts, row, keep_since)

    def install_value(
        self, key: Hashable, ts: int, row: Any, keep_since: int | None = None
    ) -> None:
        """Add ``row`` (or :data:`ABSENT`) as the committed version of ``key`` at ``ts``."""
        chain = self._versions.get(key)
        if chain is None:
            self._versions[key] = [(ts, row)]
            return
        # Readers may be walking a chain while this runs: a chain is only ever
        # appended to or replaced whole, never shortened in place.
        if keep_since is None:
            # No snapshot open: only the newest version can ever be read.
            if len(chain) == 1:
                chain[0] = (ts, row)
            else:
                self._versions[key] = [(ts, row)]
            return
        chain.append((ts, row))
        if len(chain) > 4:
            # Keep the newest version visible at keep_since and all later ones.
            cut = 0
            for i in range(len(chain) - 1, -1, -1):
                if chain[i][0] <= keep_since:
                    cut = i
                    break
            if cut:
                self._versions[key] = chain[cut:]

    def apply(self, key: Hashable, row: Any, ts: int, keep_since: int | None = None) -> None:
        """Set the current row and its committed version at once (deferred writes, replay)."""
        if row is ABSENT:
            self._current.pop(key, None)
        else:
            self._current[key] = row
        self.install_value(key, ts, row, keep_since)

    def load(self, rows: dict[Hashable, Any], ts: int = 0) -> None:
        """Bulk-load committed rows outside any transaction (initial data)."""
        for key, row in rows.items():
            self.apply(key, row, ts)
