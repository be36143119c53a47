"""Checks of what a caller hands the job builder, each a one-line error at the wrong call.

:class:`~txstream.spark.runtime.job.Job` calls these where the argument is
given, so a mistake fails there and not later inside Spark (a trigger Spark
refuses at ``start()``), batch after batch (a transaction function of the wrong
arity: every transaction rolled back with a ``TypeError``) or among the
caller's files (an empty store path is the current folder).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from txstream.spark.runtime.base import TableSpec, initial_row
from txstream.spark.runtime.errors import RuntimeJobError
from txstream.spark.runtime.merge import watermark_delay

_TRIGGERS = ("processingTime", "availableNow", "once")


def check_trigger(trigger: dict[str, Any]) -> dict[str, Any]:
    """``trigger`` if it is one micro-batch trigger Spark takes; else a one-line error."""
    shown = ", ".join(f"{k}={v!r}" for k, v in trigger.items())
    if len(trigger) != 1:
        raise RuntimeJobError(
            f"trigger({shown}): give one of processingTime='5 seconds', availableNow=True "
            "or once=True"
        )
    [(key, value)] = trigger.items()
    if key in ("continuous", "realTime"):
        raise RuntimeJobError(
            f"trigger({shown}): txstream commits micro-batches (foreachBatch), which a "
            f"{key} trigger does not run; use processingTime, availableNow or once"
        )
    if key not in _TRIGGERS:
        raise RuntimeJobError(
            f"trigger({shown}): unknown trigger {key!r}; choose one of: {', '.join(_TRIGGERS)}"
        )
    if key == "processingTime":
        ok = isinstance(value, str) and bool(value.strip())
        if ok:
            try:
                watermark_delay(value, "trigger")  # (the same interval text Spark takes)
            except RuntimeJobError:
                ok = False
        if not ok:
            raise RuntimeJobError(
                f"trigger({shown}): an interval such as '5 seconds' or '200 milliseconds'"
            )
    elif value is not True:
        raise RuntimeJobError(f"trigger({shown}): {key} takes True only")
    return dict(trigger)


def check_place(path: Any, what: str) -> None:
    """Refuse a store or checkpoint that is not a path, or an empty one, in one line.

    ``Path("")`` is the current folder: ``run_local(batches, "")`` (an unset
    variable) wrote the store's files among the caller's own.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise RuntimeJobError(f"{what}: a folder path, not {path!r}")
    if not str(os.fspath(path)).strip():
        raise RuntimeJobError(f"{what}: an empty path; name a folder")


def takes_two(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` can be called with two positional arguments (True when unknown)."""
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError:
        return False
    except ValueError:  # (no signature: a builtin; let the call decide)
        return True
    return True


INITIAL_FILES = (".json", ".jsonl", ".csv", ".parquet")
"""The files ``table(initial=...)`` loads (a folder is read as Parquet)."""


def check_initial(table: TableSpec) -> TableSpec:
    """``table`` if its initial rows are a DataFrame, rows, or a file :data:`INITIAL_FILES` names.

    ``initial=42`` or ``initial="rows.txt"`` was taken, and failed when the job
    started on Spark; a list's bad row failed in ``run_local`` only.
    """
    initial, name = table.initial, table.name
    if isinstance(initial, (list, tuple)):
        for i, row in enumerate(initial):
            initial_row(table, row, i)
        return table
    if initial is None or hasattr(initial, "schema"):
        return table
    if isinstance(initial, (str, os.PathLike)):
        path = Path(initial)
        if path.suffix.lower() in INITIAL_FILES or path.is_dir():
            return table
        raise RuntimeJobError(
            f"table {name!r}: initial file {path} is not {', '.join(INITIAL_FILES)} "
            "(or a Parquet folder)"
        )
    raise RuntimeJobError(
        f"table {name!r}: initial is a DataFrame, a file or a list of dicts, not {initial!r}"
    )


def check_source(name: str, source: Any) -> None:
    """Refuse an input source that is not a DataFrame, a list of rows or None.

    ``input("ev", "events/")`` (a folder, as for Spark's readers) was taken and
    failed at ``start()``.
    """
    if source is None or isinstance(source, (list, tuple)) or hasattr(source, "schema"):
        return
    raise RuntimeJobError(
        f"input {name!r}: the source is a streaming DataFrame (spark.readStream...), or "
        f"None with run_local, not {source!r}"
    )
