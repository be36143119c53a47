"""Watching a query without Spark: error conditions, Spark failures decoded, progress, logging.

The handle's methods are exercised on a :class:`TxQuery` whose Spark query is
a stand-in (the Spark side is in ``tests/test_spark_observability.py``); the
PySpark exceptions here have the shape measured on PySpark 4.3 (see
``_stream_failed``).
"""

from __future__ import annotations

import importlib
import logging
import os
import pkgutil
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import txstream as tx
from txstream.errors import TxStreamError, condition_of
from txstream.spark.runtime.query import TxQuery
from txstream.spark.runtime.spark_errors import decode, one_line

ROOT = Path(__file__).resolve().parent.parent


def _all_error_classes() -> list[type[TxStreamError]]:
    for module in pkgutil.walk_packages(tx.__path__, "txstream."):
        if not module.name.endswith("__main__"):  # (runs the command line)
            importlib.import_module(module.name)

    def walk(cls: type[TxStreamError]) -> list[type[TxStreamError]]:
        return [c for sub in cls.__subclasses__() for c in (sub, *walk(sub))]

    found = {c for c in walk(TxStreamError) if c.__module__.startswith("txstream.")}
    return sorted(found | {TxStreamError}, key=lambda c: c.condition)


def test_every_error_class_has_its_own_condition_and_is_in_the_docs_table() -> None:
    classes = _all_error_classes()
    assert len(classes) > 40  # (the walk found the package's classes)
    twice = [c for c, n in Counter(cls.condition for cls in classes).items() if n > 1]
    assert twice == []
    table = (ROOT / "docs" / "errors.md").read_text()
    rows = dict(re.findall(r"^\| `(TXSTREAM_\w+)` \| `([\w.]+)` \|", table, re.M))
    missing = [
        _row(cls) for cls in classes if not rows.get(cls.condition, "").endswith(f".{cls.__name__}")
    ]
    assert missing == [], "add these rows to docs/errors.md:\n" + "\n".join(missing)
    for cls in classes:
        assert re.fullmatch(r"TXSTREAM_[A-Z0-9_]+", cls.condition), cls
    assert len(rows) == len(classes)  # (no row for a class that is gone)


def _row(cls: type[TxStreamError]) -> str:
    """``cls``'s row of the table in docs/errors.md (as the table was written)."""
    name = (
        f"tx.{cls.__name__}"
        if getattr(tx, cls.__name__, None) is cls
        else f"{cls.__module__}.{cls.__name__}"
    )
    parent = next(b for b in cls.__mro__[1:] if issubclass(b, TxStreamError) or b is Exception)
    summary = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
    summary = summary.replace("``", "`").replace("|", "\\|")
    return f"| `{cls.condition}` | `{name}` | {parent.__name__} | {summary} |"


def test_conditions_are_stable_names_and_pyspark_shaped() -> None:
    assert condition_of("StoreLockedError") == "TXSTREAM_STORE_LOCKED"
    assert tx.SchemaError.condition == "TXSTREAM_SCHEMA_MISMATCH"
    assert tx.RuntimeJobError.condition == "TXSTREAM_INVALID_JOB"
    # A subclass never inherits its parent's condition.
    assert tx.GroupOrderError.condition == "TXSTREAM_GROUP_ORDER"
    assert tx.StoreLockedError("x").getCondition() == "TXSTREAM_STORE_LOCKED"
    with pytest.raises(tx.RuntimeJobError) as caught:
        tx.Job().table("a", key="k").table("a", key="k")
    assert caught.value.getCondition() == "TXSTREAM_INVALID_JOB"


class _StreamFailed(Exception):
    """A ``StreamingQueryException`` as PySpark 4.3 raises it from ``awaitTermination``.

    Its condition is ``STREAM_FAILED``; the batch's own error is the ``message``
    parameter (measured: a foreachBatch function whose Spark job failed on a cast).
    """

    def __init__(self, inner: str) -> None:
        self.inner = inner
        super().__init__(
            "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: "
            f"{inner} SQLSTATE: XXKST\n=== Streaming Query ===\nIdentifier: [id = 1]"
        )

    def getCondition(self) -> str:
        return "STREAM_FAILED"

    def getMessageParameters(self) -> dict[str, str]:
        return {"id": "1", "runId": "2", "message": self.inner}


def _stream_failed(cause: str) -> _StreamFailed:
    return _StreamFailed(
        "[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function "
        "in foreach batch sink. Reason: An exception was raised by the Python Proxy. Return "
        "Message: Traceback (most recent call last):\n"
        '  File "/venv/pyspark/sql/utils.py", line 163, in call\n'
        "    self.func(DataFrame(jdf, wrapped_session_jdf), batch_id)\n"
        '  File "/venv/pyspark/errors/exceptions/captured.py", line 262, in deco\n'
        "    raise converted from None\n"
        f"{cause}\n SQLSTATE: 39000"
    )


CAST = (
    "pyspark.errors.exceptions.captured.NumberFormatException: [CAST_INVALID_INPUT] The value "
    '\'x\' of the type "STRING" cannot be cast to "INT" because it is malformed. SQLSTATE: 22018'
)


def test_a_failed_query_is_decoded_from_pysparks_condition_and_parameters() -> None:
    failure = decode(_stream_failed(CAST))
    assert failure.condition == "CAST_INVALID_INPUT"
    assert failure.line.startswith("[CAST_INVALID_INPUT] The value 'x' of the type")
    assert "SQLSTATE" not in failure.line
    user = decode(_stream_failed("ValueError: account 2 is frozen"))
    assert user == ("ValueError: account 2 is frozen", "FOREACH_BATCH_USER_FUNCTION_ERROR")
    # The condition after a JVM exception's class (a task that failed to read a file).
    jvm = "org.apache.spark.SparkException: [FAILED_READ_FILE.NO_HINT] Encountered error"
    assert decode(_stream_failed(jvm)).condition == "FAILED_READ_FILE.NO_HINT"
    # Not a PySpark exception: its text, no condition.
    assert decode(OSError("disk full")) == ("disk full", None)
    assert one_line(_stream_failed(CAST)) == failure.line


def _query(tmp_path: Path, job: Any = None) -> TxQuery:
    job = job or tx.Job("watched").input("ev", None, keys="k").on("ev", lambda t, e: None)
    return TxQuery(job, tmp_path / "ckpt", None, 2, "executors")


class _SparkQuery:
    """Stands in for Spark's StreamingQuery: ids, an exception, a plan."""

    id = "11111111-aaaa"
    runId = "22222222-bbbb"
    isActive = False

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error

    def exception(self) -> BaseException | None:
        return self.error

    def explain(self, extended: bool = False) -> None:
        print("== Physical Plan ==\nFileScan json [k#1]" + (" (extended)" if extended else ""))


def test_spark_failures_keep_pysparks_exception_as_the_cause(tmp_path: Path) -> None:
    query = _query(tmp_path)
    error = _stream_failed(CAST)

    def fails() -> None:
        raise error

    with pytest.raises(tx.SparkJobError) as caught:
        query._wrap(fails)
    assert str(caught.value) == "job 'watched' failed: " + one_line(error)
    assert caught.value.__cause__ is error  # (was dropped: `from None`)
    assert caught.value.spark_condition == "CAST_INVALID_INPUT"
    assert caught.value.condition == "TXSTREAM_SPARK_FAILURE"
    assert isinstance(caught.value, tx.TxStreamError)


def test_exception_is_none_or_the_error_that_stopped_the_query(tmp_path: Path) -> None:
    query = _query(tmp_path)
    assert query.exception() is None  # (not started)
    query.query = _SparkQuery()
    assert query.exception() is None
    assert query.runId == "22222222-bbbb" and query.id == "11111111-aaaa"
    spark_error = _stream_failed("ValueError: boom")
    query.query = _SparkQuery(spark_error)
    error = query.exception()
    assert isinstance(error, tx.SparkJobError) and error.__cause__ is spark_error
    assert str(error) == "job 'watched' failed: ValueError: boom"
    # A batch's own error keeps its class (as processAllAvailable raises it).
    query._error = tx.InputFailingError("input 'ev': all 20 failed")
    query._failure = str(query._error)
    again = query.exception()
    assert type(again) is tx.InputFailingError and str(again) == "input 'ev': all 20 failed"
    assert again.__cause__ is spark_error


def test_explain_says_what_the_job_is_and_shows_sparks_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = (
        tx.Job("bank")
        .table("accounts", key="acct", schema="acct long, balance long")
        .input("deposits", None, keys="acct", order="ts")
        .output("receipts", schema="acct long")
        .on("deposits", lambda t, e: None)
        .sink("receipts", lambda batch, rows: None)
    )
    query = _query(tmp_path, job)
    query.explain()
    before = capsys.readouterr().out
    assert before.startswith("txstream job 'bank' (id -, runId -)\n")
    assert "engine executors, 2 partitions" in before and "merge batch" in before
    assert "input deposits: keys acct, order ts" in before
    assert "table accounts: key acct, partitioned by acct (acct long, balance long)" in before
    assert "output receipts (acct long), sinks " in before
    assert before.rstrip().endswith("(no batch yet)")
    query.query = _SparkQuery()
    query.explain(extended=True)
    after = capsys.readouterr().out
    assert "(id 11111111-aaaa, runId 22222222-bbbb)" in after
    assert after.rstrip().endswith("FileScan json [k#1] (extended)")


def _stats(**counts: int) -> dict[str, Any]:
    return {
        "events": 5,
        "committed": 4,
        "aborted": 1,
        "deferred": 2,
        "held": 3,
        "failures": [],
        "latency": {},
        **counts,
    }


def test_progress_goes_to_the_listeners_and_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[dict[str, Any]] = []

    def broken(progress: dict[str, Any]) -> None:
        raise RuntimeError("dashboard down")

    job = (
        tx.Job("watched")
        .input("ev", None, keys="k")
        .on("ev", lambda t, e: None)
        .on_progress(broken)
        .on_progress(seen.append)
    )
    query = _query(tmp_path, job)
    query.query = _SparkQuery()
    with caplog.at_level(logging.DEBUG, logger="txstream"):
        query._progressed(query._progress(7, _stats(), 0.25, 2))
    # The second listener ran although the first raised; a copy each.
    assert len(seen) == 1 and seen[0] == query.lastProgress and seen[0] is not query.lastProgress
    progress = seen[0]
    assert (progress["id"], progress["runId"], progress["name"]) == (
        "11111111-aaaa",
        "22222222-bbbb",
        "watched",
    )
    assert (progress["batchId"], progress["numInputRows"], progress["committed"]) == (7, 5, 4)
    assert (progress["aborted"], progress["deferred"], progress["held"]) == (1, 2, 3)
    assert progress["durationMs"] == 250 and "latency" in progress
    messages = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
    assert (
        "txstream.runtime",
        "INFO",
        "job 'watched' batch 7 committed: 5 events, 4 committed, 1 aborted, 2 deferred, "
        "3 held, 250 ms",
    ) in messages
    assert any("3 event(s) held by the event-time merge" in m for _, _, m in messages)
    assert any(
        level == "WARNING" and "progress listener" in m and "RuntimeError: dashboard down" in m
        for _, level, m in messages
    )


def test_on_progress_refuses_what_it_cannot_call() -> None:
    with pytest.raises(tx.RuntimeJobError, match=r"on_progress\(...\) needs a callable"):
        tx.Job().on_progress("print")  # type: ignore[arg-type]


def test_warnings_speak_and_info_stays_quiet_unless_logging_is_configured() -> None:
    # Failures speak (issue 27): a rolled-back transaction's WARNING reaches stderr
    # through Python's last-resort handler when the application configured nothing;
    # the INFO records (a batch committed) do not.  A NullHandler on "txstream"
    # would silence the warning: it must not be there.
    code = (
        "import logging, txstream\n"
        "logging.getLogger('txstream.runtime').info('batch 3 committed')\n"
        "logging.getLogger('txstream.runtime').warning('job x: 3 rolled back')\n"
        "logging.basicConfig(level=logging.INFO, format='%(name)s %(message)s')\n"
        "logging.getLogger('txstream.runtime').info('configured')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == ["job x: 3 rolled back", "txstream.runtime configured"]


def test_a_failing_sinks_error_keeps_the_sinks_exception_as_its_cause(tmp_path: Path) -> None:
    def down(batch: int, rows: list[dict[str, Any]]) -> None:
        raise ConnectionError("db down\nsecond line")

    job = (
        tx.Job("sunk")
        .input("ev", None, keys="k")
        .output("seen")
        .on("ev", lambda t, e: t.emit("seen", {"k": e["k"]}))
        .sink("seen", down)
    )
    with pytest.raises(tx.TxStreamError, match=r"ConnectionError: db down; it is called") as err:
        job.run_local([[("ev", {"k": 1})]], tmp_path / "store")
    assert "\n" not in str(err.value)
    assert isinstance(err.value.__cause__, ConnectionError)  # (was dropped: `from None`)
