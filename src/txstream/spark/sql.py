"""Spark SQL by expression strings, so that code above the runtime never builds a ``Column``.

The engines' Spark jobs (``txstream.jobs``) describe what they want from a
DataFrame with Spark SQL expression strings (``"try_cast(x AS BIGINT) AS n"``,
``"seq > 0"``) and pass them here; only this package turns them into pyspark
calls.  A DataFrame is an opaque handle to those callers.  Importing this module
does not import pyspark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from txstream.errors import TxStreamError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def literal(value: str | int | float | None) -> str:
    """``value`` as a Spark SQL literal: strings quoted, backslashes and quotes escaped."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def select(df: DataFrame, *exprs: str) -> DataFrame:
    """``df`` projected to the SQL expressions ``exprs`` (``selectExpr``)."""
    return df.selectExpr(*exprs)


def where(df: DataFrame, condition: str) -> DataFrame:
    """The rows of ``df`` for which the SQL ``condition`` holds."""
    return df.where(condition)


def case_when(*rules: tuple[str, str], otherwise: str | None = None) -> str:
    """``CASE WHEN c1 THEN v1 ... END``: the value of the first rule whose condition holds."""
    if not rules:
        raise TxStreamError("case_when needs at least one (condition, value) rule")
    body = " ".join(f"WHEN {condition} THEN {value}" for condition, value in rules)
    tail = f" ELSE {otherwise}" if otherwise is not None else ""
    return f"CASE {body}{tail} END"
