"""The runtime's errors, in one place (``tx.*Error``; all are :class:`~txstream.TxStreamError`).

The runtime raises its own classes from here and re-exports those of the layer
below that mean the same thing when the runtime raises them: a duplicate key, a
missing row and a damaged or busy store are the storage layer's
:class:`DuplicateKeyError`, :class:`MissingRowError`, :class:`StoreError` and
:class:`StoreLockedError` (one class per meaning).  The modules that raised
these before (``base``, ``boundaries``, ``state``, ``failures``, ``forward``,
``codec``) still export them under the same names.

A transaction function's error is recorded as ``"<class name>: <message>"``
(``tx.read_failures``); the class names are therefore part of the contract.
"""

from __future__ import annotations

from txstream.errors import TxStreamError
from txstream.storage.base import (
    DuplicateKeyError,
    MissingRowError,
    StoreError,
    StoreLockedError,
)

__all__ = [
    "DuplicateKeyError",
    "ExchangeError",
    "GroupOrderError",
    "InputFailingError",
    "MissingRowError",
    "RuntimeJobError",
    "SchemaError",
    "SparkJobError",
    "StoreError",
    "StoreLockedError",
    "TransactionAborted",
    "UndeclaredKeyError",
    "UnstorableValueError",
]


class RuntimeJobError(TxStreamError):
    """A job definition is wrong (unknown name, missing column, bad option).

    Raised by the builder or before anything runs, in one line:

    >>> import txstream as tx
    >>> tx.Job().input("ev", None, keys="k").option("onError", "ignore")
    Traceback (most recent call last):
    txstream.spark.runtime.errors.RuntimeJobError: option onError is one of ('rollback', 'stop'),
    not 'ignore'
    """

    condition = "TXSTREAM_INVALID_JOB"


class UndeclaredKeyError(TxStreamError):
    """A transaction touched a row whose partition value its events did not declare.

    The transaction is rolled back (see ``tx.read_failures``): declare every
    value it touches in the input's ``keys``.

    >>> import txstream as tx
    >>> def transfer(t, e):
    ...     t.increment("accounts", e["src"], "balance", -e["amount"])
    ...     t.increment("accounts", e["dst"], "balance", e["amount"])
    >>> job = (tx.Job()
    ...        .table("accounts", key="acct", initial=[{"acct": 1, "balance": 10},
    ...                                                {"acct": 2, "balance": 0}])
    ...        .input("transfers", None, keys="src")           # dst is missing
    ...        .on("transfers", transfer))
    >>> _ = job.run_local([[("transfers", {"src": 1, "dst": 2, "amount": 3})]], "ckpt/undeclared")
    >>> print(tx.read_failures("ckpt/undeclared")[0]["error"])
    UndeclaredKeyError: accounts: partition value 2 is not a key of the transaction's events
    (['1']); declare it in .input(keys=...)
    """


class SchemaError(TxStreamError):
    """A row does not fit the declared columns of its table or output.

    >>> import txstream as tx
    >>> job = (tx.Job().table("prices", key="item", schema="item string, price double")
    ...        .input("quotes", None, keys="item")
    ...        .on("quotes", lambda t, e: t.upsert("prices", e)))
    >>> _ = job.run_local([[("quotes", {"item": "pen", "price": "cheap"})]], "ckpt/schema")
    >>> print(tx.read_failures("ckpt/schema")[0]["error"])
    SchemaError: row of prices: column 'price' is double, got 'cheap'
    """

    condition = "TXSTREAM_SCHEMA_MISMATCH"


class TransactionAborted(TxStreamError):
    """Raised by ``tx.abort(reason)``: the transaction is rolled back, not an error.

    Its failure record has ``kind`` ``abort`` (an exception is ``error``):

    >>> import txstream as tx
    >>> def withdraw(t, e):
    ...     row = t.read("accounts", e["acct"])
    ...     if row["balance"] < e["amount"]:
    ...         t.abort("insufficient funds")
    ...     t.update("accounts", e["acct"], balance=row["balance"] - e["amount"])
    >>> job = (tx.Job().table("accounts", key="acct", initial=[{"acct": 1, "balance": 10}])
    ...        .input("withdrawals", None, keys="acct").on("withdrawals", withdraw))
    >>> _ = job.run_local([[("withdrawals", {"acct": 1, "amount": 30}),
    ...                     ("withdrawals", {"acct": 1, "amount": 4})]], "ckpt/abort")
    >>> tx.read_table("ckpt/abort", "accounts")
    [{'acct': 1, 'balance': 6}]
    >>> [(f["kind"], f["error"]) for f in tx.read_failures("ckpt/abort")]
    [('abort', 'TransactionAborted: insufficient funds')]
    """


class GroupOrderError(RuntimeJobError):
    """The ``by`` boundary's runs of two values interleave in a batch: it is refused.

    Nothing of such a batch commits (its transactions would depend on the
    partition count).

    >>> import txstream as tx
    >>> def add(t, e):
    ...     row = t.read("totals", e["g"], default={"n": 0})
    ...     t.upsert("totals", {"g": e["g"], "n": row["n"] + 1})
    >>> job = (tx.Job().table("totals", key="g").input("ev", None, keys="g")
    ...        .boundary("by", group=lambda e: e["g"]).on("ev", add))
    >>> job.run_local([[("ev", {"g": 1}), ("ev", {"g": 3}), ("ev", {"g": 1})]], "ckpt/by")
    Traceback (most recent call last):
    txstream.spark.runtime.errors.GroupOrderError: batch 0: boundary 'by': the events of group 1
    (from ev#0 to ev#2) and of group 3 (from ev#1) interleave; 'by' needs each value's events
    consecutive in the declared order across all inputs (e.g. a function of event time), otherwise
    the transactions would depend on the partition count
    """


class InputFailingError(TxStreamError):
    """Every transaction of an input failed with a schema or undeclared-key error: a job bug.

    The job stops after ``allFailLimit`` (20) such failures with none committed;
    the batches so far are committed with those transactions rolled back.

    >>> import warnings, txstream as tx
    >>> job = (tx.Job().input("readings", None, keys="device").output("alerts", schema="c double")
    ...        .on("readings", lambda t, e: t.emit("alerts", {"c": "hot"})))
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore", tx.TransactionFailuresWarning)
    ...     job.run_local([[("readings", {"device": n}) for n in range(25)]], "ckpt/failing")
    Traceback (most recent call last):
    txstream.spark.runtime.errors.InputFailingError: input 'readings': all 25 of its transactions
    since the job started failed, the first at readings#0 with SchemaError: emit to alerts: column
    'c' is double, got 'hot'; the job cannot process this input as written: fix the transaction
    function or the declarations, then restart (these batches are committed with those transactions
    rolled back, see tx.read_failures('ckpt/failing'); .option('allFailLimit', 0) turns this stop
    off)
    """


class ExchangeError(TxStreamError):
    """The tasks of a batch could not exchange their messages (a peer is gone or silent)."""


class UnstorableValueError(TxStreamError):
    """A value of a type the store's data format does not hold."""


class SparkJobError(TxStreamError):
    """Spark failed under the job (a Spark job, the query, the session): one line.

    The message names the innermost cause (the user's exception, a Spark error
    condition, a JVM exception); ``spark_condition`` is PySpark's condition of
    that cause when it has one (``CAST_INVALID_INPUT``, ``STREAM_FAILED``), and
    ``__cause__`` the exception PySpark raised.

    >>> import txstream as tx
    >>> exc = tx.SparkJobError("job 'j' failed: [CAST_INVALID_INPUT] ...", "CAST_INVALID_INPUT")
    >>> exc.condition, exc.spark_condition
    ('TXSTREAM_SPARK_FAILURE', 'CAST_INVALID_INPUT')
    """

    condition = "TXSTREAM_SPARK_FAILURE"

    def __init__(self, message: str, spark_condition: str | None = None) -> None:
        super().__init__(message)
        self.spark_condition = spark_condition
