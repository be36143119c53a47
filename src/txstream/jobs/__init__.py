"""The engines' Spark jobs, built on the runtime's API (:mod:`txstream.spark`).

One module per engine: :mod:`~txstream.jobs.cq` (continuous queries on
micro-batches), :mod:`~txstream.jobs.windows` (a sliding window fed by a stream)
and :mod:`~txstream.jobs.loading` (the continuous loader fed by a stream).
Linear Road keeps its jobs in its own package, in the same layer: the modules
named ``*_job`` in :mod:`txstream.linearroad` (``spark_job``, ``runtime_job``,
``generate_job``, ``run_job``).

This layer sits above the engines and below the command line: it imports the
engines and :mod:`txstream.spark`, never pyspark itself (it hands Spark SQL
expression strings and plain Python callbacks to the runtime), so importing it
starts no JVM.  ``tests/test_layering.py`` checks both.
"""
