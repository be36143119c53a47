"""Which partition a partition value lives in, computed alike in Python and in Spark SQL.

A partition value (an int, a string, a bool, or a tuple of them) is written as
its canonical text (ints in decimal, bools as the ints they equal, ``1`` and
``0``, tuple parts joined by the unit separator U+001F) and placed by
``crc32(utf8(text)) mod P``.  Bools are placed as ints because Python makes
``True`` and ``1`` one dict key: a table's row of ``True`` is its row of ``1``
on every partition count, as it is on one (placed by ``true``, they met on some
counts and not on others).  Spark SQL computes the same from the columns
(``cast(... as string)`` prints ints the same way; a boolean column is cast to
an int first), so the shuffle that brings events to their partitions and the
check inside a transaction agree; a test compares both on random values.

Spark's own hash partitioner would place value ``v`` by ``murmur3(v) mod P``,
which does not spread ``P`` values over ``P`` partitions; the runtime therefore
shuffles by a *route* number chosen per partition so that Spark's partitioner
sends partition ``q``'s rows to Spark partition ``q`` exactly (see
:func:`route_numbers`).
"""

from __future__ import annotations

import decimal
import math
import zlib
from collections.abc import Collection, Sequence

from txstream.spark.runtime.base import Key, RuntimeJobError

SEPARATOR = "\x1f"


def canonical(value: Key) -> str:
    """The canonical text of a partition value."""
    if isinstance(value, tuple):
        return SEPARATOR.join(canonical(part) for part in value)
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | str):
        return str(value)
    raise RuntimeJobError(
        f"a partition value is an int, a string, a bool or a tuple of them, not {value!r}"
    )


def key_text(key: Key) -> str:
    """The text a table's keys are ordered by (``scan``): :func:`canonical`'s, for any key.

    A key column that places no row may hold what a partition value may not (a
    float, a ``Decimal``, a date): a finite number is written as the exact
    decimal it is (equal numbers alike), anything else as its ``repr``.  (The
    order used :func:`canonical`, which refused them: every scan of such a table
    failed, naming a "partition value".)
    """
    if isinstance(key, tuple):
        return SEPARATOR.join(key_text(part) for part in key)
    if isinstance(key, int | str):
        return canonical(key)  # (a bool as the int it equals)
    if (isinstance(key, float) and math.isfinite(key)) or (
        isinstance(key, decimal.Decimal) and key.is_finite()
    ):  # (math.isfinite raises on a signalling NaN Decimal)
        # Equal numbers are one key of a dict (1.0 and 1, Decimal("2.50") and 2.5):
        # one text, or a row would be two items of the history.
        exact = decimal.Decimal(key)
        if exact == exact.to_integral_value():
            return str(int(exact))
        return format(exact.normalize(), "f")
    return repr(key)


def partition_of(value: Key, partitions: int) -> int:
    """The partition (0 .. partitions-1) of ``value``."""
    return zlib.crc32(canonical(value).encode("utf-8")) % partitions


def sql_partition(columns: Sequence[str], partitions: int, booleans: Collection[str] = ()) -> str:
    """A Spark SQL expression computing :func:`partition_of` from ``columns``; -1 for a null.

    ``booleans``: the columns of Spark type boolean (placed as their ints), in lower
    case (Spark's column names are not case-sensitive by default).
    """
    cols = [f"`{c}`" for c in columns]
    texts = [
        f"cast(cast({c} as int) as string)" if name.lower() in booleans else f"cast({c} as string)"
        for c, name in zip(cols, columns, strict=True)
    ]
    text = texts[0] if len(texts) == 1 else "concat_ws(char(31), " + ", ".join(texts) + ")"
    nulls = " or ".join(f"{c} is null" for c in cols)
    place = f"pmod(crc32(cast({text} as binary)), {partitions})"
    return f"cast(case when {nulls} then -1 else {place} end as int)"


_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _mix(h1: int, word: int) -> int:
    k1 = _rotl((word * 0xCC9E2D51) & _M32, 15) * 0x1B873593 & _M32
    return (_rotl(h1 ^ k1, 13) * 5 + 0xE6546B64) & _M32


def spark_hash_long(number: int) -> int:
    """Spark SQL's ``hash(n)`` of a bigint ``n``: Murmur3 x86 32-bit, seed 42 (signed).

    What Spark's hash partitioner places a bigint column's rows by, computed
    without a Spark job (:func:`spark_routes`); a test compares it with Spark.
    """
    unsigned = number & 0xFFFFFFFFFFFFFFFF
    h1 = _mix(_mix(42, unsigned & _M32), unsigned >> 32) ^ 8
    h1 = (h1 ^ (h1 >> 16)) * 0x85EBCA6B & _M32
    h1 = (h1 ^ (h1 >> 13)) * 0xC2B2AE35 & _M32
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def spark_routes(partitions: int) -> list[int]:
    """:func:`route_numbers` for ``partitions``, found with :func:`spark_hash_long`."""
    candidates = range(64 * partitions)
    return route_numbers(partitions, {n: spark_hash_long(n) % partitions for n in candidates})


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
