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
    MissingRowError,
    Row,
    SchemaError,
    TransactionAborted,
    check_row,
)
from txstream.spark.runtime.boundaries import Event, Run, check_runs, track_runs
from txstream.spark.runtime.executor import Outcome
from txstream.txn import TransactionManager


class DriverTx:
    """The :class:`~txstream.spark.runtime.executor.Tx` interface over a TM transaction."""

    def __init__(self, job: JobSpec, tm: TransactionManager, txn: Any) -> None:
        self._job, self._tm, self._txn = job, tm, txn
        self._emits: list[tuple[str, Row]] = []

    def read(self, table: str, key: Key, default: Any = None) -> Any:
        """See ``Tx.read``."""
        row = self._txn.read(self._tm.table(table), key)
        return default if row is None else dict(row)

    def insert(self, table: str, row: Row) -> None:
        """See ``Tx.insert``."""
        spec = self._job.tables[table]
        if spec.columns is not None:
            check_row(f"row of {table}", spec.columns, row)
        self._txn.insert(self._tm.table(table), spec.key_of(row), dict(row))

    def upsert(self, table: str, row: Row) -> None:
        """See ``Tx.upsert``."""
        spec = self._job.tables[table]
        self._txn.put(self._tm.table(table), spec.key_of(row), dict(row))

    def update(self, table: str, key: Key, changes: Row | None = None, **columns: Any) -> Row:
        """See ``Tx.update``."""
        old = self._txn.read(self._tm.table(table), key)
        if old is None:
            raise MissingRowError(f"update of {table}: no row with key {key!r}")
        new = {**old, **(changes or {}), **columns}
        self._txn.update(self._tm.table(table), key, new)
        return dict(new)

    def increment(self, table: str, key: Key, column: str, by: float = 1) -> Any:
        """See ``Tx.increment``."""
        old = self._txn.read(self._tm.table(table), key)
        if old is None:
            raise MissingRowError(f"increment of {table}.{column}: no row with key {key!r}")
        new = {**old, column: old[column] + by}
        self._txn.update(self._tm.table(table), key, new)
        return new[column]

    def delete(self, table: str, key: Key) -> None:
        """See ``Tx.delete``."""
        self._txn.delete(self._tm.table(table), key)

    def emit(self, output: str, row: Row) -> None:
        """See ``Tx.emit``."""
        spec = self._job.outputs.get(output)
        if spec is None:
            raise SchemaError(f"emit to unknown output {output!r}")
        if spec.columns is not None:
            check_row(f"emit to {output}", spec.columns, row)
        self._emits.append((output, dict(row)))

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

            def work(txn: Any, group: Any = group, emits: list[Any] = emits) -> None:
                emits.clear()
                tx = DriverTx(self.job, self.tm, txn)
                for event in group.events:
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
                        "kind": "error",
                        "position": group.events[0].position,
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
