"""The partitioned transactional runtime and its public API (see ``docs/spark.md``).

Importing this package does not import pyspark; :meth:`Job.start` does.
"""

from txstream.spark.runtime.base import (
    DuplicateKeyError,
    MissingRowError,
    RuntimeJobError,
    SchemaError,
    TransactionAborted,
    Tx,
    UndeclaredKeyError,
)
from txstream.spark.runtime.boundaries import BOUNDARIES, Boundary, GroupOrderError, boundary
from txstream.spark.runtime.failures import InputFailingError, TransactionFailuresWarning
from txstream.spark.runtime.job import Job
from txstream.spark.runtime.local import LocalRunner
from txstream.spark.runtime.results import (
    history_text,
    read_failures,
    read_history,
    read_output,
    read_table,
)
from txstream.spark.runtime.sinks import PostgresSink
from txstream.spark.runtime.state import StoreError, StoreLockedError

__all__ = [
    "BOUNDARIES",
    "Boundary",
    "DuplicateKeyError",
    "GroupOrderError",
    "InputFailingError",
    "Job",
    "LocalRunner",
    "MissingRowError",
    "PostgresSink",
    "RuntimeJobError",
    "SchemaError",
    "StoreError",
    "StoreLockedError",
    "TransactionAborted",
    "TransactionFailuresWarning",
    "Tx",
    "UndeclaredKeyError",
    "boundary",
    "history_text",
    "read_failures",
    "read_history",
    "read_output",
    "read_table",
]
