"""The Spark boundary: the only package of txstream that imports pyspark.

Executors do the data-parallel work (parsing, filtering, joins against pinned
table snapshots, aggregation, parameter sweeps); the transaction manager stays in
the driver.  Import this package only where Spark is really wanted: importing it
does not start a JVM, :func:`local_session` does.
"""

from txstream.spark.session import local_session

__all__ = ["local_session"]
