"""Spark's and Python's failures as one readable line.

A failure inside a Spark job reaches the driver as a PySpark exception
(``pyspark.errors``: a ``PySparkException`` with a condition and message
parameters, e.g. a ``StreamingQueryException`` of condition ``STREAM_FAILED``
whose ``message`` parameter holds the failed batch's error) or a Py4J one.
:func:`decode` reads PySpark's structure first: the condition, and the
wrapped message of a failed query; the text it then holds (a Java stack
trace, a Python worker's traceback, or both) is searched for the innermost
useful message (the user's own exception, a Spark error condition, a JVM
exception), so that the runtime's errors stay one line.  PySpark is not
imported here: an exception is read through the methods PySpark's have.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

_PYTHON_EXCEPTION = re.compile(
    r"(?!pyspark\.|py4j\.)([A-Za-z_]\w*\.)*[A-Za-z_]\w*(Error|Exception|Exit|Interrupt)(: |$)"
)
"""A Python traceback's last line (``ModuleNotFoundError: No module named 'x'``)."""

_SPARK_ERROR = re.compile(
    r"(?:pyspark\.errors\.exceptions\.[\w.]+: |py4j\.[\w.]+: |[\w.]*(?:Error|Exception): )?"
    r"(\[[A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*\] .+)"
)
"""A line naming a Spark error class (``...NumberFormatException: [CAST_INVALID_INPUT] ...``)."""

_JVM_EXCEPTION = re.compile(r"(?::\s*)?((?:java|javax|scala|org)\.[\w.$]+(?:Error|Exception): .+)")
"""A JVM exception's line in a Py4J error (``: java.lang.OutOfMemoryError: Java heap space``)."""

_TRACEBACK = "Traceback (most recent call last):"


class SparkFailure(NamedTuple):
    """A Spark failure, decoded: one line, and the innermost Spark error condition seen."""

    line: str
    condition: str | None


_CONDITION = re.compile(r"(?:^|: )\[([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)\] ")
"""A condition opening a message, maybe after its class (``...SparkException: [X] ``)."""


def _pyspark_parts(exc: BaseException) -> tuple[str | None, str]:
    """PySpark's condition of ``exc`` and the text that holds its cause.

    A failed streaming query (``STREAM_FAILED``) carries its batch's error in
    the ``message`` parameter: that text, not the query's own (which repeats
    it after the query's identifiers and plan).  Not a PySpark exception:
    (None, its text).
    """
    condition: str | None = None
    text = str(exc)
    get_condition: Any = getattr(exc, "getCondition", None)
    get_params: Any = getattr(exc, "getMessageParameters", None)
    if callable(get_condition) and callable(get_params):
        try:
            condition = get_condition()
            params = get_params() or {}
        except Exception:  # a captured exception whose JVM side is gone: its text only
            return None, text
        inner = params.get("message") if isinstance(params, dict) else None
        if isinstance(inner, str) and inner:
            text = inner
    return (str(condition) if condition else None), text


def decode(exc: BaseException) -> SparkFailure:
    """``exc`` (PySpark's, Py4J's or Python's) as a :class:`SparkFailure`."""
    condition, text = _pyspark_parts(exc)
    line = _line(exc, text)
    named = _CONDITION.search(line)
    if named:  # the cause names its condition: the innermost one
        condition = named[1]
    elif condition == "STREAM_FAILED":
        wrapped = _CONDITION.match(text)  # (FOREACH_BATCH_USER_FUNCTION_ERROR ...)
        condition = wrapped[1] if wrapped else condition
    return SparkFailure(line, condition)


def one_line(exc: BaseException) -> str:
    """A Spark or Python failure as one readable line (the innermost useful message)."""
    return decode(exc).line


def _line(exc: BaseException, text: str) -> str:
    for marker in ("TxStreamError: ", "RuntimeJobError: ", "SchemaError: ", "StoreError: "):
        if marker in text:
            return text.split(marker, 1)[1].splitlines()[0].strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # A Python worker's or the foreachBatch function's failure: Spark's first line
    # ends with "Traceback (most recent call last):"; the cause is the innermost
    # Python exception line of the traceback that follows or, when Spark itself
    # failed under the function (a bad cast in a Spark job it started), the last
    # line of the traceback that names a Spark error class (else a JVM exception).
    if any(line.endswith(_TRACEBACK) for line in lines):
        end = next((i for i, line in enumerate(lines) if line.startswith("===")), None)
        body = [line for line in lines[:end] if not line.endswith(_TRACEBACK)]
        causes = [line for line in body if _PYTHON_EXCEPTION.match(line)]
        for pattern in (_SPARK_ERROR, _JVM_EXCEPTION):
            if not causes:
                causes = [m[1] for m in map(pattern.fullmatch, body) if m]
        if causes:
            cause = _without_sqlstate(causes[-1])[:500]
            if cause.startswith("ModuleNotFoundError: "):
                cause += _MODULE_HINT
            return cause
    for line in lines:
        if line.startswith(("pyspark.", "py4j.", "at ", "File ", "Traceback", "JVM stacktrace")):
            continue
        return line[:500]
    return type(exc).__name__


_MODULE_HINT = (
    " (Spark's Python workers unpickle the job's functions and import the modules "
    "they name: define them in the driver's script, ship their module with "
    "spark.sparkContext.addPyFile(path), or install it where the workers run)"
)


def _without_sqlstate(line: str) -> str:
    return re.sub(r"(\s+SQLSTATE: \w+)+$", "", line)
