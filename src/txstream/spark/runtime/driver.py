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
    duplicate_key,
    emitted_row,
    incremented_row,
    key_of_row,
    missing_row,
    table_spec,
    updated_row,
)
from txstream.spark.runtime.boundaries import Event, Run, check_runs, track_runs
from txstream.spark.runtime.executor import Outcome, undeclared
from txstream.storage import DuplicateKeyError, MissingKeyError
from txstream.txn import TransactionManager


class DriverTx:
    """The :class:`~txstream.spark.runtime.executor.Tx` interface over a TM transaction."""

    def __init__(
        self, job: JobSpec, tm: TransactionManager, txn: Any, allowed: set[Any] | None
    ) -> None:
        self._job, self._tm, self._txn = job, tm, txn
        self._emits: list[tuple[str, Row]] = []
        self._allowed = allowed
        """The partition values of the transaction's events (None: it has a keyless event,
        which may touch any row, as a fragment on every partition may)."""

    def _table(self, table: str, key: Key) -> Any:
        """The transaction manager's table, for a key the transaction declared."""
        spec = table_spec(self._job, table)
        if self._allowed is not None:
            value = spec.value_of_key(key)
            if value not in self._allowed:
                raise undeclared(table, value, self._allowed)
        return self._tm.table(table)

    # The write rules (schema, key, increment) are the executors' (``base``), so
    # both engines accept and refuse the same writes.
    def read(self, table: str, key: Key, default: Any = None) -> Any:
        """See ``Tx.read``."""
        row = self._txn.read(self._table(table, key), key)
        return default if row is None else dict(row)

    def insert(self, table: str, row: Row) -> None:
        """See ``Tx.insert``."""
        key = key_of_row(table_spec(self._job, table), row)
        try:
            self._txn.insert(self._table(table, key), key, dict(row))
        except DuplicateKeyError:
            raise duplicate_key(table, key) from None

    def upsert(self, table: str, row: Row) -> None:
        """See ``Tx.upsert``."""
        key = key_of_row(table_spec(self._job, table), row)
        self._txn.put(self._table(table, key), key, dict(row))

    def update(self, table: str, key: Key, changes: Row | None = None, **columns: Any) -> Row:
        """See ``Tx.update``."""
        old = self._txn.read(self._table(table, key), key)
        if old is None:
            raise missing_row(f"update of {table}", key)
        new = updated_row(self._job.tables[table], key, old, changes, columns)
        self._txn.update(self._tm.table(table), key, new)
        return dict(new)

    def increment(self, table: str, key: Key, column: str, by: float = 1) -> Any:
        """See ``Tx.increment``."""
        old = self._txn.read(self._table(table, key), key)
        if old is None:
            raise missing_row(f"increment of {table}.{column}", key)
        new = incremented_row(self._job.tables[table], old, column, by)
        self._txn.update(self._tm.table(table), key, new)
        return new[column]

    def delete(self, table: str, key: Key) -> None:
        """See ``Tx.delete``."""
        try:
            self._txn.delete(self._table(table, key), key)
        except MissingKeyError:
            raise missing_row(f"delete from {table}", key) from None

    def emit(self, output: str, row: Row) -> None:
        """See ``Tx.emit``."""
        self._emits.append((output, emitted_row(self._job, output, row)))

    def abort(self, reason: str = "aborted by the transaction") -> None:
        """See ``Tx.abort``."""
        raise TransactionAborted(reason)


class DriverEngine:
    """Runs a job's transactions in the driver under a transaction manager, in order."""

    def __init__(self, job: JobSpec, protocol: str = "ss2pl") -> None:
        self.job = job
        self.tm = TransactionManager(protocol, record=job.record_history)
        self.meta: dict[str, Any] = {}
        """The boundary's state across batches (the timeslice clock), as a partition's."""
        for name in job.tables:
            self.tm.table(name)

    def load(self, table: str, rows: list[Row]) -> None:
        """Initial contents of ``table``."""
        spec = self.job.tables[table]
        with self.tm.begin() as txn:
            for row in rows:
                txn.insert(self.tm.table(table), spec.key_of(row), dict(row))

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
            emits: list[tuple[str, Row]] = []
            current = [group.events[0]]  # the event running: a failure names it
            keyless = any(not e.values for e in group.events)
            allowed = None if keyless else {v for e in group.events for v in e.values}

            def work(
                txn: Any,
                group: Any = group,
                emits: list[Any] = emits,
                current: Any = current,
                allowed: Any = allowed,
            ) -> None:
                emits.clear()
                tx = DriverTx(self.job, self.tm, txn, allowed)
                for event in group.events:
                    current[0] = event
                    self.job.handlers[event.input](tx, event.row)
                emits.extend(tx._emits)

            try:
                self.tm.run(work)
            except TransientError:
                raise
            except Exception as exc:
                outcome.aborted += 1
                outcome.failures.append(
                    {
                        "txn": group.gid,
                        "kind": "abort" if isinstance(exc, TransactionAborted) else "error",
                        "position": current[0].position,
                        "order": list(group.order),
                        "error": f"{type(exc).__name__}: {exc}",
                    }
                )
                continue
            outcome.committed += 1
            for output, row in emits:
                row["__order"] = [*group.order, seq]
                seq += 1
                outcome.outputs.setdefault(output, []).append(json.dumps(row, default=str))
            if arrival is not None:
                for event in group.events:
                    sent = arrival(event.row)
                    if sent is not None:
                        outcome.sent.append(sent)
        return outcome
