"""The executors' transaction verbs: :class:`ExecutorTx`, what a transaction function is given.

One :class:`ExecutorTx` per :class:`~.executor.GroupRunner`, reused for every
transaction the runner executes on its partition (the runner sets its fields
before each one): the verbs of the :class:`~txstream.spark.runtime.base.Tx`
protocol over one partition's rows, with the undo log, the history's
operations and the rows to emit.  Split from :mod:`.executor`, which runs
transactions and keeps their outcomes.

Ownership: called on its runner's thread only, one transaction at a time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Container, Iterable
from typing import Any, NoReturn

from txstream.spark.runtime.base import (
    LONG_MAX,
    LONG_MIN,
    JobSpec,
    Key,
    Row,
    TableSpec,
    TransactionAborted,
    UndeclaredKeyError,
    check_key,
    check_partition_value,
    check_value,
    duplicate_key,
    key_of_row,
    keyed_values,
    missing_row,
    table_spec,
    undeclared_total,
)
from txstream.spark.runtime.boundaries import Event
from txstream.spark.runtime.partitioning import canonical, key_text, partition_of
from txstream.spark.runtime.recorded import history_codes
from txstream.spark.runtime.rows import (
    check_emitted,
    check_output_values,
    incremented_row,
    owned_row,
    updated_row,
)
from txstream.spark.runtime.state import ABSENT, PartitionState
from txstream.spark.runtime.totals import (
    check_numbers,
    finish_total,
    partial_totals,
    track,
)

_SIMPLE = re.compile(r"[A-Za-z0-9_]+")
_INTEGRAL = re.compile(r"-?[0-9]+")


_ITEMS: dict[str, dict[Key, str]] = {}
"""Item names per table and key: every read and write of a recorded run names one."""


def item_name(table: str, key: Key) -> str:
    """The history item of a row: ``table:`` and the key (ints as is, strings prefixed)."""
    if type(key) is int:  # formatting beats a lookup in a cache too big for the CPU's
        return f"{table}:{key}"
    names = _ITEMS.get(table)
    if names is None:
        names = _ITEMS[table] = {}
    name = names.get(key)
    if name is None:
        if len(names) > 1_000_000:
            names.clear()
        name = names[key] = _item_name(table, key)
    return name


def _item_name(table: str, key: Key) -> str:
    parts = key if isinstance(key, tuple) else (key,)
    out = []
    for part in parts:
        if isinstance(part, int):  # (a bool as the int it equals: one row, one item)
            out.append(str(int(part)))
        elif isinstance(part, str | tuple):
            text = key_text(part)
            out.append("s" + (text if _SIMPLE.fullmatch(text) else "-" + text.encode().hex()))
        else:
            # A float, Decimal or date part of a key column that places no row (they
            # were refused here): an integral number as the int it equals, the rest
            # tagged apart from strings.
            text = key_text(part)
            out.append(text if _INTEGRAL.fullmatch(text) else "x-" + text.encode().hex())
    return f"{table}:{'.'.join(out)}"


def undeclared(table: str, value: Any, allowed: Iterable[Any]) -> UndeclaredKeyError:
    """The error of a read or write outside the transaction's declared partition values."""
    return UndeclaredKeyError(
        f"{table}: partition value {value!r} is not a key of the transaction's events "
        f"({sorted(map(canonical, allowed))}); declare it in .input(keys=...)"
    )


def check_fragment(
    table: str, value: Key, allowed: Iterable[Any], home: int | None, partitions: int
) -> None:
    """The rule for a partition value that is not among the transaction's declared ones.

    Only a keyless event's fragment may touch it, and only when it lives on the
    fragment's partition ``home`` (of ``partitions``); :class:`UndeclaredKeyError`
    otherwise.  The driver engine runs such an event as one fragment (``home``
    0 of 1 partition), which may touch every value.
    """
    if home is None or partition_of(value, partitions) != home:
        raise undeclared(table, value, allowed)


_MISSING: Any = object()
"""A column a row does not have (``increment``'s fast path falls back to the full rule)."""

_NO_ROWS: dict[Any, Any] = {}
"""An empty table to look up in (never changed)."""


def _set_item(table: str, value: Key) -> str:
    """The history item standing for the set of rows of one partition value (phantoms)."""
    return item_name(table, value).replace(":", ":v", 1)


class ExecutorTx:
    """:class:`~txstream.spark.runtime.base.Tx` on a partition's state: executors, ``run_local``.

    What a transaction function sees: reads and writes of its partition values.

    Rows are dicts of columns; ``read`` returns a copy.  Every change is undone
    when the function raises (or calls :meth:`abort`).  The verbs' contracts
    and an example: ``help(tx.Tx)``.  Owned by the task running the partition's
    batch; one object serves each transaction in turn (reset between them).
    """

    __slots__ = (
        "_aggregates",
        "_allowed",
        "_batch",
        "_codes",
        "_data",
        "_emits",
        "_event",
        "_fast",
        "_gid",
        "_global",
        "_history",
        "_home",
        "_job",
        "_outputs",
        "_partitions",
        "_remote",
        "_remote_ops",
        "_state",
        "_stride",
        "_tables",
        "_tracked",
        "_undo",
    )

    def __init__(
        self, job: JobSpec, state: PartitionState, gid: str | None, history: list[Any] | None
    ):
        self._job = job
        self._tables = job.tables
        self._state = state
        state.use_flat(flat_tables(job))  # (before _data: it may replace a table's dict)
        self._data = state.data
        self._tracked = state.tracked
        """The partition's totals for global reads, kept by every write (see .totals)."""
        """The state's rows (the same dict for the whole batch: read on every verb)."""
        self._gid = gid
        """The transaction's id, for the history; None: made from ``_batch`` and ``_event``
        when an operation needs it (see :meth:`_txn`)."""
        self._batch = 0
        self._event: Event | None = None
        self._history = history
        """The task's history (None when nothing is recorded), in the compact form of
        :mod:`.recorded`: an operation on an int key as one int, its key and table's code)."""
        self._codes, self._stride = history_codes(job)
        self._fast: dict[str, tuple[frozenset[type], int, TableSpec]] = {
            name: (
                spec.key_types if spec.simple and spec.key_types is not None else frozenset(),
                self._codes[name],
                spec,
            )
            for name, spec in job.tables.items()
        }
        """Per table, what ``read`` and ``increment`` need of it in one lookup: the exact
        types of a key that takes their fast case (a one-column key of a table with a
        schema, kept flat: a key is its own partition value, its row a dict; none for
        any other table), the history code of a read, and its spec."""
        self._outputs: dict[str, dict[str, tuple[frozenset[type], str]]] = {
            name: {column: (kinds, _key_text(column)) for column, kinds in types.items()}
            for name, spec in job.outputs.items()
            if (types := spec.types_by_name) is not None
        }
        """Per output with a schema (see ``OutputSpec.types_by_name``): per column, the
        exact types that fit it and its JSON name, for ``emit``'s one pass over a row."""
        self._allowed: Collection[Any] = ()
        """The transaction's declared partition values: one event's own list (no set made
        per event: it holds one or two values), a set for several events."""
        self._undo: list[tuple[tuple[str, Any, Any], Any]] = []
        """``((table, value, key), row before)`` per write of the transaction."""
        self._emits: list[tuple[str, Row | str]] = []
        """Rows to emit on commit: a copy, or its JSON members (a str, see :meth:`emit`)."""
        self._home: int | None = None
        """While a keyless event runs: the partition whose rows it may touch (its fragment)."""
        self._partitions = 0
        self._remote: Container[Any] | None = None
        """Values whose rows were forwarded here from their own partitions (see
        :mod:`.forward`): their operations are recorded there, so they go to
        ``_remote_ops`` as value, operation, value, operation, ... (flat: no tuple per
        operation to make, and the home's answer takes the operations as one slice)."""
        self._remote_ops: list[Any] = []
        self._global: tuple[tuple[str, str | None], ...] = ()
        """What this transaction may read across all partitions (its input's global_reads)."""
        self._aggregates: dict[tuple[str, str | None], list[Any]] | None = None
        """The totals over every partition, when they were gathered for it; None: count
        them here (this state holds every row: the deferred phase, the driver engine)."""

    # -- reads ---------------------------------------------------------------------
    def read(self, table: str, key: Key, default: Any = None) -> Any:
        """The row of ``table`` with ``key`` (a copy), or ``default`` when there is none."""
        # The hot path of every job.  First a one-column key of a table with a
        # schema whose type fits: the same steps as below, with what they read of
        # the table's spec in one lookup.
        try:
            kinds, code, spec = self._fast[table]
        except KeyError:
            self._unknown(table)
        if type(key) in kinds:
            if key not in self._allowed:
                self._check_value(table, key)
            history = self._history
            if history is not None:
                if type(key) is not int:
                    self._log(key, f"r{self._txn()}({item_name(table, key)})")
                else:  # (compact: see recorded.py; _log inlined, see there)
                    op = key * self._stride + code
                    remote = self._remote
                    if remote is not None and key in remote:
                        self._remote_ops += (key, op)
                    else:
                        history.append(op)
            rows = self._data.get(table)
            row = rows.get(key) if rows is not None else None
            return default if row is None else row.copy()
        fits = spec.key_types  # (key_fits, inlined for the common one-column key)
        if (type(key) not in fits) if fits is not None else not spec.key_fits(key):
            check_key(f"read of {table}", spec, key)
        value = key if spec.simple else spec.value_of_key(key)
        if value not in self._allowed:
            self._check_value(table, value)
        history = self._history
        if history is not None:
            if type(key) is not int:
                self._log(value, f"r{self._txn()}({item_name(table, key)})")
            elif self._remote is None:  # (compact: see recorded.py)
                history.append(key * self._stride + code)
            else:
                self._log(value, key * self._stride + code)
        rows = self._data.get(table)
        if rows is None:
            return default
        if spec.simple:  # (a flat table: key -> row, see PartitionState.flat)
            row = rows.get(key)
        else:
            part = rows.get(value)
            row = part.get(key) if part is not None else None
        if row is None:
            return default
        # (a table without a schema may hold lists: see owned_row; a stored row is a
        # dict, and its copy() costs half of dict(row), which goes through the type call)
        return row.copy() if spec.columns is not None else owned_row(row)

    def scan(self, table: str, value: Key) -> list[Row]:
        """Every row of ``table`` in partition value ``value`` (copies, by key's canonical text)."""
        check_partition_value(f"scan of {table}", self._table(table), value)
        self._check_value(table, value)
        rows = self._state.rows_of(table, value)
        if self._history is not None:
            gid = self._txn()
            self._log(value, f"r{gid}({_set_item(table, value)})")
            for k in rows:
                self._log(value, f"r{gid}({item_name(table, k)})")
        return [owned_row(rows[k]) for k in sorted(rows, key=key_text)]

    def values(self, table: str) -> list[Key]:
        """The partition values of ``table`` with rows here, for a keyless event's fragment.

        An event of an input declared without keys reaches every partition; on
        each, its fragment may touch that partition's rows.  This lists which
        partition values it holds (in canonical order), so a fragment can find
        e.g. one car's rows wherever they were written.
        """
        self._table(table)
        if self._home is None:
            raise keyed_values(table)
        home, parts = self._home, self._partitions
        found = [v for v in self._state.data.get(table, {}) if partition_of(v, parts) == home]
        found.sort(key=canonical)
        if self._history is not None:
            gid = self._txn()
            self._history.extend(f"r{gid}({_set_item(table, v)})" for v in found)
        return found

    @property
    def home(self) -> int | None:
        """For an event that reaches every partition: the partition this fragment runs on.

        Every partition ``0 .. P-1`` runs one fragment of such an event (an input
        without keys, or a ``broadcast`` event); ``home == 0`` picks one of them,
        e.g. to emit something once per event.  An input with ``global_reads``
        runs each event once, at partition 0: 0 (so that the same test emits
        there too; its rows are still out of reach).  None for an event with keys.
        """
        return 0 if self._global else self._home

    # -- writes --------------------------------------------------------------------
    def insert(self, table: str, row: Row) -> None:
        """Add ``row``; :class:`DuplicateKeyError` when its key exists."""
        spec = self._table(table)
        key = key_of_row(spec, row)
        value = self._value(f"insert into {table}", spec, key)
        if key in (self._state.part(table, value) or _NO_ROWS):
            raise duplicate_key(table, key)
        self._put(table, value, key, _stored(spec, row), structural=True)

    def upsert(self, table: str, row: Row) -> None:
        """Insert ``row`` or replace the row with its key."""
        spec = self._table(table)
        key = key_of_row(spec, row)
        value = spec.value_of_key(key)
        if value not in self._allowed:
            self._check_value(table, value)
        part = self._state.part(table, value)
        exists = part is not None and key in part
        self._put(table, value, key, _stored(spec, row), structural=not exists)

    def update(self, table: str, key: Key, changes: Row | None = None, **columns: Any) -> Row:
        """Change some columns of the row with ``key``; returns the new row (a copy)."""
        spec = self._table(table)
        value = self._value(f"update of {table}", spec, key)
        old = (self._state.part(table, value) or _NO_ROWS).get(key)
        if old is None:
            raise missing_row(f"update of {table}", key)
        new = updated_row(spec, key, old, changes, columns)
        self._put(table, value, key, new)
        return new.copy() if spec.columns is not None else owned_row(new)

    def increment(self, table: str, key: Key, column: str, by: float = 1) -> Any:
        """Add ``by`` to one column of the row with ``key``; returns the new value."""
        # As hot as read (counters, balances): the same inlined lookups (and the
        # same fast case, see read), and the common case of incremented_row and
        # _put inline.  (part: the dict holding the key's row; a flat table's is
        # the table itself)
        try:
            kinds, code, spec = self._fast[table]
        except KeyError:
            self._unknown(table)
        if type(key) in kinds:
            value = key
            part = self._data.get(table)
        else:
            fits = spec.key_types  # (key_fits, inlined for the common one-column key)
            if (type(key) not in fits) if fits is not None else not spec.key_fits(key):
                check_key(f"increment of {table}", spec, key)
            value = key if spec.simple else spec.value_of_key(key)
            part = self._data.get(table)
            if part is not None and not spec.simple:
                part = part.get(value)
        if value not in self._allowed:
            self._check_value(table, value)
        old = part.get(key) if part is not None else None
        if part is None or old is None:
            raise missing_row(f"increment of {table}.{column}", key)
        types = spec.column_types
        current = old.get(column, _MISSING)
        kind = type(current)  # (_MISSING's is object)
        if (
            kind is not type(by)
            or (kind is not int and kind is not float)
            or (types is not None and kind not in types[column])
        ):  # anything but a number plus a number of its type: the full rule
            new = incremented_row(spec, old, column, by)
            self._put(table, value, key, new, part=part)
            return new[column]
        new = old.copy()  # (a stored row: a dict; see read)
        total = new[column] = current + by
        if types is not None and not LONG_MIN <= total <= LONG_MAX:  # (a long may overflow)
            sql = spec.columns[column] if spec.columns is not None else "double"
            check_value(f"increment of {table}", column, sql, total)
        # (_put of a row that exists, inlined; setdefault: one hash of the key tuple)
        undo_key = (table, value, key)
        self._undo.append((undo_key, old))
        state = self._state
        # The batch's pre-image, when kept (see PartitionState.pre_images): else
        # only the key, and ``old`` is freed with the transaction's undo log.
        state.undo.setdefault(undo_key, old if state.pre_images else None)
        part[key] = new
        tracked = self._tracked
        if tracked and table in tracked:  # (a global read keeps this table's totals)
            # A row lent by another partition (``_remote``) is not counted here: it
            # came in and leaves again within this one run at its home, before any
            # total is taken, so adding it, its changes and taking it out netted to
            # zero (the lender counts its change when the row comes back).
            remote = self._remote
            if remote is None or value not in remote:
                if kind is int:
                    # (track, inlined for an int column raised by an int: only the
                    # partials of this column change, their int sum by ``by``)
                    for counted, partial in tracked[table]:
                        if counted == column:
                            partial[0] += by
                else:
                    track(tracked, table, old, new)
        history = self._history
        if history is not None:
            if type(key) is not int:
                self._log(value, f"w{self._txn()}({item_name(table, key)})")
            else:  # (compact: see recorded.py; _log inlined, see there)
                op = key * self._stride + code + 1
                remote = self._remote
                if remote is not None and value in remote:
                    self._remote_ops += (value, op)
                else:
                    history.append(op)
        return total

    def delete(self, table: str, key: Key) -> None:
        """Remove the row with ``key``; :class:`MissingRowError` when there is none."""
        spec = self._table(table)
        value = self._value(f"delete from {table}", spec, key)
        if key not in (self._state.part(table, value) or _NO_ROWS):
            raise missing_row(f"delete from {table}", key)
        self._put(table, value, key, ABSENT, structural=True)

    def sum(self, table: str, column: str) -> Any:
        """The sum of ``column`` over every row of ``table`` in every partition (nulls skipped).

        For an input declared with ``global_reads=["table.column"]``: the total
        as of this transaction's place in the order, over all partitions.
        """
        return self._total(table, column)[0]

    def count(self, table: str) -> int:
        """The number of rows of ``table`` in every partition (see :meth:`sum`)."""
        for read_table, column in self._global:
            if read_table == table:
                return int(self._total(table, column)[1])
        raise self._undeclared_total(table, None)

    def _total(self, table: str, column: str | None) -> list[Any]:
        if (table, column) not in self._global:
            raise self._undeclared_total(table, column)
        if self._aggregates is not None:
            return finish_total(check_numbers(self._aggregates[(table, column)], table, column))
        # Every row is here (the deferred phase, the driver engine): count them now.
        state = self._state
        found = partial_totals(state.data, ((table, column),), flat=state.flat)
        if self._history is not None:
            record_reads(state, ((table, column),), self._txn(), self._history)
        return finish_total(found[(table, column)])

    def _undeclared_total(self, table: str, column: str | None) -> UndeclaredKeyError:
        return undeclared_total(table, column)

    def emit(self, output: str, row: Row) -> None:
        """Send ``row`` to ``output`` when (and only if) the transaction commits."""
        # Its JSON members now, when it is plain (see _plain_members): the text is
        # the copy that later changes of ``row`` must not reach.  For an output
        # with a schema, one pass checks each column's exact type and spells it.
        columns = self._outputs.get(output)
        if columns is not None and type(row) is dict and len(row) == len(columns):
            parts = []
            for key, value in row.items():
                try:
                    kinds, name = columns[key]
                except KeyError:
                    break  # (a missing column: the full check says which)
                kind = type(value)
                if kind not in kinds:
                    break  # (a wrong column: the full check says which)
                if kind is int:
                    if not LONG_MIN <= value <= LONG_MAX:
                        break  # (beyond a long: the full check says whether it fits)
                    text = f"{value}"
                elif kind is str:
                    text = _ESCAPE(value)
                elif kind is bool:
                    text = "true" if value else "false"
                elif value is None:
                    text = "null"
                elif kind is float and value - value == 0.0:
                    text = repr(value)
                else:
                    break
                parts.append(name + text)
            else:
                self._emits.append((output, ", ".join(parts)))
                return
        spec = self._job.outputs.get(output)
        check_emitted(self._job, output, row)
        members = _plain_members(row)
        if members is None and spec is not None and spec.columns is None:
            check_output_values(output, row)
        self._emits.append((output, owned_row(row) if members is None else members))

    def abort(self, reason: str = "aborted by the transaction") -> None:
        """Roll this transaction back (it is reported as aborted, not as an error)."""
        raise TransactionAborted(reason)

    # -- internals -----------------------------------------------------------------
    def _table(self, table: str) -> Any:
        return table_spec(self._job, table)

    def _unknown(self, table: str) -> NoReturn:
        """Raise the error of a verb on ``table``, which is not one of the job's."""
        table_spec(self._job, table)
        raise AssertionError(f"table {table!r} is declared but has no entry in Tx._fast")

    def _value(self, what: str, spec: TableSpec, key: Key) -> Any:
        """The partition value of ``key`` (checked: ``what``, a verb, names it in errors).

        A key of another type than the key columns' is a :class:`SchemaError`
        before anything else (``"5"`` for a long key finds no row, and is no
        declared value either).
        """
        if not spec.key_fits(key):
            check_key(what, spec, key)
        value = spec.value_of_key(key)
        if value not in self._allowed:
            self._check_value(spec.name, value)
        return value

    def _txn(self) -> str:
        """The transaction's id for a recorded operation (made once, when first needed)."""
        gid = self._gid
        if gid is None:
            assert self._event is not None
            gid = self._gid = f"b{self._batch}_{self._event.order[2]}"  # (event_gid, inlined)
        return gid

    def _log(self, value: Any, op: str | int) -> None:
        """Record one operation (history on): here, or for the value's own partition.

        ``op``: its text, or its int (see :mod:`.recorded`), which the value's own
        partition follows with the transaction's commit mark (see ``record_remote``).
        ``read`` and ``increment`` have its lines inline for an int key: a crossing
        transfer at its home made four calls of it (a change here changes them too).
        """
        remote = self._remote
        if remote is not None and value in remote:
            self._remote_ops += (value, op)
        else:
            assert self._history is not None
            self._history.append(op)

    def _check_value(self, table: str, value: Any) -> None:
        if value not in self._allowed:
            check_fragment(table, value, self._allowed, self._home, self._partitions)

    def _put(
        self,
        table: str,
        value: Any,
        key: Any,
        row: Any,
        structural: bool = False,
        part: dict[Any, Row] | None = None,
    ) -> None:
        """Write one row (ABSENT deletes); ``part``: the value's rows, when the caller has them."""
        state = self._state
        if part is None:
            part = state.part(table, value)
        old = ABSENT if part is None else part.get(key, ABSENT)
        undo_key = (table, value, key)
        self._undo.append((undo_key, old))
        # (state.put, inlined: the batch's pre-image when kept, else only the key)
        state.undo.setdefault(undo_key, old if state.pre_images else None)
        tracked = self._tracked
        if tracked:  # (a lent row is not counted here: see increment)
            remote = self._remote
            counted = table in tracked and (remote is None or value not in remote)
        else:
            counted = False
        if row is ABSENT or not part:
            state.put(table, value, key, row, counted)  # (it keeps the totals: _set)
        else:
            part[key] = row
            if counted:
                track(tracked, table, None if old is ABSENT else old, row)
        history = self._history
        if history is not None:
            if type(key) is int and (
                not structural or (type(value) is int and ":" not in table)
            ):  # (compact: see recorded.py; a set item's name is "table:v<value>")
                stride, code = self._stride, self._codes[table]
                self._log(value, key * stride + code + 1)
                if structural:
                    self._log(value, value * stride + code + 3)
                return
            gid = self._txn()
            self._log(value, f"w{gid}({item_name(table, key)})")
            if structural:
                self._log(value, f"w{gid}({_set_item(table, value)})")

    def _rollback(self) -> None:
        state = self._state
        remote = self._remote
        for (table, value, key), old in reversed(self._undo):
            # (state.put: its pre-image is kept; a lent row was not counted: see increment)
            state._set(table, value, key, old, remote is None or value not in remote)
        if remote is not None:
            # Rows forwarded here leave again: their batch pre-images must not stay
            # in this partition's undo log (its delta, and a retry's rollback, would
            # give this partition another's row).  Only this run wrote them here.
            undo = state.undo
            for undo_key, _old in self._undo:
                if undo_key[1] in remote:
                    undo.pop(undo_key, None)
        self._undo.clear()
        self._emits.clear()


Tx = ExecutorTx
"""The class's old name here (``executor.Tx``), for code that patches it; ``tx.Tx`` is the
Protocol (:class:`~txstream.spark.runtime.base.Tx`)."""


def _stored(spec: TableSpec, row: Row) -> Row:
    """The copy of a written ``row`` that the state keeps (checked against a schema already)."""
    if spec.columns is None:
        return owned_row(row)
    return row.copy() if type(row) is dict else dict(row)  # (see read)


def flat_tables(job: JobSpec) -> frozenset[str]:
    """The job's tables whose key is one column: kept flat in memory (see PartitionState.flat)."""
    return frozenset(name for name, spec in job.tables.items() if spec.simple)


def record_reads(
    state: PartitionState,
    reads: Iterable[tuple[str, str | None]],
    gid: str,
    ops: list[str],
) -> None:
    """A global read's operations on this partition (history on): every row and row set."""
    for table in dict.fromkeys(table for table, _ in reads):
        for value in state.data.get(table, {}):
            ops.append(f"r{gid}({_set_item(table, value)})")
            ops.extend(f"r{gid}({item_name(table, k)})" for k in state.rows_of(table, value))


_ESCAPE: Callable[[str], str] = json.encoder.encode_basestring_ascii
_KEYS: dict[str, str] = {}
"""A column name's JSON text and the separator after it (``"id": ``), per name."""


def _plain_members(row: Row) -> str | None:
    """The members of ``row``'s JSON object as :func:`_json_line` writes them, or None.

    For a row of string keys and plain values (``None``, ``bool``, ``int``,
    finite ``float``, ``str``), the text the C encoder writes, built without
    it: it costs about 0.35 us per member on a small dict (measured), several
    times this.  None for anything else (then :func:`_json_line` writes it),
    and for a row with an ``__order`` column (an output without a schema),
    which the order would replace in place.
    """
    parts = []
    for key, value in row.items():
        kind = type(value)
        if kind is int:
            text = f"{value}"
        elif kind is str:
            text = _ESCAPE(value)
        elif kind is bool:
            text = "true" if value else "false"
        elif value is None:
            text = "null"
        elif kind is float and value - value == 0.0:
            text = repr(value)
        else:
            return None
        name = _KEYS.get(key)
        if name is None:
            if type(key) is not str or key == "__order":
                return None
            name = _key_text(key)
        parts.append(name + text)
    return ", ".join(parts)


def _key_text(key: str) -> str:
    """A column name's JSON text and separator, remembered in :data:`_KEYS`."""
    if len(_KEYS) > 10_000:  # (column names: few, unless rows are odd dicts)
        _KEYS.clear()
    name = _KEYS[key] = f"{_ESCAPE(key)}: "
    return name
