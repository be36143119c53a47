"""The ``driver`` engine: the same job API executed by the SS2PL transaction manager.

Every event of a micro-batch is brought to the driver and each transaction runs
in one driver thread under :class:`~txstream.txn.TransactionManager` (locks,
undo log, optional history recording): the way every engine of the project ran
before the executor runtime.  It is here for the papers' comparisons and the
benchmark's baseline (``txstream bench runtime`` runs the same workload on both);
the executor runtime is the one that scales.  Its tables live in the driver's
memory: unlike the executor runtime it is not exactly-once across a driver crash.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from txstream.errors import TransientError
from txstream.spark.runtime.base import (
    JobSpec,
    Key,
    Row,
    TransactionAborted,
    Tx,
    check_key,
    check_partition_value,
    duplicate_key,
    key_of_row,
    keyed_values,
    missing_row,
    table_spec,
    undeclared_total,
)
from txstream.spark.runtime.boundaries import Event, Run, check_runs, track_runs
from txstream.spark.runtime.executor import ExecutorTx, check_fragment
from txstream.spark.runtime.outcome import Outcome
from txstream.spark.runtime.partitioning import canonical, key_text
from txstream.spark.runtime.rows import (
    emitted_row,
    incremented_row,
    json_value,
    owned_row,
    updated_row,
)
from txstream.spark.runtime.totals import count_rows, finish_total
from txstream.storage import DuplicateKeyError, MissingRowError
from txstream.txn import TransactionManager

_ALL = "all"
"""The key of a table's one row in its ``<table>-values`` item table."""


class DriverTx:
    """:class:`~txstream.spark.runtime.base.Tx` over a transaction of the transaction manager.

    ``scan`` and ``values`` read the engine's index of keys per partition value
    under *set items*, against phantoms as the executors' history does: a scan
    reads the item ``<table>-v.<value>``, ``values`` the item
    ``<table>-values.all`` (rows of two item tables that no job table can be
    called, a job's names having no ``-``); an insert or delete, or an upsert of
    a new key, writes the item of its value, and also the table's when the value
    gains its first row or loses its last.  Under SS2PL a scan therefore holds
    off every insert into its value until it commits, and the history shows the
    conflict.
    """

    def __init__(self, engine: DriverEngine, txn: Any, allowed: set[Any]) -> None:
        self._engine, self._job, self._tm, self._txn = engine, engine.job, engine.tm, txn
        self._emits: list[tuple[str, Row]] = []
        self._allowed = allowed
        """The partition values of the transaction's events."""
        self._home: int | None = None
        """0 while a keyless event runs: its one fragment here, which may touch any row."""
        self._written: set[tuple[str, Any, bool]] = set()
        """The set items this transaction has written (it holds them to the end)."""
        self._global: tuple[tuple[str, str | None], ...] = ()
        """What the running event may read across all partitions (its input's global_reads)."""

    @property
    def home(self) -> int | None:
        """See ``Tx.home``: 0 for an event that reaches every partition, None for one with keys.

        The driver runs such an event once, as the one fragment of one partition;
        a global read's event too (0, as on the executors, where it runs at 0).
        """
        return 0 if self._global else self._home

    def _value(self, table: str, key: Key, what: str) -> Key:
        """The partition value of ``key``, one the running event may touch (``what``: a verb).

        The key is checked against the key columns' types first: one of another
        type is a :class:`SchemaError`, as on the executors.
        """
        spec = table_spec(self._job, table)
        if not spec.key_fits(key):
            check_key(what, spec, key)
        return self._allow(table, spec.value_of_key(key))

    def _allow(self, table: str, value: Key) -> Key:
        """``value``, unless the running event may not touch it (the executors' rule)."""
        if value not in self._allowed:
            check_fragment(table, value, self._allowed, self._home, 1)
        return value

    # The write rules (schema, key, increment) are the executors' (``base``), so
    # both engines accept and refuse the same writes.
    def read(self, table: str, key: Key, default: Any = None) -> Any:
        """See ``Tx.read``."""
        self._value(table, key, f"read of {table}")
        row = self._txn.read(self._tm.table(table), key)
        if row is None:
            return default
        return owned_row(row)

    def scan(self, table: str, value: Key) -> list[Row]:
        """See ``Tx.scan``: every row of ``table`` in partition value ``value``, in key order."""
        check_partition_value(f"scan of {table}", table_spec(self._job, table), value)
        self._allow(table, value)
        engine, txn = self._engine, self._txn
        txn.read(engine.sets[table], value)  # before the index: inserts into value wait
        rows, keys = self._tm.table(table), engine.index[table].get(value, ())
        found = (txn.read(rows, k) for k in sorted(keys, key=key_text))
        return [owned_row(row) for row in found if row is not None]

    def values(self, table: str) -> list[Key]:
        """See ``Tx.values``: for a keyless event, every partition value of ``table`` with rows.

        On the driver such an event is one fragment and sees every partition.
        """
        table_spec(self._job, table)
        if self._home is None:
            raise keyed_values(table)
        self._txn.read(self._engine.value_sets[table], _ALL)
        return sorted(self._engine.index[table], key=canonical)

    def sum(self, table: str, column: str) -> Any:
        """See ``Tx.sum``: the total over every row of ``table``, read under the TM's locks."""
        return self._total(table, column)[0]

    def count(self, table: str) -> int:
        """See ``Tx.count``."""
        for read_table, column in self._global:
            if read_table == table:
                return int(self._total(table, column)[1])
        raise undeclared_total(table, None)

    def _total(self, table: str, column: str | None) -> list[Any]:
        """(sum, count) as the executors compute them, reading every row and set item.

        Reading the table's set of values and each value's set item holds off
        any insert or delete (a phantom) until this transaction ends, as a scan does.
        """
        if (table, column) not in self._global:
            raise undeclared_total(table, column)
        engine, txn, rows = self._engine, self._txn, self._tm.table(table)
        txn.read(engine.value_sets[table], _ALL)
        found: dict[Any, dict[Key, Row]] = {}
        for value in sorted(engine.index[table], key=canonical):
            txn.read(engine.sets[table], value)
            keys = sorted(engine.index[table].get(value, ()), key=key_text)
            part = {k: txn.read(rows, k) for k in keys}
            found[value] = {k: row for k, row in part.items() if row is not None}
        partial = count_rows(found, column)
        if partial is None:  # (the executors' words: totals.partial_totals)
            raise TypeError(f"the sum of {table}.{column}: a value is not a number")
        return finish_total(partial)

    def insert(self, table: str, row: Row) -> None:
        """See ``Tx.insert``."""
        key = key_of_row(table_spec(self._job, table), row)
        value = self._value(table, key, f"insert into {table}")
        try:
            self._txn.insert(self._tm.table(table), key, owned_row(row))
        except DuplicateKeyError:
            raise duplicate_key(table, key) from None
        self._added(table, value, key)

    def upsert(self, table: str, row: Row) -> None:
        """See ``Tx.upsert``."""
        key = key_of_row(table_spec(self._job, table), row)
        value = self._value(table, key, f"upsert into {table}")
        self._txn.put(self._tm.table(table), key, owned_row(row))
        if key not in self._engine.index[table].get(value, ()):
            self._added(table, value, key)

    def update(self, table: str, key: Key, changes: Row | None = None, **columns: Any) -> Row:
        """See ``Tx.update``."""
        self._value(table, key, f"update of {table}")
        old = self._txn.read(self._tm.table(table), key)
        if old is None:
            raise missing_row(f"update of {table}", key)
        new = updated_row(self._job.tables[table], key, old, changes, columns)
        self._txn.update(self._tm.table(table), key, new)
        return owned_row(new)

    def increment(self, table: str, key: Key, column: str, by: float = 1) -> Any:
        """See ``Tx.increment``."""
        self._value(table, key, f"increment of {table}")
        old = self._txn.read(self._tm.table(table), key)
        if old is None:
            raise missing_row(f"increment of {table}.{column}", key)
        new = incremented_row(self._job.tables[table], old, column, by)
        self._txn.update(self._tm.table(table), key, new)
        return new[column]

    def delete(self, table: str, key: Key) -> None:
        """See ``Tx.delete``."""
        value = self._value(table, key, f"delete from {table}")
        try:
            self._txn.delete(self._tm.table(table), key)
        except MissingRowError:
            raise missing_row(f"delete from {table}", key) from None
        self._removed(table, value, key)

    def emit(self, output: str, row: Row) -> None:
        """See ``Tx.emit``."""
        self._emits.append((output, emitted_row(self._job, output, row)))

    def abort(self, reason: str = "aborted by the transaction") -> None:
        """See ``Tx.abort``."""
        raise TransactionAborted(reason)

    # -- the index of keys per partition value, under its set items ---------------------
    def _write_set(self, table: str, value: Any, whole: bool = False) -> None:
        """Write the set item of ``value`` (``whole``: the table's set of values) once."""
        item = (table, _ALL if whole else value, whole)
        if item not in self._written:
            engine = self._engine
            self._txn.put((engine.value_sets if whole else engine.sets)[table], item[1], True)
            self._written.add(item)

    def _added(self, table: str, value: Any, key: Key) -> None:
        """``key`` joined the rows of ``value`` (its row is written and locked)."""
        self._write_set(table, value)
        if value not in self._engine.index[table]:
            self._write_set(table, value, whole=True)
        self._engine.index_add((table, value, key))
        self._txn.on_abort(self._engine.index_remove, (table, value, key))

    def _removed(self, table: str, value: Any, key: Key) -> None:
        """``key`` left the rows of ``value`` (its row is deleted and locked)."""
        self._write_set(table, value)
        if self._engine.index[table].get(value) == {key}:
            self._write_set(table, value, whole=True)
        self._engine.index_remove((table, value, key))
        self._txn.on_abort(self._engine.index_add, (table, value, key))


class DriverEngine:
    """Runs a job's transactions in the driver under a transaction manager, in order."""

    def __init__(self, job: JobSpec, protocol: str = "ss2pl") -> None:
        self.job = job
        self.tm = TransactionManager(protocol, record=job.record_history)
        self.meta: dict[str, Any] = {}
        """The boundary's state across batches (the timeslice clock), as a partition's."""
        for name in job.tables:  # first: a name the manager refuses is the job's
            self.tm.table(name)
        self.index: dict[str, dict[Any, set[Key]]] = {name: {} for name in job.tables}
        """Per table, the keys of each partition value with rows (what scans list);
        changed by a transaction under its set items, rolled back with it."""
        self.sets = {name: self.tm.table(f"{name}-v") for name in job.tables}
        """Per table, the set items of its partition values (see :class:`DriverTx`)."""
        self.value_sets = {name: self.tm.table(f"{name}-values") for name in job.tables}
        """Per table, the set item of its set of partition values."""

    def index_add(self, entry: tuple[str, Any, Key]) -> None:
        """Index ``(table, value, key)``: the key has a row."""
        table, value, key = entry
        self.index[table].setdefault(value, set()).add(key)

    def index_remove(self, entry: tuple[str, Any, Key]) -> None:
        """Unindex ``(table, value, key)``; a value without keys leaves the index."""
        table, value, key = entry
        keys = self.index[table].get(value)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self.index[table][value]

    def load(self, table: str, rows: list[Row]) -> None:
        """Initial contents of ``table``."""
        spec = self.job.tables[table]
        loaded = []
        with self.tm.begin() as txn:
            for row in rows:
                key = spec.key_of(row)
                txn.insert(self.tm.table(table), key, dict(row))
                loaded.append((table, spec.value_of_key(key), key))
        for entry in loaded:
            self.index_add(entry)

    def run_batch(
        self,
        batch: int,
        events: list[Event],
        arrival: Callable[[Row], float | None] | None = None,
    ) -> Outcome:
        """Run the batch's events (any order; sorted here) as the boundary's transactions."""
        outcome = Outcome(events=len(events))
        events.sort(key=lambda e: e.order)
        seq = 0
        boundary = self.job.boundary
        groups = list(boundary.groups(batch, events, self.meta))
        if boundary.checks_runs:  # as the executors' driver does, before anything runs
            runs: dict[str, Run] = {}
            groups = list(track_runs(groups, runs))
            check_runs(batch, [runs])
        for group in groups:
            if group.late:  # a late timeslice event: aborted without running, as on executors
                outcome.failed(group, "late", group.late)
                continue
            emits: list[tuple[str, Row]] = []
            current = [group.events[0]]  # the event running: a failure names it
            allowed = {v for e in group.events for v in e.values}

            def work(
                txn: Any,
                group: Any = group,
                emits: list[Any] = emits,
                current: Any = current,
                allowed: Any = allowed,
            ) -> None:
                emits.clear()
                tx = DriverTx(self, txn, allowed)
                for event in group.events:
                    current[0] = event
                    # A keyless event is one fragment here; an event with keys, in the
                    # same transaction or not, touches its transaction's values only.
                    # A global read's event touches no rows, as on the executors.
                    reads = self.job.inputs[event.input].global_reads
                    tx._global = reads
                    tx._home = None if event.values or reads else 0
                    self.job.handlers[event.input](tx, event.row)
                emits.extend(tx._emits)

            try:
                self.tm.run(work)
            except TransientError:
                raise
            except Exception as exc:
                kind = "abort" if isinstance(exc, TransactionAborted) else "error"
                error = f"{type(exc).__name__}: {exc}"
                outcome.failed(group, kind, error, current[0].position, current[0].order)
                continue
            outcome.committed_txn(group.events)
            for output, row in emits:
                row["__order"] = [*group.order, seq]
                seq += 1
                outcome.outputs.setdefault(output, []).append(json.dumps(row, default=json_value))
            if arrival is not None:
                for event in group.events:
                    sent = arrival(event.row)
                    if sent is not None:
                        outcome.sent.append(sent)
        return outcome


def _as_tx(engine_tx: ExecutorTx | DriverTx) -> Tx:
    """Never called: mypy checks here that every engine's transaction is a ``Tx``.

    (``tests/test_tx_protocol.py`` compares the verbs' parameters at run time.)
    """
    return engine_tx
