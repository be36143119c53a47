"""The ``>>>`` examples of the public API run, and every entry point has one.

As PySpark ends each public method's docstring with an example its suite runs,
txstream's public entry points (what ``import txstream as tx`` exports, the
main methods of ``tx.Job`` and of the query handle ``Job.start`` returns) carry
examples, and this file runs every example of the modules that define them.
The examples use ``run_local`` and write their stores under the current
directory, so each module's examples run in a fresh temporary one.  Examples
that need a live Spark session are marked ``# doctest: +SKIP``.

Option flags, as ``pytest --doctest-modules`` would take them from
``doctest_optionflags``: ``ELLIPSIS`` (``...`` for a process id) and
``NORMALIZE_WHITESPACE`` (a long one-line error is wrapped to the line length).
"""

from __future__ import annotations

import doctest
import inspect
import io
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import txstream as tx
from txstream.spark import testing as spark_testing
from txstream.spark.runtime.query import TxQuery

FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

JOB_METHODS = (
    "table",
    "input",
    "output",
    "sink",
    "on",
    "boundary",
    "option",
    "validate",
    "run_local",
    "start",
    "on_progress",
)
QUERY_METHODS = (
    "processAllAvailable",
    "awaitTermination",
    "stop",
    "lastProgress",
    "output",
    "failures",
    "exception",
    "explain",
)

NOT_DOCUMENTED_BY_EXAMPLE = {"BOUNDARIES"}
"""A dict, which has no docstring of its own: ``tx.Boundary``'s example lists it."""


def entry_points() -> Iterator[tuple[str, Any]]:
    """(name, object) of every public entry point."""
    yield "txstream", tx
    for name in tx.__all__:
        if name not in NOT_DOCUMENTED_BY_EXAMPLE:
            yield f"tx.{name}", getattr(tx, name)
    for name in JOB_METHODS:
        yield f"tx.Job.{name}", getattr(tx.Job, name)
    for name in QUERY_METHODS:
        yield f"TxQuery.{name}", inspect.getattr_static(TxQuery, name)
    yield "txstream.spark.testing", spark_testing  # (the users' testing kit)


def _function(obj: Any) -> Any:
    """The function behind a property (its docstring and module are the getter's)."""
    return obj.fget if isinstance(obj, property) else obj


def _module(obj: Any) -> types.ModuleType:
    if isinstance(obj, types.ModuleType):
        return obj
    module = inspect.getmodule(_function(obj))
    assert module is not None, obj
    return module


MODULES = sorted({_module(obj) for _, obj in entry_points()}, key=lambda m: m.__name__)


def test_every_public_entry_point_has_an_example() -> None:
    missing = [name for name, obj in entry_points() if ">>>" not in (obj.__doc__ or "")]
    assert missing == []


def run_examples(module: types.ModuleType) -> tuple[doctest.TestResults, str]:
    """Run every example in ``module``'s docstrings; the results and the failure report."""
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    report = io.StringIO()
    for test in doctest.DocTestFinder().find(module):
        runner.run(test, out=report.write)
    return runner.summarize(verbose=False), report.getvalue()


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_the_examples_run(
    module: types.ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result, report = run_examples(module)
    assert result.attempted > 0
    assert result.failed == 0, report


def test_a_wrong_expected_output_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The runner above is the one that reports: an example whose output differs fails.
    monkeypatch.chdir(tmp_path)
    module = types.ModuleType("wrong_example")
    module.__doc__ = """
    >>> import txstream as tx
    >>> job = tx.Job().table("t", key="k").input("ev", None, keys="k")
    >>> _ = job.on("ev", lambda t, e: t.upsert("t", e)).run_local([[("ev", {"k": 1})]], "s")
    >>> tx.read_table("s", "t")
    [{'k': 2}]
    """
    result, report = run_examples(module)
    assert (result.attempted, result.failed) == (4, 1)
    assert "[{'k': 1}]" in report
