"""Setting a job's stream up on Spark: routes, initial rows, the inputs' union, the driver engine.

:class:`QueryStart` is the base of :class:`~txstream.spark.runtime.query.TxQuery`
that :meth:`TxQuery.start <txstream.spark.runtime.query.TxQuery.start>` calls once,
on the driver, before the first micro-batch
(:class:`~txstream.spark.runtime.query_batches.QueryBatches` runs those).
"""

from __future__ import annotations

import json
import logging
import shutil
import uuid
from dataclasses import replace
from typing import Any

from txstream.spark.connect import conf_get, functions
from txstream.spark.runtime.base import (
    RuntimeJobError,
    initial_row,
)
from txstream.spark.runtime.forward import forwarding
from txstream.spark.runtime.inputs import order_value
from txstream.spark.runtime.partitioning import partition_of, spark_routes, sql_partition
from txstream.spark.runtime.query_batches import QueryBatches
from txstream.spark.runtime.spark_tasks import (
    add_initial,
    as_dataframe,
    init_writer,
    plain_rows,
)

log = logging.getLogger("txstream.runtime")
"""The runtime's logger (quiet unless the application configures logging)."""


class QueryStart(QueryBatches):
    """The stream's set-up: called once per start, before Spark's query runs a batch."""

    def _routes(self) -> None:
        # Computed in Python: a Spark job here cost 2-3 s of the start (the
        # session's first job warms up the JVM).
        self.routes = spark_routes(self.partitions)
        self.tasks = self._phase1_tasks()
        if self.tasks < self.partitions:
            # Phase-1 task q hosts partitions q, q + tasks, ... (see forward/).
            mine = spark_routes(self.tasks)
            self.task_routes = [mine[p % self.tasks] for p in range(self.partitions)]
        else:
            self.task_routes = list(self.routes)

    def _phase1_tasks(self) -> int:
        """How many phase-1 tasks a batch has: one per partition, or one per task slot.

        A job whose transactions can span partitions forwards rows between the
        phase-1 tasks (see :mod:`.forward`), which must then all run at once: a
        barrier stage of at most one task per slot, each hosting whole
        partitions.  Without slots for that (dynamic allocation), such
        transactions are deferred to phases 2 and 3 instead.
        """
        self.forward = False
        if not (self.spec.may_cross and forwarding(self.spec)):
            return self.partitions
        if conf_get(self.spark, "spark.dynamicAllocation.enabled", "false") == "true":
            return self.partitions
        self.forward = True
        return max(1, min(self.partitions, self._parallelism()))

    def _load_initial(self) -> None:
        for table in self.spec.tables.values():
            if table.initial is None:
                continue
            if plain_rows(table.initial):
                # A list of plain rows goes to the store from here: through Spark
                # (a DataFrame, a shuffle, Python workers) it took 8 s of the start.
                by_pid: dict[int, dict[Any, dict[Any, Any]]] = {}
                for row in table.initial:
                    if table.columns is not None:  # as below: missing columns are null
                        row = {**dict.fromkeys(table.columns), **row}
                    key = table.key_of(initial_row(table, row))
                    value = table.value_of_key(key)
                    add_initial(by_pid, partition_of(value, self.partitions), table, key, row)
                for pid, values in by_pid.items():
                    self.store.write_init(pid, table.name, values)
                continue
            df = as_dataframe(self.spark, table.initial, table.name)
            missing = [c for c in table.key if c not in df.columns]
            if missing:
                raise RuntimeJobError(
                    f"table {table.name!r}: initial rows lack key columns {missing}"
                )
            df = df.selectExpr(
                "to_json(struct(*)) as payload",
                f"{sql_partition(table.partition_by, self.partitions, _booleans(df))} as pid",
            ).selectExpr("payload", "pid", f"{self._route_expr('pid')} as route")
            write = init_writer(str(self.store.root), replace(table, initial=None))
            df.repartition(self.partitions, "route").mapInArrow(write, "n long").collect()

    def _start_stream(self) -> None:
        F = functions(self.spark)

        # One schema for all inputs (a union needs it): each input's rows travel
        # as a struct column of their own (__in<i>), null in the other inputs'
        # rows, so they reach Python as dicts through Arrow, with their types.
        specs = list(self.spec.inputs.values())
        structs = {s.index: F.struct(*[F.col(f"`{c}`") for c in s.source.columns]) for s in specs}
        types = {
            s.index: s.source.select(structs[s.index].alias("x")).schema["x"].dataType
            for s in specs
        }
        parts = []
        for spec in specs:
            df = spec.source
            pids = [sql_partition(g, self.partitions, _booleans(df)) for g in spec.keys]
            order = (
                order_value(spec.order, df.schema[spec.order].dataType)
                if spec.order
                else "cast(0 as double)"
            )
            payloads = [
                (structs[j] if j == spec.index else F.lit(None).cast(types[j])).alias(f"__in{j}")
                for j in sorted(types)
            ]
            placed = f"array({', '.join(pids)})" if pids else "array()"
            if spec.broadcast is not None:  # an empty array: every partition gets a copy
                placed = f"if(coalesce(`{spec.broadcast}`, false), array(), {placed})"
            parts.append(
                df.select(
                    F.lit(spec.index).alias("__input"),
                    F.expr(order).alias("__ordv"),
                    *payloads,
                    F.expr(placed).cast("array<int>").alias("__pids"),
                )
            )
        union = parts[0]
        for part in parts[1:]:
            union = union.unionByName(part)
        self._schema = union.schema
        if self.connect:  # (before foreachBatch pickles this object: see __getstate__)
            # An earlier run's folder (a crash) is nobody's now: this run holds the store.
            shutil.rmtree(self.store.root / "connect", ignore_errors=True)
            self._shared = str(self.store.root / "connect" / uuid.uuid4().hex)
        writer = (
            union.writeStream.queryName(self.spec.name)
            .option("checkpointLocation", str(self.root / "spark"))
            .foreachBatch(self._on_batch)
            .trigger(**self.job._trigger)
        )
        self._status = "running"
        self.query = writer.start()
        committed = self.store.committed()
        log.info(
            "job %r started (id %s, runId %s): engine %s, %d partitions, %s",
            self.spec.name,
            self.id,
            self.runId,
            self.engine,
            self.partitions,
            f"resuming after committed batch {committed[-1]}" if committed else "a new checkpoint",
        )

    def _start_driver(self) -> None:
        from txstream.spark.runtime.driver import DriverEngine

        if self.store.committed():
            raise RuntimeJobError(
                "the driver engine keeps its tables in memory and cannot resume a checkpoint; "
                "use a new checkpoint (or the executors engine)"
            )
        self.driver = DriverEngine(self.spec)
        for table in self.spec.tables.values():
            if table.initial is not None:
                df = as_dataframe(self.spark, table.initial, table.name)
                self.driver.load(
                    table.name,
                    [json.loads(r[0]) for r in df.selectExpr("to_json(struct(*))").collect()],
                )


def _booleans(df: Any) -> frozenset[str]:
    """The columns of ``df`` of Spark type boolean (placed as the ints they equal), lower case.

    (Spark resolves a declared key ``Flag`` to the column ``flag`` by default.)
    """
    return frozenset(f.name.lower() for f in df.schema.fields if f.dataType.typeName() == "boolean")
