"""txstream: transactional stream processing for Python.

The package is layered; dependencies point one way::

    model <- storage <- txn <- engines (cq, windows, broadcast, loading, linearroad)
          <- spark / cli

Only :mod:`txstream.spark` imports pyspark, so ``import txstream`` never starts a JVM.

``import txstream as tx`` is the front door: ``tx.Job`` declares a transactional
job (tables, inputs, boundary, transaction functions, outputs) that
``job.start(checkpoint=...)`` runs on Spark executors and ``job.run_local(...)``
runs in this process; ``tx.read_output``, ``tx.read_table`` and ``tx.read_history`` read what it
committed.  ``tx.SparkCQ`` runs a continuous query whose windows never mix
table versions, with the join on executors (``docs/cq.md``).

A bank ledger run in this process (the examples write their stores under the
current directory)::

    >>> import txstream as tx
    >>> def deposit(t, e):
    ...     row = t.read("accounts", e["acct"], default={"balance": 0})
    ...     t.upsert("accounts", {"acct": e["acct"], "balance": row["balance"] + e["amount"]})
    ...     t.emit("receipts", {"acct": e["acct"], "amount": e["amount"]})
    >>> job = (
    ...     tx.Job("bank")
    ...     .table("accounts", key="acct")
    ...     .input("deposits", None, keys="acct")
    ...     .output("receipts", schema="acct long, amount long")
    ...     .on("deposits", deposit)
    ... )
    >>> batches = [[("deposits", {"acct": 1, "amount": 5})],    # micro-batch 0
    ...            [("deposits", {"acct": 1, "amount": 7})]]    # micro-batch 1
    >>> _ = job.run_local(batches, "ckpt/bank")
    >>> tx.read_table("ckpt/bank", "accounts")
    [{'acct': 1, 'balance': 12}]
    >>> tx.read_output("ckpt/bank", "receipts")
    [{'acct': 1, 'amount': 5}, {'acct': 1, 'amount': 7}]

On Spark the same job reads streaming DataFrames (``.input("deposits", df,
keys="acct")``) and runs with ``job.start(checkpoint=...)``.
"""

from txstream.errors import NotationError, TransientError, TxStreamError, UnknownNameError
from txstream.jobs.cq import SparkCQ
from txstream.spark.runtime import (
    BOUNDARIES,
    Boundary,
    DeltaSink,
    DuplicateKeyError,
    FolderSink,
    GroupOrderError,
    InputFailingError,
    Job,
    LateEventsWarning,
    LocalRunner,
    MissingRowError,
    PostgresSink,
    RuntimeJobError,
    SchemaError,
    SourceOrderWarning,
    SparkJobError,
    StoreError,
    StoreLockedError,
    TransactionAborted,
    TransactionFailuresWarning,
    Tx,
    UndeclaredKeyError,
    boundary,
    read_failures,
    read_history,
    read_output,
    read_output_arrow,
    read_output_pandas,
    read_table,
)

__all__ = [
    "BOUNDARIES",
    "Boundary",
    "DeltaSink",
    "DuplicateKeyError",
    "FolderSink",
    "GroupOrderError",
    "InputFailingError",
    "Job",
    "LateEventsWarning",
    "LocalRunner",
    "MissingRowError",
    "NotationError",
    "PostgresSink",
    "RuntimeJobError",
    "SchemaError",
    "SourceOrderWarning",
    "SparkCQ",
    "SparkJobError",
    "StoreError",
    "StoreLockedError",
    "TransactionAborted",
    "TransactionFailuresWarning",
    "TransientError",
    "Tx",
    "TxStreamError",
    "UndeclaredKeyError",
    "UnknownNameError",
    "boundary",
    "read_failures",
    "read_history",
    "read_output",
    "read_output_arrow",
    "read_output_pandas",
    "read_table",
]
__version__ = "0.1.0"
