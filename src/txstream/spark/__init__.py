"""The Spark boundary: the only package of txstream that imports pyspark.

Executors do the data-parallel work (parsing, filtering, joins against pinned
table snapshots, aggregation, parameter sweeps); the transaction manager stays in
the driver.  Import this package only where Spark is really wanted: importing it
does not start a JVM, :func:`local_session` does.
"""

from txstream.spark.session import local_session, quiet_spark_logs

__all__ = ["local_session", "quiet_spark_logs"]

# The engine-independent runtime pieces the engines' jobs (txstream.jobs) build on.
from txstream.spark.batches import (
    ExactlyOnce,
    MicroBatch,
    StreamHandle,
    foreach_batch,
    run_available,
)
from txstream.spark.sources import FileReplay, csv_files, text_files, untag
from txstream.spark.sweep import run_points

__all__ += [
    "ExactlyOnce",
    "FileReplay",
    "MicroBatch",
    "StreamHandle",
    "csv_files",
    "foreach_batch",
    "run_available",
    "run_points",
    "text_files",
    "untag",
]
