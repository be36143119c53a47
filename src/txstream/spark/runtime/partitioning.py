"""Which partition a partition value lives in, computed alike in Python and in Spark SQL.

A partition value (an int, a string, a bool, or a tuple of them) is written as
its canonical text (ints in decimal, bools as ``true``/``false``, tuple parts
joined by the unit separator U+001F) and placed by ``crc32(utf8(text)) mod P``.
Spark SQL computes the same from the columns (``cast(... as string)`` prints
ints and bools the same way), so the shuffle that brings events to their
partitions and the check inside a transaction agree; a test compares both on
random values.

Spark's own hash partitioner would place value ``v`` by ``murmur3(v) mod P``,
which does not spread ``P`` values over ``P`` partitions; the runtime therefore
shuffles by a *route* number chosen per partition so that Spark's partitioner
sends partition ``q``'s rows to Spark partition ``q`` exactly (see
:func:`route_numbers`).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from txstream.spark.runtime.base import Key, RuntimeJobError

SEPARATOR = "\x1f"


def canonical(value: Key) -> str:
    """The canonical text of a partition value."""
    if isinstance(value, tuple):
        return SEPARATOR.join(canonical(part) for part in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | str):
        return str(value)
    raise RuntimeJobError(
        f"a partition value is an int, a string, a bool or a tuple of them, not {value!r}"
    )


def partition_of(value: Key, partitions: int) -> int:
    """The partition (0 .. partitions-1) of ``value``."""
    return zlib.crc32(canonical(value).encode("utf-8")) % partitions


def sql_partition(columns: Sequence[str], partitions: int) -> str:
    """A Spark SQL expression computing :func:`partition_of` from ``columns``; -1 for a null."""
    cols = [f"`{c}`" for c in columns]
    text = (
        f"cast({cols[0]} as string)"
        if len(cols) == 1
        else "concat_ws(char(31), " + ", ".join(f"cast({c} as string)" for c in cols) + ")"
    )
    nulls = " or ".join(f"{c} is null" for c in cols)
    place = f"pmod(crc32(cast({text} as binary)), {partitions})"
    return f"cast(case when {nulls} then -1 else {place} end as int)"


def route_numbers(partitions: int, spark_partition_of: dict[int, int]) -> list[int]:
    """For each partition ``q``, a number that Spark's hash partitioner sends to ``q``.

    ``spark_partition_of`` maps candidate numbers to ``pmod(hash(n), partitions)``
    as Spark computed it.
    """
    routes: dict[int, int] = {}
    for number in sorted(spark_partition_of):
        routes.setdefault(spark_partition_of[number], number)
    missing = [q for q in range(partitions) if q not in routes]
    if missing:
        raise RuntimeJobError(f"no route number found for partitions {missing}")
    return [routes[q] for q in range(partitions)]
