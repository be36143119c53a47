"""One partition's rows in memory: :class:`PartitionState`, and its tables' column layout.

A task of the runtime holds one :class:`PartitionState` per partition it runs;
the store (:class:`~txstream.spark.runtime.state.RuntimeStore`) loads and saves
it, as the columns of :func:`columns` (values, keys, rows).  A state belongs to
one task at a time (a Python worker caches it between batches, see
:mod:`~txstream.spark.runtime.state`); nothing here touches a file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain, islice, repeat
from operator import itemgetter
from typing import Any

from txstream.spark.runtime.totals import Tracked, track

ABSENT: Any = None  # a deleted row in a delta
Data = dict[str, dict[Any, Any]]
"""table -> partition value -> key -> row; a table in :attr:`PartitionState.flat`:
table -> key -> row (its key is its own partition value, see :meth:`PartitionState.use_flat`)"""


@dataclass
class PartitionState:
    """One partition's rows and boundary state, as of ``version`` (a committed batch).

    While a batch ``pending`` runs, ``undo`` holds the key of every row it
    changed (its delta's keys) and, when ``pre_images`` is on, the row's first
    pre-image of the batch, so a re-run of the batch rolls back in memory.
    Without them (``begin(batch, pre_images=False)``) :meth:`rollback` refuses
    and the store loads the state again: a batch's pre-images are row dicts
    scattered over the whole state, and freeing them one by one after the
    batch missed the cache on each (about 0.6 us of phase 1's ~14 per event),
    for the sake of a re-run that only a failed task brings.

    A table whose key is one column (``TableSpec.simple``) is its own partition
    value: its rows are kept flat, key -> row (:attr:`flat`), not in a dict of
    one-row dicts per value, which costs a lookup and a cache miss more per row
    access.  Every value's rows are reached through :meth:`part`,
    :meth:`rows_of` and :meth:`set_rows`, whichever the layout; the files on
    disk keep the nested layout's columns (:func:`columns`).
    """

    data: Data = field(default_factory=dict)
    flat: frozenset[str] = frozenset()
    """The tables kept flat (key -> row; their key is their partition value)."""
    meta: dict[str, Any] = field(default_factory=dict)
    version: int = -1
    pending: int | None = None
    undo: dict[tuple[str, Any, Any], Any] = field(default_factory=dict)
    pre_images: bool = True
    """Whether ``undo`` keeps the pending batch's pre-images (else None: see :meth:`rollback`)."""
    meta_before: dict[str, Any] | None = None
    token: str | None = None
    """Names the saved version this state is (a fresh one per save): a worker's cached
    state is used only when its token is the one the driver committed."""
    token_before: str | None = None
    tracked: Tracked = field(default_factory=dict)
    """Per table, the totals that the batch's global reads keep (see :mod:`.totals`):
    every write changes them; they last one batch (cleared, never replaced: a
    transaction holds the dict)."""

    def use_flat(self, tables: frozenset[str]) -> None:
        """Keep ``tables`` flat and every other table nested, converting what is not yet.

        A state read from disk (or made empty) is nested; the executors call this
        with their job's one-column-keyed tables before touching the rows.
        """
        if tables == self.flat:
            return
        data = self.data
        for table in self.flat - tables:  # (flat -> nested: a job of another shape)
            if table in data:
                data[table] = {key: {key: row} for key, row in data[table].items()}
        for table in tables - self.flat:
            if table in data:
                data[table] = dict(chain.from_iterable(map(dict.items, data[table].values())))
        self.flat = tables

    def part(self, table: str, value: Any) -> dict[Any, Any] | None:
        """The dict that holds ``value``'s rows by key (None: none of the table here).

        For a flat table it is the whole table (a key of a flat table is its value):
        look keys of ``value`` up in it, never iterate it (:meth:`rows_of` does).
        """
        rows = self.data.get(table)
        if rows is None or table in self.flat:
            return rows
        found: dict[Any, Any] | None = rows.get(value)
        return found

    def rows_of(self, table: str, value: Any) -> dict[Any, Any]:
        """``value``'s rows of ``table``, key -> row (never change it: it may be a copy)."""
        rows = self.data.get(table, _NONE)
        if table in self.flat:
            row = rows.get(value)
            return _NONE if row is None else {value: row}
        found: dict[Any, Any] = rows.get(value, _NONE)
        return found

    def set_rows(self, table: str, value: Any, rows: dict[Any, Any]) -> None:
        """Replace ``value``'s rows of ``table`` by ``rows`` (empty: none; no undo, no totals)."""
        if table in self.flat:
            by_key = self.data.setdefault(table, {})
            row = rows.get(value)
            if row is None:
                by_key.pop(value, None)
            else:
                by_key[value] = row
        elif rows:
            self.data.setdefault(table, {})[value] = dict(rows)
        else:
            self.data.get(table, {}).pop(value, None)

    def pop_rows(self, table: str, value: Any) -> dict[Any, Any]:
        """Take ``value``'s rows of ``table`` out (no undo, no totals); returns them."""
        rows = self.data.get(table)
        if rows is None:
            return _NONE
        if table in self.flat:
            row = rows.pop(value, None)
            return _NONE if row is None else {value: row}
        found: dict[Any, Any] = rows.pop(value, _NONE)
        return found

    def all_rows(self, table: str) -> list[tuple[Any, Any]]:
        """Every ``(key, row)`` of ``table`` here, whichever the layout."""
        rows = self.data.get(table, _NONE)
        if table in self.flat:
            return list(rows.items())
        return list(chain.from_iterable(map(dict.items, rows.values())))

    def begin(self, batch: int, pre_images: bool = True) -> None:
        """Start batch ``batch``; ``pre_images``: keep its changes undoable until :meth:`settle`.

        Without pre-images only the changed rows' keys are kept (for the delta);
        the rows a write replaces are freed then, while they are in the cache.
        """
        self.tracked.clear()
        self.pending = batch
        self.pre_images = pre_images
        self.undo = {}
        self.meta_before = dict(self.meta)
        self.token_before = self.token

    def rollback(self) -> bool:
        """Undo the pending batch; False (nothing changed) when its pre-images were not kept.

        Then the state holds the batch's rows with no way back in memory: the
        caller must drop it and load the version before the batch from the store.
        """
        if not self.pre_images:
            return False
        for (table, value, key), old in self.undo.items():
            self._set(table, value, key, old)
        self.tracked.clear()
        if self.meta_before is not None:
            self.meta = self.meta_before
        self.token = self.token_before
        self.pending = None
        self.undo = {}
        self.meta_before = None
        return True

    def settle(self) -> None:
        """The pending batch committed: it becomes this state's version."""
        if self.pending is not None:
            self.version = self.pending
        self.tracked.clear()
        self.pending = None
        self.undo = {}
        self.meta_before = None

    def put(self, table: str, value: Any, key: Any, row: Any, counted: bool = True) -> None:
        """Set (or delete, with ABSENT) one row, keeping its pre-image for the batch.

        ``counted`` False: not in :attr:`tracked` (a row lent by another
        partition, which leaves again before any total is taken here).
        """
        undo_key = (table, value, key)
        if undo_key not in self.undo:
            self.undo[undo_key] = (
                (self.part(table, value) or _NONE).get(key, ABSENT) if self.pre_images else None
            )
        self._set(table, value, key, row, counted)

    def _set(self, table: str, value: Any, key: Any, row: Any, counted: bool = True) -> None:
        flat = table in self.flat
        if flat:
            rows = self.data.setdefault(table, {})
        else:
            rows = self.data.setdefault(table, {}).setdefault(value, {})
        tracked = self.tracked
        if tracked and counted and table in tracked:
            old = rows.get(key)
            track(tracked, table, old, None if row is ABSENT else row)
        if row is ABSENT:
            rows.pop(key, None)
            if not rows and not flat:
                self.data[table].pop(value, None)
        else:
            rows[key] = row

    def delta(self) -> dict[str, Any]:
        """The rows the pending batch changed, as they are now (ABSENT when deleted).

        ``changes``: per table, three columns (partition values, keys, rows), the
        layout the store's format writes fastest (see :mod:`.codec`); two (keys,
        rows) when every key is its partition value (a one-column key: one column
        less to encode and write per changed row).
        """
        # Block by block (see codec._BLOCK): each changed row's key (a tuple made
        # when the row was first written, somewhere in the batch's memory) is
        # read once, and its row looked up while its key is still in the cache;
        # no list of every key outlives its block (freeing one touched each key
        # again, from cold memory).
        found: dict[str, tuple[list[Any] | None, list[Any], list[Any]]] = {}
        entries = iter(self.undo)
        seen = 0  # (entries of the blocks before this one)
        while block := list(islice(entries, _BLOCK)):
            tables, values, keys = zip(*block, strict=True)
            names = set(tables)
            for table in names:
                if len(names) == 1:
                    mine_values, mine_keys = values, keys
                else:  # (several tables written: each one's entries, in their order)
                    mine = [e for e in block if e[0] == table]
                    mine_values, mine_keys = (
                        tuple(map(itemgetter(1), mine)),
                        tuple(map(itemgetter(2), mine)),
                    )
                cols = found.get(table)
                if cols is None:
                    cols = found[table] = (None, [], [])
                # A one-column key's value is its key (the same object: compared in
                # C without reading it): no column of values is made, nor freed.
                if cols[0] is None and mine_values != mine_keys:
                    # (the earlier blocks' values, read again from the undo log: equal
                    # to their keys, but a key 1.0 of a value 1 would change its type)
                    earlier = [e[1] for e in islice(self.undo, seen) if e[0] == table]
                    cols = found[table] = (earlier, cols[1], cols[2])
                if cols[0] is not None:
                    cols[0].extend(mine_values)
                cols[1].extend(mine_keys)
                cols[2].extend(self._rows_now(table, mine_values, mine_keys))
            seen += len(block)
        changes: dict[str, list[list[Any]]] = {}
        for table in sorted(found):
            all_values, all_keys, rows = found[table]
            # (equal for a one-column key in either layout, so the files do not
            # depend on the layout in memory)
            changes[table] = (
                [all_keys, rows] if all_values is None else [all_values, all_keys, rows]
            )
        # "parent" names the version the batch started from: a worker catching up
        # checks that each delta continues the version it holds (see _catch_up).
        return {
            "changes": changes,
            "meta": self.meta,
            "token": self.token,
            "parent": self.token_before,
        }

    def _rows_now(self, table: str, values: Sequence[Any], keys: Sequence[Any]) -> list[Any]:
        """The rows of ``table`` with ``keys`` (of partition ``values``) as they are now.

        ABSENT where there is none; looked up in C (no Python code per row).
        """
        by_value = self.data.get(table, _NONE)
        if table in self.flat:
            return list(map(by_value.get, keys, repeat(ABSENT)))
        parts = map(by_value.get, values, repeat(_NONE))
        return list(map(dict.get, parts, keys, repeat(ABSENT)))

    def apply(self, delta: dict[str, Any]) -> None:
        """Apply a delta read from disk (no undo kept)."""
        if "changes" in delta:
            for table, cols in delta["changes"].items():
                # (two columns: each key is its partition value, see delta)
                values, keys, rows = cols if len(cols) == 3 else (cols[0], *cols)
                for value, key, row in zip(values, keys, rows, strict=True):
                    self._set(table, value, key, row)
        else:  # (the layout of earlier versions: one [table, value, key, row] per row)
            for table, value, key, row in delta["rows"]:
                self._set(table, value, key, row)
        self.meta = dict(delta["meta"])
        self.token = delta.get("token")

    def apply_patch(self, patch: dict[str, Any]) -> bool:
        """Apply phase 3's patch if it continues this version (see :meth:`RuntimeStore.patch`)."""
        if patch["parent"] != self.token:
            return False
        for value, tables in patch["values"]:
            for table, rows in tables.items():
                self.set_rows(table, value, rows)
        self.token = patch["token"]
        return True


_NONE: dict[Any, Any] = {}
"""An empty dict to look up in (never changed)."""

_BLOCK = 2048
"""Entries per block of :meth:`PartitionState.delta`'s passes (see ``codec._BLOCK``)."""


def columns(by_value: dict[Any, dict[Any, Any]]) -> list[list[Any]]:
    """A table's rows (partition value -> key -> row) as three columns: values, keys, rows.

    The store's layout of a table (snapshots, initial rows): lists of plain
    values and rows that the format writes without a Python step per row
    (see :mod:`.codec`); built in C (``chain``, ``repeat``) from the dicts.  A
    value without rows is left out (a lookup finds none either way).
    """
    groups = by_value.values()
    if set(map(len, groups)) <= {1}:  # one row per value (a key that is the value)
        values = list(by_value)
    else:
        values = list(chain.from_iterable(map(repeat, by_value, map(len, groups))))
    keys = list(chain.from_iterable(groups))
    rows = list(chain.from_iterable(map(dict.values, groups)))
    return [values, keys, rows]


def flat_columns(by_key: dict[Any, Any]) -> list[list[Any]]:
    """A flat table's rows (key -> row) as :func:`columns` writes them (each key its value)."""
    keys = list(by_key)
    return [keys, list(keys), list(by_key.values())]


def nested(values: list[Any], keys: list[Any], rows: list[Any]) -> dict[Any, dict[Any, Any]]:
    """The table that :func:`columns` wrote (partition value -> key -> row)."""
    if len(set(values)) == len(values) == len(keys) == len(rows):  # one row per value
        return {value: {key: row} for value, key, row in zip(values, keys, rows, strict=True)}
    table: dict[Any, dict[Any, Any]] = {}
    for value, key, row in zip(values, keys, rows, strict=True):
        by_key = table.get(value)
        if by_key is None:
            table[value] = by_key = {}
        by_key[key] = row
    return table
