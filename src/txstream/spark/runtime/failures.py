"""Failed transactions speak: a log line when their batch commits, a warning, a stop.

A transaction that raises is rolled back and recorded with its input position
(``tx.read_failures``).  That alone is silent, so the driver also

* **logs** each batch's failures when the batch commits, on the logger
  ``txstream.runtime`` (standard :mod:`logging`): the first
  :data:`LOGGED_PER_BATCH` in full (input position and error), then one line
  with the count of the rest, so that a million failures do not flood the log;
  a ``tx.abort`` is logged at ``INFO``, every other failure at ``WARNING``;
* **warns** (:class:`TransactionFailuresWarning`) from ``processAllAvailable()``,
  ``awaitTermination()``, ``stop()`` and ``run_local`` with the number of
  failures since the last such warning (``tx.abort`` calls excluded: they are
  the function's choice) and where to read them;
* **stops** the query when the first :data:`ALL_FAIL_LIMIT` transactions of an
  input since the job (re)started have all failed with a :class:`SchemaError`
  or :class:`UndeclaredKeyError` (an ``emit`` that never fits its output, an
  undeclared output or key): errors of the job, not of the data, which would
  otherwise leave its outputs empty without a word (:class:`InputFailingError`,
  raised after the batch committed, as ``onError=stop`` does).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from txstream.spark.runtime.base import NOT_RUN
from txstream.spark.runtime.errors import InputFailingError as InputFailingError  # (re-exported)

log = logging.getLogger("txstream.runtime")
"""The runtime's logger: failed transactions, per committed batch."""

LOGGED_PER_BATCH = 10
"""Failures of one batch logged in full; the rest are counted in one line."""

ALL_FAIL_LIMIT = 20
"""Failed transactions of an input, none committed, that stop the job (option ``allFailLimit``)."""

JOB_ERRORS = ("SchemaError: ", "UndeclaredKeyError: ")
"""The errors (as a failure record starts them) that the job's code makes, whatever the data."""


class TransactionFailuresWarning(UserWarning):
    """Transactions failed (and were rolled back) since the last such warning.

    ``run_local`` warns at its end, a query at each ``processAllAvailable()``;
    the failures themselves are in ``tx.read_failures``.

    >>> import warnings, txstream as tx
    >>> job = (tx.Job("signup").table("users", key="name").input("signups", None, keys="name")
    ...        .on("signups", lambda t, e: t.insert("users", {"name": e["name"]})))
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     _ = job.run_local([[("signups", {"name": "ada"})] * 2], "ckpt/warned")
    >>> [w.category.__name__ for w in caught]
    ['TransactionFailuresWarning']
    >>> print(caught[0].message)
    job 'signup': 1 transaction(s) failed and were rolled back since the last report (first at
    signups#1: DuplicateKeyError: insert into users: key 'ada' exists); read them with
    tx.read_failures('ckpt/warned') (logged on 'txstream.runtime')
    """


class LateEventsWarning(UserWarning):
    """Events ran after later ones of their partition: out of the declared order.

    Under the event-time merge, an event whose order value is below a frontier
    already passed (an input that was quiet for ``idleBatches`` batches, or
    further behind than its watermark, hands older events over) still runs,
    in the batch it arrives in, but its place in the order is lost, so the
    answer may differ from the serial one.  ``run_local`` warns at its end, a
    query at each ``processAllAvailable()``, ``awaitTermination()`` and
    ``stop()``, with the count since the last such warning; each batch's
    count is ``lastProgress["late"]``.

    >>> import warnings, txstream as tx
    >>> job = (tx.Job("late").input("a", None, keys="k", order="ts")
    ...        .input("b", None, keys="k", order="ts").output("out")
    ...        .on("a", lambda t, e: t.emit("out", e)).on("b", lambda t, e: t.emit("out", e)))
    >>> _ = job.run_local([[("a", {"k": 1, "ts": 1}), ("b", {"k": 1, "ts": 2})],
    ...                    [("a", {"k": 1, "ts": 5})]], "ckpt/late", end_inputs=False)
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     _ = job.run_local([[("b", {"k": 1, "ts": 3})]], "ckpt/late")
    >>> [w.category.__name__ for w in caught]
    ['LateEventsWarning']
    >>> [r["ts"] for r in tx.read_output("ckpt/late", "out")]
    [1, 2, 5, 3]
    """


def is_job_error(failure: Mapping[str, Any]) -> bool:
    """Whether ``failure`` is a :data:`JOB_ERRORS` error of a transaction that ran.

    An event that was not run (a null key or order value) is the data's fault.
    """
    error = str(failure.get("error", ""))
    return (
        failure.get("kind") == "error"
        and error.startswith(JOB_ERRORS)
        and not error.endswith(NOT_RUN)
    )


def log_late(job: str, batch: int, late: int) -> None:
    """Warn on the ``txstream.runtime`` logger that ``late`` events of a batch ran late.

    An event is late when its partition had already run an event that comes
    after it in the declared order (the event-time merge had released past it),
    or, under a ``timestamp`` or ``seconds`` boundary, when its group had
    already run (on any partition): it ran out of order, so the answer may
    differ from the serial one.
    """
    if late:
        log.warning(
            "job %r batch %d: %d event(s) arrived after later ones had run and ran late, "
            "out of the declared order; raise the input's watermark (or idleBatches)",
            job,
            batch,
            late,
        )


def log_failures(job: str, batch: int, failures: list[dict[str, Any]]) -> None:
    """Log the committed batch ``batch``'s ``failures`` (bounded, see the module docstring)."""
    for failure in failures[:LOGGED_PER_BATCH]:
        level = logging.INFO if failure.get("kind") == "abort" else logging.WARNING
        log.log(
            level,
            "job %r, batch %d: transaction at %s rolled back (%s): %s",
            job,
            batch,
            failure.get("position"),
            failure.get("kind"),
            failure.get("error"),
        )
    rest = failures[LOGGED_PER_BATCH:]
    if rest:
        errors = sum(1 for f in rest if f.get("kind") != "abort")
        log.log(
            logging.WARNING if errors else logging.INFO,
            "job %r, batch %d: %d more transaction(s) rolled back (%d aborted by tx.abort); "
            "tx.read_failures(store) lists them all",
            job,
            batch,
            len(rest),
            len(rest) - errors,
        )


class FailureWatch:
    """The driver's account of failures for a running job: warnings and the all-fail stop.

    ``inputs``: input index -> name.  :meth:`after_batch` takes each committed
    batch's stats (from the batch's thread); :meth:`warn` reports the count
    since the last call (from the caller's thread).
    """

    def __init__(self, job: str, inputs: Mapping[int, str], where: str, limit: int) -> None:
        self.job = job
        self.inputs = dict(inputs)
        self.where = where
        """How to read them, e.g. ``tx.read_failures('/ckpt')``."""
        self.limit = limit
        self._lock = threading.Lock()
        self._unreported = 0
        self._first: dict[str, Any] | None = None
        self._committed: dict[int, int] = {}
        self._bugs: dict[int, int] = {}
        self._first_bug: dict[int, dict[str, Any]] = {}
        self._late = 0

    def after_batch(self, stats: Mapping[str, Any]) -> None:
        """Count a committed batch's failures (logged by then: :func:`log_failures`)."""
        failures: list[dict[str, Any]] = stats.get("failures", [])
        errors = [f for f in failures if f.get("kind") != "abort"]
        with self._lock:
            self._unreported += len(errors)
            self._late += int(stats.get("late", 0))
            if errors and self._first is None:
                self._first = errors[0]
        for index, count in stats.get("committed_inputs", {}).items():
            self._committed[int(index)] = self._committed.get(int(index), 0) + count
        for failure in failures:
            if not is_job_error(failure):
                continue
            index = int(failure.get("at", failure["order"])[1])
            self._bugs[index] = self._bugs.get(index, 0) + 1
            self._first_bug.setdefault(index, failure)

    def check(self) -> None:
        """Raise :class:`InputFailingError` when an input's transactions all failed (the rule).

        Called after :meth:`after_batch` and after ``onError=stop`` had its say.
        """
        if not self.limit:
            return
        for index, bugs in sorted(self._bugs.items()):
            if bugs >= self.limit and not self._committed.get(index):
                first = self._first_bug[index]
                name = self.inputs.get(index, str(index))
                raise InputFailingError(
                    f"input {name!r}: all {bugs} of its transactions since the job started "
                    f"failed, the first at {first['position']} with {first['error']}; the job "
                    "cannot process this input as written: fix the transaction function or "
                    "the declarations, then restart (these batches are committed with those "
                    f"transactions rolled back, see {self.where}; .option('allFailLimit', 0) "
                    "turns this stop off)"
                )

    def warn(self, stacklevel: int = 3) -> int:
        """Warn with the failures (and late events) since the last call; returns the failures."""
        with self._lock:
            count, first = self._unreported, self._first
            self._unreported, self._first = 0, None
            late, self._late = self._late, 0
        import warnings

        try:
            if count and first is not None:
                warnings.warn(
                    f"job {self.job!r}: {count} transaction(s) failed and were rolled back "
                    f"since the last report (first at {first.get('position')}: "
                    f"{first.get('error')}); read them with {self.where} (logged on "
                    "'txstream.runtime')",
                    TransactionFailuresWarning,
                    stacklevel=stacklevel,
                )
        finally:  # (the failures' count is taken: a filter that raises must not lose this one)
            if late:
                warnings.warn(
                    f"job {self.job!r}: {late} event(s) arrived after later ones of their "
                    "partition (or their boundary's group) had run, and ran out of the "
                    "declared order since the last "
                    "report (lastProgress['late'] counts them per batch); give the input a "
                    "watermark, or raise idleBatches (see docs/spark.md, merge)",
                    LateEventsWarning,
                    stacklevel=stacklevel,
                )
        return count


__all__ = [
    "ALL_FAIL_LIMIT",
    "FailureWatch",
    "InputFailingError",
    "LateEventsWarning",
    "TransactionFailuresWarning",
    "is_job_error",
    "log_failures",
]
