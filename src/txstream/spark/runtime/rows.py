"""Rows handed to and taken from transaction functions, and rows they emit.

Who owns what: a row the store keeps is the store's; a function gets a copy
that shares no mutable value with it (:func:`owned_row`), and what it emits is
copied and checked (:func:`emitted_row`) before it goes to an output, whose
JSON lines hold numbers, strings, lists and the text of dates and decimals
only (:func:`check_output_values`, :func:`json_value`).
"""

from __future__ import annotations

import copy
import datetime
import decimal
from typing import Any

from txstream.spark.runtime.base import (
    LONG_MAX,
    LONG_MIN,
    JobSpec,
    Key,
    Row,
    TableSpec,
    check_row,
    check_value,
    key_of_row,
)
from txstream.spark.runtime.errors import SchemaError


def emitted_row(job: JobSpec, output: str, row: Row) -> Row:
    """A copy of ``row`` for ``output``, checked against its schema (the rule of ``emit``)."""
    check_emitted(job, output, row)
    if job.outputs[output].columns is None:
        check_output_values(output, row)
    return owned_row(row)


_AS_TEXT = (decimal.Decimal, datetime.date, datetime.time, datetime.timedelta)
"""Values an output line holds as their ``str()`` (JSON has no type for them)."""


def check_output_values(output: str, row: Any) -> None:
    """Raise :class:`SchemaError` if ``row`` holds a value an output line cannot hold.

    For a row of an output without a schema that is not plain (a plain one
    cannot hold such a value): a set, bytes or an object of another class was
    written as its ``str()`` (``"{1}"``, ``"b'x'"``), a text nobody reads back
    as the value.  Numbers of numpy are written as numbers (:func:`json_value`),
    ``Decimal`` and date/time values as their text, tuples as lists.
    """
    stack = [row]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            if value is not row and not all(type(k) is str for k in value):
                # (json refuses such a key while the lines are written: the run failed)
                raise SchemaError(
                    f"emit to {output}: a dict inside a row has a key that is not a string "
                    f"({next(k for k in value if type(k) is not str)!r:.60}); JSON's keys "
                    "are strings: convert the keys"
                )
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
        elif not (
            value is None or isinstance(value, (str, int, float, *_AS_TEXT)) or _numpy_number(value)
        ):
            raise SchemaError(
                f"emit to {output}: a {type(value).__name__} ({value!r:.60}) has no form in an "
                "output's JSON line (it would read back as its text); convert it (a sorted "
                "list, a str, a number)"
            )


def _numpy_number(value: Any) -> bool:
    """A numpy scalar number (``np.int64(5)``), not an array (``.item()`` of one fails)."""
    return (
        type(value).__module__ == "numpy"
        and getattr(value, "ndim", None) == 0
        and getattr(value, "shape", None) == ()
        and type(value).__name__ != "ndarray"
        and getattr(value, "dtype", None) is not None
        and (value.dtype.kind in "biuf")
    )


def json_value(value: Any) -> Any:
    """The ``default`` of the output lines' JSON encoder: a numpy number as itself.

    (``str`` made ``np.int64(5)`` the text ``"5"``, a row from pandas changing type.)
    """
    if _numpy_number(value):
        return value.item()
    return str(value)


_PLAIN_TYPES = frozenset(
    {int, float, str, bool, type(None), bytes, decimal.Decimal}
    | {datetime.date, datetime.datetime, datetime.time, datetime.timedelta}
)
"""Values a row may share with its copy: nothing can change them in place."""


def owned_row(row: Row) -> Row:
    """A copy of ``row`` that shares no mutable value (a list, a dict ...) with it.

    A table without a schema may hold lists and dicts.  A shallow copy handed
    to (or taken from) a transaction function would let it change a stored row
    in place, outside the undo log: never rolled back, and lost when the state
    is next loaded from the store (its delta never had it).  Rows of plain
    values, the common case, cost one ``dict`` copy and a type test per column.
    """
    # (copy(): half the instructions of dict(row), which a Mapping that is not a dict needs)
    new = row.copy() if type(row) is dict else dict(row)
    if _PLAIN_TYPES.issuperset(map(type, new.values())):
        return new
    return copy.deepcopy(new)


def check_emitted(job: JobSpec, output: str, row: Row) -> None:
    """Raise :class:`SchemaError` unless ``row`` may go to ``output`` (the check of ``emit``)."""
    spec = job.outputs.get(output)
    if spec is None:
        raise SchemaError(f"emit to unknown output {output!r}; outputs: {', '.join(job.outputs)}")
    if spec.columns is None and not isinstance(row, dict):
        # (else an AttributeError from deep in the writer named no emit and no output)
        raise SchemaError(f"emit to {output}: a row is a dict of columns, not {type(row).__name__}")
    if spec.columns is not None:
        # The full check only when the fast one (a dict of the columns' exact types) fails.
        if type(row) is not dict or len(row) != len(spec.columns):
            check_row(f"emit to {output}", spec.columns, row)
        for name, fits in spec.column_types or ():
            value = row.get(name, row)  # (a missing column: the row, a dict)
            kind = type(value)
            if kind not in fits or (kind is int and not LONG_MIN <= value <= LONG_MAX):
                check_row(f"emit to {output}", spec.columns, row)
                break


def updated_row(spec: TableSpec, key: Key, old: Row, changes: Row | None, columns: Row) -> Row:
    """``old`` with ``changes`` and ``columns`` applied, checked: the write rule of ``update``."""
    new = {**old, **(changes or {}), **columns}
    if key_of_row(spec, new) != key:
        raise SchemaError(f"update of {spec.name}: the key columns {spec.key} cannot change")
    # (a schema's columns hold plain values: only a table without one may get a list)
    return new if spec.columns is not None else owned_row(new)


def incremented_row(spec: TableSpec, old: Row, column: str, by: Any) -> Row:
    """``old`` with ``by`` added to ``column``, checked: the write rule of ``increment``."""
    if column not in old:
        raise SchemaError(f"increment of {spec.name}: no column {column!r}")
    new = old.copy() if type(old) is dict else dict(old)
    try:
        new[column] = old[column] + by
    except TypeError:
        raise SchemaError(
            f"increment of {spec.name}.{column}: cannot add {by!r} to {old[column]!r}"
        ) from None
    if spec.columns is not None:
        check_value(f"increment of {spec.name}", column, spec.columns[column], new[column])
    return new
