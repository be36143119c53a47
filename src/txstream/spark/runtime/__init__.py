"""The partitioned transactional runtime and its public API (see ``docs/spark.md``).

Importing this package does not import pyspark; :meth:`Job.start` does.
"""

from txstream.spark.runtime.base import Tx
from txstream.spark.runtime.boundaries import BOUNDARIES, Boundary, boundary
from txstream.spark.runtime.errors import (
    DuplicateKeyError,
    GroupOrderError,
    InputFailingError,
    MissingRowError,
    RuntimeJobError,
    SchemaError,
    SparkJobError,
    StoreError,
    StoreLockedError,
    TransactionAborted,
    UndeclaredKeyError,
)
from txstream.spark.runtime.failures import LateEventsWarning, TransactionFailuresWarning
from txstream.spark.runtime.job import Job
from txstream.spark.runtime.local import LocalRunner, SourceOrderWarning
from txstream.spark.runtime.results import (
    history_text,
    read_failures,
    read_history,
    read_output,
    read_output_arrow,
    read_output_pandas,
    read_table,
)
from txstream.spark.runtime.sinks import DeltaSink, FolderSink, PostgresSink

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
    "PostgresSink",
    "RuntimeJobError",
    "SchemaError",
    "SourceOrderWarning",
    "SparkJobError",
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
    "read_output_arrow",
    "read_output_pandas",
    "read_table",
]
