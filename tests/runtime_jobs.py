"""Jobs and readers shared by the runtime's tests without Spark (``test_runtime_*.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import txstream as tx
from txstream.spark.runtime.state import RuntimeStore


def balances(store: Path, partitions: int) -> dict[int, int]:
    rs = RuntimeStore(store)
    last = rs.committed()[-1]
    out: dict[int, int] = {}
    for pid in range(partitions):
        state = rs.load(pid, last)
        for rows in state.data.get("accounts", {}).values():
            out.update({k: r["balance"] for k, r in rows.items()})
    return out


def split(stream: list[Any], sizes: list[int]) -> list[list[Any]]:
    out, i = [], 0
    for size in sizes:
        out.append(stream[i : i + size])
        i += size
    out.append(stream[i:])
    return [b for b in out if b]


# -- transaction functions: errors, aborts, undeclared keys --------------------------
def counter_job(boundary: str = "event", **options: Any) -> tx.Job:
    def add(t: tx.Tx, e: dict[str, Any]) -> None:
        if t.read("counts", e["k"]) is None:
            t.insert("counts", {"k": e["k"], "n": 0})
        t.increment("counts", e["k"], "n", 1)
        t.emit("seen", {"k": e["k"], "ts": e["ts"]})
        if e.get("boom"):
            raise ValueError("boom")
        if e.get("stop"):
            t.abort("not today")
        if e.get("other") is not None:
            t.read("counts", e["other"])

    return (
        tx.Job("counter")
        .table("counts", key="k")
        .input("ev", None, keys="k", order="ts")
        .output("seen")
        .on("ev", add)
        .boundary(boundary, **options)
        .option("recordHistory", True)
    )


def counts(store: Path, partitions: int = 2) -> dict[Any, int]:
    rs = RuntimeStore(store)
    out: dict[Any, int] = {}
    for pid in range(partitions):
        for rows in rs.load(pid, rs.committed()[-1]).data.get("counts", {}).values():
            out.update({k: r["n"] for k, r in rows.items()})
    return out


class FakeStream:
    """A streaming DataFrame as far as ``job.start`` reads one before Spark starts: its schema."""

    isStreaming = True

    def __init__(self, ddl: str) -> None:
        from pyspark.sql import types as T

        kinds = {
            "int": T.IntegerType(),
            "long": T.LongType(),
            "double": T.DoubleType(),
            "decimal": T.DecimalType(12, 3),
            "string": T.StringType(),
            "boolean": T.BooleanType(),
            "timestamp": T.TimestampType(),
            "timestamp_ntz": T.TimestampNTZType(),
            "date": T.DateType(),
            "array<long>": T.ArrayType(T.LongType()),
        }
        pairs = [part.split() for part in ddl.split(",")]
        self.schema = T.StructType([T.StructField(name, kinds[kind]) for name, kind in pairs])
        self.columns = self.schema.names
