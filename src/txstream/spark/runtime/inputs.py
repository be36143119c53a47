"""Checks of a job's inputs against their DataFrames, before Spark starts anything.

:func:`check_inputs` reads only the streaming DataFrames' schemas and refuses,
in one line, an input whose key, order, broadcast or arrival column does not fit
its declaration; :func:`order_value` is the SQL of an event's order value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from txstream.spark.runtime.base import RuntimeJobError
from txstream.spark.runtime.restart import KEY_KINDS

if TYPE_CHECKING:
    from txstream.spark.runtime.job import Job

_ORDER_TYPES = (
    "ByteType",
    "ShortType",
    "IntegerType",
    "LongType",
    "FloatType",
    "DoubleType",
    "DecimalType",
    "TimestampType",
    "DateType",
)
"""Types of an order column: numbers, timestamps and dates (see :func:`order_value`)."""

_ARRIVAL_TYPES = ("ByteType", "ShortType", "IntegerType", "LongType", "FloatType", "DoubleType")
"""Types of the ``arrivalTime`` column: numbers of epoch seconds (read as Python numbers)."""


def order_value(column: str, data_type: Any) -> str:
    """The SQL of an event's order value (a double) from its order column of ``data_type``.

    A timestamp is its epoch seconds (what a cast to double gives); a date is the
    epoch seconds of its midnight UTC (Spark does not cast dates to double).
    """
    if type(data_type).__name__ == "DateType":
        return f"cast(unix_date(`{column}`) as double) * 86400"
    return f"cast(`{column}` as double)"


def check_inputs(job: Job) -> dict[str, list[str]]:
    """Refuse, in one line, inputs whose DataFrames do not fit their declarations.

    Reads only the DataFrames' schemas: it runs before Spark starts anything.
    Returns the type of each input's key columns (see :func:`restart.job_shape`).
    """
    columns: dict[str, dict[str, str]] = {}
    key_types: dict[str, list[str]] = {}
    for spec in job.spec.inputs.values():
        df = spec.source
        if not hasattr(df, "isStreaming"):
            raise RuntimeJobError(f"input {spec.name!r} must be a Spark DataFrame")
        if not df.isStreaming:
            raise RuntimeJobError(
                f"input {spec.name!r} is a batch DataFrame; give a streaming one "
                "(spark.readStream...), or try the job on lists of rows with run_local"
            )
        fields = {f.name: type(f.dataType).__name__ for f in df.schema.fields}
        columns[spec.name] = fields
        for group in spec.keys:
            for column in group:
                if column not in fields:
                    raise RuntimeJobError(
                        f"input {spec.name!r}: key column {column!r} is not in its schema "
                        f"({', '.join(fields)})"
                    )
                if fields[column] not in KEY_KINDS:
                    raise RuntimeJobError(
                        f"input {spec.name!r}: key column {column!r} is {fields[column]}; "
                        "a key is an integer, string or boolean column"
                    )
                key_types.setdefault(spec.name, []).append(KEY_KINDS[fields[column]])
        if spec.broadcast is not None and fields.get(spec.broadcast) != "BooleanType":
            raise RuntimeJobError(
                f"input {spec.name!r}: broadcast column {spec.broadcast!r} must be a boolean "
                f"column of its schema ({', '.join(fields)})"
            )
        if spec.order is not None:
            if spec.order not in fields:
                raise RuntimeJobError(
                    f"input {spec.name!r}: order column {spec.order!r} is not in its schema "
                    f"({', '.join(fields)})"
                )
            if fields[spec.order] not in _ORDER_TYPES:
                raise RuntimeJobError(
                    f"input {spec.name!r}: order column {spec.order!r} is "
                    f"{fields[spec.order]}; an order column is a number, a timestamp or a "
                    f"date: {_order_hint(spec.order, fields[spec.order])}"
                )
    arrival = job._arrival
    if arrival is not None:
        having = {name: fields[arrival] for name, fields in columns.items() if arrival in fields}
        if not having:
            listed = "; ".join(f"{name}: {', '.join(fields)}" for name, fields in columns.items())
            raise RuntimeJobError(
                f"option arrivalTime names column {arrival!r}, which no input has ({listed})"
            )
        for name, kind in having.items():
            if kind not in _ARRIVAL_TYPES:
                raise RuntimeJobError(
                    f"option arrivalTime: column {arrival!r} of input {name!r} is {kind}; "
                    "it must hold epoch seconds as a number (for a timestamp column, "
                    f"add one: F.unix_micros({arrival!r}) / 1e6)"
                )
    return key_types


def _order_hint(column: str, kind: str) -> str:
    """What to do about an order column of type ``kind``."""
    if kind == "StringType":
        return (
            f"convert it first, e.g. df.withColumn({column!r}, F.to_timestamp({column!r})) "
            f"for ISO-8601 times, or F.col({column!r}).cast('double') for numbers written as text"
        )
    if kind == "TimestampNTZType":
        return f"convert it first, e.g. F.col({column!r}).cast('timestamp')"
    return f"convert it first with df.withColumn({column!r}, ...)"
